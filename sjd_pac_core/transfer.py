"""Host -> device copies of small index tensors that never wait for the device's queue.

Shared by the sampling loop (engine/) and the model adapters (models/), which must not import
each other.
"""

from __future__ import annotations

from typing import List, Sequence

import numpy as np
import torch


def to_device(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """A long tensor of host ints on `device`, copied without waiting for the device's queue."""
    return copy_to_device(torch.tensor(list(values), dtype=torch.long), device)


def copy_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`, copied without waiting for the device's queue."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def arrays_to_device(arrays: Sequence[np.ndarray], device: torch.device) -> List[torch.Tensor]:
    """Integer host arrays as long tensors on `device` in one copy (views of one buffer): on a
    GPU every copy is a transfer of its own, and a pass's index tensors are many and small. On
    the CPU they are the arrays' own memory: nothing to copy."""
    if device.type == "cpu":
        return [torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)) for a in arrays]
    flat = np.concatenate([np.asarray(a, dtype=np.int64).ravel() for a in arrays])
    buffer = copy_to_device(torch.from_numpy(flat), device)
    ends = np.cumsum([0] + [int(np.size(a)) for a in arrays]).tolist()
    return [buffer[a:b].view(np.shape(array)) for a, b, array in zip(ends, ends[1:], arrays)]
