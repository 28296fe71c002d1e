"""The benchmark: a grid of methods run interleaved per prompt, summarised as the paper's tables.

    from sjd_pac_core.bench.runner import parse_methods, run_bench, write_outputs
    result = run_bench(model, prompts, seeds=[0], methods=parse_methods(DEFAULT_METHODS))
    write_outputs(result, "runs/bench")        # results.json, results.md (+ plots via plots.py)

Every number comes from the `RunStats` of `generate_image` (the one entry point of the CLI,
nodes, app and benchmark) plus one external clock around the call:

* latency: wall-clock seconds of the whole `generate_image` call (prompt encoding, sampling,
  decoding) -- what a user waits. Speedup = latency of the fastest plain-AR row (ours or
  transformers' generate, eager or compiled) / method latency for the same prompt and seed in
  the same run, so machine load that hits both cancels out; we report the
  median over (prompt, seed) pairs and the interquartile range.
* step compression: image tokens / forward passes (pooled over runs; AR = 1.00x).
* mean accepted length: tokens committed per verification pass (the prefill pass excluded).
* sampler overhead: time of a pass outside the model's forward (`wall_time - forward_time` of
  each PassRecord), per pass and as a fraction of the forward time.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Union

import torch

from ..config import SamplerConfig
from ..generate import ImageResult, generate_image
from ..models.image_model import ARImageModel
from .methods import (  # noqa: F401  (the grid's names, importable from here as before)
    AR_VARIANTS,
    BASELINE_METHODS,
    DEFAULT_METHODS,
    GENERATE_VARIANTS,
    PRESETS,
    RULE_VARIANTS,
    RULE_WINDOWS,
    MethodSpec,
    parse_method,
    parse_methods,
    rule_grid,
    with_rules,
)

PROMPT_DIR = Path(__file__).resolve().parent / "prompts"
PROMPT_SETS = ("demo", "general")


def load_prompts(source: str, limit: Optional[int] = None) -> List[str]:
    """A prompt set by name ('demo', 'general') or a text file: one prompt per line, '#' comments."""
    path = PROMPT_DIR / f"{source}.txt" if source in PROMPT_SETS else Path(source)
    if not path.is_file():
        raise ValueError(f"No prompt file {path}; use --prompt-set demo, general, or a text file path.")
    prompts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    prompts = [p for p in prompts if p and not p.startswith("#")]
    if not prompts:
        raise ValueError(f"{path} holds no prompts.")
    return prompts[:limit] if limit else prompts


# --- one run ---------------------------------------------------------------------------------


@dataclass
class RunRecord:
    """One generate_image call of the grid."""

    method: str
    prompt_index: int
    seed: int
    order: int  # position of this method among the back-to-back runs of its (prompt, seed)
    tokens: int
    forward_passes: int
    step_compression: float  # RunStats.step_compression
    latency_s: float  # wall clock of the whole generate_image call
    sampler_s: float  # RunStats.wall_time: sum of the passes' wall times (generate rows: the generate call)
    forward_s: Optional[float]  # RunStats.forward_time (None for generate rows: not measured inside it)
    accept_lengths: List[int]  # tokens committed per pass, prefill first
    windows: List[int]  # draft window of each pass (what window="auto" chose)
    tree_nodes: int  # PD side nodes fed over the run
    kept_by_ac: int  # drafts AC kept over the run
    token_digest: str  # token_digest(tokens): sha256 of the int64 tokens

    @property
    def overhead_s(self) -> Optional[float]:
        return None if self.forward_s is None else self.sampler_s - self.forward_s


def token_digest(tokens: torch.Tensor) -> str:
    """sha256 of the tokens as int64 bytes: equal digests <=> equal tokens (the bench and the batch)."""
    return hashlib.sha256(tokens.detach().cpu().to(torch.int64).contiguous().numpy().tobytes()).hexdigest()


def record_of(result: ImageResult, latency: float, method: str = "", prompt_index: int = 0,
              order: int = 0) -> RunRecord:
    """The RunRecord of one generate_image call that took `latency` seconds."""
    stats = result.stats
    return RunRecord(
        method=method or result.config.method, prompt_index=prompt_index, seed=result.seed, order=order,
        tokens=stats.tokens_committed, forward_passes=stats.forward_passes,
        step_compression=stats.step_compression, latency_s=latency, sampler_s=stats.wall_time,
        forward_s=stats.forward_time, accept_lengths=list(stats.accept_lengths),
        windows=[r.window for r in stats.records], tree_nodes=sum(r.tree_nodes for r in stats.records),
        kept_by_ac=sum(r.kept_by_ac for r in stats.records), token_digest=token_digest(result.tokens),
    )


def run_one(model: ARImageModel, prompt: str, config: SamplerConfig, seed: int, method: str = "",
            prompt_index: int = 0, order: int = 0) -> RunRecord:
    start = time.perf_counter()
    result = generate_image(model, prompt, config=config, seed=seed)
    return record_of(result, time.perf_counter() - start, method, prompt_index, order)


def run_generate(model: ARImageModel, baseline, prompt: str, config: SamplerConfig, seed: int,
                 method: str, prompt_index: int = 0, order: int = 0) -> RunRecord:
    """One transformers-generate baseline image, timed like generate_image: encode, sample, decode."""
    import warnings

    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        encoding = model.encode_prompt(prompt)
    out = baseline.generate(encoding, config, seed)
    model.decode(out.tokens.unsqueeze(0), encoding.resolution)
    latency = time.perf_counter() - start
    n = int(out.tokens.numel())
    return RunRecord(
        method=method, prompt_index=prompt_index, seed=seed, order=order, tokens=n, forward_passes=n,
        step_compression=1.0, latency_s=latency, sampler_s=out.seconds, forward_s=None,
        accept_lengths=[1] * n, windows=[0] * n, tree_nodes=0, kept_by_ac=0, token_digest=token_digest(out.tokens),
    )


def make_baselines(model: ARImageModel, methods: Sequence[MethodSpec], prompts: Sequence[str]) -> Dict[str, object]:
    """{key: GenerateBaseline} for the grid's generate rows; raises BaselineUnsupported (one
    sentence) before any work when the model's family cannot run them."""
    from .baselines import GenerateBaseline, prompt_width

    specs = [m for m in methods if m.is_generate]
    if not specs:
        return {}
    width = prompt_width(model, prompts)
    return {m.key: GenerateBaseline(model, static=m.variant == "generate-static", compiled=m.compiled,
                                    prompt_width=width) for m in specs}


