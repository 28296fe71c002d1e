"""`sjd-pac batch` in this process: job ids, bad input (one sentence, before any work), atomic and
resumable output, a real Ctrl-C (SIGINT) and a rerun that redoes nothing finished. The Ray
runner's tests are in test_batch_ray.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sjd_pac_core.batch.jobs import BatchInputError, ModelInfo, plan_jobs, read_input
from sjd_pac_core.batch.store import ResultStore
from sjd_pac_core.bench.methods import parse_methods
from sjd_pac_core.bench.runner import PROMPT_DIR
from sjd_pac_core.cli import main
from sjd_pac_core.settings import RECORD_PNG_KEY

REPO = Path(__file__).resolve().parent.parent
PROMPTS = [p for p in (PROMPT_DIR / "demo.txt").read_text().splitlines() if p.strip() and not p.startswith("#")]


@pytest.fixture(scope="module")
def demo_info(demo_model) -> ModelInfo:
    return ModelInfo(demo_model.name, demo_model.family, "torch.float32", demo_model.defaults)


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def results(folder: Path) -> list:
    return [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]


# --- ids ---------------------------------------------------------------------------------------------


def test_job_ids_follow_content_not_spelling(tmp_path, demo_info):
    """--methods and the same settings spelled out in JSONL give one id; any change gives another."""
    text = read_input(write(tmp_path / "p.txt", f"{PROMPTS[0]}\n# a comment\n\n{PROMPTS[1]}\n"))
    assert [line.number for line in text] == [1, 4]
    by_flag = plan_jobs(text[:1], demo_info, [0, 1], parse_methods("ar,sjd-pac@32"))
    spelled = read_input(write(tmp_path / "p.jsonl", "\n".join(json.dumps(x) for x in [
        {"prompt": PROMPTS[0], "seed": 1, "method": "sjd_pac", "window": 32},
        {"prompt": PROMPTS[0], "seed": 0, "method": "ar"},
        {"prompt": PROMPTS[0], "seed": 0, "method": "ar", "cfg_scale": demo_info.defaults.cfg_scale, "top_k": None},
        {"prompt": PROMPTS[0], "seed": 0, "method": "ar", "cfg_scale": 3.0},
    ])))
    jobs = plan_jobs(spelled[:2], demo_info)
    assert {j.id for j in jobs} <= {j.id for j in by_flag}
    assert [j.method for j in jobs] == ["sjd-pac@32", "ar"]
    with pytest.raises(BatchInputError, match=r"lines 2 and 3 make the same image"):
        plan_jobs(spelled[:3], demo_info)  # the model's own CFG written out is the same job
    other = plan_jobs(spelled[3:], demo_info)[0]
    assert other.id not in {j.id for j in by_flag}
    assert len({j.id for j in by_flag}) == 4  # seeds and methods each change the id
    here = plan_jobs(text[:1], demo_info)[0].id
    for other_model in (ModelInfo("other-model", demo_info.family, demo_info.dtype, demo_info.defaults),
                        ModelInfo(demo_info.name, demo_info.family, "torch.bfloat16", demo_info.defaults),
                        ModelInfo(demo_info.name, demo_info.family, demo_info.dtype, demo_info.defaults, "int8")):
        assert plan_jobs(text[:1], other_model)[0].id != here  # another model, dtype or quantization


# --- bad input: one sentence, before any work -------------------------------------------------------

GOOD = json.dumps({"prompt": PROMPTS[0]})
P2 = json.dumps(PROMPTS[1])  # a second prompt the demo model reads
BAD_INPUT = [
    # (row, INPUT text or None for no file, extra arguments, text the sentence names)
    ("empty file", "", [], "holds no prompts"),
    ("comments only", "# nothing\n\n", [], "holds no prompts"),
    ("no such file", None, [], "is not a file"),
    ("partial JSONL line", f'{GOOD}\n{{"prompt": "a blue sq\n', [], "line 2 is not valid JSON"),
    ("not an object", f"{GOOD}\n[1, 2]\n", [], "line 2 holds a list"),
    ("unknown settings key", f'{GOOD}\n{{"prompt": "x", "cfg": 2}}\n', [], "line 2 has the unknown key 'cfg'"),
    ("no prompt", f'{GOOD}\n{{"seed": 1}}\n', [], "line 2 has no prompt"),
    ("a prompt the demo cannot read", f'{GOOD}\n{{"prompt": "a purple elephant"}}\n', [],
     "line 2: The demo model does not know the word"),
    ("negative seed", f'{{"prompt": {P2}, "seed": -1}}\n', [], "seed must be a whole number 0 or more"),
    ("bad setting value", f'{GOOD}\n{{"prompt": {P2}, "window": 0}}\n', [], "line 2: window"),
    ("bad resolution", f'{GOOD}\n{{"prompt": {P2}, "resolution": "512x512"}}\n', [], "does not draw 512x512"),
    ("duplicated ids", f"{GOOD}\n{GOOD}\n", [], "lines 1 and 2 make the same image"),
    ("line seed and --seeds", f'{{"prompt": {P2}, "seed": 3}}\n', ["--seeds", "0-1"], "drop one of the two"),
    ("line overruled by --methods", f'{{"prompt": {P2}, "window": 32}}\n', ["--methods", "sjd@16"],
     "sets window = 32, but --methods sjd@16 sets 16"),
    ("same method twice", f"{GOOD}\n", ["--methods", "sjd-pac@32,sjd-pac@32:d2"], "run the same settings"),
    ("unknown method", f"{GOOD}\n", ["--methods", "fast"], "Unknown method 'fast'"),
    ("generate row", f"{GOOD}\n", ["--methods", "generate"], "not a batch method"),
    ("bad seeds", f"{GOOD}\n", ["--seeds", "a-b"], "--seeds 'a-b'"),
    ("workers 0", f"{GOOD}\n", ["--workers", "0"], "--workers must be 1 or more, got 0"),
    ("workers negative", f"{GOOD}\n", ["--workers", "-2"], "--workers must be 1 or more, got -2"),
    ("threads negative", f"{GOOD}\n", ["--threads", "-1"], "--threads must be 0"),
    ("threads past the cores", f"{GOOD}\n", ["--threads", "99999"], "--threads 99999 is more than the"),
    ("workers past the cores", f"{GOOD}\n", ["--workers", "1000"],
     "--workers 1000 asks for a CPU core each at least, but this machine has"),
    ("bad device", f"{GOOD}\n", ["--device", "gpu"], "is not a device name"),
]


def _run_bad(tmp_path, capsys, text, extra, out=None):
    source = tmp_path / "in.jsonl"
    if text is not None:
        write(source, text)
    out = out or tmp_path / "out"
    rc = main(["batch", str(source), "--out", str(out), "--quiet", *extra])
    err = capsys.readouterr().err.strip()
    return rc, err, out


def _one_sentence(err: str) -> str:
    assert err.startswith("error: ") and "\n" not in err and err.endswith("."), err
    return err


@pytest.mark.parametrize("row,text,extra,names", BAD_INPUT, ids=[r[0] for r in BAD_INPUT])
def test_bad_input_is_one_sentence_before_any_work(tmp_path, capsys, row, text, extra, names):
    rc, err, out = _run_bad(tmp_path, capsys, text, extra)
    assert rc == 2
    assert names in _one_sentence(err)
    assert not (out / "results.jsonl").exists() and not list(out.glob("images/*.png"))


def test_unknown_key_sentence_lists_the_known_keys(tmp_path, capsys):
    _, err, _ = _run_bad(tmp_path, capsys, '{"prompt": "x", "steps": 3}\n', [])
    assert "'steps'" in err and "prompt, seed, negative_prompt, resolution, method, window" in err


def test_unwritable_out_is_refused_before_any_work(tmp_path, capsys):
    blocker = write(tmp_path / "a_file", "")
    for out in (blocker, blocker / "sub"):  # a file, and a folder that cannot be made (root or not)
        rc, err, _ = _run_bad(tmp_path, capsys, f"{GOOD}\n", [], out=out)
        assert rc == 2 and "--out" in _one_sentence(err)
    assert blocker.read_text() == ""


def test_ray_missing_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what find_spec sees when ray is not installed
    for flag in (["--workers", "2"], ["--ray-address", "auto"]):
        rc, err, _ = _run_bad(tmp_path, capsys, f"{GOOD}\n", flag)
        assert rc == 2 and 'pip install "sjd-pac[ray]"' in _one_sentence(err)


def test_checks_run_before_torch_is_imported(tmp_path):
    source = write(tmp_path / "in.jsonl", f'{GOOD}\n{{"prompt": "a blue sq\n')
    code = ("import sys; from sjd_pac_core.cli import main; "
            f"rc = main(['batch', {str(source)!r}, '--out', {str(tmp_path / 'o')!r}]); print(rc, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.stdout.split() == ["2", "False"], out.stdout + out.stderr
    assert "in.jsonl line 2 is not valid JSON" in out.stderr


# --- the results store ----------------------------------------------------------------------------------


def _line(i: str) -> str:
    return json.dumps({"id": i, "tokens": 1}) + "\n"


def test_store_drops_a_torn_tail_and_lines_without_a_png(tmp_path):
    store = ResultStore(tmp_path)
    store.load()
    for i in ("a", "b", "c"):
        store.add(json.loads(_line(i)), b"png")
    store.image_path("b").unlink()  # a PNG deleted by hand: its job runs again
    with open(store.results, "a") as handle:
        handle.write('{"id": "d", "tok')  # a crash in the middle of an append
    (store.images / ".tmp-x.png").write_bytes(b"half")  # and in the middle of a PNG
    again = ResultStore(tmp_path)
    assert sorted(again.load()) == ["a", "c"] and again.dropped == 2
    text = store.results.read_text()  # rewritten whole, newline-terminated
    assert text.endswith("\n") and [json.loads(x)["id"] for x in text.splitlines()] == ["a", "c"]
    assert not list(store.images.glob(".tmp-*"))
    again.add(json.loads(_line("b")), b"png")
    assert [json.loads(x)["id"] for x in store.results.read_text().splitlines()] == ["a", "c", "b"]


def test_store_refuses_a_damaged_line_in_the_middle(tmp_path):
    store = ResultStore(tmp_path)
    store.load()
    store.add(json.loads(_line("a")), b"png")
    with open(store.results, "a") as handle:
        handle.write("garbage\n" + _line("c"))
    with pytest.raises(BatchInputError, match=r"results.jsonl line 2 is not a result line"):
        ResultStore(tmp_path).load()


# --- a real run, interrupted and resumed ----------------------------------------------------------------


def test_batch_writes_pngs_lines_and_summary(tmp_path, capsys, monkeypatch):
    from sjd_pac_core.batch import work

    loads = []
    original = work.load_model
    monkeypatch.setattr(work, "load_model", lambda *args, **kwargs: loads.append(kwargs) or original(*args, **kwargs))
    source = write(tmp_path / "p.txt", PROMPTS[0] + "\n")
    out = tmp_path / "out"
    assert main(["batch", str(source), "--out", str(out), "--methods", "ar,sjd-pac@32", "--quiet",
                 "--check-finite"]) == 0
    assert loads and all(kwargs["check_finite"] is True for kwargs in loads)
    lines = results(out)
    assert [line["method"] for line in lines] == ["ar", "sjd-pac@32"]
    ar, pac = lines
    assert ar["forward_passes"] == ar["tokens"] and pac["forward_passes"] < pac["tokens"]
    assert pac["token_digest"] == ar["token_digest"]  # verify=gumbel: AR's tokens
    assert len(pac["token_digest"]) == 64 and pac["settings"]["window"] == 32
    from PIL import Image

    with Image.open(out / pac["image"]) as image:
        record = json.loads(image.text[RECORD_PNG_KEY])
    assert record["prompt"] == PROMPTS[0] and record["seed"] == 0 and record["window"] == 32
    summary = (out / "summary.md").read_text()
    assert "| SJD-PAC L=32 |" in summary and "sjd-pac@32 (verify gumbel): 1 of 1 jobs returned AR's tokens" in summary
    assert not [p for p in out.rglob("*") if p.name.startswith(".tmp-")]
    umask = os.umask(0o022)
    os.umask(umask)
    for path in (out / pac["image"], out / "summary.md", out / "results.jsonl"):  # readable as open() makes files
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask, path


def test_summary_pairs_each_job_with_ar_of_its_own_prompt_and_recipe(tmp_path):
    """Two prompts and two recipes (CFG 2 and 3) for one seed: eight jobs whose four AR jobs all
    differ. Each method's job is paired with AR's of the same prompt, seed and recipe (under
    gumbel it returns exactly those tokens), so the summary says 4 of 4; pairing by the seed
    alone, or by the prompt without the recipe, would say 1 or 2 of 4."""
    source = write(tmp_path / "p.jsonl", "\n".join(
        json.dumps({"prompt": prompt, "seed": 0, "cfg_scale": cfg}) for cfg in (2.0, 3.0) for prompt in PROMPTS[:2]))
    out = tmp_path / "out"
    assert main(["batch", str(source), "--out", str(out), "--methods", "ar,sjd-pac@32", "--quiet"]) == 0
    lines = results(out)
    assert len(lines) == 8
    ar = {(line["prompt"], line["settings"]["cfg_scale"]): line["token_digest"] for line in lines if line["method"] == "ar"}
    assert len(set(ar.values())) == 4, "the four AR jobs must draw four different pictures"
    for line in lines:
        assert line["token_digest"] == ar[(line["prompt"], line["settings"]["cfg_scale"])]
    summary = (out / "summary.md").read_text()
    assert "sjd-pac@32 (verify gumbel): 4 of 4 jobs returned AR's tokens" in summary, summary


@pytest.mark.slow
def test_ctrl_c_then_rerun_redoes_nothing_finished(tmp_path):
    """A real SIGINT to a running `sjd-pac batch`; the rerun adds only the missing jobs."""
    source = write(tmp_path / "p.txt", "\n".join(PROMPTS[:2]) + "\n")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "sjd_pac_core.cli", "batch", str(source), "--out", str(out),
               "--methods", "sjd-pac@32", "--seeds", "0-1", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # Ctrl-C as in a terminal: a child inherits an ignored SIGINT (CI started as a background job)
    run = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and run.poll() is None:
        if (out / "results.jsonl").is_file() and (out / "results.jsonl").read_text().count("\n") >= 1:
            break
        time.sleep(0.2)
    run.send_signal(signal.SIGINT)
    stdout, stderr = run.communicate(timeout=120)
    assert run.returncode == 130, stdout + stderr
    assert "rerun the same command to continue" in stdout
    before = results(out)
    assert 1 <= len(before) < 4
    kept = {line["id"]: (out / line["image"]).stat().st_mtime_ns for line in before}
    text_before = (out / "results.jsonl").read_text()

    finished = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert f"{4 - len(before)} done now, {len(before)} done before" in finished.stdout
    after = results(out)
    assert len(after) == 4 and len({line["id"] for line in after}) == 4  # every job exactly once
    assert (out / "results.jsonl").read_text().startswith(text_before)  # finished lines untouched
    assert {i: (out / f"images/{i}.png").stat().st_mtime_ns for i in kept} == kept  # PNGs not rewritten
    assert len(list((out / "images").glob("*.png"))) == 4


# --- before the model loads, and a full disk -------------------------------------------------------


@pytest.fixture
def loads(monkeypatch) -> list:
    """Every model load of the batch (the in-process runner's), counted."""
    from sjd_pac_core.batch import work

    calls: list = []
    original = work.load_model
    monkeypatch.setattr(work, "load_model", lambda *args, **kwargs: calls.append(args) or original(*args, **kwargs))
    return calls


def test_a_byte_order_mark_is_not_part_of_the_first_prompt(tmp_path, demo_info):
    plain = read_input(write(tmp_path / "plain.txt", f"{PROMPTS[0]}\n"))
    marked = tmp_path / "marked.txt"
    marked.write_bytes(b"\xef\xbb\xbf" + f"{PROMPTS[0]}\n".encode())  # as Windows editors save UTF-8
    assert read_input(marked)[0].prompt == PROMPTS[0]
    assert plan_jobs(read_input(marked), demo_info)[0].id == plan_jobs(plain, demo_info)[0].id


@pytest.mark.parametrize("text,extra,names", [
    (f'{{"prompt": {P2}, "window": 0}}\n', [], "line 1: window (L) must be an integer >= 1"),
    (f'{{"prompt": {P2}, "temperature": 0}}\n', [], "line 1: temperature must be > 0"),
    (f"{GOOD}\n", ["--methods", "sjd-pac@64:b0"], "with --methods sjd-pac@64:b0: node_budget must be None, an integer"),
    (f"{GOOD}\n", ["--methods", "sjd-pac@64:b2000"], "with --methods sjd-pac@64:b2000: node_budget must be None"),
    (f'{{"prompt": {P2}, "resolution": "512x512"}}\n', [], "does not draw 512x512"),
], ids=["window 0", "temperature 0", "budget 0", "budget 2000", "resolution"])
def test_settings_no_model_can_run_are_refused_before_it_loads(tmp_path, capsys, loads, text, extra, names):
    rc, err, out = _run_bad(tmp_path, capsys, text, extra)
    assert rc == 2 and names in _one_sentence(err)
    assert loads == []  # refused from the model's folder alone (a 7B load takes minutes)


def test_a_rerun_with_nothing_left_loads_no_model(tmp_path, capsys, loads):
    source = write(tmp_path / "p.txt", PROMPTS[0] + "\n")
    out = tmp_path / "out"
    command = ["batch", str(source), "--out", str(out), "--methods", "ar", "--quiet"]
    assert main(command) == 0 and len(loads) == 1
    (out / ".tmp-1a2b3c4d.md").write_text("# half a summary")  # a kill during summary.md's write
    (out / "summary.md").unlink()
    capsys.readouterr()
    assert main(command) == 0
    printed = capsys.readouterr().out
    assert len(loads) == 1, "the rerun loaded the model"
    assert "1 jobs: 0 done now, 1 done before, 0 failed; ran no job" in printed
    assert (out / "summary.md").is_file() and not list(out.glob(".tmp-*"))
    assert main(command + ["--seeds", "0-1"]) == 0  # another job: the model loads, the first job is kept
    assert len(loads) == 2 and "1 done now, 1 done before" in capsys.readouterr().out
    assert main(command + ["--dtype", "bf16"]) == 0  # asked for otherwise: planned with the model it loads
    assert len(loads) == 3 and "1 done now, 0 done before" in capsys.readouterr().out


@pytest.fixture
def disk_fills(monkeypatch):
    """fills(folder): once results.jsonl in `folder` holds a line, the disk is full: every write
    into the folder fails with ENOSPC in os.write (the one call sjd_pac_core.files writes with),
    until `fills.free()`."""
    import errno

    real_write = os.write
    state = {"folder": None}

    def write(fd, data):
        folder = state["folder"]
        if folder is not None and os.path.realpath(f"/proc/self/fd/{fd}").startswith(str(folder) + os.sep):
            results = folder / "results.jsonl"
            if results.is_file() and results.read_bytes().count(b"\n") >= 1:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)

    class Fills:
        def __call__(self, folder: Path) -> None:
            state["folder"] = folder.resolve()

        def free(self) -> None:
            state["folder"] = None

    return Fills()


