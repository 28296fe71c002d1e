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
  which also says which slots are real (a fixed-width row may hold fewer real candidates); or
  slot 0 the draft and the others a draw from another law known before the pass
  (`ctx.rule.candidates_beside`), which then goes to verification as tree.beside_q[d];
* tree.layout lays out any tree (a TreeShape, or nodes as arrays) whose main branch (slot 0 at
  every depth) is the whole window and whose other slots lie in the candidate rows
  (`sampling.tree`); its children-are-a-prefix rule is what keeps recursive rejection exact,
  and the Gumbel rule is exact for any tree.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple

import torch

from ..config import SamplerConfig, TreeLevels
from ..sampling.drafting import initial_proposals, rejected_mixture
from ..sampling.recipe import SamplingRecipe
from ..sampling.rules import NodeChildren
from ..sampling.tree import level_tree_shape, one_deviation_leaves, tree_layout
from ..transfer import to_device
from .budget import (MAX_SLOTS, AcceptanceTable, BudgetTree, DecayedMean, chain_floor, fastest_budget, greedy_tree,
                     path_class, position_classes, ranked_tree)
from .draft import Draft, DraftWindow, TreeDraft
from .mixture import FirstDraftMixture
from .neighbour_laws import NeighbourLaws
from .side_rows import PastNodes, side_proposals
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
    committed: torch.Tensor  # long [N] on the device: the run's tokens, [:start] final when drafting from start
    row_length: int = 0  # positions per image row (position i - row_length is above i); 0: not a grid


