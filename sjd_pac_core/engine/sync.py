"""The host sync points of the sampling loop, instrumented.

A pass moves its decisions to the host exactly once (`fetch`); every other value the loop needs
on the host is known there already (sizes, positions, the walk's result). Index lists going the
other way (the accepted path) travel with `transfer.to_device`, which never blocks on an accelerator.
"""

from __future__ import annotations

from typing import Dict, List

import torch


class SyncCounter:
    """Counts device-to-host reads made through `fetch` (the test of one sync per pass reads it)."""

    count = 0


def fetch(tensors: Dict[str, torch.Tensor]) -> Dict[str, List[int]]:
    """Every tensor's values as Python ints, in one device-to-host copy (the pass's one sync)."""
    names = list(tensors)
    flat = torch.cat([tensors[n].reshape(-1).long() for n in names]) if names else None
    values = flat.tolist() if flat is not None else []
    SyncCounter.count += 1
    out: Dict[str, List[int]] = {}
    start = 0
    for name in names:  # unpack by each field's own size
        size = tensors[name].numel()
        out[name] = values[start : start + size]
        start += size
    return out


def synchronize(device: torch.device) -> None:
    """Wait for the device (timing and warm-up only, never on the sampling path)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type != "cpu" and hasattr(torch, "accelerator"):
        torch.accelerator.synchronize()
