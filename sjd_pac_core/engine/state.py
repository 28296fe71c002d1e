"""DecodeState: everything the loop carries from one forward pass to the next."""

from __future__ import annotations

from dataclasses import dataclass
import torch

from ..models.base import DecoderSession
from .draft import Draft


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
    draft: Draft
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

