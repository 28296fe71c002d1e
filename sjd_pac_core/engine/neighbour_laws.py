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

Summed p's, one row per (expert, token), and their counts, sized by the memory plan
(`models.memory.law_row_entries`): the two experts' rows are blocks of one table (the left
expert's V + 1 rows, then the above expert's), so one read serves both. Where the [2 (V + 1), V]
table fits (the demo model's 567 tokens take 2.6 MB) the rows are dense (`DenseRows`). A 7B
family's image codes (8,194 to 32,772 tokens: gigabytes dense) keep in each row only its 64
largest sums (`TopRows`: 13-50 MB): the tokens a law gives almost nothing to are the ones it
would not propose anyway.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from ..models import memory

FLOOR = 1e-6  # a token one law never saw still gets this much in the product (the other law may know it)


def run_starts(ordered: torch.Tensor) -> torch.Tensor:
    """bool like `ordered` (1-d, equal values adjacent): True where a run of equal values starts."""
    start = torch.ones_like(ordered, dtype=torch.bool)
    start[1:] = ordered[1:] != ordered[:-1]
    return start


class DenseRows:
    """Summed p's per row, every entry kept: [rows, V] floats (default V + 1 rows; a row that
    takes the p's that do not count is never read)."""

    def __init__(self, vocab: int, device: torch.device, rows: Optional[int] = None) -> None:
        self.sums = torch.zeros(vocab + 1 if rows is None else rows, vocab, device=device)

    def add(self, rows: torch.Tensor, p: torch.Tensor) -> None:
        """Add p[i] [V] to row rows[i] (rows may repeat)."""
        self.sums.index_add_(0, rows, p)

    def read(self, rows: torch.Tensor) -> torch.Tensor:
        """[R, V]: the sums of rows `rows`."""
        return self.sums[rows]


class TopRows:
    """Summed p's per row, each row keeping its `kept` largest entries: ids long [rows, kept]
    and sums [rows, kept] (default V + 1 rows; row V takes the entries a merge drops, and like
    any row that takes the p's that do not count, it is never read). Merging is fixed-shape
    tensor work (a sort, segment sums, a rank within each row): no host sync, no loop."""

    def __init__(self, vocab: int, kept: int, device: torch.device, rows: Optional[int] = None) -> None:
        self.vocab, self.kept = vocab, kept
        rows = vocab + 1 if rows is None else rows
        self.ids = torch.zeros(rows, kept, dtype=torch.long, device=device)
        self.sums = torch.zeros(rows, kept, device=device)

    def add(self, rows: torch.Tensor, p: torch.Tensor) -> None:
        """Add p[i] [V] to row rows[i] (rows may repeat), then keep each row's largest sums."""
        n, kept, vocab = rows.shape[0], self.kept, self.vocab
        new_sums, new_ids = p.topk(min(kept, p.shape[-1]), dim=-1)
        # each touched row's current entries once: with the first node that names it
        order = torch.sort(rows, stable=True).indices
        owner = torch.zeros_like(rows, dtype=torch.bool).index_copy_(0, order, run_starts(rows[order]))
        old_sums = self.sums[rows] * owner.unsqueeze(1)
        entry_rows = torch.cat([rows.unsqueeze(1).expand(n, kept), rows.unsqueeze(1).expand(n, new_ids.shape[1])], 1)
        entry_ids = torch.cat([self.ids[rows], new_ids], 1).flatten()
        entry_sums = torch.cat([old_sums, new_sums], 1).flatten()
        entry_rows = entry_rows.flatten()
        # one entry per (row, id): segment sums over the sorted keys
        keys, key_order = torch.sort(entry_rows * vocab + entry_ids, stable=True)
        start = run_starts(keys)
        segment = torch.cumsum(start.long(), 0) - 1
        totals = torch.zeros_like(entry_sums).index_add_(0, segment, entry_sums[key_order])
        merged_sums = torch.where(start, totals[segment], torch.full_like(totals, -1.0))
        merged_rows, merged_ids = keys // vocab, keys % vocab
        # the largest sums of each row first, then each entry's rank within its row
        by_sum = torch.sort(merged_sums, descending=True, stable=True).indices
        by_row = by_sum[torch.sort(merged_rows[by_sum], stable=True).indices]
        final_rows = merged_rows[by_row]
        index = torch.arange(final_rows.shape[0], device=rows.device)
        rank = index - torch.cummax(torch.where(run_starts(final_rows), index, torch.zeros_like(index)), 0).values
        keep = (rank < kept) & (merged_sums[by_row] >= 0)
        target = torch.where(keep, final_rows, torch.full_like(final_rows, vocab))  # dropped: row V
        slot = torch.where(keep, rank, torch.zeros_like(rank))
        self.ids.index_fill_(0, rows, 0)
        self.sums.index_fill_(0, rows, 0.0)
        self.ids[target, slot] = torch.where(keep, merged_ids[by_row], torch.zeros_like(slot))
        self.sums[target, slot] = torch.where(keep, merged_sums[by_row], torch.zeros_like(merged_sums[by_row]))

    def read(self, rows: torch.Tensor) -> torch.Tensor:
        """[R, V]: the kept sums of rows `rows` (0 elsewhere)."""
        dense = torch.zeros(rows.shape[0], self.vocab, device=self.sums.device, dtype=self.sums.dtype)
        return dense.scatter_add_(1, self.ids[rows], self.sums[rows])


class NeighbourLaws:
    """Average p behind each token (the token to the left) and below each token (the token
    `row_length` positions back, with a grid), from every node of the passes verified so far.

    One table holds both experts: row t is the left law of token t, row (V + 1) + t the law
    below token t. Row V of each block takes what does not count (its count stays 0, so it is
    never seen): the p's of positions past the image or without a final token above, and the
    neighbours of positions before the image."""

    def __init__(self, vocab: int, row_length: int, device: torch.device, kept: Optional[int] = None) -> None:
        """kept: the sums a row keeps (None or >= vocab: every one, dense rows)."""
        self.vocab = vocab
        self.row_length = row_length
        rows = (2 if row_length else 1) * (vocab + 1)  # a block of V + 1 rows per expert
        self.sums: Union[DenseRows, TopRows] = (DenseRows(vocab, device, rows) if kept is None or kept >= vocab
                     else TopRows(vocab, kept, device, rows))
        self.counts = torch.zeros(rows, device=device)

    @property
    def left_count(self) -> torch.Tensor:
        """[V + 1]: how many p's each token's left law holds (a view)."""
        return self.counts[: self.vocab + 1]

    @property
    def above_count(self) -> Optional[torch.Tensor]:
        """[V + 1]: how many p's the law below each token holds (a view; None without a grid)."""
        return self.counts[self.vocab + 1 :] if self.row_length else None

    def add(self, tokens: torch.Tensor, positions: torch.Tensor, p: torch.Tensor, committed: torch.Tensor,
            num_committed: int) -> None:
        """One verified pass: node i holds `tokens[i]` and computed `p[i]` for image position
        `positions[i]`; `committed[:num_committed]` are final. Device ops only (no host sync)."""
        num_tokens = committed.shape[0]
        inside = positions < num_tokens  # a pass near the end feeds past the image
        left = torch.where(inside, tokens, self.vocab)
        self.sums.add(left, p)
        self.counts.index_add_(0, left, inside.to(p.dtype))
        if not self.row_length:
            return
        up = positions - self.row_length
        known = (up >= 0) & (up < num_committed) & inside  # the token above is final
        above = torch.where(known, committed.index_select(0, up.clamp(0, num_tokens - 1)), self.vocab) + (self.vocab + 1)
        self.sums.add(above, p)
        self.counts.index_add_(0, above, known.to(p.dtype))

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
        to its left and the token above, each committed (before `start`) or the window's draft:
        q [R, V] restricted to `allowed` (bool [R, V]), and seen (bool [R]), False where neither
        token has been seen. Device ops only."""
        mean_log, seen = self.window_log_law(start, drafts, committed, allowed.shape[0])
        weights = torch.exp(mean_log - mean_log.max(-1, keepdim=True).values) * allowed
        return weights / weights.sum(-1, keepdim=True).clamp(min=1e-30), seen

    def window_log_law(self, start: int, drafts: torch.Tensor, committed: torch.Tensor,
                       rows: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """`window_law` as logs, before it is restricted and normalised: [R, V], each row the
        mean of its experts' log laws (finite, at least log FLOOR; a row's constant apart from
        the log of window_law's q where allowed), and seen [R]. What only needs the law's order
        (a Gumbel ranking) reads this and skips the normalisation. Both experts' rows in one
        read: the neighbours of the R positions are two slices of one line of tokens."""
        back = self.row_length or 1  # the furthest neighbour back: the token above, else the left one
        first = start - back  # the line's first position
        pieces = [committed[max(first, 0) : start], drafts[: rows - 1]]
        if first < 0:  # neighbours before the image: a block's row V, never seen
            pieces.insert(0, committed.new_full((-first,), self.vocab))
        line = torch.cat(pieces)  # line[i]: the token of position first + i
        index = line[back - 1 : back - 1 + rows]  # the left neighbours
        if self.row_length:
            index = torch.cat([index, line[:rows] + (self.vocab + 1)])  # and the tokens above
        log_law, seen = self._log_law(index)
        if not self.row_length:
            return log_law, seen.squeeze(1)
        seen = seen.to(log_law.dtype)
        experts = seen[:rows] + seen[rows:]
        return (log_law[:rows] + log_law[rows:]) / experts.clamp(min=1.0), (experts > 0).squeeze(1)

    def _log_law(self, rows: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """[R, V]: log of the average p of each table row (0 where it was never seen), and bool
        [R, 1]: whether it was seen."""
        count = self.counts[rows].unsqueeze(1)
        seen = count > 0
        return torch.log((self.sums.read(rows) / count.clamp(min=1.0)).clamp(min=FLOOR)) * seen, seen


def make_laws(vocab: int, row_length: int, device: torch.device) -> Optional[NeighbourLaws]:
    """The run's laws, dense or compact (`law_row_entries`), or None where not even compact rows fit."""
    kept = memory.law_row_entries(vocab, 2 if row_length else 1)
    return None if kept is None else NeighbourLaws(vocab, row_length, device, kept)
