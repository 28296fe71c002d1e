"""The seed: one meaning for every value, for the library, the CLI, the ComfyUI nodes and the app.

    None or -1          a fresh random seed, drawn below 2**32 so that it is easy to read, type
                        and store, and reported back in the result so that the run can be repeated
    0 .. SEED_MAX       that seed (SEED_MAX = 2**64 - 1, the range of ComfyUI's seed widget)
    anything else       refused with one sentence (ConfigError): other negative numbers, larger
                        numbers, fractions, strings, booleans

The seed is resolved once, at the public edge (`generate_image`, `sample_tokens`), which return
the seed they used; the CLI, the nodes and the app pass the user's value through. A batch of B
images uses the seeds `image_seed(seed, 0) .. image_seed(seed, B - 1)`: seed, seed + 1, ...,
counted modulo 2**64, so that every seed in range starts a batch of any size.
"""

from __future__ import annotations

import numbers
import secrets
from typing import Any, Optional

import numpy as np

from ..config import ConfigError

SEED_BITS = 64
SEED_MAX = 2**SEED_BITS - 1
RANDOM = -1  # the value that asks for a fresh random seed where None cannot be entered (a number field)
RANDOM_SEED_RANGE = 2**32


def check_seed(seed: Any) -> Optional[int]:
    """A user's seed -> None (draw a random one) or the seed as a Python int; ConfigError otherwise.

    Nothing is drawn here: front ends call it to refuse a bad seed before any work."""
    if seed is None:
        return None
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
        raise ConfigError(
            f"seed must be an integer or None (a random seed), got {seed!r} of type {type(seed).__name__}; "
            "pass a whole number such as 0."
        )
    seed = int(seed)
    if seed == RANDOM:
        return None
    if not 0 <= seed <= SEED_MAX:
        raise ConfigError(f"seed must be between 0 and 2^64-1, or -1 for a random one, got {seed}; try 0.")
    return seed


def resolve_seed(seed: Any) -> int:
    """The seed a run uses: the user's seed, or a fresh random one for None or -1 (check_seed)."""
    checked = check_seed(seed)
    return secrets.randbelow(RANDOM_SEED_RANGE) if checked is None else checked


def image_seed(seed: int, index: int) -> int:
    """The seed of image `index` of a batch started with the resolved `seed`."""
    return (seed + index) % (SEED_MAX + 1)


def reduce_seed(seed: int) -> int:
    """The verification rules' 64-bit seed: the identity on every resolved seed (0..SEED_MAX);
    callers below the public edge that pass another integer get its low 64 bits."""
    return int(seed) % (SEED_MAX + 1)
