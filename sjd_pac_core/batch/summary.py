"""summary.md: the benchmark's table over a batch's results, and how many jobs returned AR's tokens.

Each results line becomes the benchmark's RunRecord, so the table is the one `sjd-pac bench`
writes (step compression, latency speedup paired per prompt and seed against the fastest AR row
of the batch, ...). Jobs are paired with AR's job of the same prompt, negative prompt,
resolution, seed and recipe (verify, CFG, temperature, top-k, top-p).
"""

from __future__ import annotations

import time
from typing import Dict, List, Mapping, Sequence, Tuple

from ..bench.report import markdown_table
from ..bench.summary import RunRecord, summarise
from .jobs import Job, ModelInfo


def _expand(histogram: Mapping[str, int]) -> List[int]:
    return [int(value) for value, count in histogram.items() for _ in range(count)]


def run_of(line: dict, job: Job, pair_index: int) -> RunRecord:
    """The benchmark's record of one results line (the prefill pass, one token, put back first)."""
    return RunRecord(
        method=job.method, prompt_index=pair_index, seed=job.seed, order=0, tokens=line["tokens"],
        forward_passes=line["forward_passes"], step_compression=line["tokens_per_pass"],
        latency_s=line["latency_s"], sampler_s=line["sampler_s"], forward_s=line["forward_s"],
        accept_lengths=[1] + _expand(line["accepted"]), windows=[0] + _expand(line["windows"]),
        tree_nodes=line["tree_nodes"], kept_by_ac=line["kept_by_ac"], token_digest=line["token_digest"],
    )


def ar_agreement(jobs: Sequence[Job], lines: Mapping[str, dict]) -> Dict[str, Tuple[int, int]]:
    """{method: (jobs with an AR job of the same picture, how many of them have AR's tokens)}."""
    ar = {}
    for job in jobs:
        if job.config.method == "ar" and job.id in lines:
            ar.setdefault((job.recipe, job.seed), lines[job.id]["token_digest"])
    out: Dict[str, Tuple[int, int]] = {}
    for job in jobs:
        reference = ar.get((job.recipe, job.seed))
        if job.config.method == "ar" or job.id not in lines or reference is None:
            continue
        paired, same = out.get(job.method, (0, 0))
        out[job.method] = (paired + 1, same + (lines[job.id]["token_digest"] == reference))
    return out


def summary_markdown(jobs: Sequence[Job], lines: Mapping[str, dict], model: ModelInfo, where: str,
                     failed: Sequence[Tuple[Job, str]] = ()) -> str:
    done = [job for job in jobs if job.id in lines]
    pairs: Dict[tuple, int] = {}
    runs = [run_of(lines[job.id], job, pairs.setdefault(job.recipe, len(pairs))) for job in done]
    keys = list(dict.fromkeys(job.method for job in jobs))
    table = markdown_table(summarise(runs, keys)) if runs else "(no finished jobs yet)"
    parts = [
        f"# sjd-pac batch\n\nmodel: {model.family} ({model.name}, {model.dtype}"
        f"{'' if model.quantize == 'none' else ', quantized ' + model.quantize}); {len(done)} of {len(jobs)} jobs "
        f"finished, run {where}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "Latency is each job's wall clock on its worker (encode, sample, decode); a speedup is paired per "
        "prompt and seed against the AR row. Jobs that ran on different machines, or side by side on one "
        "machine's shared cores, are timed under different loads: for speed, compare within one worker "
        "kind and take `sjd-pac bench` for a clean measurement.",
        table,
    ]
    agreement = ar_agreement(jobs, lines)
    if agreement:
        rules = {method: "/".join(sorted({job.config.verify for job in jobs if job.method == method}))
                 for method in agreement}
        parts.append("\n".join(
            f"- {method} (verify {rules[method]}): {same} of {paired} jobs returned AR's tokens (the token digest of "
            "the AR job of the same prompt, seed and recipe)" for method, (paired, same) in agreement.items()))
    if failed:
        parts.append("Failed (rerun the same command to try them again):\n" + "\n".join(
            f"- {job.describe()}: {error}" for job, error in failed))
    return "\n\n".join(parts) + "\n"