@dataclass(frozen=True)
class PassReport:
    """What one pass verified and decided, for drafting the next one."""

    start: int  # committed tokens before the pass (the window's first position)
    num_committed: int  # committed tokens after it (the next window's first position)
    target: int  # window size the window policy wants for the next pass
    draft: Draft  # what this pass verified
    node_tokens: torch.Tensor  # long [S] on the device: each node's token (the draft laid out as the tree)
    children: NodeChildren  # device: every node's children by slot, their tokens and validity
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

    @property
    def node_budget(self) -> Optional[int]:
        """If set, no pass carries more nodes than this (it sizes the cache); each Draft says
        what its pass is padded to."""
        return None

    def use_cost(self, cost: Callable[[int], float]) -> None:
        """The forward seconds of a pass of n nodes on this hardware (a drafter may price its
        passes with it); ignored by default."""

    def note_overhead(self, seconds: float) -> None:
        """A pass's sampler seconds outside the forward; ignored by default."""

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
    def behind_the_change(ctx: DraftContext, report: PassReport, window: DraftWindow,
                          mixture: FirstDraftMixture) -> Tuple[DraftWindow, bool]:
        """The window with its first draft redrawn where the pass ended on a rejection (else
        unchanged), and whether it was: drawn from `mixture`'s blend of the p behind the rejected
        draft (row 0), `sampling.drafting.rejected_mixture` of the p's behind every rejected
        candidate, and the neighbour law of the new token to its left and the token above."""
        outcome = report.outcome
        if mixture.off or not (outcome.rejected and len(window)):
            return window, False
        end = outcome.path_nodes[-1] if outcome.path_nodes else 0
        rejected = report.draft.layout.children[end]
        if len(rejected) < 2 and mixture.laws is None:  # nothing to blend
            return window, False
        p = report.verdict.p
        index = to_device(rejected, p.device)
        # padding slots (q had fewer tokens than the level's width) were never verified: no weight
        children = report.children
        mass = p[end].gather(0, children.tokens[end, : len(rejected)]) * children.valid[end, : len(rejected)]
        behind = p.index_select(0, index)
        full = rejected_mixture(behind, mass)
        start = report.num_committed
        positions = ctx.positions[start : start + 1]
        law = mixture.law(start, ctx.committed, ctx.constraints.mask(positions)[0], behind[0])
        q = mixture.blend(behind[0], full, law).unsqueeze(0).to(window.q.dtype)
        mixture.drafted(start, behind[0], full, law)
        first = ctx.rule.draw(q, positions)
        return DraftWindow(torch.cat([first, window.tokens[1:]]), torch.cat([q, window.q[1:]])), True

    @staticmethod
    def candidates_from_law(ctx: DraftContext, laws: Optional[NeighbourLaws], window: DraftWindow, start: int,
                            rows: int, width: int) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """The candidate rows of the window's first `rows` positions (row r: position start + r),
        `width` slots each, in one draw: slot 0 the draft (the drafts behind it were continued
        from it), the others drawn without replacement, the draft left out, by the rule's
        `candidates_beside` from the neighbour law there given the token to the left and the token
        above on the main chain (`NeighbourLaws.window_law`), or from the row's own q where the
        law has seen neither token (the draft was drawn from that q, so the row is then one draw
        without replacement from it, as `rule.candidates` makes it). Returns (candidates, valid,
        beside_q): beside_q [rows, V] is the law each row's other slots came from, for
        verification (None where the rule does not read it); without laws, the rule's draw from
        q and None."""
        positions = ctx.positions[start : start + rows]
        q, first = window.q[:rows], window.tokens[:rows]
        if laws is None or width < 2:
            cands, valid = ctx.rule.candidates(q, first, width, positions)
            return cands, valid, None
        allowed = ctx.constraints.mask(positions)
        if not ctx.rule.reads_beside:  # only the law's ranking counts: its logs, never normalised
            log_law, seen = laws.window_log_law(start, window.tokens, ctx.committed, rows)
            log_beside = torch.where(seen.unsqueeze(1), log_law.masked_fill(~allowed, float("-inf")), torch.log(q))
            cands, valid = ctx.rule.candidates_beside_of_logs(log_beside, first, width, positions)
            return cands, valid, None
        law, seen = laws.window_law(start, window.tokens, ctx.committed, allowed)
        beside_q = torch.where(seen.unsqueeze(1), law.to(q.dtype), q)
        cands, valid = ctx.rule.candidates_beside(beside_q, first, width, positions)
        return cands, valid, beside_q

    @staticmethod
    def shaped_tree(ctx: DraftContext, window: DraftWindow, start: int, widths: Sequence[int],
                    side_chain: int = 0, chain_width: int = 1,
                    laws: Optional[NeighbourLaws] = None) -> Optional[TreeDraft]:
        """A level tree with widths[d] candidates at window position d (one rule call: a draw of
        max(widths) without replacement per level, of which level d uses the first widths[d]
        slots, and a prefix of a draw without replacement is itself one), side chains of
        `side_chain` drafts on its one-deviation leaves (cut to the drafts the window has), and
        `chain_width` - 1 siblings beside every chain draft (one vectorised draw of
        `chain_width` per chain position, its first slot the draft itself). With `laws`, every
        candidate row is one `candidates_from_law` draw instead."""
        levels = min(len(widths), len(window))
        if levels <= 0:
            return None
        vocab = int(window.q.shape[-1])  # a level never draws more tokens than there are
        widths = tuple(min(w, vocab) for w in widths[:levels])
        chain_width = min(chain_width, vocab)
        chain = len(window) - levels
        if chain_width <= 1 or not chain:
            chain_width = 1
        leaves = one_deviation_leaves(widths) if side_chain and chain else ()
        shape = level_tree_shape(widths, chain, leaves, min(side_chain, chain), chain_width)
        if laws is not None:
            rows = levels + (chain if chain_width > 1 else 0)
            cands, valid, beside_q = Drafter.candidates_from_law(ctx, laws, window, start, rows,
                                                                 max(max(widths), chain_width))
            return TreeDraft(cands, valid, tree_layout(shape), widths, beside_q=beside_q)
        rows = slice(0, levels)
        cands, valid = ctx.rule.candidates(window.q[rows], window.tokens[rows], max(widths),
                                           ctx.positions[start : start + levels])
        if chain_width > 1:
            # The siblings' rows join the candidate rows (padding slots where the widths differ).
            more, more_valid = ctx.rule.chain_candidates(window.q[levels:], window.tokens[levels:], chain_width,
                                                         ctx.positions[start + levels : start + len(window)])
            width = max(cands.shape[1], chain_width)
            cands, more = (torch.nn.functional.pad(c, (0, width - c.shape[1])) for c in (cands, more))
            valid, more_valid = (torch.nn.functional.pad(v, (0, width - v.shape[1]), value=False)
                                 for v in (valid, more_valid))
            cands, valid = torch.cat([cands, more]), torch.cat([valid, more_valid])
        return TreeDraft(cands, valid, tree_layout(shape), widths)


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

    def first_after_rejection(self, ctx: DraftContext, report: PassReport, window: DraftWindow,
                              kept: int) -> Tuple[DraftWindow, int]:
        """The window and its count of drafts kept by AC, once its first draft is settled: SJD
        keeps the one drawn from the stale p (PACDrafter may redraw it)."""
        return window, kept

    def next_window(self, ctx: DraftContext, report: PassReport) -> Tuple[DraftWindow, int, int]:
        """The next pass's window: the verified drafts carried on, filled to the target, its first
        draft settled; with the drafts kept by AC and how many were carried (not new)."""
        window, kept = self.carried_window(ctx, report)
        carried = len(window)
        window, kept = self.complete_window(ctx, report, window, kept, report.target)
        return window, kept, carried

    def carried_window(self, ctx: DraftContext, report: PassReport) -> Tuple[DraftWindow, int]:
        """The verified drafts carried on to the next pass, and how many AC kept."""
        if report.stale.nodes:
            return self.continue_window(ctx, report)
        return report.draft.window.tail(len(report.draft.window)), 0  # nothing left: empty

    def complete_window(self, ctx: DraftContext, report: PassReport, window: DraftWindow, kept: int,
                        target: int) -> Tuple[DraftWindow, int]:
        """`window` filled with fresh drafts to `target` and its first draft settled, with the
        drafts AC kept."""
        window = self.fill(ctx, window, report.proposal_logits, report.num_committed, target)
        return self.first_after_rejection(ctx, report, window, kept)

    def next(self, ctx: DraftContext, report: PassReport) -> Draft:
        window, kept, _ = self.next_window(ctx, report)
        return Draft(window, self.next_tree(ctx, report, window), kept)


