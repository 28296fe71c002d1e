"""ConstraintTable: TokenConstraints' per-position masks, built once per run on the device.

`TokenConstraints.mask` builds a one-hot row for every forced position on every call; the
sampler asks for masks on every pass, so it uses this table instead: the distinct mask rows
(the free set, then one row per distinct forced token) and which row each position uses. A
mask lookup is then one gather, with no host work.
"""

from __future__ import annotations

import torch

from .recipe import TokenConstraints


class ConstraintTable:
    """Drop-in for TokenConstraints wherever only `mask(positions)` is needed."""

    def __init__(self, constraints: TokenConstraints, device: torch.device) -> None:
        self.vocab_size = constraints.vocab_size
        self.num_tokens = constraints.num_tokens
        allowed, forced = constraints.allowed.cpu(), constraints.forced.cpu()
        if allowed.dim() == 2:  # a set per position: the rows are the positions
            one_hot = torch.nn.functional.one_hot(forced.clamp(min=0), self.vocab_size).bool()
            rows = torch.where((forced >= 0).unsqueeze(-1), one_hot, allowed)
            row_of = torch.arange(self.num_tokens)
        else:
            forced_ids = torch.unique(forced[forced >= 0])
            one_hot = torch.nn.functional.one_hot(forced_ids, self.vocab_size).bool()
            rows = torch.cat([allowed.unsqueeze(0), one_hot])
            row_of = torch.where(forced >= 0, 1 + torch.searchsorted(forced_ids, forced), torch.zeros_like(forced))
        self.rows = rows.to(device)
        self.row_of = row_of.to(device)

    def mask(self, positions: torch.Tensor) -> torch.Tensor:
        """Bool [S, V]: the tokens allowed at each of `positions` (image-token indices)."""
        return self.rows.index_select(0, self.row_of.index_select(0, positions))
