"""The GPU benchmark in one command (issue 13, item 8): what a pass costs on real model shapes.

    python benchmarks/gpu_bench.py --device cuda --out runs/gpu          # on a machine with a GPU
    python benchmarks/gpu_bench.py --tiny --device cpu --out runs/tiny   # the same code, tiny shapes (CI)

Three parts, written to gpu_bench.json and gpu_bench.md in --out:

1. **Window-cost curve** t(L)/t(1), L = 1..96, for 7B-shaped models with random weights (no
   download: built from the config on the device) in bf16: Lumina-mGPT's Chameleon-7B shape at
   768x768 (2,356 image tokens) and Emu3-Gen's shape at 720x720 (8,193 image tokens), each at
   its real context (prompt + image tokens; measured half-way and at the end of the image), two
   rows (CFG), on a static KV cache (a pass of L tokens writes L slots that the next repetition
   overwrites: the rollback of a static cache), logits for the family's image vocabulary only
   (as the adapters compute them). Timed with device synchronisation, rounds interleaved over L,
   median per L.
2. **Sampler overhead per pass** on the same models: `sample_tokens` over the last image tokens
   at the real context, per method, from its `PassRecord`s (wall time minus forward time).
   Random weights give near-uniform distributions, so the acceptance is not the real models';
   the per-pass cost is what this measures.
3. **Weight-only quantization** (bench/quantized.py) on the first shape: bf16, int8 and 4-bit
   (torchao int8, bitsandbytes NF4 on CUDA) loaded through from_pretrained as load_model
   quantizes them: weight bytes, memory after loading, AR and SJD-PAC time per token in
   interleaved rounds, step compression, and whether SJD-PAC's tokens equal AR's.
4. **The demo rows** (`sjd-pac bench --methods baselines`: transformers' generate with dynamic /
   static / static + compiled cache, our AR, SJD and SJD-PAC eager and compiled) on the device.
4. **Node budgets** (`--budgets`, default 32,64,128,256 nodes per pass): a pass of 1 + B nodes
   (two rows each with CFG) against a one-token pass, timed as in part 1, and the budget
   drafter's sampler overhead per pass (`sjd-pac@64:bB` and `:bauto`, as in part 2). With the
   step compression the demo model counts at each budget (docs/benchmark.md, "Drafting within a
   node budget"), tokens per second = step compression / seconds per pass.

`--tiny` shrinks every shape (hidden 64, 2 layers, short contexts, L = 1..8) so the whole
script runs on a CPU in seconds; its numbers mean nothing, it proves the script runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import torch

from .. import arguments
from .shapes import CPU_SHAPES, SHAPES, TINY_SHAPES, Shape, build_random_model, image_token_ids, text_vocab  # noqa: F401


class DeviceTimer:
    """Wall clock with device synchronisation, so a GPU's queued kernels are counted."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __call__(self, fn: Callable[[], object]) -> float:
        self.sync()
        start = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - start


