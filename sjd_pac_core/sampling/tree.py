"""Token trees for one forward pass: which node sees which, at what position (spec section 4).

A pass feeds a tree of nodes. Node 0 is the root (the last committed token). Every other node
holds a draft for the window position of its depth - 1 and is named by its path of *slots* from
the root: slot s at depth d is candidate s of that position's draw, one draw without
replacement from the position's proposal q, whose slot 0 is the window's own draft. The tree
is exact to verify under both rules if the children of every node are the first k slots of the
next position's draw (a prefix of a draw without replacement is itself one); `TreeShape` checks
that.

Familiar shapes are special cases: the plain SJD window is a chain (every node has slot 0 only);
the Proactive Drafting tree gives every node of its first D - 1 levels the same K candidates
(`level_tree_shape`), with the chain hung off the main branch (the path of slot 0s); side chains
hang the chain's first drafts also off some side leaves. A drafter may build any other shape
from its slot paths (`TreeShape.check` says whether it is one).

A node may also own a proposal: its children are then a draw from a q of its own (a candidate
row after the position rows) instead of its position's. The budget drafter gives one to the
nodes behind a side candidate, whose context the position's q never saw (engine/side_rows.py).
"""

from __future__ import annotations

import sys
from collections import abc
from dataclasses import dataclass
from functools import cached_property
from typing import Dict, Iterable, Optional, Sequence, Tuple

import numpy as np
import torch

from ..bounded_cache import MIB, bounded_by_bytes, field_tensor_bytes

Path = Tuple[int, ...]  # slots from the root's child down to the node; () is the root


@dataclass(frozen=True)
class TreeShape:
    """The nodes of a pass, as slot paths in node order (the root, (), is node 0 and implied).

    Node order is free but fixed by the shape (it sets the cache layout of the pass): parents
    come before their children. Hashable, so a layout is built once per shape.
    """

    paths: Tuple[Path, ...]
    own_rows: Tuple[Path, ...] = ()  # nodes whose children come from a proposal of their own, in row order

    def check(self) -> None:
        """Parents before children, no duplicates, every node's children are the slots 0..k-1
        of one draw (what makes recursive rejection over them exact), and a node that owns a
        proposal exists and has children."""
        seen: Dict[Path, int] = {(): 0}
        children: Dict[Path, list] = {}
        for path in self.paths:
            if not path or path in seen or path[:-1] not in seen or min(path) < 0:
                raise ValueError(f"tree shape: node {path} repeats, is the root, or comes before its parent")
            seen[path] = len(seen)
            children.setdefault(path[:-1], []).append(path[-1])
        for parent, slots in children.items():
            if sorted(slots) != list(range(len(slots))):
                raise ValueError(f"tree shape: the children of {parent} must be slots 0..k-1, got {sorted(slots)}")
        for owner in self.own_rows:
            if owner not in children or not owner or self.own_rows.count(owner) > 1:
                raise ValueError(f"tree shape: node {owner} owns a proposal but is the root, repeats or "
                                 "has no children")

    @property
    def num_nodes(self) -> int:
        return 1 + len(self.paths)

    @property
    def depth(self) -> int:
        """The deepest node's depth: the drafts the pass verifies along its longest path."""
        return max((len(p) for p in self.paths), default=0)


def shape_bytes(shape: TreeShape) -> int:
    """Bytes of a shape's node paths (a tuple per node, as long as its depth)."""
    return sys.getsizeof(shape.paths) + sum(map(sys.getsizeof, shape.paths)) + sys.getsizeof(shape.own_rows)


# A run near the image's end meets a new shape every pass: kept up to a number of bytes.
@bounded_by_bytes(32 * MIB, max_entries=512, weigh=shape_bytes)
def chain_shape(length: int) -> TreeShape:
    """The plain SJD window: root + `length` drafts, each the only child of the one before."""
    return TreeShape(tuple((0,) * d for d in range(1, length + 1)))


def _product(widths: Sequence[int]) -> Iterable[Path]:
    if not widths:
        yield ()
        return
    for head in _product(widths[:-1]):
        for s in range(widths[-1]):
            yield head + (s,)


