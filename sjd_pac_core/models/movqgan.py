"""The MoVQGAN decoder (codes -> pixels) of Lumina-mGPT 2.0, written for sjd-pac.

Lumina-mGPT 2.0 tokenizes images with ai-forever's MoVQGAN-270M (`movqgan_270M.ckpt`, 16384 codes of
4 channels, 8x downsampling). MoVQ's decoder is a taming-style decoder whose every normalisation is
a "spatial norm": GroupNorm of the features, then a scale and a shift computed by 1x1 convolutions
from the quantized codes (nearest-upsampled to the features' size). This module rebuilds only what
decoding needs - the codebook (`quantize.embedding`), `post_quant_conv` and the `decoder.*` tree
(`vq_blocks`' CodebookDecoder with that norm) - under the checkpoint's own parameter names, so its
state dict loads key for key. The shape (widths per level, blocks per level, which levels attend) is
read from the checkpoint's keys, so the published 270M file and the tests' tiny one load the same
way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from .checks import read_tensor_file
from .vq_blocks import CodebookDecoder, DecoderShape, TamingGroupNorm


class MoVQLoadError(ValueError):
    """movqgan_270M.ckpt cannot be used; the message names the fix."""


@dataclass(frozen=True)
class MoVQConfig:
    """The decoder's shape: level i (0 = finest) has `channels[i]` features, `blocks` residual
    blocks, and attention after each block where i is in `attention_levels`."""

    n_embed: int
    embed_dim: int
    z_channels: int
    channels: Tuple[int, ...]
    blocks: int
    attention_levels: Tuple[int, ...]
    out_channels: int = 3

    @property
    def downsample(self) -> int:
        """Pixels per code along each side (8 for MoVQGAN-270M)."""
        return 2 ** (len(self.channels) - 1)

    @property
    def decoder_shape(self) -> DecoderShape:
        return DecoderShape(z_channels=self.z_channels, channels=self.channels, blocks=self.blocks,
                            attention_levels=self.attention_levels, out_channels=self.out_channels)

    @classmethod
    def from_state_dict(cls, state: Dict[str, torch.Tensor]) -> "MoVQConfig":
        """The shape the decoder keys of a MoVQGAN state dict describe (KeyError if one is absent)."""
        levels = sorted({int(m.group(1)) for k in state if (m := re.match(r"decoder\.up\.(\d+)\.", k))})
        blocks = len({m.group(1) for k in state if (m := re.match(r"decoder\.up\.0\.block\.(\d+)\.", k))})
        n_embed, embed_dim = state["quantize.embedding.weight"].shape
        return cls(
            n_embed=int(n_embed), embed_dim=int(embed_dim),
            z_channels=int(state["decoder.conv_in.weight"].shape[1]),
            channels=tuple(int(state[f"decoder.up.{i}.block.0.conv2.weight"].shape[0]) for i in levels),
            blocks=blocks,
            attention_levels=tuple(i for i in levels if f"decoder.up.{i}.attn.0.q.weight" in state),
            out_channels=int(state["decoder.conv_out.weight"].shape[0]),
        )


# ai-forever's MoVQGAN-270M (ch 256, ch_mult 1 2 2 4, 2 residual blocks + 1 per level, attention at
# the nominal resolution 32 = the coarsest level), for memory plans made without the file.
MOVQGAN_270M = MoVQConfig(n_embed=16384, embed_dim=4, z_channels=4, channels=(256, 512, 512, 1024), blocks=3,
                          attention_levels=(3,))


class _SpatialNorm(nn.Module):
    """GroupNorm(f) * conv_y(zq) + conv_b(zq), zq resized to f by nearest neighbours (MoVQ)."""

    def __init__(self, channels: int, zq_channels: int) -> None:
        super().__init__()
        self.norm_layer = TamingGroupNorm(channels)
        self.conv_y = nn.Conv2d(zq_channels, channels, 1)
        self.conv_b = nn.Conv2d(zq_channels, channels, 1)

    def forward(self, f: torch.Tensor, zq: torch.Tensor) -> torch.Tensor:
        zq = F.interpolate(zq, size=f.shape[-2:], mode="nearest")
        return self.norm_layer(f) * self.conv_y(zq) + self.conv_b(zq)


class MoVQDecoder(CodebookDecoder):
    """Codes [B, H, W] -> pixels [B, 3, H*f, W*f] in about [-1, 1] (f = cfg.downsample); every norm a
    spatial norm of the codes."""

    def __init__(self, cfg: MoVQConfig) -> None:
        spatial_norm = partial(_SpatialNorm, zq_channels=cfg.embed_dim)
        super().__init__(cfg.n_embed, cfg.embed_dim, cfg.decoder_shape, spatial_norm)
        self.config = cfg


def pixels_to_pil_rounded(pixels: torch.Tensor) -> List[Image.Image]:
    """[B, 3, H, W] in about [-1, 1] -> PIL images: (x + 1) * 127.5 rounded and clamped to 0..255 in
    float32, as Lumina-mGPT 2.0's own code converts its decoder's output (rounding, where Meta's
    Chameleon code truncates)."""
    scaled = ((pixels.detach().float().cpu() + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8)
    arrays = scaled.permute(0, 2, 3, 1).numpy()
    return [Image.fromarray(np.ascontiguousarray(a)) for a in arrays]


# Re-saves a trusted movqgan_270M.ckpt's tensors as movqgan_270M.safetensors (run in its folder).
CONVERT_COMMAND = (
    "python -c \"import torch; from safetensors.torch import save_file; "
    "sd = torch.load('movqgan_270M.ckpt', weights_only=False); sd = sd.get('state_dict', sd); "
    "save_file({k: v.contiguous() for k, v in sd.items()}, 'movqgan_270M.safetensors')\""
)
DECODER_KEYS = ("decoder.", "post_quant_conv.", "quantize.embedding.")


def read_decoder_state(weights_path: Path) -> Dict[str, torch.Tensor]:
    """The decoder's tensors from movqgan_270M.safetensors or movqgan_270M.ckpt, never unpickling an
    object: the .ckpt is read with torch's weights-only loader (memory-mapped, so the encoder and
    any other tensors in it are never read into memory); a file holding other Python objects is
    refused with the command that re-saves its tensors as safetensors. ai-forever's file is the
    state dict itself (their loader passes it to load_state_dict); a training checkpoint keeps it
    under "state_dict"."""
    download = "download movqgan_270M.ckpt from ai-forever/MoVQGAN again"
    return read_tensor_file(weights_path, MoVQLoadError, DECODER_KEYS, download=download, plain_copy=download,
                            convert_command=CONVERT_COMMAND)


def movq_config_of(weights_path: Path) -> MoVQConfig:
    """The decoder shape a MoVQGAN file holds (its keys and shapes; tensors are mapped, not read)."""
    return _config_from(read_decoder_state(weights_path), weights_path)


def _config_from(state: Dict[str, torch.Tensor], weights_path: Path) -> MoVQConfig:
    try:
        return MoVQConfig.from_state_dict(state)
    except (KeyError, ValueError):
        raise MoVQLoadError(
            f"{weights_path} is not a MoVQGAN checkpoint (it has no MoVQ decoder weights such as "
            "decoder.conv_in.weight and quantize.embedding.weight); download movqgan_270M.ckpt from "
            "ai-forever/MoVQGAN."
        ) from None


def load_movq_decoder(weights_path: Path, device: torch.device, dtype: torch.dtype = torch.float32) -> MoVQDecoder:
    """The decoder of a MoVQGAN checkpoint, its shape read from the keys; a missing, surplus or
    mis-shaped decoder key (another VQ model's file, a damaged one) is one sentence."""
    state = read_decoder_state(weights_path)
    cfg = _config_from(state, weights_path)
    with torch.device("meta"):
        model = MoVQDecoder(cfg)
    expected = model.state_dict()
    missing, surplus = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or surplus:
        detail = f"missing {missing[:3]}" if missing else f"unexpected {surplus[:3]}"
        raise MoVQLoadError(
            f"{weights_path} is not a MoVQGAN decoder sjd-pac can read ({detail}); download movqgan_270M.ckpt "
            "from ai-forever/MoVQGAN again."
        )
    for key, tensor in expected.items():
        if tuple(state[key].shape) != tuple(tensor.shape):
            raise MoVQLoadError(
                f"{weights_path} is damaged ({key} has shape {tuple(state[key].shape)}, expected "
                f"{tuple(tensor.shape)}); download movqgan_270M.ckpt from ai-forever/MoVQGAN again."
            )
    model.load_state_dict({k: v.clone() for k, v in state.items()}, assign=True)
    return model.to(device=device, dtype=dtype).eval()
