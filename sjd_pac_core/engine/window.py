"""Window policies: how many drafts to verify in the next pass.

`FixedWindow` is the paper's constant L. `AutoWindow` (window="auto") picks L to maximise
expected tokens per second: expected tokens per pass from the acceptance seen so far in this run,
divided by the forward cost of a pass of that size, measured once per model and device. The
choice depends only on the past, and every draft keeps its known q, so the sampler stays exact
whatever L it picks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..models.base import DecoderSession, TokenModel

PROBE_SIZES: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128)
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
    def __init__(self, window: int) -> None:
        self.window = window

    def next_window(self) -> int:
        return self.window

    def observe(self, accepted: int, censored: bool, window: int, **tree) -> None:
        pass


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

    def hazards(self, prior: float = 0.5) -> Callable[[int], float]:
        """k -> hazard at k; where too little is seen, the tail hazard (else `prior`)."""
        tail = self.tail_hazard()
        tail = prior if tail is None else tail
        tail = min(max(tail, 0.02), 1.0)

        def hazard(k: int) -> float:
            if k < len(self.at_risk) and self.at_risk[k] > 0.5:
                return self.events[k] / self.at_risk[k]
            return tail
        return hazard


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

    @property
    def at_risk(self) -> List[float]:
        return self.chain.at_risk

    @property
    def events(self) -> List[float]:
        return self.chain.events

    def next_window(self) -> int:
        return self.window

    def observe(self, accepted: int, censored: bool, window: int, tree_levels: int = 0) -> None:
        """accepted, censored: the pass's accepted drafts and whether it ended without a
        rejection; window: its drafts; tree_levels: its PD levels (the first drafts)."""
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
        tree_mean = self.tree.mean_hazard()
        tree = self.tree.hazards()
        chain = self.chain.hazards(prior=0.5 if tree_mean is None else tree_mean)
        levels = min(self.levels, window)
        survive, total = 1.0, 1.0
        for k in range(window):
            survive *= 1.0 - (tree(k) if k < levels else chain(k - levels))
            total += survive
        return total

    def _best_window(self) -> int:
        def speed(w: int) -> float:
            return self.expected_tokens(w) / self.cost(1 + w + self.extra_nodes)

        best, best_speed = self.candidates[0], speed(self.candidates[0])
        for w in self.candidates[1:]:  # ascending: a longer window must pay for itself
            if speed(w) > best_speed * (1.0 + self.RELATIVE_GAIN):
                best, best_speed = w, speed(w)
        return best
