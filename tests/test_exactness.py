"""Exact-distribution tests (spec section 7).

Every lossless mode samples many short sequences from a tiny random transformers causal LM
(vocabulary 3, 5 image tokens, peaked conditionals that depend on the whole prefix), and the
counts are compared with the exact joint distribution, enumerated by plain full forwards:
chi-square p-value above 1e-3 and total variation within 1.5x the sampling-noise level. The
negative controls plant known bugs and must fail the same test.

Most configurations read the model's exact conditionals from a table (TableModel) so that tens of
thousands of samples take seconds; one configuration runs the real model with its KV cache in
the loop, and the seed-exact tests cover the cache mechanics token by token.
"""

from __future__ import annotations

import pytest
import torch

import sjd_pac_core as sp
import sjd_pac_core.sampling.rules as rules
from exactness_tools import (
    MarkovChain,
    MarkovModel,
    RejectionConfig,
    TableModel,
    compare,
    conditional_logits,
    draw_samples,
    draw_sequences,
    exact_joint,
    markov_marginal_pvalue,
    planted_fault,
    side_branch_share,
    tiny_causal_lm,
)
from sjd_pac_core.sampling.recipe import TokenConstraints

V, N = 3, 5
PROMPT = torch.tensor([0, 1])
UNCOND = torch.tensor([2])
P_VALUE_MIN = 1e-3
TV_FACTOR = 1.5


@pytest.fixture(scope="module")
def tiny():
    model = tiny_causal_lm(V)
    cond = conditional_logits(model, PROMPT, V, N)
    uncond = conditional_logits(model, UNCOND, V, N)
    return model, cond, uncond, TableModel({(0, 1): cond, (2,): uncond}, V)


FORCED = TokenConstraints(V, N, forced=torch.tensor([-1, -1, 1, -1, -1]))


# Sample sizes: each case keeps the power to fail the planted faults that reach its code path
# (residual replaced by p for a chain that rejects, last accepted candidate wins for a tree,
# a greedy first tree draft for the every-pass tree), measured at these sizes with seeds 10**6+:
# residual p < 1e-20 (chain cases < 1e-50), last-accepted and greedy p < 1e-100 already at 1000
# samples (every case's numbers are in the commit that set them). "ar" has no drafts (no fault
# reaches it): it checks the harness against the sampler's plain draws.
CASES = {
    "ar": (RejectionConfig(method="ar"), None, 4000),
    "sjd_L2_shorter_than_sequence": (RejectionConfig(method="sjd", window=2), None, 3000),
    "sjd_L8_longer_than_sequence": (RejectionConfig(method="sjd", window=8), None, 3000),
    "sjd_uniform_init": (RejectionConfig(method="sjd", window=4, init_proposal="uniform"), None, 3000),
    "sjd_ac_only": (RejectionConfig(method="sjd_pac", window=3, proactive_drafting=False), None, 3000),
    "sjd_pd_only_K2_D3": (
        RejectionConfig(method="sjd_pac", window=3, tree_width=2, adaptive_continuation=False), None, 4000,
    ),
    "sjd_pac_K3_D3_L8": (RejectionConfig(method="sjd_pac", window=8, tree_width=3), None, 4000),
    # top-k 2: the tree's levels cover the whole support, so a residual is never drawn from (the
    # planted residual fault changed 0 of 400 samples); the tree faults fail it at 1000.
    "sjd_pac_K2_D4_cfg_topk_forced": (
        RejectionConfig(method="sjd_pac", window=3, tree_width=2, tree_depth=4, cfg_scale=2.0, top_k=2),
        FORCED, 6000,
    ),
    "sjd_pac_auto_window": (RejectionConfig(method="sjd_pac", window="auto", tree_width=2), None, 3000),
    "sjd_pac_top_p_temperature": (
        RejectionConfig(method="sjd_pac", window=4, tree_width=2, top_p=0.8, temperature=1.5), None, 3000,
    ),
    # The default rule: over seeds, argmax(log p + G) is an exact draw (token identity with AR
    # is test_seed_exact's; this checks the distribution itself, trees and CFG included).
    "gumbel_sjd_pac_K3_D3_L8": (sp.SamplerConfig(method="sjd_pac", window=8, tree_width=3), None, 3000),
    "gumbel_sjd_pac_K2_D4_cfg_topk_forced": (
        sp.SamplerConfig(method="sjd_pac", window=3, tree_width=2, tree_depth=4, cfg_scale=2.0, top_k=2),
        FORCED, 3000,
    ),
}
assert all(config.verify == "gumbel" for name, (config, _, _) in CASES.items() if name.startswith("gumbel"))


def _check(tiny, config, constraints, samples, model=None, seed0=0):
    _, cond, uncond, table = tiny
    joint = exact_joint([cond] + ([uncond] if config.uses_cfg else []), V, N, config, constraints)
    counts = draw_samples(model or table, PROMPT, N, config, samples, uncond=UNCOND,
                          allowed=constraints, seed0=seed0)
    return compare(counts, joint)


