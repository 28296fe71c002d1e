"""The two verification rules as small strategy objects over the pure functions in verify.py.

Both expose the same four operations, so the loop never branches on the rule:
  draw(p, positions)                  a token from each row of p (first token, bonus, redraft)
  chain(p, q, drafts, positions)      accept flags and replacement tokens for drafts ~ q
  level(p_parents, q, candidates, t)  PD level: first accepted candidate per parent, fallback
  candidates(q, first, k, t)          PD candidates: `first`, then k-1 more without replacement
"""

from __future__ import annotations

from typing import Tuple, Union

import torch

from .seeds import reduce_seed
from .verify import (
    first_true,
    gumbel_argmax,
    gumbel_noise,
    gumbel_top_k,
    recursive_rejection_steps,
    residual,
    sample,
    sample_without_replacement,
    speculative_accept,
)


class RejectionRule:
    """Speculative rejection sampling; exact in distribution."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def _uniform(self, shape, device) -> torch.Tensor:
        return torch.rand(shape, generator=self.generator, device=device)

    def draw(self, p: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return sample(p, self.generator)

    def chain(
        self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, positions: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        accepted = speculative_accept(p, q, drafts, self._uniform(drafts.shape, p.device))
        replacements = sample(residual(p, q), self.generator)
        return accepted, replacements

    def level(
        self, p_parents: torch.Tensor, q: torch.Tensor, candidates: torch.Tensor, position: int
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        accept_prob, final = recursive_rejection_steps(p_parents, q, candidates)
        coins = self._uniform(accept_prob.shape, p_parents.device)
        return first_true(coins < accept_prob), sample(final, self.generator)

    def candidates(self, q: torch.Tensor, first: torch.Tensor, k: int, position: int) -> torch.Tensor:
        others = sample_without_replacement(q, k - 1, first, self.generator)
        return torch.cat([first.reshape(1), others])


class GumbelRule:
    """Seed-exact: token_t = argmax(log p_t + G_t) with G_t fixed by (seed, t).

    A draft is accepted exactly when it equals that argmax under the exact p, so every method
    commits the same tokens as plain AR with the same seed.
    """

    def __init__(self, seed: int, vocab_size: int) -> None:
        self.seed = seed
        self.vocab_size = vocab_size

    def _noise(self, positions: torch.Tensor) -> torch.Tensor:
        return gumbel_noise(self.seed, positions, self.vocab_size)

    def draw(self, p: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return gumbel_argmax(p, self._noise(positions))

    def chain(
        self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, positions: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        target = self.draw(p, positions)
        return drafts == target, target

    def level(
        self, p_parents: torch.Tensor, q: torch.Tensor, candidates: torch.Tensor, position: int
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        pos = torch.full((p_parents.shape[0],), position, device=p_parents.device)
        target = self.draw(p_parents, pos)
        return first_true(candidates.unsqueeze(0) == target.unsqueeze(-1)), target

    def candidates(self, q: torch.Tensor, first: torch.Tensor, k: int, position: int) -> torch.Tensor:
        # The draft `first` is already argmax(log q + G); the top-k keeps it first.
        pos = torch.tensor([position], device=q.device)
        return gumbel_top_k(q.unsqueeze(0), self._noise(pos), k)[0]


def make_rule(
    verify: str, seed: int, vocab_size: int, device: torch.device
) -> Union[RejectionRule, GumbelRule]:
    seed = reduce_seed(seed)  # one seed domain for both rules (seeds.py)
    if verify == "gumbel":
        return GumbelRule(seed, vocab_size)
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return RejectionRule(generator)

