"""`sjd-pac` command line: every argument is checked before torch is imported (measured by the
imports, never by the clock), the summary line names the settings, and the app's entry point
explains a missing Gradio."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers")


def run_cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """`python -X importtime -m sjd_pac_core.cli ARGS`: stderr lists every module imported."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-X", "importtime", "-m", "sjd_pac_core.cli", *args],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def imported(proc: subprocess.CompletedProcess) -> set:
    """Top-level names of the modules the process imported (from -X importtime's lines)."""
    names = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


def error_lines(proc: subprocess.CompletedProcess) -> list:
    return [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]


def test_importtime_parser_sees_torch_when_it_is_imported():
    """Control: the import measurement below is able to see torch."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", "import torch"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert "torch" in imported(proc)


def test_help_does_not_import_torch():
    proc = run_cli("--help")
    assert proc.returncode == 0 and "generate" in proc.stdout and "bench" in proc.stdout
    assert not set(HEAVY) & imported(proc)
    proc = run_cli("generate", "--help")
    assert proc.returncode == 0 and "--upscale" in proc.stdout and not set(HEAVY) & imported(proc)


@pytest.fixture
def blocked_file(tmp_path):
    path = tmp_path / "a_file"
    path.write_text("not a folder")
    return path


@pytest.mark.parametrize("args, words", [
    (["--window", "0"], ["window (L)", "32, 64 or 'auto'"]),
    (["--window", "2.5"], ["window L", "32, 64 or 'auto'"]),
    (["--window", "2000"], ["1024"]),
    (["-D", "8", "-K", "4"], ["D <= 4", "K^(D-1)"]),
    (["-o", "{tmp}"], ["is a folder", "out.png"]),
    (["-o", "{tmp}/out.txt"], ["'.txt'", ".png"]),
    (["-o", "{tmp}/out"], ["no file extension"]),
    (["-o", "{file}/out.png"], ["cannot write into"]),
    (["--device", "gpu0"], ["gpu0", "cuda:N"]),
    (["--upscale", "100000"], ["--upscale", "between 1 and 16"]),
    (["--seed", "-5"], ["seed", "-1 for a random one"]),
    (["--temperature", "0"], ["temperature"]),
    (["--temperature", "1e-45"], ["temperature = 1e-45 is below", "smallest normal float32"]),
    (["--cfg-scale", "3.5e38"], ["cfg_scale = 3.5e+38 is above"]),
    (["--top-p", "1e-46"], ["top_p = 1e-46 is below"]),
])
def test_bad_arguments_are_refused_before_torch(args, words, tmp_path, blocked_file):
    args = [a.format(tmp=tmp_path, file=blocked_file) for a in args]
    proc = run_cli("generate", "a red circle", *args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    message = " ".join(error_lines(proc))
    assert all(w in message for w in words), message
    assert "Traceback" not in proc.stderr
    assert not set(HEAVY) & imported(proc), "validated after importing torch"
    assert not list(tmp_path.glob("*.png")) and not list(tmp_path.glob("out*"))


def test_bench_refuses_an_unwritable_out_before_running(blocked_file, capsys):
    from sjd_pac_core.cli import main

    assert main(["bench", "--out", str(blocked_file / "results"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "cannot write" in err


def test_check_writable_folder_creates_and_refuses(tmp_path, blocked_file):
    from sjd_pac_core.cli import ArgumentError, check_writable_folder

    assert check_writable_folder(str(tmp_path / "new" / "runs")).is_dir()
    with pytest.raises(ArgumentError, match="is a file"):
        check_writable_folder(str(blocked_file))


def test_generate_summary_names_the_settings_and_threads(tmp_path, capsys):
    from PIL import Image

    from sjd_pac_core.cli import main
    from sjd_pac_core.config import SamplerConfig
    from sjd_pac_core.settings import run_record

    out = tmp_path / "red.png"
    rc = main(["generate", "a red circle top left on a blue background.", "-o", str(out), "--quiet", "--seed", "1",
               "--upscale", "8", "--upscale-filter", "lanczos"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "does not know" not in captured.err  # the trailing full stop is not part of a word
    assert "Loading weights" not in captured.err and "%|" not in captured.err  # --quiet: no bar at all
    settings = next(line for line in captured.out.splitlines() if line.startswith("settings:"))
    from sjd_pac_core.models.demo import DemoImageModel

    demo = DemoImageModel.defaults  # the settings line names the demo's own defaults
    for part in ("method sjd_pac", f"window L {demo.window}", f"tree depth D {demo.tree_depth}, tree width K "
                 f"{demo.tree_width}", "CFG scale 2", "temperature 0.8", "verify gumbel", "1 CPU thread", "seed 1"):
        assert part in settings, settings
    assert "tokens per forward pass" in captured.out
    saved = Image.open(out)
    assert saved.size == (512, 512)
    record = json.loads(saved.info["sjd_pac"])  # the run can be reproduced from the file alone
    assert record["prompt"] == "a red circle top left on a blue background." and record["seed"] == 1
    assert set(record) == set(run_record(SamplerConfig(), prompt="", seed=0))  # the one record, as nodes and app
    assert record["method"] == "sjd_pac" and record["cfg_scale"] == 2.0 and record["window"] == demo.window


def test_the_loading_bar_shows_without_quiet(capsys):
    """Control for --quiet: transformers' loading bar does reach the captured stderr."""
    import sjd_pac_core as sp

    sp.load_model("demo")
    assert "Loading weights" in capsys.readouterr().err


