"""`sjd-pac batch --workers N` on a local Ray with CPU workers: the same token digests as the
in-process run, a worker process killed mid-batch, and workers whose model does not load.
One Ray session for the module (starting Ray costs seconds); `-m ray` selects these tests."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

import sjd_pac_core as sp  # noqa: E402
from sjd_pac_core.batch.driver import BatchOptions, run_batch  # noqa: E402
from sjd_pac_core.batch.jobs import read_input  # noqa: E402
from sjd_pac_core.batch.ray_runner import RayRunner, WorkersUnavailable  # noqa: E402
from sjd_pac_core.batch.work import ModelSpec  # noqa: E402
from sjd_pac_core.bench.methods import parse_methods  # noqa: E402
from sjd_pac_core.bench.runner import PROMPT_DIR  # noqa: E402
from sjd_pac_core.cli import main  # noqa: E402
from sjd_pac_core.models.loader import DEMO_FOLDER  # noqa: E402

pytestmark = pytest.mark.ray

PROMPTS = [p for p in (PROMPT_DIR / "demo.txt").read_text().splitlines() if p.strip() and not p.startswith("#")]
METHODS = "sjd-pac@32"  # the fastest demo method: 4 jobs of about 3 s on one thread
SEEDS = [0, 1]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="warning")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("batch_ray") / "prompts.txt"
    path.write_text("\n".join(PROMPTS[:2]) + "\n")
    return path


def options(prompt_file: Path, out: Path, **changes) -> BatchOptions:
    values = dict(lines=read_input(prompt_file), out=out, methods=parse_methods(METHODS), seeds=SEEDS,
                  model=ModelSpec("demo", device="cpu"), progress=False)
    values.update(changes)
    return BatchOptions(**values)


def digests(out: Path) -> dict:
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(lines) == len({line["id"] for line in lines}), "a job was written twice"
    return {line["id"]: line["token_digest"] for line in lines}


@pytest.fixture(scope="module")
def in_process(prompt_file, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("in_process")
    report = run_batch(options(prompt_file, out))
    assert report.complete and report.where.startswith("in this process")
    found = digests(out)
    assert len(found) == 4 and len(set(found.values())) == 4  # different prompts and seeds: different tokens
    return found


def test_two_ray_workers_give_the_in_process_digests(local_ray, in_process, prompt_file, tmp_path, capsys):
    out = tmp_path / "ray"
    rc = main(["batch", str(prompt_file), "--out", str(out), "--methods", METHODS, "--seeds", "0-1",
               "--workers", "2", "--device", "cpu", "--quiet"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "on 2 CPU (1 torch thread each) workers" in printed
    assert digests(out) == in_process
    workers = {json.loads(line)["worker"].split(" (")[0] for line in (out / "results.jsonl").read_text().splitlines()}
    assert workers == {"worker 0", "worker 1"}  # the jobs were spread over both


def test_a_killed_worker_that_cannot_reload_loses_and_duplicates_nothing(local_ray, in_process, prompt_file,
                                                                         tmp_path):
    """Mid-batch, the weights vanish and the busy worker's process is SIGKILLed: its job runs
    again on the other worker, Ray restarts it, the restart cannot load the model and is named
    with the reason, and the batch completes on the worker left: every job exactly once."""
    folder = tmp_path / "models" / "demo"  # a copy of the demo model (same name: same job ids)
    shutil.copytree(DEMO_FOLDER, folder)
    runner = RayRunner(ModelSpec(str(folder), device="cpu"), workers=2, say=lambda text: None)
    killed = []

    def break_and_kill(outcome) -> None:
        """After the first result, the other worker is running a job: delete the weights, kill it,
        and wait until Ray has restarted it (and its model load has failed), so that the batch
        cannot end before the runner hears of it."""
        if killed or outcome.output is None:
            return
        others = [s for s in runner.states.values() if s.name != outcome.output.line["worker"]]
        if not others:
            return
        (folder / "model.safetensors").unlink()
        os.kill(others[0].pid, signal.SIGKILL)
        killed.append(others[0])
        for _ in range(240):
            try:
                if ray.get(runner.actors[others[0].index].describe.remote()).error:
                    return
            except ray.exceptions.ActorUnavailableError:  # not restarted yet
                pass
            time.sleep(0.5)

    out = tmp_path / "killed"
    report = run_batch(options(prompt_file, out), on_result=break_and_kill, runner=runner)
    assert killed, "the second worker never started"
    assert report.complete and not report.failed
    assert report.retried >= 1  # the killed worker's job ran again on the other one
    assert digests(out) == in_process  # every job exactly once, with the same tokens
    assert len(report.lost_workers) == 1, report.lost_workers
    lost = report.lost_workers[0]
    assert lost.startswith(f"worker {killed[0].index} (") and "could not load the model" in lost
    assert "model.safetensors" in lost


def test_workers_whose_model_does_not_load_are_named(local_ray, prompt_file, tmp_path):
    broken = Path(shutil.copytree(DEMO_FOLDER, tmp_path / "broken_model"))
    (broken / "model.safetensors").unlink()  # its small files are fine: only a worker's load finds this
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.jsonl").write_text("")  # an earlier run's file: kept as it was
    with pytest.raises(WorkersUnavailable) as caught:
        run_batch(options(prompt_file, out, workers=2, model=ModelSpec(str(broken), device="cpu")))
    message = str(caught.value)
    assert "no worker could load the model" in message and "model.safetensors" in message
    assert "worker 0 (" in message and "worker 1 (" in message
    assert (out / "results.jsonl").read_text() == ""


def test_a_config_no_model_can_be_built_from_is_refused_before_any_worker_starts(local_ray, prompt_file, tmp_path,
                                                                                 monkeypatch):
    broken = Path(shutil.copytree(DEMO_FOLDER, tmp_path / "broken_config"))
    (broken / "config.json").write_text("{not json")
    monkeypatch.setattr(RayRunner, "start", lambda self: pytest.fail("a worker was started"))
    with pytest.raises(sp.ModelLoadError, match=r"config.json is not valid JSON"):
        run_batch(options(prompt_file, tmp_path / "out", workers=2, model=ModelSpec(str(broken), device="cpu")))


def test_more_workers_or_threads_than_ray_has_are_one_sentence_before_any_worker(local_ray, prompt_file, tmp_path):
    cpus = int(ray.cluster_resources()["CPU"])
    for workers, threads, needle in [(cpus + 1, 0, f"--workers {cpus + 1} asks for a CPU core each at least, but"),
                                     (1, 99999, "--threads 99999 is more than the")]:
        runner = RayRunner(ModelSpec("demo", device="cpu", threads=threads), workers=workers, say=lambda text: None)
        with pytest.raises(WorkersUnavailable, match=needle) as caught:
            run_batch(options(prompt_file, tmp_path / f"out{workers}", workers=workers), runner=runner)
        message = str(caught.value)
        assert message.count(". ") == 0 and message.endswith(".") and "at most" in message
        assert runner.actors == []  # no worker was started


def test_an_address_where_no_ray_answers_is_one_sentence_within_seconds(prompt_file, tmp_path, capsys):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    rc = main(["batch", str(prompt_file), "--out", str(tmp_path / "out"), "--ray-address", f"127.0.0.1:{port}",
               "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and time.monotonic() - started < 60  # Ray's own retries took over 200 s, silently
    assert err.startswith(f"error: cannot reach the Ray cluster at 127.0.0.1:{port} (connection refused)")
    assert "\n" not in err and err.endswith("or check --ray-address.")
    assert not (tmp_path / "out" / "results.jsonl").exists()
