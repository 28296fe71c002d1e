"""Drafting strategies: what the next pass verifies.

The loop asks a Drafter for a Draft twice: `first` after the prompt's prefill, and `next` after
every pass, with a PassReport of what that pass verified and decided. It never looks inside a
drafter, so a new strategy (a tree at every pass, adaptive depth or width, other proposals) is a
new subclass and no edit of the loop.

The exactness contract every drafter keeps (spec sections 2-4):
* window.tokens[j] is drawn from window.q[j], and q[j] depends only on what was known before the
  pass that verifies it (stale p's, earlier drafts), never on that pass's own p;
* tree.candidates[d] is one draw without replacement from window.q[d], in draw order, with
  candidates[d, 0] == window.tokens[d] (the main branch); draw it with `ctx.rule.candidates`,
  which also says which slots are real (a fixed-width row may hold fewer real candidates);
* the tree covers window positions 0..levels-1, with levels <= len(window).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Optional, Sequence, Tuple

import torch

from ..config import SamplerConfig, tree_side_nodes
from ..sampling.drafting import adaptive_continuation, initial_proposals
from ..sampling.recipe import SamplingRecipe
from ..sampling.tree import one_deviation_leaves
from .state import DraftWindow
from .verdict import Decisions, PassOutcome, StaleRows, Verdict


@dataclass(frozen=True)
class TreeDraft:
    """Proactive Drafting candidates for the first `levels` window positions.

    candidates: long [levels, K]; row d is the draw for window position d (column 0 is the
    window's own draft). valid: bool [levels, K]; False marks padding slots (q had fewer than K
    tokens), which are never accepted. Every level has width K, so the pass's shape is fixed.
    level_widths: per-level widths when they differ (a level of width w < K uses the first w
    slots of its row, the rest marked invalid); None means K at every level.
    side_leaves, side_len: a side chain (the window's drafts levels .. levels + side_len - 1, fed
    again) hung off each of these leaves (local indices of the last level, never 0, the main
    branch's), so that a pass won by that side leaf runs on into the chain.
    """

    candidates: torch.Tensor
    valid: torch.Tensor
    level_widths: Optional[Tuple[int, ...]] = None
    side_leaves: Tuple[int, ...] = ()
    side_len: int = 0

    @property
    def levels(self) -> int:
        return int(self.candidates.shape[0])

    @property
    def widths(self) -> Tuple[int, ...]:
        if self.level_widths is not None:
            return self.level_widths
        return (int(self.candidates.shape[1]),) * self.levels


@dataclass(frozen=True)
class Draft:
    """What the next pass verifies: the window on the main branch and an optional tree."""

    window: DraftWindow
    tree: Optional[TreeDraft] = None
    kept_by_ac: int = 0  # drafts carried over unchanged from the last pass (a statistic)


@dataclass(frozen=True)
class DraftContext:
    """The run's constants a drafter may use."""

    rule: object  # sampling.rules.RejectionRule or GumbelRule: draw(), candidates()
    recipe: SamplingRecipe
    constraints: object  # anything with mask(positions) -> bool [S, V]
    num_tokens: int
    init_proposal: str  # "nearest" or "uniform"
    positions: torch.Tensor  # long arange on the device (slice it with host ints; no sync)


@dataclass(frozen=True)
class PassReport:
    """What one pass verified and decided, for drafting the next one."""

    start: int  # committed tokens before the pass (the window's first position)
    num_committed: int  # committed tokens after it (the next window's first position)
    target: int  # window size the window policy wants for the next pass
    draft: Draft  # what this pass verified
    outcome: PassOutcome  # host: accepted path, final token, rejected or not
    decisions: Decisions  # host copies of the pass's decisions
    verdict: Verdict  # device: chain flags and tokens, p along the main branch
    proposal_logits: torch.Tensor  # [B, V] raw logits of the furthest main-branch node
    stale: StaleRows  # the verdict and p of each window draft along the path the pass took


class Drafter(ABC):
    """A drafting strategy. Subclass it; the loop calls only these three members."""

    @property
    def max_side_nodes(self) -> int:
        """The most tree nodes beyond the main branch one pass may carry (sizes the envelope)."""
        return 0

    @abstractmethod
    def first(self, ctx: DraftContext, logits: torch.Tensor, start: int, target: int) -> Draft:
        """The draft for the first pass; logits [B, V] are the prefill's."""

    @abstractmethod
    def next(self, ctx: DraftContext, report: PassReport) -> Draft:
        """The draft for the pass after `report`'s (called only while tokens remain)."""

    # --- building blocks for subclasses ----------------------------------------------------
    @staticmethod
    def fresh(ctx: DraftContext, logits: torch.Tensor, start: int, count: int) -> DraftWindow:
        """Drafts for `count` positions new to the window, from raw logits [B, V]."""
        positions = ctx.positions[start : start + count]
        q = initial_proposals(logits, positions, ctx.recipe, ctx.constraints, ctx.init_proposal)
        return DraftWindow(ctx.rule.draw(q, positions), q)

    @classmethod
    def fill(cls, ctx: DraftContext, window: DraftWindow, logits: torch.Tensor, start: int,
             target: int) -> DraftWindow:
        """Extend `window` (positions from `start`) to `target` drafts with fresh ones."""
        missing = min(target, ctx.num_tokens - start) - len(window)
        if missing <= 0:
            return window
        extra = cls.fresh(ctx, logits, start + len(window), missing)
        return window.extend(extra.tokens, extra.q)

    @staticmethod
    def tree(ctx: DraftContext, window: DraftWindow, start: int, depth: int, width: int) -> Optional[TreeDraft]:
        """K candidates at each of the first D - 1 window positions (one rule call per level)."""
        levels = min(depth - 1, len(window))
        if levels <= 0:
            return None
        rows = [ctx.rule.candidates(window.q[d], window.tokens[d : d + 1], width, start + d)
                for d in range(levels)]  # D - 1 levels, a handful
        return TreeDraft(torch.stack([c for c, _ in rows]), torch.stack([v for _, v in rows]))

    @classmethod
    def shaped_tree(cls, ctx: DraftContext, window: DraftWindow, start: int,
                    widths: Sequence[int]) -> Optional[TreeDraft]:
        """widths[d] candidates at window position d: one draw of max(widths) without replacement
        per level, of which level d keeps the first widths[d] (a prefix of a draw without
        replacement is itself one, so the contract holds)."""
        levels = min(len(widths), len(window))
        vocab = int(window.q.shape[-1])  # a level never draws more tokens than there are
        widths = tuple(min(w, vocab) for w in widths[:levels])
        if levels <= 0:
            return None
        if len(set(widths)) == 1:
            return cls.tree(ctx, window, start, levels + 1, widths[0])
        tree = cls.tree(ctx, window, start, levels + 1, max(widths))
        within = torch.arange(max(widths), device=tree.valid.device) < torch.tensor(
            widths, device=tree.valid.device).unsqueeze(-1)
        return TreeDraft(tree.candidates, tree.valid & within, widths)


class SJDDrafter(Drafter):
    """Speculative Jacobi Decoding: after a pass, every draft beyond the committed token is drawn
    afresh from this pass's stale p; positions new to the window are drafted from the furthest
    stale logits. No tree. (Plain AR is this drafter with an empty window.)"""

    def first(self, ctx: DraftContext, logits: torch.Tensor, start: int, target: int) -> Draft:
        return Draft(self.fill(ctx, DraftWindow.empty_like(ctx, logits), logits, start, target))

    def continue_window(self, ctx: DraftContext, report: PassReport, rest: slice) -> Tuple[DraftWindow, int]:
        """Drafts for the verified positions after the committed ones, and how many were kept."""
        stale = report.stale
        tokens = ctx.rule.draw(stale.p[rest], report.verdict.positions_main[rest])
        return DraftWindow(tokens, stale.p[rest]), 0

    def next_tree(self, ctx: DraftContext, report: PassReport, window: DraftWindow) -> Optional[TreeDraft]:
        return None

    def next(self, ctx: DraftContext, report: PassReport) -> Draft:
        old = report.draft.window
        rest = slice(report.outcome.accepted + 1, len(old))
        if rest.start < rest.stop:
            window, kept = self.continue_window(ctx, report, rest)
        else:
            window, kept = old.tail(len(old)), 0
        window = self.fill(ctx, window, report.proposal_logits, report.num_committed, report.target)
        return Draft(window, self.next_tree(ctx, report, window), kept)


class PACDrafter(SJDDrafter):
    """SJD-PAC: Adaptive Continuation keeps every old draft the stale p accepts (else its residual
    redraw), and Proactive Drafting puts a tree of K candidates on the D - 1 positions after a
    rejection. Either can be switched off (the paper's ablation). `widths` overrides the
    per-level candidate counts (e.g. a wider first level). `side_chain` > 0 hangs that many of
    the chain's drafts also off every leaf that leaves the main branch at exactly one level
    (tree.one_deviation_leaves), so a side-branch win no longer ends the pass."""

    def __init__(self, continuation: bool, proactive: bool, depth: int, width: int,
                 widths: Optional[Sequence[int]] = None, side_chain: int = 0) -> None:
        self.continuation = continuation
        self.proactive = proactive and depth > 1
        self.depth, self.width = depth, width
        self.widths = tuple(widths) if widths is not None else (width,) * max(depth - 1, 0)
        self.side_chain = side_chain if self.proactive else 0

    @property
    def max_side_nodes(self) -> int:
        if not self.proactive:
            return 0
        return tree_side_nodes(self.widths) + len(one_deviation_leaves(self.widths)) * self.side_chain

    def make_tree(self, ctx: DraftContext, window: DraftWindow, start: int) -> Optional[TreeDraft]:
        tree = self.shaped_tree(ctx, window, start, self.widths)
        if tree is None or not self.side_chain:
            return tree
        # The leaves of the tree as drawn (its widths may be clamped to the vocabulary or cut by
        # a short window); the layout cuts the side chains to the drafts the window has.
        return replace(tree, side_leaves=one_deviation_leaves(tree.widths), side_len=self.side_chain)

    def continue_window(self, ctx: DraftContext, report: PassReport, rest: slice) -> Tuple[DraftWindow, int]:
        if not self.continuation:
            return super().continue_window(ctx, report, rest)
        stale, old = report.stale, report.draft.window
        tokens = adaptive_continuation(old.tokens[rest], stale.accepted[rest], stale.token[rest])
        return DraftWindow(tokens, stale.p[rest]), sum(stale.accepted_host[rest])

    def next_tree(self, ctx: DraftContext, report: PassReport, window: DraftWindow) -> Optional[TreeDraft]:
        if not (self.proactive and report.outcome.rejected):
            return None
        return self.make_tree(ctx, window, report.num_committed)


class EveryPassTreeDrafter(PACDrafter):
    """SJD-PAC with the tree on the first D - 1 window positions of every pass, as the authors'
    sampler builds it: also after a fully accepted window (whose next drafts are all new to the
    window) and on the first pass. The tree depends only on the stale q's, so it stays exact."""

    def first(self, ctx: DraftContext, logits: torch.Tensor, start: int, target: int) -> Draft:
        draft = super().first(ctx, logits, start, target)
        return Draft(draft.window, self.make_tree(ctx, draft.window, start) if self.proactive else None)

    def next_tree(self, ctx: DraftContext, report: PassReport, window: DraftWindow) -> Optional[TreeDraft]:
        return self.make_tree(ctx, window, report.num_committed) if self.proactive else None


def make_drafter(config: SamplerConfig) -> Drafter:
    """The drafter a configuration asks for."""
    if config.use_ac or config.use_pd:
        kind = EveryPassTreeDrafter if config.tree_every_pass else PACDrafter
        return kind(config.use_ac, config.use_pd, config.tree_depth, config.tree_width, config.tree_widths,
                    config.side_chain_len)
    return SJDDrafter()