class PACDrafter(SJDDrafter):
    """SJD-PAC: Adaptive Continuation keeps every old draft the stale p accepts (else its residual
    redraw), and Proactive Drafting puts a tree on the positions after a rejection. Either can be
    switched off (the paper's ablation). `tree` is the tree in numbers (config.TreeLevels: the
    level widths, side chains hung off the one-deviation leaves so a side-branch win no longer
    ends the pass, chain siblings beside the chain's drafts); `max_window`, the longest window a
    pass may carry, sizes the envelope when the tree has chain siblings.

    After a rejection among several candidates (a tree level), the first draft is drawn from a
    blend of the p behind the rejected draft and the mixture of the p's the pass computed behind
    all of them (`Drafter.behind_the_change`): on image models the mixture's draft wins more
    often right behind a changed token, and the run's own law of the token after the new one and
    below the token above more often still. `mixture_weight`, `law_weight`: their weights (both 0
    for the paper's PAC), or None (the default) for the weights the run's own passes score best
    (engine/mixture.py)."""

    def __init__(self, continuation: bool, proactive: bool, tree: TreeLevels, max_window: int = 0,
                 mixture_weight: Optional[float] = None, law_weight: Optional[float] = None,
                 law_candidates: bool = True) -> None:
        self.continuation = continuation
        self.proactive = proactive and bool(tree.widths)
        self.tree = tree if self.proactive else TreeLevels()
        self.max_window = max_window
        self.mixture = FirstDraftMixture(mixture_weight, law_weight)
        self.law_candidates = law_candidates

    def first_after_rejection(self, ctx: DraftContext, report: PassReport, window: DraftWindow,
                              kept: int) -> Tuple[DraftWindow, int]:
        verdict = report.verdict
        self.mixture.observe(report.start, verdict.p[0])  # node 0's p: the window's first position
        nodes = report.node_tokens.shape[0]  # the pass's nodes (a padded pass computes more rows)
        self.mixture.learn(report.node_tokens, verdict.positions[:nodes], verdict.p[:nodes], ctx.committed,
                           report.num_committed, ctx.row_length)
        window, redrawn = self.behind_the_change(ctx, report, window, self.mixture)
        if redrawn and report.stale.nodes:  # the first draft is no longer the one AC kept
            kept -= report.decisions.accepted_child[report.stale.nodes[0]] == 0
        return window, kept

    @property
    def max_side_nodes(self) -> int:
        return self.tree.side_nodes(self.max_window) if self.proactive else 0

    def make_tree(self, ctx: DraftContext, window: DraftWindow, start: int,
                  widths: Optional[Tuple[int, ...]] = None) -> Optional[TreeDraft]:
        """The level tree on the window's first positions: `widths` (the window policy's choice,
        e.g. a narrower tree on hardware where nodes cost) or the configured ones."""
        levels = self.tree
        return self.shaped_tree(ctx, window, start, levels.widths if widths is None else widths, levels.side_chain,
                                levels.chain_width, self.mixture.laws if self.law_candidates else None)

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


SIDE_CHAIN = 24  # the deepest own row below a side candidate that may come from the last pass's chain