def test_a_full_disk_keeps_the_image_stops_and_the_rerun_finishes(tmp_path, capsys, disk_fills, loads):
    from PIL import Image

    source = write(tmp_path / "p.txt", PROMPTS[0] + "\n")
    out = tmp_path / "out"
    out.mkdir()
    disk_fills(out)
    command = ["batch", str(source), "--out", str(out), "--methods", "sjd-pac@32", "--seeds", "0-2", "--quiet"]
    assert main(command) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    errors = [line for line in captured.err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and _one_sentence(errors[0]), captured.err
    assert "(no space left on device); kept it as " in errors[0] and "the batch stopped" in errors[0]
    assert "free some disk space and rerun the same command to finish the batch (2 jobs left)" in errors[0]
    kept = Path(errors[0].split("kept it as ", 1)[1].split(" instead", 1)[0])
    with Image.open(kept) as image:  # the image made when the disk was full, whole, with its run record
        assert json.loads(image.text[RECORD_PNG_KEY])["seed"] == 1
    assert "warning: could not write" in captured.err and "summary.md" in captured.err  # said where it is
    assert len(results(out)) == 1 and len(list((out / "images").glob("*.png"))) == 1
    assert not [p for p in out.rglob("*") if p.name.startswith(".tmp-")]

    disk_fills.free()  # space freed: the rerun finishes the batch
    assert main(command) == 0
    assert "2 done now, 1 done before, 0 failed" in capsys.readouterr().out
    assert len(results(out)) == 3 and (out / "summary.md").is_file()
    loaded = len(loads)

    disk_fills(out)  # full again: a rerun with nothing left to do still ends well, and says where summary.md is
    assert main(command) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "error" not in captured.err
    assert captured.err.startswith("warning: could not write") and "summary.md" in captured.err
    assert "3 done before" in captured.out and len(loads) == loaded
