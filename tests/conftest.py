"""Shared fixtures. The machine is shared (2 cores): one torch thread per test process keeps
tests from slowing each other down 20x through thread oversubscription."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
SLOW_TEST_TIMEOUT_S = 900  # a test marked slow (a few long runs in subprocesses, a browser) may take this long


def pytest_collection_modifyitems(items):
    """The suite's per-test limit (pyproject.toml's timeout) is too short for a test marked slow:
    it gets SLOW_TEST_TIMEOUT_S unless it sets its own."""
    for item in items:
        if item.get_closest_marker("slow") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLOW_TEST_TIMEOUT_S))


@pytest.fixture(scope="session")
def demo_model():
    """The bundled demo model, loaded once per test session through the public loader."""
    import sjd_pac_core as sp

    return sp.load_model("demo", device="cpu")


@pytest.fixture(scope="session")
def smoke_demo_folder(tmp_path_factory) -> Path:
    """A demo-format checkpoint from a few steps of the real training script (its CI smoke run)."""
    out = tmp_path_factory.mktemp("demo_smoke")
    subprocess.run(
        [sys.executable, "-m", "sjd_pac_core.demo.tools.train", "--smoke", "--out", str(out), "--no-progress"],
        check=True, cwd=REPO, capture_output=True,
    )
    return out


@pytest.fixture(scope="module")
def tiny_lumina_sizes():
    """Lumina-mGPT's sizes are a constant of the family (512/768/1024 px), as Lumina-mGPT 2.0's are
    (the areas of 768 and 512 px); the tiny test checkpoints run at the sizes of 96 and 64 px
    instead, without users ever seeing such sizes."""
    from sjd_pac_core.models import lumina_mgpt, lumina_mgpt2

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lumina_mgpt, "LUMINA_SIZES", (96, 64))
        mp.setattr(lumina_mgpt2, "TARGETS", (96, 64))
        yield


@pytest.fixture(scope="module")
def tiny_joint():
    """The exactness tests' tiny Llama and its exact conditionals (exactness_tools.tiny_joint), built
    once per test file."""
    import exactness_tools

    return exactness_tools.tiny_joint()


@pytest.fixture
def no_weights(monkeypatch):
    """Fail the test if any family starts reading model weights (the LLM's or the Chameleon VQGAN's):
    a refusal must come first."""
    from sjd_pac_core.models import emu3, janus, lumina_mgpt

    def forbidden(*args, **kwargs):
        raise AssertionError("weights were loaded before the input was checked")

    for module in (lumina_mgpt, emu3, janus):
        monkeypatch.setattr(module, "load_pretrained", forbidden)
    monkeypatch.setattr(lumina_mgpt, "load_chameleon_vqgan", forbidden)


@pytest.fixture
def full_folder(tmp_path, monkeypatch):
    """A folder whose file system has no space left: a tiny tmpfs filled up (as root, where mount
    works), else writes into it fail with ENOSPC from os.write (the one call write_atomic writes with)."""
    import errno

    folder = tmp_path / "full"
    folder.mkdir()
    mounted = hasattr(os, "geteuid") and os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(folder)], capture_output=True).returncode == 0
    if mounted:
        try:
            with open(folder / "filler", "wb", buffering=0) as filler:
                try:
                    while True:
                        filler.write(b"\0" * 4096)
                except OSError:
                    pass
            yield folder
        finally:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)
        return
    real_write = os.write

    def write(fd, data):
        if os.path.realpath(f"/proc/self/fd/{fd}").startswith(str(folder.resolve()) + os.sep):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    yield folder