# --- the grid --------------------------------------------------------------------------------


@dataclass
class BenchResult:
    model: Dict[str, str]
    environment: Dict[str, object]
    settings: Dict[str, object]
    methods: List[MethodSpec]
    prompts: List[str]
    seeds: List[int]
    runs: List[RunRecord] = field(default_factory=list)
    warmup_s: float = 0.0
    total_s: float = 0.0

    def runs_of(self, key: str) -> List[RunRecord]:
        return [r for r in self.runs if r.method == key]

    def summary(self) -> Dict[str, dict]:
        return summarise(self.runs, [m.key for m in self.methods])


def _loadavg() -> Optional[List[float]]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):  # pragma: no cover - not on every OS
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:  # pragma: no cover
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> Optional[str]:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):  # pragma: no cover
        return None


def environment(model: ARImageModel) -> Dict[str, object]:
    device = model.device
    env = {
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "cpu": _cpu_name(),
        "loadavg_start": _loadavg(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "git_commit": _git_commit(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


def _cost_curves(model: ARImageModel) -> Dict[str, Dict[int, float]]:
    """Milliseconds per pass of n nodes, as the auto window measured them (eager and compiled),
    if it ran: what a pass costs on this machine."""
    from ..engine.window import measured_cost_curves

    return {("auto_cost_curve_compiled_ms" if compiled else "auto_cost_curve_ms"):
            {n: round(1000 * t, 3) for n, t in zip(curve.sizes, curve.seconds)}
            for compiled, curve in measured_cost_curves(model.token_model).items()}


def _sync(model: ARImageModel) -> None:
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


def run_bench(
    model: ARImageModel,
    prompts: Sequence[str],
    seeds: Sequence[int],
    methods: Sequence[MethodSpec],
    base_config: Optional[SamplerConfig] = None,
    warmup: bool = True,
    progress: bool = True,
    on_run: Optional[Callable[[RunRecord], None]] = None,
) -> BenchResult:
    """Run every method on every (prompt, seed), the methods of one pair back to back.

    The order of the methods rotates from one (prompt, seed) to the next, so no method always
    runs first (cold caches) or last. Warm-up: one untimed run of every method (this also
    measures and caches the auto window's cost curve) before any timed run.
    """
    from tqdm import tqdm

    base = base_config or model.defaults.sampler_config()
    baselines = make_baselines(model, methods, prompts)

    def run(spec: MethodSpec, prompt_index: int, seed: int, order: int) -> RunRecord:
        if spec.is_generate:
            return run_generate(model, baselines[spec.key], prompts[prompt_index], spec.config(base), seed,
                                spec.key, prompt_index, order)
        return run_one(model, prompts[prompt_index], spec.config(base), seed, spec.key, prompt_index, order)

    result = BenchResult(
        model={"family": model.family, "name": getattr(model, "name", "") or model.family},
        environment=environment(model),
        settings={
            "base_config": {k: v for k, v in asdict(base).items() if k not in ("method", "window")},
            "methods": [m.key for m in methods],
            "warmup": warmup,
            "interleaved": "methods back to back per (prompt, seed), order rotated per pair",
            "latency": "wall clock of generate_image (encode + sample + decode); generate rows: encode + "
                       "transformers generate + decode",
            "reference": "every latency ratio is against the fastest plain-AR row (median latency) of this run",
        },
        methods=list(methods),
        prompts=list(prompts),
        seeds=list(seeds),
    )
    t0 = time.perf_counter()
    if warmup:
        for spec in tqdm(methods, desc="warm-up", disable=not progress, leave=False):
            run(spec, 0, 10_000_019, 0)  # also compiles the compiled rows, outside the timed runs
        _sync(model)
    result.warmup_s = time.perf_counter() - t0
    result.environment.update(_cost_curves(model))  # what window="auto" believes a pass costs here

    pairs = [(i, s) for i in range(len(prompts)) for s in seeds]
    bar = tqdm(total=len(pairs) * len(methods), unit="run", desc="bench", disable=not progress)
    for pair_index, (i, seed) in enumerate(pairs):
        shift = pair_index % len(methods)
        order = list(methods[shift:]) + list(methods[:shift])
        for position, spec in enumerate(order):
            bar.set_description(f"bench {spec.key}")
            record = run(spec, i, seed, position)
            result.runs.append(record)
            if on_run is not None:
                on_run(record)
            bar.update(1)
        ar = [r for r in result.runs if parse_method(r.method).is_ar]
        best = summarise(result.runs, [m.key for m in methods])
        fastest = max((v for v in best.values() if v.get("speedup_median")), default=None,
                      key=lambda v: v["speedup_median"])
        if ar and fastest:
            bar.set_postfix(best=f"{fastest['method']} {fastest['speedup_median']:.2f}x")
    bar.close()
    result.total_s = time.perf_counter() - t0
    result.environment["loadavg_end"] = _loadavg()
    return result


# --- summary ---------------------------------------------------------------------------------


def _quantiles(values: Sequence[float]) -> Dict[str, float]:
    xs = sorted(values)
    if len(xs) == 1:
        return {"median": xs[0], "q25": xs[0], "q75": xs[0]}
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return {"median": statistics.median(xs), "q25": q[0], "q75": q[2]}


def fastest_ar(runs: Sequence[RunRecord], keys: Iterable[str]) -> Optional[str]:
    """The plain-AR row (ours or transformers', eager or compiled) with the lowest median latency."""
    medians = {}
    for key in keys:
        try:
            is_ar = parse_method(key).is_ar
        except ValueError:
            is_ar = False
        lat = [r.latency_s for r in runs if r.method == key]
        if is_ar and lat:
            medians[key] = statistics.median(lat)
    return min(medians, key=medians.get, default=None)


def summarise(runs: Sequence[RunRecord], keys: Iterable[str], reference: Optional[str] = None) -> Dict[str, dict]:
    """Per method: the table's columns (see the module docstring and docs/benchmark.md).

    Latency speedups are paired per (prompt, seed) against `reference`, by default the fastest
    plain-AR row of the run (`fastest_ar`)."""
    keys = list(keys)
    reference = reference or fastest_ar(runs, keys)
    ref_latency = {(r.prompt_index, r.seed): r.latency_s for r in runs if r.method == reference}
    out: Dict[str, dict] = {}
    for key in keys:
        rs = [r for r in runs if r.method == key]
        if not rs:
            continue
        tokens = sum(r.tokens for r in rs)
        passes = sum(r.forward_passes for r in rs)
        timed = [r for r in rs if r.forward_s is not None]  # generate rows have no forward time
        timed_passes = sum(r.forward_passes for r in timed)
        fwd = sum(r.forward_s for r in timed)
        over = sum(r.overhead_s for r in timed)
        verify = [n for r in rs for n in r.accept_lengths[1:]]  # the prefill always commits one
        lat = _quantiles([r.latency_s for r in rs])
        row = {
            "method": key,
            "runs": len(rs),
            "tokens_per_image": tokens / len(rs),
            "forward_passes_mean": passes / len(rs),
            "step_compression": tokens / passes,
            "step_compression_per_run": _quantiles([r.step_compression for r in rs]),
            "latency_s": lat,
            "tokens_per_second": tokens / sum(r.latency_s for r in rs),
            "mean_accepted_length": sum(verify) / len(verify) if verify else float("nan"),
            "one_token_pass_fraction": sum(1 for n in verify if n == 1) / len(verify) if verify else float("nan"),
            "overhead_ms_per_pass": 1000.0 * over / timed_passes if timed else None,
            "forward_ms_per_pass": 1000.0 * fwd / timed_passes if timed else None,
            "overhead_pct_of_forward": (100.0 * over / fwd if fwd > 0 else float("nan")) if timed else None,
            "outside_sampler_ms_per_image": 1000.0 * sum(r.latency_s - r.sampler_s for r in rs) / len(rs),
            "window_median": statistics.median([w for r in rs for w in r.windows[1:]] or [0]),
            "tree_nodes_per_pass": sum(r.tree_nodes for r in rs) / passes,
            "speedup_reference": reference,
        }
        speedups = [ref_latency[(r.prompt_index, r.seed)] / r.latency_s
                    for r in rs if (r.prompt_index, r.seed) in ref_latency and r.latency_s > 0]
        if speedups:  # the reference row itself: exactly 1.0 on every pair
            q = _quantiles(speedups)
            row.update(speedup_median=q["median"], speedup_q25=q["q25"], speedup_q75=q["q75"],
                       speedup_min=min(speedups), speedup_max=max(speedups),
                       slower_than_ar_fraction=sum(1 for s in speedups if s < 1.0) / len(speedups))
        out[key] = row
    return out


def acceptance_histogram(runs: Sequence[RunRecord], key: str) -> Dict[int, int]:
    """{tokens committed by a verification pass: passes} over all runs of one method."""
    hist: Dict[int, int] = {}
    for r in runs:
        if r.method == key:
            for n in r.accept_lengths[1:]:
                hist[n] = hist.get(n, 0) + 1
    return dict(sorted(hist.items()))


# --- outputs ---------------------------------------------------------------------------------

def _label(key: str) -> str:
    try:
        return parse_method(key).label
    except ValueError:
        return key


def _fmt(value: Optional[float], spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def markdown_table(summary: Dict[str, dict]) -> str:
    reference = next((row.get("speedup_reference") for row in summary.values()), None)
    against = f"fastest AR ({_label(reference)})" if reference else "AR"
    head = (f"| method | forward passes | step compression | latency s (median) | latency speedup vs {against}, "
            "median [IQR] | tokens/s | mean accepted length | 1-token passes | overhead ms/pass | "
            "overhead % of forward |")
    rule = "|" + "---|" * 10
    lines = [head, rule]
    for key, row in summary.items():
        if row.get("speedup_median") is not None:
            speed = f"{row['speedup_median']:.2f}x [{row['speedup_q25']:.2f}-{row['speedup_q75']:.2f}]"
        else:
            speed = "-"
        window = ""
        if "@auto" in key:  # what the auto policy chose: L, and the tree where it chooses that too
            window = f" (median L {row['window_median']:g}, {row.get('tree_nodes_per_pass', 0):.1f} tree nodes/pass)"
        lines.append(
            f"| {_label(key)}{window} | {row['forward_passes_mean']:.1f} | {row['step_compression']:.2f}x | "
            f"{row['latency_s']['median']:.2f} | {speed} | {row['tokens_per_second']:.1f} | "
            f"{row['mean_accepted_length']:.2f} | {100 * row['one_token_pass_fraction']:.0f}% | "
            f"{_fmt(row['overhead_ms_per_pass'], '.2f')} | {_fmt(row['overhead_pct_of_forward'], '.1f', '%')} |"
        )
    return "\n".join(lines)


def header_text(result: BenchResult) -> str:
    env = result.environment
    device = env.get("gpu") or env["cpu"]
    cfg = result.settings["base_config"]
    recipe = ", ".join(f"{k}={cfg[k]}" for k in ("cfg_scale", "temperature", "top_k", "top_p", "verify"))
    return (
        f"model: {result.model['family']} ({result.model['name']}) on {env['device']} ({device}); "
        f"torch threads {env['torch_threads']} of {env['cpu_count']} CPUs; load average "
        f"{env.get('loadavg_start')} at start, {env.get('loadavg_end')} at end\n"
        f"{len(result.prompts)} prompts x {len(result.seeds)} seeds, methods interleaved per prompt; "
        f"D={cfg['tree_depth']}, K={cfg['tree_width']}; {recipe}; "
        f"{env['date_utc']}, commit {env.get('git_commit')}, torch {env['torch']}; "
        f"benchmark {result.total_s / 60:.1f} min (warm-up {result.warmup_s:.0f} s)"
        + "".join(f"\nforward ms per pass of n nodes ({'compiled' if 'compiled' in key else 'eager'}, as the auto "
                  f"window measured it): " + ", ".join(f"t({n}) = {ms:.2f}" for n, ms in env[key].items())
                  for key in ("auto_cost_curve_ms", "auto_cost_curve_compiled_ms") if env.get(key))
    )


def to_json(result: BenchResult) -> dict:
    summary = result.summary()
    return {
        "model": result.model,
        "environment": result.environment,
        "settings": result.settings,
        "prompts": result.prompts,
        "seeds": result.seeds,
        "methods": [{"key": m.key, "label": m.label, "variant": m.variant, "window": m.window}
                    for m in result.methods],
        "summary": summary,
        "findings": findings(result.runs, summary, result.settings["base_config"].get("verify")),
        "histograms": {m.key: acceptance_histogram(result.runs, m.key) for m in result.methods},
        "runs": [dict(asdict(r), overhead_s=r.overhead_s) for r in result.runs],
        "warmup_s": result.warmup_s,
        "total_s": result.total_s,
    }


def write_outputs(result: BenchResult, out_dir: Union[str, Path], extra_md: str = "") -> Dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = to_json(result)
    paths = {"json": out / "results.json", "markdown": out / "results.md"}
    paths["json"].write_text(json.dumps(data, indent=1, default=float), encoding="utf-8")
    md = "\n\n".join(x for x in [header_text(result), markdown_table(data["summary"]),
                                 findings_markdown(data["findings"]), extra_md] if x)
    paths["markdown"].write_text(md + "\n", encoding="utf-8")
    return paths


# --- locality ---------------------------------------------------------------------------------


def measure_locality(model: ARImageModel, samples: int = 4, perturb: int = 16, seed: int = 0,
                     max_distance: int = 32) -> Optional[Dict[str, object]]:
    """The locality curve of the demo model, by the demo engineer's calibration code
    (`sjd_pac_core.demo.calibrate`): mean total variation of p_{i+d} after changing the token
    at i, on the model's own AR samples. None for other families."""
    demo = getattr(model, "demo", None)
    if demo is None:
        return None
    import argparse
    import tempfile

    from ..demo import calibrate

    if hasattr(calibrate, "entropy_and_locality"):
        from ..demo.model import reference_ar_sample

        vocab = demo.vocab
        allowed = vocab.allowed_tokens()
        free = ~torch.zeros(vocab.num_image_tokens, dtype=torch.bool).index_fill_(0, vocab.eol_positions(), True)
        caps = (calibrate.CAPTIONS * samples)[:samples]
        with torch.no_grad():
            toks = reference_ar_sample(demo, caps, seed=seed)
        res: Dict[str, object] = {}
        calibrate.entropy_and_locality(demo, caps, toks, allowed, free,
                                       argparse.Namespace(seed=seed, perturb=perturb), res)
    else:  # older calibrate.py: everything lives in main()
        with tempfile.TemporaryDirectory() as tmp:
            res = calibrate.main(["--weights", demo.path, "--out", f"{tmp}/cal.json", "--samples", str(samples),
                                  "--perturb", str(perturb), "--sjd-runs", "1", "--seed", str(seed),
                                  "--threads", str(torch.get_num_threads())])
    tv = [float(v) for _, v in sorted(res["locality_tv"].items(), key=lambda kv: int(kv[0]))][:max_distance]
    return {"tv": tv, "row_length": demo.vocab.row_length, "samples": samples, "perturb": perturb,
            "entropy_nats": res.get("entropy_nats_T1"), "source": "sjd_pac_core.demo.calibrate"}


# --- the questions the benchmark answers --------------------------------------------------------


def _spec(key: str) -> Optional[MethodSpec]:
    try:
        return parse_method(key)
    except ValueError:
        return None


def _best(summary: Dict[str, dict], variant: str, field: str, like: Optional[MethodSpec] = None) -> Optional[str]:
    """The fixed-window row of `variant` with the largest `field` (same rule, compilation and tree
    knobs as `like` when given)."""
    keys = []
    for k in summary:
        spec = _spec(k)
        if spec is None or spec.variant != variant or spec.window in (None, "auto"):
            continue
        if like is not None and (spec.verify, spec.compiled, spec.tree_text) != (like.verify, like.compiled,
                                                                                   like.tree_text):
            continue
        if summary[k].get(field) is not None:
            keys.append(k)
    return max(keys, key=lambda k: summary[k][field], default=None)


def _paired(runs: Sequence[RunRecord], numerator: str, denominator: str) -> List[float]:
    """latency(numerator) / latency(denominator) per (prompt, seed) both ran."""
    lat = {(r.method, r.prompt_index, r.seed): r.latency_s for r in runs}
    return [lat[(numerator, p, s)] / lat[(m, p, s)] for (m, p, s) in lat
            if m == denominator and (numerator, p, s) in lat]


def rule_comparison(runs: Sequence[RunRecord], summary: Dict[str, dict]) -> List[dict]:
    """Every windowed (variant, window, compiled) row run under both rules: step compression of each and the
    paired latency ratio rejection / gumbel (> 1: gumbel faster)."""
    rows = []
    for key in summary:
        spec = _spec(key)
        if spec is None or spec.verify != "gumbel" or spec.is_ar:  # AR rows compress nothing
            continue
        twin = replace(spec, verify="rejection").key
        if twin not in summary:
            continue
        ratios = _paired(runs, twin, key)
        q = _quantiles(ratios) if ratios else {"median": None, "q25": None, "q75": None}
        rows.append({
            "method": replace(spec, verify=None).key,
            "compression_rejection": summary[twin]["step_compression"],
            "compression_gumbel": summary[key]["step_compression"],
            "compression_gain": summary[key]["step_compression"] / summary[twin]["step_compression"],
            "speedup_rejection": summary[twin].get("speedup_median"),
            "speedup_gumbel": summary[key].get("speedup_median"),
            "latency_rejection_over_gumbel_median": q["median"], "q25": q["q25"], "q75": q["q75"],
        })
    return rows


def seed_exact_agreement(runs: Sequence[RunRecord], base_verify: Optional[str] = None) -> Dict[str, dict]:
    """Under verify='gumbel' every method (transformers' generate with our processor included)
    must return plain AR's tokens for the same seed: identical (prompt, seed) pairs per row,
    against our eager AR under gumbel."""
    def rule(key: str) -> Optional[str]:
        spec = _spec(key)
        return None if spec is None else (spec.verify or base_verify)

    ar_keys = [k for k in {r.method for r in runs} if (_spec(k) or MethodSpec("sjd", 1)).variant == "ar"
               and rule(k) == "gumbel"]
    if not ar_keys:
        return {}
    reference = min(ar_keys, key=lambda k: (_spec(k).compiled, k))  # eager first
    digest = {(r.prompt_index, r.seed): r.token_digest for r in runs if r.method == reference}
    out: Dict[str, dict] = {}
    for key in sorted({r.method for r in runs}):
        if key == reference or rule(key) != "gumbel":
            continue
        pairs = [(r.prompt_index, r.seed) for r in runs if r.method == key and (r.prompt_index, r.seed) in digest]
        same = sum(1 for r in runs if r.method == key and digest.get((r.prompt_index, r.seed)) == r.token_digest)
        out[key] = {"against": reference, "pairs": len(pairs), "identical": same}
    return out


def findings(runs: Sequence[RunRecord], summary: Dict[str, dict],
             base_verify: Optional[str] = None) -> Dict[str, object]:
    """Auto window vs the best fixed L (paired per prompt and seed), the two rules side by side,
    seed-exact agreement under gumbel, and the project's targets."""
    out: Dict[str, object] = {}
    autos = [k for k in summary if "@auto" in k]
    comparisons = []
    for auto in autos:  # each auto row against the best fixed L of its own variant, rule and compilation
        spec = _spec(auto)
        best_fixed = _best(summary, spec.variant, "speedup_median", like=spec) if spec else None
        if not best_fixed:
            continue
        q = _quantiles(_paired(runs, best_fixed, auto))
        comparisons.append({
            "auto": auto, "best_fixed": best_fixed,
            "auto_speedup_over_ar": summary[auto].get("speedup_median"),
            "best_fixed_speedup_over_ar": summary[best_fixed].get("speedup_median"),
            "auto_over_best_fixed_median": q["median"], "q25": q["q25"], "q75": q["q75"],
            "auto_slower_than_ar_fraction": summary[auto].get("slower_than_ar_fraction"),
            "auto_median_window": summary[auto]["window_median"],
        })
    if comparisons:
        out["auto_vs_best_fixed"] = comparisons
    auto = next((k for k in autos if (_spec(k) or MethodSpec("sjd", 1)).variant == "sjd-pac"),
                autos[0] if autos else None)
    rules = rule_comparison(runs, summary)
    if rules:
        out["rules"] = rules
    agreement = seed_exact_agreement(runs, base_verify)
    if agreement:
        out["seed_exact"] = agreement
    out["speedup_reference"] = next((row.get("speedup_reference") for row in summary.values()), None)
    pac = _best(summary, "sjd-pac", "step_compression")
    sjd = _best(summary, "sjd", "step_compression")
    targets = {}
    if pac:
        targets["sjd_pac_compression_vs_ar"] = {"value": summary[pac]["step_compression"], "target": 3.5,
                                                "method": pac}
    if pac and sjd:
        targets["sjd_pac_compression_vs_sjd"] = {
            "value": summary[pac]["step_compression"] / summary[sjd]["step_compression"], "target": 2.0,
            "method": f"{pac} / {sjd}"}
    if auto and summary[auto].get("speedup_median") is not None:
        targets["auto_latency_speedup_vs_ar"] = {"value": summary[auto]["speedup_median"], "target": 1.5,
                                                 "method": auto}
    at64 = next((k for k in ("sjd-pac@64", "sjd-pac@64:rejection", "sjd-pac@64:gumbel") if k in summary), None)
    if (pac or at64) and summary[at64 or pac].get("overhead_pct_of_forward") is not None:
        key = at64 or pac
        targets["overhead_pct_of_forward"] = {"value": summary[key]["overhead_pct_of_forward"], "target": 10.0,
                                              "method": key, "lower_is_better": True}
    for t in targets.values():
        t["met"] = t["value"] <= t["target"] if t.get("lower_is_better") else t["value"] >= t["target"]
    out["targets"] = targets
    return out


def findings_markdown(found: Dict[str, object]) -> str:
    lines = []
    for a in found.get("auto_vs_best_fixed", []):
        lines.append(
            f"window='auto', {_label(a['auto'])}: {a['auto_speedup_over_ar']:.2f}x over AR (median L "
            f"{a['auto_median_window']:g}) vs the best fixed L of the same method, {_label(a['best_fixed'])}: "
            f"{a['best_fixed_speedup_over_ar']:.2f}x; paired per prompt, "
            f"auto / best fixed latency ratio median {a['auto_over_best_fixed_median']:.2f} "
            f"[IQR {a['q25']:.2f}-{a['q75']:.2f}] (> 1 = auto faster); auto slower than AR on "
            f"{100 * (a['auto_slower_than_ar_fraction'] or 0):.0f}% of prompts.")
    if found.get("speedup_reference"):
        lines.append(f"every latency speedup is paired per (prompt, seed) against the fastest plain-AR row of this "
                     f"run: {_label(found['speedup_reference'])}.")
    for r in found.get("rules", []):
        ratio = r["latency_rejection_over_gumbel_median"]
        lines.append(
            f"{_label(r['method'])}: step compression {r['compression_rejection']:.2f}x (rejection) vs "
            f"{r['compression_gumbel']:.2f}x (gumbel), x{r['compression_gain']:.2f}; latency rejection / gumbel "
            + ("-" if ratio is None else f"median {ratio:.2f} [IQR {r['q25']:.2f}-{r['q75']:.2f}]")
            + (" (gumbel faster)" if ratio and ratio > 1 else " (rejection faster)" if ratio else ""))
    for key, a in found.get("seed_exact", {}).items():
        lines.append(f"seed-exact (verify='gumbel'): {_label(key)} returned {_label(a['against'])}'s tokens on "
                     f"{a['identical']} of {a['pairs']} (prompt, seed) pairs"
                     + ("" if a["identical"] == a["pairs"] else " - NOT token-identical, see docs/benchmark.md"))
    names = {"sjd_pac_compression_vs_ar": "SJD-PAC step compression over AR (best L)",
             "sjd_pac_compression_vs_sjd": "SJD-PAC step compression over plain SJD (best L of each)",
             "auto_latency_speedup_vs_ar": "latency speedup over AR with window='auto'",
             "overhead_pct_of_forward": "sampler overhead, % of forward time (SJD-PAC L=64)"}
    for key, t in found.get("targets", {}).items():
        cmp = "<=" if t.get("lower_is_better") else ">="
        lines.append(f"target: {names.get(key, key)} {cmp} {t['target']:g}: measured {t['value']:.2f} "
                     f"({t['method']}) - {'met' if t['met'] else 'MISSED'}")
    return "\n".join(f"- {x}" for x in lines)