@torch.inference_mode()
def window_cost_curve(model, shape: Shape, windows: Sequence[int], context: int, rows: int, rounds: int,
                      device: torch.device, seed: int = 0) -> Dict[str, object]:
    """Median seconds of one pass of L tokens on top of `context` cached tokens, for every L."""
    from transformers import StaticCache

    g = torch.Generator().manual_seed(seed)
    ids = image_token_ids(shape, device)
    head = model.get_output_embeddings().weight.index_select(0, ids)  # the adapters' restricted head
    backbone = model.model
    largest = max(windows)
    cache = StaticCache(config=model.config, max_cache_len=context + largest)
    prompt = torch.randint(0, text_vocab(shape), (rows, context), generator=g).to(device)
    backbone(input_ids=prompt, cache=cache, use_cache=True)
    draft = ids[torch.randint(0, shape.image_vocab, (rows, largest), generator=g).to(device)]

    def one_pass(n: int) -> Callable[[], object]:
        positions = torch.arange(context, context + n, device=device)

        def run():
            hidden = backbone(input_ids=draft[:, :n], cache=cache, use_cache=True,
                              position_ids=positions.unsqueeze(0).expand(rows, -1)).last_hidden_state
            logits = torch.nn.functional.linear(hidden, head)
            cache.crop(-n)  # a static cache's rollback: move the write pointer back, nothing is copied
            return logits

        return run

    timer = DeviceTimer(device)
    for n in (1, largest):  # warm-up: kernels, allocator
        timer(one_pass(n))
    samples: Dict[int, List[float]] = {n: [] for n in windows}
    order = list(windows)
    for r in range(rounds):  # rounds interleave the sizes, so drifting load hits all alike
        order = order[::-1] if r % 2 else order
        for n in order:
            samples[n].append(timer(one_pass(n)))
    seconds = {n: statistics.median(v) for n, v in samples.items()}
    base = seconds[windows[0]]
    return {"context": context, "rows": rows, "rounds": rounds,
            "ms": {n: 1000 * s for n, s in seconds.items()},
            "ratio": {n: s / base for n, s in seconds.items()}}


