"""Command line: `sjd-pac generate` (one image), `sjd-pac batch` (many) and `sjd-pac bench` (the benchmark).

Every argument, the output path included, is parsed and checked before torch is imported or a
model is loaded: `--help` and a mistyped flag answer at once, and a run never fails at its end
because of a setting that could have been checked at its start.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Iterator, List, Optional

# Only light modules at import time: config and settings import neither torch nor transformers.
from . import arguments
from .config import ConfigError
from .files import FileSaveError, check_file_name, interrupts_deferred, keep
from .demo import EXAMPLE_PROMPT, quantize_refusal
from .images import MAX_UPSCALE, UPSCALE_FILTERS, png_bytes
from .settings import SETTINGS, config_from_settings, flag, seed_value

DEVICE_NAMES = "auto, cpu, cuda, cuda:N (N = 0, 1, ...) or mps"
DTYPE_HELP = "weights' precision: auto (the default) is bf16 on GPUs that support it, else fp32"
BENCH_COMMANDS = ("bench", "lossless")


class ArgumentError(ValueError):
    """A command-line argument is wrong; the message says which and how to fix it."""


# --- checks shared with `sjd-pac bench` ----------------------------------------------------------
def _probe_folder(folder: Path, flag: str) -> None:
    """Create `folder` if needed and prove that a file can be written in it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ArgumentError(
            f"{flag}: cannot write into {folder} ({reason.lower()}); choose a folder you can write to."
        ) from None


def check_writable_folder(path: str, flag: str = "--out") -> Path:
    """The folder `path`, created if missing, after proving it can be written (before any work)."""
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ArgumentError(f"{flag} {path} is a file, not a folder; give a folder for the results.")
    _probe_folder(folder, flag)
    return folder


def image_extensions() -> List[str]:
    """File extensions PIL can write an image to (.png, .jpg, ...)."""
    from PIL import Image

    Image.init()
    return sorted(ext for ext, fmt in Image.registered_extensions().items() if fmt in Image.SAVE)


def check_image_path(path: str, flag: str = "--output") -> Path:
    """An image file path that can be written: not a folder, a known extension, a writable folder."""
    out = Path(path).expanduser()
    check_file_name(out, flag)  # before any look at the path: a name too long makes stat() fail
    if path.endswith(("/", os.sep)) or out.is_dir():
        raise ArgumentError(f"{flag} {path} is a folder; give a file name such as {out / 'out.png'}.")
    if not out.suffix:
        raise ArgumentError(f"{flag} {path} has no file extension; add one, e.g. {path}.png.")
    if out.suffix.lower() not in image_extensions():
        raise ArgumentError(
            f"{flag} {path}: '{out.suffix}' is not an image format this Pillow can write; use .png, .jpg or .webp."
        )
    _probe_folder(out.parent, flag)
    if out.exists() and not os.access(out, os.W_OK):
        raise ArgumentError(f"{flag} {path} exists and cannot be overwritten; choose another file name.")
    return out


def check_device(name: str, flag: str = "--device") -> str:
    """A device name the loader understands (whether it is present is checked when loading)."""
    if re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", name):
        return name
    raise ArgumentError(f"{flag} {name!r} is not a device name; use {DEVICE_NAMES}.")


