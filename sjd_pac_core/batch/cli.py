"""`sjd-pac batch INPUT --out DIR`: one image per (prompt, seed, method), resumable.

    sjd-pac batch prompts.txt --out runs/batch                              # each prompt once, seed 0
    sjd-pac batch prompts.txt --out runs/paper --methods paper --seeds 0-3  # the paper's table
    sjd-pac batch prompts.jsonl --out runs/b --workers 4                    # 4 Ray workers (one GPU each)
    sjd-pac batch prompts.txt --out runs/b --workers 16 --ray-address auto  # join a running Ray cluster

INPUT: a text file, one prompt per line ('#' lines skipped), or JSONL, one object per line:
{"prompt": "...", "seed": 3, "negative_prompt": "...", "resolution": "768x768", "window": 32, ...}
(any SamplerConfig field by its name; null takes the model's default; top_k 0 / top_p 1 are off).
Writes DIR/images/<id>.png (the run record in the PNG), DIR/results.jsonl (one line per job) and
DIR/summary.md. Rerunning the same command skips finished jobs (see docs/batch.md).

Every check here runs before torch is imported: INPUT is read and parsed, --seeds and --methods
are parsed, --out is proven writable.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager

from ..bench.methods import DEFAULT_METHODS, PRESETS, parse_methods, parse_seeds
from .jobs import BatchInputError, read_input
from .resources import machine_cores, ray_address_problem, threads_problem, workers_problem

RAY_EXTRA = 'pip install "sjd-pac[ray]"'


@dataclass(frozen=True)
class CliChecks:
    """The main CLI's own checks, handed in (this module does not import the CLI: no import circle)."""

    check_writable_folder: Callable  # --out: created and proven writable, or ArgumentError
    check_device: Callable  # --device: a device name
    check_demo_prompt: Callable  # (model, prompt): a prompt the demo model cannot read is refused
    quiet_loading: Callable[[], ContextManager]  # transformers' loading bars off inside the block


def add_batch_parser(subparsers, **checks: Callable) -> None:
    """Register `batch`, with the CLI's own checks (see CliChecks)."""
    cli = CliChecks(**checks)
    p = subparsers.add_parser(
        "batch", help="many images from a prompt file, resumable; on Ray workers with --workers",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", metavar="INPUT", help="text file (one prompt per line) or JSONL file")
    p.add_argument("--out", required=True, help="output folder (created): images/, results.jsonl, summary.md")
    p.add_argument("--model", default="demo", help="'demo' or a local checkpoint folder")
    p.add_argument("--seeds", default=None,
                   help="seeds for every line: 0 | 0,5,9 | 0-3 (default: a JSONL line's own seed, else 0)")
    p.add_argument("--methods", default=None,
                   help=f"methods for every line, as `sjd-pac bench` takes them: e.g. ar,sjd@32,sjd-pac@64, or a "
                        f"preset ({', '.join(PRESETS)}; paper = {DEFAULT_METHODS}); default: each line's own "
                        "settings (the model's: SJD-PAC)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"],
                   help="weights' precision: auto (the default) is bf16 on GPUs that support it, else fp32")
    p.add_argument("--quantize", default="none", choices=["none", "int8", "4bit", "auto"],
                   help="weight-only quantization of the decoder layers, as `sjd-pac generate` takes it")
    p.add_argument("--check-finite", action="store_true",
                   help="look for NaN or infinite values in every weight after loading, as `sjd-pac generate` does")
    p.add_argument("--device", default="auto",
                   help="auto, cpu, cuda, cuda:N or mps; with Ray workers auto or cuda gives each worker one GPU")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads per worker (0 = chosen: 1 for small models such as the demo, else the "
                        "machine's cores shared among its workers)")
    p.add_argument("--workers", type=int, default=None,
                   help="run on N Ray workers, each loading the model once (one GPU each where the cluster has "
                        f"GPUs); needs the ray extra: {RAY_EXTRA}")
    p.add_argument("--ray-address", default=None,
                   help="join a running Ray cluster (its address, or auto) instead of starting one here")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=lambda args: _batch(args, cli), validate=lambda args: validate_batch_args(args, cli))


