"""How often floating-point near-ties flip a token under verify="gumbel" (issue 15, item 4).

The guarantee of the gumbel rule: token_t = argmax(log p_t + G_t), with G_t fixed by (seed, t)
alone. Because the noise never depends on the prefix, every method draws exactly from p, in
distribution, always. Token identity with plain AR holds up to floating-point ties: SJD-PAC
computes p_t in a pass of a different shape (a window, a tree) than AR does, and in bf16 two
candidates whose `log p + G` differ by less than the rounding can swap. This module counts it
(it never times anything):

* **fp32 vs bf16, same prefix** (teacher-forced): the fp32 AR sample's tokens are fed through
  the model in fp32 and in bf16 in one forward each; at every free position the gumbel decision
  `argmax(log p + G)` is taken from both, and we count the positions where they differ (the
  per-decision flip rate of the dtype). The fp32 teacher-forced decisions are also compared with
  the fp32 AR sample itself: a forward over the whole sequence against one token at a time,
  i.e. a batch-shape change in fp32.
* **whole images**: AR fp32 vs AR bf16, and each method vs AR within bf16 (and within fp32):
  images identical, the first differing position, and a per-decision flip rate estimated from
  them (differing images / free decisions made before the first difference, the geometric MLE).
"""

from __future__ import annotations

import statistics
import time
from typing import Dict, List, Optional, Sequence

import torch

from ..config import SamplerConfig
from ..engine.loop import sample_tokens
from ..models.image_model import ARImageModel, PromptEncoding
from ..models.loader import load_model
from ..sampling.recipe import SamplingRecipe, processed_logits
from ..sampling.verify import gumbel_noise
from .baselines import causal_lm_of
from .methods import MethodSpec


def _tokens(model: ARImageModel, encoding: PromptEncoding, config: SamplerConfig, seed: int) -> torch.Tensor:
    out = sample_tokens(model, encoding.prompt_ids, encoding.layout.num_tokens, config=config, seed=seed,
                        uncond_prompt_ids=encoding.uncond_ids if config.uses_cfg else None,
                        allowed_tokens=encoding.constraints)
    return out.tokens.cpu()


@torch.inference_mode()
def gumbel_scores(model: ARImageModel, encoding: PromptEncoding, tokens: torch.Tensor, config: SamplerConfig,
                  seed: int) -> torch.Tensor:
    """log p_t + G_t [N, V] at every image position, less a constant per row (the processed
    logits, as the rule's target takes them), teacher-forced on `tokens` in one forward per
    prompt row: the quantity whose argmax the gumbel rule commits."""
    lm, token_space = causal_lm_of(model)
    model_tokens = tokens if token_space is None else token_space.cpu()[tokens]
    rows = [encoding.prompt_ids] + ([encoding.uncond_ids] if config.uses_cfg else [])
    logits = []
    for prompt in rows:  # one row at a time: no padding, nothing but the dtype differs
        ids = torch.cat([prompt.reshape(-1), model_tokens[:-1]]).unsqueeze(0).to(model.device)
        row = lm(input_ids=ids).logits[0, prompt.numel() - 1:]
        logits.append(row if token_space is None else row.index_select(-1, token_space))
    n = tokens.numel()
    positions = torch.arange(n, device=model.device)
    recipe = SamplingRecipe(config.cfg_scale, config.temperature, config.top_k, config.top_p)
    processed = processed_logits(torch.stack(logits), positions, recipe, encoding.constraints.to(model.device))
    return (processed + gumbel_noise(seed, positions, processed.shape[-1])).float().cpu()


def _first_difference(a: torch.Tensor, b: torch.Tensor) -> Optional[int]:
    diff = (a != b).nonzero()
    return None if diff.numel() == 0 else int(diff[0])


def _top2_gap(scores: torch.Tensor) -> torch.Tensor:
    top = torch.topk(scores, 2, dim=-1).values
    return top[:, 0] - top[:, 1]


def _image_comparison(pairs: List[tuple], free: torch.Tensor) -> dict:
    """pairs: (tokens a, tokens b) per image -> identical share, first differences, flip rate."""
    firsts = [_first_difference(a, b) for a, b in pairs]
    differing = [f for f in firsts if f is not None]
    # free decisions taken with the same prefix: up to and including the first difference
    decisions = sum(int(free[: (f + 1 if f is not None else free.numel())].sum()) for f in firsts)
    return {"images": len(pairs), "identical": len(pairs) - len(differing),
            "first_difference": differing,
            "first_difference_median": statistics.median(differing) if differing else None,
            "decisions": decisions,
            "flip_rate_per_decision": len(differing) / decisions if decisions else 0.0}


