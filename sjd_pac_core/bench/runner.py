"""The benchmark run: a grid of methods run interleaved per prompt and seed.

    from sjd_pac_core.bench.methods import DEFAULT_METHODS, parse_methods
    from sjd_pac_core.bench.runner import load_prompts, run_bench
    from sjd_pac_core.bench.report import write_outputs
    result = run_bench(model, load_prompts("demo"), seeds=[0], methods=parse_methods(DEFAULT_METHODS))
    write_outputs(result, "runs/bench")        # results.json, results.md (+ plots via plots.py)

Every number comes from the `RunStats` of `generate_image` (the one entry point of the CLI,
nodes, app and benchmark) plus one external clock around the call (summary.py says what each
column means); environment.py records the machine beside them.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import torch

from ..config import SamplerConfig
from ..generate import ImageResult, generate_image
from ..models.image_model import ARImageModel
from .environment import cost_curves, environment, loadavg
from .methods import MethodSpec, parse_method
from .summary import RunRecord, summarise

PROMPT_DIR = Path(__file__).resolve().parent / "prompts"
PROMPT_SETS = ("demo", "general")


def load_prompts(source: str, limit: Optional[int] = None) -> List[str]:
    """A prompt set by name ('demo', 'general') or a text file: one prompt per line, '#' comments."""
    path = PROMPT_DIR / f"{source}.txt" if source in PROMPT_SETS else Path(source)
    if not path.is_file():
        raise ValueError(f"No prompt file {path}; use --prompt-set demo, general, or a text file path.")
    prompts = [line.strip() for line in path.read_text(encoding="utf-8-sig").splitlines()]  # no byte order mark
    prompts = [p for p in prompts if p and not p.startswith("#")]
    if not prompts:
        raise ValueError(f"{path} holds no prompts.")
    return prompts[:limit] if limit else prompts


# --- one run ---------------------------------------------------------------------------------


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
    result = generate_image(model, prompt, config=config, seed=seed, threads=None)  # --threads set them
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
    result.environment.update(cost_curves(model))  # what window="auto" believes a pass costs here

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
    result.environment["loadavg_end"] = loadavg()
    return result
