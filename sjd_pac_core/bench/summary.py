"""What one benchmark run measured (RunRecord) and the table's numbers over many runs.

Every number comes from the `RunStats` of `generate_image` plus one external clock around the call:

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

import statistics
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence

from .methods import parse_method


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
    token_digest: str  # runner.token_digest: sha256 of the int64 tokens (equal tokens <=> equal digest)

    @property
    def overhead_s(self) -> Optional[float]:
        return None if self.forward_s is None else self.sampler_s - self.forward_s


def quantiles(values: Sequence[float]) -> Dict[str, float]:
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
        lat = quantiles([r.latency_s for r in rs])
        row = {
            "method": key,
            "runs": len(rs),
            "tokens_per_image": tokens / len(rs),
            "forward_passes_mean": passes / len(rs),
            "step_compression": tokens / passes,
            "step_compression_per_run": quantiles([r.step_compression for r in rs]),
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
            q = quantiles(speedups)
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
