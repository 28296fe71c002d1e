"""The run's own next-token laws by neighbour: a proposal for the position right behind a changed token.

Every node of every pass computes an exact p for the position after it. Averaged over the run,
the p's behind a token x are the law of "what follows x" in this image, and the p's of positions
whose token above is a are the law of "what lies below a" (image codes repeat along rows and down
columns: backgrounds, edges, flat colour). Right behind a changed token, the draft from the last
pass was drawn behind the token that has just been replaced, so it is often wrong; the law behind
the new token to the left, combined with the law below the committed token above (their
normalised geometric mean, a product of experts), predicts the verified token better: on the demo
model its q holds 48% of the exact p's mass there (1 - TV), against 23% for the p behind the
rejected draft and 32% for the mixture of the p's behind every rejected candidate.

The laws are built only from passes already verified and read before the pass that verifies the
draft drawn from them, so verification stays exact under both rules. `engine/mixture.py` blends
the law into the first draft at the weight the run's own passes score best.

Two [V, V] tables (sums and counts per token): the laws are kept only where they fit
`MAX_BYTES` (the demo model's 567 tokens take 2.6 MB; a vocabulary of tens of thousands of tokens
would take gigabytes, and there the first draft keeps to the other two proposals).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

MAX_BYTES = 256 * 2**20  # both tables together
FLOOR = 1e-6  # a token one law never saw still gets this much in the product (the other law may know it)


class NeighbourLaws:
    """Average p behind each token (the token to the left) and below each token (the token
    `row_length` positions back, with a grid), from every node of the passes verified so far."""

    def __init__(self, vocab: int, row_length: int, device: torch.device) -> None:
        self.row_length = row_length
        self.left_sum = torch.zeros(vocab, vocab, device=device)
        self.left_count = torch.zeros(vocab, device=device)
        self.above_sum = torch.zeros(vocab, vocab, device=device) if row_length else None
        self.above_count = torch.zeros(vocab, device=device) if row_length else None

    @staticmethod
    def fit(vocab: int, row_length: int) -> bool:
        """Whether the tables for a vocabulary of `vocab` tokens fit MAX_BYTES."""
        tables = 2 if row_length else 1
        return tables * vocab * vocab * 4 <= MAX_BYTES

    def add(self, tokens: torch.Tensor, positions: torch.Tensor, p: torch.Tensor, committed: torch.Tensor,
            num_committed: int) -> None:
        """One verified pass: node i holds `tokens[i]` and computed `p[i]` for image position
        `positions[i]`; `committed[:num_committed]` are final. Device ops only (no host sync)."""
        num_tokens = committed.shape[0]
        inside = (positions < num_tokens).to(p.dtype)  # a pass near the end feeds past the image
        self.left_sum.index_add_(0, tokens, p * inside.unsqueeze(-1))
        self.left_count.index_add_(0, tokens, inside)
        if self.above_sum is None:
            return
        up = positions - self.row_length
        known = ((up >= 0) & (up < num_committed)).to(p.dtype) * inside  # the token above is final
        above = committed.index_select(0, up.clamp(0, num_tokens - 1))
        self.above_sum.index_add_(0, above, p * known.unsqueeze(-1))
        self.above_count.index_add_(0, above, known)

    def law(self, position: int, committed: torch.Tensor, allowed: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The proposal for image `position` (>= 1) from the committed tokens to its left and above,
        restricted to `allowed` (bool [V]): q [V], and a 0-d bool, False where neither token has
        been seen (q is then meaningless)."""
        q, seen = self.window_law(position, committed[position - 1 : position - 1], committed, allowed.unsqueeze(0))
        return q[0], seen[0]

    def window_law(self, start: int, drafts: torch.Tensor, committed: torch.Tensor,
                   allowed: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The proposal for each of the image positions start .. start + R - 1 along a window
        whose drafts from `start` on are `drafts` (long, at least R - 1 of them), from the token
        to its left and the token above, each committed (before `start`) or the window's draft: q [R, V] restricted to `allowed` (bool [R, V]), and seen (bool [R]), False
        where neither token has been seen. Device ops only."""
        rows = allowed.shape[0]
        line = torch.cat([committed[start - 1 : start], drafts[: rows - 1]])  # the token to the left
        mean_log = self._log_law(self.left_sum, self.left_count, line)
        experts = (self.left_count[line] > 0).to(mean_log.dtype)
        if self.above_sum is not None:
            up = torch.arange(start, start + rows, device=line.device) - self.row_length
            from_drafts = (up - start).clamp(min=0, max=max(0, drafts.shape[0] - 1))
            above = torch.where(up < start, committed[up.clamp(min=0)], drafts[from_drafts] if drafts.shape[0] else 0)
            has = (up >= 0) & (self.above_count[above] > 0)
            mean_log = mean_log + self._log_law(self.above_sum, self.above_count, above) * has.unsqueeze(1)
            experts = experts + has.to(mean_log.dtype)
        mean_log = mean_log / experts.clamp(min=1.0).unsqueeze(1)
        weights = torch.exp(mean_log - mean_log.max(-1, keepdim=True).values) * allowed
        return weights / weights.sum(-1, keepdim=True).clamp(min=1e-30), experts > 0

    @staticmethod
    def _log_law(sums: torch.Tensor, counts: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """[R, V]: log of the average p behind each token (0 where it was never seen)."""
        count = counts[tokens].unsqueeze(1)
        return torch.log((sums[tokens] / count.clamp(min=1.0)).clamp(min=FLOOR)) * (count > 0)


def make_laws(vocab: int, row_length: int, device: torch.device) -> Optional[NeighbourLaws]:
    """The run's laws, or None where their tables would not fit MAX_BYTES."""
    return NeighbourLaws(vocab, row_length, device) if NeighbourLaws.fit(vocab, row_length) else None
