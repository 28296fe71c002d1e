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
    leaf_accepted: List[int]  # [R] per leaf row: its chain draft accepted (layout.leaf_rows)


@dataclass(frozen=True)
class Verdict:
    """Everything verification decided in one pass, on the device (indexed like the layout)."""

    chain_accepted: torch.Tensor  # bool [m]
    chain_token: torch.Tensor  # long [m]: what is committed where draft j is the first rejected
    bonus: torch.Tensor  # long [0 or 1]: the token after a fully accepted main branch
    first_child: torch.Tensor  # long [P]
    fallback: torch.Tensor  # long [P]: the draw when every candidate of the parent is rejected
    leaf_accepted: torch.Tensor  # bool [R]: per leaf row (a leaf, then its side chain's nodes)
    leaf_token: torch.Tensor  # long [R]: the row's residual draw, or past the window a draw from its p
    p_main: torch.Tensor  # float [m + 1, V]: p along the main branch (the drafter's stale p)
    positions_main: torch.Tensor  # long [m + 1]: the image positions of p_main's rows
    p_rows: Optional[torch.Tensor] = None  # float [R, V]: p of each leaf row (None: no tree)

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


@dataclass(frozen=True)
class StaleRows:
    """This pass's verdict on each window draft and the p it was checked against, along the
    path the pass took: the main chain's rows, except where a side leaf with a side chain won
    (there that leaf's rows, whose context is the committed one). What the next draft is
    continued from (AC) and drafted from (SJD); every row is a distribution this pass computed,
    so a draft taken from it has a known q whichever row is used."""

    accepted: torch.Tensor  # bool [m]
    token: torch.Tensor  # long [m]: the residual draw (rejection) or target (gumbel) of each row
    p: torch.Tensor  # float [m, V]
    accepted_host: List[int]  # accepted, on the host


def stale_rows(layout: TreeLayout, verdict: Verdict, decisions: Decisions, outcome: PassOutcome,
               window: int) -> StaleRows:
    """The rows of StaleRows (pure slicing; no host sync)."""
    accepted, token, p = verdict.chain_accepted, verdict.chain_token, verdict.p_main[:window]
    host = list(decisions.chain_accepted)
    d = layout.levels
    if d == 0 or len(outcome.branch) < d or not any(outcome.branch) or verdict.p_rows is None:
        return StaleRows(accepted, token, p, host)
    first, count = layout.leaf_rows[outcome.path_nodes[d - 1] - layout.level_offsets[d]]
    span = min(count, window - d)
    if span <= 0:
        return StaleRows(accepted, token, p, host)
    rows, cut = slice(first, first + span), slice(d + span, window)

    def splice(main, side):
        return torch.cat([main[:d], side[rows], main[cut]])

    host = host[:d] + list(decisions.leaf_accepted[rows]) + host[cut]
    return StaleRows(splice(accepted, verdict.leaf_accepted), splice(token, verdict.leaf_token),
                     splice(p, verdict.p_rows), host)


def walk(layout: TreeLayout, decisions: Decisions, window: int, has_bonus: bool) -> PassOutcome:
    """Follow the accepted path through the tree, then along the chain (pure, host values only).

    window: m, the drafts on the main branch; has_bonus: the image goes on past the window (a
    bonus token was drawn after the main branch, and after each leaf row past the window).
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
    if any(branch):  # left the main branch: only the leaf's own p and its side chain's are exact
        leaf = node - layout.level_offsets[d]
        first, count = layout.leaf_rows[leaf]
        side = layout.side_nodes(leaf)
        checks = min(count, window - d)  # rows that verify a draft; the rest are past the window
        flags = decisions.leaf_accepted[first : first + checks]
        run = flags.index(0) if 0 in flags else checks
        path.extend(side[:run])
        if run < checks:  # draft d + run rejected: its residual draw
            return PassOutcome(tuple(path), d + run, TokenRef("leaf", first + run), True, tuple(branch))
        if checks == count:  # every row accepted; the last accepted draft has no node: commit it
            return PassOutcome(tuple(path), d + run - 1, TokenRef("draft", d + run - 1), False, tuple(branch))
        # the side chain reached the window's end: a draw from the last row's p, if any is left
        final = TokenRef("leaf", first + run) if has_bonus else None
        return PassOutcome(tuple(path), d + run, final, False, tuple(branch))

    # Main branch: continue along the chain until its first rejection.
    chain = decisions.chain_accepted[d:]
    run = chain.index(0) if 0 in chain else len(chain)
    path.extend(layout.main_nodes[d + 1 : d + 1 + run])
    j = d + run
    if j < window:
        return PassOutcome(tuple(path), j, TokenRef("chain", j), True, tuple(branch))
    return PassOutcome(tuple(path), j, TokenRef("bonus", 0) if has_bonus else None, False, tuple(branch))
