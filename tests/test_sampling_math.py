"""Unit tests of the maths on hand-made distributions (spec sections 2-4)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from sjd_pac_core.sampling.recipe import (
    SamplingRecipe,
    TokenConstraints,
    classifier_free_guidance,
    process,
    top_k_filter,
    top_p_filter,
)
from sjd_pac_core.sampling.tree import build_tree_layout, tree_attention_mask, tree_position_ids
from sjd_pac_core.sampling.verify import (
    accept_probability,
    first_true,
    gumbel_argmax,
    gumbel_noise,
    recursive_rejection_steps,
    residual,
    sample,
    sample_without_replacement,
    sample_without_replacement_rows,
    speculative_accept,
)

P = torch.tensor([0.5, 0.3, 0.2, 0.0])
Q = torch.tensor([0.2, 0.5, 0.1, 0.2])


def test_accept_probability_is_min_one_ratio():
    got = accept_probability(P, Q.clamp(min=1e-30))
    assert torch.allclose(got, torch.tensor([1.0, 0.6, 1.0, 0.0]))


def test_residual_is_normalised_positive_part():
    assert torch.allclose(residual(P, Q), torch.tensor([0.75, 0.0, 0.25, 0.0]))


def test_residual_of_equal_distributions_falls_back_to_p():
    assert torch.allclose(residual(P, P), P)


def test_speculative_accept_compares_coin_with_ratio():
    tokens = torch.tensor([1, 1, 0, 3])
    p = P.expand(4, -1)
    q = Q.expand(4, -1)
    coins = torch.tensor([0.59, 0.61, 0.999, 0.0])
    assert speculative_accept(p, q, tokens, coins).tolist() == [True, False, True, False]


def test_single_draft_accept_or_residual_gives_exactly_p():
    # P(out = x) = q(x) min(1, p/q) + P(reject) residual(x), the identity SJD rests on.
    a = accept_probability(P, Q)
    out = Q * a + (1 - (Q * a).sum()) * residual(P, Q)
    assert torch.allclose(out, P, atol=1e-7)


def _without_replacement_orders(q: torch.Tensor, k: int):
    """Every ordered k-tuple drawn sequentially without replacement from q, with its probability."""
    v = q.shape[0]
    for tup in itertools.permutations(range(v), k):
        prob, left = 1.0, 1.0
        for c in tup:
            if left <= 0 or q[c] <= 0:
                prob = 0.0
                break
            prob *= float(q[c]) / left
            left -= float(q[c])
        if prob > 0:
            yield tup, prob


def _recursive_rejection_output(p, q, k, sibling_mode="without_replacement"):
    """Exact output distribution of one PD level (first accepted candidate in draw order wins)."""
    out = torch.zeros_like(p, dtype=torch.float64)
    for tup, prob in _without_replacement_orders(q, k):
        cands = torch.tensor(tup)
        acc, final = recursive_rejection_steps(p.unsqueeze(0), q, cands)
        acc, final = acc[0].double(), final[0].double()
        reach = 1.0
        for j, c in enumerate(tup):
            out[c] += prob * reach * acc[j]
            reach *= 1 - acc[j]
        out += prob * reach * final
    return out


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_recursive_rejection_without_replacement_is_exact(k):
    p = torch.tensor([0.05, 0.45, 0.1, 0.4])
    q = torch.tensor([0.4, 0.1, 0.3, 0.2])
    out = _recursive_rejection_output(p, q, k)
    assert torch.allclose(out, p.double(), atol=1e-6)


def test_recursive_rejection_steps_by_hand():
    p = torch.tensor([[0.6, 0.4, 0.0]])
    q = torch.tensor([0.5, 0.25, 0.25])
    acc, final = recursive_rejection_steps(p, q, torch.tensor([2, 0]))
    # c1 = 2: p(2)/q(2) = 0 -> reject; p2 = norm(max(p - q, 0)) = [0.1, 0.15, 0] / 0.25.
    # q2 = q without 2 = [2/3, 1/3, 0]; c2 = 0: p2(0)/q2(0) = 0.4 / (2/3) = 0.6.
    assert torch.allclose(acc, torch.tensor([[0.0, 0.6]]))
    # p3 = norm(max(p2 - q2, 0)) = norm([0, 0.6 - 1/3, 0]) = [0, 1, 0].
    assert torch.allclose(final, torch.tensor([[0.0, 1.0, 0.0]]))


def test_first_true_picks_the_first_in_draw_order():
    flags = torch.tensor([[False, True, True], [False, False, False], [True, False, True]])
    assert first_true(flags).tolist() == [1, -1, 0]


def test_sample_matches_probabilities_and_skips_zeros():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.1, 0.0, 0.6, 0.3])
    draws = sample(p.expand(40000, -1), g)
    freq = torch.bincount(draws, minlength=4).float() / 40000
    assert freq[1] == 0
    assert torch.allclose(freq, p, atol=0.01)


def test_sample_without_replacement_first_two_follow_plackett_luce():
    g = torch.Generator().manual_seed(1)
    q = torch.tensor([0.5, 0.3, 0.2, 0.0])
    n = 20000
    pairs = {}
    for _ in range(n // 1000):
        for row in range(1000):
            got = tuple(sample_without_replacement(q, 2, torch.tensor(3), g).tolist())
            pairs[got] = pairs.get(got, 0) + 1
    for (a, b), prob in _without_replacement_orders(q, 2):
        assert abs(pairs.get((a, b), 0) / n - prob) < 0.015
    assert all(3 not in k for k in pairs)


def test_sample_without_replacement_excludes_the_given_token():
    g = torch.Generator().manual_seed(2)
    q = torch.tensor([0.7, 0.2, 0.1])
    for _ in range(50):
        got = sample_without_replacement(q, 2, torch.tensor(0), g).tolist()
        assert sorted(got) == [1, 2]


def test_sample_without_replacement_rows_follows_plackett_luce_per_row():
    """The chain siblings' batched draw: per row, the given first token, then draws without
    replacement from q (here 3 of them on hand-made rows; a row with support 2 pads its last slot)."""
    g = torch.Generator().manual_seed(3)
    q = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.2, 0.3, 0.4], [0.0, 0.6, 0.4, 0.0]])
    first = torch.tensor([0, 3, 1])
    n = 20000
    counts = {}
    for _ in range(n // 2000):
        got = sample_without_replacement_rows(q.expand(2000, 3, 4).reshape(-1, 4), first.repeat(2000), 3, g)
        assert (got[:, 0] == first.repeat(2000)).all()
        for row in range(3):
            for seq in got[row::3, 1:].tolist():
                counts[(row, *seq[:1])] = counts.get((row, *seq[:1]), 0) + 1
    for row in range(3):
        rest = q[row].clone()
        rest[first[row]] = 0
        rest = rest / rest.sum()
        for token in range(4):
            assert abs(counts.get((row, token), 0) / n - float(rest[token])) < 0.015, (row, token)
    assert sample_without_replacement_rows(q, first, 1, g).tolist() == [[0], [3], [1]]


def test_gumbel_noise_depends_on_seed_and_position_only():
    a = gumbel_noise(7, torch.tensor([3, 4, 5]), 50)
    b = gumbel_noise(7, torch.tensor([5, 9]), 50)
    assert torch.equal(a[2], b[0])
    assert not torch.equal(a[0], a[1])
    assert not torch.equal(gumbel_noise(8, torch.tensor([3]), 50)[0], a[0])


def test_gumbel_noise_is_standard_gumbel():
    g = gumbel_noise(0, torch.arange(200), 1000).double()
    assert abs(float(g.mean()) - 0.5772) < 0.01
    assert abs(float(g.std()) - math.pi / math.sqrt(6)) < 0.01


def test_gumbel_argmax_samples_p():
    p = torch.tensor([0.1, 0.0, 0.6, 0.3])
    draws = gumbel_argmax(p.expand(30000, -1), gumbel_noise(3, torch.arange(30000), 4))
    freq = torch.bincount(draws, minlength=4).float() / 30000
    assert freq[1] == 0
    assert torch.allclose(freq, p, atol=0.012)


def test_tree_layout_widths_and_chain():
    layout = build_tree_layout((2, 2), 2)
    # root, level 1: 2 nodes, level 2: 4 nodes, chain: 2 nodes off the main leaf.
    assert layout.num_nodes == 1 + 2 + 4 + 2
    assert layout.parents.tolist() == [-1, 0, 0, 1, 1, 2, 2, 3, 7]
    assert layout.depths.tolist() == [0, 1, 1, 2, 2, 2, 2, 3, 4]
    assert layout.candidate_index.tolist() == [0, 0, 1, 0, 1, 0, 1, 0, 0]
    assert list(layout.main_nodes) == [0, 1, 3, 7, 8]
    assert (layout.depths == 2).nonzero().flatten().tolist()[:4] == [3, 4, 5, 6]
    assert layout.children[1] == (3, 4) and layout.children[2] == (5, 6) and layout.children[3] == (7,)
    # node 6 (level 2, child 1 of node 2) sees the root, node 2 and itself only.
    assert layout.attend[6].nonzero().flatten().tolist() == [0, 2, 6]
    assert layout.attend[8].nonzero().flatten().tolist() == [0, 1, 3, 7, 8]
    assert layout.ancestors_path(6) == [2, 6]


def test_chain_layout_is_causal():
    layout = build_tree_layout((), 3)
    assert torch.equal(layout.attend, torch.ones(4, 4, dtype=torch.bool).tril())


def test_tree_attention_mask_and_positions():
    layout = build_tree_layout((2,), 1)
    key_valid = torch.tensor([[False, True, True], [True, True, True]])  # row 0 is left-padded
    mask = tree_attention_mask(layout.attend, key_valid, torch.float32)
    assert mask.shape == (2, 1, 4, 7)
    blocked = torch.finfo(torch.float32).min
    assert mask[0, 0, 0, 0] == blocked and mask[1, 0, 0, 0] == 0
    # columns: 3 cached keys, then root (3), node 1 (4), node 2 (5)
    assert mask[0, 0, 2, 3] == 0 and mask[0, 0, 2, 4] == blocked and mask[0, 0, 2, 5] == 0
    pos = tree_position_ids(layout.depths, torch.tensor([2, 3]))
    assert pos.tolist() == [[2, 3, 3, 4], [3, 4, 4, 5]]


def test_recipe_order_cfg_constraints_temperature_topk_topp():
    logits = torch.tensor([[[2.0, 1.0, 0.0, -1.0]], [[0.0, 1.0, 0.0, 1.0]]])
    guided = classifier_free_guidance(logits[:, 0], 3.0)
    assert torch.allclose(guided, torch.tensor([6.0, 1.0, 0.0, -5.0]))
    cons = TokenConstraints(4, 2, allowed=torch.tensor([True, True, True, False]),
                            forced=torch.tensor([-1, 2]))
    p = process(logits, torch.tensor([0]), SamplingRecipe(cfg_scale=3.0, temperature=2.0, top_k=2), cons)[0]
    expect = torch.softmax(torch.tensor([3.0, 0.5]), 0)
    assert torch.allclose(p[:2], expect) and p[2] == 0 and p[3] == 0
    forced = process(logits, torch.tensor([1]), SamplingRecipe(cfg_scale=3.0), cons)[0]
    assert forced.tolist() == [0.0, 0.0, 1.0, 0.0]


def test_top_k_and_top_p_filters():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    assert torch.isinf(top_k_filter(logits, 2)[0, 2:]).all()
    kept = torch.isfinite(top_p_filter(logits, 0.7))[0].tolist()
    assert kept == [True, True, False, False]  # 0.5 < 0.7, then 0.75 reaches it
    assert torch.isfinite(top_p_filter(logits, 0.5))[0].tolist() == [True, False, False, False]
