"""The shape caches hold at most a number of bytes of tensors: a session of large pass shapes
(each an envelope x envelope mask) no longer keeps hundreds of them alive. Bytes are counted
from the cached tensors' storages, never from the process's RSS."""

from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass

import pytest
import torch

from sjd_pac_core.bounded_cache import MIB, ByteBoundedCache, tensor_bytes
from sjd_pac_core.engine import loop
from sjd_pac_core.sampling import tree


@dataclass(frozen=True)
class Holder:
    data: torch.Tensor
    view: torch.Tensor


def test_tensor_bytes_counts_each_storage_once():
    data = torch.zeros(1000, dtype=torch.float32)
    assert tensor_bytes(Holder(data, data[:10])) == 4000  # a view shares its storage
    assert tensor_bytes((data, {"mask": torch.ones(10, 10, dtype=torch.bool)})) == 4100
    assert tensor_bytes("no tensors") == 0
    # three levels down (a dataclass, a tuple, a list), beside the ints a shape's paths hold
    nested = Holder((1, 2, [torch.ones(5), 3]), ((0, 1), (0, 2)))
    assert tensor_bytes(nested) == 20 and tensor_bytes([[[[torch.ones(5)]]]]) == 0  # four levels: not looked at


def test_least_recently_used_entries_leave_past_the_byte_bound():
    cache = ByteBoundedCache(max_bytes=10_000)
    built = []

    def block(n):
        def build():
            built.append(n)
            return torch.zeros(n, dtype=torch.uint8)
        return build

    for key in "abc":
        cache.get(key, block(3000))
    assert cache.nbytes == 9000 and len(cache) == 3
    cache.get("a", block(3000))  # a hit: "a" is now the most recent, nothing built
    assert built == [3000] * 3
    cache.get("d", block(3000))  # 12,000 bytes: the oldest ("b") leaves
    assert cache.nbytes == 9000 and cache.get("b", block(3000)) is not None and built[-1] == 3000
    assert len(built) == 5  # "b" was built again; "c" left for it
    big = cache.get("huge", block(20_000))  # bigger than the bound: returned, never kept
    assert big.numel() == 20_000 and cache.nbytes <= 10_000 and "huge" not in cache


def test_the_entry_count_is_bounded_too():
    cache = ByteBoundedCache(max_bytes=1 << 30, max_entries=4)
    for i in range(10):
        cache.get(i, lambda: torch.zeros(1))
    assert len(cache) == 4


def test_large_pass_shapes_stay_under_the_bound_and_leave_memory():
    """Twelve padded pass shapes of ~9 MB each (108 MB if all were kept, as the 256-entry cache
    did): the cache holds at most its bound, and an evicted shape's tensors are freed."""
    cache = loop.pass_shape.cache
    cache.clear()
    layout = tree.tree_layout(tree.chain_shape(4))
    device = torch.device("cpu")
    first = loop.pass_shape(layout, 0, 1, 4, 3000, device)
    freed = weakref.ref(first.attend)
    built = tensor_bytes(first)
    del first
    held = []
    for envelope in range(3001, 3012):
        shape = loop.pass_shape(layout, 0, 1, 4, envelope, device)
        built += tensor_bytes(shape)
        del shape
        held.append(cache.nbytes)
    assert built > 100 * MIB  # what the old cache would still hold
    assert max(held) <= cache.max_bytes == 64 * MIB
    assert len(cache) < 12
    gc.collect()
    assert freed() is None  # the first shape's mask is gone, not just uncounted
    again = loop.pass_shape(layout, 0, 1, 4, 3011, device)  # the most recent is still cached
    assert loop.pass_shape(layout, 0, 1, 4, 3011, device) is again
    cache.clear()


def test_tree_shapes_and_layouts_are_weighed_with_their_node_paths():
    """A shape's node paths grow as nodes x depth (a chain of 1024 holds ~4 MB of tuples), so
    the shape and layout caches weigh them too, not only the layout's tensors."""
    shape = tree.chain_shape(1024)
    assert tree.chain_shape(1024) is shape  # cached per length
    assert tree.shape_bytes(shape) > 4 * MIB
    layout = tree.tree_layout(shape)
    assert tree.tree_layout(shape) is layout
    assert tree.layout_bytes(layout) == tensor_bytes(layout) + tree.shape_bytes(shape)
    for cache in (tree.chain_shape.cache, tree.level_tree_shape.cache, tree.tree_layout.cache):
        assert cache.nbytes <= cache.max_bytes <= 64 * MIB


def test_many_long_chains_leave_the_shape_cache():
    """The lengths a run with a long window meets at the image's end, one new shape each."""
    cache = tree.chain_shape.cache
    cache.clear()
    first = tree.chain_shape(1100)
    freed = weakref.ref(first)
    held = []
    for length in range(1000, 1040):
        tree.chain_shape(length)
        held.append(cache.nbytes)
    assert max(held) <= cache.max_bytes == 32 * MIB  # ~170 MB if all were kept
    assert len(cache) < 40
    del first
    gc.collect()
    assert freed() is None
    cache.clear()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_the_bound_is_also_a_share_of_its_memory():
    device = torch.device("cuda")
    total = torch.cuda.get_device_properties(device).total_memory
    cache = ByteBoundedCache(max_bytes=1 << 50, device_fraction=0.01)
    assert cache.limit({device}) == int(0.01 * total)
    assert cache.limit({torch.device("cpu")}) == 1 << 50
