"""Verification maths (spec sections 2-4), as small pure functions on tensors.

Notation as in the paper: p is the target (the model's processed distribution in the right
context), q is the distribution a draft token was really drawn from.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch

# Residual mass below this is rounding noise: p and q are equal, so a rejection could only come
# from float error and the residual is p itself.
_RESIDUAL_EPS = 1e-12


def compute_dtype(device: torch.device) -> torch.dtype:
    """The float type of the sampler's random draws: float64, or float32 where the device has no
    float64 (Apple MPS). Both are exact: the float32 path uses 23-bit uniforms strictly inside
    (0, 1), so no Gumbel key is ever infinite; it draws other numbers for a seed than float64."""
    return torch.float32 if torch.device(device).type == "mps" else torch.float64


def _tiny(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).tiny


def accept_probability(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """min(1, p(x) / q(x)) for a draft x drawn from q (q(x) > 0)."""
    return torch.clamp(p_x / q_x, max=1.0)


def residual(p: torch.Tensor, q: torch.Tensor, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
    """normalize(max(p - q, 0)) over the last axis: what to draw from after a rejection. A row
    left with (almost) no mass stays p, as does a row `rows` (bool [..., 1]) leaves out: the
    same one select."""
    diff = torch.clamp(p - q, min=0.0)
    mass = diff.sum(-1, keepdim=True)
    take = mass > _RESIDUAL_EPS if rows is None else (mass > _RESIDUAL_EPS) & rows
    return torch.where(take, diff / mass.clamp(min=_RESIDUAL_EPS), p)


def speculative_accept(
    p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor, uniforms: torch.Tensor
) -> torch.Tensor:
    """Bool [M]: accept draft tokens[j] ~ q[j] against p[j] with coin uniforms[j] in [0, 1).

    u < p(x)/q(x), written as u q(x) < p(x) so that no division is needed.
    """
    idx = tokens.unsqueeze(-1)
    p_x = p.gather(-1, idx).squeeze(-1)
    q_x = q.gather(-1, idx).squeeze(-1)
    return uniforms * q_x < p_x


def first_true(flags: torch.Tensor) -> torch.Tensor:
    """Index of the first True along the last axis, or -1 where there is none (argmax returns
    the first of equal maxima)."""
    return torch.where(flags.any(-1), flags.long().argmax(-1), -1)


def sample(probs: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    """One categorical draw per row of probs [..., V] (inverse CDF; faster than multinomial).

    searchsorted(right=True) skips zero-probability tokens even where u lands on a flat step.
    """
    cdf = probs.cumsum(-1)
    u = torch.rand(probs.shape[:-1] + (1,), generator=generator, device=probs.device, dtype=cdf.dtype)
    idx = torch.searchsorted(cdf, u * cdf[..., -1:], right=True)
    return idx.squeeze(-1).clamp(max=probs.shape[-1] - 1)


def _gumbel_keys(q: torch.Tensor, exclude: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    """log q + Gumbel noise from `generator`, -inf at the `exclude` indices of each row (scatter
    index, shaped like q[..., :m]): their top-k is a draw of k without replacement."""
    dtype = compute_dtype(q.device)
    logq = torch.log(q).to(dtype).scatter(-1, exclude, float("-inf"))
    u = torch.rand(q.shape, generator=generator, device=q.device, dtype=dtype)
    return logq - torch.log(-torch.log(u.clamp(min=_tiny(dtype))))


def sample_without_replacement_rows(
    q: torch.Tensor, first: torch.Tensor, k: int, generator: Optional[torch.Generator]
) -> torch.Tensor:
    """Per row of q [T, V]: `first` (drawn from it), then k - 1 more without replacement: long
    [T, k], in one Gumbel top-k over all rows (Gumbel top-k on log q is exactly a sequential
    draw without replacement: Plackett-Luce). Rows with fewer than k tokens of support get
    arbitrary extra slots, which `candidate_validity` marks as padding."""
    if k <= 1:
        return first.unsqueeze(-1)
    keys = _gumbel_keys(q, first.unsqueeze(-1), generator)
    return torch.cat([first.unsqueeze(-1), torch.topk(keys, k - 1, dim=-1).indices], -1)


# ---------------------------------------------------------------------------------------------
# The seed-exact (Gumbel) rule: token_t = argmax(log p_t + G_t), G_t a function of (seed, t).

_MASK32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (lowbias32) on int64 tensors; identical on every device."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def gumbel_noise(seed: int, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Standard Gumbel noise [S, V] for image positions `positions`, from (seed, position) alone.

    A counter-based hash, so the noise of position t never depends on how many tokens were
    drawn before it: the property that makes AR, SJD and SJD-PAC pick the same tokens.
    """
    device = positions.device
    seed_key = _mix32(torch.tensor([seed & _MASK32, (seed >> 32) & _MASK32], device=device))
    base = _mix32(seed_key[0] ^ _mix32(seed_key[1] + 0x3C6EF372))
    pos_key = _mix32(base ^ _mix32(positions.long() * 0x9E3779B9 + 0x7F4A7C15))  # [S]
    vocab_key = _mix32(torch.arange(vocab_size, device=device, dtype=torch.long) + 0x632BE5AB)
    bits = _mix32(pos_key.unsqueeze(-1) ^ vocab_key.unsqueeze(0))
    bits = _mix32(bits + pos_key.unsqueeze(-1))
    if compute_dtype(device) == torch.float64:
        u = (bits.double() + 0.5) / 4294967296.0
    else:  # the top 23 bits: (k + 0.5) / 2^23 is exact in float32 and strictly inside (0, 1)
        u = ((bits >> 9).float() + 0.5) / 8388608.0
    return (-torch.log(-torch.log(u))).float()


