"""Forward-pass timing that is true on accelerators without adding a host sync.

On CUDA the forward is bracketed by events and read after the pass's one sync (the events have
completed by then); on the CPU the forward is synchronous and the wall clock is exact.
"""

from __future__ import annotations

import contextlib
import time

import torch

STAGE_PREFIX = "sjd_pac."  # the names of a pass's stages in a torch.profiler trace
_NO_STAGE = contextlib.nullcontext()


def stage(name: str):
    """A named range (sjd_pac.<name>) in a torch.profiler trace while a profiler runs, so a
    trace says where a pass's time goes (bench/stage_profile.py); otherwise nothing, at the cost
    of one check."""
    if torch.autograd._profiler_enabled():
        return torch.profiler.record_function(STAGE_PREFIX + name)
    return _NO_STAGE


class ForwardTimer:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._start = self._end = None
        self._seconds = 0.0

    def start(self) -> None:
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._seconds = -time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            self._end.record()
        else:
            self._seconds += time.perf_counter()

    def seconds(self) -> float:
        """The forward's duration; on CUDA call it only after the pass's sync."""
        if self.cuda:
            return self._start.elapsed_time(self._end) / 1000.0
        return self._seconds
