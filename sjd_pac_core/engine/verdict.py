"""One pass's verification result (on the device), its host decisions, and the pure walks.

verify -> Verdict (device tensors, one entry per tree node) -> Verdict.decisions() (the pass's
one host sync) -> walk() and continuation() (plain Python over those values, on the pass's
TreeLayout) -> PassOutcome, whose final token is a node index into the Verdict, so committing
it needs no further sync.

Per node u, the verdict holds two things: which of u's children (in slot order) verification
accepted, if any, and `next_token[u]`, the token committed right after u if the walk ends there
(a residual draw after a rejection, a draw from p at a leaf; the Gumbel target). The walk
follows accepted children from the root; wherever it stops, next_token is exact, because u's
context is the committed prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

from ..sampling.tree import TreeLayout
from ..transfer import to_device
from .sync import fetch


@dataclass(frozen=True)
class Decisions:
    """The host copy of a pass's decisions: what the walks need, nothing else."""

    accepted_child: List[int]  # [S] per node: the accepted child's slot, -1 for none
    non_finite_at: int = -1  # the first image position whose p is NaN or inf, -1 for none


@dataclass(frozen=True)
class Verdict:
    """Everything verification decided in one pass, on the device (indexed by node)."""

    accepted_child: torch.Tensor  # long [S]: slot of the accepted child, -1 for none
    next_token: torch.Tensor  # long [S]: committed after the node if the walk ends there
    draft_token: torch.Tensor  # long [S]: the accepted child's token, else next_token: a draw from p
    p: torch.Tensor  # float [S, V]: each node's p (for the position after it)
    positions: torch.Tensor  # long [S]: the image position each node's p is for
    non_finite_at: torch.Tensor  # long [1]: the first position whose p is not finite, -1 for none

    def decisions(self) -> Decisions:
        values = fetch(dict(accepted_child=self.accepted_child, non_finite_at=self.non_finite_at))
        return Decisions(accepted_child=values["accepted_child"], non_finite_at=values["non_finite_at"][0])


@dataclass(frozen=True)
class PassOutcome:
    """Where verification of one pass ended."""

    path_nodes: Tuple[int, ...]  # accepted nodes after the root, in order (their cache is valid)
    accepted: int  # drafts accepted (= len(path_nodes))
    final: Optional[int]  # the node whose next_token is committed after them; None at the image's end
    rejected: bool  # the walk stopped at a node with children, all rejected (PD builds its tree there)
    branch: Tuple[int, ...]  # the slot taken at each accepted depth (0 = the main branch)


def walk(layout: TreeLayout, decisions: Decisions, last_depth: int) -> PassOutcome:
    """Follow accepted children from the root (pure, host values only).

    last_depth: the depth of a node holding the image's last token (no token follows it).
    """
    children, accepted = layout.children, decisions.accepted_child
    path: List[int] = []
    branch: List[int] = []
    node = 0
    while accepted[node] >= 0:  # at most the tree's depth steps
        branch.append(accepted[node])
        node = children.child(node, accepted[node])
        path.append(node)
    final = node if len(path) < last_depth else None
    return PassOutcome(tuple(path), len(path), final, children.count(node) > 0, tuple(branch))


@dataclass(frozen=True)
class Continuation:
    """Where the next pass's drafts come from: `nodes` (one per window draft carried over,
    from the position after the final token on) and `proposal`, the node whose logits draft
    the positions new to the window (its p is for the first of them)."""

    nodes: Tuple[int, ...]
    proposal: int


def continuation(layout: TreeLayout, decisions: Decisions, outcome: PassOutcome, last_depth: int) -> Continuation:
    """The nodes whose p drafts the next pass's window: one per draft this pass carried after
    the final token (a node at depth d has p for the token at depth d + 1), up to the image's
    end (last_depth as in `walk`).

    From the node after the path's end on: the accepted child of the node before (its token is
    the draft there, so its p has the closest context), else its first child, else the main
    branch's node of that depth (a path that took a side leaf goes on where the main branch
    computed the positions after it). Every node's p is one this pass computed, so a draft taken
    from it has a known q whichever node is used.
    """
    children, accepted, main = layout.children, decisions.accepted_child, layout.main_nodes
    end = outcome.path_nodes[-1] if outcome.path_nodes else 0
    depth = outcome.accepted + 1  # the depth of the first node to use
    limit = min(last_depth, len(main) - 1)  # the drafts the window held; the image's end

    def after(node: int, depth: int) -> Optional[int]:
        if children.count(node):
            return children.child(node, max(accepted[node], 0))
        return main[depth] if depth < len(main) else None

    nodes: List[int] = []
    node = after(end, depth)  # the walk stopped at `end`: its first child is the rejected draft's node
    while node is not None and depth < limit:  # one step per carried draft
        nodes.append(node)
        depth += 1
        node = after(node, depth)
    proposal = node if node is not None else (nodes[-1] if nodes else end)
    return Continuation(tuple(nodes), proposal)


@dataclass(frozen=True)
class StaleRows:
    """This pass's verdict on each next-window position and the p it was drawn from (the nodes
    of `continuation`): what the next draft is continued from (AC) and drafted from (SJD)."""

    nodes: Tuple[int, ...]
    token: torch.Tensor  # long [c]: the verdict's draw at each node (an old draft kept, or a redraw)
    p: torch.Tensor  # float [c, V]
    positions: torch.Tensor  # long [c]
    kept: int  # how many of them kept the old draft (slot 0 accepted): a statistic

    @staticmethod
    def gather(verdict: Verdict, decisions: Decisions, nodes: Tuple[int, ...], device) -> "StaleRows":
        index = to_device(nodes, device)
        kept = sum(decisions.accepted_child[u] == 0 for u in nodes)
        return StaleRows(nodes, verdict.draft_token.index_select(0, index), verdict.p.index_select(0, index),
                         verdict.positions.index_select(0, index), kept)
