"""Window policies: how many drafts to verify in the next pass.

`FixedWindow` is the paper's constant L. `AutoWindow` (window="auto") picks L to maximise
expected tokens per second: expected tokens per pass from the acceptance seen so far in this run,
divided by the forward cost of a pass of that size, measured once per model and device. The
choice depends only on the past, and every draft keeps its known q, so the sampler stays exact
whatever L it picks. `AutoTreeWindow` (window="auto" on an eager run with a PD tree) picks the
tree's widths with L, from counts of which candidate slot each tree level accepted.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..config import PROBE_SIZES, TreeLevels
from ..models.base import DecoderSession, TokenModel

CANDIDATE_WINDOWS: Tuple[int, ...] = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96)
# A compiled run builds one graph per pass size: its auto window chooses among a few sizes, each
# compiled (and timed, compiled) in the warm-up; shorter passes are padded up to one of them.
COMPILED_CANDIDATE_WINDOWS: Tuple[int, ...] = (8, 16, 32, 64)
AUTO_START_WINDOW = 16


@dataclass(frozen=True)
class CostCurve:
    """Forward seconds for a pass of n nodes, interpolated between measured sizes."""

    sizes: Tuple[int, ...]
    seconds: Tuple[float, ...]

    def __call__(self, nodes: int) -> float:
        sizes, secs = self.sizes, self.seconds
        if nodes <= sizes[0]:
            return secs[0]
        for (n0, t0), (n1, t1) in zip(zip(sizes, secs), zip(sizes[1:], secs[1:])):
            if nodes <= n1:
                return t0 + (t1 - t0) * (nodes - n0) / (n1 - n0)
        slope = (secs[-1] - secs[-2]) / (sizes[-1] - sizes[-2])
        return secs[-1] + slope * (nodes - sizes[-1])

    def relative(self) -> Dict[int, float]:
        """Cost of each measured size relative to one token (what the README reports)."""
        return {n: t / self.seconds[0] for n, t in zip(self.sizes, self.seconds)}


_CostKey = Tuple[int, str, bool, Tuple[int, ...]]
_COST_CACHE: Dict[_CostKey, CostCurve] = {}


def _cost_key(model: TokenModel, compiled: bool, sizes: Sequence[int]) -> _CostKey:
    return id(getattr(model, "model", model)), str(model.device), compiled, tuple(sizes)  # the network, not its wrapper


def cached_cost_curve(model: TokenModel, compiled: bool = False,
                      sizes: Sequence[int] = PROBE_SIZES) -> Optional[CostCurve]:
    """The curve `measure_cost_curve` measured for this model, device and sizes, if it ran."""
    return _COST_CACHE.get(_cost_key(model, compiled, sizes))


def measured_cost_curves(model: TokenModel) -> Dict[bool, CostCurve]:
    """Every curve measured for this model on its device, by compilation (False: eager passes),
    the sizes of several measurements merged (for reports)."""
    network, device = _cost_key(model, False, ())[:2]
    merged: Dict[bool, Dict[int, float]] = {}
    for (net, dev, compiled, _), curve in _COST_CACHE.items():
        if (net, dev) == (network, device):
            merged.setdefault(compiled, {}).update(zip(curve.sizes, curve.seconds))
    return {compiled: CostCurve(tuple(sorted(points)), tuple(points[n] for n in sorted(points)))
            for compiled, points in merged.items()}


def measure_cost_curve(
    model: TokenModel, session: DecoderSession, root: torch.Tensor, sizes: Sequence[int] = PROBE_SIZES,
    repeats: int = 3, compiled: bool = False,
) -> CostCurve:
    """Time chain passes of each size on the live session, then drop them from the cache.

    Cached per model, device, compilation and sizes: the curve is a property of the hardware, the
    model shape and the kernels that run it. On a compiled session the first pass of a size builds its
    graph; the fastest of `repeats` passes is the one that counts.
    """
    key = _cost_key(model, compiled, sizes)
    if key in _COST_CACHE:
        return _COST_CACHE[key]
    seconds = []
    for size in sizes:  # measured once per model and device, not per pass
        tokens = root.reshape(1).expand(size).contiguous()
        depths = torch.arange(size, device=tokens.device)
        attend = torch.ones(size, size, dtype=torch.bool).tril()
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            logits = session.forward(tokens, depths, attend)
            logits[..., :1].sum().item()  # wait for the device
            best = min(best, time.perf_counter() - start)
            session.keep([])  # the probe leaves the cache exactly as it was
        seconds.append(best)
    # A bigger pass never costs less; forcing that removes timer noise from the choice.
    monotone = [max(seconds[: i + 1]) for i in range(len(seconds))]
    curve = CostCurve(tuple(sizes), tuple(monotone))
    _COST_CACHE[key] = curve
    return curve


class FixedWindow:
    """The paper's constant L. Every window policy answers these four calls."""

    def __init__(self, window: int) -> None:
        self.window = window

    def next_window(self) -> int:
        return self.window

    def next_tree(self) -> Optional[Tuple[int, ...]]:
        """The tree widths the policy wants for the next pass; None: the drafter's own."""
        return None

    def observe(self, accepted: int, censored: bool, window: int, **tree) -> None:
        pass

    def note_overhead(self, seconds: float) -> None:
        """A constant window needs no costs."""