@pytest.mark.parametrize("name", list(CASES))
def test_lossless_modes_match_the_exact_joint(tiny, name):
    config, constraints, samples = CASES[name]
    p_value, tv, noise = _check(tiny, config, constraints, samples)
    assert p_value > P_VALUE_MIN, f"{name}: chi-square p = {p_value:.2e} (tv {tv:.4f}, noise {noise:.4f})"
    assert tv < TV_FACTOR * noise, f"{name}: total variation {tv:.4f} above noise {noise:.4f}"


@pytest.mark.slow
def test_sjd_pac_with_the_real_model_and_kv_cache_matches_the_exact_joint():
    """The same test with the transformers model itself in the loop (cache, tree masks, CFG
    rows); four image tokens keep it to a few thousand samples."""
    n = 4
    model = tiny_causal_lm(V)
    cond = conditional_logits(model, PROMPT, V, n)
    uncond = conditional_logits(model, UNCOND, V, n)
    config = RejectionConfig(method="sjd_pac", window=3, tree_width=2, cfg_scale=2.0)
    joint = exact_joint([cond, uncond], V, n, config)
    counts = draw_samples(model, PROMPT, n, config, 3000, uncond=UNCOND)
    p_value, tv, noise = compare(counts, joint)
    assert p_value > P_VALUE_MIN and tv < TV_FACTOR * noise, (p_value, tv, noise)


# --- negative controls: the test must catch the bugs that made the reference code biased ----

def _residual_is_p(p, q):  # "redraw from p after a rejection" instead of the residual
    return p


def _last_accepted_wins(flags):  # a later accepted candidate (a longer path) beats the first
    k = flags.shape[-1]
    idx = torch.arange(k, device=flags.device)
    last = (flags.long() * (idx + 1)).argmax(-1)
    return torch.where(flags.any(-1), last, torch.full_like(last, -1))


_true_gumbel_noise = rules.gumbel_noise


def _noise_shared_by_positions(seed, positions, vocab_size):  # one G for every position of a seed
    return _true_gumbel_noise(seed, torch.zeros_like(positions), vocab_size)


@pytest.mark.parametrize(
    "patch,config",
    [
        (("residual", _residual_is_p), RejectionConfig(method="sjd", window=4)),
        (("first_true", _last_accepted_wins), RejectionConfig(method="sjd_pac", window=3, tree_width=3)),
        (("gumbel_noise", _noise_shared_by_positions), sp.SamplerConfig(method="sjd_pac", window=3, tree_width=3)),
    ],
    ids=["residual_replaced_by_p", "last_accepted_candidate_wins", "gumbel_noise_shared_by_positions"],
)
def test_negative_control_planted_bug_is_caught(tiny, monkeypatch, patch, config):
    monkeypatch.setattr(rules, patch[0], patch[1])
    p_value, tv, noise = _check(tiny, config, None, 3000, seed0=10**6)
    assert p_value < P_VALUE_MIN or tv > TV_FACTOR * noise, (
        f"planted bug {patch[0]} went unnoticed: p = {p_value:.3f}, tv {tv:.4f}, noise {noise:.4f}"
    )


# --- Proactive Drafting with power: the sibling candidates' law must be visible -----------------
#
# With a vocabulary of 3 and K = 2 a wrong sibling law barely moves the joint. Here: a Markov
# chain over 6 tokens whose next token prefers x_(t-1) + 1, then + 2, ... (logits falling by 1 per
# step, plus position noise). After a redraw at i, the candidates for i+1 were drawn from
# q = P(. | old x_i) while the target is P(. | new x_i): the first candidate is often rejected and
# a sibling accepted (a side branch wins in about 40-60 % of the passes that carry a tree). The exact
# pairwise marginals (x_t, x_t+1) follow from the transition matrices; every adjacent pair's
# table is tested (chi-square, Bonferroni over the pairs).

PD_V, PD_N = 6, 6
PD_RAMP = (2.0, 1.0, 0.0, -1.0, -2.0, -3.0)
PD_PROMPT = torch.tensor([0])
SIDE_BRANCH_SHARE_MIN = 0.2
P_VALUE_PLANTED_MAX = 1e-6

PD_CASES = {
    "K3_one_level": (RejectionConfig(method="sjd_pac", window=8, tree_width=3, tree_depth=2), 1500),
    "K3_two_levels": (RejectionConfig(method="sjd_pac", window=8, tree_width=3, tree_depth=3), 1500),
    "K4_one_level": (RejectionConfig(method="sjd_pac", window=8, tree_width=4, tree_depth=2), 1500),
    "K4_two_levels_top_k": (
        RejectionConfig(method="sjd_pac", window=8, tree_width=4, tree_depth=3, top_k=5), 1500,
    ),
    # Chain siblings (tree_chain_width): 3 candidates beside every chain draft past the one level.
    "K4_one_level_chain_siblings_W4": (
        RejectionConfig(method="sjd_pac", window=8, tree_width=4, tree_depth=2, tree_first_width=None,
                        tree_chain_width=4), 1500,
    ),
}
# The planted sibling bugs run on the one-level K = 4 tree (three siblings per level, the most
# power per sample); samples such that p < 1e-6 with margin over seeds.
PLANTED_SIBLING_CASE = "K4_one_level"
PLANTED_SIBLING_SAMPLES = {"pd_tempered_siblings": 2000, "pd_topk_siblings": 2000}


