"""A small convolutional VQ autoencoder: 64x64 RGB <-> 16x16 codes.

Encoder (two stride-2 convolutions + residual blocks) -> vector quantiser with an EMA codebook,
commitment loss and dead-code restarts -> decoder (residual blocks + two transposed
convolutions). Pure PyTorch; weights as safetensors plus a json config.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

VQ_WEIGHTS = "vq.safetensors"
VQ_CONFIG = "vq_config.json"


@dataclass
class VQConfig:
    codebook_size: int = 512
    code_dim: int = 32
    ch1: int = 32  # channels at 64x64
    ch2: int = 48  # channels at 32x32
    ch3: int = 64  # channels at 16x16
    n_res: int = 2
    beta: float = 0.25  # commitment loss weight
    ema_decay: float = 0.99
    restart_after: int = 10  # steps a code may go unused before it is re-seeded
    image_size: int = 64
    grid: int = 16  # tokens per side

    @property
    def num_tokens(self) -> int:
        return self.grid * self.grid


class ResBlock(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.c1 = nn.Conv2d(ch, ch, 3, padding=1)
        self.c2 = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x):
        return x + self.c2(F.silu(self.c1(F.silu(x))))


class Encoder(nn.Module):
    def __init__(self, c: VQConfig):
        super().__init__()
        self.inp = nn.Conv2d(3, c.ch1, 3, padding=1)
        self.d1 = nn.Conv2d(c.ch1, c.ch2, 4, stride=2, padding=1)
        self.d2 = nn.Conv2d(c.ch2, c.ch3, 4, stride=2, padding=1)
        self.res = nn.Sequential(*[ResBlock(c.ch3) for _ in range(c.n_res)])
        self.out = nn.Conv2d(c.ch3, c.code_dim, 1)

    def forward(self, x):
        x = F.silu(self.inp(x))
        x = F.silu(self.d1(x))
        x = self.d2(x)
        x = self.res(x)
        return self.out(F.silu(x))


class Decoder(nn.Module):
    def __init__(self, c: VQConfig):
        super().__init__()
        self.inp = nn.Conv2d(c.code_dim, c.ch3, 3, padding=1)
        self.res = nn.Sequential(*[ResBlock(c.ch3) for _ in range(c.n_res)])
        self.u1 = nn.ConvTranspose2d(c.ch3, c.ch2, 4, stride=2, padding=1)
        self.u2 = nn.ConvTranspose2d(c.ch2, c.ch1, 4, stride=2, padding=1)
        self.out = nn.Conv2d(c.ch1, 3, 3, padding=1)

    def forward(self, z):
        x = self.res(self.inp(z))
        x = F.silu(self.u1(F.silu(x)))
        x = F.silu(self.u2(x))
        return self.out(x)


class EMAQuantizer(nn.Module):
    """Nearest-neighbour codebook with EMA updates and dead-code restarts."""

    def __init__(self, c: VQConfig):
        super().__init__()
        self.c = c
        self.register_buffer("embedding", torch.randn(c.codebook_size, c.code_dim) * 0.1)
        self.register_buffer("cluster_size", torch.ones(c.codebook_size))
        self.register_buffer("embed_sum", self.embedding.clone())
        self.register_buffer("unused_steps", torch.zeros(c.codebook_size))

    def codes(self, z: torch.Tensor) -> torch.Tensor:
        """z: (N, D) -> nearest code indices (N,)."""
        e = self.embedding
        d = (z * z).sum(1, keepdim=True) - 2 * z @ e.t() + (e * e).sum(1)[None]
        return d.argmin(1)

    def forward(self, z: torch.Tensor, generator: torch.Generator | None = None):
        # z: (B, D, H, W)
        B, D, H, W = z.shape
        flat = z.permute(0, 2, 3, 1).reshape(-1, D)
        idx = self.codes(flat.detach())
        q = self.embedding[idx]
        if self.training:
            with torch.no_grad():
                onehot = F.one_hot(idx, self.c.codebook_size).type_as(flat)
                n = onehot.sum(0)
                s = onehot.t() @ flat.detach()
                dec = self.c.ema_decay
                self.cluster_size.mul_(dec).add_(n, alpha=1 - dec)
                self.embed_sum.mul_(dec).add_(s, alpha=1 - dec)
                total = self.cluster_size.sum()
                size = (self.cluster_size + 1e-5) / (total + self.c.codebook_size * 1e-5) * total
                self.embedding.copy_(self.embed_sum / size[:, None])
                # dead-code restarts: a code unused for `restart_after` steps is re-seeded
                # from a random encoder output of this batch
                self.unused_steps.add_(1).mul_((n == 0).float())
                dead = self.unused_steps > self.c.restart_after
                nd = int(dead.sum())
                if nd > 0:
                    pick = torch.randint(0, flat.shape[0], (nd,), generator=generator)
                    new = flat.detach()[pick] + 0.01 * torch.randn(nd, D, generator=generator)
                    w = float(self.cluster_size.mean())
                    self.embedding[dead] = new
                    self.embed_sum[dead] = new * w
                    self.cluster_size[dead] = w
                    self.unused_steps[dead] = 0
        commit = F.mse_loss(flat, q.detach())
        q_st = flat + (q - flat).detach()
        q_st = q_st.reshape(B, H, W, D).permute(0, 3, 1, 2)
        return q_st, idx.reshape(B, H, W), commit


def to_input(images) -> torch.Tensor:
    """uint8 (B, 64, 64, 3) numpy/tensor -> float (B, 3, 64, 64) in [-1, 1]."""
    x = torch.as_tensor(np.asarray(images)) if not torch.is_tensor(images) else images
    return x.permute(0, 3, 1, 2).float() / 127.5 - 1.0


def to_uint8(x: torch.Tensor) -> np.ndarray:
    """float (B, 3, 64, 64) in [-1, 1] -> uint8 (B, 64, 64, 3) numpy."""
    return ((x.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).cpu().numpy()


class VQModel(nn.Module):
    def __init__(self, config: VQConfig | None = None):
        super().__init__()
        self.config = config or VQConfig()
        self.encoder = Encoder(self.config)
        self.quantizer = EMAQuantizer(self.config)
        self.decoder = Decoder(self.config)

    @property
    def codebook_size(self) -> int:
        return self.config.codebook_size

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None):
        z = self.encoder(x)
        q, idx, commit = self.quantizer(z, generator)
        return self.decoder(q), idx, commit

    @torch.no_grad()
    def encode(self, images, batch_size: int = 256) -> torch.Tensor:
        """uint8 images (B, 64, 64, 3) -> codes LongTensor (B, 16, 16)."""
        out = []
        n = len(images)
        for i in range(0, n, batch_size):
            x = to_input(images[i : i + batch_size])
            z = self.encoder(x)
            B, D, H, W = z.shape
            out.append(self.quantizer.codes(z.permute(0, 2, 3, 1).reshape(-1, D)).reshape(B, H, W))
        return torch.cat(out)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes (B, 16, 16) or (B, 256) -> float images (B, 3, 64, 64) in [-1, 1]."""
        codes = torch.as_tensor(codes).long()
        g = self.config.grid
        codes = codes.reshape(-1, g, g)
        q = self.quantizer.embedding[codes].permute(0, 3, 1, 2)
        return self.decoder(q).clamp(-1, 1)

    def decode_to_uint8(self, codes: torch.Tensor) -> np.ndarray:
        return to_uint8(self.decode(codes))

    # -- persistence ------------------------------------------------------------------------
    def save_pretrained(self, path: str, dtype: torch.dtype = torch.float16) -> None:
        from safetensors.torch import save_file

        os.makedirs(path, exist_ok=True)
        sd = {k: v.detach().to(dtype).contiguous() for k, v in self.state_dict().items()}
        # the codebook sets the token identities: keep it exact
        sd["quantizer.embedding"] = self.quantizer.embedding.detach().float().contiguous()
        for k in ("quantizer.cluster_size", "quantizer.embed_sum", "quantizer.unused_steps"):
            sd.pop(k, None)
        save_file(sd, os.path.join(path, VQ_WEIGHTS))
        with open(os.path.join(path, VQ_CONFIG), "w") as f:
            json.dump(asdict(self.config), f, indent=2)

    @classmethod
    def from_pretrained(cls, path: str) -> "VQModel":
        from safetensors.torch import load_file

        with open(os.path.join(path, VQ_CONFIG)) as f:
            cfg = VQConfig(**json.load(f))
        m = cls(cfg)
        sd = {k: v.float() for k, v in load_file(os.path.join(path, VQ_WEIGHTS)).items()}
        missing, unexpected = m.load_state_dict(sd, strict=False)
        bad = [k for k in missing if not k.startswith("quantizer.")] + list(unexpected)
        if bad or "quantizer.embedding" not in sd:
            raise RuntimeError(f"bad VQ checkpoint: missing/unexpected {bad}")
        return m.eval()
