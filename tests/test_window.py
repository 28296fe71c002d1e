"""window="auto": the cost curve and the survival estimate behind the choice of L."""

from __future__ import annotations

import random

import pytest
import torch

import sjd_pac_core as sp
from exactness_tools import MarkovChain, MarkovModel, planted_fault, seed_exact_lm
from sjd_pac_core.engine import drafters
from sjd_pac_core.engine.window import AutoWindow, CostCurve

# A GPU-like cost: passes of up to ~64 nodes cost about as much as one token, then linear.
CHEAP_PASSES = CostCurve((1, 16, 64, 128), (1.0, 1.02, 1.25, 2.5))


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


def test_tree_levels_and_chain_runs_are_counted_apart():
    policy = AutoWindow(CostCurve((1, 128), (1.0, 1.0)), decay=1.0)
    for _ in range(50):  # the tree's two levels always pass; the chain's first draft is always wrong
        policy.observe(2, censored=False, window=16, tree_levels=2)
    assert abs(policy.expected_tokens(16) - 3.0) < 1e-9 and policy.next_window() == 2
    policy = AutoWindow(CostCurve((1, 128), (1.0, 1.0)), decay=1.0)
    policy.observe(1, censored=False, window=16, tree_levels=2)  # once through the first level
    for _ in range(50):  # then the tree ends every pass at its first level: the chain is never reached
        policy.observe(0, censored=False, window=16, tree_levels=2)
    assert not policy.chain.at_risk and policy.tree.hazards(1)[0] == 50 / 51
    assert policy.next_window() == 1  # the chain adds nothing: flat costs do not buy a longer window


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
        records = auto.stats.records
        away_from_the_end = [r.window for r, before in zip(records[1:], records) if 100 - before.total_committed > 16]
        assert set(away_from_the_end) != {16}, "the auto window never moved from its start value"


# --- the policy adapts: long windows where drafts survive, L = 1 where they never do ----------

def picked_windows(policy: AutoWindow, accept: float, passes: int = 60, seed: int = 0) -> list:
    """Drive the policy with passes whose drafts are each accepted with probability `accept`
    (the accepted run is geometric, cut at the window); return the window it picked each time."""
    rng = random.Random(seed)
    picked = []
    for _ in range(passes):
        window = policy.next_window()
        picked.append(window)
        run = 0
        while run < window and rng.random() < accept:
            run += 1
        policy.observe(run, censored=run == window, window=window)
    return picked


def long_window_share(windows: list) -> float:
    return sum(w > 1 for w in windows) / len(windows)


