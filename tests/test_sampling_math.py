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
from scipy import stats as scipy_stats

from exactness_tools import compare, planted_fault
from sjd_pac_core.sampling.drafting import draft_and_ranked
from sjd_pac_core.sampling import rules, verify
from sjd_pac_core.sampling.tree import build_tree_layout, tree_attention_mask, tree_position_ids
from sjd_pac_core.sampling.verify import (
    accept_probability,
    candidate_validity,
    first_true,
    gumbel_argmax,
    gumbel_argmax_of_logs,
    gumbel_noise,
    residual,
    sample,
    sample_without_replacement_rows,
    speculative_accept,
)

P_VALUE_MIN = 1e-3
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


# Hand-made levels (p, q, slots): q's support smaller than the slots in the last three, so the
# sampler's fixed-width row carries padding slots; their tokens are ones q cannot draw but p
# wants (a padding slot counted as real would be accepted).
LEVELS = [
    (torch.tensor([0.05, 0.45, 0.1, 0.4]), torch.tensor([0.4, 0.1, 0.3, 0.2]), k) for k in (1, 2, 3, 4)
] + [
    (torch.tensor([0.1, 0.5, 0.1, 0.2, 0.1]), torch.tensor([0.6, 0.0, 0.4, 0.0, 0.0]), 4),
    (torch.tensor([0.3, 0.0, 0.3, 0.4]), torch.tensor([0.0, 0.5, 0.2, 0.3]), 4),
    (torch.tensor([0.2, 0.5, 0.3]), torch.tensor([1.0, 0.0, 0.0]), 3),
]


def _level_rows(p: torch.Tensor, q: torch.Tensor, k: int):
    """Every way the sampler can fill one level of k slots: the ordered draws without
    replacement of min(k, support) candidates from q, then padding slots (tokens outside q's
    support, cycled). Rows (p [R, V], q [R, V], candidates [R, k], valid [R, k], probability [R])."""
    real = min(k, int((q > 0).sum()))
    outside = [t for t in range(q.shape[0]) if q[t] == 0] or [0]
    rows = [(list(tup) + [outside[i % len(outside)] for i in range(k - real)], prob)
            for tup, prob in _without_replacement_orders(q, real)]
    cands = torch.tensor([c for c, _ in rows])
    valid = (torch.arange(k) < real).expand(len(rows), k)
    prob = torch.tensor([w for _, w in rows], dtype=torch.float64)
    return p.expand(len(rows), -1), q.expand(len(rows), -1), cands, valid, prob


def _level_output(p: torch.Tensor, q: torch.Tensor, k: int, valid_override=None) -> torch.Tensor:
    """Exact output law of one level as the sampler verifies it: every way of filling it, all
    in ONE call of recursive_rejection_rows (the function RejectionRule.verify calls), the first
    accepted candidate in slot order wins, else a draw from the final residual."""
    p_rows, q_rows, cands, valid, prob = _level_rows(p, q, k)
    if valid_override is not None:
        valid = valid_override(valid)
    accept, final = verify.recursive_rejection_rows(p_rows, q_rows, cands, valid)
    return _first_accepted_law(prob, cands, accept, final)


def _first_accepted_rows(cands: torch.Tensor, accept: torch.Tensor, final: torch.Tensor) -> torch.Tensor:
    """[R, V]: the output law of each way of filling a level: the first accepted candidate in
    slot order wins, else a draw from the final residual."""
    accept, final = accept.double(), final.double()
    out = torch.zeros(cands.shape[0], final.shape[-1], dtype=torch.float64)
    reach = torch.ones(cands.shape[0], dtype=torch.float64)
    for j in range(cands.shape[1]):
        out.scatter_add_(1, cands[:, j : j + 1], (reach * accept[:, j]).unsqueeze(1))
        reach = reach * (1 - accept[:, j])
    return out + reach.unsqueeze(1) * final


def _first_accepted_law(prob: torch.Tensor, cands: torch.Tensor, accept: torch.Tensor,
                        final: torch.Tensor) -> torch.Tensor:
    """The output law over every way of filling a level (way i with probability prob[i])."""
    return (prob.unsqueeze(1) * _first_accepted_rows(cands, accept, final)).sum(0)


def _worst_level_error(**kwargs) -> float:
    return max(float((_level_output(p, q, k, **kwargs) - p.double()).abs().max()) for p, q, k in LEVELS)


