"""The first draft behind a changed token: a blend of three proposals, weighted as the run's own
passes score best.

* row 0: the p behind the rejected draft (what Adaptive Continuation carries on from);
* the rejected mixture: the p's behind every rejected candidate, averaged in proportion to the
  p that rejected them (`sampling.drafting.rejected_mixture`);
* the neighbour law: the run's average p behind the token to the left and below the token above
  (`engine/neighbour_laws.py`), where the model's vocabulary lets the run keep it.

q = lerp(lerp(row 0, mixture, w_mixture), law, w_law). Which weights are best depends on the
model: on the demo model the mixture's draft wins a third of the time against a quarter, and the
law more often still, while on a chain whose next token is a shift of the last one (the exactness
tests' Markov chains) the p behind a wrong token points away from the right one and the mixture
makes it worse. So by default the run chooses: after every pass whose first draft was redrawn, the
next pass has computed the exact p at that position (its root's), and the acceptance every pair of
weights would have had against it (`blend_acceptance`) is added to a decayed score; the next
redraw uses the best-scoring pair. Every pair is scored on every such pass (no exploration), the
choice is made on the device (no host sync), and it uses only passes already verified, so the
sampler stays exact.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from ..sampling.drafting import blend_acceptance, first_draft_blend
from .neighbour_laws import NeighbourLaws, make_laws

Weight = Union[float, torch.Tensor]


class FirstDraftMixture:
    """The weights of the first draft's blend: `fixed` for the rejected mixture (0: the paper's
    PAC, 1: all mixture) and `fixed_law` for the neighbour law, or None: the pair of WEIGHTS the
    run's own passes score best (the module docstring). `fixed_law=0` leaves the law out."""

    WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)  # a tie goes to the first: the paper's draft until measured
    DECAY = 0.98  # per scored pass: recent passes weigh more

    def __init__(self, fixed: Optional[float] = None, fixed_law: Optional[float] = None) -> None:
        self.fixed = fixed
        self.fixed_law = fixed_law
        self.laws: Optional[NeighbourLaws] = None  # made on the first pass (it needs the vocabulary)
        self.score: Optional[torch.Tensor] = None  # [W, W] decayed acceptance per pair, on the device
        self.grids: Optional[Tuple[torch.Tensor, torch.Tensor]] = None  # the weights on the device, once per run
        # the last redrawn first draft: its image position and its three proposals
        self.pending: Optional[Tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = None

    @property
    def off(self) -> bool:
        return self.fixed == 0 and self.fixed_law == 0

    def learn(self, tokens: torch.Tensor, positions: torch.Tensor, p: torch.Tensor, committed: torch.Tensor,
              num_committed: int, row_length: int) -> None:
        """Add a verified pass's p's to the neighbour laws (NeighbourLaws.add)."""
        if self.fixed_law == 0:
            return
        if self.laws is None:
            self.laws = make_laws(int(p.shape[-1]), row_length, p.device)
            if self.laws is None:  # too large a vocabulary: the blend keeps to the other two
                self.fixed_law, self.grids = 0.0, None
                return
        self.laws.add(tokens, positions, p, committed, num_committed)

    def law(self, position: int, committed: torch.Tensor, allowed: torch.Tensor,
            fallback: torch.Tensor) -> torch.Tensor:
        """The neighbour law at `position`, or `fallback` where the run has none (yet)."""
        if self.laws is None:
            return fallback
        law, seen = self.laws.law(position, committed, allowed)
        return torch.where(seen, law.to(fallback.dtype), fallback)

    def weights(self, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        """The candidate weights for the mixture and for the law (a fixed one alone)."""
        if self.grids is None or self.grids[0].device != device:
            def grid(fixed: Optional[float]) -> torch.Tensor:
                return torch.tensor(self.WEIGHTS if fixed is None else (fixed,), device=device)
            self.grids = (grid(self.fixed), grid(self.fixed_law))
        return self.grids

    def weight(self, device: torch.device) -> Tuple[Weight, Weight]:
        """(w_mixture, w_law) for the next redraw (0-d device tensors when chosen by the run)."""
        mixture_weights, law_weights = self.weights(device)
        if self.score is None:
            return mixture_weights[0], law_weights[0]
        best = torch.argmax(self.score)  # flat over [mixture, law]
        return mixture_weights[best // law_weights.shape[0]], law_weights[best % law_weights.shape[0]]

    def blend(self, row0: torch.Tensor, mixture: torch.Tensor, law: torch.Tensor) -> torch.Tensor:
        """The first draft's q [V] at the current weights."""
        return first_draft_blend(row0, mixture, law, *self.weight(row0.device))

    def drafted(self, position: int, row0: torch.Tensor, mixture: torch.Tensor, law: torch.Tensor) -> None:
        """A first draft at image `position` was redrawn from a blend of these three [V]."""
        if self.fixed is None or self.fixed_law is None:
            self.pending = (position, row0, mixture, law)

    def observe(self, start: int, root_p: torch.Tensor) -> None:
        """A pass starting at image position `start` computed `root_p` [V], the exact p there: score
        every pair of weights on the last redrawn first draft if it was for that position."""
        pending, self.pending = self.pending, None
        if pending is None or pending[0] != start:
            return
        _, row0, mixture, law = pending
        accept = blend_acceptance(row0, mixture, law, root_p, *self.weights(row0.device))
        self.score = accept if self.score is None else self.DECAY * self.score + accept
