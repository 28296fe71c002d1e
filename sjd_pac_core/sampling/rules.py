"""The two verification rules as small strategy objects over the pure functions in verify.py.

Both expose the same operations, so the loop never branches on the rule:
  prepare(start)                           the pass verifies positions from `start` on (host int)
  draw(p, positions)                       a token from each row of p (first token, bonus, redraft)
  chain(p, q, drafts, positions)           accept flags and replacement tokens for drafts ~ q
  level(p, q, candidates, valid, positions) PD: first accepted candidate per parent row, fallback
  candidates(q, first, k, position)        PD candidates: `first`, then k-1 more without
                                           replacement, and which of the k slots are real
Every operation stays on the device: no host sync.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from .seeds import reduce_seed
from .verify import (
    candidate_validity,
    first_true,
    gumbel_argmax,
    gumbel_noise,
    gumbel_top_k,
    recursive_rejection_rows,
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

    def prepare(self, start: int) -> None:
        pass

    def draw(self, p: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return sample(p, self.generator)

    def chain(
        self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, positions: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        accepted = speculative_accept(p, q, drafts, self._uniform(drafts.shape, p.device))
        replacements = sample(residual(p, q), self.generator)
        return accepted, replacements

    def level(
        self, p: torch.Tensor, q: torch.Tensor, candidates: torch.Tensor, valid: torch.Tensor,
        positions: torch.Tensor,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        accept_prob, final = recursive_rejection_rows(p, q, candidates, valid)
        coins = self._uniform(accept_prob.shape, p.device)
        return first_true(coins < accept_prob), sample(final, self.generator)

    def candidates(
        self, q: torch.Tensor, first: torch.Tensor, k: int, position: int
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        first = first.reshape(1)  # a 1-element index: advanced indexing, no host sync
        others = sample_without_replacement(q, k - 1, first, self.generator)
        return torch.cat([first, others]), candidate_validity(q, k)


class GumbelNoiseWindow:
    """The Gumbel noise of the positions a pass may touch, hashed once per position and run.

    Holds the noise of positions [base, base + 2 * chunk) with chunk >= the largest pass span,
    so every position of a pass starting at `start` is inside once prepare(start) has run.
    Moving on by a chunk reuses the upper half: each position is hashed about once per run.
    """

    def __init__(self, seed: int, vocab_size: int, num_tokens: int, span: int, device) -> None:
        self.seed, self.vocab_size, self.num_tokens = seed, vocab_size, num_tokens
        self.chunk = max(int(span), 16)
        self.device = device
        self.base: Optional[int] = None
        self.noise: Optional[torch.Tensor] = None

    def _hash(self, first: int, last: int) -> torch.Tensor:
        positions = torch.arange(first, max(first, min(last, self.num_tokens)), device=self.device)
        return gumbel_noise(self.seed, positions, self.vocab_size)

    def prepare(self, start: int) -> None:
        base = (start // self.chunk) * self.chunk
        if base == self.base:
            return
        if self.base is not None and base == self.base + self.chunk:
            upper = self.noise[self.chunk :]
            self.noise = torch.cat([upper, self._hash(base + self.chunk, base + 2 * self.chunk)])
        else:
            self.noise = self._hash(base, base + 2 * self.chunk)
        self.base = base

    def rows(self, positions: torch.Tensor) -> torch.Tensor:
        return self.noise.index_select(0, positions - self.base)

    def row(self, position: int) -> torch.Tensor:
        return self.noise[position - self.base : position - self.base + 1]


class GumbelRule:
    """Seed-exact: token_t = argmax(log p_t + G_t) with G_t fixed by (seed, t).

    A draft is accepted exactly when it equals that argmax under the exact p, so every method
    commits the same tokens as plain AR with the same seed. With a noise window (the sampler's
    case) the noise is hashed once per position; without one, on every call.
    """

    def __init__(self, seed: int, vocab_size: int, window: Optional[GumbelNoiseWindow] = None) -> None:
        self.seed = seed
        self.vocab_size = vocab_size
        self.window = window

    def prepare(self, start: int) -> None:
        if self.window is not None:
            self.window.prepare(start)

    def _noise(self, positions: torch.Tensor) -> torch.Tensor:
        if self.window is not None and self.window.base is not None:
            return self.window.rows(positions)
        return gumbel_noise(self.seed, positions, self.vocab_size)

    def draw(self, p: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return gumbel_argmax(p, self._noise(positions))

    def chain(
        self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, positions: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        target = self.draw(p, positions)
        return drafts == target, target

    def level(
        self, p: torch.Tensor, q: torch.Tensor, candidates: torch.Tensor, valid: torch.Tensor,
        positions: torch.Tensor,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        target = self.draw(p, positions)
        return first_true((candidates == target.unsqueeze(-1)) & valid), target

    def candidates(
        self, q: torch.Tensor, first: torch.Tensor, k: int, position: int
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        # The draft `first` is already argmax(log q + G); the top-k keeps it first.
        if self.window is not None and self.window.base is not None:
            noise = self.window.row(position)
        else:
            noise = gumbel_noise(self.seed, torch.tensor([position], device=q.device), self.vocab_size)
        return gumbel_top_k(q.unsqueeze(0), noise, k)[0], candidate_validity(q, k)


def make_rule(
    verify: str, seed: int, vocab_size: int, device: torch.device,
    num_tokens: Optional[int] = None, span: Optional[int] = None,
) -> Union[RejectionRule, GumbelRule]:
    """The rule for `verify`. With num_tokens and span (the most positions one pass touches),
    the Gumbel rule keeps a noise window instead of re-hashing the noise on every call."""
    seed = reduce_seed(seed)  # one seed domain for both rules (seeds.py)
    if verify == "gumbel":
        window = None
        if num_tokens is not None and span is not None:
            window = GumbelNoiseWindow(seed, vocab_size, num_tokens, span, device)
        return GumbelRule(seed, vocab_size, window)
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return RejectionRule(generator)
