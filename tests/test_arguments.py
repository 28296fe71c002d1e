"""Count, rate and list arguments of the command-line tools: refused while parsing, before any
work, with one sentence (sjd_pac_core/arguments.py, shared by every tool)."""

from __future__ import annotations

import argparse
import os

import pytest

from sjd_pac_core import arguments


def _cli(argv):
    from sjd_pac_core.cli import main

    return main(argv)


def _tool(module: str):
    def run(argv):
        import importlib

        return importlib.import_module(module).main(argv)

    return run


TRAIN = _tool("sjd_pac_core.demo.tools.train")
QUALITY = _tool("sjd_pac_core.demo.tools.quality")
CALIBRATE = _tool("sjd_pac_core.demo.tools.calibrate")
DRAFTING = _tool("sjd_pac_core.bench.drafting")
HARDWARE = _tool("sjd_pac_core.bench.hardware")
QUANTIZED = _tool("sjd_pac_core.bench.quantized")


# (tool, argv, words the one error line must hold)
ROWS = [
    (_cli, ["bench", "--prompts", "0"], ["--prompts", "between 1 and", "got 0", "every prompt"]),
    (_cli, ["bench", "--prompts", "-1"], ["--prompts", "got -1"]),
    (_cli, ["bench", "--methods", ""], ["--methods", "is empty", "ar,sjd-pac@64"]),
    (_cli, ["bench", "--methods", ","], ["--methods", "is empty"]),
    (_cli, ["bench", "--rules", ""], ["--rules", "is empty"]),
    (_cli, ["bench", "--windows", " "], ["--windows", "is empty"]),
    (_cli, ["bench", "--budgets", "0"], ["--budgets", "not a node budget", "none,32,64,128,256"]),
    (_cli, ["bench", "--budgets", "64,2000"], ["--budgets", "from 1 to 1024"]),
    (_cli, ["bench", "--budgets", ","], ["--budgets", "names no budget"]),
    (_cli, ["bench", "--budgets", "64,64"], ["--budgets", "twice"]),
    (_cli, ["generate", "x", "--node-budget", "-3"], ["--node-budget", "got -3", "128"]),
    (_cli, ["generate", "x", "--node-budget", "5000"], ["--node-budget", "1 to 1024", "got 5000"]),
    (_cli, ["generate", "x", "--node-budget", "lots"], ["--node-budget", "whole number"]),
    (_cli, ["lossless", "--seeds", ""], ["--seeds", "names no seed"]),
    (_cli, ["lossless", "--seeds", "0-100000000000"], ["--seeds", "more than 100,000 seeds"]),
    (_cli, ["lossless", "--seeds", "9-3"], ["--seeds", "runs backwards", "3-9"]),
    (_cli, ["lossless", "--seeds", "1,1"], ["--seeds", "twice"]),
    (_cli, ["lossless", "--seeds", "x"], ["--seeds", "ranges (0-9)"]),
    (_cli, ["lossless", "--permutations", "-1"], ["--permutations", "got -1", "1999"]),
    (_cli, ["lossless", "--gumbel-pairs", "-1"], ["--gumbel-pairs", "got -1", "0 skips"]),
    (_cli, ["lossless", "--control-temperature", "nan"], ["--control-temperature", "0 = no control"]),
    (_cli, ["bench", "--threads", "-1"], ["--threads", "got -1", "cores"]),
    (_cli, ["bench", "--threads", "99999"], ["--threads", "got 99999", "cores"]),
    (_cli, ["bench", "--locality-samples", "-2"], ["--locality-samples", "0 skips"]),
    (_cli, ["generate", "x", "--threads", "99999"], ["--threads", "cores"]),
    (_cli, ["generate", "x", "--batch-size", "0"], ["--batch-size", "between 1 and 64"]),
    (TRAIN, ["--caption-dropout", "2.0"], ["--caption-dropout", "below 1", "got 2.0"]),
    (TRAIN, ["--caption-dropout", "-0.1"], ["--caption-dropout", "at least 0"]),
    (TRAIN, ["--images", "0"], ["--images", "got 0"]),
    (TRAIN, ["--lm-lr", "0"], ["--lm-lr", "above 0"]),
    (TRAIN, ["--lm-lr", "inf"], ["--lm-lr"]),
    (TRAIN, ["--threads", "0"], ["--threads", "cores"]),
    (TRAIN, ["--hidden", "130", "--heads", "4"], ["--hidden 130", "multiple of --heads 4"]),
    (TRAIN, ["--seed", "-3"], ["--seed", "0 to 2^64-1"]),
    (QUALITY, ["--n", "0"], ["--n", "got 0"]),
    (QUALITY, ["--seeds", "0", "-1"], ["--seeds", "got -1"]),
    (QUALITY, ["--temperature", "0"], ["--temperature", "above 0"]),
    (QUALITY, ["--threads", "-1"], ["--threads"]),
    (CALIBRATE, ["--window", "0"], ["--window", "between 1 and 1024"]),
    (CALIBRATE, ["--sjd-runs", "-1"], ["--sjd-runs"]),
    (CALIBRATE, ["--threads", "99999"], ["--threads", "cores"]),
    (DRAFTING, ["--prompts", "0"], ["--prompts"]),
    (DRAFTING, ["--budgets", "0"], ["--budgets", "between 1 and 1024"]),
    (HARDWARE, ["--budgets", "32,x"], ["--budgets", "not a node budget"]),
    (HARDWARE, ["--demo-seeds", "0-100000000000"], ["--demo-seeds", "100,000"]),
    (HARDWARE, ["--rounds", "0"], ["--rounds"]),
    (QUANTIZED, ["--threads", "-1"], ["--threads"]),
    (QUANTIZED, ["--tokens", "0"], ["--tokens"]),
]


@pytest.mark.parametrize("tool, argv, words", ROWS, ids=[" ".join(r[1]) or "empty" for r in ROWS])
def test_a_bad_count_is_one_sentence_at_parse_time(tool, argv, words, capsys, monkeypatch):
    import sjd_pac_core as sp

    def no_work(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(sp, "load_model", no_work)
    with pytest.raises(SystemExit) as exit_info:
        tool(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in errors[0], errors[0]


def test_good_values_parse():
    assert arguments.seed_list("0-4,10") == [0, 1, 2, 3, 4, 10]
    assert arguments.seed_list(f"{2**64 - 2}-{2**64 - 1}") == [2**64 - 2, 2**64 - 1]
    assert arguments.whole(1, 5)("5") == 5 and arguments.real(0, 1, below=True)("0.12") == 0.12
    assert arguments.threads()("0") == 0 and arguments.threads()(str(os.cpu_count() or 1)) == (os.cpu_count() or 1)
    assert arguments.window("auto") == "auto" and arguments.window("32") == 32
    with pytest.raises(argparse.ArgumentTypeError):
        arguments.threads(allow_default=False)("0")


def test_a_long_seed_range_is_refused_without_building_it():
    """The bound is checked on the range's length, so a 10^11-seed range costs nothing."""
    import tracemalloc

    tracemalloc.start()
    with pytest.raises(argparse.ArgumentTypeError):
        arguments.seed_list("0-100000000000")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20
