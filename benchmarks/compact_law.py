"""The drafting counts with the neighbour law's rows cut to the size a 7B family gets (a counting benchmark).

    python benchmarks/compact_law.py --kept 64 --prompt-set sjd_pac_core/demo/tools/quality_prompts.txt \
        --seeds 0 1 --budgets 128 256 --rules gumbel rejection

The demo model's 567 tokens fit the neighbour law's dense tables; the 7B families' image codes
(8,194 to 32,772 tokens) do not, and their law keeps each row's `LAW_MAX_KEPT` largest sums
(`engine/neighbour_laws.py`, `TopRows`; `models/memory.py`, `law_row_entries`). This runs
`python -m sjd_pac_core.bench.drafting` with every other argument as given, but with the demo's
law in compact rows of `--kept` sums, so the cut's cost can be counted on the model we have.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sjd_pac_core.models import memory  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=False)
    parser.add_argument("--kept", type=int, default=memory.LAW_MAX_KEPT,
                        help="sums a row keeps (default: what the 7B families get)")
    args, rest = parser.parse_known_args()
    if args.kept < 1:
        parser.error("--kept must be at least 1")
    memory.LAW_DENSE_MAX_BYTES = 0  # no vocabulary gets dense rows
    memory.LAW_MAX_KEPT = memory.LAW_MIN_KEPT = args.kept
    memory.LAW_COMPACT_MAX_BYTES = 2**62
    print(f"neighbour law: compact rows of {args.kept} sums")
    sys.argv = ["sjd_pac_core.bench.drafting"] + rest
    runpy.run_module("sjd_pac_core.bench.drafting", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
