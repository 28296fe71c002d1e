"""Drafting: proposals for positions new to the window, Adaptive Continuation, the proposal behind
a changed token, PD candidates."""

from __future__ import annotations

import torch

from .recipe import SamplingRecipe, TokenConstraints, process


def initial_proposals(
    source_logits: torch.Tensor,
    positions: torch.Tensor,
    recipe: SamplingRecipe,
    constraints: TokenConstraints,
    kind: str,
) -> torch.Tensor:
    """q [M, V] for positions new to the window; the draft there is drawn from exactly this q.

    "nearest": the stale logits of the furthest position the last pass computed, processed with
    each new position's own recipe (so a forced end-of-line stays one-hot there).
    "uniform": uniform over the tokens each position allows.
    source_logits: [B, V] raw logits (B = 2 with CFG).
    """
    if kind == "uniform":
        allowed = constraints.mask(positions).float()
        return allowed / allowed.sum(-1, keepdim=True)
    m = positions.shape[0]
    logits = source_logits.unsqueeze(1).expand(-1, m, -1)
    return process(logits, positions, recipe, constraints)


def adaptive_continuation(
    drafts: torch.Tensor, accepted: torch.Tensor, replacements: torch.Tensor
) -> torch.Tensor:
    """AC (spec section 3): keep each old draft the stale p accepts, else take its redraw.

    accepted / replacements come from verifying the old drafts against this pass's stale p (the
    residual draw under the rejection rule, the Gumbel target under the Gumbel rule). The result
    is distributed as the stale p at every position, so its q is that p. One tensor op.
    """
    return torch.where(accepted, drafts, replacements)


def rejected_mixture(p_behind: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """q [V] for the position right after a rejection among several candidates.

    p_behind: [k, V] the p's the pass computed behind each rejected candidate (row 0 behind the
    rejected draft, the one Adaptive Continuation carries on from); mass: [k] each candidate's
    probability under the p that rejected them. The token committed there is none of them, so
    every p_behind saw a wrong token; their average in proportion to that p is the next
    position's law with the unplaced token averaged out (on the demo, its top draft holds the
    verified token 32% of the time against 26% for row 0). All of it computed before the pass
    that verifies the draft, so exact; the drafter blends it with row 0 (engine/mixture.py).
    """
    total = mass.sum()
    mixture = (mass.unsqueeze(-1) * p_behind).sum(0) / total.clamp(min=1e-30)
    return torch.where(total > 0, mixture, p_behind[0])  # none had mass (cut by top-k): row 0 alone


def first_draft_blend(row0: torch.Tensor, mixture: torch.Tensor, law: torch.Tensor, w_mixture, w_law) -> torch.Tensor:
    """The first draft's q: lerp(lerp(row0, mixture, w_mixture), law, w_law) (weights broadcast)."""
    return torch.lerp(torch.lerp(row0, mixture, w_mixture), law, w_law)


def blend_acceptance(row0: torch.Tensor, mixture: torch.Tensor, law: torch.Tensor, p: torch.Tensor,
                     mixture_weights: torch.Tensor, law_weights: torch.Tensor) -> torch.Tensor:
    """[Wm, Wl]: the chance a draft from `first_draft_blend` would be accepted against the target
    p [V], for each pair of `mixture_weights` [Wm] and `law_weights` [Wl]: sum_v min(q(v), p(v)) =
    1 - TV(q, p), what the best coupling of a draft with its target achieves (speculative
    sampling's accept rate)."""
    dtype = row0.dtype
    q = first_draft_blend(row0, mixture, law.to(dtype), mixture_weights.to(dtype).view(-1, 1, 1),
                          law_weights.to(dtype).view(1, -1, 1))  # [Wm, Wl, V]
    return torch.minimum(q, p.to(dtype)).sum(-1)


def candidate_count(q: torch.Tensor, width: int) -> torch.Tensor:
    """How many PD candidates each row of q [.., V] can give: min(K, support size)."""
    return (q > 0).sum(-1).clamp(max=width)


def draft_and_ranked(first: torch.Tensor, ranked: torch.Tensor, ranked_valid: torch.Tensor,
                      width: int) -> tuple:
    """Candidate rows whose slot 0 is each row's draft and whose other slots are another
    proposal's tokens in its order, the draft left out: (tokens long [R, width], valid bool
    [R, width]).

    first: long [R], the drafts; ranked: long [R, n] with n >= width, distinct tokens per row,
    best first (e.g. a Gumbel top-n); ranked_valid: bool [R, n], False for a token the row may
    not hold. The Gumbel rule's `candidates_beside` (exact for any tokens fixed before the pass);
    one stable sort, no loop.
    """
    others = ranked != first.unsqueeze(1)  # the draft appears at most once
    order = torch.argsort((~others).to(torch.int8), dim=1, stable=True)  # the others first, in rank order
    rest = ranked.gather(1, order)[:, : width - 1]
    rest_valid = (others & ranked_valid).gather(1, order)[:, : width - 1]
    tokens = torch.cat([first.unsqueeze(1), rest], 1)
    valid = torch.cat([torch.ones_like(first, dtype=torch.bool).unsqueeze(1), rest_valid], 1)
    return tokens, valid
