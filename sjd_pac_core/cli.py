"""Command line: `sjd-pac generate` (one image) and `sjd-pac bench` (the benchmark)."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import List, Optional

import torch


def _window_arg(text: str):
    return text if text == "auto" else int(text)


def _add_sampler_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampler (defaults: the model family's recommended settings)")
    g.add_argument("--method", choices=["ar", "sjd", "sjd_pac"], default="sjd_pac")
    g.add_argument("--window", "-L", type=_window_arg, default=None,
                   help="draft window L, or 'auto' (chosen from measured costs and acceptance)")
    g.add_argument("--tree-depth", "-D", type=int, default=None, help="PD tree depth D (counts the root)")
    g.add_argument("--tree-width", "-K", type=int, default=None, help="PD tree width K")
    g.add_argument("--no-ac", action="store_true", help="switch Adaptive Continuation off")
    g.add_argument("--no-pd", action="store_true", help="switch Proactive Drafting off")
    g.add_argument("--verify", choices=["rejection", "gumbel"], default="rejection",
                   help="gumbel = seed-exact: every method gives AR's exact picture for a seed")
    g.add_argument("--cfg", type=float, default=None, help="classifier-free guidance scale")
    g.add_argument("--temperature", type=float, default=None)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--top-p", type=float, default=None)


def _config_from_args(model, args):
    overrides = dict(method=args.method, verify=args.verify,
                     adaptive_continuation=not args.no_ac, proactive_drafting=not args.no_pd)
    for field, value in [("window", args.window), ("tree_depth", args.tree_depth),
                         ("tree_width", args.tree_width), ("cfg_scale", args.cfg),
                         ("temperature", args.temperature), ("top_k", args.top_k), ("top_p", args.top_p)]:
        if value is not None:
            overrides[field] = value
    return model.defaults.sampler_config(**overrides)


def _generate(args) -> int:
    import sjd_pac_core as sp
    from tqdm import tqdm

    if args.threads:
        torch.set_num_threads(args.threads)
    model = sp.load_model(args.model, dtype=args.dtype, device=args.device)
    config = _config_from_args(model, args)
    encoding_tokens = model.encode_prompt(args.prompt, args.negative_prompt, args.resolution).layout.num_tokens
    bar = tqdm(total=encoding_tokens * args.batch_size, unit="tok", desc=config.method, disable=args.quiet)

    def on_pass(progress: sp.Progress) -> None:
        bar.update(progress.record.committed)
        bar.set_postfix(passes=progress.stats.forward_passes, compression=f"{progress.stats.step_compression:.2f}x")

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.formatwarning = lambda msg, *a, **k: f"warning: {msg}\n"
        result = sp.generate_image(model, args.prompt, config=config, seed=args.seed,
                                   negative_prompt=args.negative_prompt, resolution=args.resolution,
                                   callback=on_pass, batch_size=args.batch_size)
    bar.close()
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = [out] if len(result.images) == 1 else [
        out.with_name(f"{out.stem}_{i}{out.suffix}") for i in range(len(result.images))
    ]
    for image, path in zip(result.images, paths):
        if args.upscale > 1:
            image = image.resize((image.width * args.upscale, image.height * args.upscale), resample=0)
        image.save(path)
    for stats in result.all_stats:
        print(stats.summary())
    print(f"model: {model.family} ({model.name}) on {model.device}; wrote {', '.join(map(str, paths))}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sjd-pac", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate an image and print the sampler's statistics")
    gen.add_argument("prompt")
    gen.add_argument("-o", "--output", default="out.png")
    gen.add_argument("--model", default="demo", help="'demo' or a local checkpoint folder")
    gen.add_argument("--negative-prompt", default="")
    gen.add_argument("--resolution", default=None,
                     help="WxH, one of the sizes the model was trained for (default: its own; a wrong one lists them)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--batch-size", type=int, default=1)
    gen.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    gen.add_argument("--device", default="auto")
    gen.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    gen.add_argument("--upscale", type=int, default=1, help="nearest-neighbour upscale of the saved PNG")
    gen.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_sampler_args(gen)
    gen.set_defaults(func=_generate)

    try:
        from .bench.cli import add_bench_parser
    except ImportError:  # the benchmark is optional
        pass
    else:
        add_bench_parser(sub, _add_sampler_args)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    from .config import ConfigError
    from .models.loader import ModelLoadError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, ModelLoadError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