def test_recursive_rejection_rows_is_exact_with_padding_slots():
    """Exact enumeration: every level's output law is p, to rounding."""
    for p, q, k in LEVELS:
        out = _level_output(p, q, k)
        assert torch.allclose(out, p.double(), atol=1e-6), (p, q, k, out)


def test_recursive_rejection_rows_controls():
    """The same enumeration rejects the planted faults (they move a level's law by 0.30, 0.20
    and 0.27; the correct code stays within 1.3e-7): padding slots counted as candidates, q that
    keeps a rejected candidate's mass, a rejection redrawn from p instead of the residual."""
    assert _worst_level_error(valid_override=torch.ones_like) > 0.05
    with planted_fault("q_keeps_rejected_mass") as calls:
        assert _worst_level_error() > 0.05
    assert calls.count > 0
    residual_calls = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(verify, "residual", lambda p, q, rows=None: residual_calls.append(1) or p)
        assert _worst_level_error() > 0.05
    assert residual_calls


def test_recursive_rejection_rows_by_hand():
    p = torch.tensor([[0.6, 0.4, 0.0], [0.6, 0.4, 0.0]])
    q = torch.tensor([[0.5, 0.25, 0.25], [0.5, 0.5, 0.0]])
    cands = torch.tensor([[2, 0], [0, 2]])
    valid = torch.tensor([[True, True], [True, False]])  # row 1: q has two tokens, slot 1 pads
    acc, final = verify.recursive_rejection_rows(p, q, cands, valid)
    # Row 0: c1 = 2: p(2)/q(2) = 0 -> reject; p2 = norm(max(p - q, 0)) = [0.1, 0.15, 0] / 0.25.
    # q2 = q without 2 = [2/3, 1/3, 0]; c2 = 0: p2(0)/q2(0) = 0.4 / (2/3) = 0.6;
    # p3 = norm(max(p2 - q2, 0)) = norm([0, 0.6 - 1/3, 0]) = [0, 1, 0].
    # Row 1: c1 = 0: 0.6 / 0.5 -> 1; the padding slot: 0 and the residual unchanged after it.
    assert torch.allclose(acc, torch.tensor([[0.0, 0.6], [1.0, 0.0]]))
    assert torch.allclose(final, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))


# Levels whose slots after the first come from another law (p, q, beside, slots): the rejection
# rule's candidates_beside (the neighbour law beside each draft). The third's law has fewer
# tokens than the slots; the fourth's puts no mass where p has most.
BESIDE_LEVELS = [
    (torch.tensor([0.05, 0.45, 0.1, 0.4]), torch.tensor([0.4, 0.1, 0.3, 0.2]),
     torch.tensor([0.1, 0.5, 0.1, 0.3]), k) for k in (2, 3, 4)
] + [
    (torch.tensor([0.1, 0.5, 0.1, 0.2, 0.1]), torch.tensor([0.3, 0.1, 0.2, 0.2, 0.2]),
     torch.tensor([0.0, 0.7, 0.0, 0.3, 0.0]), 4),
    (torch.tensor([0.3, 0.0, 0.3, 0.4]), torch.tensor([0.2, 0.3, 0.2, 0.3]), torch.tensor([0.6, 0.4, 0.0, 0.0]), 3),
]


def _beside_rows(q: torch.Tensor, law: torch.Tensor, k: int):
    """Every way the sampler can fill one level whose slot 0 is drawn from q and whose other
    slots are one draw without replacement from `law` with slot 0's token left out (padding
    past the law's support): (candidates long [R, k], valid bool [R, k], probability [R])."""
    rows, probs = [], []
    for first in range(q.shape[0]):
        if q[first] <= 0:
            continue
        rest = law.clone()
        rest[first] = 0
        real = min(k - 1, int((rest > 0).sum()))
        outside = [t for t in range(q.shape[0]) if t != first and rest[t] == 0] or [first]
        for tup, prob in _without_replacement_orders(rest / rest.sum(), real):
            rows.append([first, *tup] + [outside[i % len(outside)] for i in range(k - 1 - real)])
            probs.append(float(q[first]) * prob)
    cands = torch.tensor(rows)
    return cands, verify.beside_validity(law.expand(len(rows), -1), cands[:, 0], k), torch.tensor(probs, dtype=torch.float64)


