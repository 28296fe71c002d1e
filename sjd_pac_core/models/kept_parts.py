"""What of a checkpoint sampling can use, and only that on the device.

Only image codes and forced tokens are ever sampled or fed after the prompt, so:
* the LM head keeps the rows of the sampler's token space (`HeadRows`, `keep_head_rows`);
* the input embedding is split (`EmbeddingRows`, `keep_embedding_rows`): a copy of the token-space
  rows on the model's device embeds every sampled or forced token, and the full table stays in
  CPU memory, in the load dtype, for the prompt (looked up once per run, at prefill);
* parts of a transformers class that image generation never runs (an image-understanding
  encoder, a VQ encoder) are dropped before the move to the device (`drop_modules`), or never
  built, their keys in the file skipped (`unused_key_patterns`).
"""

from __future__ import annotations

import re
from typing import List, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel


class HeadRows(nn.Module):
    """The rows of an LM head that sampling can use (`ids`, in the sampler's order): the other
    rows are dropped before the model moves to its device. Called like the full head, it gives
    full-width logits with the dtype's minimum at every id it does not hold (those are never
    allowed at an image position)."""

    def __init__(self, rows: torch.Tensor, ids: torch.Tensor, vocab: int) -> None:
        super().__init__()
        self.rows = nn.Parameter(rows, requires_grad=False)
        self.register_buffer("ids", ids.long(), persistent=False)
        self.in_features, self.out_features = int(rows.shape[1]), vocab

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        part = F.linear(hidden, self.rows)
        out = part.new_full(part.shape[:-1] + (self.out_features,), torch.finfo(part.dtype).min)
        return out.index_copy_(-1, self.ids.to(out.device), part)


def keep_head_rows(model: PreTrainedModel, ids: torch.Tensor) -> None:
    """Replace the model's LM head by its rows `ids` (none: a head that is never used); a head
    offloaded to disk (meta weights) is left whole. Call it before keep_embedding_rows: a head
    tied to the input embedding then keeps its own copy of the rows it needs."""
    head = model.get_output_embeddings()
    if head.weight.device.type == "meta":
        return
    with torch.no_grad():
        rows = head.weight.index_select(0, ids.to(head.weight.device)).clone()
    model.lm_head = HeadRows(rows, ids, int(head.weight.shape[0]))


class EmbeddingRows(nn.Module):
    """An input embedding split in two. `rows` (a parameter: it moves with the model) are the
    table's rows `ids`, in the sampler's order: `token_rows(sampler ids)` embeds sampled and forced
    tokens on the device. `table` (a buffer that `.to()` leaves in CPU memory) is the whole table:
    called with model vocabulary ids like nn.Embedding, it looks them up on the CPU and moves the
    result to the rows' device. Both are exact copies of the checkpoint's rows."""

    def __init__(self, table: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor) -> None:
        super().__init__()
        self.rows = nn.Parameter(rows, requires_grad=False)
        self.ids = ids.long().cpu()  # model ids of the rows (checked against the sampler's token space)
        self.register_buffer("table", table, persistent=False)
        self.num_embeddings, self.embedding_dim = int(table.shape[0]), int(table.shape[1])

    def _apply(self, fn, recurse=True):
        # .to(device), .cuda(), .half(): everything but the table (it stays where it is).
        table = self._buffers.pop("table")
        try:
            return super()._apply(fn, recurse)
        finally:
            self._buffers["table"] = table

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        found = F.embedding(input_ids.to(self.table.device), self.table)
        return found.to(device=self.rows.device, dtype=self.rows.dtype)

    def token_rows(self, sampler_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(sampler_ids.to(self.rows.device), self.rows)


def keep_embedding_rows(model: PreTrainedModel, ids: torch.Tensor) -> None:
    """Replace the model's input embedding by an EmbeddingRows: its rows `ids` where the weight is
    now, the whole table in CPU memory. A weight offloaded to disk (meta) is left whole."""
    embedding = model.get_input_embeddings()
    weight = embedding.weight
    if weight.device.type == "meta":
        return
    with torch.no_grad():
        rows = weight.index_select(0, ids.to(weight.device))
        table = weight.detach().to("cpu")  # no copy when the model loaded on the CPU
    model.set_input_embeddings(EmbeddingRows(table, ids, rows))


def keep_what_sampling_uses(model: PreTrainedModel, ids: torch.Tensor) -> None:
    """The loader's `prepare` step (after loading, before the move to the device) for a family
    whose sampler token space is `ids` (model vocabulary ids; none where image tokens bypass the
    text vocabulary): the head keeps those rows, the input embedding those rows on the device and
    its table in CPU memory."""
    keep_head_rows(model, ids)
    keep_embedding_rows(model, ids)


def drop_modules(model: nn.Module, names: Sequence[str]) -> None:
    """Delete the submodules at these dotted paths (parts sampling never runs).

    A subclass that never builds them would not read them at all (Lumina-mGPT's does), but
    transformers applies its checkpoint key renames (Emu3's published layout needs them) only to
    its own classes, not to subclasses defined elsewhere: those families drop them after loading."""
    for name in names:
        parent, _, child = name.rpartition(".")
        delattr(model.get_submodule(parent) if parent else model, child)


def unused_key_patterns(names: Sequence[str]) -> List[str]:
    """transformers' _keys_to_ignore_on_load_unexpected for the weights of dropped modules."""
    return [rf"^{re.escape(name)}\." for name in names]