@bounded_by_bytes(32 * MIB, max_entries=512, weigh=shape_bytes)
def level_tree_shape(widths: Tuple[int, ...], chain_len: int, side_leaves: Tuple[int, ...] = (),
                     side_len: int = 0, chain_width: int = 1) -> TreeShape:
    """Proactive Drafting's tree: level d (1-based) gives every node of level d - 1 the same
    widths[d-1] candidates; then a chain of `chain_len` drafts off the main branch's leaf; then
    a side chain of `side_len` drafts (the chain's first ones) off each leaf in `side_leaves`
    (local indices at the last level, never 0: the main leaf already carries the chain); then,
    with `chain_width` > 1, chain siblings: candidates 1 .. chain_width - 1 of every chain
    position as leaves beside the chain's draft (a rejected chain draft whose sibling holds the
    verified token still gains the token after it).

    Node order: the levels breadth first (child k of the node with local index l at level d - 1
    has local index l * widths[d-1] + k), the main chain, the side chains in leaf order, then
    the chain siblings by position.
    """
    widths = tuple(int(w) for w in widths)
    side_len = min(int(side_len), chain_len) if widths else 0
    side_leaves = tuple(int(leaf) for leaf in side_leaves) if side_len else ()
    paths = []
    for d in range(1, len(widths) + 1):
        paths += list(_product(widths[:d]))
    levels = len(widths)
    paths += [(0,) * (levels + r) for r in range(1, chain_len + 1)]
    leaves = list(_product(widths)) if widths else []
    for leaf in side_leaves:
        if not 0 < leaf < len(leaves):
            raise ValueError(f"side leaf {leaf} is not a side leaf of a tree with widths {widths}")
        paths += [leaves[leaf] + (0,) * r for r in range(1, side_len + 1)]
    for r in range(chain_len):  # the chain's draft at depth levels + r + 1 is slot 0 of its parent
        paths += [(0,) * (levels + r) + (slot,) for slot in range(1, int(chain_width))]
    return TreeShape(tuple(paths))


def one_deviation_leaves(widths: Tuple[int, ...]) -> Tuple[int, ...]:
    """Local indices of the leaves whose path leaves the main branch at exactly one level
    (candidate > 0 there, the main candidate 0 at every other level): the side leaves that win
    most often, since a changed context usually moves one token, not two."""
    leaves = []
    for d, width in enumerate(widths):
        stride = 1
        for w in widths[d + 1 :]:
            stride *= w
        leaves += [k * stride for k in range(1, width)]
    return tuple(sorted(leaves))


class NodeChildrenIndex(abc.Sequence):
    """Per node, its children's node indices by slot (a tuple each), read only where asked: a
    budget's pass walks a few dozen of its hundreds of nodes, so no tuple is built up front."""

    def __init__(self, parents: np.ndarray, slots: np.ndarray) -> None:
        n = parents.shape[0]
        order = np.lexsort((slots, parents))[1:]  # by parent, then slot; the root (parent -1) first
        self.order = order.tolist()
        self.bounds = np.searchsorted(parents[order], np.arange(n + 1)).tolist()

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, node: int) -> Tuple[int, ...]:
        if not -len(self) <= node < len(self):
            raise IndexError(f"node {node} of a tree of {len(self)} nodes")
        node %= len(self)
        return tuple(self.order[self.bounds[node] : self.bounds[node + 1]])

    # The walk of a pass reads a few dozen nodes' children: these two build no tuple and check
    # no bounds (node in range, slot below its count).
    def count(self, node: int) -> int:
        """How many children `node` has."""
        return self.bounds[node + 1] - self.bounds[node]

    def child(self, node: int, slot: int) -> int:
        """The node at `slot` among `node`'s children."""
        return self.order[self.bounds[node] + slot]


@dataclass(frozen=True, eq=False)
class TreeLayout:
    """A tree's nodes as tensors and host arrays (`layout_of_nodes`; `tree_layout` keeps those
    of fixed shapes). Compared and hashed by identity (it holds tensors): a PassShape is cached
    per layout."""

    parents: torch.Tensor  # long [S]; -1 for the root
    depths: torch.Tensor  # long [S]; root 0
    candidate_index: torch.Tensor  # long [S]: the node's slot in its position's draw (0 for the root)
    attend: torch.Tensor  # bool [S, S]: node i may attend to node j (j is i or an ancestor)
    children: NodeChildrenIndex  # per node, its children's node indices by slot
    main_nodes: Tuple[int, ...]  # the main branch (slot 0 at every depth), root first
    # parents, depths and slots on the host: read-only int64 arrays [S] (on the CPU, the tensors'
    # own memory), which the pass's layout is built from without a round trip through Python ints
    node_depths: np.ndarray
    node_slots: np.ndarray
    node_parents: np.ndarray
    given_shape: Optional[TreeShape] = None  # the shape it was laid out from, if any

    @cached_property
    def shape(self) -> TreeShape:
        """The tree as slot paths: the shape it was laid out from, else built from its nodes."""
        if self.given_shape is not None:
            return self.given_shape
        paths: list = [()]
        for parent, slot in zip(self.node_parents[1:].tolist(), self.node_slots[1:].tolist()):
            paths.append(paths[parent] + (slot,))
        return TreeShape(tuple(paths[1:]))

    @property
    def own_rows(self) -> Tuple[Path, ...]:
        """The nodes whose children come from a proposal of their own (a layout of nodes has none)."""
        return self.given_shape.own_rows if self.given_shape is not None else ()

    @property
    def num_nodes(self) -> int:
        return int(self.parents.shape[0])

    @property
    def max_children(self) -> int:
        return max((len(c) for c in self.children), default=0)

    def ancestors_path(self, node: int) -> list:
        """Nodes from the root's first child down to `node` (root excluded)."""
        path = []
        parents = self.node_parents.tolist()
        while node > 0:
            path.append(node)
            node = parents[node]
        return path[::-1]


