"""The end-to-end GPU benchmark: tokens per second at a 7B model's cost, against compiled plain AR.

    python benchmarks/gpu_e2e.py --device cuda --out runs/gpu_e2e          # one H100 / H200
    python benchmarks/gpu_e2e.py --tiny --device cpu --out runs/e2e_tiny   # the same code, tiny (CI)

Every sampler row runs on the 7B-cost twin of the demo model (bench/twin.py): each pass runs
Lumina-mGPT's 7B shape with random weights (bf16, two rows with CFG, the context of a 768x768
image: the cost) and the trained demo model (its logits: the acceptance), through
`generate_image`, compiled or not, as a user's run would. The rows:

* transformers' `generate` on the 7B shape alone, static cache (a whole image's), eager and
  compiled with CUDA graphs (`generate-static`, `generate-static:compile`): plain AR as fast as
  transformers runs it; its recipe (CFG, constraints, temperature, the Gumbel draw) is the
  sampler's, in a logits processor (bench/baselines.py);
* our AR on the twin, eager and compiled (`ar`, `ar:compile`);
* SJD-PAC's default (`sjd-pac@64`: L = 64, the library's tree) and node budgets 32 / 64 / 128
  with the window chosen by the budget (`sjd-pac@auto:bB`), eager and compiled;
* the 7B pass alone at 1 and 1 + B nodes, eager and compiled: the floor under every row.

Timing: every row gets one untimed warm-up run (compilation happens there; its cost is reported
apart), then `--rounds` timed rounds run the rows in the same order (A B C ... A B C ...), with
device synchronisation. A run's clock starts when its first image token is drawn (after the
prompt's pass: the twin's big prompt stands for half an image, which a real run computes pass by
pass) and stops at its last token, for the sampler (generate_image's callback) and for
`generate` (its logits processor) alike. Tokens per second = tokens after the first / the
median round's seconds. Host time per pass = wall time minus forward time (the engine's
PassRecords; CUDA events on a GPU).

Exactness: every run of every row must return our eager AR's tokens for the same prompt and seed
under the gumbel rule. `generate` on the 7B alone samples from random weights, so its rows are
checked by the same baseline configuration run on the demo model. A planted control (the default
SJD-PAC row with seed + 1) must be reported as not returning them: the check can fail. The exit
status is 1 if any row is not AR's tokens or the control is.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import statistics
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

import torch

from .. import arguments
from ..config import PROBE_SIZES, ConfigError, SamplerConfig
from .methods import MethodSpec, parse_method, parse_methods
from .shapes import Shape
from .twin import TwinImageModel

DEFAULT_METHODS = ("generate-static,generate-static:compile,ar,ar:compile,sjd-pac@64,sjd-pac@64:compile,"
                   "sjd-pac@auto:b32,sjd-pac@auto:compile:b32,sjd-pac@auto:b64,sjd-pac@auto:compile:b64,"
                   "sjd-pac@auto:b128,sjd-pac@auto:compile:b128")
SHAPE = "lumina-mgpt-7b-768"
TINY_SHAPE = "lumina-mgpt-tiny"
# --tiny compiles with this torch.compile backend: the same graphs and guards, no generated kernels
# (what the engine's tests use), so the CPU check takes about a minute, not ten.
TINY_COMPILE_BACKEND = "aot_eager"
PARTIAL_FILE = "gpu_e2e.partial.json"  # the runs so far, removed when the record is written


@dataclass(frozen=True)
class Row:
    """One row of the table."""

    key: str  # a bench method key, or pass:N[:compile]
    label: str
    kind: str  # "generate" (the 7B shape alone), "sampler" (the twin), "pass" (one 7B pass alone)
    compiled: bool
    spec: Optional[MethodSpec] = None
    size: int = 0  # pass rows: nodes in the pass (1 + B)


@dataclass
class Run:
    """One run of a generate or sampler row on one prompt."""

    row: str
    prompt: int
    round: int  # -1: the warm-up run
    seconds: float  # from the first token drawn to the last
    tokens: int  # tokens after the first
    total_seconds: float  # the whole call (prompt, compilation, image decoding included)
    passes: int
    step_compression: float
    engine_warmup_s: float = 0.0  # RunStats.warmup_time: the engine compiling pass shapes
    forward_ms: List[float] = field(default_factory=list)  # per pass after the prompt's
    host_ms: List[float] = field(default_factory=list)
    max_syncs_per_pass: int = 0
    ar_tokens: Optional[bool] = None


@dataclass
class PassCost:
    """The 7B pass alone at one size."""

    row: str
    size: int
    ms: List[float]
    first_ms: float  # the first pass of the size (compilation included when compiled)


@dataclass
class RowResult:
    key: str
    label: str
    kind: str
    compiled: bool
    ar_tokens: Optional[bool]  # None: the row samples no tokens (pass rows)
    checked_on: str
    runs: int = 0
    step_compression: Optional[float] = None
    tokens_per_s: Optional[float] = None
    round_seconds: List[float] = field(default_factory=list)  # every timed round (the spread behind the median)
    vs_fastest_ar: Optional[float] = None
    vs_eager_generate: Optional[float] = None
    forward_ms_per_pass: Optional[float] = None
    host_ms_per_pass: Optional[float] = None
    max_syncs_per_pass: Optional[int] = None
    warmup_s: Optional[float] = None  # the warm-up run's whole wall time
    compile_s: Optional[float] = None  # of which the engine's compile of pass shapes (sampler rows)
    pass_ms: Optional[float] = None
    pass_vs_one_node: Optional[float] = None
    bound_tokens_per_s: Optional[float] = None  # pass rows: step compression / pass time, no host work


# --- the rows ----------------------------------------------------------------------------------


def method_rows(methods: str, big: str = "7B shape") -> List[Row]:
    """The generate and sampler rows of --methods (ValueError: one sentence); `big` names the
    big model in the labels."""
    rows = []
    for spec in parse_methods(methods):
        kind = "generate" if spec.is_generate else "sampler"
        if spec.is_generate and spec.verify not in (None, "gumbel"):
            raise ValueError(f"{spec.key!r}: every row is checked against AR's tokens under the gumbel rule; "
                             "drop the :rejection modifier.")
        if not spec.is_generate and spec.verify == "rejection":
            raise ValueError(f"{spec.key!r}: every row is checked against AR's tokens under the gumbel rule, "
                             "which rejection sampling does not return; drop the :rejection modifier.")
        label = spec.label + (f" ({big} alone)" if spec.is_generate else "")
        rows.append(Row(spec.key, label, kind, spec.compiled, spec))
    return rows


def pass_rows(rows: Sequence[Row], big: str = "7B shape") -> List[Row]:
    """The big model's pass alone at 1 and 1 + B nodes for every budget B of the sampler rows,
    eager and (if any row compiles) compiled."""
    budgets = sorted({r.spec.node_budget for r in rows
                      if r.kind == "sampler" and isinstance(r.spec.node_budget, int)})
    modes = [False] + ([True] if any(r.compiled for r in rows) else [])
    return [Row(f"pass:{size}" + (":compile" if compiled else ""),
                f"{big} alone, a pass of {size} node{'s' if size > 1 else ''}" + (", compiled" if compiled else ""),
                "pass", compiled, size=size)
            for compiled in modes for size in [1] + [1 + b for b in budgets]]


def row_config(row: Row, base: SamplerConfig) -> SamplerConfig:
    """The row's SamplerConfig (generate rows: its recipe) under the gumbel rule; ConfigError: its
    sentence, which check_setup shows before any work."""
    return row.spec.config(base.with_(verify="gumbel"))


# --- timing --------------------------------------------------------------------------------------


class PassClock:
    """A generate_image callback: the clock when the prompt's pass is done and at the last pass."""

    def __init__(self) -> None:
        self.first: Optional[float] = None
        self.last: Optional[float] = None

    def __call__(self, progress) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        self.last = now


