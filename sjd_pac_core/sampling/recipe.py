"""The sampling recipe (spec section 1): logits -> the processed distribution p_t.

Every method (AR, SJD, SJD-PAC) calls `process` with the same arguments, so they all target the
same distribution. Order: CFG, position constraints, temperature, top-k, top-p, softmax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch


@dataclass(frozen=True)
class SamplingRecipe:
    cfg_scale: float = 1.0
    temperature: float = 1.0
    top_k: Optional[int] = None
    top_p: Optional[float] = None


class TokenConstraints:
    """Which tokens each image position may take.

    allowed: bool [V] (the same set at every free position) or bool [N, V] (per position).
    forced:  long [N], the token forced at a position (an end-of-line, say) or -1 where free.
    A forced position's distribution is one-hot, so its draft is always accepted.
    """

    def __init__(
        self,
        vocab_size: int,
        num_tokens: int,
        allowed: Optional[torch.Tensor] = None,
        forced: Optional[torch.Tensor] = None,
    ) -> None:
        self.vocab_size = vocab_size
        self.num_tokens = num_tokens
        if allowed is None:
            allowed = torch.ones(vocab_size, dtype=torch.bool)
        allowed = allowed.to(torch.bool)
        if allowed.shape[-1] != vocab_size or allowed.dim() not in (1, 2):
            raise ValueError(
                f"allowed_tokens must be a bool mask of shape [{vocab_size}] or [{num_tokens}, "
                f"{vocab_size}], got {tuple(allowed.shape)}."
            )
        if allowed.dim() == 2 and allowed.shape[0] != num_tokens:
            raise ValueError(
                f"per-position allowed_tokens needs {num_tokens} rows, got {allowed.shape[0]}."
            )
        if forced is None:
            forced = torch.full((num_tokens,), -1, dtype=torch.long)
        if forced.shape != (num_tokens,):
            raise ValueError(f"forced tokens must have shape [{num_tokens}], got {tuple(forced.shape)}.")
        if int(forced.max()) >= vocab_size:
            raise ValueError(f"a forced token id is outside the vocabulary of {vocab_size} tokens.")
        self.allowed = allowed
        self.forced = forced.to(torch.long)
        self.has_forced = bool((self.forced >= 0).any())
        if int(self.free_support_sizes().min()) < 1:
            raise ValueError("allowed_tokens leaves a position with no allowed token; allow at least one.")

    @classmethod
    def from_user(
        cls,
        allowed_tokens: Union[None, torch.Tensor, Sequence[int], "TokenConstraints"],
        vocab_size: int,
        num_tokens: int,
    ) -> "TokenConstraints":
        """Accept None, a bool mask, a list of token ids, or a ready TokenConstraints."""
        if isinstance(allowed_tokens, TokenConstraints):
            if allowed_tokens.vocab_size != vocab_size or allowed_tokens.num_tokens != num_tokens:
                raise ValueError(
                    f"constraints were built for vocabulary {allowed_tokens.vocab_size} and "
                    f"{allowed_tokens.num_tokens} tokens, but sampling uses {vocab_size} and {num_tokens}."
                )
            return allowed_tokens
        if allowed_tokens is None:
            return cls(vocab_size, num_tokens)
        if not isinstance(allowed_tokens, torch.Tensor):
            ids = torch.as_tensor(list(allowed_tokens), dtype=torch.long)
            if ids.numel() == 0:
                raise ValueError("allowed_tokens is empty; pass at least one token id or None.")
            if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
                raise ValueError(f"allowed_tokens has ids outside 0..{vocab_size - 1}.")
            mask = torch.zeros(vocab_size, dtype=torch.bool)
            mask[ids] = True
            return cls(vocab_size, num_tokens, allowed=mask)
        if allowed_tokens.dtype != torch.bool:
            return cls.from_user(allowed_tokens.tolist(), vocab_size, num_tokens)
        return cls(vocab_size, num_tokens, allowed=allowed_tokens)

    def to(self, device: torch.device) -> "TokenConstraints":
        out = TokenConstraints.__new__(TokenConstraints)
        out.vocab_size, out.num_tokens = self.vocab_size, self.num_tokens
        out.allowed, out.forced = self.allowed.to(device), self.forced.to(device)
        out.has_forced = self.has_forced
        return out

    def free_support_sizes(self) -> torch.Tensor:
        return self.allowed.sum(-1).reshape(-1)

    def mask(self, positions: torch.Tensor) -> torch.Tensor:
        """Bool [S, V]: the tokens allowed at each of `positions` (image-token indices)."""
        allowed = self.allowed[positions] if self.allowed.dim() == 2 else self.allowed.expand(
            positions.shape[0], -1
        )
        if not self.has_forced:
            return allowed
        forced = self.forced[positions]
        forced_mask = torch.nn.functional.one_hot(forced.clamp(min=0), self.vocab_size).bool()
        return torch.where((forced >= 0).unsqueeze(-1), forced_mask, allowed)

    def min_free_support(self) -> int:
        """Smallest number of tokens any free position allows (bounds the tree width K)."""
        sizes = self.free_support_sizes()
        return int(sizes.min())


def classifier_free_guidance(logits: torch.Tensor, cfg_scale: float) -> torch.Tensor:
    """[B, S, V] -> [S, V]. Row 0 is conditional, row 1 unconditional: l_u + s (l_c - l_u)."""
    if logits.shape[0] == 1 or cfg_scale == 1.0:
        return logits[0]
    cond, uncond = logits[0], logits[1]
    return uncond + cfg_scale * (cond - uncond)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest finite logits of each row (all of them where fewer are finite)."""
    if k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (always >= 1)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def process(
    logits: torch.Tensor,
    positions: torch.Tensor,
    recipe: SamplingRecipe,
    constraints: TokenConstraints,
) -> torch.Tensor:
    """The processed distribution p for each row.

    logits: [B, S, V] raw model logits (B = 2 with CFG: conditional row, unconditional row).
    positions: long [S], the image-token index each row is a prediction for.
    Returns float32 probabilities [S, V].
    """
    guided = classifier_free_guidance(logits.float(), recipe.cfg_scale)
    guided = guided.masked_fill(~constraints.mask(positions), float("-inf"))
    guided = guided / recipe.temperature
    if recipe.top_k is not None:
        guided = top_k_filter(guided, recipe.top_k)
    if recipe.top_p is not None:
        guided = top_p_filter(guided, recipe.top_p)
    return torch.softmax(guided, dim=-1)
