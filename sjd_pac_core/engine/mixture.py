"""How much of the first draft behind a changed token comes from the mixture of the p's behind
every rejected candidate (`sampling.drafting.rejected_mixture`), the rest from the p behind the
rejected draft alone.

Which is better depends on the model: on the demo model the mixture's draft wins a third of the
time against a quarter, while on a chain whose next token is a shift of the last one (the
exactness tests' Markov chains) the p behind a wrong token points away from the right one and
the mixture makes it worse. So by default the run chooses: after every pass whose first draft
was redrawn, the next pass has computed the exact p at that position (its root's), and the
acceptance every weight of WEIGHTS would have had against it (`blend_acceptance`) is added to
a decayed score; the next redraw uses the best-scoring weight. Every weight is scored on every
such pass (no exploration), the choice is made on the device (no host sync), and it uses only
passes already verified, so the sampler stays exact.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from ..sampling.drafting import blend_acceptance

Weight = Union[float, torch.Tensor]


class FirstDraftMixture:
    """The mixture's weight: `fixed` (0: the paper's PAC, 1: all mixture), or None: the one of
    WEIGHTS the run's own passes score best (the module docstring)."""

    WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)  # a tie goes to the first: the paper's draft until measured
    DECAY = 0.98  # per scored pass: recent passes weigh more

    def __init__(self, fixed: Optional[float] = None) -> None:
        self.fixed = fixed
        self.score: Optional[torch.Tensor] = None  # [W] decayed acceptance per weight, on the device
        self.grid: Optional[torch.Tensor] = None  # WEIGHTS on the device, copied there once per run
        # the last redrawn first draft: its image position, the p behind the rejected draft, the mixture
        self.pending: Optional[Tuple[int, torch.Tensor, torch.Tensor]] = None

    @property
    def off(self) -> bool:
        return self.fixed == 0

    def weight(self, device: torch.device) -> Weight:
        """The weight for the next redraw (a 0-d device tensor when chosen by the run)."""
        if self.fixed is not None:
            return self.fixed
        weights = self.weights(device)
        return weights[0] if self.score is None else weights[torch.argmax(self.score)]

    def weights(self, device: torch.device) -> torch.Tensor:
        if self.grid is None or self.grid.device != device:
            self.grid = torch.tensor(self.WEIGHTS, device=device)
        return self.grid

    def drafted(self, position: int, row0: torch.Tensor, mixture: torch.Tensor) -> None:
        """A first draft at image `position` was redrawn from a blend of `row0` and `mixture` [V]."""
        if self.fixed is None:
            self.pending = (position, row0, mixture)

    def observe(self, start: int, root_p: torch.Tensor) -> None:
        """A pass starting at image position `start` computed `root_p` [V], the exact p there: score
        every weight on the last redrawn first draft if it was for that position."""
        pending, self.pending = self.pending, None
        if pending is None or pending[0] != start:
            return
        _, row0, mixture = pending
        accept = blend_acceptance(row0, mixture, root_p, self.weights(row0.device))
        self.score = accept if self.score is None else self.DECAY * self.score + accept
