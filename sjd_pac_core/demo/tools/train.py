"""Rebuild the bundled demo model from scratch: data -> VQ tokenizer -> text-to-image LM.

    python -m sjd_pac_core.demo.tools.train --out /tmp/demo_run      # the shipped weights' recipe
    python -m sjd_pac_core.demo.tools.train --smoke                  # a few steps of each stage

The defaults are the recipe of the shipped weights in ``sjd_pac_core/demo/weights/`` (a Llama with
row tokens, the sub-token layout loss, strong background clouds, 5,400 LM steps; README, "The
bundled demo model"): 0.9-1.3 s of CPU time per LM step on one thread, about 90-120 minutes in
all. Every ``--ckpt-every`` LM steps the output directory holds a usable (partially trained) model.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time

import numpy as np
import torch

from ... import arguments
from ..captions import CAPTION_WORDS
from ..vocab import BOS, EOI, PAD, SLOT_WORDS, DemoVocab
from ..vq import VQConfig, VQModel, to_input
from . import data as D
from .vq_training import train_vq

LOSS_LOG = "loss_log.jsonl"
TRAINING_LOG = "training_log.json"


ARCHITECTURES = ("gpt2", "llama")
PROMPT_SLOTS = 20  # --prompt-slots for --arch gpt2: the longest training caption has 19 words


def lm_config(vocab: DemoVocab, hidden: int, layers: int, heads: int, intermediate: int, max_pos: int,
              arch: str = "llama"):
    """The LM's transformers config. ``gpt2`` has learned absolute position embeddings: with
    fixed-length prompts (the slot format, or ``--prompt-slots 20``) every image token has its own,
    so row and column are explicit inputs (initialised to a 2D sinusoidal grid,
    `init_grid_positions`). ``llama`` (1D RoPE, the shipped model and `main`'s default) infers row
    and column from distances and the row tokens, helped by the layout loss (README, "The bundled
    demo model")."""
    if arch == "gpt2":
        from transformers import GPT2Config

        return GPT2Config(
            vocab_size=vocab.vocab_size,
            n_positions=max_pos,
            n_embd=hidden,
            n_layer=layers,
            n_head=heads,
            n_inner=intermediate,
            activation_function="gelu_new",
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            layer_norm_epsilon=1e-5,
            tie_word_embeddings=False,
            bos_token_id=BOS,
            eos_token_id=EOI,
            pad_token_id=PAD,
            attn_implementation="sdpa",
        )
    if arch != "llama":
        raise ValueError(f"arch must be one of {ARCHITECTURES}, got {arch!r}")
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        intermediate_size=intermediate,
        max_position_embeddings=max_pos,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOI,
        pad_token_id=PAD,
        attn_implementation="sdpa",
    )


def grid_position_table(vocab: DemoVocab, hidden: int, amplitude: float = 0.05) -> torch.Tensor:
    """(num_image_tokens + 1, hidden): a 2D sinusoidal code of the grid cell each image position
    predicts: row r = t // 17 on the first half of the channels, column c = t % 17 (16: the
    <eol>) on the second, sines and cosines of periods from 2.5 to 48 tokens. Row t of the table
    belongs to the absolute position that predicts image token t (<boi> predicts token 0;
    t = 272 is <eoi>, row 16)."""
    t = torch.arange(vocab.num_image_tokens + 1, dtype=torch.float64)
    coords = (t // vocab.row_length, t % vocab.row_length)
    half = hidden // 2
    n_freq = half // 2
    periods = 2.5 * (48 / 2.5) ** (torch.arange(n_freq, dtype=torch.float64) / max(n_freq - 1, 1))
    parts = []
    for v in coords:
        ang = 2 * math.pi * v[:, None] / periods[None]
        parts += [torch.sin(ang), torch.cos(ang)]
    table = torch.cat(parts, 1)
    table = torch.cat([table, torch.zeros(len(t), hidden - table.shape[1], dtype=torch.float64)], 1)
    return (amplitude * table).float()


@torch.no_grad()
def init_grid_positions(model, vocab: DemoVocab) -> int:
    """Set a GPT-2's position embeddings of the image positions to `grid_position_table` (prompt
    positions keep their random initialisation; the embeddings train freely from there). Needs a
    fixed prompt length. Returns the first absolute position it set."""
    plen = vocab.prompt_length
    if plen is None:
        raise ValueError("grid position init needs fixed-length prompts (the slot format or --prompt-slots)")
    wpe = model.transformer.wpe.weight
    table = grid_position_table(vocab, wpe.shape[1])
    start = plen - 1  # the <boi> position predicts image token 0
    wpe[start : start + len(table)] = table.to(wpe.dtype)
    return start


def build_sequences(vocab: DemoVocab, captions: list[str], codes: torch.Tensor):
    """-> list of prompt id tensors (conditional), image id tensor (N, 272 + 1 with <eoi>)."""
    prompts = [vocab.prompt_ids(c) for c in captions]
    img = vocab.image_ids(codes)
    img = torch.cat([img, torch.full((img.shape[0], 1), EOI, dtype=torch.long)], 1)
    return prompts, img


def object_loss_weights(regions: np.ndarray, object_weight: float) -> torch.Tensor:
    """(N, 16, 16) object regions (`data.caption_regions`) -> (N, 273) loss weights in the image
    sequence's layout: ``1 + object_weight`` inside a region, 1 elsewhere and on <eol>/<eoi>.

    Objects are a tenth of an image and most of the loss is background texture, so the caption's
    objects barely move the gradient early in training. The regions come from the caption alone
    (where the named objects can be), not from the target pixels, so the weighting changes where
    the model spends its capacity but not the distribution it converges to."""
    w = 1.0 + object_weight * torch.as_tensor(regions, dtype=torch.float32)
    n, rows, cols = w.shape
    w = torch.cat([w, torch.ones(n, rows, 1)], 2).reshape(n, rows * (cols + 1))
    return torch.cat([w, torch.ones(n, 1)], 1)


def make_batch(vocab, prompts, img, idx, drop_mask, img_weights=None):
    """-> ids, labels (-100 outside the image part), and per-token loss weights (0 outside).

    A dropped caption gets uniform weights: its regions would leak the caption into the loss."""
    seqs, plen = [], []
    for j, i in enumerate(idx):
        p = vocab.uncond_prompt_ids() if drop_mask[j] else prompts[i]
        seqs.append(torch.cat([p, img[i]]))
        plen.append(len(p))
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), PAD, dtype=torch.long)
    labels = torch.full((len(seqs), T), -100, dtype=torch.long)
    weights = torch.zeros(len(seqs), T)
    for j, s in enumerate(seqs):
        ids[j, : len(s)] = s
        labels[j, plen[j] : len(s)] = s[plen[j] :]  # loss only on the image part (and <eoi>)
        weights[j, plen[j] : len(s)] = 1.0 if img_weights is None or drop_mask[j] else img_weights[idx[j]]
    return ids, labels, weights


