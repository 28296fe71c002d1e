"""Known start-up noise of the optional quantization libraries, silenced once for the package.

transformers imports torchao whenever it is installed (the [quant] extra), on every model load,
quantized or not. torchao's wheels then log one "Failed to load ... .so" line per kernel library
built for another Python or GPU, register their Enum types with torch's pytree, which logs a
deprecation warning for each, and say that triton (GPU kernels) is missing on a CPU-only torch;
bitsandbytes' CPU backend logs that an optional kernel could not be fetched. None of these is a
failure (weight-only quantization runs without those kernels), yet they showed on every command,
in the app and in ComfyUI's console, `--quiet` or not.

Each filter drops only its own message from its own logger: every other message of these
libraries still shows. No library is imported here (logging only), so this costs nothing.
"""

from __future__ import annotations

import logging
from typing import Tuple

# (logger, fragments that must all be in the message's format string)
KNOWN_NOISE: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("torchao", ("Failed to load ", ".so")),
    ("torchao.kernel.intmm", ("Detected no triton",)),  # CPU-only torch has no triton; shown where logging is set up
    ("torch.utils._pytree", ("is an Enum subclass and is now natively supported",)),
    ("bitsandbytes.backends.cpu.ops", ("Failed to load CPU gemm_4bit_forward",)),
)


class KnownNoise(logging.Filter):
    """Drops a logger's records whose message holds every one of `fragments`."""

    def __init__(self, fragments: Tuple[str, ...]) -> None:
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        return not all(fragment in message for fragment in self.fragments)


def silence_known_noise() -> None:
    """Add each KNOWN_NOISE filter to its logger, once (the loggers exist before their libraries load)."""
    for name, fragments in KNOWN_NOISE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, KnownNoise) and f.fragments == fragments for f in logger.filters):
            logger.addFilter(KnownNoise(fragments))