def _beside_verified(p: torch.Tensor, q: torch.Tensor, law: torch.Tensor, cands: torch.Tensor, valid: torch.Tensor,
                     prob: torch.Tensor, pass_law: bool = True) -> torch.Tensor:
    """The output law of a level filled in the ways `cands` with probabilities `prob`, verified in
    ONE call of recursive_rejection_rows with `beside` = law (or, the planted fault, without it)."""
    rows = cands.shape[0]
    accept, final = verify.recursive_rejection_rows(p.expand(rows, -1), q.expand(rows, -1), cands, valid,
                                                    law.expand(rows, -1) if pass_law else None)
    return _first_accepted_law(prob, cands, accept, final)


def _beside_output(p: torch.Tensor, q: torch.Tensor, law: torch.Tensor, k: int, pass_law: bool = True) -> torch.Tensor:
    """Exact output law of one level: every way of filling it (`_beside_rows`), verified."""
    return _beside_verified(p, q, law, *_beside_rows(q, law, k), pass_law=pass_law)


def test_recursive_rejection_rows_is_exact_with_candidates_from_another_law():
    """Exact enumeration: a draft from q and the others from another law give p, to rounding."""
    for p, q, law, k in BESIDE_LEVELS:
        out = _beside_output(p, q, law, k)
        assert torch.allclose(out, p.double(), atol=1e-6), (p, q, law, k, out)


def test_recursive_rejection_rows_control_candidates_from_another_law_verified_as_from_q():
    """The planted fault: the same candidates verified as if they were a draw from q."""
    worst = max(float((_beside_output(p, q, law, k, pass_law=False) - p.double()).abs().max())
                for p, q, law, k in BESIDE_LEVELS)
    assert worst > 0.05


# The rule's own draw of the candidates beside a draft (RejectionRule.candidates_beside), held
# to the enumeration above: every row it draws must be one the enumeration gives a chance (so a
# draw that may repeat the draft, or repeat a token, fails at once), the rows of each draft must
# follow the enumeration's probabilities, and the drawn rows verified by recursive_rejection_rows
# with the law must give p. Draws per level and draft, in one vectorised call each.
BESIDE_DRAWS = 3000
BESIDE_GAP_MAX = 5.0  # standard errors (25 token-level comparisons)


def _row_codes(cands: torch.Tensor, valid: torch.Tensor, vocab: int) -> torch.Tensor:
    """long [R]: one number per row for its real slots in order (padding slots read as `vocab`)."""
    digits = torch.where(valid, cands, torch.full_like(cands, vocab))
    return (digits * (vocab + 1) ** torch.arange(cands.shape[1])).sum(-1)


def _beside_draw_check(seed: int):
    """(drawn rows the enumeration gives no chance, the smallest chi-square p-value of one
    draft's rows against the enumeration (Bonferroni over every level and draft), the largest
    gap between the drawn rows' verified output law and p, in standard errors)."""
    rule = rules.RejectionRule(torch.Generator().manual_seed(seed))
    impossible, p_value, gap, tests = 0, 1.0, 0.0, 0
    for p, q, law, k in BESIDE_LEVELS:
        vocab = q.shape[0]
        exact_cands, exact_valid, exact_prob = _beside_rows(q, law, k)
        exact_codes = _row_codes(exact_cands, exact_valid, vocab)
        estimate, variance = torch.zeros(vocab, dtype=torch.float64), torch.zeros(vocab, dtype=torch.float64)
        for first in exact_cands[:, 0].unique():
            n, share = BESIDE_DRAWS, float(q[first])
            cands, valid = rule.candidates_beside(law.expand(n, -1), first.expand(n), k, torch.zeros(n, dtype=torch.long))
            codes = _row_codes(cands, valid, vocab)
            known = torch.isin(codes, exact_codes) & (cands[:, 0] == first)
            impossible += int((~known).sum())
            if not bool(known.all()):
                continue
            mine = exact_cands[:, 0] == first
            chance = dict(zip(exact_codes[mine].tolist(), (exact_prob[mine] / share).tolist()))
            counts = dict(zip(*(t.tolist() for t in codes.unique(return_counts=True))))
            p_value = min(p_value, compare(counts, chance)[0])
            tests += 1
            rows = cands.shape[0]
            accept, final = verify.recursive_rejection_rows(p.expand(rows, -1), q.expand(rows, -1), cands, valid,
                                                            law.expand(rows, -1))
            out = _first_accepted_rows(cands, accept, final)
            estimate += share * out.mean(0)
            variance += share ** 2 * out.var(0) / n
        error = (estimate - p.double()).abs()  # a token every drawn row gives the same chance: to rounding
        gap = max(gap, float((error / variance.sqrt().clamp(min=1e-6)).max()))
    return impossible, min(1.0, p_value * max(tests, 1)), gap