def sampler_overhead(model, shape: Shape, methods: Sequence[str], tokens: int, cfg_scale: float,
                     device: torch.device, seed: int = 0) -> List[Dict[str, object]]:
    """Per method: forward and outside-forward milliseconds per pass from the PassRecords of one
    `sample_tokens` run over the last `tokens` image tokens at the shape's real context."""
    from ..engine.loop import sample_tokens
    from ..models.causal_lm import CausalLMAdapter
    from .methods import parse_method

    g = torch.Generator().manual_seed(seed)
    adapter = CausalLMAdapter(model, token_space=image_token_ids(shape, device))
    prompt = torch.randint(0, text_vocab(shape), (shape.context - tokens,), generator=g)
    uncond = prompt[:8].clone()
    from ..config import SamplerConfig

    base = SamplerConfig(cfg_scale=cfg_scale, temperature=1.0, window=32)
    rows_per_pass = 2 if cfg_scale != 1.0 else 1
    kv_bytes_per_token = (rows_per_pass * shape.layers * 2 * shape.kv_heads * (shape.hidden // shape.heads)
                          * model.dtype.itemsize)
    rows = []
    for key in methods:
        spec = parse_method(key)
        config = spec.config(base)
        if config.compile:  # compile outside the measured run
            sample_tokens(adapter, prompt, min(tokens, 8), config=config, seed=seed + 1, uncond_prompt_ids=uncond)
        stats = sample_tokens(adapter, prompt, tokens, config=config, seed=seed, uncond_prompt_ids=uncond).stats
        records = stats.records[1:]  # the prompt's prefill is not a sampler pass
        passes = len(records)
        fwd = sum(r.forward_time for r in records)
        wall = sum(r.wall_time for r in records)
        tree = [r for r in records if r.tree_nodes > 0]
        rows.append({"method": key, "passes": passes, "tokens": tokens, "step_compression": stats.step_compression,
                     "forward_ms_per_pass": 1000 * fwd / max(1, passes),
                     "overhead_ms_per_pass": 1000 * (wall - fwd) / max(1, passes),
                     "overhead_pct_of_forward": 100 * (wall - fwd) / fwd if fwd > 0 else None,
                     "tree_passes": len(tree),
                     "compaction_bytes_max_per_tree_pass": max((r.compaction_bytes for r in tree), default=0),
                     "compaction_bytes_per_tree_pass": sum(r.compaction_bytes for r in tree) / max(1, len(tree)),
                     # the bound: accepted tokens x layers x K,V x heads x head_dim x dtype, per CFG row
                     "compaction_within_bound": sum(r.compaction_bytes <= (r.committed - 1) * kv_bytes_per_token
                                                    for r in tree),
                     "kv_bytes_per_token": kv_bytes_per_token})
    return rows


def demo_rows(device: str, methods: str, prompts: int, seeds: Sequence[int], warmup: bool) -> Dict[str, object]:
    """`sjd-pac bench --methods ...` on the demo model on the device: the summary table."""
    import sjd_pac_core as sp

    from .methods import parse_methods
    from .report import markdown_table, to_json
    from .runner import load_prompts, run_bench

    model = sp.load_model("demo", device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_bench(model, load_prompts("demo", prompts), list(seeds), parse_methods(methods),
                           warmup=warmup, progress=False)
    data = to_json(result)
    return {"summary": data["summary"], "findings": data["findings"], "markdown": markdown_table(data["summary"]),
            "prompts": prompts, "seeds": list(seeds), "methods": methods}


def _environment(device: torch.device) -> Dict[str, object]:
    env = {"device": str(device), "torch": torch.__version__, "threads": torch.get_num_threads(),
           "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


def budget_report(part: Dict[str, object]) -> List[str]:
    """The node-budget table: a pass's cost at each budget and the budget drafter's overhead."""
    curve = part["curve"]
    overhead = {row["method"].rpartition(":b")[2]: row for row in part["overhead"]}
    lines = ["", f"Node budgets (context {curve['context']}, two rows per node with CFG):", "",
             "| budget B (nodes per pass) | pass of 1 + B nodes, ms | vs a one-token pass | "
             "budget drafter: forward ms/pass | overhead ms/pass |", "|---|---|---|---|---|"]
    for size, ms in curve["ms"].items():
        budget = int(size) - 1
        if budget < 1:
            continue
        row = overhead.get(str(budget))
        drafter = f"{row['forward_ms_per_pass']:.2f} | {row['overhead_ms_per_pass']:.2f}" if row else "- | -"
        lines.append(f"| {budget} | {ms:.2f} | {curve['ratio'][size]:.2f} | {drafter} |")
    if "auto" in overhead:
        row = overhead["auto"]
        lines.append(f"| auto (per pass) | - | - | {row['forward_ms_per_pass']:.2f} | {row['overhead_ms_per_pass']:.2f} |")
    return lines


def markdown_report(result: Dict[str, object]) -> str:
    lines = [f"# GPU benchmark ({result['environment'].get('gpu') or result['environment']['device']}, "
             f"{result['dtype']}, torch {result['environment']['torch']}, {result['environment']['date_utc']})", ""]
    for shape in result["shapes"]:
        info = shape["shape"]
        lines.append(f"## {info['note']}: {info['layers']} layers, hidden {info['hidden']}, "
                     f"{shape['shape']['image_vocab']} image codes, random weights")
        curves = shape["curves"]
        head = "| L | " + " | ".join(f"ms @ ctx {c['context']} | t(L)/t(1)" for c in curves) + " |"
        lines += ["", head, "|" + "---|" * (1 + 2 * len(curves))]
        for n in curves[0]["ms"]:
            cells = " | ".join(f"{c['ms'][n]:.2f} | {c['ratio'][n]:.2f}" for c in curves)
            lines.append(f"| {n} | {cells} |")
        lines += ["", "| method (sampler overhead) | passes | forward ms/pass | overhead ms/pass | % of forward | "
                  "tree passes | compaction KB per tree pass, mean / max | within the accepted-tokens bound |",
                  "|---|---|---|---|---|---|---|---|"]
        for row in shape["overhead"]:
            pct = "-" if row["overhead_pct_of_forward"] is None else f"{row['overhead_pct_of_forward']:.1f}%"
            tree = row.get("tree_passes", 0)
            moved = (f"{row['compaction_bytes_per_tree_pass'] / 1024:.0f} / "
                     f"{row['compaction_bytes_max_per_tree_pass'] / 1024:.0f}") if tree else "-"
            bound = f"{row['compaction_within_bound']} of {tree}" if tree else "-"
            lines.append(f"| {row['method']} | {row['passes']} | {row['forward_ms_per_pass']:.2f} | "
                         f"{row['overhead_ms_per_pass']:.2f} | {pct} | {tree} | {moved} | {bound} |")
        if shape["overhead"] and shape["overhead"][0].get("kv_bytes_per_token"):
            lines.append(f"\nOne token's keys and values (all layers, CFG rows): "
                         f"{shape['overhead'][0]['kv_bytes_per_token'] / 1024:.0f} KB.")
        if shape.get("budgets"):
            lines += budget_report(shape["budgets"])
        lines.append("")
    if result.get("quantized"):
        lines += [result["quantized"]["markdown"], ""]
    if result.get("demo"):
        lines += ["## Demo model rows", "", result["demo"]["markdown"], ""]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny shapes and sizes: runs on a CPU in seconds (CI)")
    p.add_argument("--shapes", default=None,
                   help=f"comma-separated, from {', '.join([*SHAPES, *CPU_SHAPES])} (default: the GPU shapes); "
                        f"{', '.join(CPU_SHAPES)} runs on a CPU in fp32")
    p.add_argument("--max-window", type=arguments.whole(1, 1024), default=None, help="curve for L = 1..this (default 96; tiny 8)")
    p.add_argument("--windows", default=None, help="curve at these L only, comma-separated (overrides --max-window)")
    p.add_argument("--rounds", type=arguments.whole(1, 10_000), default=None, help="timed rounds per L (default 5; tiny 2)")
    p.add_argument("--context-fractions", default="0.5,1.0",
                   help="where in the image the curve is measured: fractions of the image tokens done")
    p.add_argument("--overhead-tokens", type=arguments.whole(1, 1_000_000), default=None, help="image tokens per overhead run (256; tiny 8)")
    p.add_argument("--overhead-methods", default="ar,sjd@32,sjd-pac@32,sjd-pac@64,sjd-pac@64:gumbel")
    p.add_argument("--compile", action="store_true", help="add compiled rows (SamplerConfig(compile=True))")
    p.add_argument("--budgets", type=arguments.budget_list, default=None,
                   help="node budgets to time, comma-separated (default 32,64,128,256; tiny: none); 'none' skips")
    p.add_argument("--demo-methods", default=None,
                   help="demo rows (default: the baselines preset; tiny: ar,generate,sjd-pac@16)")
    p.add_argument("--demo-prompts", type=arguments.whole(1, 100_000), default=None, help="demo prompts (default 20; tiny 1)")
    p.add_argument("--demo-seeds", type=arguments.seed_list, default=[0])
    p.add_argument("--no-demo", action="store_true")
    p.add_argument("--quantized-shape", default=None,
                   help="shape of the quantized rows (default: the first shape); 'none' skips them")
    p.add_argument("--quantized-tokens", type=arguments.whole(1, 1_000_000), default=None, help="image tokens per quantized run (64; tiny 8)")
    p.add_argument("--out", default="runs/gpu_bench")
    args = p.parse_args(argv)

    from ..models.loader import resolve_device
    from .methods import BASELINE_METHODS

    device = resolve_device(args.device)
    table = TINY_SHAPES if args.tiny else {**SHAPES, **CPU_SHAPES}
    names = [s.strip() for s in (args.shapes or ",".join(TINY_SHAPES if args.tiny else SHAPES)).split(",")
             if s.strip()]
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"unknown shape {unknown[0]!r}; choose from {', '.join(table)}.")
    if device.type != "cuda" and not args.tiny and any(n in SHAPES for n in names):
        raise SystemExit(f"device {device} is not a GPU: the 7B shapes need one; add --tiny for the CPU check, "
                         f"or --shapes {', '.join(CPU_SHAPES)} for the CPU target.")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # CPUs run the fp32 the CPU target names
    windows = ([int(w) for w in args.windows.split(",")] if args.windows
               else list(range(1, (args.max_window or (8 if args.tiny else 96)) + 1)))
    largest = max(windows)
    rounds = args.rounds or (2 if args.tiny else 5)
    fractions = [float(f) for f in args.context_fractions.split(",")]
    overhead_tokens = args.overhead_tokens or (8 if args.tiny else 256)
    overhead_methods = [m for m in args.overhead_methods.split(",") if m]
    chosen = args.budgets if args.budgets is not None else ([] if args.tiny else [32, 64, 128, 256])
    budgets = [b for b in chosen if isinstance(b, int)]  # none skips the part; auto runs with any budget
    budget_methods = [f"sjd-pac@64:b{b}" for b in budgets] + (["sjd-pac@64:bauto"] if budgets else [])
    if args.compile:
        overhead_methods += [f"{m}:compile" for m in overhead_methods if ":compile" not in m]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: Dict[str, object] = {"environment": _environment(device), "dtype": str(dtype).replace("torch.", ""),
                                 "tiny": args.tiny,
                                 "shapes": [], "demo": None}
    start = time.perf_counter()
    for name in names:
        shape = table[name]
        print(f"{name}: building a random model on {device} ...", flush=True)
        model = build_random_model(shape, dtype, device)
        curves = []
        for f in fractions:
            context = shape.prompt_tokens + max(1, int(round(f * shape.image_tokens)) - largest)
            print(f"  window-cost curve at context {context}, L in {windows[0]}..{largest}", flush=True)
            curves.append(window_cost_curve(model, shape, windows, context, rows=2,
                                            rounds=rounds, device=device))
        print(f"  sampler overhead: {', '.join(overhead_methods)}", flush=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            overhead = sampler_overhead(model, shape, overhead_methods, overhead_tokens, cfg_scale=3.0, device=device)
        budget_part = None
        if budgets:
            print(f"  node budgets: passes of 1 + {', '.join(map(str, budgets))} nodes", flush=True)
            sizes = [1] + [1 + b for b in budgets]
            context = shape.prompt_tokens + max(1, shape.image_tokens - max(sizes))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                budget_part = {"curve": window_cost_curve(model, shape, sizes, context, rows=2, rounds=rounds,
                                                          device=device),
                               "overhead": sampler_overhead(model, shape, budget_methods, overhead_tokens,
                                                            cfg_scale=3.0, device=device)}
        result["shapes"].append({"shape": asdict(shape), "curves": curves, "overhead": overhead,
                                 "budgets": budget_part})
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    quantized_shape = args.quantized_shape or names[0]
    if quantized_shape != "none":
        from ..models.quantize import available_precisions
        from .quantized import markdown as quantized_markdown, quantized_rows

        precisions = available_precisions(device)
        print(f"quantized rows on {quantized_shape}: {', '.join(precisions)}", flush=True)
        result["quantized"] = quantized_rows(table[quantized_shape], device, precisions,
                                             tokens=args.quantized_tokens or (8 if args.tiny else 64),
                                             rounds=1 if args.tiny else 3, window=8 if args.tiny else 32)
        result["quantized"]["markdown"] = quantized_markdown(result["quantized"])
    if not args.no_demo:
        methods = args.demo_methods or ("ar,generate,sjd-pac@16" if args.tiny else BASELINE_METHODS)
        print(f"demo rows: {methods}", flush=True)
        result["demo"] = demo_rows(str(device), methods, args.demo_prompts or (1 if args.tiny else 20),
                                   args.demo_seeds, warmup=not args.tiny)
    result["seconds"] = time.perf_counter() - start
    (out / "gpu_bench.json").write_text(json.dumps(result, indent=1, default=float))
    report = markdown_report(result)
    (out / "gpu_bench.md").write_text(report + "\n")
    print(report)
    print(f"wrote {out / 'gpu_bench.json'}, {out / 'gpu_bench.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
