"""Measure how "real" the demo model looks to a speculative sampler.

    python -m sjd_pac_core.demo.tools.calibrate [--weights DIR] [--out calibration.json] [--docs docs]

Reports, on the model's own AR samples:
* mean per-token entropy (nats) of the image-code distribution at temperature 1, without and
  with top-k, and under the shipped sampling defaults (CFG, temperature);
* the locality curve: mean total variation between p_{i+d} with and without a change of the
  token at i, for d = 1..36 (image tokens of real models peak at d = 1 and one row below,
  d = 17 with the <eol> column, and again at d = 34);
* SJD step compression (image tokens per forward pass) at window 32 with the real per-position
  constraints (image codes at free positions, <eol> forced at every row end), through the
  library's ``sjd_pac_core.sample_tokens`` when it is importable, for the raw model and at the
  sampling defaults; SJD-PAC at window 64 likewise. The verification rule is stated: ``--verify
  rejection`` (the default) is the paper's rule, the one the 1.8-2.8x target for plain SJD at
  L=32 (real models: 2.2-2.3x) is measured with; ``--verify gumbel`` is the library's seed-exact
  default, which accepts differently.

The sampling defaults are the weights' own (their generation_config.json, read by the demo
loader), unless ``--cfg-scale`` / ``--temperature`` say otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Dict, List, Tuple

import numpy as np
import torch

from ... import arguments
from ...models.demo import DemoImageModel, folder_defaults
from .. import WEIGHTS_DIR
from ..model import load_demo, reference_ar_sample
from . import data as D
from .quality import trained_texture

CAPTIONS = [
    "a red circle top left on a blue background",
    "a large green triangle in the center on a black background",
    "a small yellow star bottom right on a purple background",
    "a large white ring in the center on a red background",
    "a blue square top right and a small orange diamond bottom left on a gray background",
    "a large pink circle left on a green background",
    "a cyan diamond bottom on a brown background",
    "a small black triangle top and a large yellow circle bottom on a white background",
]


def image_logits(demo, captions, tokens, uncond: bool = False):
    """Teacher-forced logits at the image positions: (B, 272, V); ``uncond``: with the
    unconditional prompt instead of the captions (for classifier-free guidance)."""
    vocab = demo.vocab
    prompts = [vocab.uncond_prompt_ids() if uncond else vocab.prompt_ids(c) for c in captions]
    out = []
    for p, t in zip(prompts, tokens):
        ids = torch.cat([p, t])[None]
        lg = demo.model(input_ids=ids).logits[0, len(p) - 1 : len(p) - 1 + len(t)]
        out.append(lg)
    return torch.stack(out)


def masked_probs(logits, allowed, top_k=None):
    l = logits.masked_fill(~allowed, float("-inf"))
    if top_k is not None:
        kth = torch.topk(l, top_k, dim=-1).values[..., -1:]
        l = l.masked_fill(l < kth, float("-inf"))
    return torch.softmax(l, -1)


def entropy(p):
    return -(p * torch.log(p.clamp_min(1e-30))).sum(-1)


@torch.no_grad()
def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", default=WEIGHTS_DIR)
    ap.add_argument("--out", default=None, help="json results (default: <weights>/calibration.json)")
    ap.add_argument("--docs", default=None, help="write demo_samples.png / demo_vq_recon.png / demo_data.png here")
    ap.add_argument("--samples", type=arguments.whole(0, 10_000), default=8, help="AR samples for entropy/locality")
    ap.add_argument("--perturb", type=arguments.whole(0, 10_000), default=24, help="perturbed positions per sample (locality)")
    ap.add_argument("--sjd-runs", type=arguments.whole(1, 10_000), default=8)
    ap.add_argument("--window", type=arguments.whole(1, 1024), default=32)
    ap.add_argument("--threads", type=arguments.threads(allow_default=False), default=1)
    ap.add_argument("--seed", type=arguments.seed, default=0)
    ap.add_argument("--cfg-scale", type=arguments.real(0.0, 100.0), default=None,
                    help="the sampling defaults measured besides the raw model (default: the weights' own)")
    ap.add_argument("--temperature", type=arguments.real(0.0, 100.0, above=True), default=None)
    ap.add_argument("--verify", choices=("rejection", "gumbel"), default="rejection",
                    help="verification rule of the SJD measurements (rejection: the paper's, which the "
                         "1.8-2.8x target is for)")
    ap.add_argument("--sjd-only", action="store_true", help="only the SJD L=window measurement (quick)")
    args = ap.parse_args(argv)
    defaults = folder_defaults(args.weights, DemoImageModel.defaults)
    if args.cfg_scale is None:
        args.cfg_scale = defaults.cfg_scale
    if args.temperature is None:
        args.temperature = defaults.temperature
    torch.set_num_threads(args.threads)
    demo = load_demo(args.weights)
    vocab = demo.vocab
    allowed, free = vocab.allowed_tokens(), free_positions(vocab)
    res = {"weights": os.path.relpath(os.path.abspath(args.weights))}
    t0 = time.time()

    if args.sjd_only:
        args.samples, args.perturb, args.docs = 0, 0, None
    caps = (CAPTIONS * ((args.samples + len(CAPTIONS) - 1) // len(CAPTIONS)))[: args.samples]
    if caps:
        toks = reference_ar_sample(demo, caps, seed=args.seed)
        print(f"AR samples: {time.time() - t0:.1f}s", flush=True)
        ent, res["entropy_by_row"], cond_logits = entropy_at_t1(demo, caps, toks)
        res["entropy_nats_T1"] = ent
        print("entropy", ent, flush=True)
        curve = locality_curve(demo, caps, toks, args.perturb, args.seed)
        res["locality_tv"] = {str(d): round(tv, 4) for d, tv in enumerate(curve, start=1)}
        print(f"locality TV d=1..{len(curve)}:", " ".join(f"{x:.3f}" for x in curve), flush=True)
        entropy_at_defaults(demo, caps, toks, cond_logits, allowed, free, args.cfg_scale, args.temperature, res)
    sjd_measure(demo, allowed, args, res)
    pictures(demo, toks if caps else None, args, res)
    res["wall_s"] = round(time.time() - t0, 1)
    out = args.out or os.path.join(args.weights, "calibration.json")
    with open(out, "w") as f:
        json.dump(res, f, indent=2)
    print("wrote", out)
    return res


@torch.no_grad()
def entropy_at_defaults(demo, caps, toks, lc, allowed, free, cfg_scale: float, temperature: float, res) -> None:
    """Mean per-token entropy of what the sampler draws from: CFG and temperature applied to the
    conditional logits ``lc`` (from `entropy_and_locality`) and the unconditional ones."""
    lu = image_logits(demo, caps, toks, uncond=True)
    guided = (lu + cfg_scale * (lc - lu)) / temperature
    res["sampling_defaults"] = {"cfg_scale": cfg_scale, "temperature": temperature}
    res["entropy_nats_defaults"] = float(entropy(masked_probs(guided, allowed[None]))[:, free].mean())
    print("entropy at the defaults", res["entropy_nats_defaults"], flush=True)


def free_positions(vocab) -> torch.Tensor:
    """bool [num_image_tokens]: the positions the sampler chooses (every one but the row ends)."""
    return ~torch.zeros(vocab.num_image_tokens, dtype=torch.bool).index_fill_(0, vocab.eol_positions(), True)


@torch.no_grad()
def entropy_at_t1(demo, caps, toks) -> Tuple[Dict[str, float], List[float], torch.Tensor]:
    """Mean per-token entropy (nats) at temperature 1 over the free positions of the AR samples
    ``toks`` (without top-k and with top-k 64, 16), its mean per image row, and the conditional
    image logits it computed (B, 272, V)."""
    allowed, free = demo.vocab.allowed_tokens(), free_positions(demo.vocab)
    lg = image_logits(demo, caps, toks)
    ent = {}
    for k in (None, 64, 16):
        p = masked_probs(lg, allowed[None], k)
        ent["all" if k is None else f"top_k={k}"] = float(entropy(p)[:, free].mean())
    # entropy per row (image structure: background rows vs object rows)
    p = masked_probs(lg, allowed[None])
    by_row = [round(float(x), 3) for x in entropy(p)[:, free].reshape(len(caps), 16, 16).mean((0, 2))]
    return ent, by_row, lg


@torch.no_grad()
def locality_curve(demo, caps, toks, perturb: int, seed: int, max_distance: int = 36) -> List[float]:
    """Mean total variation between p_{i+d} with and without a change of the token at i, for
    d = 1..max_distance, over ``perturb`` random free positions i of each AR sample in ``toks``
    (the new token drawn from the model's own p_i without the old one)."""
    vocab = demo.vocab
    allowed, free = vocab.allowed_tokens(), free_positions(vocab)
    p = masked_probs(image_logits(demo, caps, toks), allowed[None])
    g = torch.Generator().manual_seed(seed + 7)
    tv_sum = torch.zeros(max_distance + 1)
    tv_n = torch.zeros(max_distance + 1)
    free_idx = free.nonzero().squeeze(1)
    for b, c in enumerate(caps):
        prompt = vocab.prompt_ids(c)
        P = len(prompt)
        base = torch.cat([prompt, toks[b]])
        pos = free_idx[free_idx < vocab.num_image_tokens - 1]
        pick = pos[torch.randperm(len(pos), generator=g)[:perturb]]
        batch = base[None].repeat(len(pick) + 1, 1)
        for j, i in enumerate(pick.tolist()):
            # change the token at i to another code drawn from the model's own p_i
            pi = p[b, i].clone()
            pi[toks[b, i]] = 0
            new = torch.multinomial(pi / pi.sum(), 1, generator=g)
            batch[j + 1, P + i] = new
        lgb = demo.model(input_ids=batch).logits[:, P - 1 : P - 1 + vocab.num_image_tokens]
        pb = masked_probs(lgb, allowed[None])
        for j, i in enumerate(pick.tolist()):
            for d in range(1, max_distance + 1):
                t = i + d
                if t >= vocab.num_image_tokens or not free[t]:
                    continue
                tv = 0.5 * (pb[j + 1, t] - pb[0, t]).abs().sum()
                tv_sum[d] += tv
                tv_n[d] += 1
    return [float(x) for x in (tv_sum / tv_n.clamp_min(1))[1:]]


@torch.no_grad()
def sjd_measure(demo, allowed, args, res):
    """SJD / SJD-PAC step compression through the library's sample_tokens, with the demo's real
    per-position constraints, for the raw model and at the sampling defaults."""
    from ... import SamplerConfig, TokenConstraints, sample_tokens

    vocab = demo.vocab
    cons = TokenConstraints(vocab.vocab_size, vocab.num_image_tokens, allowed=allowed, forced=vocab.forced_tokens())
    sjd = {"verify": args.verify, "sampling_defaults": {"cfg_scale": args.cfg_scale, "temperature": args.temperature}}
    defaults = dict(cfg_scale=args.cfg_scale, temperature=args.temperature)
    rule = dict(verify=args.verify)
    settings = [
        ("sjd", dict(method="sjd", window=args.window, **rule)),
        ("sjd_defaults", dict(method="sjd", window=args.window, **defaults, **rule)),
    ]
    if not args.sjd_only:
        settings += [
            ("sjd_topk64", dict(method="sjd", window=args.window, top_k=64, **rule)),
            ("sjd_pac_L64", dict(method="sjd_pac", window=64, **rule)),
            ("sjd_pac_L64_defaults", dict(method="sjd_pac", window=64, **defaults, **rule)),
        ]
    print(f"SJD measurements: verify={args.verify}, defaults cfg_scale {args.cfg_scale} temperature "
          f"{args.temperature}", flush=True)
    for name, kw in settings:
        comps, times = [], []
        for r in range(args.sjd_runs):
            cap = CAPTIONS[r % len(CAPTIONS)]
            t1 = time.time()
            out = sample_tokens(demo.model, vocab.prompt_ids(cap), vocab.num_image_tokens, config=SamplerConfig(**kw),
                                seed=r, uncond_prompt_ids=vocab.uncond_prompt_ids(), allowed_tokens=cons)
            times.append(time.time() - t1)
            comps.append(float(out.stats.step_compression))
            vocab.codes_from_ids(out.tokens.reshape(-1)[-vocab.num_image_tokens :])  # layout check
        sjd[name] = {
            "mean": round(float(np.mean(comps)), 3),
            "min": round(float(np.min(comps)), 3),
            "max": round(float(np.max(comps)), 3),
            "runs": len(comps),
            "mean_wall_s": round(float(np.mean(times)), 2),
        }
        print(name, sjd[name], flush=True)
    res["sjd"] = sjd


@torch.no_grad()
def pictures(demo, toks, args, res):
    if args.docs and toks is not None:
        os.makedirs(args.docs, exist_ok=True)
        texture = trained_texture(args.weights)
        ims, _ = D.generate(16, seed=123, split="train", texture=texture)
        D.contact_sheet(ims, 8, 3).save(os.path.join(args.docs, "demo_data.png"))
        ho, _ = D.generate(8, seed=0, split="heldout", texture=texture)
        rec = demo.vq.decode_to_uint8(demo.vq.encode(np.concatenate([ims[:8], ho])))
        D.contact_sheet(np.concatenate([ims[:8], rec[:8], ho, rec[8:]]), 8, 3).save(
            os.path.join(args.docs, "demo_vq_recon.png")
        )
        cfg_toks = reference_ar_sample(
            demo, CAPTIONS, cfg_scale=args.cfg_scale, temperature=args.temperature, seed=args.seed + 1
        )
        arr = np.concatenate([demo.tokens_to_array(toks[: len(CAPTIONS)]), demo.tokens_to_array(cfg_toks)])
        D.contact_sheet(arr, 8, 3).save(os.path.join(args.docs, "demo_samples.png"))
        res["samples_png_captions"] = CAPTIONS


if __name__ == "__main__":
    main()
