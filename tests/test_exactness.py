"""Exact-distribution tests (spec section 7).

Every lossless mode samples many short sequences from a tiny random transformers causal LM
(vocabulary 3, 5 image tokens, peaked conditionals that depend on the whole prefix), and the
counts are compared with the exact joint distribution, enumerated by plain full forwards:
chi-square p-value above 1e-3 and total variation within 1.5x the sampling-noise level. The
negative controls plant known bugs and must fail the same test at p < 1e-6, with sample counts
set by the test's power (tests/planted_power.py).

Most configurations read the model's exact conditionals from a table (TableModel) so that tens of
thousands of samples take seconds; one configuration runs the real model with its KV cache in
the loop, and the seed-exact tests cover the cache mechanics token by token. The drafting
configurations with many candidates run on Markov-chain table models with larger vocabularies
(MARKOV_CASES, one entry per configuration with its planted controls).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Tuple

import pytest
import torch

import sjd_pac_core as sp
import sjd_pac_core.sampling.rules as rules
from sjd_pac_core.models import memory
from exactness_tools import (N, P_VALUE_MIN, P_VALUE_PLANTED_MAX, PROMPT, TV_FACTOR, UNCOND, V, MarkovChain,
                             RejectionConfig, SecondOrderChain, compare, conditional_logits, draw_samples,
                             draw_sequences, exact_joint, joint_check, pair_laws_pvalue, planted_fault,
                             side_branch_share, tiny_causal_lm)
from sjd_pac_core.sampling.recipe import TokenConstraints

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


@pytest.mark.parametrize("name", list(CASES))
def test_lossless_modes_match_the_exact_joint(tiny_joint, name):
    config, constraints, samples = CASES[name]
    p_value, tv, noise = joint_check(tiny_joint, config, samples, constraints=constraints)
    assert p_value > P_VALUE_MIN, f"{name}: chi-square p = {p_value:.2e} (tv {tv:.4f}, noise {noise:.4f})"
    assert tv < TV_FACTOR * noise, f"{name}: total variation {tv:.4f} above noise {noise:.4f}"


REAL_MODEL_TOKENS = 4  # four image tokens keep the real model's run to a few thousand samples
REAL_MODEL_CONFIG = RejectionConfig(method="sjd_pac", window=3, tree_width=2, cfg_scale=2.0)
REAL_MODEL_SAMPLES = 1500
REAL_MODEL_ATTENTION_SCALE = 9.0  # peaked attention: the planted mask fault moves the joint
# The control: the unconditional row's left-padding column left visible in the tree passes (the
# CFG rows differ in prompt length), a bug only the real model's masks can have.
REAL_MODEL_CONTROL = ("padding_columns_unmasked", 800)


def real_model_check(samples: int, seed0: int = 0):
    """The exact-joint check with the transformers model itself in the loop (cache, tree masks,
    CFG rows): (p-value, total variation, noise level)."""
    model = tiny_causal_lm(V, attention_scale=REAL_MODEL_ATTENTION_SCALE)
    cond = conditional_logits(model, PROMPT, V, REAL_MODEL_TOKENS)
    uncond = conditional_logits(model, UNCOND, V, REAL_MODEL_TOKENS)
    joint = exact_joint([cond, uncond], V, REAL_MODEL_TOKENS, REAL_MODEL_CONFIG)
    counts = draw_samples(model, PROMPT, REAL_MODEL_TOKENS, REAL_MODEL_CONFIG, samples, uncond=UNCOND, seed0=seed0)
    return compare(counts, joint)


@pytest.mark.slow
def test_sjd_pac_with_the_real_model_and_kv_cache_matches_the_exact_joint():
    p_value, tv, noise = real_model_check(REAL_MODEL_SAMPLES)
    assert p_value > P_VALUE_MIN and tv < TV_FACTOR * noise, (p_value, tv, noise)


def test_planted_cache_fault_fails_the_real_model_check():
    fault, samples = REAL_MODEL_CONTROL
    with planted_fault(fault) as calls:
        p_value, tv, noise = real_model_check(samples, seed0=10**6)
    assert calls.count > 0, f"the seam of {fault} never ran; re-target it in exactness_tools.FAULTS"
    assert p_value < P_VALUE_PLANTED_MAX, f"planted bug {fault} went unnoticed: p = {p_value:.2e} (tv {tv:.4f})"


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


# name: (the rule's function replaced, its faulty version, config, samples); the samples from
# tests/planted_power.py (power >= 0.999 at p < 1e-6).
V3_CONTROLS = {
    "residual_replaced_by_p": ("residual", _residual_is_p, RejectionConfig(method="sjd", window=4), 1000),
    "last_accepted_candidate_wins": (
        "first_true", _last_accepted_wins, RejectionConfig(method="sjd_pac", window=3, tree_width=3), 300,
    ),
    "gumbel_noise_shared_by_positions": (
        "gumbel_noise", _noise_shared_by_positions, sp.SamplerConfig(method="sjd_pac", window=3, tree_width=3), 300,
    ),
}


@pytest.mark.parametrize("name", list(V3_CONTROLS))
def test_negative_control_planted_bug_is_caught(tiny_joint, monkeypatch, name):
    attribute, faulty, config, samples = V3_CONTROLS[name]
    calls = []
    monkeypatch.setattr(rules, attribute, lambda *args, **kwargs: calls.append(1) or faulty(*args, **kwargs))
    p_value, tv, noise = joint_check(tiny_joint, config, samples, seed0=10**6)
    assert calls, f"the planted {attribute} never ran"
    assert p_value < P_VALUE_PLANTED_MAX, (
        f"planted bug {name} went unnoticed: p = {p_value:.2e}, tv {tv:.4f}, noise {noise:.4f}"
    )


# --- drafting configurations with power: one list of cases on Markov-chain table models ---------
#
# With a vocabulary of 3 and K = 2 a wrong sibling law barely moves the joint. Here the image is a
# chain whose next token prefers a shift of its context (logits falling by 1 per step of the
# shift, plus position noise), so after a redraw the stale proposals are wrong in a structured
# way: the first candidate is often rejected and a sibling accepted. The exact pair laws follow
# from the chain (no sampler code), and every pair's sampled table is tested (chi-square,
# Bonferroni over the pairs).
#
# Models:
#   "ramp": x_t given x_t-1 (V = 6, 6 tokens): after a redraw at i, the candidates for i+1 were
#       drawn from P(. | old x_i) while the target is P(. | new x_i); every adjacent pair.
#   "grandparent": x_t given x_t-2 only (V = 4, 6 tokens): a chain draft after a redraw is drafted
#       against its old grandparent, so the chain's drafts (and their siblings) are where the
#       rejections fall, while the tree's level right after the redraw is accepted; every pair.
#
# To guard a new drafting path (a drafter option), add ONE entry to MARKOV_CASES: its config,
# the samples of the exact check, the model, and the planted faults (exactness_tools.FAULTS) it
# must reject, with their samples; `python tests/planted_power.py CASE --fault F` prints the
# samples each needs (the chi-square's power, from a pilot run). A model-loading option does not
# reach these table models: test_reference_loop.LOAD_OPTIONS runs the real families.


@dataclass(frozen=True)
class MarkovCase:
    """One drafting configuration checked against a chain model's exact pair laws.

    samples: the exact check's sample count. controls: (planted fault, samples) pairs, each run
    as its own test that must fail the same check at p < P_VALUE_PLANTED_MAX. guards: further
    faults the case's own check is sized to catch (power >= 0.99 at P_VALUE_MIN, from
    planted_power.py), not run. side_share_min: the share of tree passes a side branch must win
    (else the case does not exercise its siblings)."""

    config: sp.SamplerConfig
    samples: int
    model: str = "ramp"
    controls: Tuple[Tuple[str, int], ...] = ()
    guards: Tuple[str, ...] = ()
    side_share_min: float = 0.2
    # False: the run's neighbour law off (as for a vocabulary too large even for compact rows),
    # so every candidate is a draw from q. With it, seen rows take the law's candidates and a
    # fault in the draw from q shows only in the first passes, so every case whose faults live in
    # that draw runs without it: its controls' power then depends on that draw alone (the law's
    # draw has its own exact checks in test_sampling_math.py and its own controls).
    law: bool = True


CHAIN_PROMPT = torch.tensor([0])
MARKOV_MODELS = {
    "ramp": lambda: MarkovChain.shifted(6, 6, (2.0, 1.0, 0.0, -1.0, -2.0, -3.0), seed=0),
    "grandparent": lambda: SecondOrderChain(4, 6, (2.0, 1.0, 0.0, -1.0), seed=0, parent=0.0, grand=1.0),
}

# Sample counts from tests/planted_power.py (pilot runs of 3000 faulty samples, seeds 10**7+):
# a control's count gives its fault power >= 0.999 at p < 1e-6; a case's count gives each of its
# faults (controls and guards) power >= 0.99 at p < 1e-3, and is at least 600. The figures are
# in the commit that set them.
MARKOV_CASES = {
    # One level over the whole vocabulary (the first level's 8, clamped to V = 6).
    "one_level_of_6": MarkovCase(
        RejectionConfig(method="sjd_pac", window=8, tree_depth=2), 1500,
        controls=(("pd_tempered_siblings", 1900), ("pd_topk_siblings", 1200)), law=False,
    ),
    "first_level_6_then_3": MarkovCase(
        RejectionConfig(method="sjd_pac", window=8, tree_width=3), 1500, guards=("pd_tempered_siblings",), law=False,
    ),
    # The shipped tree (D = 3, first level 8, K = 4) under top-p and top-k: q's support is often
    # smaller than a level, so padding slots must never count as candidates.
    "defaults_top_p_0.7": MarkovCase(
        RejectionConfig(method="sjd_pac", window=8, top_p=0.7), 600, controls=(("all_slots_valid", 350),),
        side_share_min=0.05, law=False,
    ),
    "defaults_top_k_3": MarkovCase(
        RejectionConfig(method="sjd_pac", window=8, top_k=3), 600, controls=(("all_slots_valid", 350),),
        side_share_min=0.05, law=False,
    ),
    # The shipped tree at a low temperature: a first level (6) wider than K = 4, then a second
    # level; the redraw's new mode often sits past the proposal's K most likely tokens.
    "defaults_first_level_wider_than_K_T0.33": MarkovCase(
        RejectionConfig(method="sjd_pac", window=8, temperature=0.33), 750,
        controls=(("first_level_drawn_k_wide", 950),), law=False,
    ),
    # Chain siblings on the grandparent chain, where the chain's drafts are rejected: W = 2 (one
    # candidate beside every chain draft), and W = 3 behind a first level of 2 (the level's row
    # padded to the chain's width).
    "chain_siblings_W2_grandparent_T0.33": MarkovCase(
        RejectionConfig(method="sjd_pac", window=8, tree_depth=2, tree_first_width=2, tree_chain_width=2,
                        temperature=0.33), 750, model="grandparent",
        controls=(("chain_sibling_repeats_draft", 1200),), guards=("chain_siblings_uniform",), law=False,
    ),
    "chain_siblings_W3_grandparent_T0.33": MarkovCase(
        RejectionConfig(method="sjd_pac", window=8, tree_depth=2, tree_first_width=2, tree_chain_width=3,
                        temperature=0.33), 600, model="grandparent",
        controls=(("chain_siblings_uniform", 600),), guards=("chain_sibling_repeats_draft",), law=False,
    ),
}
MARKOV_CONTROLS = [(case, fault) for case, spec in MARKOV_CASES.items() for fault, _ in spec.controls]


@contextlib.contextmanager
def neighbour_law(on: bool) -> Iterator[None]:
    """Inside the block, runs keep the neighbour law (on) or have none (off: neither dense nor
    compact tables fit, as if the vocabulary were too large)."""
    with pytest.MonkeyPatch.context() as patch:
        if not on:
            patch.setattr(memory, "LAW_DENSE_MAX_BYTES", 0)
            patch.setattr(memory, "LAW_COMPACT_MAX_BYTES", 0)
        yield


def markov_check(config: sp.SamplerConfig, samples: int, model: str = "ramp", seed0: int = 0, law: bool = True):
    """(Bonferroni p-value, worst pair, share of tree passes won by a side branch)."""
    chain = MARKOV_MODELS[model]()
    passes: list = []
    with neighbour_law(law):
        tokens = draw_sequences(chain.model(), CHAIN_PROMPT, chain.num_tokens, config, samples, seed0=seed0,
                                passes=passes)
    p_value, worst = pair_laws_pvalue(tokens, chain.pair_laws(config))
    return p_value, worst, side_branch_share(passes)


@pytest.mark.parametrize("name", list(MARKOV_CASES))
def test_drafting_cases_match_exact_pair_laws(name):
    case = MARKOV_CASES[name]
    p_value, worst, share = markov_check(case.config, case.samples, case.model, law=case.law)
    assert share >= case.side_share_min, f"{name}: side branches won only {share:.0%} of tree passes"
    assert p_value > P_VALUE_MIN, f"{name}: p = {p_value:.2e} at {worst} (side-branch share {share:.0%})"


@pytest.mark.parametrize("name,fault", MARKOV_CONTROLS, ids=[f"{c}-{f}" for c, f in MARKOV_CONTROLS])
def test_planted_drafting_fault_is_caught(name, fault):
    case = MARKOV_CASES[name]
    samples = dict(case.controls)[fault]
    with planted_fault(fault) as calls:
        p_value, worst, _ = markov_check(case.config, samples, case.model, seed0=10**6, law=case.law)
    assert calls.count > 0, f"the seam of {fault} never ran; re-target it in exactness_tools.FAULTS"
    assert p_value < P_VALUE_PLANTED_MAX, f"{name}: planted bug {fault} went unnoticed: p = {p_value:.2e} at {worst}"


# --- window="auto" choosing the tree: any choice made from the past keeps the law -----------------

def random_auto_choices(monkeypatch, seed: int) -> set:
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
AUTO_TREE_SAMPLES = 1500
SIDE_BRANCH_SHARE_MIN = 0.2


def test_auto_window_with_changing_trees_matches_exact_marginals(monkeypatch):
    picked = random_auto_choices(monkeypatch, seed=0)
    p_value, worst, share = markov_check(AUTO_TREE_CONFIG, AUTO_TREE_SAMPLES)
    assert len(picked) >= 6, picked
    assert share >= SIDE_BRANCH_SHARE_MIN, f"side branches won only {share:.0%} of tree passes"
    assert p_value > P_VALUE_MIN, f"p = {p_value:.2e} at {worst}"


# The control's fault and samples (planted_power.py: power >= 0.999 at p < 1e-6; the case's 1500
# samples give it power >= 0.99 at p < 1e-3).
AUTO_TREE_CONTROL = ("pd_topk_siblings", 1500)


def test_planted_sibling_bug_under_changing_trees_is_caught(monkeypatch):
    fault, samples = AUTO_TREE_CONTROL
    random_auto_choices(monkeypatch, seed=1)
    with planted_fault(fault) as calls:
        p_value, worst, _ = markov_check(AUTO_TREE_CONFIG, samples, seed0=10**6)
    assert calls.count > 0
    assert p_value < P_VALUE_PLANTED_MAX, f"planted bug went unnoticed under changing trees: p = {p_value:.2e} at {worst}"
