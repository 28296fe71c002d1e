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
from typing import Dict, List, Sequence, Tuple

import torch

from ..models.base import DecoderSession, TokenModel

PROBE_SIZES: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128)
CANDIDATE_WINDOWS: Tuple[int, ...] = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96)


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


_COST_CACHE: Dict[Tuple[int, str], CostCurve] = {}


def measure_cost_curve(
    model: TokenModel, session: DecoderSession, root: torch.Tensor, sizes: Sequence[int] = PROBE_SIZES, repeats: int = 2
) -> CostCurve:
    """Time chain passes of each size on the live session, then drop them from the cache.

    Cached per model and device: the curve is a property of the hardware and model shape.
    """
    key = (id(getattr(model, "model", model)), str(model.device))  # the network, not its wrapper
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

    def observe(self, accepted: int, censored: bool, window: int) -> None:
        pass


class AutoWindow:
    """Chooses L from a survival estimate of the accepted run length and the cost curve.

    With A the drafts a pass accepts before its first rejection, a pass of window L commits
    about 1 + sum_{k=1..L} P(A >= k) tokens. P(A >= k) comes from the hazard
    P(A = k | A >= k), counted over this run's passes (recent passes weigh more, since drafts
    improve as the image fills in); beyond the longest window seen, the mean hazard extrapolates.
    """

    def __init__(self, cost: CostCurve, extra_nodes: int = 0, start: int = 16, decay: float = 0.9,
                 candidates: Sequence[int] = CANDIDATE_WINDOWS) -> None:
        self.cost = cost
        self.extra_nodes = extra_nodes  # PD side-branch nodes a pass may carry
        self.window = start
        self.decay = decay
        self.candidates = tuple(candidates)
        self.at_risk: List[float] = []  # weighted passes with A >= k, seen at position k
        self.events: List[float] = []  # weighted passes with A == k (rejected there)

    def next_window(self) -> int:
        return self.window

    def observe(self, accepted: int, censored: bool, window: int) -> None:
        self.at_risk = [w * self.decay for w in self.at_risk]
        self.events = [w * self.decay for w in self.events]
        reach = min(accepted, window) + (0 if censored else 1)
        while len(self.at_risk) < reach:
            self.at_risk.append(0.0)
            self.events.append(0.0)
        for k in range(reach):  # a short list per pass (<= L entries), off the tensor path
            self.at_risk[k] += 1.0
        if not censored and accepted < len(self.events):
            self.events[accepted] += 1.0
        self.window = self._best_window()

    def expected_tokens(self, window: int) -> float:
        hazards = [e / r for e, r in zip(self.events, self.at_risk) if r > 0.5]
        tail = sum(hazards) / len(hazards) if hazards else 0.5
        tail = min(max(tail, 0.02), 1.0)
        survive, total = 1.0, 1.0
        for k in range(window):
            h = self.events[k] / self.at_risk[k] if k < len(self.at_risk) and self.at_risk[k] > 0.5 else tail
            survive *= 1.0 - h
            total += survive
        return total

    def _best_window(self) -> int:
        def speed(w: int) -> float:
            return self.expected_tokens(w) / self.cost(1 + w + self.extra_nodes)

        return max(self.candidates, key=speed)
