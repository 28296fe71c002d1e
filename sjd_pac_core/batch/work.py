"""The one job function: (model, job) -> the job's results line and its PNG bytes.

The in-process runner and every Ray worker call `run_job`; nothing here knows where it runs, and
nothing here writes a file (the driver is the only writer). The seed travels with the job and
the sampler draws from its own generator, so a job gives the same tokens on any worker.
"""

from __future__ import annotations

import time
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Tuple

import torch

from ..bench.runner import record_of
from ..generate import generate_image
from ..images import png_bytes
from ..models.image_model import ARImageModel
from ..models.loader import load_model, resolve_dtype
from ..settings import run_record
from ..threads import threads_for
from .jobs import Job, ModelInfo


@dataclass(frozen=True)
class ModelSpec:
    """How every worker loads the model (sent to Ray workers, so plain values only)."""

    path: str = "demo"  # "demo" or a checkpoint folder (absolute, so that a worker finds it too)
    dtype: str = "auto"
    device: str = "auto"
    quantize: str = "none"  # weight-only quantization, as load_model takes it
    threads: int = 0  # torch CPU threads; 0 = chosen from the model's size and the workers per machine
    check_finite: bool = False  # every weight checked for NaN/inf after loading, whatever the size


@dataclass
class JobOutput:
    line: dict  # the job's line for results.jsonl
    png: bytes  # the picture, its run record in the PNG's text chunk


def cpu_threads(model: ARImageModel, spec: ModelSpec, cores: Optional[int] = None) -> Optional[int]:
    """Torch threads for a CPU run: --threads, else 1 for small models (threads.py), else the
    `cores` this worker may use (None: torch's own setting). None on a GPU (torch's is kept)."""
    if model.device.type != "cpu":
        return None
    return spec.threads or threads_for(model) or cores


def load_for_jobs(spec: ModelSpec) -> Tuple[ARImageModel, ModelInfo]:
    """Load the model once for many jobs; ModelLoadError (one sentence) when it cannot be loaded."""
    model = load_model(spec.path, dtype=spec.dtype, device=spec.device, quantize=spec.quantize,
                       check_finite=True if spec.check_finite else None)
    info = ModelInfo(name=model.name, family=model.family, dtype=str(resolve_dtype(spec.dtype, model.device)),
                     defaults=model.defaults, quantize=getattr(model, "quantize", spec.quantize))
    return model, info


def histogram(values: Iterable[int]) -> Dict[str, int]:
    """{value: count}, keys as text (JSON), in increasing order."""
    return {str(k): v for k, v in sorted(Counter(values).items())}


def run_job(model: ARImageModel, job: Job, worker: str = "local") -> JobOutput:
    """Make one job's picture; its numbers go into the line, its run record into the PNG."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # e.g. a word the demo does not know: kept in the line
        start = time.perf_counter()
        result = generate_image(model, job.prompt, config=job.config, seed=job.seed,
                                negative_prompt=job.negative_prompt, resolution=job.resolution,
                                threads=None)  # the runner set this worker's threads (--threads)
        latency = time.perf_counter() - start
    run = record_of(result, latency, job.method)
    threads = torch.get_num_threads() if model.device.type == "cpu" else None
    record = run_record(job.config, prompt=job.prompt, seed=job.seed, negative_prompt=job.negative_prompt,
                        resolution=result.encoding.resolution, model=job.model, family=model.family,
                        device=str(model.device), threads=threads)
    line = {
        "id": job.id, "method": job.method, "prompt": job.prompt, "negative_prompt": job.negative_prompt,
        "resolution": result.encoding.resolution, "seed": job.seed, "input_line": job.line,
        "model": job.model, "family": model.family, "dtype": job.dtype, "quantize": job.quantize,
        "settings": job.settings,
        "image": f"images/{job.id}.png",
        "tokens": run.tokens, "forward_passes": run.forward_passes, "tokens_per_pass": run.step_compression,
        "latency_s": run.latency_s, "sampler_s": run.sampler_s, "forward_s": run.forward_s,
        # per verification pass (the prefill pass, which commits one token, left out): tokens
        # committed and the window drafted, as {value: passes}
        "accepted": histogram(run.accept_lengths[1:]), "windows": histogram(run.windows[1:]),
        "tree_nodes": run.tree_nodes, "kept_by_ac": run.kept_by_ac,
        "token_digest": run.token_digest,
        "worker": worker, "device": str(model.device), "threads": threads,
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "warnings": sorted({str(w.message) for w in caught}),
    }
    return JobOutput(line=line, png=png_bytes(result.images[0], record))
