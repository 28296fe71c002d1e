"""Host -> device copies of small index tensors that never wait for the device's queue.

Shared by the sampling loop (engine/) and the model adapters (models/), which must not import
each other.
"""

from __future__ import annotations

from typing import Sequence

import torch


def to_device(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """A long tensor of host ints on `device`, copied without waiting for the device's queue."""
    return copy_to_device(torch.tensor(list(values), dtype=torch.long), device)


def copy_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`, copied without waiting for the device's queue."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
