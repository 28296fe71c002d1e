"""Tree layout for one forward pass: which node sees which, at what position (spec section 4).

A pass feeds: the root (the last committed token), then the Proactive Drafting levels (level d
holds widths[0] * ... * widths[d-1] nodes, every node of level d-1 having the same widths[d-1]
candidates as children), then a chain of drafts hanging off the main branch (the path of first
candidates). With no levels this is the plain SJD window: root + chain.

Node order: root = 0; level d occupies a contiguous block, and the child k of the node with
local index l at level d-1 has local index l * widths[d-1] + k. Local index 0 at every level is
the main branch.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Tuple

import torch


@dataclass(frozen=True)
class TreeLayout:
    widths: Tuple[int, ...]  # candidates per level
    chain_len: int  # drafts after the tree, on the main branch
    parents: torch.Tensor  # long [S]; -1 for the root
    depths: torch.Tensor  # long [S]; root 0
    level_offsets: Tuple[int, ...]  # first node of each level 0..len(widths) (level 0 = root)
    candidate_index: torch.Tensor  # long [S]: which candidate of its level a node is (0 elsewhere)
    main_path: torch.Tensor  # long [len(widths) + chain_len + 1]: main-branch node at each depth
    attend: torch.Tensor  # bool [S, S]: node i may attend to node j (j is i or an ancestor)
    main_nodes: Tuple[int, ...]  # main_path as plain ints, for host-side bookkeeping
    side_leaves: Tuple[int, ...] = ()  # leaf local indices that carry a side chain
    side_len: int = 0  # drafts on each side chain (<= chain_len)
    leaf_rows: Tuple[Tuple[int, int], ...] = ()  # per leaf: (first row, rows)
    row_nodes: Tuple[int, ...] = ()  # per leaf row: the node whose p verifies it
    row_offsets: Tuple[int, ...] = ()  # per leaf row: r, the chain draft it verifies

    @property
    def side_chain_nodes(self) -> int:
        return len(self.side_leaves) * self.side_len

    def side_nodes(self, leaf: int) -> Tuple[int, ...]:
        """The side-chain nodes hung off leaf `leaf` (local index), in chain order."""
        first, count = self.leaf_rows[leaf]
        return self.row_nodes[first + 1 : first + count]

    @property
    def num_nodes(self) -> int:
        return int(self.parents.shape[0])

    @property
    def levels(self) -> int:
        return len(self.widths)

    def level_nodes(self, level: int) -> range:
        """Global indices of the nodes at `level` (0 = the root)."""
        size = 1
        for width in self.widths[:level]:
            size *= width
        start = self.level_offsets[level]
        return range(start, start + size)

    def ancestors_path(self, node: int) -> list:
        """Nodes from the root's first child down to `node` (root excluded)."""
        path = []
        parents = self.parents.tolist()
        while node > 0:
            path.append(node)
            node = parents[node]
        return path[::-1]


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


@lru_cache(maxsize=256)
def build_tree_layout(widths: Tuple[int, ...], chain_len: int, side_leaves: Tuple[int, ...] = (),
                      side_len: int = 0) -> TreeLayout:
    """The layout for these level widths and chain length, built with tensor ops (once per shape).

    side_leaves, side_len: hang a chain of side_len drafts (the main chain's first ones) off each
    of these leaves (local indices at the last level; never the main branch's leaf 0).
    """
    widths = tuple(int(w) for w in widths)
    side_len = min(int(side_len), chain_len) if widths else 0
    side_leaves = tuple(int(l) for l in side_leaves) if side_len else ()
    parents, depths, cand = [torch.tensor([-1])], [torch.zeros(1, dtype=torch.long)], [torch.zeros(1, dtype=torch.long)]
    offsets = [0]
    size, start = 1, 0
    for d, k in enumerate(widths, start=1):  # one step per PD level (D - 1 of them)
        offsets.append(start + size)
        local = torch.arange(size * k)
        parents.append(start + torch.div(local, k, rounding_mode="floor"))
        depths.append(torch.full((size * k,), d, dtype=torch.long))
        cand.append(local % k)
        start, size = start + size, size * k
    main_tree = [0] + [offsets[d] for d in range(1, len(widths) + 1)]
    num_tree = start + size
    chain_nodes = torch.arange(num_tree, num_tree + chain_len)
    parents.append(torch.cat([torch.tensor([main_tree[-1]]), chain_nodes[:-1]]) if chain_len else chain_nodes)
    depths.append(torch.arange(1, chain_len + 1) + len(widths))
    cand.append(torch.zeros(chain_len, dtype=torch.long))
    leaf_base = offsets[-1]
    num_leaves = size if widths else 0
    assert all(0 < leaf < num_leaves for leaf in side_leaves), side_leaves
    side_start = num_tree + chain_len
    leaf_rows, row_nodes, row_offsets = [], [], []
    side_index = {leaf: i for i, leaf in enumerate(side_leaves)}
    for leaf in range(num_leaves):  # host bookkeeping, one entry per leaf row
        chain = []
        if leaf in side_index:
            first = side_start + side_index[leaf] * side_len
            chain = list(range(first, first + side_len))
        leaf_rows.append((len(row_nodes), 1 + len(chain)))
        row_nodes += [leaf_base + leaf] + chain
        row_offsets += list(range(1 + len(chain)))
    for leaf in side_leaves:  # each side chain: first draft's parent is its leaf
        first = side_start + side_index[leaf] * side_len
        parents.append(torch.cat([torch.tensor([leaf_base + leaf]), torch.arange(first, first + side_len - 1)]))
        depths.append(torch.arange(1, side_len + 1) + len(widths))
        cand.append(torch.zeros(side_len, dtype=torch.long))
    parents_t, depths_t, cand_t = torch.cat(parents), torch.cat(depths), torch.cat(cand)
    main_path = main_tree + list(range(num_tree, num_tree + chain_len))

    # attend[i, j]: j is i or one of its ancestors; walk every node up one level per step.
    n = int(parents_t.shape[0])
    attend = torch.zeros(n, n, dtype=torch.bool)
    rows = torch.arange(n)
    ancestor = rows.clone()
    for _ in range(len(widths) + chain_len + 1):  # tree depth + chain length steps, not nodes
        alive = ancestor >= 0
        attend[rows[alive], ancestor[alive]] = True
        ancestor = torch.where(alive, parents_t[ancestor.clamp(min=0)], ancestor)
    return TreeLayout(
        widths=widths,
        chain_len=chain_len,
        parents=parents_t,
        depths=depths_t,
        level_offsets=tuple(offsets),
        candidate_index=cand_t,
        main_path=torch.tensor(main_path, dtype=torch.long),
        attend=attend,
        main_nodes=tuple(main_path),
        side_leaves=side_leaves,
        side_len=side_len if side_leaves else 0,
        leaf_rows=tuple(leaf_rows),
        row_nodes=tuple(row_nodes),
        row_offsets=tuple(row_offsets),
    )


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
