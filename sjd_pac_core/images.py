"""Upscaling a generated image for saving and viewing (shared by the CLI and the Decode node).

The demo model draws 64x64 images; a viewer shows them as a thumbnail. Nearest-neighbour keeps
the token grid's sharp pixels; Lanczos smooths them.
"""

from __future__ import annotations

import io
import json

from PIL import Image

from .settings import RECORD_PNG_KEY

UPSCALE_FILTERS = ("nearest", "lanczos")
MAX_UPSCALE = 16
MAX_UPSCALED_SIDE = 8192  # pixels on the long side; beyond this a PNG of one image is hundreds of MB


def upscale_factor_for(width: int, height: int, min_long_side: int) -> int:
    """The smallest whole factor that makes the long side at least `min_long_side` (1 if it already is)."""
    long_side = max(width, height, 1)
    return max(1, -(-min_long_side // long_side))


def upscale(image: Image.Image, factor: int, method: str = "nearest") -> Image.Image:
    """`image` scaled by a whole `factor` with 'nearest' or 'lanczos'."""
    if method not in UPSCALE_FILTERS:
        raise ValueError(f"Unknown upscale filter {method!r}; choose nearest or lanczos.")
    if not isinstance(factor, int) or not 1 <= factor <= MAX_UPSCALE:
        raise ValueError(f"The upscale factor must be a whole number from 1 to {MAX_UPSCALE}, got {factor!r}.")
    if max(image.width, image.height) * factor > MAX_UPSCALED_SIDE:
        raise ValueError(
            f"Upscaling {image.width}x{image.height} by {factor} exceeds {MAX_UPSCALED_SIDE} px; "
            "use a smaller factor."
        )
    if factor == 1:
        return image
    resample = Image.Resampling.NEAREST if method == "nearest" else Image.Resampling.LANCZOS
    return image.resize((image.width * factor, image.height * factor), resample=resample)


def png_bytes(image: Image.Image, record: dict) -> bytes:
    """`image` as PNG bytes whose RECORD_PNG_KEY text chunk holds the run record as JSON."""
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text(RECORD_PNG_KEY, json.dumps(record))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", pnginfo=info)
    return buffer.getvalue()
