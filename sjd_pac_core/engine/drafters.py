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
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from ..config import SamplerConfig
from ..sampling.drafting import adaptive_continuation, initial_proposals
from ..sampling.recipe import SamplingRecipe
from .state import DraftWindow
from .verdict import Decisions, PassOutcome, Verdict


@dataclass(frozen=True)
class TreeDraft:
    """Proactive Drafting candidates for the first `levels` window positions.

    candidates: long [levels, K]; row d is the draw for window position d (column 0 is the
    window's own draft). valid: bool [levels, K]; False marks padding slots (q had fewer than K
    tokens), which are never accepted. Every level has width K, so the pass's shape is fixed.
    """

    candidates: torch.Tensor
    valid: torch.Tensor

    @property
    def levels(self) -> int:
        return int(self.candidates.shape[0])

    @property
    def widths(self) -> Tuple[int, ...]:
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


class SJDDrafter(Drafter):
    """Speculative Jacobi Decoding: after a pass, every draft beyond the committed token is drawn
    afresh from this pass's stale p; positions new to the window are drafted from the furthest
    stale logits. No tree. (Plain AR is this drafter with an empty window.)"""

    def first(self, ctx: DraftContext, logits: torch.Tensor, start: int, target: int) -> Draft:
        return Draft(self.fill(ctx, DraftWindow.empty_like(ctx, logits), logits, start, target))

    def continue_window(self, ctx: DraftContext, report: PassReport, rest: slice) -> Tuple[DraftWindow, int]:
        """Drafts for the verified positions after the committed ones, and how many were kept."""
        verdict = report.verdict
        tokens = ctx.rule.draw(verdict.p_main[rest], verdict.positions_main[rest])
        return DraftWindow(tokens, verdict.p_main[rest]), 0

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
    rejection. Either can be switched off (the paper's ablation)."""

    def __init__(self, continuation: bool, proactive: bool, depth: int, width: int) -> None:
        self.continuation = continuation
        self.proactive = proactive and depth > 1
        self.depth, self.width = depth, width

    @property
    def max_side_nodes(self) -> int:
        if not self.proactive:
            return 0
        levels = [self.width ** d for d in range(1, self.depth)]
        return sum(levels) - len(levels)

    def continue_window(self, ctx: DraftContext, report: PassReport, rest: slice) -> Tuple[DraftWindow, int]:
        if not self.continuation:
            return super().continue_window(ctx, report, rest)
        verdict, old = report.verdict, report.draft.window
        tokens = adaptive_continuation(old.tokens[rest], verdict.chain_accepted[rest], verdict.chain_token[rest])
        return DraftWindow(tokens, verdict.p_main[rest]), sum(report.decisions.chain_accepted[rest])

    def next_tree(self, ctx: DraftContext, report: PassReport, window: DraftWindow) -> Optional[TreeDraft]:
        if not (self.proactive and report.outcome.rejected):
            return None
        return self.tree(ctx, window, report.num_committed, self.depth, self.width)


def make_drafter(config: SamplerConfig) -> Drafter:
    """The drafter a configuration asks for."""
    if config.use_ac or config.use_pd:
        return PACDrafter(config.use_ac, config.use_pd, config.tree_depth, config.tree_width)
    return SJDDrafter()