def sampler_run(model, row: Row, config: SamplerConfig, prompt: str, prompt_index: int, seed: int,
                round_index: int):
    """One generate_image run on the twin: (Run, tokens)."""
    from ..generate import generate_image

    clock = PassClock()
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = generate_image(model, prompt, config=config, seed=seed, callback=clock)
    total = time.perf_counter() - start
    stats = result.stats
    records = stats.records[1:]  # the prompt's pass is not timed
    run = Run(row.key, prompt_index, round_index, seconds=clock.last - clock.first,
              tokens=stats.tokens_committed - 1, total_seconds=total, passes=stats.forward_passes,
              step_compression=stats.step_compression, engine_warmup_s=stats.warmup_time,
              forward_ms=[1000 * r.forward_time for r in records],
              host_ms=[1000 * (r.wall_time - r.forward_time) for r in records],
              max_syncs_per_pass=max((r.host_syncs for r in records), default=0))
    return run, result.tokens


def generate_run(baseline, encoding, row: Row, config: SamplerConfig, prompt_index: int, seed: int,
                 round_index: int):
    """One transformers-generate run: (Run, tokens)."""
    start = time.perf_counter()
    out = baseline.generate(encoding, config, seed)
    total = time.perf_counter() - start
    n = int(out.tokens.numel())
    run = Run(row.key, prompt_index, round_index, seconds=out.after_first_seconds, tokens=n - 1,
              total_seconds=total, passes=n, step_compression=1.0)
    return run, out.tokens