class BudgetDrafter(PACDrafter):
    """SJD-PAC within a node budget: before every pass, the tree of at most `budget` nodes worth
    the most by the acceptance this run has seen (engine/budget.py): how long the main chain is
    (the window the pass feeds), how many candidates each position gets, and which candidates
    get branches of their own. Adaptive Continuation carries the drafts over, as in PACDrafter;
    the candidates at a position are one draw without replacement from its q (the rule's), so
    any shape verifies exactly, and the shape depends only on passes already verified. After a
    rejection among several candidates, the first draft comes from the mixture of the p's behind
    all of them and the run's neighbour law (`mixture_weight`, `law_weight`, as in PACDrafter).

    With `side_rows`, the nodes behind a side candidate at the window's first position draw
    their children from proposals of their own, the p's the last pass computed behind that
    candidate's token (engine/side_rows.py), instead of the main chain's drafts.

    `ranked`: the tree is chosen in array operations (budget.ranked_tree) rather than node by
    node from a heap (budget.greedy_tree, which own rows always use).

    With `cost` (seconds of a pass of n nodes, the auto window's curve measured on this
    hardware), every pass also picks its budget, up to `budget`, among BUDGET_CHOICES: the one
    with the most expected tokens per second (`budget.fastest_budget`).
    """

    def __init__(self, continuation: bool, budget: int, max_width: int = MAX_SLOTS, side_rows: bool = False,
                 mixture_weight: Optional[float] = None, law_weight: Optional[float] = None,
                 law_candidates: bool = True, ranked: bool = True) -> None:
        super().__init__(continuation, proactive=False, tree=TreeLevels(), mixture_weight=mixture_weight,
                         law_weight=law_weight, law_candidates=law_candidates)
        self.budget = budget
        self.max_width = max_width
        self.side_rows = side_rows
        self.ranked = ranked and not side_rows  # own rows sit below side candidates: only the greedy reaches them
        self.last: Optional[PassReport] = None  # the pass before the draft being made (side rows come from it)
        self.table = AcceptanceTable(max_width)
        self.cost: Optional[Callable[[int], float]] = None
        self.overhead = DecayedMean(0.0, decay=0.8)  # sampler seconds per pass outside the forward
        self.classes: Tuple[int, ...] = ()  # the classes of the last draft's positions
        self.after_leaf = False  # the last draft's pass follows one that ended on a side leaf
        # accepted drafts of passes that followed a side-leaf end / a rejection (a decayed mean)
        self.accepted_after = {True: DecayedMean(1.0), False: DecayedMean(1.0)}
        self.tokens_per_pass = DecayedMean(2.0)

    @property
    def node_budget(self) -> Optional[int]:
        return self.budget

    def use_cost(self, cost: Callable[[int], float]) -> None:
        """Choose every pass's budget for speed on this hardware (`cost(n)`: a pass of n nodes)."""
        self.cost = cost

    def note_overhead(self, seconds: float) -> None:
        self.overhead.add(max(seconds, 0.0))

    def pass_seconds(self, nodes: int) -> float:
        return self.cost(nodes) + self.overhead.mean

    # The tree is chosen before the window is filled: it depends on how many drafts were
    # carried, not on their values, and the fresh drafts past its main chain would be thrown away.
    def first(self, ctx: DraftContext, logits: torch.Tensor, start: int, target: int) -> Draft:
        window = DraftWindow.empty_like(ctx, logits)
        tree, nodes = self.choose_tree(window, 0, min(target, ctx.num_tokens - start))
        window = self.fill(ctx, window, logits, start, tree.window)
        return self.tree_draft(ctx, window, start, tree, nodes, kept=0)

    def next(self, ctx: DraftContext, report: PassReport) -> Draft:
        self.observe(report)
        self.last = report if self.side_rows else None  # it holds the pass's p: kept only for side rows
        outcome = report.outcome
        self.after_leaf = not outcome.rejected and any(outcome.branch)
        start = report.num_committed
        window, kept = self.carried_window(ctx, report)
        length = max(len(window), min(report.target, ctx.num_tokens - start))  # the window filled to the target
        tree, nodes = self.choose_tree(window, len(window), length)
        window, kept = self.complete_window(ctx, report, window, kept, tree.window)
        return self.tree_draft(ctx, window, start, tree, nodes, kept)

    def observe(self, report: PassReport) -> None:
        """Count, along the pass's accepted path, which candidate slot won at each position."""
        layout = report.draft.layout
        accepted = report.decisions.accepted_child
        self.table.age()
        self.accepted_after[self.after_leaf].add(report.outcome.accepted)
        self.tokens_per_pass.add(report.num_committed - report.start)
        deviation = -1
        branch = report.outcome.branch
        for pos, node in enumerate((0,) + report.outcome.path_nodes):  # the path: a few dozen nodes
            width = layout.children.count(node)
            if not width or pos >= len(self.classes):
                break
            cls = path_class(self.classes, branch[:pos] + (0,), deviation, self.side_rows)  # of node's children
            self.table.add(cls, width, accepted[node])
            if accepted[node] > 0:
                deviation = pos

    def choose_tree(self, window: DraftWindow, carried: int, length: int) -> Tuple[BudgetTree, int]:
        """The budget's tree over a window of `length` drafts whose first `carried` were carried
        from the last pass, and the nodes its pass is padded to."""
        classes = position_classes(carried, length, self.after_leaf)
        leaf_value = max(0.0, self.accepted_after[True].mean - self.accepted_after[False].mean)
        vocab = int(window.q.shape[-1])
        win, width = self.table.win_probabilities(), min(self.max_width, vocab)
        min_chain = chain_floor(self.tokens_per_pass.mean, self.budget)
        if self.ranked:
            tree = ranked_tree(win, classes, self.budget, width, leaf_value=leaf_value, min_chain=min_chain)
        else:
            tree = greedy_tree(win, classes, self.budget, width, leaf_value=leaf_value, min_chain=min_chain,
                               own_rows=self.side_rows)
        nodes = self.budget
        if self.cost is not None:
            nodes = fastest_budget(tree.expected, self.pass_seconds) or self.budget
            tree = tree.first(nodes)
        if tree.num_nodes > nodes:  # the pass is padded to `nodes`: a larger tree cannot be laid out
            raise RuntimeError(f"internal error: the budget's tree has {tree.num_nodes} nodes, more than the "
                               f"{nodes} of its pass")
        self.classes = classes[: tree.window]
        return tree, nodes

    def tree_draft(self, ctx: DraftContext, window: DraftWindow, start: int, tree: BudgetTree, nodes: int,
                   kept: int) -> Draft:
        """The draft of `tree` over `window`: the window cut to the tree's main chain, candidates
        drawn at the positions that branch, the pass padded to `nodes`."""
        window = DraftWindow(window.tokens[: tree.window], window.q[: tree.window])
        levels = max((pos + 1 for pos, w in enumerate(tree.widths) if w > 1), default=0)
        if not levels:
            return Draft(window, None, kept, nodes)
        width = max(tree.widths + tree.own_widths)
        laws = self.mixture.laws if self.law_candidates else None
        cands, valid, beside_q = self.candidates_from_law(ctx, laws, window, start, levels, width)
        own_q = None
        if tree.own_rows:  # (side candidate's slot, level below it) per row
            rows = [(path[0], len(path) - 1) for path in tree.own_rows]
            own_q, first = side_proposals(self.past_nodes(start), cands[0], rows, window.q[1:], window.tokens[1:])
            positions = to_device(tuple(start + 1 + level for _, level in rows), own_q.device)
            own, own_valid = ctx.rule.candidates(own_q, first, width, positions)
            cands, valid = torch.cat([cands, own]), torch.cat([valid, own_valid])
        return Draft(window, TreeDraft(cands, valid, tree.layout, own_q=own_q,
                                       beside_q=beside_q), kept, nodes)

    def past_nodes(self, position: int) -> Optional[PastNodes]:
        """The last pass's nodes holding the token of image `position` (the window's first)."""
        report = self.last
        if report is None:
            return None
        verdict = report.verdict
        return PastNodes.of(report.draft.layout, report.decisions.accepted_child, report.node_tokens,
                            verdict.p, verdict.draft_token, report.start, position, SIDE_CHAIN)


def make_drafter(config: SamplerConfig) -> Drafter:
    """The drafter a configuration asks for."""
    if config.node_budget is not None:
        # The ranked tree under gumbel, where it commits more per pass than the greedy within
        # 32-128 nodes; under rejection its shallow branches commit less within 32 and 256 nodes
        # (held-out counts, docs/benchmark.md), so that rule keeps the node-by-node greedy.
        return BudgetDrafter(config.use_ac, config.pass_nodes, ranked=config.verify == "gumbel")
    if config.use_ac or config.use_pd:
        kind = EveryPassTreeDrafter if config.tree_every_pass else PACDrafter
        return kind(config.use_ac, config.use_pd, config.tree, config.window_size)
    return SJDDrafter()