def layout_bytes(layout: TreeLayout) -> int:
    """Bytes a cached layout keeps alive: its tensors and its shape."""
    return field_tensor_bytes(layout) + shape_bytes(layout.shape)


def ancestor_mask(parents: np.ndarray) -> np.ndarray:
    """bool [S, S]: [i, j] when node j is i or one of its ancestors (parents[0] = -1, the root).
    Pointer doubling: after round k a row holds the ancestors less than 2**k up, so a tree of
    depth D takes log2(D) rounds of whole-array steps, not one step per depth or per node. The
    root is its own parent, so no round needs to tell the nodes that reached it apart."""
    attend = np.eye(parents.shape[0], dtype=bool)
    jump = np.maximum(parents, 0)
    while True:
        attend |= attend[jump]
        if not jump.any():
            return attend
        jump = jump[jump]


def layout_of_nodes(parents: np.ndarray, slots: np.ndarray, shape: Optional[TreeShape] = None) -> TreeLayout:
    """The layout of a tree given as arrays over its nodes, root first (parents[0] = -1, every
    parent before its children; slots[u]: node u's candidate slot), in whole-array steps: a
    budget's tree is new nearly every pass. `shape`: its slot paths, if known."""
    parents = np.array(parents, dtype=np.int64)  # its own copies: the layout keeps them read-only
    slots = np.array(slots, dtype=np.int64)
    attend = ancestor_mask(parents)
    depths = attend.sum(1, dtype=np.int64) - 1
    # the main branch: the nodes with no slot other than 0 on their way from the root
    on_main = np.flatnonzero(~(attend & (slots > 0)).any(1))
    main = on_main[np.argsort(depths[on_main], kind="stable")]
    layout = TreeLayout(
        parents=torch.from_numpy(parents), depths=torch.from_numpy(depths), candidate_index=torch.from_numpy(slots),
        attend=torch.from_numpy(attend), children=NodeChildrenIndex(parents, slots), main_nodes=tuple(main.tolist()),
        node_depths=depths, node_slots=slots, node_parents=parents, given_shape=shape,
    )
    for array in (parents, depths, slots):
        array.flags.writeable = False
    return layout


def build_layout(shape: TreeShape) -> TreeLayout:
    """The layout of a shape, built afresh (`tree_layout` keeps the ones a run meets again)."""
    index: Dict[Path, int] = {(): 0}
    for path in shape.paths:
        index[path] = len(index)
    n = len(index)
    parents = np.concatenate([np.full(1, -1, dtype=np.int64),
                              np.fromiter((index[p[:-1]] for p in shape.paths), dtype=np.int64, count=n - 1)])
    slots = np.concatenate([np.zeros(1, dtype=np.int64),
                            np.fromiter((p[-1] for p in shape.paths), dtype=np.int64, count=n - 1)])
    return layout_of_nodes(parents, slots, shape)


@bounded_by_bytes(64 * MIB, max_entries=512, weigh=layout_bytes)
def tree_layout(shape: TreeShape) -> TreeLayout:
    """The layout of a shape (cached: a run uses a handful of shapes, and kept up to 64 MiB)."""
    return build_layout(shape)


def build_tree_layout(widths: Tuple[int, ...], chain_len: int, side_leaves: Tuple[int, ...] = (),
                      side_len: int = 0, chain_width: int = 1) -> TreeLayout:
    """The layout of `level_tree_shape(widths, chain_len, side_leaves, side_len, chain_width)`."""
    return tree_layout(level_tree_shape(widths, chain_len, side_leaves, side_len, chain_width))


def tree_attention_mask(
    attend: torch.Tensor, key_valid: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Additive 4D mask [B, 1, S, past + S] for a tree pass over a KV cache.

    attend: bool [S, S] among the new nodes; key_valid: bool [B, past] (False for left padding).
    Additive float (0 / dtype min) works with eager and sdpa attention alike; a bool mask is
    silently wrong with eager attention.
    """
    b, s = key_valid.shape[0], attend.shape[0]
    past = key_valid.unsqueeze(1).expand(b, s, -1)
    new = attend.to(key_valid.device).unsqueeze(0).expand(b, -1, -1)
    allowed = torch.cat([past, new], dim=-1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=key_valid.device)
    mask = mask.masked_fill(~allowed, torch.finfo(dtype).min)
    return mask.unsqueeze(1)


def tree_position_ids(depths: torch.Tensor, root_positions: torch.Tensor) -> torch.Tensor:
    """Position ids [B, S]: each row's root position plus the node's depth."""
    return root_positions.unsqueeze(-1) + depths.to(root_positions.device).unsqueeze(0)
