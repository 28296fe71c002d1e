"""Before a run, a pass shape that is expected to be slower than AR on the device is named in one
sentence (sjd_pac_core/pass_cost.py), in the CLI, the app and the nodes. The rule is checked on
hand-made cost curves (no timing here); the measurement path runs once on the demo model."""

from __future__ import annotations

import pytest

import sjd_pac_core as sp
from sjd_pac_core import pass_cost
from sjd_pac_core.config import PROBE_SIZES
from sjd_pac_core.engine.window import CostCurve
from test_app import app_model  # noqa: F401  (fixtures)
from test_nodes import bridge, handle, model_setup, pack  # noqa: F401

# Forward seconds by pass size: a CPU where every token costs (about 0.1 ms a token over 2 ms), and a
# GPU where a pass of a few hundred tokens costs what one does.
CPU = CostCurve((1, 16, 64, 128), (2.15e-3, 3.37e-3, 10.09e-3, 20.0e-3))
GPU = CostCurve((1, 128, 512), (20e-3, 21e-3, 24e-3))

ROWS = [
    # (knobs, curve, slower than AR?)
    (dict(method="sjd_pac", window=12, tree_depth=2, tree_width=4, tree_first_width=None), CPU, False),  # demo default
    (dict(method="sjd_pac", window=128, tree_depth=4, tree_width=5), CPU, True),  # the widgets' largest shape
    (dict(method="sjd", window=128), CPU, True),
    (dict(method="sjd", window=32), CPU, False),
    (dict(method="sjd_pac", window=128, tree_depth=4, tree_width=5), GPU, False),  # a wide pass is nearly free
    (dict(method="sjd_pac", window="auto", tree_depth=4, tree_width=5), CPU, False),  # auto picks L from the curve
    (dict(method="ar", window=128), CPU, False),
    # a 13-token pass "measured" at 18 one-token passes: dearer than 13 separate passes, so timer
    # noise from a busy machine, not a slow shape (seen under a parallel test run)
    (dict(method="sjd", window=12), CostCurve((1, 13), (1e-3, 18e-3)), False),
]


@pytest.mark.parametrize("knobs, curve, slow", ROWS, ids=[str(r[0]) + ("-gpu" if r[1] is GPU else "") for r in ROWS])
def test_a_shape_slower_than_ar_is_named_in_one_sentence(knobs, curve, slow):
    config = sp.SamplerConfig(**knobs)
    note = pass_cost.slower_than_ar(config, curve, "this CPU")
    assert (note is not None) == slow, note
    if note:
        nodes = pass_cost.pass_nodes(config)
        assert f"({nodes} tokens)" in note and "expected to be slower than AR" in note
        assert note.endswith("'auto'.") and note.count(". ") == 0  # one sentence, with the fix
        assert f"about {curve(nodes) / curve(1):.0f} one-token passes" in note


def test_pass_nodes_count_the_window_and_the_tree():
    assert pass_cost.pass_nodes(sp.SamplerConfig(method="sjd", window=32)) == 33
    config = sp.SamplerConfig(method="sjd_pac", window=12, tree_depth=2, tree_width=4, tree_first_width=None)
    assert pass_cost.pass_nodes(config) == 1 + 12 + 3  # one level of 4: three side nodes


def test_the_curve_is_measured_on_the_model_once_per_shape(demo_model, monkeypatch):
    config = sp.SamplerConfig(method="sjd", window=40, cfg_scale=2.0)
    encoding = demo_model.encode_prompt("a red circle on a blue background", "", None)
    curve = pass_cost.cost_curve(demo_model, encoding, config)
    assert curve.sizes in ((1, 41), PROBE_SIZES)  # this shape's, or the one an auto run measured
    assert all(t > 0 for t in curve.seconds) and list(curve.seconds) == sorted(curve.seconds)
    monkeypatch.setattr(demo_model.token_model, "open_session", lambda *a: pytest.fail("measured twice"))
    assert pass_cost.cost_curve(demo_model, encoding, config) is curve


STEEP = CostCurve((1, 1000), (1e-3, 0.5))  # every token of a pass costs half an AR pass


def test_the_app_says_it_before_the_run(monkeypatch, app_model):  # noqa: F811
    from test_app import args_for, make_app

    monkeypatch.setattr(pass_cost, "cost_curve", lambda *a, **k: STEEP)
    spec, model = app_model
    app = make_app(spec, model)
    run = app.generate(*args_for(spec, model, method="sjd", window=64))
    first = next(run)
    while first[-1].get("forward_passes") is None and first[-1]["status"] != "progress":
        first = next(run)
    assert "expected to be slower than AR" in first[6]  # shown with the first frame
    assert first[-1].get("forward_passes", 0) <= 8
    final = list(run)[-1]
    assert "expected to be slower than AR" in final[5] and final[-1]["status"] == "finished"
    quick = list(app.generate(*args_for(spec, model, method="sjd", window=4)))[-1]
    assert "slower than AR" not in quick[6]  # 5 tokens a pass: at most 5 AR passes, never flagged


def test_the_nodes_say_it_before_the_run_and_in_the_stats(monkeypatch, pack, bridge, handle, caplog):  # noqa: F811
    from test_nodes import sampler_args

    monkeypatch.setattr(pass_cost, "cost_curve", lambda *a, **k: STEEP)
    bridge.hooks.progress = lambda *a: None
    seen = []
    caplog.set_level("WARNING", logger="sjd_pac.nodes")
    bridge.hooks.interrupt = lambda: seen.append(any("slower than AR" in r.message for r in caplog.records))
    try:
        _, stats = pack.NODE_CLASS_MAPPINGS["SJDPACSampler"]().sample(handle, **sampler_args(window=64))
    finally:
        bridge.reset_hooks()
    assert seen and seen[0]  # logged before the first forward pass
    text = pack.NODE_CLASS_MAPPINGS["SJDStats"]().report(stats)["result"][1]
    assert any(line.startswith("warning: A pass of L = 64") and "slower than AR" in line for line in text.splitlines())

