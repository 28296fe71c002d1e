"""Where a pass's time goes: one run under torch.profiler, summed by the sampler's stages.

The sampling loop marks every pass's stages (engine/timing.py `stage`): plan (the pass's inputs
and masks), forward (the model), verify (every node's decision, on the device), sync (the pass's
one host sync: on a GPU it waits for the forward and verification to finish), commit (the path
and the cache's compaction) and draft (the next pass's drafts and tree). Per pass: each stage's
host time (the CPU time spent inside it, launches included) and, on a GPU, its device time (the
kernels it launched); the time outside every stage is the prompt's encoding, the prefill, the
picture's decoding and the loop's own bookkeeping.

    python benchmarks/gpu_e2e.py --device cuda --profile best     # the fastest SJD-PAC row
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional

import torch

from ..engine.timing import STAGE_PREFIX

STAGES = ("plan", "forward", "verify", "sync", "commit", "draft")


@dataclass
class StageTime:
    stage: str
    calls: int
    host_ms_per_pass: float
    device_ms_per_pass: Optional[float]  # None on a CPU


@dataclass
class StageProfile:
    passes: int
    wall_ms_per_pass: float  # the run's wall time / its passes (the prompt's pass included)
    stages: List[StageTime]
    trace: Optional[str] = None  # the Chrome trace, if written

    @property
    def outside_ms_per_pass(self) -> float:
        """Wall time per pass outside every stage (the prompt, the prefill, the picture's decoding
        and the loop's bookkeeping)."""
        return self.wall_ms_per_pass - sum(s.host_ms_per_pass for s in self.stages)


def profile_stages(run: Callable[[], object], device: torch.device, trace: Optional[Path] = None) -> StageProfile:
    """Run `run` (one sampler run) under torch.profiler and sum its time by stage."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - start
    totals = {e.key: e for e in prof.key_averages() if e.key.startswith(STAGE_PREFIX)}
    forward = totals.get(STAGE_PREFIX + "forward")
    passes = forward.count if forward is not None else 0
    if not passes:
        raise RuntimeError("the profiled run made no pass with the sampler's stages; profile a sampler row")
    stages = []
    for name in STAGES:
        event = totals.get(STAGE_PREFIX + name)
        if event is None:
            continue
        device_ms = event.device_time_total / 1000.0 / passes if device.type == "cuda" else None
        stages.append(StageTime(name, event.count, event.cpu_time_total / 1000.0 / passes, device_ms))
    written = None
    if trace is not None:
        prof.export_chrome_trace(str(trace))
        written = str(trace)
    return StageProfile(passes, 1000.0 * wall / passes, stages, written)


def stage_table(profile: StageProfile) -> List[str]:
    """Markdown lines: a row per stage, then the time outside them."""
    gpu = any(s.device_ms_per_pass is not None for s in profile.stages)
    head = "| stage | host ms per pass | share of the pass |" + (" device ms per pass |" if gpu else "")
    lines = [head, "|---|---|---|" + ("---|" if gpu else "")]
    for s in profile.stages:
        row = f"| {s.stage} | {s.host_ms_per_pass:.3f} | {100 * s.host_ms_per_pass / profile.wall_ms_per_pass:.0f}% |"
        lines.append(row + (f" {s.device_ms_per_pass:.3f} |" if gpu else ""))
    outside = profile.outside_ms_per_pass
    share = 100 * outside / profile.wall_ms_per_pass
    lines.append(f"| outside the stages (prompt, prefill, decoding, bookkeeping) | {outside:.3f} | {share:.0f}% |"
                 + (" - |" if gpu else ""))
    return lines
