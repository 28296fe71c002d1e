"""A benchmark's outputs: results.json (every run, the summary, the findings, the machine) and
results.md (a header naming the machine and settings, the table, the findings)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Dict, Optional, Tuple, Union

from ..files import keep

from .findings import findings, findings_markdown
from .methods import method_label
from .runner import BenchResult
from .summary import acceptance_histogram, summarise


def _fmt(value: Optional[float], spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def markdown_table(summary: Dict[str, dict]) -> str:
    reference = next((row.get("speedup_reference") for row in summary.values()), None)
    against = f"fastest AR ({method_label(reference)})" if reference else "AR"
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
            f"| {method_label(key)}{window} | {row['forward_passes_mean']:.1f} | {row['step_compression']:.2f}x | "
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
    summary = summarise(result.runs, [m.key for m in result.methods])
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
    """Write results.json and results.md (each whole or not at all); where the folder cannot take
    them (a full disk) both go to one folder in the temp dir, said on stderr. -> where they are."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = to_json(result)
    md = "\n\n".join(x for x in [header_text(result), markdown_table(data["summary"]),
                                 findings_markdown(data["findings"]), extra_md] if x)
    return keep_all({"json": (out / "results.json", json.dumps(data, indent=1, default=float)),
                     "markdown": (out / "results.md", md + "\n")})


def keep_all(files: Dict[str, Tuple[Path, str]]) -> Dict[str, Path]:
    """files.keep for text files that belong together: one fallback folder for all, one warning each."""
    paths: Dict[str, Path] = {}
    fallback: Optional[Path] = None
    for key, (path, text) in files.items():
        kept = keep(path, text.encode("utf-8"), fallback)
        if kept.moved:
            print(f"warning: {kept.note}", file=sys.stderr)
            fallback = kept.path.parent
        paths[key] = kept.path
    return paths