def test_an_unknown_demo_word_is_refused_before_torch(tmp_path):
    """The demo's vocabulary is read from its vocab.json: no torch, no weights; every size is named."""
    proc = run_cli("generate", "a huge red circle", "-o", str(tmp_path / "out.png"))
    message = " ".join(error_lines(proc))
    assert proc.returncode == 2 and "huge" in message and "small, medium, large" in message, proc.stderr[-2000:]
    assert not set(HEAVY) & imported(proc), "the prompt was checked after importing torch"
    assert not list(tmp_path.iterdir())


def test_pointless_window_is_warned(capsys, tmp_path):
    from sjd_pac_core.config import SamplerConfig
    from sjd_pac_core.settings import pointless_setting_warnings, settings_line

    assert pointless_setting_warnings(SamplerConfig(method="sjd_pac", window=1))
    assert pointless_setting_warnings(SamplerConfig(method="sjd", window=1))
    assert not pointless_setting_warnings(SamplerConfig(method="sjd_pac", window=32))
    assert not pointless_setting_warnings(SamplerConfig(method="ar", window=1))
    assert pointless_setting_warnings(SamplerConfig(adaptive_continuation=False, proactive_drafting=False))
    line = settings_line(SamplerConfig(method="ar", cfg_scale=2.0), threads=1)
    assert line.startswith("method ar, CFG scale 2") and "tree depth" not in line and "1 CPU thread" in line


def test_trailing_punctuation_is_not_part_of_a_word():
    from sjd_pac_core.demo.captions import caption_words

    assert caption_words("A red circle, on a blue background.") == ["a", "red", "circle", "on", "a", "blue",
                                                                     "background"]
    assert caption_words("(red) star!  ...") == ["red", "star"]


def test_app_without_gradio_says_how_to_install_it(monkeypatch, capsys):
    import sjd_pac_app.main as app_main

    monkeypatch.setitem(sys.modules, "gradio", None)  # `import gradio` now fails as if not installed
    monkeypatch.delitem(sys.modules, "sjd_pac_app.app", raising=False)
    assert app_main.main(["--port", "0"]) == 2
    assert "pip install 'sjd-pac[app]'" in capsys.readouterr().err


def test_compile_flag_reaches_the_sampler_config_and_the_bench_rows():
    from sjd_pac_core.bench.cli import _grid_from_args
    from sjd_pac_core.cli import _config_from_args, build_parser

    args = build_parser().parse_args(["generate", "a red square", "--compile"])
    assert _config_from_args(args).compile is True
    assert _config_from_args(build_parser().parse_args(["generate", "a red square"])).compile is False
    argv = ["bench", "--methods", "generate,ar,sjd-pac@32", "--compile"]
    bench = build_parser(argv).parse_args(argv)
    assert [(s.key, s.compiled) for s in _grid_from_args(bench, "ar")] == [
        ("generate", False), ("ar:compile", True), ("sjd-pac@32:compile", True)]


