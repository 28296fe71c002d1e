"""Images per minute of `sjd-pac batch` with 1 and with 2 (or more) Ray workers, side by side.

    python benchmarks/batch_scaling.py --out runs/batch_scaling                 # demo, 24 prompts, 1 vs 2 workers
    python benchmarks/batch_scaling.py --prompts 2 --rounds 1 --out /tmp/tiny  # a check that it runs

Each round runs the same batch once per worker count, into a fresh folder, in an order that
rotates from round to round, so machine load that hits one hits the other. Two rates per run:
end to end (starting Ray and loading the model included: what a user waits) and steady (images
between the first and the last result, startup excluded: what more images cost). The ratio of
each worker count to the first one is the median over rounds. Needs the ray extra.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, no install needed

from sjd_pac_core.batch.driver import BatchOptions, run_batch  # noqa: E402
from sjd_pac_core.batch.jobs import InputLine  # noqa: E402
from sjd_pac_core.batch.work import ModelSpec  # noqa: E402
from sjd_pac_core.bench.methods import parse_methods  # noqa: E402
from sjd_pac_core.bench.runner import load_prompts  # noqa: E402


def one_run(lines, methods, workers: int, model: ModelSpec) -> dict:
    stamps = []
    with tempfile.TemporaryDirectory(prefix="batch_scaling_") as out:
        start = time.perf_counter()
        report = run_batch(BatchOptions(lines=lines, out=Path(out), methods=methods, model=model, workers=workers,
                                        progress=False),
                           on_result=lambda outcome: stamps.append(time.perf_counter()))
        total = time.perf_counter() - start
    assert report.complete and len(stamps) == len(report.jobs), "a job failed; see above"
    steady = (len(stamps) - 1) / (stamps[-1] - stamps[0]) * 60 if len(stamps) > 1 else float("nan")
    return {"workers": workers, "images": len(stamps), "seconds": total, "images_per_min": len(stamps) / total * 60,
            "steady_images_per_min": steady, "where": report.where}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--prompt-set", default="demo", help="demo, general or a text file")
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--methods", default="sjd-pac@32")
    parser.add_argument("--workers", default="1,2", help="worker counts to compare, the first is the reference")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    lines = [InputLine(i + 1, p) for i, p in enumerate(load_prompts(args.prompt_set, args.prompts))]
    methods = parse_methods(args.methods)
    counts = [int(n) for n in args.workers.split(",")]
    model = ModelSpec(args.model, device=args.device)
    runs = []
    for round_index in range(args.rounds):
        shift = round_index % len(counts)
        for workers in counts[shift:] + counts[:shift]:
            runs.append(dict(one_run(lines, methods, workers, model), round=round_index))
            print(json.dumps(runs[-1]))
    rows = []
    for workers in counts:
        mine = [r for r in runs if r["workers"] == workers]
        ref = {r["round"]: r for r in runs if r["workers"] == counts[0]}
        rows.append({
            "workers": workers,
            "images_per_min": statistics.median(r["images_per_min"] for r in mine),
            "steady_images_per_min": statistics.median(r["steady_images_per_min"] for r in mine),
            "ratio": statistics.median(r["images_per_min"] / ref[r["round"]]["images_per_min"] for r in mine),
            "steady_ratio": statistics.median(r["steady_images_per_min"] / ref[r["round"]]["steady_images_per_min"]
                                              for r in mine),
        })
    table = ["| workers | images/min end to end | ratio | images/min steady | ratio |", "|---|---|---|---|---|"]
    table += [f"| {r['workers']} | {r['images_per_min']:.1f} | {r['ratio']:.2f}x | {r['steady_images_per_min']:.1f} | "
              f"{r['steady_ratio']:.2f}x |" for r in rows]
    text = (f"{len(lines)} prompts x {args.methods} on {args.model} ({args.device}), {args.rounds} rounds, "
            f"worker counts {args.workers} interleaved; ratios against {counts[0]} worker(s), median over rounds\n\n"
            + "\n".join(table))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "batch_scaling.json").write_text(json.dumps({"runs": runs, "rows": rows, "args": vars(args)}, indent=1))
    (out / "batch_scaling.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
