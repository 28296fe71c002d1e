"""The host sync points of the sampling loop, instrumented.

A pass moves its decisions to the host exactly once (`fetch`); every other value the loop needs
on the host is known there already (sizes, positions, the walk's result). Index lists going the
other way (the accepted path) travel with `to_device`, which never blocks on an accelerator.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

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


def to_device(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """A long tensor of host ints on `device`, copied without waiting for the device's queue."""
    return copy_to_device(torch.tensor(list(values), dtype=torch.long), device)


def copy_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`, copied without waiting for the device's queue."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def synchronize(device: torch.device) -> None:
    """Wait for the device (timing and warm-up only, never on the sampling path)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type != "cpu" and hasattr(torch, "accelerator"):
        torch.accelerator.synchronize()