class _Survival:
    """Decayed at-risk and event counts of a run length A: the hazard P(A = k | A >= k)."""

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.at_risk: List[float] = []  # weighted passes with A >= k, seen at position k
        self.events: List[float] = []  # weighted passes with A == k (rejected there)

    def age(self) -> None:
        self.at_risk = [w * self.decay for w in self.at_risk]
        self.events = [w * self.decay for w in self.events]

    def add(self, run: int, censored: bool, length: int) -> None:
        reach = min(run, length) + (0 if censored else 1)
        while len(self.at_risk) < reach:
            self.at_risk.append(0.0)
            self.events.append(0.0)
        for k in range(reach):  # a short list per pass (<= L entries), off the tensor path
            self.at_risk[k] += 1.0
        if not censored and run < len(self.events):
            self.events[run] += 1.0

    def mean_hazard(self) -> Optional[float]:
        seen = [e / r for e, r in zip(self.events, self.at_risk) if r > 0.5]
        return sum(seen) / len(seen) if seen else None

    def tail_hazard(self) -> Optional[float]:
        """The hazard pooled over the deeper half of the positions seen: what lies beyond them.

        Not the mean over all positions: a draft's first position is rejected far more often
        than a deep one (its context changed the most), so the mean overstates the hazard past
        the window, and a window once shrunk would never see the longer runs that would grow it."""
        seen = [k for k, r in enumerate(self.at_risk) if r > 0.5]
        if not seen:
            return None
        deep = seen[len(seen) // 2:]
        return sum(self.events[k] for k in deep) / sum(self.at_risk[k] for k in deep)

    def hazards(self, length: int, prior: float = 0.5) -> List[float]:
        """Hazards at positions 0..length-1; where too little is seen, the tail hazard (else `prior`)."""
        tail = self.tail_hazard()
        tail = prior if tail is None else tail
        tail = min(max(tail, 0.02), 1.0)
        seen = [e / r if r > 0.5 else tail for e, r in zip(self.events[:length], self.at_risk[:length])]
        return seen + [tail] * (length - len(seen))


class AutoWindow:
    """Chooses L from survival estimates of the accepted run length and the cost curve.

    With A the drafts a pass accepts before its first rejection, a pass of window L commits
    about 1 + sum_{k=1..L} P(A >= k) tokens. P(A >= k) comes from hazards P(A = k | A >= k),
    counted over this run's passes (recent passes weigh more, since drafts improve as the image
    fills in); beyond the longest run seen, the hazard of the deeper positions seen extrapolates (see
    `_Survival.tail_hazard`). A pass with a Proactive
    Drafting tree is counted in two tables: its tree levels (how far the path got through them),
    and, when the path got through the tree, its run along the chain after it. P(A >= k) past
    the tree is P(through the tree) x P(chain run >= k - levels); a chain never reached is
    estimated with the tree's mean hazard. A longer window must beat the best shorter one's
    expected speed by RELATIVE_GAIN: when every chain draft is wrong and the tree ends every
    pass, the chain adds nothing and the window drains to the tree's levels.
    """

    RELATIVE_GAIN = 1e-3

    def __init__(self, cost: CostCurve, extra_nodes: int = 0, start: int = AUTO_START_WINDOW, decay: float = 0.9,
                 candidates: Sequence[int] = CANDIDATE_WINDOWS) -> None:
        self.cost = cost
        self.extra_nodes = extra_nodes  # PD side-branch nodes a pass may carry
        self.window = start
        self.decay = decay
        self.candidates = tuple(candidates)
        self.tree = _Survival(decay)  # runs through the tree's levels
        self.chain = _Survival(decay)  # runs along the continued chain
        self.levels = 0  # tree levels of the last pass
        self.pass_overhead = 0.0  # seconds a pass costs outside the forward (the loop measures it)

    def note_overhead(self, seconds: float) -> None:
        """A pass's sampler time outside the forward: it costs every pass alike, so it makes a
        short window dearer than the forward's cost curve alone says."""
        self.pass_overhead += 0.2 * (max(seconds, 0.0) - self.pass_overhead)

    def pass_cost(self, nodes: int) -> float:
        return self.cost(nodes) + self.pass_overhead

    @property
    def at_risk(self) -> List[float]:
        return self.chain.at_risk

    @property
    def events(self) -> List[float]:
        return self.chain.events

    def next_window(self) -> int:
        return self.window

    def next_tree(self) -> Optional[Tuple[int, ...]]:
        return None  # L only; AutoTreeWindow chooses the tree too

    def observe(self, accepted: int, censored: bool, window: int, tree_levels: int = 0,
                branch: Sequence[int] = (), widths: Sequence[int] = ()) -> None:
        """accepted, censored: the pass's accepted drafts and whether it ended without a
        rejection; window: its drafts; tree_levels: its PD levels (the first drafts); branch,
        widths: the slot taken at each accepted depth and the pass's tree (AutoTreeWindow's)."""
        self.tree.age()
        self.chain.age()
        levels = min(tree_levels, window)
        if levels:
            self.tree.add(min(accepted, levels), accepted >= levels or censored, levels)
        if accepted >= levels and window > levels:  # the path reached the chain
            self.chain.add(accepted - levels, censored, window - levels)
        self.levels = levels
        self.window = self._best_window()

    def expected_tokens(self, window: int) -> float:
        return self._expected_curve(window)[window]

    def _expected_curve(self, length: int) -> List[float]:
        """Expected tokens of a pass of window w, for w = 0..length (one sweep for every window)."""
        tree_mean = self.tree.mean_hazard()
        tree = self.tree.hazards(length)
        chain = self.chain.hazards(length, prior=0.5 if tree_mean is None else tree_mean)
        levels = self.levels
        survive, total, curve = 1.0, 1.0, [1.0]
        for k in range(length):
            survive *= 1.0 - (tree[k] if k < levels else chain[k - levels])
            total += survive
            curve.append(total)
        return curve

    def _best_window(self) -> int:
        curve = self._expected_curve(max(self.candidates))

        def speed(w: int) -> float:
            return curve[w] / self.pass_cost(1 + w + self.extra_nodes)

        best, best_speed = self.candidates[0], speed(self.candidates[0])
        for w in self.candidates[1:]:  # ascending: a longer window must pay for itself
            w_speed = speed(w)
            if w_speed > best_speed * (1.0 + self.RELATIVE_GAIN):
                best, best_speed = w, w_speed
        return best


def narrower_trees(widths: Sequence[int]) -> Tuple[Tuple[int, ...], ...]:
    """The trees an auto policy may choose instead of `widths`: fewer levels, and each level's
    width a power of two up to its configured width (the configured tree itself included)."""
    def ladder(width: int) -> List[int]:
        steps = [w for w in (2, 4, 8, 16, 32, 64) if w < width]
        return steps + [width] if width >= 2 else []

    trees: List[Tuple[int, ...]] = [()]
    for levels in range(1, len(widths) + 1):
        trees += itertools.product(*(ladder(w) for w in widths[:levels]))
    return tuple(dict.fromkeys(trees))


class _SlotRanks:
    """Per tree level, decayed counts of which candidate slot verification accepted.

    A level's accepted slot does not depend on how many candidates it had (the candidates are a
    draw without replacement, tried in order, or the top-k of log q + G), so counts taken with
    W candidates give P(a level with w <= W candidates is passed). A level that rejected all
    its w candidates says only "slot >= w" (censored), as in a survival table over slots.
    """

    def __init__(self, decay: float, wide_decay: Optional[float] = None) -> None:
        # Slot 0 is tried on every pass that reaches a level and follows the run tables' decay;
        # the wider slots, which most passes censor, may forget more slowly (`wide_decay`).
        self.decay = decay
        self.wide_decay = decay if wide_decay is None else wide_decay
        self.at_risk: List[List[float]] = []  # [level][slot]
        self.events: List[List[float]] = []

    def _aged(self, table: List[List[float]]) -> List[List[float]]:
        return [[w * (self.decay if s == 0 else self.wide_decay) for s, w in enumerate(row)] for row in table]

    def age(self) -> None:
        self.at_risk = self._aged(self.at_risk)
        self.events = self._aged(self.events)

    def add(self, widths: Sequence[int], branch: Sequence[int], accepted: int) -> None:
        """widths: the pass's tree; branch: the slot taken at each accepted level; accepted: the
        pass's accepted drafts (a level it did not reach is not at risk)."""
        for level, width in enumerate(widths):
            if level > accepted:
                break
            while len(self.at_risk) <= level:
                self.at_risk.append([])
                self.events.append([])
            passed = level < len(branch)
            slot = branch[level] if passed else width  # rejected: every slot < width failed
            risk, events = self.at_risk[level], self.events[level]
            while len(risk) < min(slot + 1, width):
                risk.append(0.0)
                events.append(0.0)
            for s in range(min(slot + 1, width)):  # at most the level's width (a few slots)
                risk[s] += 1.0
            if passed:
                events[slot] += 1.0

    def passed(self, level: int, width: int) -> float:
        """P(a level of `width` candidates is passed). A slot with too few passes to say takes
        the hazard of the last slot that has them, and a level never reached the level above's:
        optimistic where hazards fall with the slot, so a wider tree gets tried (and measured)
        instead of looking no better than a narrow one forever."""
        row = level
        while row >= 0 and not (row < len(self.at_risk) and self.at_risk[row] and self.at_risk[row][0] > 0.5):
            row -= 1
        if row < 0:
            return 0.0
        risk_row, event_row = self.at_risk[row], self.events[row]
        fail, hazard = 1.0, 0.0
        for s in range(width):
            if s < len(risk_row) and risk_row[s] > 0.5:
                hazard = event_row[s] / risk_row[s]
            fail *= 1.0 - hazard
        return 1.0 - fail


class AutoTreeWindow(AutoWindow):
    """window="auto" with a Proactive Drafting tree, on an eager run: chooses the window and the
    tree together, among `trees` (the configured tree and narrower ones), to maximise expected
    tokens per second. Where every node costs (a CPU), a 40-node tree can cost more than it
    gains; where passes are nearly free (a GPU), the configured tree wins.

    Expected tokens of (L, tree w): 1 + sum_{k <= levels} prod_{d < k} P(level d passed | w_d)
    + sum_{k > levels} P(the main branch survives to k), where the main branch's survival uses
    slot 0 at the configured tree's levels and the chain's hazards after them (a path through a
    side branch ends the pass at the tree: side chains are off). A position the chosen tree does
    not branch at counts as a level of width 1, so the slot and chain tables keep one meaning
    whatever was chosen. Every EXPLORE_EVERY-th pass (and the first EXPLORE_FIRST) uses the
    configured tree, so its wide slots stay measured. The choice depends only on the past: the
    sampler stays exact.
    """

    EXPLORE_FIRST = 4
    EXPLORE_EVERY = 32
    WIDE_SLOT_DECAY = 0.99
    RELATIVE_GAIN = 0.01  # the slot estimates are never exactly 0: a bigger pass must pay clearly
    SHRINK_GAIN = 0.15  # a narrower tree must promise this much more speed than the configured one

    def __init__(self, cost: CostCurve, trees: Sequence[Tuple[int, ...]], start: int = AUTO_START_WINDOW,
                 decay: float = 0.9, candidates: Sequence[int] = CANDIDATE_WINDOWS) -> None:
        self.trees = tuple(sorted(set(trees), key=lambda t: (TreeLevels(t).side_nodes(0), len(t))))
        self.full_tree = self.trees[-1]
        super().__init__(cost, extra_nodes=TreeLevels(self.full_tree).side_nodes(0), start=start, decay=decay,
                         candidates=candidates)
        # The wide slots forget more slowly than slot 0: most passes censor them, and only the
        # exploration passes measure them.
        self.slots = _SlotRanks(decay, wide_decay=self.WIDE_SLOT_DECAY)
        self.forward_costs = [[cost(1 + w + TreeLevels(t).side_nodes(0)) for w in self.candidates] for t in self.trees]
        self.passes = 0
        self.tree_choice = self.full_tree

    def next_tree(self) -> Tuple[int, ...]:
        return self.tree_choice

    def observe(self, accepted: int, censored: bool, window: int, tree_levels: int = 0,
                branch: Sequence[int] = (), widths: Sequence[int] = ()) -> None:
        """branch: the slot taken at each accepted depth; widths: the pass's tree."""
        self.passes += 1
        levels = min(len(self.full_tree), window)
        padded = (tuple(widths) + (1,) * levels)[:levels]
        self.slots.age()
        self.slots.add(padded, tuple(branch)[:levels], accepted)
        super().observe(accepted, censored, window, tree_levels=levels)  # the chain's run; _best_window
        explore = self.passes < self.EXPLORE_FIRST or self.passes % self.EXPLORE_EVERY == 0
        if explore:
            # the whole tree, and a window that reaches just past it, so no slot or level goes
            # unseen (no longer: carried drafts would keep a long window for many passes)
            self.tree_choice = self.full_tree
            self.window = max(self.window, min(self.candidates[-1], len(self.full_tree) + 1))

    def _main_survival(self, length: int) -> List[float]:
        """P(the main branch's first k drafts are all accepted), k = 0..length."""
        chain = self.chain.hazards(length, prior=0.5)
        levels = len(self.full_tree)
        survive, out = 1.0, [1.0]
        for k in range(length):
            survive *= self.slots.passed(k, 1) if k < levels else 1.0 - chain[k - levels]
            out.append(survive)
        return out

    def _best_window(self) -> int:
        prefix = list(itertools.accumulate(self._main_survival(max(self.candidates)), initial=0.0))
        widest = max((max(t) for t in self.trees if t), default=1)
        passed = [[self.slots.passed(d, w) for w in range(widest + 1)] for d in range(len(self.full_tree))]
        overhead = self.pass_overhead
        best_per_tree = []
        for tree, costs in zip(self.trees, self.forward_costs):
            through = [1.0]  # expected tokens through the tree's first d levels, d = 0..levels
            survive = 1.0
            for d, width in enumerate(tree):
                survive *= passed[d][width]
                through.append(through[-1] + survive)
            best, best_speed = self.candidates[0], -1.0
            for w, cost in zip(self.candidates, costs):  # shorter first: a longer window must pay
                levels = min(len(tree), w)
                # through the tree, then the chain after it (main-branch survival)
                expected = through[levels] + prefix[w + 1] - prefix[levels + 1]
                speed = expected / (cost + overhead)
                if speed > best_speed * (1.0 + self.RELATIVE_GAIN):
                    best, best_speed = w, speed
            best_per_tree.append((best_speed, best, tree))
        # The configured tree unless a narrower one is clearly faster: the estimate leaves out
        # what a tree does for the next pass (after a side-branch win the continued drafts were
        # verified in the right context), so a small estimated gain is not a real one. With the
        # configured tree, L is chosen as AutoWindow chooses it (its tree table, counted over
        # the same levels), so where trees stay whole this policy is AutoWindow.
        full_speed = best_per_tree[-1][0]
        speed, window, tree = max(best_per_tree[:-1], default=(-1.0, 0, self.full_tree))
        if speed <= full_speed * (1.0 + self.SHRINK_GAIN):
            self.tree_choice = self.full_tree
            return super()._best_window()
        self.tree_choice = tree
        return window