def test_the_law_draw_of_the_rejection_rule_matches_the_enumeration():
    impossible, p_value, gap = _beside_draw_check(seed=0)
    assert impossible == 0, f"{impossible} drawn rows have no chance in the enumeration"
    assert p_value > P_VALUE_MIN, f"the rows' counts: p = {p_value:.2e}"
    assert gap < BESIDE_GAP_MAX, f"the drawn rows verified give p only to {gap:.1f} standard errors"


@pytest.mark.parametrize("fault", ["beside_draft_not_left_out", "beside_with_replacement"])
def test_planted_law_draws_fail_the_enumeration(fault):
    """A draw whose later slots may repeat the draft, or repeat each other, is caught at once."""
    with planted_fault(fault) as calls:
        impossible, p_value, gap = _beside_draw_check(seed=1)
    assert calls.count > 0, f"the seam of {fault} never ran; re-target it in exactness_tools.FAULTS"
    assert impossible > 0, f"planted bug {fault} went unnoticed (counts p = {p_value:.2e}, gap {gap:.1f})"


def test_beside_validity_counts_the_laws_tokens_other_than_the_draft():
    law = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0], [0.1, 0.2, 0.3, 0.4]])
    first = torch.tensor([0, 2, 3])
    assert verify.beside_validity(law, first, 3).tolist() == [
        [True, True, False], [True, True, True], [True, True, True]]


def test_candidate_validity_marks_slots_past_the_support():
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.1, 0.2, 0.3, 0.4], [0.0, 0.0, 1.0, 0.0]])
    assert candidate_validity(q, 3).tolist() == [[True, True, False], [True, True, True], [True, False, False]]


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


def _ordered_pairs_pvalue(cands: torch.Tensor, first: torch.Tensor, q: torch.Tensor) -> float:
    """Chi-square p-value of the (slot 1, slot 2) pairs of rows drawn for the rows of q [R, V]
    (each with its own `first`) against Plackett-Luce over q without the row's first token,
    Bonferroni over the rows. A slot repeating an earlier one is an impossible pair."""
    v = q.shape[-1]
    worst = 1.0
    for row in range(q.shape[0]):
        rest = q[row].double().clone()
        rest[first[row]] = 0
        rest = rest / rest.sum()
        exact = torch.zeros(v * v, dtype=torch.float64)
        for (a, b), prob in _without_replacement_orders(rest, 2):
            exact[a * v + b] = prob
        got = cands[row :: q.shape[0]]
        observed = torch.bincount(got[:, 1] * v + got[:, 2], minlength=v * v).double()
        if bool((observed[exact == 0] > 0).any()):
            return 0.0
        keep = exact > 0
        expected = exact[keep] * observed.sum()
        worst = min(worst, float(scipy_stats.chisquare(observed[keep].numpy(), expected.numpy()).pvalue))
    return min(1.0, worst * q.shape[0])


# Rows of q (the chain siblings' batched draw gets many at once): the first slot is the row's
# draft, given; slots 1 and 2 must be an ordered draw without replacement from q without it.
PL_Q = torch.tensor([[0.5, 0.3, 0.15, 0.05, 0.0], [0.1, 0.2, 0.3, 0.4, 0.0], [0.35, 0.3, 0.2, 0.15, 0.0]])
PL_FIRST = torch.tensor([0, 3, 1])
PL_DRAWS = 6000  # per row, in one vectorised draw; the planted control below gave p = 1.5e-278


def test_sample_without_replacement_rows_follows_plackett_luce_per_row():
    g = torch.Generator().manual_seed(3)
    reps = PL_Q.repeat(PL_DRAWS, 1)
    firsts = PL_FIRST.repeat(PL_DRAWS)
    got = sample_without_replacement_rows(reps, firsts, 3, g)
    assert (got[:, 0] == firsts).all()
    assert _ordered_pairs_pvalue(got, PL_FIRST, PL_Q) > 1e-3
    assert sample_without_replacement_rows(PL_Q, PL_FIRST, 1, g).tolist() == [[0], [3], [1]]
    # Planted control: the siblings drawn from a tempered q (softmax(0.5 log q)), one of the
    # sibling laws the tree's exactness rests on ruling out.
    tempered = torch.softmax(0.5 * torch.log(reps), -1)
    assert _ordered_pairs_pvalue(sample_without_replacement_rows(tempered, firsts, 3, g), PL_FIRST, PL_Q) < 1e-6


