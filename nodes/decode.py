"""Decode AR Image Tokens: AR_IMAGE_TOKENS -> IMAGE ([B, H, W, C] float32 in 0..1)."""

from __future__ import annotations

from typing import List, Tuple

import numpy as np
import torch
from PIL import Image

from sjd_pac_core.images import MAX_UPSCALE, UPSCALE_FILTERS, upscale, upscale_factor_for

from .datatypes import AR_IMAGE_TOKENS, ARImageTokens

# The default makes the demo's 64x64 image 512x512 (x8); larger models' images are left as they are.
DEFAULT_UPSCALE_TO = 512
MAX_UPSCALE_TO = 64 * MAX_UPSCALE


def pil_to_image(images: List[Image.Image]) -> torch.Tensor:
    """PIL images (same size) -> ComfyUI IMAGE: float32 [B, H, W, 3] in 0..1."""
    arrays = [np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0 for im in images]
    return torch.from_numpy(np.stack(arrays))


UPSCALE_INPUTS = {
    "upscale_to": ("INT", {
        "default": DEFAULT_UPSCALE_TO, "min": 0, "max": MAX_UPSCALE_TO, "step": 64,
        "tooltip": "Upscale by a whole factor until the long side is at least this many pixels; 0 = the "
                   "model's own size. The demo's 64x64 becomes 512x512; images of the large models "
                   "(384-768 px) are upscaled only if you ask for more.",
    }),
    "upscale_method": (list(UPSCALE_FILTERS), {
        "default": "nearest",
        "tooltip": "nearest keeps the token grid's sharp pixels; lanczos smooths them.",
    }),
}


def upscale_to_long_side(images: List[Image.Image], min_long_side: int, method: str) -> List[Image.Image]:
    """Scale by the smallest whole factor that makes the long side at least `min_long_side` (0 = off)."""
    if min_long_side <= 0 or not images:
        return images
    factor = min(MAX_UPSCALE, upscale_factor_for(images[0].width, images[0].height, min_long_side))
    return [upscale(im, factor, method) for im in images]


def tokens_to_image(tokens: ARImageTokens, upscale_to: int = 0, upscale_method: str = "nearest") -> torch.Tensor:
    model = tokens.model.get()
    images = model.decode(tokens.tokens, tokens.resolution)
    return pil_to_image(upscale_to_long_side(images, upscale_to, upscale_method))


class DecodeARImageTokens:
    DESCRIPTION = "Turns sampled image tokens into pixels with the model's own image decoder (VQ)."
    CATEGORY = "sjd-pac"
    SEARCH_ALIASES = ["image tokens", "vq decode", "lumina", "janus", "emu3", "speculative decoding"]
    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("image",)
    OUTPUT_TOOLTIPS = ("The decoded image(s), one per token sequence of the batch.",)
    FUNCTION = "decode"

    @classmethod
    def INPUT_TYPES(cls) -> dict:
        return {
            "required": {
                "tokens": (AR_IMAGE_TOKENS, {
                    "tooltip": "Image tokens from SJD-PAC Sampler (they remember which model made them).",
                }),
                **UPSCALE_INPUTS,
            }
        }

    def decode(self, tokens: ARImageTokens, upscale_to: int = DEFAULT_UPSCALE_TO,
               upscale_method: str = "nearest") -> Tuple[torch.Tensor]:
        return (tokens_to_image(tokens, upscale_to, upscale_method),)
