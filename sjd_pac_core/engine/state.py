"""DecodeState: everything the loop carries from one forward pass to the next."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..models.base import DecoderSession

if TYPE_CHECKING:
    from .drafters import Draft


@dataclass
class DraftWindow:
    """Draft tokens for the positions right after the committed prefix, each with its q.

    tokens[j] is the draft for image position num_committed + j, drawn from q[j] given
    everything before it (that is what makes verifying it against p exact).
    """

    tokens: torch.Tensor  # long [M]
    q: torch.Tensor  # float [M, V]

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def tail(self, start: int) -> "DraftWindow":
        return DraftWindow(self.tokens[start:], self.q[start:])

    def extend(self, tokens: torch.Tensor, q: torch.Tensor) -> "DraftWindow":
        return DraftWindow(torch.cat([self.tokens, tokens]), torch.cat([self.q, q]))

    @staticmethod
    def empty_like(ctx, logits: torch.Tensor) -> "DraftWindow":
        """No drafts, on logits' device (q has the vocabulary width of logits)."""
        return DraftWindow(ctx.positions[:0], logits.new_zeros((0, logits.shape[-1]), dtype=torch.float32))


@dataclass
class DecodeState:
    """The loop's state between passes.

    committed[:num_committed] are final. The last committed token is not in the cache yet: it is
    the root (first input) of the next pass. `draft` is what the next pass verifies (the window
    and, after a rejection, the Proactive Drafting tree); `target` the window size it was drafted
    for (it sizes the pass's fixed envelope).
    """

    session: DecoderSession
    committed: torch.Tensor  # long [N]
    num_committed: int
    draft: "Draft"
    target: int

    @property
    def num_tokens(self) -> int:
        return int(self.committed.shape[0])

    @property
    def done(self) -> bool:
        return self.num_committed >= self.num_tokens

    @property
    def root_token(self) -> torch.Tensor:
        return self.committed[self.num_committed - 1 : self.num_committed]

