"""Seed-exact tests: with verify="gumbel", AR, SJD and SJD-PAC return identical tokens.

A tiny random Llama (vocabulary 64, fp32, peaked attention) with its real KV cache: any
cache-crop, compaction, tree-mask, position-id or CFG-row bug changes some logit and so some
token; the planted position faults below hold the model to that.

To guard a new drafting path (a drafter option), add its SamplerConfig fields to VARIANTS:
every variant runs against AR at three seeds with CFG off and on.
"""

from __future__ import annotations

import pytest
import torch

import sjd_pac_core as sp
from exactness_tools import planted_fault, seed_exact_lm
from sjd_pac_core.models.causal_lm import CausalLMAdapter
from sjd_pac_core.sampling.tree import build_tree_layout

NUM_TOKENS = 120


@pytest.fixture(scope="module")
def lm():
    return seed_exact_lm()


PROMPT = torch.tensor([5, 9, 13, 21, 3])
UNCOND = torch.tensor([5, 3])

VARIANTS = [
    dict(method="sjd", window=4),
    dict(method="sjd", window=16),
    dict(method="sjd_pac", window=16, proactive_drafting=False),
    dict(method="sjd_pac", window=16, tree_width=3, adaptive_continuation=False),
    dict(method="sjd_pac", window=64, tree_width=4, tree_depth=3),
    dict(method="sjd_pac", window=8, tree_width=2, tree_depth=4, init_proposal="uniform"),
    dict(method="sjd_pac", window=24, tree_chain_width=2, tree_side_chain=4),  # the default tree, siblings, side chains
]


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_all_methods_give_the_ar_tokens(lm, seed, cfg_scale):
    common = dict(verify="gumbel", cfg_scale=cfg_scale, top_k=40)
    ar = sp.sample_tokens(lm, PROMPT, NUM_TOKENS, config=sp.SamplerConfig(method="ar", **common),
                          seed=seed, uncond_prompt_ids=UNCOND)
    assert ar.stats.forward_passes == NUM_TOKENS
    rejected_somewhere = False
    for variant in VARIANTS:
        out = sp.sample_tokens(lm, PROMPT, NUM_TOKENS, config=sp.SamplerConfig(**variant, **common),
                               seed=seed, uncond_prompt_ids=UNCOND)
        assert torch.equal(out.tokens, ar.tokens), f"{variant} differs from AR at seed {seed}"
        assert out.stats.tokens_committed == NUM_TOKENS
        assert out.stats.forward_passes < NUM_TOKENS
        rejected_somewhere |= any(r.first_reject >= 0 for r in out.stats.records)
    assert rejected_somewhere, "the test model is too easy: no draft was ever rejected"


# Position-id faults the seed-exact model must see (exactness_tools.FAULTS): the CFG scale
# under which each can act. Every variant with CFG, or with nodes past depth 8, feeds them.
POSITION_FAULTS = {"uncond_row_deep_positions": 3.0, "deep_positions": 1.0}


@pytest.mark.parametrize("fault", list(POSITION_FAULTS))
def test_planted_position_faults_change_the_tokens(lm, fault):
    """The control of the test above: a position id one off in the unconditional row (depth
    >= 2), or past depth 8, must change the tokens of some variant (a model blind to positions
    let both through)."""
    common = dict(verify="gumbel", cfg_scale=POSITION_FAULTS[fault], top_k=40)
    differ, runs = 0, 0
    for seed in (0, 1):
        ar = sp.sample_tokens(lm, PROMPT, NUM_TOKENS, config=sp.SamplerConfig(method="ar", **common),
                              seed=seed, uncond_prompt_ids=UNCOND)
        with planted_fault(fault) as calls:
            for variant in VARIANTS:
                out = sp.sample_tokens(lm, PROMPT, NUM_TOKENS, config=sp.SamplerConfig(**variant, **common),
                                       seed=seed, uncond_prompt_ids=UNCOND)
                differ += not torch.equal(out.tokens, ar.tokens)
                runs += 1
        assert calls.count > 0
    assert differ >= 2, f"planted {fault} changed the tokens of only {differ} of {runs} runs"


def test_tree_passes_take_side_branches(lm):
    """The PD tree's side branches must win sometimes, or compaction goes untested."""
    config = sp.SamplerConfig(method="sjd_pac", window=16, tree_width=4, verify="gumbel")
    branches = []
    for seed in range(4):
        out = sp.sample_tokens(lm, PROMPT, NUM_TOKENS, config=config, seed=seed)
        branches += [b for r in out.stats.records for b in r.branch]
    assert any(b > 0 for b in branches)


def test_seed_changes_the_picture(lm):
    config = sp.SamplerConfig(method="sjd_pac", verify="gumbel")
    a = sp.sample_tokens(lm, PROMPT, 40, config=config, seed=0).tokens
    b = sp.sample_tokens(lm, PROMPT, 40, config=config, seed=1).tokens
    assert not torch.equal(a, b)


def test_rejection_rule_is_reproducible_for_a_seed(lm):
    config = sp.SamplerConfig(method="sjd_pac", window=16)
    a = sp.sample_tokens(lm, PROMPT, 60, config=config, seed=4).tokens
    b = sp.sample_tokens(lm, PROMPT, 60, config=config, seed=4).tokens
    assert torch.equal(a, b)


@torch.no_grad()
def test_tree_pass_logits_and_compaction_match_a_plain_forward(lm):
    """Each tree node's logits equal a full forward of its own path; after keeping an off-main
    path, the next pass equals a full forward of the committed sequence."""
    adapter = CausalLMAdapter(lm)
    session = adapter.open_session([PROMPT])
    session.prefill()
    layout = build_tree_layout((2, 2), 2)
    tokens = torch.tensor([7, 11, 12, 20, 21, 20, 21, 30, 31])
    logits = session.forward(tokens, layout.depths, layout.attend)[0]
    for node in range(layout.num_nodes):
        path = [0] + layout.ancestors_path(node)
        full = lm(input_ids=torch.cat([PROMPT, tokens[path]]).unsqueeze(0)).logits[0, -1]
        assert torch.allclose(logits[node], full, atol=1e-5), node
    kept = [0, 2, 6]  # root -> candidate 1 at level 1 -> candidate 1 at level 2 (off the main branch)
    session.keep(kept)
    nxt = session.forward(torch.tensor([40]), torch.tensor([0]), torch.ones(1, 1, dtype=torch.bool))[0, 0]
    full = lm(input_ids=torch.cat([PROMPT, tokens[kept], torch.tensor([40])]).unsqueeze(0)).logits[0, -1]
    assert torch.allclose(nxt, full, atol=1e-5)
    session.close()
