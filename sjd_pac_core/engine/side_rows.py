"""Proposals for the nodes behind a side candidate, taken from the pass before.

Right behind a changed token, a side candidate c often wins at the window's first position
(another token than the draft). Its children would be the main chain's drafts for the next
position, drawn from a p whose context holds the draft there, not c: they win rarely, and the
pass stops one position later. The last pass, though, often fed a node holding c at that very
image position (one of its candidates there, or its main chain's draft), whose context differs
from this pass's only further back. That node's p is a proposal for c's children, and the p's
along its continuation (its accepted child, else its first) for the chain below them.

Every such q was computed by an earlier pass and is chosen by tokens fixed before this pass
(c and the last pass's nodes), so a row drawn from it and verified against it is exact under both
rules. Where the last pass held no node with c there, or its chain ends, a row falls back to its
position's q and draft (the window's). All of it runs on the device: no host sync.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..sampling.tree import Path, TreeLayout
from ..sampling.verify import first_true
from ..transfer import copy_to_device, to_device


def own_row_level(path: Path) -> int:
    """For a node behind a side candidate at the window's first position, on the chain of first
    children below it ((s,), (s, 0), (s, 0, 0), ... with s > 0): how far below the side candidate
    it is (0 for the candidate itself); -1 for any other node. These nodes own a proposal."""
    if not path or path[0] == 0 or any(path[1:]):
        return -1
    return len(path) - 1


def continuation_chain(layout: TreeLayout, accepted: Sequence[int], node: int, length: int) -> List[int]:
    """`node`, then the node the walk would go on to below it (the accepted child, else the
    first), up to `length` nodes or a leaf (host values only)."""
    chain = [node]
    while len(chain) < length and layout.children[chain[-1]]:
        kids, slot = layout.children[chain[-1]], accepted[chain[-1]]
        chain.append(kids[slot] if slot >= 0 else kids[0])
    return chain


@dataclass(frozen=True)
class PastNodes:
    """The last pass's nodes holding a token of one image position, and the chains below them
    (device tensors)."""

    tokens: torch.Tensor  # long [M]: each node's token
    chains: torch.Tensor  # long [M, H]: the node, then its continuation_chain; -1 past its end
    p: torch.Tensor  # float [S, V]: the last pass's p at every node (for the position after it)
    draft_token: torch.Tensor  # long [S]: the verdict's draw at every node (distributed as its p)

    @staticmethod
    def of(layout: TreeLayout, accepted: Sequence[int], node_tokens: torch.Tensor, p: torch.Tensor,
           draft_token: torch.Tensor, start: int, position: int, length: int) -> Optional["PastNodes"]:
        """The nodes of a pass that started at `start` (its root at start - 1) holding the token
        of image `position`, with chains of up to `length` nodes; None if it fed none."""
        depth = position - start + 1
        nodes = np.flatnonzero(layout.node_depths == depth).tolist()
        if depth < 1 or not nodes:
            return None
        chains = [continuation_chain(layout, accepted, u, length) for u in nodes]
        table = [chain + [-1] * (length - len(chain)) for chain in chains]
        device = node_tokens.device
        index = to_device(tuple(nodes), device)
        chains_table = copy_to_device(torch.tensor(table, dtype=torch.long), device)
        return PastNodes(node_tokens.index_select(0, index), chains_table, p, draft_token)


def side_proposals(past: Optional[PastNodes], side_tokens: torch.Tensor, rows: Sequence[Tuple[int, int]],
                   fallback_q: torch.Tensor, fallback_tokens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The q and first draft of every own row: (q [R, V], first long [R]).

    side_tokens: long [A], the side candidates' tokens; rows: (side candidate a, level i) per own
    row, the row drafting position i + 1 of the window behind candidate a; fallback_q / _tokens:
    the window's q and drafts from position 1 on (row (a, i) falls back to entry i). The row's q is
    the p of chain node i below the last pass's first node holding the same token, and its first
    draft the verdict's draw there.
    """
    device = fallback_q.device
    side = to_device(tuple(a for a, _ in rows), device)
    level = to_device(tuple(i for _, i in rows), device)
    q_fallback, first_fallback = fallback_q.index_select(0, level), fallback_tokens.index_select(0, level)
    if past is None:
        return q_fallback, first_fallback
    match = first_true(side_tokens.unsqueeze(1) == past.tokens.unsqueeze(0))  # [A]: a past node, -1 for none
    found = match.index_select(0, side)
    node = past.chains[found.clamp(min=0), level.clamp(max=past.chains.shape[1] - 1)]
    node = torch.where((found >= 0) & (level < past.chains.shape[1]), node, torch.full_like(node, -1))
    use = node >= 0
    safe = node.clamp(min=0)
    q = torch.where(use.unsqueeze(1), past.p.index_select(0, safe).to(fallback_q.dtype), q_fallback)
    first = torch.where(use, past.draft_token.index_select(0, safe), first_fallback)
    return q, first
