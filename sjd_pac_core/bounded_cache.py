"""ByteBoundedCache: built-once objects kept up to a number of bytes, the least recently used out.

The sampler builds a few objects per pass shape (a tree shape, its layout, a pass's padded masks)
and reuses them for the rest of the run and later runs. A large shape takes megabytes (the
attention mask of a pass is nodes x nodes, a shape's node paths grow with nodes x depth) and a
run near the image's end meets a new shape every pass, so a count of entries alone let a session
hold hundreds of megabytes after its runs were over: these caches weigh what they hold (the
bytes of its tensors by default) and drop the least recently used entries past their bound.
Shared by the sampling loop (engine/) and the tree shapes and layouts (sampling/).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections import OrderedDict
from typing import Any, Callable, Dict, Hashable, Iterator, Optional, TypeVar

import torch

V = TypeVar("V")

MIB = 1 << 20


# Values that hold no tensor: skipped without a call each (a shape's node paths are thousands of ints).
_LEAVES = (int, float, complex, str, bytes, type(None), torch.device, torch.dtype)


def _tensors(value: Any, depth: int = 3) -> Iterator[torch.Tensor]:
    """The tensors a value holds: itself, its dataclass fields, tuple/list/dict items (a few levels)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif depth <= 0 or isinstance(value, _LEAVES):
        return
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from _tensors(getattr(value, field.name), depth - 1)
    elif isinstance(value, (tuple, list, dict)):
        for item in (value.values() if isinstance(value, dict) else value):
            if depth > 1 and not isinstance(item, _LEAVES):  # at depth 1 only a tensor item counts
                yield from _tensors(item, depth - 1)
            elif isinstance(item, torch.Tensor):
                yield item


def tensor_bytes(value: Any) -> int:
    """Bytes of the tensor storages `value` holds, each storage counted once."""
    storages: Dict[tuple, int] = {}
    for t in _tensors(value):
        storage = t.untyped_storage()
        storages[(t.device, storage.data_ptr())] = storage.nbytes()
    return sum(storages.values())


def field_tensor_bytes(value: Any) -> int:
    """Bytes of the tensors held directly in a dataclass's fields, each storage once: no walk
    through its containers (a tree layout's host tuples are thousands of ints)."""
    return tensor_bytes(tuple(v for v in (getattr(value, f.name) for f in dataclasses.fields(value))
                              if isinstance(v, torch.Tensor)))


def _devices(value: Any) -> set:
    return {t.device for t in _tensors(value)}


class ByteBoundedCache:
    """A least-recently-used cache bounded by the bytes of the tensors its values hold.

    max_bytes: the bound; device_fraction: on a CUDA device, the bound is also at most this
    fraction of the device's memory (a small GPU keeps less). An entry bigger than the bound is
    built and returned but not kept. max_entries bounds the count too (small entries have
    Python overhead the byte count does not see). weigh: a value's bytes (default: its tensors').
    Thread-safe; `build` runs outside the lock.
    """

    def __init__(self, max_bytes: int, max_entries: int = 256, device_fraction: Optional[float] = None,
                 weigh: Callable[[Any], int] = tensor_bytes) -> None:
        self.max_bytes = int(max_bytes)
        self.max_entries = int(max_entries)
        self.device_fraction = device_fraction
        self.weigh = weigh
        self._entries: "OrderedDict[Hashable, tuple]" = OrderedDict()  # key -> (value, bytes)
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes of tensors held now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def limit(self, devices: set) -> int:
        """The byte bound for values on `devices` (this cache's, lowered on a CUDA device)."""
        bound = self.max_bytes
        if self.device_fraction is not None:
            for device in devices:
                if device.type == "cuda":
                    total = torch.cuda.get_device_properties(device).total_memory
                    bound = min(bound, int(self.device_fraction * total))
        return bound

    def get(self, key: Hashable, build: Callable[[], V]) -> V:
        """The value for `key`, built by `build()` on a miss."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                return entry[0]
        value = build()
        size = self.weigh(value)
        bound = self.max_bytes if self.device_fraction is None else self.limit(_devices(value))  # one walk less
        if size > bound:
            return value  # too big to keep: built again next time
        with self._lock:
            if key in self._entries:  # another thread built it meanwhile: keep one
                self._entries.move_to_end(key)
                return self._entries[key][0]
            self._entries[key] = (value, size)
            self._bytes += size
            while self._entries and (self._bytes > bound or len(self._entries) > self.max_entries):
                _, (_, dropped) = self._entries.popitem(last=False)  # the least recently used
                self._bytes -= dropped
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


def bounded_by_bytes(max_bytes: int, max_entries: int = 256, device_fraction: Optional[float] = None,
                     weigh: Callable[[Any], int] = tensor_bytes) -> Callable[[Callable[..., V]], Callable[..., V]]:
    """Like functools.lru_cache, bounded by bytes: a ByteBoundedCache keyed by the call's
    (hashable) arguments, reachable as the function's `cache` attribute."""
    def decorate(function: Callable[..., V]) -> Callable[..., V]:
        cache = ByteBoundedCache(max_bytes, max_entries, device_fraction, weigh)

        @functools.wraps(function)
        def cached(*args: Any, **kwargs: Any) -> V:
            key = (args, tuple(sorted(kwargs.items()))) if kwargs else args
            return cache.get(key, lambda: function(*args, **kwargs))

        cached.cache = cache  # type: ignore[attr-defined]
        return cached
    return decorate
