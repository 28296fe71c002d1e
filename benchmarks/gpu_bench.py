"""One command for the GPU numbers (issue 13, item 8); see sjd_pac_core/bench/hardware.py.

    python benchmarks/gpu_bench.py --device cuda --out runs/gpu_bench     # well over 10 min in full on an H200
    python benchmarks/gpu_bench.py --tiny --device cpu --out runs/tiny    # seconds, any CPU (what CI runs)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, no install needed

from sjd_pac_core.bench.hardware import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
