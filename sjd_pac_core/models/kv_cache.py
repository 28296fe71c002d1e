"""A preallocated KV cache for tree passes, behind transformers' Cache API.

Every layer holds keys and values of shape [B, H, capacity, head_dim], allocated at the first
write and never reallocated while it fits. The session decides where a pass's entries go (its
`slots`, the write pointer onwards) and how many entries attention sees (`visible`: the
committed prefix plus the pass in eager mode, the whole buffer in a compiled fixed-shape pass,
where the attention mask hides everything that is not valid). So:

* rollback (drop a pass's unaccepted nodes) is moving the session's write pointer: no copy;
* compaction after a tree pass moves only the accepted path's entries into place: one indexed
  gather and copy of (accepted tokens x B x H x head_dim) per keys and values and layer, made
  as one gather and one copy for all layers when their buffers are views of one storage
  [layers, 2, B, H, capacity, head_dim] (every layer on one device, with one shape and dtype);
* no attribute of transformers' own cache classes is touched: these layers are ours.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


@dataclass
class CacheCursor:
    """Where the current pass writes and how much of the buffer attention reads (session-owned)."""

    capacity: int
    slots: Optional[torch.Tensor] = None  # long [S]: buffer index of each new entry
    visible: Optional[int] = None  # entries attention sees; None = the whole buffer
    length: int = 0  # valid entries before the pass (what get_seq_length reports)
    moved_bytes: int = 0  # bytes copied by compaction so far (the counting test reads it)


class TreeKVLayer(CacheLayerMixin):
    """One layer's preallocated keys and values (views of the cache's shared storage, or its own)."""

    is_compileable = True
    is_sliding = False

    def __init__(self, cursor: CacheCursor, owner: Optional["TreeKVCache"] = None, index: int = 0) -> None:
        super().__init__()
        self.cursor = cursor
        self.owner, self.index = owner, index
        self.shared = False  # keys and values are views of owner.storage[index]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        views = self.owner.shared_views(self.index, key_states, value_states) if self.owner is not None else None
        if views is not None:
            self.keys, self.values = views
            self.shared = True
            _mark_static(self.keys, self.values)  # the views a compiled pass reads and writes
        else:
            b, h, _, dk = key_states.shape
            # Ordinary tensors even under inference mode: they are updated in place by compiled
            # passes and by compaction, which inference tensors do not allow outside that mode.
            with torch.inference_mode(False):
                self.keys = key_states.new_zeros((b, h, self.cursor.capacity, dk))
                self.values = value_states.new_zeros((b, h, self.cursor.capacity, value_states.shape[-1]))
            _mark_static(self.keys, self.values)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> Tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        slots = self.cursor.slots.to(self.keys.device)  # a no-op unless layers sit on several GPUs
        self.keys.index_copy_(2, slots, key_states.to(self.keys.dtype))
        self.values.index_copy_(2, slots, value_states.to(self.values.dtype))
        visible = self.cursor.visible
        if visible is None:
            return self.keys, self.values
        return self.keys[:, :, :visible], self.values[:, :, :visible]

    def move(self, source: torch.Tensor, target: torch.Tensor) -> int:
        """Copy entries `source` to `target` (long [A] each); returns the bytes moved."""
        if not self.is_initialized:
            return 0
        source, target = source.to(self.keys.device), target.to(self.keys.device)
        keys = self.keys.index_select(2, source)
        values = self.values.index_select(2, source)
        self.keys.index_copy_(2, target, keys)
        self.values.index_copy_(2, target, values)
        return keys.numel() * keys.element_size() + values.numel() * values.element_size()

    def grow(self, capacity: int) -> None:
        """A bigger buffer (only when a caller outgrows what it reserved)."""
        if self.is_initialized and self.shared:  # the storage grew: take the new views
            self.keys, self.values = self.owner.storage[self.index, 0], self.owner.storage[self.index, 1]
        elif self.is_initialized:
            pad = capacity - self.keys.shape[2]
            with torch.inference_mode(False):
                self.keys = torch.nn.functional.pad(self.keys, (0, 0, 0, pad))
                self.values = torch.nn.functional.pad(self.values, (0, 0, 0, pad))

    def get_mask_sizes(self, query_length: int) -> Tuple[int, int]:
        visible = self.cursor.visible
        return (self.cursor.capacity if visible is None else visible), 0

    def get_seq_length(self) -> int:
        return self.cursor.length

    def get_max_length(self) -> int:
        return self.cursor.capacity


class TreeKVCache(Cache):
    """The layers of TreeKVLayer a session writes into; created lazily, one per model layer.

    num_layers: the model's decoder layers, when they all sit on one device; their keys and
    values are then views of one storage, so compaction is one gather and one copy in all.
    """

    def __init__(self, cursor: CacheCursor, num_layers: Optional[int] = None) -> None:
        self.cursor = cursor
        self.num_layers = num_layers
        self.storage: Optional[torch.Tensor] = None  # [layers, 2, B, H, capacity, head_dim]
        super().__init__(layer_class_to_replicate=lambda: TreeKVLayer(cursor, self, len(self.layers)))

    def shared_views(self, index: int, keys: torch.Tensor, values: torch.Tensor) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """Layer `index`'s keys and values as views of the storage, or None where this layer
        cannot share it (another device, shape or dtype than layer 0's; no layer count)."""
        if self.num_layers is None or keys.shape != values.shape or index >= self.num_layers:
            return None
        if self.storage is None:
            if index != 0:
                return None
            b, h, _, d = keys.shape
            with torch.inference_mode(False):  # updated in place, in and out of inference mode
                self.storage = keys.new_zeros((self.num_layers, 2, b, h, self.cursor.capacity, d))
            _mark_static(self.storage)
        storage = self.storage
        if (storage.device, storage.dtype) != (keys.device, keys.dtype) or storage.shape[2:4] != keys.shape[:2] \
                or storage.shape[-1] != keys.shape[-1]:
            return None
        return storage[index, 0], storage[index, 1]

    @property
    def tree_layers(self) -> List[TreeKVLayer]:
        return [layer for layer in self.layers if isinstance(layer, TreeKVLayer)]

    def move(self, source: torch.Tensor, target: torch.Tensor) -> None:
        """Compaction: entries `source` to `target` in every layer: one gather and one copy of
        the shared storage, else one per layer."""
        layers = self.tree_layers
        if self.storage is not None and layers and all(layer.shared for layer in layers) \
                and len(layers) == self.num_layers:
            source, target = source.to(self.storage.device), target.to(self.storage.device)
            moved = self.storage.index_select(4, source)
            self.storage.index_copy_(4, target, moved)
            self.cursor.moved_bytes += moved.numel() * moved.element_size()
            return
        for layer in layers:  # one per model layer
            self.cursor.moved_bytes += layer.move(source, target)

    def grow(self, capacity: int) -> None:
        if self.storage is not None:
            pad = capacity - self.storage.shape[4]
            with torch.inference_mode(False):
                self.storage = torch.nn.functional.pad(self.storage, (0, 0, 0, pad))
        for layer in self.tree_layers:
            layer.grow(capacity)
        self.cursor.capacity = capacity


def _mark_static(*tensors: torch.Tensor) -> None:
    """CUDA graphs may then update these buffers in place instead of skipping the graph."""
    for tensor in tensors:
        if tensor.is_cuda:
            torch._dynamo.mark_static_address(tensor)