def test_high_acceptance_and_cheap_passes_choose_long_windows():
    windows = picked_windows(AutoWindow(CHEAP_PASSES), accept=0.95)
    assert long_window_share(windows) >= 0.9, windows
    assert sorted(windows)[len(windows) // 2] >= 16, windows


def test_every_draft_rejected_chooses_a_window_of_one():
    windows = picked_windows(AutoWindow(CHEAP_PASSES), accept=0.0)
    assert windows[0] == 16  # the start value, before any pass was seen
    assert all(w == 1 for w in windows[1:]), windows


def test_window_grows_with_acceptance():
    medians = []
    for accept in (0.3, 0.7, 0.95):
        windows = picked_windows(AutoWindow(CostCurve((1, 128), (1.0, 6.0))), accept=accept, passes=80)
        medians.append(sorted(windows)[len(windows) // 2])
    assert medians[0] < medians[1] < medians[2], medians


def _iid_chain(num_tokens: int) -> MarkovChain:
    """Every token i.i.d. and peaked (97 % on token 0): the stale proposal equals the target,
    so every draft is accepted."""
    first = torch.tensor([4.0, 0.0, 0.0, 0.0])
    return MarkovChain(first, first.expand(num_tokens, 4, 4).clone())


def _never_right_chain(num_tokens: int) -> MarkovChain:
    """x_t = x_(t-1) + 1 mod 4: a draft made in any other context is wrong, so every draft after
    the first pass is rejected (no other token has any mass, so PD has no siblings to offer)."""
    step = torch.full((4, 4), float("-inf"))
    step[torch.arange(4), (torch.arange(4) + 1) % 4] = 0.0
    return MarkovChain(torch.zeros(4), step.expand(num_tokens, 4, 4).clone())


def sampled_windows(chain: MarkovChain, seed: int = 0) -> list:
    model = MarkovModel({(0,): chain})
    # The default tree at every pass (K = 2 fits the 4-token vocabulary): the policy counts the
    # tree's levels and the chain's own run separately, so a chain whose drafts are always wrong
    # drains the window even though the tree ends every pass.
    config = sp.SamplerConfig(method="sjd_pac", window="auto", tree_width=2)
    out = sp.sample_tokens(model, torch.tensor([0]), chain.num_tokens, config=config, seed=seed)
    remaining = [chain.num_tokens - r.total_committed for r in out.stats.records]
    # the window of each pass that had more than one token left to fill (the end caps L)
    return [r.window for r, left in zip(out.stats.records[1:], remaining) if left > 1]


def test_sample_tokens_uses_long_windows_where_drafts_are_accepted():
    windows = sampled_windows(_iid_chain(400))
    assert long_window_share(windows) >= 0.8, windows


@pytest.mark.parametrize("seed", [0, 1, 5])
def test_sample_tokens_uses_a_window_of_one_where_drafts_are_rejected(seed, monkeypatch):
    # The drafts a pass already carries (Adaptive Continuation) stay in the window, so after the
    # policy drops to L = 1 the window drains by one per pass instead of at once. With seeds 1 and
    # 5 the first pass is not rejected (its few drafts happen to be right), the policy grows the
    # window to 48-96, and the drain takes as many passes; what must hold for every seed: at most
    # one pass per carried draft to drain, and once drained the window stays at 1-2. The run's
    # neighbour law would learn this chain's one rule and make the first draft right: left out.
    original = drafters.make_drafter

    def without_the_law(config):
        drafter = original(config)
        drafter.mixture = drafters.FirstDraftMixture(None, 0.0)
        return drafter

    monkeypatch.setattr(drafters, "make_drafter", without_the_law)
    windows = sampled_windows(_never_right_chain(120), seed)
    drained = next((i for i, w in enumerate(windows) if w <= 2), None)
    assert drained is not None and drained <= max(windows[: drained + 1]), windows
    after = windows[drained:]
    assert len(after) >= 20 and sum(w <= 2 for w in after) >= 0.9 * len(after), windows


def test_planted_auto_window_always_1_is_caught():
    with planted_fault("auto_window_always_1") as calls:
        policy_windows = picked_windows(AutoWindow(CHEAP_PASSES), accept=0.95)
        run_windows = sampled_windows(_iid_chain(400))
    assert calls.count > 0
    assert long_window_share(policy_windows) < 0.9
    assert long_window_share(run_windows) < 0.8


# --- what lies past the window is read from the deep positions, not the mean hazard ------------

# The demo's compiled cost per pass of n nodes (ms, as the bench's header prints it), candidates 8-64.
DEMO_COMPILED = CostCurve((9, 17, 33, 65), (2.33, 2.80, 4.11, 6.42))


def picked_with_hazards(policy: AutoWindow, hazards, passes: int = 200, seed: int = 0) -> list:
    """Drive the policy with runs whose hazard at draft k is hazards(k)."""
    rng = random.Random(seed)
    picked = []
    for _ in range(passes):
        window = policy.next_window()
        picked.append(window)
        run = 0
        while run < window and rng.random() >= hazards(run):
            run += 1
        policy.observe(run, censored=run == window, window=window)
    return picked


def demo_like_hazard(k: int) -> float:
    """As measured for SJD+AC on the demo: the first draft is rejected half the time (its context
    changed the most), deeper ones rarely."""
    return 0.55 if k == 0 else 0.3 if k == 1 else 0.05


def test_a_window_shrunk_to_its_smallest_candidate_grows_back_where_deep_drafts_survive():
    """With these hazards L=16 commits ~27% more per pass than L=8 at 20% more cost, so 16 wins.
    Before, the hazard past the window was the mean over the positions seen (0.22 here: the first
    draft dominates it), a window at 8 never saw the longer runs, and it stayed there (planted
    below). The candidates are the compiled ones (8, 16, 32, 64)."""
    windows = picked_with_hazards(AutoWindow(DEMO_COMPILED, start=8, candidates=(8, 16, 32, 64)), demo_like_hazard)
    assert sorted(windows)[len(windows) // 2] >= 16, windows


def test_planted_mean_hazard_extrapolation_stays_at_the_short_window(monkeypatch):
    from sjd_pac_core.engine import window as window_module

    monkeypatch.setattr(window_module._Survival, "tail_hazard", window_module._Survival.mean_hazard)
    windows = picked_with_hazards(AutoWindow(DEMO_COMPILED, start=8, candidates=(8, 16, 32, 64)), demo_like_hazard)
    assert sorted(windows)[len(windows) // 2] == 8, windows


# --- window="auto" chooses the tree too (eager runs with a PD tree) -----------------------------

from sjd_pac_core.engine.window import AutoTreeWindow, _SlotRanks, narrower_trees  # noqa: E402

# A CPU-like cost: every node adds as much as a tenth of a one-token pass (the demo on one core).
NODE_LINEAR = CostCurve((1, 128), (1.0, 13.7))


def test_narrower_trees_are_the_configured_tree_and_its_cheaper_cousins():
    assert narrower_trees((8, 4)) == ((), (2,), (4,), (8,), (2, 2), (2, 4), (4, 2), (4, 4), (8, 2), (8, 4))
    assert narrower_trees((3,)) == ((), (2,), (3,))
    assert narrower_trees(()) == ((),)


def test_slot_ranks_read_any_narrower_width_and_respect_censoring():
    ranks = _SlotRanks(decay=1.0)
    for slot in [0] * 50 + [1] * 25 + [3] * 5:  # passes with 4 candidates, each took this slot
        ranks.add((4,), (slot,), accepted=1)
    for _ in range(20):  # ... and 20 rejected all 4
        ranks.add((4,), (), accepted=0)
    assert abs(ranks.passed(0, 1) - 0.5) < 1e-9 and abs(ranks.passed(0, 2) - 0.75) < 1e-9
    assert abs(ranks.passed(0, 4) - 0.8) < 1e-9
    for _ in range(100):  # one-candidate passes that failed: they say only "slot >= 1"
        ranks.add((1,), (), accepted=0)
    assert abs(ranks.passed(0, 1) - 50 / 200) < 1e-9  # slot 0's hazard counts them
    assert abs(ranks.passed(0, 2) - (1 - 150 / 200 * (1 - 25 / 50))) < 1e-9  # slot 1's does not
    # a slot never tried takes the last measured slot's hazard, a level never reached the one above's
    assert abs((1 - ranks.passed(0, 5)) - (1 - ranks.passed(0, 4)) * (1 - 5 / 25)) < 1e-9
    assert ranks.passed(1, 2) == ranks.passed(0, 2) and _SlotRanks(0.9).passed(0, 4) == 0.0


def drive_tree_policy(policy: AutoTreeWindow, slot_law, chain_accept: float, passes: int = 120, seed: int = 0):
    """Passes whose tree levels take slot s with probability slot_law[s] (None past the list:
    all candidates rejected) and whose chain drafts are each accepted with chain_accept."""
    rng = random.Random(seed)
    choices = []
    for _ in range(passes):
        window, tree = policy.next_window(), policy.next_tree()
        choices.append((window, tree))
        levels = min(len(policy.full_tree), window)
        widths = (tuple(tree) + (1,) * levels)[:levels]
        branch = []
        for width in widths:
            slot = rng.choices(range(len(slot_law) + 1), weights=list(slot_law) + [1 - sum(slot_law)])[0]
            if slot >= width:
                break
            branch.append(slot)
        accepted = len(branch)
        if accepted == levels and all(s == 0 for s in branch):
            while accepted < window and rng.random() < chain_accept:
                accepted += 1
        ended_in_tree = accepted == levels and any(branch)
        policy.observe(accepted, censored=accepted == window or ended_in_tree, window=window,
                       tree_levels=len(tree), branch=tuple(branch) + (0,) * (accepted - len(branch)),
                       widths=tree)
    return choices


def steady(choices):
    """The choice made most often after the first 20 passes."""
    tail = choices[20:]
    return max(set(tail), key=tail.count)


def test_flat_costs_keep_the_configured_tree_where_side_slots_win():
    """A narrower tree must promise SHRINK_GAIN more speed; with the configured tree, L is
    AutoWindow's choice."""
    policy = AutoTreeWindow(CostCurve((1, 128), (1.0, 1.1)), narrower_trees((8, 4)))  # a GPU's flat cost
    choices = drive_tree_policy(policy, slot_law=(0.4, 0.15, 0.1, 0.08, 0.05, 0.04, 0.03, 0.03), chain_accept=0.9)
    assert all(tree == (8, 4) for _, tree in choices), choices
    assert sorted(w for w, _ in choices[20:])[50] >= 8, choices  # and a chain after the tree


def test_costly_nodes_choose_a_small_tree_and_the_exploration_passes_stay_full():
    policy = AutoTreeWindow(NODE_LINEAR, narrower_trees((8, 4)))
    choices = drive_tree_policy(policy, slot_law=(0.5, 0.1, 0.04, 0.02, 0.01, 0.01, 0.01, 0.01), chain_accept=0.8)
    window, tree = steady(choices)
    assert len(tree) <= 1 and (not tree or tree[0] <= 4), choices[-10:]
    explored = [i for i, (_, t) in enumerate(choices) if t == (8, 4)]
    assert explored[:4] == [0, 1, 2, 3], explored  # the first passes explore the full tree
    assert {AutoTreeWindow.EXPLORE_EVERY - 1, AutoTreeWindow.EXPLORE_EVERY} & set(explored), explored  # and again later


def test_the_pass_overhead_makes_short_windows_dearer():
    cheap_overhead = AutoWindow(NODE_LINEAR)
    dear_overhead = AutoWindow(NODE_LINEAR)
    for _ in range(30):
        dear_overhead.note_overhead(5.0)  # five one-token forwards outside every pass
    assert abs(dear_overhead.pass_overhead - 5.0) < 0.01 and dear_overhead.pass_cost(1) > 5.9
    cheap = sorted(picked_windows(cheap_overhead, accept=0.8, passes=80))[40]
    dear = sorted(picked_windows(dear_overhead, accept=0.8, passes=80))[40]
    assert dear > cheap, (cheap, dear)


def test_auto_tree_choices_keep_the_ar_tokens(monkeypatch):
    """Whatever (L, tree) the policy picks, from its past only, the gumbel rule gives AR's tokens:
    here it picks at random among every narrower tree and window."""
    rng = random.Random(0)
    picked = set()

    def random_pair(self):
        window, tree = rng.choice(self.candidates[:6]), rng.choice(self.trees)
        picked.add(tree)
        self.tree_choice = tree
        return window

    monkeypatch.setattr(AutoTreeWindow, "_best_window", random_pair)
    monkeypatch.setattr(AutoTreeWindow, "EXPLORE_FIRST", 0)
    lm = seed_exact_lm()
    prompt = torch.tensor([5, 9, 13])
    for seed in range(2):
        config = sp.SamplerConfig(method="sjd_pac", window="auto", verify="gumbel", cfg_scale=1.5)
        ar = sp.sample_tokens(lm, prompt, 80, config=config.with_(method="ar"), seed=seed, uncond_prompt_ids=[2])
        auto = sp.sample_tokens(lm, prompt, 80, config=config, seed=seed, uncond_prompt_ids=[2])
        assert torch.equal(ar.tokens, auto.tokens)
        assert len({r.tree_nodes for r in auto.stats.records[1:]}) >= 4
    assert len(picked) >= 6


# --- what a seed reproduces under window="auto" ------------------------------------------------

FLAT_COSTS = CostCurve((1, 128), (1.0, 1.0))  # a device where every pass size costs the same
STEEP_COSTS = CostCurve((1, 128), (1.0, 128.0))  # one where every node costs a token's pass


@pytest.mark.parametrize("method, auto", [("sjd", dict(window="auto")), ("sjd_pac", dict(window="auto")),
                                          ("sjd_pac", dict(window=32, node_budget="auto"))])
def test_auto_windows_from_two_devices_keep_gumbel_tokens_and_change_rejection_ones(monkeypatch, method, auto):
    """The auto window (and node_budget="auto"'s pass size) follows the measured cost of a pass, so
    two devices (or two runs of one busy device) choose different passes for one seed. Gumbel fixes every token by (seed,
    position): the same picture whatever the windows. Rejection draws its coins in the order the
    passes ask for them: another picture, which is why the app, the CLI and the run record say
    that its seed reproduces only the distribution (settings.seed_reproduces_picture)."""
    from sjd_pac_core.engine import loop
    from sjd_pac_core.settings import seed_reproduces_picture

    lm = seed_exact_lm()
    prompt = torch.tensor([5, 9, 13])
    runs = {}
    for verify in ("gumbel", "rejection"):
        config = sp.SamplerConfig(method=method, verify=verify, **auto)
        for name, costs in (("flat", FLAT_COSTS), ("steep", STEEP_COSTS)):
            monkeypatch.setattr(loop, "measure_cost_curve", lambda *args, _costs=costs, **kwargs: _costs)
            runs[verify, name] = sp.sample_tokens(lm, prompt, 100, config=config, seed=5)
    windows = {key: [(r.window, r.tree_nodes) for r in out.stats.records[1:]] for key, out in runs.items()}
    assert windows["gumbel", "flat"] != windows["gumbel", "steep"], windows  # the devices chose differently
    assert windows["rejection", "flat"] != windows["rejection", "steep"], windows
    ar = sp.sample_tokens(lm, prompt, 100, config=sp.SamplerConfig(method="ar", verify="gumbel"), seed=5)
    assert torch.equal(runs["gumbel", "flat"].tokens, runs["gumbel", "steep"].tokens)
    assert torch.equal(runs["gumbel", "flat"].tokens, ar.tokens)
    assert not torch.equal(runs["rejection", "flat"].tokens, runs["rejection", "steep"].tokens)
    assert seed_reproduces_picture(runs["gumbel", "flat"].config)
    assert not seed_reproduces_picture(runs["rejection", "flat"].config)
