"""How many CPU threads a run should use, chosen from the model's size (one rule for the CLI,
the app, the ComfyUI nodes and generate_image).

A small model's forward pass is a few hundred tiny ops: splitting each over many threads costs
more in synchronisation than it saves, and on a busy or small machine the threads wait for each
other (the demo model ran 5-12x slower at torch's default thread count on a loaded 2-core CPU
than with one thread, same image). Large models need every core. Only CPU runs are changed.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional, Union

import torch

from .config import ConfigError

# Below this many parameters one thread is fastest on every CPU we measured (the demo has 1.7M).
SMALL_MODEL_PARAMETERS = 30_000_000


def count_parameters(model: object) -> int:
    """Parameters of the network behind an ARImageModel, TokenModel or torch module (0 if unknown)."""
    for candidate in (model, getattr(model, "token_model", None)):
        module = candidate if isinstance(candidate, torch.nn.Module) else getattr(candidate, "model", None)
        if isinstance(module, torch.nn.Module):
            return sum(p.numel() for p in module.parameters())
    return 0


def threads_for(model: object, device: Optional[torch.device] = None) -> Optional[int]:
    """The thread count to run `model` with, or None to keep torch's setting.

    One thread for small models on the CPU; None (torch's default) for large ones and for GPUs.
    """
    device = torch.device(device) if device is not None else getattr(model, "device", torch.device("cpu"))
    if device.type != "cpu":
        return None
    parameters = count_parameters(model)
    return 1 if 0 < parameters < SMALL_MODEL_PARAMETERS else None


def check_threads(threads: object) -> Union[None, int, str]:
    """generate_image's `threads`: "auto", None or a whole number >= 1; anything else is one sentence."""
    if threads is None or (isinstance(threads, str) and threads == "auto"):
        return threads
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"threads must be 'auto', None (torch's setting) or a whole number >= 1, got "
                          f"{threads!r}; leave it at 'auto' (one thread for small models on the CPU).")
    return threads


@contextmanager
def torch_threads(count: Optional[int]) -> Iterator[int]:
    """Run the block with `count` torch threads (None: unchanged), then restore the old setting.

    Yields the thread count in effect, for the run's summary line.
    """
    previous = torch.get_num_threads()
    if count is not None and count >= 1 and count != previous:
        torch.set_num_threads(count)
    try:
        yield torch.get_num_threads()
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)
