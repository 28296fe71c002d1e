"""DecodeState: everything the loop carries from one forward pass to the next."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import torch

from ..models.base import DecoderSession


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


@dataclass
class DecodeState:
    """The loop's state between passes.

    committed[:num_committed] are final. The last committed token is not in the cache yet: it is
    the root (first input) of the next pass. tree[d] holds the Proactive Drafting candidates for
    window position d (tree[d][0] == window.tokens[d], the main branch); empty when no tree.
    proposal_logits are the raw logits of the furthest position the last pass computed, the
    source of drafts for positions new to the window.
    """

    session: DecoderSession
    committed: torch.Tensor  # long [N]
    num_committed: int
    window: DraftWindow
    proposal_logits: torch.Tensor  # [B, V]
    tree: List[torch.Tensor] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return int(self.committed.shape[0])

    @property
    def done(self) -> bool:
        return self.num_committed >= self.num_tokens

    @property
    def root_token(self) -> torch.Tensor:
        return self.committed[self.num_committed - 1]


@dataclass(frozen=True)
class PassOutcome:
    """Where verification of one pass ended."""

    path_nodes: List[int]  # accepted nodes after the root, in order (their cache is valid)
    accepted: int  # drafts accepted (= len(path_nodes))
    final: Optional[torch.Tensor]  # the token committed after them (residual, bonus or draft)
    rejected: bool  # the final token replaced a rejected draft (PD builds its tree there)
    branch: tuple  # candidate index chosen at each accepted tree level
