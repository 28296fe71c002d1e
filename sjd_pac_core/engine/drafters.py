"""Drafting strategies: what the next pass verifies.

The loop asks a Drafter for a Draft twice: `first` after the prompt's prefill, and `next` after
every pass, with a PassReport of what that pass verified and decided. It never looks inside a
drafter, so a new strategy (another tree shape, adaptive depth or width, other proposals) is a
new subclass and no edit of the loop.

The exactness contract every drafter keeps (spec sections 2-4):
* window.tokens[j] is drawn from window.q[j], and q[j] depends only on what was known before the
  pass that verifies it (stale p's, earlier drafts), never on that pass's own p;
* tree.candidates[d] is one draw without replacement from window.q[d], in draw order, with
  candidates[d, 0] == window.tokens[d] (the main branch); draw it with `ctx.rule.candidates`,
  which also says which slots are real (a fixed-width row may hold fewer real candidates);
* tree.shape is any TreeShape whose main branch (slot 0 at every depth) is the whole window and
  whose other slots lie in the candidate rows (`sampling.tree`); its children-are-a-prefix rule
  is what keeps recursive rejection exact, and the Gumbel rule is exact for any tree.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch

from ..config import SamplerConfig, TreeLevels
from ..sampling.drafting import initial_proposals
from ..sampling.recipe import SamplingRecipe
from ..sampling.tree import level_tree_shape, one_deviation_leaves
from .draft import Draft, DraftWindow, TreeDraft
from .verdict import Decisions, PassOutcome, StaleRows, Verdict


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
    verdict: Verdict  # device: every node's decision, draw and p
    proposal_logits: torch.Tensor  # [B, V] raw logits of the furthest node the next window continues from
    stale: StaleRows  # the verdict and p for each position after the final token (verdict.continuation)
    tree_widths: Optional[Tuple[int, ...]] = None  # the tree the window policy wants (None: the drafter's own)


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
    def shaped_tree(ctx: DraftContext, window: DraftWindow, start: int, widths: Sequence[int],
                    side_chain: int = 0, chain_width: int = 1) -> Optional[TreeDraft]:
        """A level tree with widths[d] candidates at window position d (one rule call: a draw of
        max(widths) without replacement per level, of which level d uses the first widths[d]
        slots, and a prefix of a draw without replacement is itself one), side chains of
        `side_chain` drafts on its one-deviation leaves (cut to the drafts the window has), and
        `chain_width` - 1 siblings beside every chain draft (one vectorised draw of
        `chain_width` per chain position, its first slot the draft itself)."""
        levels = min(len(widths), len(window))
        if levels <= 0:
            return None
        vocab = int(window.q.shape[-1])  # a level never draws more tokens than there are
        widths = tuple(min(w, vocab) for w in widths[:levels])
        chain_width = min(chain_width, vocab)
        rows = slice(0, levels)
        cands, valid = ctx.rule.candidates(window.q[rows], window.tokens[rows], max(widths),
                                           ctx.positions[start : start + levels])
        chain = len(window) - levels
        if chain_width > 1 and chain:
            # The siblings' rows join the candidate rows (padding slots where the widths differ).
            more, more_valid = ctx.rule.chain_candidates(window.q[levels:], window.tokens[levels:], chain_width,
                                                         ctx.positions[start + levels : start + len(window)])
            width = max(cands.shape[1], chain_width)
            cands, more = (torch.nn.functional.pad(c, (0, width - c.shape[1])) for c in (cands, more))
            valid, more_valid = (torch.nn.functional.pad(v, (0, width - v.shape[1]), value=False)
                                 for v in (valid, more_valid))
            cands, valid = torch.cat([cands, more]), torch.cat([valid, more_valid])
        else:
            chain_width = 1
        leaves = one_deviation_leaves(widths) if side_chain and chain else ()
        shape = level_tree_shape(widths, chain, leaves, min(side_chain, chain), chain_width)
        return TreeDraft(cands, valid, shape, widths)


class SJDDrafter(Drafter):
    """Speculative Jacobi Decoding: after a pass, every draft beyond the committed token is drawn
    afresh from this pass's stale p; positions new to the window are drafted from the furthest
    stale logits. No tree. (Plain AR is this drafter with an empty window.)"""

    def first(self, ctx: DraftContext, logits: torch.Tensor, start: int, target: int) -> Draft:
        return Draft(self.fill(ctx, DraftWindow.empty_like(ctx, logits), logits, start, target))

    def continue_window(self, ctx: DraftContext, report: PassReport) -> Tuple[DraftWindow, int]:
        """Drafts for the verified positions after the committed ones, and how many were kept:
        SJD draws each afresh from its stale p."""
        stale = report.stale
        return DraftWindow(ctx.rule.draw(stale.p, stale.positions), stale.p), 0

    def next_tree(self, ctx: DraftContext, report: PassReport, window: DraftWindow) -> Optional[TreeDraft]:
        return None

    def next(self, ctx: DraftContext, report: PassReport) -> Draft:
        if report.stale.nodes:
            window, kept = self.continue_window(ctx, report)
        else:
            window, kept = report.draft.window.tail(len(report.draft.window)), 0  # nothing left: empty
        window = self.fill(ctx, window, report.proposal_logits, report.num_committed, report.target)
        return Draft(window, self.next_tree(ctx, report, window), kept)


class PACDrafter(SJDDrafter):
    """SJD-PAC: Adaptive Continuation keeps every old draft the stale p accepts (else its residual
    redraw), and Proactive Drafting puts a tree on the positions after a rejection. Either can be
    switched off (the paper's ablation). `tree` is the tree in numbers (config.TreeLevels: the
    level widths, side chains hung off the one-deviation leaves so a side-branch win no longer
    ends the pass, chain siblings beside the chain's drafts); `max_window`, the longest window a
    pass may carry, sizes the envelope when the tree has chain siblings."""

    def __init__(self, continuation: bool, proactive: bool, tree: TreeLevels, max_window: int = 0) -> None:
        self.continuation = continuation
        self.proactive = proactive and bool(tree.widths)
        self.tree = tree if self.proactive else TreeLevels()
        self.max_window = max_window

    @property
    def max_side_nodes(self) -> int:
        return self.tree.side_nodes(self.max_window) if self.proactive else 0

    def make_tree(self, ctx: DraftContext, window: DraftWindow, start: int,
                  widths: Optional[Tuple[int, ...]] = None) -> Optional[TreeDraft]:
        """The level tree on the window's first positions: `widths` (the window policy's choice,
        e.g. a narrower tree on hardware where nodes cost) or the configured ones."""
        tree = self.tree
        return self.shaped_tree(ctx, window, start, tree.widths if widths is None else widths, tree.side_chain,
                                tree.chain_width)

    def continue_window(self, ctx: DraftContext, report: PassReport) -> Tuple[DraftWindow, int]:
        """Adaptive Continuation: the verdict's own draw at each node, which keeps the old draft
        where the stale p accepts it (else a redraw from the residual): distributed as that p."""
        if not self.continuation:
            return super().continue_window(ctx, report)
        stale = report.stale
        return DraftWindow(stale.token, stale.p), stale.kept

    def next_tree(self, ctx: DraftContext, report: PassReport, window: DraftWindow) -> Optional[TreeDraft]:
        if not (self.proactive and report.outcome.rejected):
            return None
        return self.make_tree(ctx, window, report.num_committed, report.tree_widths)


class EveryPassTreeDrafter(PACDrafter):
    """SJD-PAC with the tree on the first D - 1 window positions of every pass, as the authors'
    sampler builds it: also after a fully accepted window (whose next drafts are all new to the
    window) and on the first pass. The tree depends only on the stale q's, so it stays exact."""

    def first(self, ctx: DraftContext, logits: torch.Tensor, start: int, target: int) -> Draft:
        draft = super().first(ctx, logits, start, target)
        return Draft(draft.window, self.make_tree(ctx, draft.window, start) if self.proactive else None)

    def next_tree(self, ctx: DraftContext, report: PassReport, window: DraftWindow) -> Optional[TreeDraft]:
        return self.make_tree(ctx, window, report.num_committed, report.tree_widths) if self.proactive else None


def make_drafter(config: SamplerConfig) -> Drafter:
    """The drafter a configuration asks for."""
    if config.use_ac or config.use_pd:
        kind = EveryPassTreeDrafter if config.tree_every_pass else PACDrafter
        return kind(config.use_ac, config.use_pd, config.tree, config.window_size)
    return SJDDrafter()