def layout_sequences(vocab: DemoVocab, layouts: np.ndarray, cells: int = 1) -> torch.Tensor:
    """(N, 16, 16) `data.token_layout`s -> (N, 273) long in the image sequence's layout (row-end
    tokens and <eoi> are -100: they show nothing). Layouts of ``cells`` x ``cells`` sub-patches per
    token, (N, 16 * cells, 16 * cells) -> (N, 273, cells * cells): each token's sub-patches in
    raster order."""
    lay = torch.as_tensor(layouts, dtype=torch.long)
    n = lay.shape[0]
    rows, cols = lay.shape[1] // cells, lay.shape[2] // cells
    lay = lay.reshape(n, rows, cells, cols, cells).permute(0, 1, 3, 2, 4).reshape(n, rows, cols, cells * cells)
    lay = torch.cat([lay, torch.full((n, rows, vocab.row_length - cols, cells * cells), -100)], 2)
    lay = torch.cat([lay.reshape(n, rows * vocab.row_length, -1), torch.full((n, 1, cells * cells), -100)], 1)
    return lay.squeeze(-1) if cells == 1 else lay


def layout_labels(vocab: DemoVocab, prompts, layout_seq: torch.Tensor, idx, drop_mask, length: int) -> torch.Tensor:
    """The auxiliary head's targets for a batch of `make_batch`, aligned with its labels: which
    object each image token shows; -100 elsewhere and for dropped captions (without the caption
    the layout is not what the head should learn)."""
    out = torch.full((len(idx), length) + tuple(layout_seq.shape[2:]), -100, dtype=torch.long)
    for j, i in enumerate(idx):
        if not drop_mask[j]:
            plen = len(prompts[i])
            out[j, plen : plen + layout_seq.shape[1]] = layout_seq[i]
    return out