def pd_chain() -> MarkovChain:
    return MarkovChain.shifted(PD_V, PD_N, PD_RAMP, seed=0)


def pd_check(config: sp.SamplerConfig, samples: int, seed0: int = 0):
    """(Bonferroni p-value, worst pair, share of tree passes won by a side branch)."""
    chain = pd_chain()
    p0, trans = chain.processed(config)
    passes: list = []
    tokens = draw_sequences(MarkovModel({(0,): chain}), PD_PROMPT, PD_N, config, samples, seed0=seed0,
                            passes=passes)
    p_value, worst = markov_marginal_pvalue(tokens, p0, trans)
    return p_value, worst, side_branch_share(passes)


@pytest.mark.parametrize("name", list(PD_CASES))
def test_proactive_drafting_with_side_branches_matches_exact_marginals(name):
    config, samples = PD_CASES[name]
    p_value, worst, share = pd_check(config, samples)
    assert share >= SIDE_BRANCH_SHARE_MIN, f"{name}: side branches won only {share:.0%} of tree passes"
    assert p_value > P_VALUE_MIN, f"{name}: p = {p_value:.2e} at {worst} (side-branch share {share:.0%})"


@pytest.mark.parametrize("fault", list(PLANTED_SIBLING_SAMPLES))
def test_planted_sibling_bug_is_caught(fault):
    config, _ = PD_CASES[PLANTED_SIBLING_CASE]
    with planted_fault(fault) as calls:
        p_value, worst, share = pd_check(config, PLANTED_SIBLING_SAMPLES[fault], seed0=10**6)
    assert calls.count > 0, f"the seam of {fault} never ran; re-target it in exactness_tools.FAULTS"
    assert p_value < P_VALUE_PLANTED_MAX, f"planted bug {fault} went unnoticed: p = {p_value:.2e} at {worst}"


def test_planted_chain_siblings_not_drawn_from_q_are_caught(monkeypatch):
    """Chain siblings drawn uniformly but verified as a draw from q without replacement (a sibling
    law that is not the proposal's) fail the same test (p = 2.7e-9 at seed 10**6; greedy siblings,
    the most likely other tokens, give p = 4e-3: a smaller fault)."""
    from sjd_pac_core.sampling import rules
    from sjd_pac_core.sampling.verify import candidate_validity, sample_without_replacement_rows

    calls = []

    def uniform_siblings(self, q, first, k, positions):
        calls.append(1)
        return sample_without_replacement_rows(torch.ones_like(q), first, k, self.generator), candidate_validity(q, k)

    monkeypatch.setattr(rules.RejectionRule, "chain_candidates", uniform_siblings)
    config, _ = PD_CASES["K4_one_level_chain_siblings_W4"]
    p_value, worst, _ = pd_check(config, 2000, seed0=10**6)
    assert calls, "the chain siblings were never drawn"
    assert p_value < P_VALUE_PLANTED_MAX, f"planted sibling law went unnoticed: p = {p_value:.2e} at {worst}"


# --- window="auto" choosing the tree: any choice made from the past keeps the law -----------------

def _random_auto_choices(monkeypatch, seed: int) -> set:
    """Make the auto policy pick (L, tree) at random among its candidates every pass (a choice
    from the past only, as every real policy's is); returns the set of trees it picked."""
    from sjd_pac_core.engine.window import AutoTreeWindow

    rng = __import__("random").Random(seed)
    picked: set = set()

    def random_pair(self):
        tree = rng.choice(self.trees)
        picked.add(tree)
        self.tree_choice = tree
        return rng.choice(self.candidates[:7])

    monkeypatch.setattr(AutoTreeWindow, "_best_window", random_pair)
    monkeypatch.setattr(AutoTreeWindow, "EXPLORE_FIRST", 0)
    return picked


AUTO_TREE_CONFIG = RejectionConfig(method="sjd_pac", window="auto", tree_width=4, tree_depth=3, tree_first_width=4)


def test_auto_window_with_changing_trees_matches_exact_marginals(monkeypatch):
    picked = _random_auto_choices(monkeypatch, seed=0)
    p_value, worst, share = pd_check(AUTO_TREE_CONFIG, 1500)
    assert len(picked) >= 6, picked
    assert share >= SIDE_BRANCH_SHARE_MIN, f"side branches won only {share:.0%} of tree passes"
    assert p_value > P_VALUE_MIN, f"p = {p_value:.2e} at {worst}"


def test_planted_sibling_bug_under_changing_trees_is_caught(monkeypatch):
    _random_auto_choices(monkeypatch, seed=1)
    with planted_fault("pd_tempered_siblings") as calls:
        p_value, worst, _ = pd_check(AUTO_TREE_CONFIG, 3000, seed0=10**6)  # p < 1e-10 at seeds 0-3
    assert calls.count > 0
    assert p_value < P_VALUE_PLANTED_MAX, f"planted bug went unnoticed under changing trees: p = {p_value:.2e} at {worst}"
