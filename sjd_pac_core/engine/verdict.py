"""One pass's verification result (on the device), its host decisions, and the pure walk.

verify -> Verdict (device tensors) -> Verdict.decisions() (the pass's one host sync) -> walk()
(plain Python over those values) -> PassOutcome, whose final token is a reference into the
Verdict, so committing it needs no further sync.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Literal, Optional, Tuple

import torch

from ..sampling.tree import TreeLayout
from .sync import fetch

TokenSource = Literal["chain", "bonus", "fallback", "leaf", "draft"]


@dataclass(frozen=True)
class Decisions:
    """The host copies of a pass's decisions: what the walk needs, nothing else."""

    chain_accepted: List[int]  # [m] 1 where draft j is accepted against the main-branch p
    first_child: List[int]  # [P] per tree parent node (nodes 0..P-1): first accepted candidate, -1 none
    leaf_accepted: List[int]  # [leaves] the chain's first draft accepted against the leaf's p


@dataclass(frozen=True)
class Verdict:
    """Everything verification decided in one pass, on the device (indexed like the layout)."""

    chain_accepted: torch.Tensor  # bool [m]
    chain_token: torch.Tensor  # long [m]: what is committed where draft j is the first rejected
    bonus: torch.Tensor  # long [0 or 1]: the token after a fully accepted main branch
    first_child: torch.Tensor  # long [P]
    fallback: torch.Tensor  # long [P]: the draw when every candidate of the parent is rejected
    leaf_accepted: torch.Tensor  # bool [leaves]
    leaf_token: torch.Tensor  # long [leaves]: residual or bonus draw from the leaf's own p
    p_main: torch.Tensor  # float [m + 1, V]: p along the main branch (the drafter's stale p)
    positions_main: torch.Tensor  # long [m + 1]: the image positions of p_main's rows

    def decisions(self) -> Decisions:
        host = fetch(dict(chain_accepted=self.chain_accepted, first_child=self.first_child,
                          leaf_accepted=self.leaf_accepted))
        return Decisions(**host)

    def token(self, source: TokenSource, index: int, drafts: torch.Tensor) -> torch.Tensor:
        """The committed token a walk refers to, as a 1-element device tensor (no sync)."""
        table = dict(chain=self.chain_token, bonus=self.bonus, fallback=self.fallback,
                     leaf=self.leaf_token, draft=drafts)
        return table[source][index : index + 1]


@dataclass(frozen=True)
class TokenRef:
    source: TokenSource
    index: int


@dataclass(frozen=True)
class PassOutcome:
    """Where verification of one pass ended."""

    path_nodes: Tuple[int, ...]  # accepted nodes after the root, in order (their cache is valid)
    accepted: int  # drafts accepted (= len(path_nodes))
    final: Optional[TokenRef]  # the token committed after them, None at the end of the image
    rejected: bool  # the final token replaced a rejected draft (PD builds its tree there)
    branch: Tuple[int, ...]  # candidate index chosen at each accepted tree level


def walk(layout: TreeLayout, decisions: Decisions, window: int, has_bonus: bool, has_leaf: bool) -> PassOutcome:
    """Follow the accepted path through the tree, then along the chain (pure, host values only).

    window: m, the drafts on the main branch; has_bonus: a bonus token was drawn after the main
    branch; has_leaf: the leaves were verified (a chain draft checked or a token drawn from their
    p; not when the tree reaches the end of the image).
    """
    path: List[int] = []
    branch: List[int] = []
    node = 0
    for d in range(layout.levels):  # at most D - 1 levels
        k = decisions.first_child[node]
        if k < 0:  # every candidate rejected: commit the draw from the final residual
            return PassOutcome(tuple(path), d, TokenRef("fallback", node), True, tuple(branch))
        local = (node - layout.level_offsets[d]) * layout.widths[d] + k
        node = layout.level_offsets[d + 1] + local
        path.append(node)
        branch.append(k)

    d = layout.levels
    if any(branch):  # left the main branch: only the leaf's own p is exact
        leaf = node - layout.level_offsets[d]
        if not has_leaf:
            return PassOutcome(tuple(path), d, None, False, tuple(branch))
        if d < window and decisions.leaf_accepted[leaf]:
            return PassOutcome(tuple(path), d, TokenRef("draft", d), False, tuple(branch))
        return PassOutcome(tuple(path), d, TokenRef("leaf", leaf), d < window, tuple(branch))

    # Main branch: continue along the chain until its first rejection.
    chain = decisions.chain_accepted[d:]
    run = chain.index(0) if 0 in chain else len(chain)
    path.extend(layout.main_nodes[d + 1 : d + 1 + run])
    j = d + run
    if j < window:
        return PassOutcome(tuple(path), j, TokenRef("chain", j), True, tuple(branch))
    return PassOutcome(tuple(path), j, TokenRef("bonus", 0) if has_bonus else None, False, tuple(branch))