# The least positive float32 (its log is -103.3).
_LEAST_POSITIVE = float(np.nextafter(np.float32(0), np.float32(1)))


def gumbel_argmax(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """argmax(log p + G) over the last axis: an exact draw from p when G is Gumbel noise.

    The zeros of p are raised to the least positive float before the log (a CPU's log takes
    about 30 times longer on zeros than on positive numbers, and p is zero wherever the
    vocabulary is masked). The argmax is the same: a row of p sums to 1, so its largest entry
    is at least 1 / V, and the noise lies within (-4, 23) (gumbel_noise's uniforms), so
    log(1 / V) - 4 stays above -103.3 + 23 for any vocabulary under 10^33 tokens. The index
    comes from max, which returns the first on ties as argmax does, and runs about 3 times
    faster on a CPU over a pass's [nodes, V]."""
    return gumbel_argmax_of_logs(torch.log(probs.clamp(min=_LEAST_POSITIVE)), noise)


def gumbel_argmax_of_logs(log_weights: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """gumbel_argmax from log weights (-inf for none), which need not be normalised: a row's
    constant moves no argmax. A model's processed logits are such weights for its p, so a
    target needs no log of p (`sampling.recipe.processed_logits`)."""
    return (log_weights + noise).max(-1).indices


def gumbel_top_k_of_logs(log_weights: torch.Tensor, noise: torch.Tensor, k: int) -> torch.Tensor:
    """The k largest log w + G: a draw of k without replacement from w normalised (the first is
    gumbel_argmax). The log weights (-inf for none) need not be normalised: a row's constant
    changes no rank."""
    return torch.topk(log_weights + noise, k, dim=-1).indices


def recursive_rejection_rows(
    p: torch.Tensor, q: torch.Tensor, candidates: torch.Tensor, valid: torch.Tensor,
    beside: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Recursive rejection sampling for many parents at once, each with its own q and candidates.

    p, q: [P, V]; candidates: long [P, K] in draw order: slot 0 drawn from q, the others one draw
    without replacement from `beside` [P, V] with slot 0's token left out (None: from q, so the
    row is one draw without replacement from q); valid: bool [P, K], False for padding slots (a
    fixed-width tree where the law has fewer tokens than K), which come after every real
    candidate of their row.
    Returns (accept_prob [P, K], final_residual [P, V]):
      accept_prob[:, k] = min(1, p^(k)(c_k) / q^(k)(c_k)) with p^(1) = p, q^(1) = q,
      p^(k+1) = normalize(max(p^(k) - q^(k), 0)), q^(2) = beside without c_1, q^(k+1) = q^(k)
      without c_k (k >= 2), renormalised; final_residual = p^(K+1), the distribution to draw
      from when all K are rejected.
    Each slot is a speculative step against the law it was drawn from, given the slots before
    it, so the first accepted candidate in draw order is distributed exactly as p. A padding slot
    has accept probability 0 and leaves the residual unchanged, so the result is exactly that of
    the row's real candidates alone. Gathers only: no host sync.
    """
    p_k, q_k = p, q
    probs = []
    for k in range(candidates.shape[-1]):  # K is the tree width (a handful), not a token count
        c = candidates[:, k : k + 1]
        probs.append(accept_probability(p_k.gather(-1, c), q_k.gather(-1, c).clamp(min=1e-30)).squeeze(-1))
        p_k = residual(p_k, q_k, rows=valid[:, k : k + 1])  # a padding slot leaves it as it was
        law = beside if k == 0 and beside is not None else q_k
        # A row's q past its last real slot is never read (every later slot pads too): no select.
        q_k = law.scatter(-1, c, 0.0)
        q_k = q_k / q_k.sum(-1, keepdim=True).clamp(min=1e-30)
    return torch.where(valid, torch.stack(probs, dim=-1), 0.0), p_k


def beside_validity(law: torch.Tensor, first: torch.Tensor, width: int) -> torch.Tensor:
    """bool [T, width]: slot 0 (the draft `first`, long [T]) is real, and slot k >= 1 is real
    when `law` [T, V] has at least k tokens other than the draft (a draw without replacement
    from it with the draft left out, `sample_without_replacement_rows`)."""
    others = (law > 0).sum(-1, keepdim=True) - (law.gather(-1, first.unsqueeze(-1)) > 0).long()
    return torch.arange(width, device=law.device) <= others


def candidate_validity(q: torch.Tensor, width: int) -> torch.Tensor:
    """bool [..., width]: slot k holds a real candidate (k < the support size of q's row)."""
    support = (q > 0).sum(-1, keepdim=True)
    return torch.arange(width, device=q.device) < support
