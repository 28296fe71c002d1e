"""The taming-transformers decoder both Lumina-mGPT generations' VQ decoders are built from.

Meta's Chameleon VQGAN (`chameleon_vqgan.py`) and ai-forever's MoVQGAN (`movqgan.py`) decode codes
with the same tree under the same parameter names - conv_in, mid (residual, attention, residual),
one up level per resolution (residual blocks, attention after each where the level attends, an
upsample but at the finest), norm_out, conv_out - and differ only in their norm: taming's GroupNorm,
or MoVQ's spatial norm, which also reads the quantized codes zq. So the blocks here build every norm
from the factory they are given and call it as norm(x, zq); the GroupNorm takes zq and ignores it.
CodebookDecoder is the whole decoding model (codebook, post_quant_conv, the tree) each file builds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

# channels -> a norm module called as norm(x, zq); its parameters are the checkpoint's norm keys.
NormFactory = Callable[[int], nn.Module]


class TamingGroupNorm(nn.GroupNorm):
    """taming's GroupNorm (32 groups, eps 1e-6, affine); it takes the codes as every norm here
    does and reads none of them."""

    def __init__(self, channels: int) -> None:
        super().__init__(num_groups=32, num_channels=channels, eps=1e-6, affine=True)

    def forward(self, x: torch.Tensor, zq: Optional[torch.Tensor] = None) -> torch.Tensor:
        return super().forward(x)


@dataclass(frozen=True)
class DecoderShape:
    """Level i (0 = finest) has `channels[i]` features and `blocks` residual blocks, with attention
    after each block where i is in `attention_levels`; z_channels in, out_channels out."""

    z_channels: int
    channels: Tuple[int, ...]
    blocks: int
    attention_levels: Tuple[int, ...]
    out_channels: int


class ResnetBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, norm: NormFactory) -> None:
        super().__init__()
        self.norm1 = norm(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2 = norm(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        # A 1x1 projection on the skip path only where the width changes (taming's nin_shortcut).
        self.nin_shortcut = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else None

    def forward(self, x: torch.Tensor, zq: Optional[torch.Tensor] = None) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x, zq)))
        h = self.conv2(F.silu(self.norm2(h, zq)))
        skip = x if self.nin_shortcut is None else self.nin_shortcut(x)
        return skip + h


class AttnBlock(nn.Module):
    """Single-head self-attention over all pixels, with 1x1-conv projections."""

    def __init__(self, channels: int, norm: NormFactory) -> None:
        super().__init__()
        self.norm = norm(channels)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor, zq: Optional[torch.Tensor] = None) -> torch.Tensor:
        b, c, height, width = x.shape
        h = self.norm(x, zq)

        def tokens(t: torch.Tensor) -> torch.Tensor:  # [B, C, H, W] -> [B, 1, HW, C]
            return t.reshape(b, c, height * width).transpose(1, 2).unsqueeze(1)

        # softmax(q k^T / sqrt(C)) v, as in taming; SDPA never materialises the HW x HW scores on a
        # GPU (MoVQ's 96 x 96 codes at 768 px: 85M of them).
        out = F.scaled_dot_product_attention(tokens(self.q(h)), tokens(self.k(h)), tokens(self.v(h)))
        out = out.squeeze(1).transpose(1, 2).reshape(b, c, height, width)
        return x + self.proj_out(out)


class Upsample(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class TamingDecoder(nn.Module):
    """conv_in -> mid (res, attn, res) -> up levels (coarsest first) -> norm_out -> conv_out, every
    norm built by `norm` and given the codes zq (which a norm that reads none may be given as None)."""

    def __init__(self, shape: DecoderShape, norm: NormFactory) -> None:
        super().__init__()
        block_in = shape.channels[-1]
        self.conv_in = nn.Conv2d(shape.z_channels, block_in, 3, padding=1)
        self.mid = nn.Module()
        self.mid.block_1 = ResnetBlock(block_in, block_in, norm)
        self.mid.attn_1 = AttnBlock(block_in, norm)
        self.mid.block_2 = ResnetBlock(block_in, block_in, norm)
        # up[i] is level i (0 the finest); built coarsest first, as the checkpoints' names run.
        ups: Dict[int, nn.Module] = {}
        for level in reversed(range(len(shape.channels))):
            up = nn.Module()
            up.block = nn.ModuleList()
            up.attn = nn.ModuleList()
            for _ in range(shape.blocks):
                up.block.append(ResnetBlock(block_in, shape.channels[level], norm))
                block_in = shape.channels[level]
                if level in shape.attention_levels:
                    up.attn.append(AttnBlock(block_in, norm))
            if level != 0:
                up.upsample = Upsample(block_in)
            ups[level] = up
        self.up = nn.ModuleList([ups[level] for level in range(len(shape.channels))])
        self.norm_out = norm(block_in)
        self.conv_out = nn.Conv2d(block_in, shape.out_channels, 3, padding=1)

    def forward(self, z: torch.Tensor, zq: Optional[torch.Tensor] = None) -> torch.Tensor:
        h = self.conv_in(z)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h, zq), zq), zq)
        for level in reversed(range(len(self.up))):
            up = self.up[level]
            for i, block in enumerate(up.block):
                h = block(h, zq)
                if len(up.attn) > 0:
                    h = up.attn[i](h, zq)
            if level != 0:
                h = up.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h, zq)))


class CodebookDecoder(nn.Module):
    """Codes [B, H, W] -> pixels [B, out_channels, H*f, W*f] in about [-1, 1] (f = downsample): the
    codebook (`quantize.embedding`), `post_quant_conv` and the `decoder.*` tree, under taming's
    names; the codes' vectors zq go to every norm."""

    def __init__(self, n_embed: int, embed_dim: int, shape: DecoderShape, norm: NormFactory) -> None:
        super().__init__()
        self.quantize = nn.Module()
        self.quantize.embedding = nn.Embedding(n_embed, embed_dim)
        self.post_quant_conv = nn.Conv2d(embed_dim, shape.z_channels, 1)
        self.decoder = TamingDecoder(shape, norm)

    @property
    def downsample(self) -> int:
        """Pixels per code along each side: each level but the finest doubles them."""
        return 2 ** (len(self.decoder.up) - 1)

    @torch.inference_mode()
    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        weight = self.quantize.embedding.weight
        zq = F.embedding(codes.to(weight.device), weight).permute(0, 3, 1, 2).contiguous()
        return self.decoder(self.post_quant_conv(zq), zq)