# --- argument types (argparse turns their errors into one usage line) ----------------------------
def _add_sampler_args(p: argparse.ArgumentParser) -> None:
    """The sampler's flags: each is its SamplerConfig field with dashes (settings.flag), and lands
    in `args` under the field's name."""
    g = p.add_argument_group("sampler (defaults: the model family's recommended settings)")
    g.add_argument(flag("method"), choices=["ar", "sjd", "sjd_pac"], default="sjd_pac",
                   help="ar: one token per forward pass; sjd: a window of drafts verified per pass; sjd_pac "
                        "(default): sjd with Adaptive Continuation and Proactive Drafting (all three lossless)")
    g.add_argument(flag("window"), "-L", type=arguments.window, default=None,
                   help="draft window L (1-1024), or 'auto' (chosen from measured costs and acceptance); "
                        "default: the model's (demo 12, the others 64), or 'auto' with --node-budget")
    g.add_argument(flag("tree_depth"), "-D", type=int, default=None,
                   help="PD tree depth D (counts the root); the tree's cost grows as K^(D-1)")
    g.add_argument(flag("tree_width"), "-K", type=int, default=None, help="PD tree width K")
    g.add_argument(flag("tree_first_width"), type=int, default=None,
                   help="candidates at the tree's first level (default: the model's - 8, or K at every "
                        "level for the demo; 0 = K at every level: -D 2 -K 4 --tree-first-width 0 is the "
                        "fastest tree measured on a CPU)")
    g.add_argument(flag("tree_side_chain"), type=int, default=None,
                   help="drafts hung off each one-deviation tree leaf (0 = off: fewer nodes per pass, "
                        "cheaper on a CPU)")
    g.add_argument(flag("tree_chain_width"), type=int, default=None,
                   help="candidates at every chain position past the tree (1 = off, the default; 3 adds "
                        "2 x (L - D + 1) nodes per pass and the most tokens per pass measured, for hardware "
                        "where nodes are nearly free; needs a fixed window)")
    g.add_argument(flag("node_budget"), type=arguments.node_budget, default=None,
                   help="nodes per pass (rows beyond the root; x2 with CFG): the window and tree are then "
                        "chosen every pass from the acceptance measured in the run (replaces the tree "
                        "flags; a --window given caps the main chain, else it may reach the budget); "
                        "'auto' also picks the budget from measured pass costs; 0 = off (the default)")
    g.add_argument(flag("adaptive_continuation"), action=argparse.BooleanOptionalAction, default=True,
                   help="Adaptive Continuation (sjd_pac; on by default)")
    g.add_argument(flag("proactive_drafting"), action=argparse.BooleanOptionalAction, default=True,
                   help="Proactive Drafting (sjd_pac; on by default)")
    g.add_argument(flag("verify"), choices=["rejection", "gumbel"], default="gumbel",
                   help="gumbel (default) = seed-exact: every method gives AR's picture for a seed; "
                        "rejection = the paper's speculative rejection sampling (both exact in distribution)")
    g.add_argument(flag("cfg_scale"), type=float, default=None, help="classifier-free guidance scale (1 = off)")
    g.add_argument(flag("temperature"), type=float, default=None,
                   help="sampling temperature, above 0 (1 = the model's own distribution; default: the "
                        "model's)")
    g.add_argument(flag("top_k"), type=int, default=None, help="0 = off")
    g.add_argument(flag("top_p"), type=float, default=None, help="1 = off")
    g.add_argument(flag("compile"), action="store_true",
                   help="compile the fixed-shape forward pass with torch.compile: faster passes after a "
                        "first run that compiles (about 6 s per pass shape on a CPU, cached on disk)")


def _config_from_args(args, defaults=None):
    """The run's SamplerConfig: settings.config_from_settings over the family's defaults."""
    return config_from_settings(defaults, **{name: getattr(args, name) for name in SETTINGS})


def validate_generate_args(args: argparse.Namespace) -> None:
    """Every check `generate` can make without torch or the model; raises ConfigError/ArgumentError."""
    if not args.prompt.strip():
        raise ArgumentError(f"The prompt is empty; say what to draw, e.g. \"{EXAMPLE_PROMPT}\".")
    check_demo_prompt(args.model, args.prompt)
    if args.model == "demo" and args.quantize not in ("none", "auto"):
        raise ArgumentError(quantize_refusal(f"--quantize {args.quantize}", "leave --quantize out"))
    _config_from_args(args)  # window, D/K budget, temperature, top-k/p, CFG (family defaults come later)
    seed_value(args.seed)  # -1 (random) or 0..2^64-1; generate_image draws a random one
    check_device(args.device)
    args.output = str(check_image_path(args.output))
    for path in _output_paths(Path(args.output), args.batch_size):
        check_file_name(path)  # with the batch's _N


def check_demo_prompt(model: str, prompt: str) -> None:
    """A prompt the demo model cannot read is refused from its vocabulary file, before its weights load."""
    from .demo import WEIGHTS_DIR
    from .demo.captions import check_prompt

    check_prompt(prompt, WEIGHTS_DIR if model == "demo" else Path(model).expanduser())


def encode_with_settings(image, path: Path, record: dict) -> bytes:
    """`image` in the format of `path`'s extension; a PNG also carries the run record (prompt, seed,
    every knob) as JSON text."""
    import io

    from PIL import Image

    image_format = Image.registered_extensions()[path.suffix.lower()]
    if image_format == "PNG":
        return png_bytes(image, record)
    buffer = io.BytesIO()
    image.save(buffer, format=image_format)
    return buffer.getvalue()


