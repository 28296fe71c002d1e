"""Decode AR Image Tokens: AR_IMAGE_TOKENS -> IMAGE ([B, H, W, C] float32 in 0..1)."""

from __future__ import annotations

from typing import List, Tuple

import numpy as np
import torch
from PIL import Image

from .datatypes import AR_IMAGE_TOKENS, ARImageTokens


def pil_to_image(images: List[Image.Image]) -> torch.Tensor:
    """PIL images (same size) -> ComfyUI IMAGE: float32 [B, H, W, 3] in 0..1."""
    arrays = [np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0 for im in images]
    return torch.from_numpy(np.stack(arrays))


def tokens_to_image(tokens: ARImageTokens) -> torch.Tensor:
    model = tokens.model.get()
    return pil_to_image(model.decode(tokens.tokens, tokens.resolution))


class DecodeARImageTokens:
    DESCRIPTION = "Turns sampled image tokens into pixels with the model's own image decoder (VQ)."
    CATEGORY = "sjd-pac"
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
            }
        }

    def decode(self, tokens: ARImageTokens) -> Tuple[torch.Tensor]:
        return (tokens_to_image(tokens),)
