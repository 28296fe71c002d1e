"""The last plain-AR run per job, so SJD Stats can report a speedup against it.

A job is (model, prompt, negative prompt, seed, resolution, batch size, CFG, temperature, top-k,
top-p): everything but the method and its knobs. Small and in memory; a ComfyUI restart forgets it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Optional

from .datatypes import SJDStats

MAX_ENTRIES = 64

_lock = threading.Lock()
_ar_runs: "OrderedDict[tuple, SJDStats]" = OrderedDict()


def record(stats: SJDStats) -> None:
    """Remember `stats` if it is a plain AR run."""
    if stats.method != "ar":
        return
    with _lock:
        _ar_runs[stats.baseline_key] = stats
        _ar_runs.move_to_end(stats.baseline_key)
        while len(_ar_runs) > MAX_ENTRIES:
            _ar_runs.popitem(last=False)


def baseline_for(stats: SJDStats) -> Optional[SJDStats]:
    """The last AR run of the same job, or None."""
    with _lock:
        return _ar_runs.get(stats.baseline_key)


def clear() -> None:
    with _lock:
        _ar_runs.clear()