def _output_paths(out: Path, count: int) -> List[Path]:
    return [out] if count == 1 else [out.with_name(f"{out.stem}_{i}{out.suffix}") for i in range(count)]


@contextlib.contextmanager
def _no_transformers_bars() -> Iterator[None]:
    """transformers' progress bars (its "Loading weights" bar) off inside the block, as they were after."""
    from transformers.utils import logging as transformers_logging

    was = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            transformers_logging.enable_progress_bar()


def check_resolution_for_folder(model: str, resolution: Optional[str]) -> None:
    """A size the checkpoint was not trained for is refused from its folder's config.json and name
    alone, before any weight is read (the loaded model would refuse it only after loading)."""
    if resolution is None:
        return
    from .models.loader import folder_resolutions

    try:
        family, sizes = folder_resolutions(model)
    except ValueError:
        return  # not a checkpoint folder: load_model says what is wrong with it
    if sizes is not None and resolution not in sizes:
        raise ArgumentError(
            f"--resolution {resolution}: the {family} checkpoint in {model} was trained for {', '.join(sizes)}; "
            "choose one of these (the first is its default)."
        )


def _generate(args) -> int:
    import sjd_pac_core as sp
    from tqdm import tqdm

    from .images import upscale
    from .pass_cost import run_pace
    from .settings import pointless_setting_warnings, run_record, seed_note, settings_line
    from .threads import threads_for, torch_threads

    check_resolution_for_folder(args.model, args.resolution)
    with _no_transformers_bars() if args.quiet else contextlib.nullcontext():
        model = sp.load_model(args.model, dtype=args.dtype, device=args.device, quantize=args.quantize,
                              check_finite=True if args.check_finite else None)
    if model.memory_plan is not None and not args.quiet:
        print(model.memory_plan.one_line(model.quantize), file=sys.stderr)
    config = _config_from_args(args, model.defaults)
    encoding = model.encode_prompt(args.prompt, args.negative_prompt, args.resolution)
    encoding_tokens = encoding.layout.num_tokens
    bar = tqdm(total=encoding_tokens * args.batch_size, unit="tok", desc=config.method, disable=args.quiet)
    pace = None

    def on_pass(progress: sp.Progress) -> None:
        bar.update(progress.record.committed)
        bar.set_postfix(passes=progress.stats.forward_passes,
                        tokens_per_pass=f"{progress.stats.step_compression:.2f}")
        slow_now = pace.during(progress.stats) if pace is not None else None
        if slow_now:  # measured on this run's first passes; said once
            bar.write(f"warning: {slow_now}", file=sys.stderr)

    threads = args.threads if args.threads else threads_for(model)
    with warnings.catch_warnings(), torch_threads(threads) as threads_used:  # restores showwarning
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *_, **__: print(f"warning: {message}", file=sys.stderr)
        for message in pointless_setting_warnings(config):
            warnings.warn(message)
        pace = run_pace(model, encoding, config)  # a few timed passes, before the run
        if pace.before:
            warnings.warn(pace.before)
        result = sp.generate_image(model, args.prompt, config=config, seed=args.seed,
                                   negative_prompt=args.negative_prompt, resolution=args.resolution,
                                   callback=on_pass, batch_size=args.batch_size, threads=None)  # set above
    bar.close()
    cpu_threads = threads_used if model.device.type == "cpu" else None
    files = []
    for image, path, seed in zip(result.images, _output_paths(Path(args.output), len(result.images)),
                                 result.image_seeds):  # each file reproduces its image
        record = run_record(config, prompt=args.prompt, seed=seed, random_seed=seed_value(args.seed) is None,
                            negative_prompt=args.negative_prompt, resolution=result.encoding.resolution,
                            model=args.model, family=model.family, device=str(model.device), threads=cpu_threads)
        files.append((path, encode_with_settings(upscale(image, args.upscale, args.upscale_filter), path, record)))
    paths = []
    with interrupts_deferred():  # Ctrl-C now stops once every image made is written, none half-written
        for path, data in files:
            kept = keep(path, data)  # a full disk: the image goes to the temp dir, and we say where
            if kept.moved:
                print(f"warning: {kept.note}", file=sys.stderr)
            paths.append(kept.path)
    print(f"settings: {settings_line(config, cpu_threads)}; seed {result.seed}")
    note = seed_note(config)
    if note:
        print(f"note: {note}.")
    for stats in result.all_stats:
        print(f"{stats.method}: {stats.tokens_committed} tokens in {stats.forward_passes} forward passes = "
              f"{stats.step_compression:.2f} tokens per forward pass (plain AR: 1), {stats.wall_time:.2f} s")
    print(f"model: {model.family} ({model.name}) on {model.device}; wrote {', '.join(map(str, paths))}")
    return 0


