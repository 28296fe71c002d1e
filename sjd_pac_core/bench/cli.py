"""`sjd-pac bench` (speed: the paper's tables on our models) and `sjd-pac lossless` (exactness).

    sjd-pac bench                                   # demo model, the paper's grid, all demo prompts
    sjd-pac bench --prompts 4 --methods ar,sjd@32,sjd-pac@64,sjd-pac@auto --out runs/quick
    sjd-pac bench --model /models/Lumina-mGPT-7B-768 --prompt-set general --prompts 50 --threads 0
    sjd-pac bench --methods baselines --prompts 12    # transformers generate, static+compiled, ours eager/compiled
    sjd-pac bench --methods rules --prompts 8         # rejection vs gumbel: SJD/+AC/+PD/SJD-PAC x L 16/32/64/auto
    sjd-pac bench --variants sjd,sjd-pac --windows 32 --rules rejection,gumbel --prompts 2
    sjd-pac bench --numerics --prompts 10 --seeds 0-1  # fp32 vs bf16 token flips under verify=gumbel
    sjd-pac lossless                                # == sjd-pac bench --check-lossless

Writes results.json, results.md and the PNG figures into --out (see docs/benchmark.md).
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import torch

from .. import arguments
from ..settings import config_from_settings
from .lossless import DEFAULT_CONTROL_TEMPERATURE
from .methods import (DEFAULT_METHODS, PRESETS, RULE_VARIANTS, RULE_WINDOWS, MethodSpec, parse_methods,
                      parse_seeds, rule_grid, with_budgets, with_rules)
from .report import keep_all
from .runner import load_prompts

LOSSLESS_METHODS = "sjd-pac@64"
LOSSLESS_PROMPTS = 2
LOSSLESS_SEEDS = "0-119"


def _common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="demo", help="'demo' or a local checkpoint folder (anything load_model accepts)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"],
                   help="weights' precision: auto (the default) is bf16 on GPUs that support it, else fp32")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N (N = 0, 1, ...) or mps")
    p.add_argument("--prompt-set", default=None,
                   help="demo, general or a text file (one prompt per line); default: demo for the demo "
                        "model, general otherwise")
    p.add_argument("--prompts", type=arguments.whole(1, 100_000, "leave it out for every prompt of the set"),
                   default=None, help="use only the first N prompts")
    p.add_argument("--seeds", type=arguments.seed_list, default=None,
                   help=f"seeds: 0 | 0,1,2 | 0-9 (bench default 0; lossless 0-119; at most {arguments.MAX_SEEDS:,})")
    p.add_argument("--methods", type=arguments.nonempty("methods", "ar,sjd-pac@64"), default=None,
                   help=f"comma-separated grid or a preset ({', '.join(PRESETS)}, rules); default: paper = "
                        f"{DEFAULT_METHODS}. sjd+pd / sjd+ac are SJD-PAC with only one of its two parts; "
                        "generate / generate-static are transformers' generate with our recipe in a logits "
                        "processor; ':gumbel' / ':rejection' fixes a row's rule, ':compile' compiles it, "
                        "':d2:k4:f8:s16' sets a tree's depth, width, first-level width (f0: uniform) and side "
                        "chain (s0: none), ':b128' a node budget per pass")
    p.add_argument("--rules", type=arguments.nonempty("rules", "rejection,gumbel"), default=None,
                   help="run every method without its own rule under each of these (rejection,gumbel)")
    p.add_argument("--budgets", type=arguments.budget_list, default=None,
                   help="node-budget axis: every sjd-pac row without its own ':bB' once per budget, nodes per "
                        "pass (with CFG each node is two rows): e.g. none,32,64,128,256 (none: the row's own "
                        "window and tree; auto: chosen per pass from the measured cost curve)")
    p.add_argument("--variants", type=arguments.nonempty("variants", "sjd,sjd-pac"), default=None,
                   help=f"rule grid: these variants x --windows x --rules, plus AR (default {','.join(RULE_VARIANTS)})")
    p.add_argument("--windows", type=arguments.nonempty("windows", "16,32"), default=None,
                   help=f"rule grid: windows (default {','.join(RULE_WINDOWS)})")
    p.add_argument("--out", default=None, help="output folder (default runs/bench or runs/lossless)")
    p.add_argument("--threads", type=arguments.threads(), default=1,
                   help="torch CPU threads (default 1: repeatable on a shared machine; 0 = torch's default)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _lossless_args(p: argparse.ArgumentParser, in_bench: bool) -> None:
    g = p.add_argument_group("lossless check" + (" (with --check-lossless)" if in_bench else ""))
    g.add_argument("--ar-source", choices=["auto", "reference", "loop"], default="auto",
                   help="AR samples from the demo's batched reference sampler (auto: when it applies) "
                        "or the library's own AR loop")
    g.add_argument("--control-temperature", type=arguments.real(0.0, 1.0, below=True, hint="0 = no control"),
                   default=DEFAULT_CONTROL_TEMPERATURE,
                   help="negative control: AR at this fraction of the temperature must FAIL "
                        f"(default {DEFAULT_CONTROL_TEMPERATURE}; 0 = none)")
    g.add_argument("--gumbel-pairs", type=arguments.whole(0, 1000, "0 skips the token-identical check"), default=3, help="(prompt, seed) pairs for the token-identical check")
    g.add_argument("--permutations", type=arguments.whole(1, 1_000_000, "1999 lets p fall below 0.001"),
                   default=1999,
                   help="relabellings per permutation test (>= 1999 so that p can fall below 0.001)")


def add_bench_parser(subparsers, add_sampler_args: Callable[[argparse.ArgumentParser], None]) -> None:
    bench = subparsers.add_parser(
        "bench", help="benchmark AR / SJD / SJD-PAC: step compression, latency speedup, overhead, plots",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common_args(bench)
    bench.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up run of each method")
    bench.add_argument("--no-plots", action="store_true", help="write results.json and results.md only, no PNG figures")
    bench.add_argument("--locality-samples", type=arguments.whole(0, 1000, "0 skips the locality curve"), default=4,
                       help="AR samples for the locality curve (demo model; 0 = skip)")
    bench.add_argument("--numerics", action="store_true",
                       help="count fp32 vs bf16 token flips under verify='gumbel' instead (demo model; no timing)")
    bench.add_argument("--check-lossless", action="store_true",
                       help="run the lossless check (two-sample tests vs AR + gumbel identity) instead")
    _lossless_args(bench, in_bench=True)
    add_sampler_args(bench)
    bench.set_defaults(func=_bench, method=None)

    lossless = subparsers.add_parser(
        "lossless", help="show losslessness: two-sample tests AR vs SJD-PAC, gumbel token identity",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common_args(lossless)
    _lossless_args(lossless, in_bench=False)
    add_sampler_args(lossless)
    lossless.set_defaults(func=_lossless, method=None)


# --- shared setup ------------------------------------------------------------------------------


def _split(text: Optional[str]) -> List[str]:
    return [t.strip().lower() for t in (text or "").split(",") if t.strip()]


def _grid_from_args(args, default: str) -> List[MethodSpec]:
    specs = _grid_before_compile(args, default)
    if getattr(args, "compile", False):  # --compile: every row of ours compiled (generate rows say it themselves)
        specs = [s if s.variant.startswith("generate") else replace(s, compiled=True) for s in specs]
    return specs


def _grid_before_compile(args, default: str) -> List[MethodSpec]:
    if getattr(args, "node_budget", None) is not None:
        raise ValueError("In bench a node budget is a row's own: write --budgets 32,64,128 (every sjd-pac row "
                         "once per budget) or a method such as sjd-pac@64:b128, not --node-budget.")
    rules = _split(getattr(args, "rules", None))
    bad = sorted(set(rules) - {"rejection", "gumbel"})
    if bad:
        raise ValueError(f"--rules {args.rules!r}: use rejection, gumbel or both, comma-separated.")
    variants, windows = _split(getattr(args, "variants", None)), _split(getattr(args, "windows", None))
    if variants or windows or (args.methods or "").strip().lower() == "rules":
        if args.methods and args.methods.strip().lower() != "rules":
            raise ValueError("Give the grid either with --methods or with --variants/--windows, not both.")
        return rule_grid(variants or RULE_VARIANTS, windows or RULE_WINDOWS, rules or ("rejection", "gumbel"))
    specs = with_budgets(_grid_single_or_list(args, default), getattr(args, "budgets", None) or ())
    return with_rules(specs, rules) if rules else specs


def _grid_single_or_list(args, default: str) -> List[MethodSpec]:
    no_ac, no_pd = not args.adaptive_continuation, not args.proactive_drafting
    single = args.method is not None or args.window is not None or no_ac or no_pd
    if args.methods and single:
        raise ValueError("Give the grid either with --methods or with --method/--window/--no-adaptive-continuation/"
                         "--no-proactive-drafting, not both.")
    if single:
        method = args.method or "sjd_pac"
        window = args.window if args.window is not None else 64
        variant = {"ar": "ar", "sjd": "sjd"}.get(method) or (
            "sjd-pac" if not (no_ac or no_pd) else ("sjd+pd" if no_ac else "sjd+ac"))
        if no_ac and no_pd and method == "sjd_pac":
            variant = "sjd"
        specs = [MethodSpec("ar")]
        if variant != "ar":
            specs.append(MethodSpec(variant, window))
        return specs
    return parse_methods(args.methods or default)


def _base_config(model, args):
    """The settings every benchmarked method shares, through the one conversion the CLI, nodes and
    app use (top-k 0 and top-p 1 are off, --tree-first-width 0 is K at every level, --tree-side-chain
    counts, --tree-chain-width too); each method then sets its own method, window, rule and tree shape."""
    shared = ("tree_depth", "tree_width", "tree_side_chain", "tree_first_width", "tree_chain_width", "verify",
              "cfg_scale", "temperature", "top_k", "top_p")
    return config_from_settings(model.defaults, **{name: getattr(args, name) for name in shared})


def _setup(args):
    import sjd_pac_core as sp

    if args.threads:
        torch.set_num_threads(args.threads)
    model = sp.load_model(args.model, dtype=args.dtype, device=args.device)
    prompt_set = args.prompt_set or ("demo" if model.family == "demo" else "general")
    return model, prompt_set


# --- bench -------------------------------------------------------------------------------------


def _bench(args) -> int:
    if args.check_lossless:
        return _lossless(args)
    if args.numerics:
        return _numerics(args)
    from .report import write_outputs
    from .runner import run_bench
    from .summary import summarise

    methods = _grid_from_args(args, DEFAULT_METHODS)
    model, prompt_set = _setup(args)
    prompts = load_prompts(prompt_set, args.prompts)
    seeds = args.seeds or [0]
    base = _base_config(model, args)
    out = Path(args.out or "runs/bench")
    n_runs = len(prompts) * len(seeds) * len(methods)
    if not args.quiet:
        print(f"sjd-pac bench: {model.family} on {model.device}, {len(prompts)} prompts x {len(seeds)} seeds x "
              f"{len(methods)} methods = {n_runs} runs, torch threads {torch.get_num_threads()}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. unknown prompt words: said once below, not per run
        result = run_bench(model, prompts, seeds, methods, base, warmup=not args.no_warmup, progress=not args.quiet)
    summary = summarise(result.runs, [m.key for m in methods])
    figures: List[str] = []
    locality = None
    extra = []
    paths = write_outputs(result, out)  # first, so a failing figure never loses a long run's numbers
    if not args.no_plots:
        figures, locality = _bench_plots(result, summary, out, args, model)
        extra.append("figures: " + ", ".join(figures))
        paths = write_outputs(result, out, extra_md="\n".join(extra))
    if figures:  # the locality numbers also go into the JSON
        data = json.loads(paths["json"].read_text())
        data["figures"] = figures
        data["locality"] = locality
        paths.update(keep_all({"json": (paths["json"], json.dumps(data, indent=1, default=float))}))
    print(paths["markdown"].read_text())
    print(f"wrote {paths['json']}, {paths['markdown']}" + (f" and {len(figures)} figures" if figures else ""))
    return 0


def _pick(summary, variant: str, prefer: Optional[int] = None) -> Optional[str]:
    """The key of `variant` with the best step compression (or window `prefer` if present)."""
    keys = [k for k in summary if k.split("@")[0] == variant and not k.endswith("@auto")]
    if prefer is not None and f"{variant}@{prefer}" in keys:
        return f"{variant}@{prefer}"
    return max(keys, key=lambda k: summary[k]["step_compression"], default=None)


def _bench_plots(result, summary, out: Path, args, model) -> Tuple[List[str], Optional[dict]]:
    """Write the figures; -> (their file names, the locality measurement or None)."""
    from . import plots
    from .locality import measure_locality
    from .methods import parse_method
    from .summary import acceptance_histogram

    written: List[str] = []
    locality = None
    hist_keys = [k for k in (_pick(summary, "sjd", 32), _pick(summary, "sjd-pac")) if k]
    if not hist_keys:  # any windowed method will do
        hist_keys = [k for k in summary if k != "ar"][:2]
    if hist_keys:
        hists = {parse_method(k).label: acceptance_histogram(result.runs, k) for k in hist_keys}
        written.append(plots.acceptance_histograms(hists, out / "acceptance_hist.png").name)
    if any("@" in k for k in summary):
        written.append(plots.compression_vs_window(summary, out / "compression_vs_L.png").name)
    if any(row.get("speedup_median") is not None for row in summary.values()) and len(summary) > 1:
        labels = {k: parse_method(k).label for k in summary}
        written.append(plots.speedup_bars(summary, labels, out / "speedup.png").name)
    if args.locality_samples > 0:
        start = time.perf_counter()
        loc = measure_locality(model, samples=args.locality_samples)
        if loc is not None:
            loc["seconds"] = time.perf_counter() - start
            locality = loc
            written.append(plots.locality_curve(loc["tv"], out / "locality.png", row_length=loc["row_length"]).name)
        elif not args.quiet:
            print("locality curve: only for the demo model (sjd_pac_core.demo.tools.calibrate); skipped")
    return written, locality


# --- numerics ----------------------------------------------------------------------------------


def _numerics(args) -> int:
    from .numerics import markdown_report, measure_flips

    if args.threads:
        torch.set_num_threads(args.threads)
    prompt_set = args.prompt_set or "demo"
    prompts = load_prompts(prompt_set, args.prompts or 10)
    seeds = args.seeds or [0]
    methods = parse_methods(args.methods or "sjd-pac@32")
    out = Path(args.out or "runs/numerics")
    out.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = measure_flips(args.model, prompts, seeds, methods, progress=not args.quiet)
    report = markdown_report(result)
    paths = keep_all({"json": (out / "numerics.json", json.dumps(result, indent=1, default=float)),
                      "markdown": (out / "numerics.md", report + "\n")})
    print(report)
    print(f"wrote {paths['json']}, {paths['markdown']}")
    return 0


# --- lossless ----------------------------------------------------------------------------------


def _lossless(args) -> int:
    from .lossless import check_lossless, markdown_report

    methods = _grid_from_args(args, LOSSLESS_METHODS)
    model, prompt_set = _setup(args)
    prompts = load_prompts(prompt_set, args.prompts or LOSSLESS_PROMPTS)
    seeds = args.seeds or parse_seeds(LOSSLESS_SEEDS)
    base = _base_config(model, args)
    out = Path(args.out or "runs/lossless")
    out.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = check_lossless(model, prompts, seeds, methods, base, ar_source=args.ar_source,
                                control_temperature=args.control_temperature or None,
                                gumbel_pairs=args.gumbel_pairs, permutations=args.permutations,
                                progress=not args.quiet)
    images = result.pop("gumbel_images")
    samples = result.pop("_samples")
    torch.save(samples, out / "samples.pt")  # the sampled tokens, to rerun the tests offline
    if images:
        _image_pairs(images, out / "gumbel_pairs.png")
    report = markdown_report(result)
    paths = keep_all({"json": (out / "lossless.json", json.dumps(result, indent=1, default=float)),
                      "markdown": (out / "lossless.md", report + "\n")})
    print(report)
    print(f"wrote {paths['json']}, {paths['markdown']}, samples.pt" + (", gumbel_pairs.png" if images else ""))
    return 0 if result["passed"] else 1


def _image_pairs(rows, path: Path, scale: int = 3) -> None:
    """AR's picture next to SJD-PAC's for the same seed (verify='gumbel': they must be identical)."""
    from PIL import Image, ImageDraw

    from .plots import TEXT, WHITE, load_font

    w, h = rows[0][0][1].size
    side = max(1, min(scale, 256 // max(w, h))) if max(w, h) < 256 else 1
    cell_w, cell_h = w * side, h * side
    cols = len(rows[0])
    img = Image.new("RGB", (cols * (cell_w + 10) + 10, len(rows) * (cell_h + 24) + 10), WHITE)
    draw = ImageDraw.Draw(img)
    for r, row in enumerate(rows):
        for c, (label, picture) in enumerate(row):
            x, y = 10 + c * (cell_w + 10), 10 + r * (cell_h + 24)
            draw.text((x, y), label, fill=TEXT, font=load_font(12))
            img.paste(picture.convert("RGB").resize((cell_w, cell_h), Image.NEAREST), (x, y + 18))
    img.save(path, optimize=True)