def measure_flips(model_name: str, prompts: Sequence[str], seeds: Sequence[int], methods: Sequence[MethodSpec],
                  progress: bool = True) -> Dict[str, object]:
    """Count fp32/bf16 token flips under verify='gumbel' (see the module docstring)."""
    from tqdm import tqdm

    start = time.perf_counter()
    models = {"fp32": load_model(model_name, dtype="fp32", device="cpu"),
              "bf16": load_model(model_name, dtype="bf16", device="cpu")}
    causal_lm_of(models["fp32"])  # the teacher-forced count needs a plain causal LM: say so before any work
    base = models["fp32"].defaults.sampler_config(verify="gumbel")
    ar = MethodSpec("ar").config(base)
    configs = {m.key: m.config(base).with_(verify="gumbel") for m in methods if m.variant != "ar"}
    tf = {"decisions": 0, "flips_fp32_vs_bf16": 0, "flips_fp32_whole_vs_incremental": 0,
          "gap_at_flips": [], "gap_quantiles_fp32": {}}
    images: Dict[str, List[tuple]] = {"ar fp32 vs ar bf16": []}
    for key in configs:
        images[f"{key} vs ar (bf16)"] = []
        images[f"{key} vs ar (fp32)"] = []
    gaps: List[torch.Tensor] = []
    free = None
    jobs = [(p, s) for p in prompts for s in seeds]
    for prompt, seed in tqdm(jobs, desc="numerics", disable=not progress):
        enc = {k: m.encode_prompt(prompt) for k, m in models.items()}
        free = enc["fp32"].constraints.forced.cpu() < 0
        ar_tokens = {k: _tokens(models[k], enc[k], ar, seed) for k in models}
        images["ar fp32 vs ar bf16"].append((ar_tokens["fp32"], ar_tokens["bf16"]))
        for key, config in configs.items():
            for dtype in ("bf16", "fp32"):
                images[f"{key} vs ar ({dtype})"].append((_tokens(models[dtype], enc[dtype], config, seed),
                                                         ar_tokens[dtype]))
        scores = {k: gumbel_scores(models[k], enc[k], ar_tokens["fp32"], ar, seed) for k in models}
        d32, d16 = scores["fp32"].argmax(-1), scores["bf16"].argmax(-1)
        flips = (d32 != d16) & free
        tf["decisions"] += int(free.sum())
        tf["flips_fp32_vs_bf16"] += int(flips.sum())
        tf["flips_fp32_whole_vs_incremental"] += int(((d32 != ar_tokens["fp32"]) & free).sum())
        gap = _top2_gap(scores["fp32"])
        tf["gap_at_flips"] += [round(float(g), 5) for g in gap[flips]]
        gaps.append(gap[free])
    all_gaps = torch.cat(gaps)
    tf["gap_quantiles_fp32"] = {q: float(torch.quantile(all_gaps, q / 100)) for q in (1, 5, 50)}
    tf["share_of_gaps_below_0.01"] = float((all_gaps < 0.01).float().mean())
    tf["flip_rate_fp32_vs_bf16"] = tf["flips_fp32_vs_bf16"] / max(1, tf["decisions"])
    return {
        "model": model_name, "prompts": list(prompts), "seeds": list(seeds),
        "recipe": {k: getattr(base, k) for k in ("cfg_scale", "temperature", "top_k", "top_p")},
        "methods": list(configs),
        "teacher_forced": tf,
        "images": {name: _image_comparison(pairs, free) for name, pairs in images.items()},
        "torch_threads": torch.get_num_threads(),
        "seconds": time.perf_counter() - start,
    }


def markdown_report(result: Dict[str, object]) -> str:
    tf = result["teacher_forced"]
    recipe = ", ".join(f"{k}={v}" for k, v in result["recipe"].items())
    lines = [
        f"model {result['model']}, {len(result['prompts'])} prompts x {len(result['seeds'])} seeds, verify='gumbel', "
        f"{recipe}; bf16 = the model's weights and matmuls in bfloat16 on the CPU",
        "",
        "| same prefix (teacher-forced on the fp32 AR sample) | free decisions | flips | rate |",
        "|---|---|---|---|",
        f"| fp32 vs bf16 | {tf['decisions']} | {tf['flips_fp32_vs_bf16']} | {tf['flip_rate_fp32_vs_bf16']:.2e} |",
        f"| fp32 whole-sequence forward vs fp32 AR (one token per pass) | {tf['decisions']} | "
        f"{tf['flips_fp32_whole_vs_incremental']} | "
        f"{tf['flips_fp32_whole_vs_incremental'] / max(1, tf['decisions']):.2e} |",
        "",
        "| whole images | images | identical | first difference (median position) | flip rate per decision |",
        "|---|---|---|---|---|",
    ]
    for name, row in result["images"].items():
        first = "-" if row["first_difference_median"] is None else f"{row['first_difference_median']:g}"
        lines.append(f"| {name} | {row['images']} | {row['identical']} | {first} | "
                     f"{row['flip_rate_per_decision']:.2e} |")
    q = tf["gap_quantiles_fp32"]
    lines += ["", f"top-2 gap of log p + G (fp32): 1% quantile {q[1]:.4f}, 5% {q[5]:.4f}, median {q[50]:.3f}; "
                  f"gaps at the flipped decisions: {tf['gap_at_flips'][:12]}"]
    return "\n".join(lines)