def build_parser(argv: Optional[List[str]] = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sjd-pac", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate an image and print the sampler's statistics")
    gen.add_argument("prompt", help="what to draw (the demo model knows 33 words: colours, shapes, sizes, places)")
    gen.add_argument("-o", "--output", default="out.png", help="image file (.png, .jpg, .webp, ...)")
    gen.add_argument("--model", default="demo", help="'demo' or a local checkpoint folder")
    gen.add_argument("--negative-prompt", default="",
                     help="what to steer away from, through classifier-free guidance (default: none)")
    gen.add_argument("--resolution", default=None,
                     help="WxH, one of the sizes the model was trained for (default: its own; a wrong one lists them)")
    gen.add_argument("--seed", type=int, default=0, help="0 to 2^64-1; -1 picks a random one (printed)")
    gen.add_argument("--batch-size", type=arguments.whole(1, 64), default=1,
                     help="images to make (1-64), with seeds seed, seed+1, ...; files out_0.png, out_1.png, ...")
    gen.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"], help=DTYPE_HELP)
    gen.add_argument("--device", default="auto", help=DEVICE_NAMES)
    gen.add_argument("--quantize", default="none", choices=["none", "int8", "4bit", "auto"],
                     help="weight-only quantization of a real family's decoder layers, not the demo's (auto: "
                          'the most precise that fits; needs pip install "sjd-pac[quant]")')
    gen.add_argument("--check-finite", action="store_true",
                     help="look for NaN or infinite values in every weight after loading (done anyway for models "
                     "of up to 2e9 parameters; larger ones take a while)")
    gen.add_argument("--threads", type=arguments.threads(), default=0,
                     help="torch CPU threads (0 = chosen for the model's size: 1 for small models such as "
                          "the demo, torch's default for large ones)")
    gen.add_argument("--upscale", type=arguments.whole(1, MAX_UPSCALE), default=1,
                     help=f"upscale the saved image by this factor (1-{MAX_UPSCALE}; the demo's 64 px -> 8 "
                          "gives 512 px)")
    gen.add_argument("--upscale-filter", choices=list(UPSCALE_FILTERS), default="nearest",
                     help="nearest keeps the token grid's sharp pixels; lanczos smooths them")
    gen.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_sampler_args(gen)
    gen.set_defaults(func=_generate, validate=validate_generate_args)

    from .batch.cli import add_batch_parser  # light, like generate: its checks run before torch

    add_batch_parser(sub, check_writable_folder=check_writable_folder, check_device=check_device,
                     check_demo_prompt=check_demo_prompt, quiet_loading=_no_transformers_bars)

    # The benchmark's parser imports torch: build it only when its command is asked for, so that
    # `sjd-pac --help` and `sjd-pac generate` start without it.
    positionals = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    if positionals[:1] and positionals[0] in BENCH_COMMANDS:
        try:
            from .bench.cli import add_bench_parser
        except ImportError:  # the benchmark is optional
            pass
        else:
            add_bench_parser(sub, _add_sampler_args)
    else:
        sub.add_parser("bench", help="the benchmark (see `sjd-pac bench --help`)", add_help=False)
        sub.add_parser("lossless", help="the lossless check (see `sjd-pac lossless --help`)", add_help=False)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser(argv).parse_args(argv)
    try:
        validate = getattr(args, "validate", None)
        if validate is not None:
            validate(args)  # before torch, before the model
        elif args.command in BENCH_COMMANDS and getattr(args, "out", None):
            check_writable_folder(args.out)  # before a benchmark that would be lost at its end
        return args.func(args)
    except (ConfigError, ArgumentError, ValueError) as exc:  # ModelLoadError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except FileSaveError as exc:
        print(f"error: {exc}.", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