def test_sample_without_replacement_rows_never_repeats_a_token_in_the_support():
    g = torch.Generator().manual_seed(2)
    q = torch.tensor([[0.7, 0.2, 0.1, 0.0]]).expand(500, -1)
    got = sample_without_replacement_rows(q, torch.zeros(500, dtype=torch.long), 3, g)
    assert (got.sort(-1).values == torch.tensor([0, 1, 2])).all()


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


def _plain_gumbel_argmax(p, noise):
    return (torch.log(p) + noise).argmax(-1)


@pytest.mark.parametrize("noise_dtype", [torch.float32, torch.float64])
def test_gumbel_argmax_is_the_plain_definition_on_masked_and_peaked_rows(noise_dtype):
    # Rows as a pass makes them: a masked vocabulary, a sharp temperature (most entries
    # underflow to 0), one token nearly certain, the least positive float, every noise extreme.
    torch.manual_seed(0)
    logits = torch.randn(300, 567) * torch.tensor([1.0, 30.0, 200.0]).repeat(100).unsqueeze(1)
    logits[:, 512:] = float("-inf")
    p = torch.softmax(logits, -1)
    p[0] = 0.0
    p[0, 5], p[0, 7] = 1.0, 1e-45
    noise = gumbel_noise(11, torch.arange(300), 567).to(noise_dtype)
    noise[0, 7], noise[0, 5] = 23.0, -4.0  # the least positive entry gets the largest key
    assert torch.equal(gumbel_argmax(p, noise), _plain_gumbel_argmax(p, noise))
    assert gumbel_argmax(p, noise)[0] == 5
    # ties go to the first index, as argmax's
    tied = torch.full((2, 6), 1 / 6)
    assert gumbel_argmax(tied, torch.zeros(2, 6)).tolist() == [0, 0]


def test_gumbel_argmax_control_zeros_raised_too_far_changes_draws():
    # Control: zeros raised to 1e-3 instead of the least positive float win where they must not.
    torch.manual_seed(1)
    p = torch.softmax(torch.randn(400, 567) * 30.0, -1)
    noise = gumbel_noise(5, torch.arange(400), 567)
    assert not torch.equal(_plain_gumbel_argmax(p.clamp(min=1e-3), noise), gumbel_argmax(p, noise))


def test_a_target_from_processed_logits_is_the_gumbel_argmax_of_their_softmax():
    # The Gumbel rule's target reads the processed logits (GumbelRule.target): log p less a
    # constant per row. Masked, flat, sharp and very sharp rows, each shifted by its own constant.
    torch.manual_seed(2)
    logits = torch.randn(300, 567) * torch.tensor([1.0, 30.0, 200.0]).repeat(100).unsqueeze(1)
    logits[:, 512:] = float("-inf")
    noise = gumbel_noise(13, torch.arange(300), 567)
    shifted = logits + torch.randn(300, 1) * 50.0
    target = gumbel_argmax_of_logs(logits, noise)
    assert torch.equal(target, gumbel_argmax(torch.softmax(logits, -1), noise))
    assert torch.equal(gumbel_argmax_of_logs(shifted, noise), target)
    # Control: logits that are not log p's (the temperature left out) give other tokens.
    assert not torch.equal(gumbel_argmax_of_logs(logits * 2.0, noise), target)


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
    # The walk's accessors agree with the tuples, leaves included.
    for node in range(layout.num_nodes):
        kids = layout.children[node]
        assert layout.children.count(node) == len(kids)
        assert [layout.children.child(node, slot) for slot in range(len(kids))] == list(kids)
    assert layout.children.count(8) == 0 and layout.children.count(0) == 2
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


def test_rejected_mixture_averages_the_p_behind_each_rejected_candidate_by_its_mass():
    from sjd_pac_core.sampling.drafting import rejected_mixture

    behind = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    mass = torch.tensor([0.1, 0.3, 0.0])  # the third candidate had no mass under the rejecting p
    mixture = rejected_mixture(behind, mass)
    assert torch.allclose(mixture, torch.tensor([0.25, 0.75, 0.0]))
    # the drafter's blend with row 0 (behind_the_change, blend_acceptance): torch.lerp
    assert torch.allclose(torch.lerp(behind[0], mixture, 0.2), torch.tensor([0.85, 0.15, 0.0]))
    assert torch.equal(torch.lerp(behind[0], mixture, 0.0), behind[0])
    # no candidate had mass (cut by top-k): the p behind the rejected draft alone
    assert torch.equal(rejected_mixture(behind, torch.zeros(3)), behind[0])


