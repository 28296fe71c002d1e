"""Weight-only quantization measured (see sjd_pac_core/bench/quantized.py).

    python benchmarks/quant_bench.py --out runs/quant_bench          # ~100M Llama, fp32 / int8 / 4bit, on the CPU
    python benchmarks/quant_bench.py --tiny --out runs/quant_tiny    # seconds: proves the command runs
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, no install needed

from sjd_pac_core.bench.quantized import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
