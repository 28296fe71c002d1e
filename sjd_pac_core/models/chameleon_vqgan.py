"""Meta's Chameleon VQGAN decoder (codes -> pixels), written for sjd-pac.

transformers' ChameleonVQVAE has no decoder, so Lumina-mGPT images need Meta's `vqgan.yaml` +
`vqgan.ckpt` (shipped in Lumina-mGPT's `ckpts/chameleon/tokenizer/` folder). That checkpoint is a
taming-transformers style VQ model; this module rebuilds only the parts needed to decode - the
codebook (`quantize.embedding`), `post_quant_conv` and the `decoder.*` tree (`vq_blocks`'
CodebookDecoder, every norm a plain GroupNorm) - under the same parameter names, so the
checkpoint's state dict loads into it key for key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Tuple

import torch

from .checks import read_tensor_file
from .vq_blocks import CodebookDecoder, DecoderShape, TamingGroupNorm


class VQGANLoadError(ValueError):
    """vqgan.yaml / vqgan.ckpt cannot be used; the message names the fix."""


MAX_BLOCKS = 512  # residual blocks per level (Chameleon's has 2): each is modules to build
MAX_LEVELS = 10  # resolution levels, each halving the image (Chameleon's has 5)


@dataclass(frozen=True)
class VQGANConfig:
    """The `model.params` of vqgan.yaml (taming-transformers naming)."""

    embed_dim: int
    n_embed: int
    z_channels: int
    ch: int
    out_ch: int
    ch_mult: Tuple[int, ...]
    num_res_blocks: int
    attn_resolutions: Tuple[int, ...]
    resolution: int

    @property
    def downsample(self) -> int:
        """Pixels per code along each side (16 for Chameleon)."""
        return 2 ** (len(self.ch_mult) - 1)

    @property
    def decoder_shape(self) -> DecoderShape:
        """Widths ch * ch_mult; attention where a level's nominal resolution (resolution at the
        coarsest level, doubling towards the finest) is in attn_resolutions, as taming places it."""
        levels = len(self.ch_mult)
        coarsest = self.resolution // 2 ** (levels - 1)
        return DecoderShape(
            z_channels=self.z_channels,
            channels=tuple(self.ch * m for m in self.ch_mult),
            blocks=self.num_res_blocks + 1,
            attention_levels=tuple(
                level for level in range(levels) if coarsest * 2 ** (levels - 1 - level) in self.attn_resolutions
            ),
            out_channels=self.out_ch,
        )

    @classmethod
    def from_yaml(cls, path: Path) -> "VQGANConfig":
        import yaml  # a dependency of transformers

        try:
            params = yaml.safe_load(Path(path).read_text())["model"]["params"]
            dd = params["ddconfig"]
            config = cls(
                embed_dim=int(params["embed_dim"]),
                n_embed=int(params["n_embed"]),
                z_channels=int(dd["z_channels"]),
                ch=int(dd["ch"]),
                out_ch=int(dd.get("out_ch", 3)),
                ch_mult=tuple(int(m) for m in dd["ch_mult"]),
                num_res_blocks=int(dd["num_res_blocks"]),
                attn_resolutions=tuple(int(r) for r in (dd.get("attn_resolutions") or ())),
                resolution=int(dd["resolution"]),
            )
        except (OSError, KeyError, TypeError, ValueError, RecursionError, yaml.YAMLError) as exc:
            raise VQGANLoadError(
                f"{path} is not a Chameleon vqgan.yaml ({' '.join(f'{type(exc).__name__}: {exc}'.split())[:200]}); "
                "download it again from Lumina-mGPT's ckpts/chameleon/tokenizer/ folder."
            ) from None
        sizes = (config.embed_dim, config.n_embed, config.z_channels, config.ch, config.out_ch, config.resolution,
                 config.num_res_blocks, *config.ch_mult)
        if min(sizes) < 1 or config.num_res_blocks > MAX_BLOCKS or not 1 <= len(config.ch_mult) <= MAX_LEVELS:
            raise VQGANLoadError(
                f"{path} describes no VQGAN that can be built (sizes must be whole numbers >= 1, at most "
                f"{MAX_BLOCKS} blocks per level and 1 to {MAX_LEVELS} levels); download it again from "
                "Lumina-mGPT's ckpts/chameleon/tokenizer/ folder."
            )
        return config


class ChameleonVQGANDecoder(CodebookDecoder):
    """Codes [B, H, W] -> pixels [B, 3, H*f, W*f] in about [-1, 1] (f = cfg.downsample); every norm a
    GroupNorm."""

    def __init__(self, cfg: VQGANConfig) -> None:
        super().__init__(cfg.n_embed, cfg.embed_dim, cfg.decoder_shape, TamingGroupNorm)
        self.config = cfg

    def to_uint8(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] in [-1, 1] -> uint8 [B, H, W, 3] on the CPU (clamped as Meta's code does)."""
        out = ((pixels.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        return out.permute(0, 2, 3, 1).cpu()


# Re-saves a trusted vqgan.ckpt's state dict as vqgan.safetensors (run in the file's folder).
CONVERT_COMMAND = (
    "python -c \"import torch; from safetensors.torch import save_file; "
    "sd = torch.load('vqgan.ckpt', weights_only=False)['state_dict']; "
    "save_file({k: v.contiguous() for k, v in sd.items()}, 'vqgan.safetensors')\""
)


def _read_state_dict(weights_path: Path) -> Dict[str, torch.Tensor]:
    """The decoder's weights from vqgan.safetensors or vqgan.ckpt, never unpickling an object.

    Meta's vqgan.ckpt is a dict holding a "state_dict" of tensors, which torch's weights-only
    loader reads (transformers' own Chameleon converter reads it with weights_only=True). Any other
    pickled object in the file - a Lightning callback, or code planted in a crafted file - is
    refused, with the command that re-saves the tensors as vqgan.safetensors.
    """
    return read_tensor_file(weights_path, VQGANLoadError, (), download="download vqgan.ckpt again",
                            plain_copy="use the vqgan.ckpt of Lumina-mGPT's ckpts/chameleon/tokenizer/ folder",
                            convert_command=CONVERT_COMMAND)


def load_chameleon_vqgan(
    yaml_path: Path, weights_path: Path, device: torch.device, dtype: torch.dtype = torch.float32
) -> ChameleonVQGANDecoder:
    """Build the decoder from vqgan.yaml and load its weights from vqgan.ckpt (or vqgan.safetensors).

    Only decoder-side keys are taken (the encoder and any GAN-loss weights are skipped); a missing
    or surplus decoder key means the yaml and the checkpoint do not belong together.
    """
    cfg = VQGANConfig.from_yaml(yaml_path)
    state = _read_state_dict(weights_path)
    wanted = ("decoder.", "post_quant_conv.", "quantize.embedding.")
    state = {k: v for k, v in state.items() if k.startswith(wanted)}
    with torch.device("meta"):
        model = ChameleonVQGANDecoder(cfg)
    expected = set(model.state_dict())
    missing, surplus = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or surplus:
        detail = f"missing {missing[:3]}" if missing else f"unexpected {surplus[:3]}"
        raise VQGANLoadError(
            f"{weights_path} does not match {yaml_path.name} ({detail}); download both files again "
            "from the same ckpts/chameleon/tokenizer/ folder."
        )
    for key, tensor in model.state_dict().items():
        if tuple(state[key].shape) != tuple(tensor.shape):
            raise VQGANLoadError(
                f"{weights_path} does not match {yaml_path.name} ({key} has shape "
                f"{tuple(state[key].shape)}, expected {tuple(tensor.shape)}); download both files again."
            )
    model.load_state_dict(state, assign=True)
    return model.to(device=device, dtype=dtype).eval()