@torch.inference_mode()
def pass_costs(adapter, prompts: Sequence[torch.Tensor], rows: Sequence[Row], extra_tokens: int, rounds: int
               ) -> List[PassCost]:
    """The big model's pass alone, through the sampler's own session (a compiled row reuses the
    graphs the compiled sampler rows built): a chain of `size` nodes on top of the prompt,
    rolled back after each timed pass; rounds interleave the sizes."""
    from .hardware import DeviceTimer

    if not rows:
        return []
    compiled = rows[0].compiled
    timer = DeviceTimer(adapter.device)
    session = adapter.open_session(list(prompts))
    try:
        session.configure(extra_tokens, None, compile=compiled)
        session.prefill()
        if compiled:
            session.start_compiled()
        root = torch.zeros(1, dtype=torch.long, device=adapter.device)

        def one_pass(size: int):
            tokens = root.expand(size).contiguous()
            depths = torch.arange(size, device=adapter.device)
            attend = torch.ones(size, size, dtype=torch.bool, device=adapter.device).tril()

            def run():
                session.forward(tokens, depths, attend)
                session.keep([])  # the cache is as it was

            return run

        costs = [PassCost(row.key, row.size, [], 1000 * timer(one_pass(row.size))) for row in rows]
        for _ in range(rounds):
            for cost in costs:
                cost.ms.append(1000 * timer(one_pass(cost.size)))
        return costs
    finally:
        session.close()


# --- the summary -----------------------------------------------------------------------------------


