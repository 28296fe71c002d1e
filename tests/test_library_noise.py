"""A quiet start with the [quant] extra installed: the quantization libraries' known start-up noise
is dropped (library_noise.py) wherever they are imported (transformers imports torchao on every
model load), and every other message of theirs still shows."""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sjd_pac_core  # noqa: F401  (installs the filters, as every entry point does)
from sjd_pac_core.library_noise import KNOWN_NOISE, silence_known_noise

REPO = Path(__file__).resolve().parent.parent

# The messages as the libraries log them (format string, arguments).
REAL_NOISE = {
    "torchao": ("Failed to load /site-packages/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so: Could not load "
                "this library", ()),
    "torch.utils._pytree": ("%s is an Enum subclass and is now natively supported by torch.compile as an opaque "
                            "value type. Calling register_constant() on Enum subclasses is deprecated and will be "
                            "an error in a future release.", ("<enum 'KernelPreference'>",)),
    "torchao.kernel.intmm": ("Warning: Detected no triton, on systems without Triton certain kernels will not work",
                             ()),
    "bitsandbytes.backends.cpu.ops": ("Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make "
                                      "sure you already `pip install kernels`", ("no trust",)),
}


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("name", [name for name, _ in KNOWN_NOISE])
def test_known_noise_is_dropped_and_every_other_message_kept(name):
    logger = logging.getLogger(name)
    kept = Kept()
    logger.addHandler(kept)
    try:
        silence_known_noise()  # a second call adds nothing
        assert sum(type(f).__name__ == "KnownNoise" for f in logger.filters) == 1
        message, args = REAL_NOISE[name]
        logger.warning(message, *args)
        logger.warning("Failed to load the checkpoint: disk error")  # not the known noise: shown
        logger.error("something else went wrong")
    finally:
        logger.removeHandler(kept)
    assert kept.messages == ["Failed to load the checkpoint: disk error", "something else went wrong"]


def test_every_known_noise_has_its_real_message():
    assert {name for name, _ in KNOWN_NOISE} == set(REAL_NOISE)


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="needs the [quant] extra (torchao)")
def test_a_demo_generation_with_the_quant_extra_prints_nothing_but_its_result(tmp_path):
    """transformers imports torchao on every model load when it is installed: nothing of it shows."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "sjd_pac_core.cli", "generate",
                           "a large orange circle top right on a blue background", "-o", str(tmp_path / "out.png"),
                           "--quiet"], capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr == "" and "tokens per forward pass" in proc.stdout
    loaded = subprocess.run([sys.executable, "-c", "import sys, sjd_pac_core as sp; sp.load_model('demo'); "
                             "print('torchao' in sys.modules)"], capture_output=True, text=True, cwd=REPO, env=env,
                            timeout=300)
    assert loaded.stdout.strip() == "True"  # the control: torchao was imported, and said nothing