def test_check_finite_and_the_seed_note(tmp_path, capsys, monkeypatch):
    """--check-finite reaches load_model; a rejection run with window auto says that its seed
    reproduces only the distribution (a gumbel run says nothing of the kind)."""
    import sjd_pac_core as sp
    from sjd_pac_core.cli import main

    calls = []
    original = sp.load_model
    monkeypatch.setattr(sp, "load_model", lambda *args, **kwargs: calls.append(kwargs) or original(*args, **kwargs))
    out = tmp_path / "out.png"
    base = ["generate", "a red circle", "-o", str(out), "--quiet", "--method", "sjd", "--window", "auto"]
    assert main([*base, "--check-finite", "--verify", "rejection"]) == 0
    captured = capsys.readouterr()
    assert calls[-1]["check_finite"] is True
    assert "note: with verify 'rejection' and window 'auto'" in captured.out
    assert saved_record(out)["seed_reproduces"] == "distribution"
    assert main([*base, "--verify", "gumbel"]) == 0
    captured = capsys.readouterr()
    assert calls[-1]["check_finite"] is None and "note:" not in captured.out
    assert saved_record(out)["seed_reproduces"] == "picture"


def saved_record(path: Path) -> dict:
    from PIL import Image

    return json.loads(Image.open(path).info["sjd_pac"])


def forward_passes(argv, capsys) -> int:
    from sjd_pac_core.cli import main

    assert main(argv) == 0
    out = capsys.readouterr().out
    return int(re.search(r"tokens in (\d+) forward passes", out).group(1))


def test_a_node_budget_alone_runs_as_with_the_auto_window(tmp_path, capsys):
    """`--node-budget 128` with no window counts the passes of window auto (the README's figures),
    not those of the demo's own window, which caps the budget's main chain (the control)."""
    base = ["generate", "a large orange circle top right on a blue background", "-o", str(tmp_path / "out.png"),
            "--quiet", "--node-budget", "128"]
    alone = forward_passes(base, capsys)
    assert alone == forward_passes([*base, "--window", "auto"], capsys)
    assert alone < forward_passes([*base, "--window", "12"], capsys)


def test_quantizing_the_demo_is_refused_before_torch(tmp_path):
    proc = run_cli("generate", "a red circle", "--quantize", "int8", "-o", str(tmp_path / "out.png"))
    (line,) = error_lines(proc)
    assert proc.returncode == 2 and "--quantize int8 is for the real families" in line and "7B" in line
    assert "device_map" not in line and not set(HEAVY) & imported(proc)


# --- help for every flag ---------------------------------------------------------------------------

def flags_without_help(parser: argparse.ArgumentParser, name: str = "sjd-pac"):
    """'command flag' for every argument of `parser` and its subcommands that has no help text."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, child in action.choices.items():
                yield from flags_without_help(child, f"{name} {command}")
        elif not action.help:
            yield f"{name} {'/'.join(action.option_strings) or action.dest}"


def test_the_help_walk_finds_a_flag_without_help():
    """Control: the walk below sees an undocumented flag, in a subcommand too."""
    parser = argparse.ArgumentParser(prog="x")
    parser.add_subparsers().add_parser("run").add_argument("--silent-flag")
    assert list(flags_without_help(parser)) == ["sjd-pac run --silent-flag"]


@pytest.mark.parametrize("argv", [["generate"], ["bench"]])  # bench and lossless are built only when asked for
def test_every_flag_of_every_subcommand_has_help(argv):
    from sjd_pac_core.cli import build_parser

    parser = build_parser(argv)
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert {"generate", "batch", "bench", "lossless"} <= set(commands)
    assert list(flags_without_help(parser)) == []


def test_the_help_states_the_real_defaults():
    from sjd_pac_core.cli import build_parser
    from sjd_pac_core.config import SamplerConfig
    from sjd_pac_core.models.demo import DemoImageModel

    generate = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["generate"]
    helps = {a.dest: a.help for a in generate._actions}
    assert f"demo {DemoImageModel.defaults.window}, the others {SamplerConfig().window}" in helps["window"]
    assert "'auto' with --node-budget" in helps["window"]
    assert DemoImageModel.defaults.tree_first_width is None and "K at every level for the demo" in helps[
        "tree_first_width"]
    assert f"the model's - {SamplerConfig().tree_first_width}," in helps["tree_first_width"]
