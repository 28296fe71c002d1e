"""The seed domain, defined once for both verification rules.

A seed is any Python or numpy integer; it is reduced to 64 bits as its two's-complement low
64 bits (seed mod 2**64), so -1 and 2**64 - 1 are the same seed, and 2**64 is seed 0, under
both rules. `None` asks for a fresh random seed, which the sampler reports back in its result
so that the run can be repeated.
"""

from __future__ import annotations

import numbers
import secrets
from typing import Any

import numpy as np

from ..config import ConfigError

SEED_BITS = 64
SEED_MODULUS = 1 << SEED_BITS


def reduce_seed(seed: int) -> int:
    """Any integer -> the 64-bit seed in [0, 2**64) both rules use."""
    return int(seed) % SEED_MODULUS


def resolve_seed(seed: Any) -> int:
    """A user's seed (an integer or None) -> the 64-bit seed of the run; ConfigError otherwise."""
    if seed is None:
        return secrets.randbits(SEED_BITS)
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
        raise ConfigError(
            f"seed must be an integer or None (a random seed), got {seed!r} of type {type(seed).__name__}; "
            "pass a whole number such as 0."
        )
    return reduce_seed(seed)