def weighted_lm_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy, weighted per target token (weights aligned with labels)."""
    ce = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100, reduction="none"
    )
    w = weights[:, 1:].reshape(-1)
    return (ce * w).sum() / w.sum().clamp(min=1e-6)


@torch.no_grad()
def eval_loss(model, vocab, prompts, img, batch_size=16, uncond=False):
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, len(prompts), batch_size):
        idx = list(range(i, min(i + batch_size, len(prompts))))
        ids, labels, _ = make_batch(vocab, prompts, img, idx, [uncond] * len(idx))
        logits = model(input_ids=ids).logits[:, :-1]
        tgt = labels[:, 1:]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-100, reduction="sum"
        )
        tot += loss.item()
        n += int((tgt != -100).sum())
    model.train()
    return tot / max(n, 1)


def write_generation_defaults(out: str, cfg_scale: float, temperature: float) -> None:
    """Name the weights' sampling defaults in their generation_config.json (``guidance_scale``,
    ``temperature``; the demo loader reads them, `models.demo.folder_defaults`)."""
    path = os.path.join(out, "generation_config.json")
    config = {}
    if os.path.exists(path):
        with open(path) as f:
            config = json.load(f)
    config.update({"do_sample": True, "guidance_scale": float(cfg_scale), "temperature": float(temperature)})
    with open(path, "w") as f:
        json.dump(config, f, indent=2)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="output directory (default: a temp dir for --smoke, else ./runs/demo)")
    ap.add_argument("--seed", type=arguments.seed, default=0)
    ap.add_argument("--images", type=arguments.whole(1, 10_000_000), default=12000, help="training images (generated, then VQ-encoded)")
    ap.add_argument("--texture", choices=list(D.TEXTURES), default="strong",
                    help="the backgrounds' cloud noise (data.TEXTURES; default strong: a token depends on its "
                         "neighbours as in natural images; fine: data v2's clouds)")
    ap.add_argument("--vq-steps", type=arguments.whole(1, 10_000_000), default=1500)
    ap.add_argument("--vq-crop", type=arguments.whole(0, 64, "0 trains on whole 64 px images"), default=32,
                    help="train the VQ on random crops of this many px (0: whole 64 px images)")
    ap.add_argument("--vq-batch", type=arguments.whole(1, 65_536), default=32)
    ap.add_argument("--vq-lr", type=arguments.real(0.0, 10.0, above=True), default=2e-3)
    ap.add_argument("--vq-edge-weight", type=arguments.real(0.0, 1e6), default=0.0,
                    help="weight of the VQ's L1 loss on pixel differences (sharper shape edges)")
    ap.add_argument("--codebook", type=arguments.whole(2, 65_536), default=512)
    ap.add_argument("--lm-steps", type=arguments.whole(1, 10_000_000), default=5400)
    ap.add_argument("--lm-stop-at", type=arguments.whole(1, 10_000_000), default=None,
                    help="stop after this many LM steps of the --lm-steps schedule (the learning rate has not "
                         "decayed to its end)")
    ap.add_argument("--lm-batch", type=arguments.whole(1, 65_536), default=16)
    ap.add_argument("--lm-lr", type=arguments.real(0.0, 10.0, above=True), default=2e-3)
    ap.add_argument("--hidden", type=arguments.whole(1, 65_536), default=128)
    ap.add_argument("--layers", type=arguments.whole(1, 1024), default=6)
    ap.add_argument("--heads", type=arguments.whole(1, 1024), default=4)
    ap.add_argument("--intermediate", type=arguments.whole(1, 1_000_000), default=512)
    ap.add_argument("--arch", choices=ARCHITECTURES, default="llama",
                    help="llama: 1D RoPE (default); gpt2: learned absolute positions, initialised to a 2D grid "
                         "(draws shapes better, but its tokens depend too little on their neighbours to stand in "
                         "for a real image model under SJD)")
    ap.add_argument("--prompt-format", choices=("slots", "words"), default=None,
                    help="slots: the structured caption, one fixed slot per fact (default); words: the caption's "
                         "words (the default with --prompt-slots)")
    ap.add_argument("--prompt-slots", type=arguments.whole(0, 4096, "0: prompts as long as their caption"), default=0,
                    help=f"the words format with this many fixed word slots, e.g. {PROMPT_SLOTS} (0: prompts as "
                         "long as their caption)")
    ap.add_argument("--no-grid-init", action="store_true",
                    help="gpt2: keep the random position embeddings instead of the 2D sinusoidal grid")
    ap.add_argument("--default-cfg-scale", type=arguments.real(0.0, 100.0), default=2.0,
                    help="the CFG scale the weights' generation_config.json names as their sampling default")
    ap.add_argument("--default-temperature", type=arguments.real(0.0, 100.0, above=True), default=0.8,
                    help="the temperature the weights' generation_config.json names as their sampling default")
    ap.add_argument("--row-tokens", action=argparse.BooleanOptionalAction, default=True,
                    help="close each image row with its own token (<eol0>..<eol15>; default) instead of the shared "
                         "<eol>")
    ap.add_argument("--caption-dropout", type=arguments.real(0.0, 1.0, below=True,
                                                             hint="the share of captions dropped, e.g. 0.12"),
                    default=0.12)
    ap.add_argument("--object-weight", type=arguments.real(0.0, 1e6), default=4.0,
                    help="extra loss weight on the image tokens where the caption puts an object (0: plain cross entropy)")
    ap.add_argument("--layout-weight", type=arguments.real(0.0, 1e6), default=4.0,
                    help="weight of an auxiliary loss: a linear head on the LM's last hidden state predicts which "
                         "object (none / first / second) each next image token shows (data.token_layout); dense "
                         "supervision of the caption's layout, used in training only (the head is not saved; 0: off)")
    ap.add_argument("--layout-cells", type=arguments.whole(1, 16), default=2,
                    help="with --layout-weight: predict the object of each of cells x cells sub-patches of the "
                         "next token (2, the default: the outline at 2 px, which is the shape and carries no "
                         "colour; 1: the whole token)")
    ap.add_argument("--ckpt-every", type=arguments.whole(1, 10_000_000), default=200)
    ap.add_argument("--threads", type=arguments.threads(allow_default=False), default=1,
                    help="torch threads (1 keeps a shared machine usable)")
    ap.add_argument("--vq-from", default=None, help="reuse a trained VQ from this dir instead of training one")
    ap.add_argument("--smoke", action="store_true", help="a handful of steps of every stage (CI)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.prompt_format is None:
        args.prompt_format = "words" if args.prompt_slots else "slots"
    if args.prompt_format == "slots" and args.prompt_slots:
        ap.error("--prompt-slots applies to --prompt-format words; the slot format has its own fixed length")
    if args.vq_crop < 0:
        ap.error("--vq-crop must be 0 (whole images) or a crop size in px")
    if args.layout_cells not in (1, 2, 4):
        ap.error("--layout-cells must divide a token's 4 px: 1, 2 or 4")
    if args.hidden % args.heads:
        ap.error(f"--hidden {args.hidden} must be a multiple of --heads {args.heads} (each head gets hidden / heads "
                 "channels); e.g. --hidden 128 --heads 4")
    if args.lm_stop_at is not None and not 1 <= args.lm_stop_at <= args.lm_steps:
        ap.error("--lm-stop-at must be a step of the schedule: between 1 and --lm-steps")

    if args.smoke:
        args.images, args.vq_steps, args.vq_batch = 48, 4, 8
        args.lm_steps, args.lm_batch, args.ckpt_every = 4, 4, 2
        args.lm_stop_at = None if args.lm_stop_at is None else min(args.lm_stop_at, args.lm_steps)
        args.hidden, args.layers, args.heads, args.intermediate = 32, 2, 2, 64
    if args.out is None:
        args.out = tempfile.mkdtemp(prefix="sjd_demo_smoke_") if args.smoke else os.path.join("runs", "demo")
    out = args.out
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(args.threads)
    progress = not args.no_progress
    t_wall0, t_cpu0 = time.time(), time.process_time()

    log_path = os.path.join(out, LOSS_LOG)
    log_f = open(log_path, "w")

    def log(rec):
        log_f.write(json.dumps(rec) + "\n")
        log_f.flush()

    # ---- 1. data -----------------------------------------------------------------------
    layouts = None
    if args.layout_weight:
        images, captions, layouts = D.generate(args.images, args.seed, "train", progress=progress, layouts=True,
                                               layout_cells=args.layout_cells, texture=args.texture)
    else:
        images, captions = D.generate(args.images, args.seed, "train", progress=progress, texture=args.texture)
    n_val = max(4, min(256, args.images // 50))
    val_images, val_captions = D.generate(n_val, args.seed, "train", start=args.images, texture=args.texture)
    ho_images, ho_captions = D.generate(n_val, args.seed, "heldout", texture=args.texture)
    t_data = time.process_time() - t_cpu0

    # ---- 2. VQ -------------------------------------------------------------------------
    vq_prev = None
    if args.vq_from:
        # reuse a VQ trained earlier (by this script, same seed and data); keep its training record
        vq = VQModel.from_pretrained(args.vq_from)
        vq_losses = {"reused_from": args.vq_from}
        prev_log = os.path.join(args.vq_from, TRAINING_LOG)
        if os.path.exists(prev_log):
            with open(prev_log) as f:
                prev = json.load(f)
            vq_prev = {"command": prev.get("command"), "vq": prev.get("vq"),
                       "cpu_time_by_stage_s": prev.get("cpu_time_by_stage_s")}
            vq_losses = {"reused_from": args.vq_from, **(prev.get("vq", {}).get("final_losses") or {})}
        vq.save_pretrained(out)
    else:
        vq, vq_losses = train_vq(
            images,
            args.vq_steps,
            batch_size=args.vq_batch,
            lr=args.vq_lr,
            seed=args.seed,
            config=VQConfig(codebook_size=args.codebook),
            log=log,
            progress=progress,
            checkpoint_every=max(100, args.vq_steps // 4),
            checkpoint_dir=out,
            edge_weight=args.vq_edge_weight,
            crop=args.vq_crop or None,
        )
        vq.save_pretrained(out)
        vq = VQModel.from_pretrained(out)  # what ships is fp16: tokenise with that
    t_vq = time.process_time() - t_cpu0 - t_data

    with torch.no_grad():
        codes = vq.encode(images)
        val_codes, ho_codes = vq.encode(val_images), vq.encode(ho_images)
        rec = vq.decode(val_codes)
        vq_val_mse = float(((rec - to_input(val_images)) ** 2).mean())
    used = int(torch.unique(codes).numel())
    print(f"VQ: val mse {vq_val_mse:.5f} (in [-1,1] units), codes used {used}/{args.codebook}", flush=True)
    log({"stage": "vq_eval", "val_mse": vq_val_mse, "codes_used": used})
    t_enc = time.process_time() - t_cpu0 - t_data - t_vq

    # ---- 3. vocabulary ------------------------------------------------------------------
    words = list(CAPTION_WORDS) + (SLOT_WORDS if args.prompt_format == "slots" else [])
    vocab = DemoVocab(words=words, codebook_size=args.codebook, grid=16, prompt_slots=args.prompt_slots or None,
                      row_tokens=args.row_tokens, prompt_format=args.prompt_format)
    vocab.save(out)
    prompts, img = build_sequences(vocab, captions, codes)
    img_weights = object_loss_weights(np.stack([D.caption_regions(c) for c in captions]), args.object_weight)
    vprompts, vimg = build_sequences(vocab, val_captions, val_codes)
    hprompts, himg = build_sequences(vocab, ho_captions, ho_codes)
    max_len = max(len(p) for p in prompts + hprompts) + img.shape[1]
    max_pos = 1 << (max_len - 1).bit_length()

    # ---- 4. LM -------------------------------------------------------------------------
    from transformers import GPT2LMHeadModel, LlamaForCausalLM

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed + 1)
    cfg = lm_config(vocab, args.hidden, args.layers, args.heads, args.intermediate, max_pos, args.arch)
    model = (GPT2LMHeadModel if args.arch == "gpt2" else LlamaForCausalLM)(cfg)
    grid_init = args.arch == "gpt2" and not args.no_grid_init and vocab.prompt_length is not None
    if grid_init:
        init_grid_positions(model, vocab)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"LM: {n_params / 1e6:.2f}M parameters, vocab {vocab.vocab_size}, max_pos {max_pos}", flush=True)
    layout_head = layout_seq = None
    if args.layout_weight:
        # per sub-patch of the next token: none / first object / second object
        layout_head = torch.nn.Linear(args.hidden, args.layout_cells ** 2 * (1 + 2))
        layout_seq = layout_sequences(vocab, layouts, args.layout_cells)
    trained = list(model.named_parameters()) + (list(layout_head.named_parameters()) if layout_head else [])
    decay = [p for n, p in trained if p.dim() >= 2]
    no_decay = [p for n, p in trained if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lm_lr,
        betas=(0.9, 0.95),
    )
    warm = max(1, min(100, args.lm_steps // 10))

    def lr_at(s):
        if s < warm:
            return args.lm_lr * (s + 1) / warm
        t = (s - warm) / max(1, args.lm_steps - warm)
        return args.lm_lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * t)))

    def write_training_log(status, step, extra):
        rec = {
            "status": status,
            "command": "python -m sjd_pac_core.demo.tools.train " + " ".join(sys.argv[1:] if argv is None else argv),
            "seed": args.seed,
            "images": args.images,
            "texture": args.texture,
            "vq": {
                "steps": args.vq_steps,
                "batch_size": args.vq_batch,
                "lr": args.vq_lr,
                "codebook_size": args.codebook,
                "edge_weight": args.vq_edge_weight,
                "crop": args.vq_crop or None,
                "params": sum(p.numel() for p in vq.parameters()),
                "final_losses": vq_losses,
                "val_mse": vq_val_mse,
                "codes_used": used,
            },
            "lm": {
                "steps_done": step,
                "steps": args.lm_steps,
                "batch_size": args.lm_batch,
                "lr": args.lm_lr,
                "caption_dropout": args.caption_dropout,
                "object_weight": args.object_weight,
                "layout_weight": args.layout_weight,
                "layout_cells": args.layout_cells,
                "params": n_params,
                "arch": args.arch,
                "prompt_format": vocab.prompt_format,
                "prompt_slots": vocab.prompt_slots,
                "grid_position_init": grid_init,
                "row_tokens": vocab.row_tokens,
                "hidden": args.hidden,
                "layers": args.layers,
                "heads": args.heads,
                "intermediate": args.intermediate,
                **extra,
            },
            "sampling_defaults": {"cfg_scale": args.default_cfg_scale, "temperature": args.default_temperature},
            "vq_trained_by": vq_prev,
            "threads": args.threads,
            "wall_time_s": round(time.time() - t_wall0, 1),
            "cpu_time_s": round(time.process_time() - t_cpu0, 1),
            "cpu_time_by_stage_s": {"data": round(t_data, 1), "vq": round(t_vq, 1), "encode": round(t_enc, 1)},
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
        }
        with open(os.path.join(out, TRAINING_LOG), "w") as f:
            json.dump(rec, f, indent=2)

    def checkpoint(status, step, extra):
        model.save_pretrained(out, safe_serialization=True)
        write_generation_defaults(out, args.default_cfg_scale, args.default_temperature)
        write_training_log(status, step, extra)

    stop = args.lm_steps if args.lm_stop_at is None else args.lm_stop_at
    it = range(stop)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(it, desc="lm", unit="step")
        it = bar
    model.train()
    ema = None
    for s in it:
        for pg in opt.param_groups:
            pg["lr"] = lr_at(s)
        idx = torch.randint(0, len(prompts), (args.lm_batch,), generator=g).tolist()
        drop = (torch.rand(args.lm_batch, generator=g) < args.caption_dropout).tolist()
        ids, labels, weights = make_batch(vocab, prompts, img, idx, drop, img_weights)
        out_lm = model(input_ids=ids, output_hidden_states=layout_head is not None)
        loss = weighted_lm_loss(out_lm.logits, labels, weights)
        if layout_head is not None:
            targets = layout_labels(vocab, prompts, layout_seq, idx, drop, ids.shape[1])
            aux = layout_head(out_lm.hidden_states[-1][:, :-1])
            layout_loss = torch.nn.functional.cross_entropy(aux.reshape(-1, 1 + 2), targets[:, 1:].reshape(-1),
                                                            ignore_index=-100)
            loss = loss + args.layout_weight * layout_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = loss.item()
        ema = lv if ema is None else 0.98 * ema + 0.02 * lv
        if bar is not None:
            bar.set_postfix(loss=f"{ema:.3f}")
        if s % 25 == 0 or s == stop - 1:
            log({"stage": "lm", "step": s, "loss": round(lv, 5), "loss_ema": round(ema, 5), "lr": lr_at(s),
                 "cpu_s": round(time.process_time() - t_cpu0, 1)})
        if args.ckpt_every and (s + 1) % args.ckpt_every == 0 and s + 1 < stop:
            checkpoint("partial", s + 1, {"train_loss_ema": ema})

    t_lm = time.process_time() - t_cpu0 - t_data - t_vq - t_enc
    val = eval_loss(model, vocab, vprompts, vimg)
    val_u = eval_loss(model, vocab, vprompts, vimg, uncond=True)
    ho = eval_loss(model, vocab, hprompts, himg)
    print(f"LM: train loss(ema) {ema:.4f}  val {val:.4f}  val-uncond {val_u:.4f}  heldout {ho:.4f}", flush=True)
    log({"stage": "lm_eval", "val_loss": val, "val_loss_uncond": val_u, "heldout_loss": ho})
    checkpoint(
        "complete" if stop == args.lm_steps else "stopped",
        stop,
        {"train_loss_ema": ema, "val_loss": val, "val_loss_uncond": val_u, "heldout_loss": ho,
         "cpu_time_s": round(t_lm, 1)},
    )
    log_f.close()
    print(f"done: {out}  cpu {time.process_time() - t_cpu0:.0f}s  wall {time.time() - t_wall0:.0f}s", flush=True)
    return out


if __name__ == "__main__":
    main()
