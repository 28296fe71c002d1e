"""window="auto": the cost curve and the survival estimate behind the choice of L."""

from __future__ import annotations

import torch

import sjd_pac_core as sp
from exactness_tools import seed_exact_lm
from sjd_pac_core.engine.window import AutoWindow, CostCurve


def test_cost_curve_interpolates_and_extrapolates():
    curve = CostCurve((1, 8, 16), (1.0, 2.0, 4.0))
    assert curve(1) == 1.0 and curve(4) == 1.0 + 3 / 7 and curve(12) == 3.0 and curve(24) == 6.0
    assert curve.relative() == {1: 1.0, 8: 2.0, 16: 4.0}


def test_expected_tokens_follow_the_observed_hazard():
    policy = AutoWindow(CostCurve((1, 128), (1.0, 1.0)), decay=1.0)
    for _ in range(50):  # every pass rejects its third draft: A == 2 always
        policy.observe(2, censored=False, window=8)
    assert abs(policy.expected_tokens(1) - 2.0) < 1e-9
    assert abs(policy.expected_tokens(8) - 3.0) < 1e-9


def test_flat_cost_and_long_runs_choose_a_long_window():
    policy = AutoWindow(CostCurve((1, 128), (1.0, 1.1)))
    for _ in range(20):
        policy.observe(16, censored=True, window=16)
    assert policy.next_window() >= 48


def test_steep_cost_and_short_runs_choose_a_short_window():
    policy = AutoWindow(CostCurve((1, 2, 128), (1.0, 1.2, 60.0)))
    for _ in range(20):
        policy.observe(0, censored=False, window=16)
    assert policy.next_window() <= 2


def test_auto_window_keeps_the_ar_tokens():
    lm = seed_exact_lm()
    prompt = torch.tensor([5, 9, 13])
    for seed in range(3):
        ar = sp.sample_tokens(lm, prompt, 100, config=sp.SamplerConfig(method="ar", verify="gumbel"), seed=seed)
        auto = sp.sample_tokens(lm, prompt, 100, seed=seed,
                                config=sp.SamplerConfig(method="sjd_pac", window="auto", verify="gumbel"))
        assert torch.equal(ar.tokens, auto.tokens)
        assert len({r.window for r in auto.stats.records[1:]}) >= 1
