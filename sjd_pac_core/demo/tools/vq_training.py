"""Training the demo's VQ image tokenizer (the model itself is ../vq.py, part of the runtime)."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ..vq import VQConfig, VQModel, to_input


def edge_loss(rec: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean L1 distance between the horizontal and vertical pixel differences of two batches."""
    dx = (rec[..., :, 1:] - rec[..., :, :-1]) - (target[..., :, 1:] - target[..., :, :-1])
    dy = (rec[..., 1:, :] - rec[..., :-1, :]) - (target[..., 1:, :] - target[..., :-1, :])
    return dx.abs().mean() + dy.abs().mean()


def train_vq(
    images: np.ndarray,
    steps: int,
    batch_size: int = 32,
    lr: float = 2e-3,
    seed: int = 0,
    config: VQConfig | None = None,
    log=None,
    progress: bool = True,
    checkpoint_every: int = 0,
    checkpoint_dir: str | None = None,
    edge_weight: float = 0.0,
    crop: int | None = None,
):
    """Train a VQModel on uint8 images (N, 64, 64, 3). Returns (model, last losses dict).

    ``edge_weight`` adds an L1 loss on horizontal and vertical pixel differences: plain MSE/L1
    is content with blurred edges, which turn every small shape into a round blob.

    ``crop``: train on random ``crop`` x ``crop`` crops (a multiple of the token size, at offsets
    on the token grid) instead of whole images. The model is fully convolutional, so it encodes
    whole images afterwards; a crop costs a quarter of an image at 32 px, so the same CPU time buys
    four times the steps (and the shapes came out sharper in the tokenizer's reconstructions)."""
    cell = (config or VQConfig()).image_size // (config or VQConfig()).grid
    if crop is not None and (crop < cell or crop % cell or crop > images.shape[1]):
        raise ValueError(f"crop must be a multiple of {cell} px up to {images.shape[1]}, got {crop}")
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    model = VQModel(config)
    # initialise the codebook from encoder outputs of a first batch
    with torch.no_grad():
        x0 = to_input(images[torch.randperm(len(images), generator=g)[:64].numpy()])
        z0 = model.encoder(x0).permute(0, 2, 3, 1).reshape(-1, model.config.code_dim)
        pick = torch.randint(0, z0.shape[0], (model.config.codebook_size,), generator=g)
        model.quantizer.embedding.copy_(z0[pick])
        model.quantizer.embed_sum.copy_(z0[pick])
    params = list(model.encoder.parameters()) + list(model.decoder.parameters())
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    warm = max(1, min(100, steps // 10))

    def lr_at(s):
        if s < warm:
            return lr * (s + 1) / warm
        t = (s - warm) / max(1, steps - warm)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    it = range(steps)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(it, desc="vq", unit="step")
        it = bar
    model.train()
    ema = None
    losses = {}
    for s in it:
        for pg in opt.param_groups:
            pg["lr"] = lr_at(s)
        idx = torch.randint(0, len(images), (batch_size,), generator=g).numpy()
        x = to_input(images[idx])
        if crop is not None and crop < x.shape[-1]:
            n_off = (x.shape[-1] - crop) // cell + 1
            offs = torch.randint(0, n_off, (batch_size, 2), generator=g) * cell
            x = torch.stack([x[b, :, oy : oy + crop, ox : ox + crop] for b, (oy, ox) in enumerate(offs.tolist())])
        # cheap augmentation: horizontal flips keep captions' colours (positions don't matter here)
        if s % 2 == 1:
            x = x.flip(3)
        rec, codes, commit = model(x, g)
        mse = F.mse_loss(rec, x)
        l1 = (rec - x).abs().mean()
        loss = mse + 0.5 * l1 + model.config.beta * commit
        if edge_weight:
            loss = loss + edge_weight * edge_loss(rec, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        used = int(torch.unique(codes).numel())
        cur = {"loss": loss.item(), "mse": mse.item(), "commit": commit.item(), "codes_used": used}
        ema = cur if ema is None else {k: 0.95 * ema[k] + 0.05 * cur[k] for k in cur}
        if bar is not None:
            bar.set_postfix(mse=f"{ema['mse']:.4f}", used=f"{ema['codes_used']:.0f}")
        if log is not None and (s % 50 == 0 or s == steps - 1):
            log({"stage": "vq", "step": s, **{k: round(v, 6) for k, v in ema.items()}})
        if checkpoint_every and checkpoint_dir and (s + 1) % checkpoint_every == 0 and s + 1 < steps:
            model.eval()
            model.save_pretrained(checkpoint_dir)
            model.train()
        losses = ema
    model.eval()
    return model, losses
