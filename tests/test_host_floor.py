"""benchmarks/host_floor.py: the budget pass's unavoidable tensor work beside the host work per pass.

No timing is asserted (speed comes from the benchmark command); what is checked: the command
runs on the demo model, reads the run's candidate rows and trees through the drafters' seams (and
puts them back), reports every row, and refuses impossible knobs before any work.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from sjd_pac_core.engine import drafters

ROOT = Path(__file__).resolve().parent.parent


def _host_floor():
    spec = importlib.util.spec_from_file_location("host_floor", ROOT / "benchmarks" / "host_floor.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_host_floor_reports_every_row_at_the_runs_shapes(tmp_path, capsys):
    original = drafters.Drafter.candidates_from_law, drafters.ranked_tree
    result = _host_floor().main(["--budget", "16", "--prompts", "1", "--seeds", "0", "--reps", "3",
                                 "--out", str(tmp_path / "floor.json")])
    assert (drafters.Drafter.candidates_from_law, drafters.ranked_tree) == original  # the seams are put back
    assert result["rows"] == 17 and result["candidate_rows"] >= 1 and result["width"] >= 2
    figures = result["ms_per_pass"]
    assert set(figures) == {"AR host work", "B=16 host work", "floor, warm", "floor, after a weights-sized read",
                            "the ranked tree's choice, warm", "the ranked tree's choice, after a weights-sized read"}
    assert all(ms > 0 for ms in figures.values())
    written = tmp_path / "floor.json"
    assert json.loads(written.read_text())["ms_per_pass"] == figures
    umask = os.umask(0)
    os.umask(umask)
    assert written.stat().st_mode & 0o777 == 0o666 & ~umask  # the mode open() gives, not a temp file's
    out = capsys.readouterr().out
    assert "| B=16 host work |" in out and "| 3 x AR's host work |" in out


def test_host_floor_refuses_impossible_knobs_before_any_work(capsys):
    for argv, says in ((["--budget", "0"], "--budget, --reps, --prompts and --threads must be at least 1"),
                       (["--budget", "5000"], "node_budget must be None, an integer from 1 to 1024"),
                       (["--reps", "10000000"], "--reps takes at most 100,000")):
        with pytest.raises(SystemExit):
            _host_floor().main(argv)
        assert says in capsys.readouterr().err
