"""One command for SJD-PAC against plain AR end to end at a 7B model's cost; see sjd_pac_core/bench/e2e.py.

    python benchmarks/gpu_e2e.py --device cuda --out runs/gpu_e2e          # one H100 / H200
    python benchmarks/gpu_e2e.py --tiny --device cpu --out runs/e2e_tiny   # the same code, tiny (CI)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, no install needed

from sjd_pac_core.bench.e2e import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
