"""A draft: what the next pass verifies (the window's drafts with their q's, and a tree).

Plain data, made by a Drafter (drafters.py) and carried by the loop's DecodeState (state.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Optional, Tuple

import torch

from ..sampling.tree import TreeLayout, TreeShape, chain_shape, tree_layout


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


@dataclass(frozen=True)
class TreeDraft:
    """Candidates for the first `levels` window positions, and the tree the pass feeds.

    candidates: long [levels + R, K]; row d < levels is the draw for window position d (column 0
    is the window's own draft), row levels + r the draw from own_q[r] for the children of
    layout.own_rows[r]. valid: bool, as candidates; False marks padding slots (q had fewer than K
    tokens), which are never accepted. layout: the nodes of the pass (any slots of these rows,
    the window's drafts beyond them on slot 0).
    """

    candidates: torch.Tensor
    valid: torch.Tensor
    layout: TreeLayout
    widths: Tuple[int, ...] = ()  # a level tree's candidates per level (empty for another shape)
    own_q: Optional[torch.Tensor] = None  # float [R, V]: the proposals of shape.own_rows
    # float [B, V]: the laws the slots after the first of position rows 0 .. B - 1 were drawn
    # from (the rule's candidates_beside); None: every row is one draw from its window q
    beside_q: Optional[torch.Tensor] = None

    @property
    def shape(self) -> TreeShape:
        return self.layout.shape

    @property
    def levels(self) -> int:
        """The position rows (the window positions with candidates)."""
        return int(self.candidates.shape[0]) - len(self.layout.own_rows)

    @property
    def width(self) -> int:
        return int(self.candidates.shape[1])


@dataclass(frozen=True)
class Draft:
    """What the next pass verifies: the window on the main branch and an optional tree."""

    window: DraftWindow
    tree: Optional[TreeDraft] = None
    kept_by_ac: int = 0  # drafts carried over unchanged from the last pass (a statistic)
    nodes: Optional[int] = None  # pad the pass to this many nodes (a budget drafter's); None: the loop's envelope

    @cached_property
    def layout(self) -> TreeLayout:
        """The pass's nodes: the tree's, or the window's chain (laid out once per length; read by
        the pass's plan and again by the next draft, so kept)."""
        return self.tree.layout if self.tree is not None else tree_layout(chain_shape(len(self.window)))

    @property
    def proposals(self) -> torch.Tensor:
        """float [M + R, V]: every q the pass's children were drawn from (the window's, then the
        tree's own rows), as NodeChildren.q_rows index them."""
        tree = self.tree
        if tree is None or tree.own_q is None:
            return self.window.q
        return torch.cat([self.window.q, tree.own_q.to(self.window.q.dtype)])

    @property
    def beside_proposals(self) -> Optional[torch.Tensor]:
        """float [M + R, V] aligned with `proposals`: the law each row's slots after the first were
        drawn from (the row's own q where they came from it), or None where all came from q."""
        tree = self.tree
        if tree is None or tree.beside_q is None:
            return None
        rows = tree.beside_q.shape[0]
        return torch.cat([tree.beside_q.to(self.window.q.dtype), self.proposals[rows:]])