def test_blend_acceptance_is_one_minus_the_total_variation_of_each_blend():
    from sjd_pac_core.sampling.drafting import blend_acceptance

    row0, mixture, law = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.0, 0.5, 0.5]), torch.tensor([0.0, 1.0, 0.0])
    p = torch.tensor([0.0, 1.0, 0.0])
    no_law = torch.tensor([0.0])
    # q_0 = row0 misses p entirely; q_.5 = [.5, .25, .25] shares .25 with it; q_1 = mixture .5
    accept = blend_acceptance(row0, mixture, law, p, torch.tensor([0.0, 0.5, 1.0]), no_law)
    assert torch.allclose(accept, torch.tensor([[0.0], [0.25], [0.5]]))
    assert torch.allclose(blend_acceptance(p, mixture, law, p, torch.tensor([0.0]), no_law), torch.tensor([[1.0]]))
    # the law blended over the mixture blend: lerp(lerp(row0, mixture, wm), law, wl)
    both = blend_acceptance(row0, mixture, law, p, torch.tensor([0.0, 1.0]), torch.tensor([0.0, 0.5, 1.0]))
    assert torch.allclose(both, torch.tensor([[0.0, 0.5, 1.0], [0.5, 0.75, 1.0]]))


def _real_slots_the_law_gives(log_law: torch.Tensor, cands: torch.Tensor, valid: torch.Tensor) -> bool:
    """Every real slot after the draft holds a token the law gives something to."""
    return bool((log_law.gather(1, cands)[:, 1:] > float("-inf"))[valid[:, 1:]].all())


def test_gumbel_candidates_beside_a_draft_are_the_laws_tokens_by_noise_and_padding_past_its_support():
    # The law gives tokens 0, 2 and 4 anything (-inf elsewhere); the draft is inside its support
    # in row 0 and outside it in row 1 (a draft comes from its own q). Five slots each.
    inf = float("-inf")
    log_law = torch.tensor([[0.0, inf, -1.0, inf, -2.0, inf]]).expand(2, -1)
    first, positions, k = torch.tensor([2, 1]), torch.tensor([3, 4]), 5
    cands, valid = rules.GumbelRule(9, 6).candidates_beside_of_logs(log_law, first, k, positions)
    assert cands[:, 0].tolist() == [2, 1]
    assert valid.tolist() == [[True, True, True, False, False], [True, True, True, True, False]]
    keys = log_law + gumbel_noise(9, positions, 6)
    for row, others in ((0, [0, 4]), (1, [0, 2, 4])):
        real = cands[row, 1 : 1 + len(others)].tolist()
        assert real == sorted(others, key=lambda t: -float(keys[row, t]))  # the law's tokens, best key first
    assert _real_slots_the_law_gives(log_law, cands, valid)
    # Control: one real slot too many (the support counted with the draft in row 0) is caught.
    planted = valid.clone()
    planted[0, 3] = True
    assert not _real_slots_the_law_gives(log_law, cands, planted)


def test_draft_and_ranked_keep_the_draft_first_and_the_other_proposals_order_without_it():
    first = torch.tensor([4, 7, 2])
    ranked = torch.tensor([[1, 4, 3, 0],    # the draft ranked second: left out, the rest in order
                           [5, 6, 1, 2],    # the draft not ranked: its first three follow it
                           [2, 3, 9, 8]])   # the draft ranked first
    ranked_valid = torch.tensor([[True, True, True, True],
                                 [True, True, False, False],  # a row that holds only two other tokens
                                 [True, True, True, True]])
    tokens, valid = draft_and_ranked(first, ranked, ranked_valid, 3)
    assert tokens.tolist() == [[4, 1, 3], [7, 5, 6], [2, 3, 9]]
    assert valid.tolist() == [[True, True, True], [True, True, True], [True, True, True]]
    tokens, valid = draft_and_ranked(first, ranked, ranked_valid, 4)
    assert tokens[:, 0].tolist() == [4, 7, 2] and tokens[0].tolist() == [4, 1, 3, 0]
    assert valid.tolist() == [[True, True, True, True], [True, True, True, False], [True, True, True, True]]
