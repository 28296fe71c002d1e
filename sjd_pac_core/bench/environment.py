"""The machine a benchmark ran on, recorded beside its numbers: device, threads, CPU, load
average, versions, commit, and what a forward pass costs here (the auto window's measurement)."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch

from ..models.image_model import ARImageModel


def loadavg() -> Optional[List[float]]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):  # pragma: no cover - not on every OS
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:  # pragma: no cover
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> Optional[str]:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):  # pragma: no cover
        return None


def _version(package: str) -> Optional[str]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:  # pragma: no cover
        return None


def environment(model: ARImageModel) -> Dict[str, object]:
    device = model.device
    env = {
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "cpu": _cpu_name(),
        "loadavg_start": loadavg(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "python": platform.python_version(),
        "git_commit": _git_commit(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


def cost_curves(model: ARImageModel) -> Dict[str, Dict[int, float]]:
    """Milliseconds per pass of n nodes, as the auto window measured them (eager and compiled),
    if it ran: what a pass costs on this machine."""
    from ..engine.window import measured_cost_curves

    return {("auto_cost_curve_compiled_ms" if compiled else "auto_cost_curve_ms"):
            {n: round(1000 * t, 3) for n, t in zip(curve.sizes, curve.seconds)}
            for compiled, curve in measured_cost_curves(model.token_model).items()}