def _model_path(path: str) -> str:
    """A local folder as an absolute path (a Ray worker's working folder is not ours); 'demo' and a
    path only the cluster's machines hold stay as they are."""
    folder = Path(path).expanduser()
    return str(folder.resolve()) if path != "demo" and folder.exists() else path


def validate_batch_args(args: argparse.Namespace, cli: CliChecks) -> None:
    """Every check that needs no torch and no model; raises ValueError (one sentence)."""
    if args.workers is not None and args.workers < 1:
        raise BatchInputError(f"--workers must be 1 or more, got {args.workers}; leave it out to run in this process.")
    if args.threads < 0:
        raise BatchInputError(f"--threads must be 0 (chosen for the model) or more, got {args.threads}.")
    if args.ray_address is None:  # on this machine: its cores bound both (a cluster's are checked on joining it)
        cores = machine_cores()
        problem = threads_problem(args.threads, cores) or (
            None if args.workers is None else workers_problem(args.workers, cores, 0, False, "this machine"))
        if problem:
            raise BatchInputError(problem)
    on_ray = args.workers is not None or args.ray_address is not None
    if on_ray and importlib.util.find_spec("ray") is None:
        raise BatchInputError(f"--workers and --ray-address run on Ray, which is not installed; install the extra: "
                              f"{RAY_EXTRA}.")
    problem = None if args.ray_address is None else ray_address_problem(args.ray_address)
    if problem:
        raise BatchInputError(problem)
    cli.check_device(args.device)
    if on_ray and args.device not in ("auto", "cpu", "cuda"):
        raise BatchInputError(f"--device {args.device}: Ray gives each worker its own GPU; use --device auto, cuda "
                              "or cpu.")
    args.lines = read_input(args.input)
    for line in args.lines:
        try:
            cli.check_demo_prompt(args.model, line.prompt)
        except ValueError as exc:
            raise BatchInputError(f"{Path(args.input).name} line {line.number}: {exc}") from None
    args.seed_list = parse_seeds(args.seeds) if args.seeds is not None else None
    if args.seed_list is not None and min(args.seed_list) < 0:
        raise BatchInputError(f"--seeds {args.seeds!r}: seeds are 0 or more.")
    args.method_list = parse_methods(args.methods) if args.methods is not None else None
    generate_rows = [m.key for m in args.method_list or [] if m.is_generate]
    if generate_rows:
        raise BatchInputError(f"--methods {generate_rows[0]}: transformers' generate is a benchmark baseline, not a "
                              "batch method; use ar, sjd@L, sjd+pd@L, sjd+ac@L or sjd-pac@L.")
    args.out = str(cli.check_writable_folder(args.out))


def _batch(args, cli: CliChecks) -> int:
    from .driver import BatchOptions, run_batch
    from .work import ModelSpec

    options = BatchOptions(
        lines=args.lines, out=Path(args.out), seeds=args.seed_list, methods=args.method_list,
        model=ModelSpec(_model_path(args.model), dtype=args.dtype, device=args.device, quantize=args.quantize,
                        threads=args.threads, check_finite=args.check_finite),
        workers=args.workers or 0, ray_address=args.ray_address, progress=not args.quiet,
        source=Path(args.input).name)
    try:
        with cli.quiet_loading() if args.quiet else contextlib.nullcontext():  # transformers' loading bar
            report = run_batch(options)
    except KeyboardInterrupt:
        print(f"stopped; the finished jobs are kept in {args.out}: rerun the same command to continue.")
        raise
    for sentence in report.lost_workers:
        print(sentence)
    for note in report.notes:
        print(f"warning: {note}", file=sys.stderr)
    print(f"{len(report.jobs)} jobs: {report.done} done now, {report.skipped} done before, {len(report.failed)} failed"
          + (f", {report.retried} rerun after their worker died" if report.retried else "")
          + f"; ran {report.where}; wrote {Path(args.out) / 'results.jsonl'}, images/"
          + (f" and {report.summary}" if report.summary else ""))
    if report.stopped:
        print(f"error: {report.stopped}", file=sys.stderr)
    return 0 if report.complete else 1
