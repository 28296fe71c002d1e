"""Drafting: proposals for positions new to the window, Adaptive Continuation, PD candidates."""

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


def candidate_count(q: torch.Tensor, width: int) -> torch.Tensor:
    """How many PD candidates each row of q [.., V] can give: min(K, support size)."""
    return (q > 0).sum(-1).clamp(max=width)
