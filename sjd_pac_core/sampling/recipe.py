"""The sampling recipe (spec section 1): logits -> the processed distribution p_t.

Every method (AR, SJD, SJD-PAC) calls `process` with the same arguments, so they all target the
same distribution. Order: CFG, position constraints, temperature, top-k, top-p, softmax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np
import torch

from ..config import ConfigError


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
    row_length: positions per image row (its end-of-line included), so that position i - row_length
    is the one above i; 0 when the positions are not a grid (drafting then uses no token above).
    """

    def __init__(
        self,
        vocab_size: int,
        num_tokens: int,
        allowed: Optional[torch.Tensor] = None,
        forced: Optional[torch.Tensor] = None,
        row_length: int = 0,
    ) -> None:
        self.vocab_size = vocab_size
        self.row_length = row_length
        self.num_tokens = num_tokens
        if allowed is None:
            allowed = torch.ones(vocab_size, dtype=torch.bool)
        allowed = allowed.to(torch.bool)
        if allowed.shape[-1] != vocab_size or allowed.dim() not in (1, 2):
            raise ConfigError(
                f"allowed_tokens must be a bool mask of shape [{vocab_size}] or [{num_tokens}, "
                f"{vocab_size}], got {tuple(allowed.shape)}."
            )
        if allowed.dim() == 2 and allowed.shape[0] != num_tokens:
            raise ConfigError(
                f"per-position allowed_tokens needs {num_tokens} rows (one per image token), got {allowed.shape[0]}."
            )
        if forced is None:
            forced = torch.full((num_tokens,), -1, dtype=torch.long)
        if forced.shape != (num_tokens,):
            raise ConfigError(f"forced tokens must have shape [{num_tokens}], got {tuple(forced.shape)}.")
        if int(forced.max()) >= vocab_size:
            raise ConfigError(f"a forced token id is outside the vocabulary of {vocab_size} tokens.")
        self.allowed = allowed
        self.forced = forced.to(torch.long)
        self.has_forced = bool((self.forced >= 0).any())
        if int(self.free_support_sizes().min()) < 1:
            raise ConfigError("allowed_tokens leaves a position with no allowed token; allow at least one.")

    @classmethod
    def from_user(
        cls,
        allowed_tokens: Union[None, torch.Tensor, np.ndarray, Sequence[int], "TokenConstraints"],
        vocab_size: int,
        num_tokens: int,
    ) -> "TokenConstraints":
        """Accept None, a mask, a list of token ids, or a ready TokenConstraints.

        A mask is any tensor, array or list of shape [V] or [num_tokens, V] whose values are all
        0/1 (or True/False), whatever its dtype: a float or uint8 0/1 mask means the same as a
        bool one. Anything else must be a 1-D collection of whole-number token ids in 0..V-1.
        (A list of exactly V ids that are all 0 or 1 is read as a mask: pass a bool mask or
        fewer ids to mean ids 0 and 1.)
        """
        if isinstance(allowed_tokens, TokenConstraints):
            if allowed_tokens.vocab_size != vocab_size or allowed_tokens.num_tokens != num_tokens:
                raise ConfigError(
                    f"allowed_tokens (TokenConstraints) was built for vocabulary {allowed_tokens.vocab_size} "
                    f"and {allowed_tokens.num_tokens} tokens, but sampling uses {vocab_size} and {num_tokens}; "
                    "build the constraints for this model and size."
                )
            return allowed_tokens
        if allowed_tokens is None:
            return cls(vocab_size, num_tokens)
        values = _as_tensor(allowed_tokens)
        if values.numel() == 0:
            raise ConfigError("allowed_tokens is empty; pass at least one token id, a mask, or None.")
        is_01 = bool(((values == 0) | (values == 1)).all())
        if values.dtype == torch.bool or (is_01 and values.shape[-1] == vocab_size and values.dim() in (1, 2)):
            return cls(vocab_size, num_tokens, allowed=values.to(torch.bool))
        if values.dim() != 1:
            raise ConfigError(
                f"allowed_tokens of shape {tuple(values.shape)} is neither a mask of shape [{vocab_size}] or "
                f"[{num_tokens}, {vocab_size}] nor a 1-D list of token ids; pass one of those."
            )
        if values.is_floating_point():
            if not bool((values == values.round()).all()):
                raise ConfigError(
                    "allowed_tokens holds fractional numbers; pass whole-number token ids or a 0/1 mask "
                    f"of length {vocab_size}."
                )
        elif values.dtype.is_complex:
            raise ConfigError("allowed_tokens holds complex numbers; pass token ids or a bool mask.")
        ids = values.long()
        if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
            raise ConfigError(
                f"allowed_tokens has ids outside 0..{vocab_size - 1}; pass ids of the sampler's token space "
                f"or a mask of length {vocab_size}."
            )
        mask = torch.zeros(vocab_size, dtype=torch.bool)
        mask[ids.cpu()] = True
        return cls(vocab_size, num_tokens, allowed=mask)

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


def _as_tensor(values: object) -> torch.Tensor:
    """A tensor, numpy array or (nested) sequence of numbers or bools as a CPU tensor."""
    if isinstance(values, torch.Tensor):
        return values.detach().cpu()
    try:
        if isinstance(values, np.ndarray):
            return torch.from_numpy(np.ascontiguousarray(values))
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
            raise TypeError
        return torch.as_tensor([v.item() if isinstance(v, np.generic) else v for v in values])
    except (TypeError, ValueError, RuntimeError):
        raise ConfigError(
            f"allowed_tokens must be None, a bool mask, a list of token ids or TokenConstraints, got "
            f"{type(values).__name__}; pass one of those."
        ) from None


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
    Returns float32 probabilities [S, V]: the softmax of `processed_logits`.
    """
    return torch.softmax(processed_logits(logits, positions, recipe, constraints), dim=-1)


def processed_logits(
    logits: torch.Tensor,
    positions: torch.Tensor,
    recipe: SamplingRecipe,
    constraints: TokenConstraints,
) -> torch.Tensor:
    """The recipe's logits for each row, before the softmax: guided, restricted to the allowed
    tokens, tempered and filtered; float32 [S, V], -inf where a token is dropped. log p differs
    from them by a constant per row, which is all a Gumbel argmax needs."""
    guided = classifier_free_guidance(logits.float(), recipe.cfg_scale)
    guided = guided.masked_fill(~constraints.mask(positions), float("-inf"))
    guided = guided / recipe.temperature
    if recipe.top_k is not None:
        guided = top_k_filter(guided, recipe.top_k)
    if recipe.top_p is not None:
        guided = top_p_filter(guided, recipe.top_p)
    return guided