def _median(values: Sequence[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def row_results(rows: Sequence[Row], runs: Sequence[Run], costs: Sequence[PassCost],
                checks: Dict[str, List[bool]]) -> List[RowResult]:
    """Per row: whether every run returned AR's tokens, tokens per second (median round), the
    ratios to the fastest plain AR and to eager generate, and per-pass times."""
    results = []
    for row in rows:
        if row.kind == "pass":
            results.append(RowResult(row.key, row.label, row.kind, row.compiled, None, "-"))
            continue
        mine = [r for r in runs if r.row == row.key]
        timed = [r for r in mine if r.round >= 0]
        per_round: Dict[int, List[Run]] = {}
        for r in timed:
            per_round.setdefault(r.round, []).append(r)
        round_seconds = [sum(r.seconds for r in per_round[k]) for k in sorted(per_round)]
        seconds = _median(round_seconds)
        tokens = sum(r.tokens for r in per_round[min(per_round)]) if per_round else 0
        warm = [r for r in mine if r.round < 0]
        results.append(RowResult(
            row.key, row.label, row.kind, row.compiled, ar_tokens=all(checks.get(row.key, [False])),
            checked_on="the demo model (the big model alone has random weights)" if row.kind == "generate"
            else "the twin",
            runs=len(timed), step_compression=_median([r.step_compression for r in timed]),
            tokens_per_s=tokens / seconds if seconds else None, round_seconds=round_seconds,
            forward_ms_per_pass=_median([ms for r in timed for ms in r.forward_ms]),
            host_ms_per_pass=_median([ms for r in timed for ms in r.host_ms]),
            max_syncs_per_pass=max((r.max_syncs_per_pass for r in timed), default=None) if row.kind == "sampler"
            else None,
            warmup_s=warm[0].total_seconds if warm else None,
            compile_s=warm[0].engine_warmup_s if warm and row.kind == "sampler" else None))
    _ratios(results)
    _pass_figures(results, costs)
    return results


def is_plain_ar(result: RowResult) -> bool:
    """transformers' generate or our AR: the rows every ratio is taken against."""
    return result.kind == "generate" or (result.kind == "sampler" and parse_method(result.key).is_ar)


def _ratios(results: List[RowResult]) -> None:
    plain = [r for r in results if is_plain_ar(r) and r.tokens_per_s]
    fastest = max((r.tokens_per_s for r in plain), default=None)
    eager = next((r.tokens_per_s for r in results if r.kind == "generate" and not r.compiled and r.tokens_per_s),
                 None)
    for r in results:
        if r.tokens_per_s:
            r.vs_fastest_ar = r.tokens_per_s / fastest if fastest else None
            r.vs_eager_generate = r.tokens_per_s / eager if eager else None


def _pass_figures(results: List[RowResult], costs: Sequence[PassCost]) -> None:
    """Pass rows: median ms, the ratio to the one-node pass of the same mode, and the tokens per
    second the pass alone allows at the step compression of the matching budget row."""
    by_key = {c.row: c for c in costs}
    compression = {(r.compiled, parse_method(r.key).node_budget): r.step_compression
                   for r in results if r.kind == "sampler" and r.step_compression}
    measured = [r for r in results if r.kind == "pass" and r.key in by_key]
    one_node = {r.compiled: _median(by_key[r.key].ms) for r in measured if by_key[r.key].size == 1}
    for r in measured:
        cost = by_key[r.key]
        r.pass_ms = _median(cost.ms)
        r.warmup_s = cost.first_ms / 1000
        if one_node.get(r.compiled):
            r.pass_vs_one_node = r.pass_ms / one_node[r.compiled]
        steps = 1.0 if cost.size == 1 else compression.get((r.compiled, cost.size - 1))
        if steps and r.pass_ms:
            r.bound_tokens_per_s = steps * 1000 / r.pass_ms


def headline(results: Sequence[RowResult]) -> Dict[str, object]:
    """The fastest plain-AR row and the fastest SJD-PAC row, with its ratios."""
    timed = [r for r in results if r.kind != "pass" and r.tokens_per_s]
    plain = [r for r in timed if is_plain_ar(r)]
    ours = [r for r in timed if not is_plain_ar(r)]
    fastest = max(plain, key=lambda r: r.tokens_per_s, default=None)
    best = max(ours, key=lambda r: r.tokens_per_s, default=None)
    return {"fastest_plain_ar": fastest.key if fastest else None, "best": best.key if best else None,
            "best_vs_fastest_ar": best.vs_fastest_ar if best else None,
            "best_vs_eager_generate": best.vs_eager_generate if best else None,
            "best_returned_ar_tokens": best.ar_tokens if best else None}


# --- the report --------------------------------------------------------------------------------------


def _cell(value, fmt: str = "{:.2f}", missing: str = "-") -> str:
    return missing if value is None else fmt.format(value)


def markdown(record: Dict[str, object]) -> str:
    env, setup = record["environment"], record["setup"]
    lines = [f"# SJD-PAC against plain AR end to end on {env.get('gpu') or env['cpu']}", "",
             f"{env['date_utc']}, torch {env['torch']}, transformers {env['transformers']}, commit "
             f"{env.get('git_commit') or '-'}; `{record['command']}`", "",
             f"Twin: {setup['twin']}, the cost of {setup['shape']['note']}; {setup['tokens_per_image']} image tokens "
             f"per run at context {setup['context_start']}-{setup['context_end']} (a whole image: "
             f"{setup['cache_positions']} positions), {setup['dtype']} (the demo in {setup['demo_dtype']}), "
             f"CFG {setup['cfg_scale']}, temperature {setup['temperature']}, gumbel; "
             f"{setup['prompts']} prompt(s) x {setup['rounds']} interleaved rounds, seed {setup['seed']}. "
             f"Compile backend: {setup['compile_backend']}.", "",
             "| row | AR's tokens | step compression | tokens/s | vs fastest plain AR | vs eager generate | "
             "forward ms/pass | host ms/pass | warm-up s (compile s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in record["rows"]:
        if r["kind"] == "pass":
            continue
        ok = {True: "yes", False: "NO", None: "-"}[r["ar_tokens"]] + ("*" if r["kind"] == "generate" else "")
        warm = _cell(r["warmup_s"], "{:.1f}") + (f" ({r['compile_s']:.1f})" if r["compile_s"] else "")
        lines.append(f"| {r['label']} | {ok} | {_cell(r['step_compression'])}x | {_cell(r['tokens_per_s'], '{:.1f}')} "
                     f"| {_cell(r['vs_fastest_ar'])}x | {_cell(r['vs_eager_generate'])}x | "
                     f"{_cell(r['forward_ms_per_pass'])} | {_cell(r['host_ms_per_pass'])} | {warm} |")
    lines += ["", "\\* checked by the same `generate` configuration on the demo model: the big model alone has random "
              "weights.", "", "| the big model's pass alone | ms | vs one node | tokens/s with no host work |",
              "|---|---|---|---|"]
    for r in record["rows"]:
        if r["kind"] == "pass":
            lines.append(f"| {r['label']} | {_cell(r['pass_ms'])} | {_cell(r['pass_vs_one_node'])}x | "
                         f"{_cell(r['bound_tokens_per_s'], '{:.1f}')} |")
    top = record["headline"]
    if top["best"]:
        labels = {r["key"]: r["label"] for r in record["rows"]}
        lines[6:6] = [f"**Fastest SJD-PAC row: {labels[top['best']]}, {_cell(top['best_vs_fastest_ar'])}x the tokens "
                      f"per second of the fastest plain AR ({labels[top['fastest_plain_ar']]}), "
                      f"{_cell(top['best_vs_eager_generate'])}x eager generate; AR's tokens: "
                      f"{'yes' if top['best_returned_ar_tokens'] else 'NO'}.**", ""]
    profiled = record.get("profile")
    if profiled:
        from .stage_profile import StageProfile, StageTime, stage_table

        stages = [StageTime(**t) for t in profiled["stages"]]
        table = stage_table(StageProfile(profiled["passes"], profiled["wall_ms_per_pass"], stages))
        lines += ["", f"Where a pass's time goes ({profiled['label']}, one run under torch.profiler, "
                  f"{profiled['passes']} passes, {profiled['wall_ms_per_pass']:.2f} ms per pass with the "
                  f"profiler's own cost; trace `{Path(profiled['trace']).name}`):", "", *table]
    control = record["control"]
    lines += ["", f"Planted control ({control['row']} with seed {control['seed']}): returned AR's tokens: "
              f"{'yes - the check is broken' if control['ar_tokens'] else 'no, as it must (the check can fail)'}.",
              "", f"Seconds: building {record['seconds']['build']:.0f}, warm-up {record['seconds']['warmup']:.0f}, "
              f"timed rounds {record['seconds']['timed']:.0f}, passes alone {record['seconds']['passes']:.0f}, "
              f"control {record['seconds']['control']:.0f}"
              + (f", profile {record['seconds']['profile']:.0f}" if "profile" in record["seconds"] else "")
              + f", total {record['seconds']['total']:.0f}."]
    return "\n".join(lines)


# --- the command -----------------------------------------------------------------------------------


@contextlib.contextmanager
def compile_backend(backend: Optional[str]) -> Iterator[None]:
    """The engine's compiled passes use `backend` (None: inductor) inside the block."""
    from ..models import causal_lm

    previous = causal_lm.COMPILE_BACKEND
    causal_lm.COMPILE_BACKEND = backend
    try:
        yield
    finally:
        causal_lm.COMPILE_BACKEND = previous


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true",
                   help="a tiny Chameleon instead of the 7B shape, the aot_eager compile backend, two image rows: "
                        "about a minute on a CPU (CI)")
    p.add_argument("--methods", default=DEFAULT_METHODS,
                   help="rows, in `sjd-pac bench` method keys (default: every row of the description)")
    p.add_argument("--prompts", type=arguments.whole(1, 1000), default=1, help="demo prompts per round (default 1)")
    p.add_argument("--rounds", type=arguments.whole(1, 1000), default=None, help="timed rounds (default 3; tiny 2)")
    p.add_argument("--pass-rounds", type=arguments.whole(1, 10_000), default=None,
                   help="timed passes per size for the 7B pass alone (default 10; tiny 2)")
    p.add_argument("--image-rows", type=arguments.whole(1, 1000), default=None,
                   help="sample the demo image's first rows only (default: all 16; tiny 2)")
    p.add_argument("--seed", type=arguments.seed, default=0)
    p.add_argument("--threads", type=arguments.threads(allow_default=False), default=None,
                   help="torch CPU threads (default: 1 on a CPU, where small models run fastest on one; "
                        "torch's own on a GPU)")
    p.add_argument("--compile-backend", default=None,
                   help=f"torch.compile backend of the compiled rows (default inductor; tiny {TINY_COMPILE_BACKEND})")
    p.add_argument("--profile", default=None, metavar="ROW",
                   help="after the timed rounds, run ROW once more under torch.profiler and say where a pass's "
                        "time goes, stage by stage (plan, forward, verify, sync, commit, draft), with its Chrome "
                        "trace in --out; ROW is a key of --methods or 'best', the fastest SJD-PAC row")
    p.add_argument("--out", default="runs/gpu_e2e")
    return p.parse_args(argv)


def big_name(tiny: bool) -> str:
    return "tiny shape" if tiny else "7B shape"


def check_setup(args: argparse.Namespace):
    """Everything that can be wrong with the command, before any work: (device, rows) or
    SystemExit with one sentence."""
    from ..models.checks import ModelLoadError
    from ..models.loader import resolve_device
    from .baselines import static_cache_length_supported

    tiny_hint = "add --tiny --device cpu for the same code on a tiny model (about a minute on a CPU)"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: this PyTorch sees no CUDA GPU; run on a machine with one, or "
                         f"{tiny_hint}.")
    try:
        device = resolve_device(args.device)
    except ModelLoadError as exc:
        raise SystemExit(f"--device {args.device}: {exc}") from None
    if device.type != "cuda" and not args.tiny:
        raise SystemExit(f"--device {device}: the 7B shape runs in bf16 on a CUDA GPU; run with --device cuda, "
                         f"or {tiny_hint.replace(' --device cpu', '')}.")
    try:
        rows = method_rows(args.methods, big_name(args.tiny))
        for row in rows:
            row_config(row, SamplerConfig())
    except (ValueError, ConfigError) as exc:
        raise SystemExit(f"--methods: {exc}") from None
    if not any(r.kind == "sampler" for r in rows):
        raise SystemExit("--methods has no row on the twin; add ar (the reference all rows are checked against).")
    sampler_keys = [r.key for r in rows if r.kind == "sampler"]
    drafting_keys = [r.key for r in rows if r.kind == "sampler" and not r.spec.is_ar]
    if args.profile == "best" and not drafting_keys:
        raise SystemExit("--profile best: --methods has no SJD-PAC row; add one such as sjd-pac@auto:b128.")
    if args.profile not in (None, "best") and args.profile not in sampler_keys:
        raise SystemExit(f"--profile {args.profile}: not a sampler row of --methods; give 'best' or one of "
                         f"{', '.join(sampler_keys)}.")
    if any(r.kind == "generate" and r.spec.variant == "generate-static" for r in rows) \
            and not static_cache_length_supported():
        raise SystemExit("--methods: generate-static needs a static cache of a whole image's size, which this "
                         "transformers cannot set (GenerationConfig.max_cache_len); upgrade transformers.")
    return device, rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    device, rows = check_setup(args)
    backend = args.compile_backend or (TINY_COMPILE_BACKEND if args.tiny else None)
    if args.threads or device.type == "cpu":
        torch.set_num_threads(args.threads or 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with compile_backend(backend):
        record = run(args, device, rows, backend, command="python benchmarks/gpu_e2e.py " + shlex.join(argv),
                     partial=out / PARTIAL_FILE)
    (out / "gpu_e2e.json").write_text(json.dumps(record, indent=1, default=float))
    (out / PARTIAL_FILE).unlink(missing_ok=True)
    report = markdown(record)
    (out / "gpu_e2e.md").write_text(report + "\n")
    print(report)
    print(f"wrote {out / 'gpu_e2e.json'}, {out / 'gpu_e2e.md'}")
    failed = [r["key"] for r in record["rows"] if r["ar_tokens"] is False]
    if failed or record["control"]["ar_tokens"]:
        print("NOT every row returned AR's tokens: " + ", ".join(failed) if failed
              else "the planted control returned AR's tokens: the check is broken.")
        return 1
    return 0


@dataclass
class Setup:
    """What the run is built from (one per command)."""

    shape: Shape
    dtype: torch.dtype
    twin: TwinImageModel
    base: SamplerConfig  # the twin's defaults under the gumbel rule
    prompts: List[str]
    seed: int
    rounds: int
    pass_rounds: int
    backend: Optional[str]
    generate: Dict[str, object] = field(default_factory=dict)  # row -> GenerateBaseline on the big model alone
    generate_on_demo: Dict[str, object] = field(default_factory=dict)  # the same configuration on the demo

    @property
    def cfg_rows(self) -> int:
        return 2 if self.base.uses_cfg else 1


def build(args: argparse.Namespace, device: torch.device, rows: Sequence[Row], backend: Optional[str]) -> Setup:
    """The big model (random weights, built on the device), the demo model, their twin and the
    generate baselines."""
    import sjd_pac_core as sp

    from ..models.causal_lm import CausalLMAdapter
    from .baselines import GenerateBaseline, prompt_width
    from .runner import load_prompts
    from .shapes import SHAPES, TINY_SHAPES, build_random_model, family_adapter, image_token_ids

    shape = TINY_SHAPES[TINY_SHAPE] if args.tiny else SHAPES[SHAPE]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    print(f"building {shape.note} with random weights ({str(dtype)[6:]}) and the demo model on {device} ...",
          flush=True)
    torch.manual_seed(0)  # the same random weights every time
    big = build_random_model(shape, dtype, device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # fp32 on every device: its logits decide every token, and bf16's near-ties would flip some
        # between pass sizes (bench/numerics.py counts them); its cost is nothing beside the big model's
        demo = sp.load_model("demo", device=str(device), dtype="fp32")
    rows_sampled = args.image_rows or (2 if args.tiny else None)
    twin = TwinImageModel(demo, family_adapter(big, shape, device), shape, rows_sampled)
    setup = Setup(shape, dtype, twin, twin.defaults.sampler_config(verify="gumbel"), load_prompts("demo", args.prompts),
                  args.seed, args.rounds or (2 if args.tiny else 3), args.pass_rounds or (2 if args.tiny else 10),
                  backend)
    context = twin.token_model.context
    # generate on the big model alone: its whole head, the image codes chosen by the logits processor
    big_lm = CausalLMAdapter(big, token_space=image_token_ids(shape, device))
    for row in rows:
        if row.kind == "generate":
            static = row.spec.variant == "generate-static"
            setup.generate[row.key] = GenerateBaseline(
                big_lm, static, row.compiled, prompt_width=context.prompt_tokens + context.before,
                cache_length=shape.context if static else None, compile_backend=backend)
            setup.generate_on_demo[row.key] = GenerateBaseline(demo, static, row.compiled, compile_backend=backend,
                                                               prompt_width=prompt_width(demo, setup.prompts))
    return setup


class Bench:
    """The runs of one command, and their checks against AR's tokens."""

    def __init__(self, setup: Setup, partial: Optional[Path] = None) -> None:
        self.setup = setup
        self.partial = partial  # where the runs so far are written after every phase and round
        self.runs: List[Run] = []
        self.checks: Dict[str, List[bool]] = {}  # row -> every check of its tokens
        self.reference: Dict[int, torch.Tensor] = {}  # prompt -> our eager AR's tokens on the twin
        self.ar = Row("ar", "AR", "sampler", False, parse_method("ar"))
        self.first_reference_run: Optional[Run] = None

    def check(self, key: str, prompt_index: int, tokens: torch.Tensor) -> bool:
        same = torch.equal(tokens.cpu(), self.reference[prompt_index])
        self.checks.setdefault(key, []).append(same)
        return same

    def save_partial(self, command: str) -> None:
        """The runs so far, should the command be stopped (a GPU run under a time limit)."""
        if self.partial is not None:
            self.partial.write_text(json.dumps({"command": command, "runs": [asdict(r) for r in self.runs],
                                                "checks": self.checks}, indent=1, default=float))

    def run_row(self, row: Row, prompt_index: int, round_index: int) -> Run:
        from ..sampling.seeds import image_seed

        s = self.setup
        config = row_config(row, s.base)
        if row.kind == "generate":  # the big model alone: its tokens are checked on the demo (warm_up)
            run, _ = generate_run(s.generate[row.key], s.twin.cost_encoding(s.cfg_rows), row, config, prompt_index,
                                  image_seed(s.seed, 0), round_index)
        else:
            run, tokens = sampler_run(s.twin, row, config, s.prompts[prompt_index], prompt_index, s.seed, round_index)
            run.ar_tokens = self.check(row.key, prompt_index, tokens)
        self.runs.append(run)
        return run

    def make_reference(self) -> None:
        """Our eager AR on the twin, per prompt (the first is also the `ar` row's warm-up run)."""
        s = self.setup
        for i, prompt in enumerate(s.prompts):
            run, tokens = sampler_run(s.twin, self.ar, row_config(self.ar, s.base), prompt, i, s.seed, -1)
            self.reference[i] = tokens.cpu()
            print(f"  our eager AR, the reference for prompt {i}: {run.total_seconds:.1f} s", flush=True)
            if i == 0:
                self.first_reference_run = run

    def warm_up(self, rows: Sequence[Row]) -> None:
        """One untimed run per row (compilation happens here); generate rows also run their
        configuration on the demo, whose tokens must be AR's."""
        from ..sampling.seeds import image_seed

        s = self.setup
        for row in rows:
            if row.key == self.ar.key:
                self.runs.append(self.first_reference_run)
                self.check(row.key, 0, self.reference[0])  # (true by construction: the timed runs are checked)
                continue
            run = self.run_row(row, 0, -1)
            print(f"  {row.key}: {run.total_seconds:.1f} s", flush=True)
            if row.kind == "generate":
                for i, prompt in enumerate(s.prompts):
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        encoding = s.twin.encode_prompt(prompt)  # the demo's prompt, the twin's image tokens
                    out = s.generate_on_demo[row.key].generate(encoding, row_config(row, s.base), image_seed(s.seed, 0))
                    self.check(row.key, i, out.tokens)

    def timed_rounds(self, rows: Sequence[Row], command: str) -> None:
        for r in range(self.setup.rounds):
            start = time.perf_counter()
            for i in range(len(self.setup.prompts)):
                for row in rows:
                    self.run_row(row, i, r)
            print(f"round {r + 1} of {self.setup.rounds}: {time.perf_counter() - start:.1f} s", flush=True)
            self.save_partial(command)

    def pass_costs(self, rows: Sequence[Row]) -> List[PassCost]:
        s = self.setup
        twin = s.twin.token_model
        # the cache a sampler run of the largest pass reserves (so compiled rows reuse its graphs)
        extra = s.twin.layout.num_tokens + max(max((r.size for r in rows), default=1), max(PROBE_SIZES)) + 1
        costs: List[PassCost] = []
        for compiled in (False, True):
            chosen = [r for r in rows if r.kind == "pass" and r.compiled == compiled]
            costs += pass_costs(twin.cost_model, twin.cost_prompts(s.cfg_rows), chosen, extra + twin.context.after,
                                s.pass_rounds)
        return costs

    def profile(self, row: Row, out: Path) -> Dict[str, object]:
        """`row` once more on the first prompt under torch.profiler: its time per pass by stage."""
        from .stage_profile import profile_stages

        s = self.setup
        trace = out / f"profile_{row.key.replace(':', '_').replace('@', '_')}.json"
        print(f"profiling {row.key} ...", flush=True)
        config = row_config(row, s.base)
        profiled = profile_stages(lambda: sampler_run(s.twin, row, config, s.prompts[0], 0, s.seed, -2), s.twin.device,
                                  trace)
        return {"row": row.key, "label": row.label, **asdict(profiled)}

    def control(self, rows: Sequence[Row]) -> Dict[str, object]:
        """The planted control: the first drafting row, eager, with another seed, cannot return
        AR's tokens; if it does, the check is broken."""
        from ..generate import generate_image

        s = self.setup
        row = next((r for r in rows if r.kind == "sampler" and not r.spec.is_ar), self.ar)
        config = row_config(row, s.base).with_(compile=False)
        same = []
        for i, prompt in enumerate(s.prompts):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = generate_image(s.twin, prompt, config=config, seed=s.seed + 1)
            same.append(torch.equal(result.tokens.cpu(), self.reference[i]))
        return {"row": row.key, "seed": s.seed + 1, "ar_tokens": any(same), "per_prompt": same}


def run(args: argparse.Namespace, device: torch.device, rows: List[Row], backend: Optional[str], command: str,
        partial: Optional[Path] = None) -> Dict[str, object]:
    """Build, warm up, time, check: the run's record."""
    from .environment import environment

    seconds: Dict[str, float] = {}
    started = clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[name], clock = now - clock, now

    setup = build(args, device, rows, backend)
    rows_all = rows + pass_rows(rows, big_name(args.tiny))
    bench = Bench(setup, partial)
    lap("build")
    print(f"warm-up: {len(rows)} rows (the compiled ones compile here) ...", flush=True)
    bench.make_reference()
    bench.warm_up(rows)
    bench.save_partial(command)
    lap("warmup")
    bench.timed_rounds(rows, command)
    lap("timed")
    print("the big model's passes alone ...", flush=True)
    costs = bench.pass_costs(rows_all)
    lap("passes")
    control = bench.control(rows)
    lap("control")
    results = row_results(rows_all, bench.runs, costs, bench.checks)
    profiled = None
    if args.profile:
        profiled = bench.profile(profile_row(args.profile, rows, results), Path(args.out))
        lap("profile")
    seconds["total"] = time.perf_counter() - started
    twin = setup.twin
    context = twin.token_model.context
    width = context.prompt_tokens + context.before
    return {
        "command": command,
        "environment": environment(twin),
        "setup": {"twin": twin.name, "shape": asdict(setup.shape), "dtype": str(setup.dtype).replace("torch.", ""),
                  "demo_dtype": "float32",
                  "tokens_per_image": twin.layout.num_tokens, "context_start": width,
                  "context_end": width + twin.layout.num_tokens, "cache_positions": setup.shape.context,
                  "cfg_scale": setup.base.cfg_scale, "temperature": setup.base.temperature,
                  "prompts": len(setup.prompts), "rounds": setup.rounds, "seed": setup.seed,
                  "compile_backend": backend or "inductor (mode reduce-overhead on CUDA: CUDA graphs)",
                  "timing": "from the first image token drawn to the last; median round; tokens after the first"},
        "rows": [asdict(r) for r in results],
        "headline": headline(results),
        "control": control,
        "runs": [asdict(r) for r in bench.runs],
        "passes": [asdict(c) for c in costs],
        "profile": profiled,
        "seconds": seconds,
    }


def profile_row(choice: str, rows: Sequence[Row], results: Sequence[RowResult]) -> Row:
    """The row `--profile` names: a row key, or 'best' (the SJD-PAC row with the most tokens per second)."""
    sampler = {r.key: r for r in rows if r.kind == "sampler"}
    if choice == "best":
        timed = [r for r in results if r.key in sampler and not sampler[r.key].spec.is_ar and r.tokens_per_s]
        if not timed:
            raise ValueError("--profile best needs an SJD-PAC row in --methods; add one such as sjd-pac@auto:b128")
        return sampler[max(timed, key=lambda r: r.tokens_per_s).key]
    return sampler[choice]
