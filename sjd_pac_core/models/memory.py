"""The memory plan: what a checkpoint needs on a device at each precision, before any weight is read.

Everything comes from config.json: the family builds its transformers model on the meta device
(no memory, no weights) and the plan counts its parameters by what the loader does with them
(models/kept_parts.py) - the decoder layers' linear weights are quantized, the LM head and the
input embedding keep on the device only the rows sampling can use (the embedding's full table
stays in CPU memory), parts generation never runs are not loaded, the rest stays in the load
dtype. To that it adds the KV cache the sampler preallocates (models/kv_cache.py) and the
activation peak of the largest pass, and compares the sum with the free memory of the device.

    weights     quantized linears (data + scales) + the rest in the load dtype (+ fp32 VQGAN);
                on the CPU device also the input embedding's table (it is the same memory)
    loading     what passes through the device while loading and is cut or moved right after
                (the head rows never used, the embedding table): only where the weights load
                onto the device (quantized on a GPU, or the CPU); an unquantized GPU load is
                prepared in CPU memory and moved
    KV cache    layers x 2 x rows x kv_heads x capacity x head_dim x bytes,
                capacity = prompt + image tokens + the largest pass or probe + 1 (engine/loop.py)
    activations the largest pass's logits over the restricted head (fp32, three copies), its
                attention scores and masks over the whole cache, and its MLP activations, and
                the sampler's neighbour-law tables (`law_table_bytes`)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Optional, Sequence, Tuple

import torch
from torch import nn

from ..config import PROBE_SIZES
from .quantize import PRECISIONS, SCHEMES, Scheme, group_size_for, holds_widths

GB = 1e9
PROMPT_TOKENS = 160  # a long prompt after the family's template (most are 30-80 tokens)
CFG_ROWS = 2  # conditional and unconditional rows (guidance on, the families' defaults)


@dataclass(frozen=True)
class WeightCensus:
    """A model's parameters, counted on the meta device by what the loader does with them."""

    quantizable: Tuple[Tuple[int, int], ...]  # (out, in) of each linear weight the schemes quantize
    full: int  # parameters kept in the load dtype (norms, VQ, aligners, head and embedding rows used)
    fp32: int = 0  # parameters held in fp32 whatever the load dtype (Lumina-mGPT's VQGAN decoder)
    dropped: int = 0  # parameters read while loading, then dropped (LM head rows sampling never uses)
    buffer_bytes: int = 0  # buffers (rotary tables, token maps) in their own dtypes
    host: int = 0  # parameters kept in CPU memory in the load dtype (the input embedding's table)

    @property
    def quantizable_params(self) -> int:
        return sum(o * i for o, i in self.quantizable)

    def weight_bytes(self, dtype: torch.dtype, scheme: Optional[Scheme]) -> int:
        size = _bytes(dtype)
        if scheme is None:
            linears = self.quantizable_params * size
        else:
            group = group_size_for(scheme, [i for _, i in self.quantizable])
            linears = sum(scheme.quantized_bytes(o, i, dtype, group) for o, i in self.quantizable)
        return linears + self.full * size + self.fp32 * 4 + self.buffer_bytes


def census(model: nn.Module, quantized_prefix: str, head: Optional[Tuple[str, int]] = None,
           embedding: Optional[Tuple[str, int]] = None, unused: Sequence[str] = (),
           extra_fp32: int = 0) -> WeightCensus:
    """Count a (meta) model's parameters, each once (a head tied to the embedding is one table):
    linear weights under quantized_prefix are quantizable; head = (module name, rows kept) counts
    that module by its kept rows (the rest dropped); embedding = (module name, rows kept) counts
    its kept rows on the device and its whole table in CPU memory; the unused modules (and their
    buffers) are loaded, then dropped."""
    pattern = re.compile(rf"{quantized_prefix}\.")
    quantizable, full, dropped, host = [], 0, 0, 0
    seen = set()
    is_unused = lambda name: any(name == u or name.startswith(u + ".") for u in unused)  # noqa: E731
    for name, module in model.named_modules():
        own = [(n, p) for n, p in module.named_parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for _, p in own)
        if is_unused(name):
            dropped += sum(p.numel() for _, p in own)
            continue
        if embedding is not None and name == embedding[0]:
            host += sum(p.numel() for _, p in own)
            full += embedding[1] * module.weight.shape[1]
            continue
        if head is not None and name == head[0]:  # its rows are copied even when it is tied
            total = sum(p.numel() for _, p in own)  # 0 when tied to the embedding (counted there)
            kept = head[1] * module.weight.shape[1]
            full, dropped = full + kept, dropped + max(total - kept, 0)
            continue
        for pname, param in own:
            if pname == "weight" and isinstance(module, nn.Linear) and pattern.match(name):
                quantizable.append((int(param.shape[0]), int(param.shape[1])))
            else:
                full += param.numel()
    buffers = sum(b.numel() * b.element_size() for name, b in model.named_buffers()
                  if not is_unused(name.rpartition(".")[0]))
    buffers += 8 * head[1] if head is not None else 0  # the kept head rows' ids (long)
    return WeightCensus(tuple(quantizable), full, extra_fp32, dropped, buffers, host)


@dataclass(frozen=True)
class FamilyShape:
    """What the plan needs to know about one checkpoint, read from its config.json."""

    family: str
    weights: WeightCensus
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    sampler_vocab: int  # logits per position after the head restriction
    image_tokens: Dict[str, int]  # resolution -> tokens per image (forced ones included)

    @property
    def default_resolution(self) -> str:
        return next(iter(self.image_tokens))


@dataclass(frozen=True)
class PrecisionCost:
    """Bytes one precision needs; `scheme` says which library does it on the device."""

    precision: str  # "none" (the load dtype), "int8" or "4bit"
    scheme: str  # e.g. "bf16", "torchao int8 weight-only", "bitsandbytes NF4"
    weights: int
    kv_cache: int
    activations: int
    loading_extra: int  # held on the device only while loading (head rows, the embedding table)
    host: int = 0  # CPU memory beside the device (the input embedding's table); 0 on the CPU device

    @property
    def total(self) -> int:
        """Bytes on the device: the weights, then the larger of sampling's and loading's extras."""
        return self.weights + max(self.kv_cache + self.activations, self.loading_extra)

    @property
    def name(self) -> str:
        return self.scheme if self.precision == "none" else f"quantize='{self.precision}'"


@dataclass(frozen=True)
class MemoryPlan:
    """The needs of every precision on one device, and that device's free memory."""

    family: str
    device: str
    dtype: str
    resolution: str
    rows: int  # 2 with guidance (CFG), else 1
    cache_entries: int
    costs: Tuple[PrecisionCost, ...]  # most precise first
    free: Optional[int]  # bytes free on the device; None when unknown

    def cost(self, precision: str) -> PrecisionCost:
        for cost in self.costs:
            if cost.precision == precision:
                return cost
        raise KeyError(precision)

    def fits(self, precision: str) -> bool:
        return self.free is None or self.cost(precision).total <= self.free

    def most_precise_fitting(self, offered: Iterable[str]) -> Optional[str]:
        offered = set(offered)
        return next((c.precision for c in self.costs if c.precision in offered and self.fits(c.precision)), None)

    def one_line(self, precision: str) -> str:
        cost = self.cost(precision)
        where = f"{self.free / GB:.1f} GB free on {self.device}" if self.free is not None else f"free memory on {self.device} unknown"
        host = f", and {cost.host / GB:.1f} GB of CPU memory" if cost.host else ""
        return (f"{self.family} {self.resolution}: needs {cost.total / GB:.1f} GB in {cost.name} (weights "
                f"{cost.weights / GB:.1f}, KV cache {cost.kv_cache / GB:.1f}, activations {cost.activations / GB:.1f})"
                f"{host}; {where}")

    def not_enough(self, precision: str, offered: Iterable[str]) -> str:
        """One sentence: what `precision` needs, what is free, and what fits instead."""
        cost = self.cost(precision)
        head = f"The model needs {cost.total / GB:.1f} GB in {cost.name}, {self.free / GB:.1f} GB free on {self.device}"
        fitting = [c for c in self.costs if c.precision in set(offered) and self.fits(c.precision) and c is not cost]
        if fitting:
            return head + "; " + ", ".join(f"{c.name} needs {c.total / GB:.1f} GB" for c in fitting) + "."
        smallest = min(self.costs, key=lambda c: c.total)
        return (head + f"; even {smallest.name} needs {smallest.total / GB:.1f} GB: free memory, use offload "
                "(device_map='auto', needs accelerate) or another device.")

    def table(self) -> str:
        """A small markdown table of every precision's needs."""
        free = "" if self.free is None else f", {self.free / GB:.1f} GB free"
        lines = [f"{self.family} at {self.resolution} on {self.device} ({self.rows} rows, cache of "
                 f"{self.cache_entries} entries{free})", "",
                 "| precision | weights GB | KV cache GB | activations GB | total GB | fits | CPU memory GB |",
                 "|---|---|---|---|---|---|---|"]
        for c in self.costs:
            fits = "?" if self.free is None else ("yes" if self.fits(c.precision) else "no")
            lines.append(f"| {c.name} | {c.weights / GB:.2f} | {c.kv_cache / GB:.2f} | {c.activations / GB:.2f} | "
                         f"{c.total / GB:.2f} | {fits} | {c.host / GB:.2f} |")
        return "\n".join(lines)


# The run's neighbour laws (engine/neighbour_laws.py): a block of V + 1 rows per table (expert) in
# one table, dense [V + 1, V] floats a block where all fit LAW_DENSE_MAX_BYTES, else each row's largest
# sums (an id and a sum, 12 bytes each) within LAW_COMPACT_MAX_BYTES, at most LAW_MAX_KEPT a row; no
# law below LAW_MIN_KEPT.
LAW_DENSE_MAX_BYTES = 256 * 2**20
LAW_COMPACT_MAX_BYTES = 64 * 2**20
LAW_MAX_KEPT = 64
LAW_MIN_KEPT = 8  # fewer would not fill a tree's first level


def law_row_entries(vocab: int, tables: int = 2) -> Optional[int]:
    """Sums a row of the neighbour-law tables keeps for `vocab` tokens: vocab (dense), fewer
    (compact), or None (no law)."""
    if tables * (vocab + 1) * vocab * 4 <= LAW_DENSE_MAX_BYTES:
        return vocab
    kept = min(LAW_MAX_KEPT, LAW_COMPACT_MAX_BYTES // (tables * (vocab + 1) * 12))
    return kept if kept >= LAW_MIN_KEPT else None


def law_table_bytes(vocab: int, tables: int = 2) -> int:
    """Device bytes of the neighbour-law tables for `vocab` tokens (`law_row_entries`)."""
    kept = law_row_entries(vocab, tables)
    if kept is None:
        return 0
    return tables * (vocab + 1) * vocab * 4 if kept >= vocab else tables * (vocab + 1) * kept * 12


def _bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def largest_pass(window: int = 64, side_nodes: int = 0) -> int:
    """Nodes in the largest pass: the root, the window, the tree's side nodes (engine/loop.py)."""
    return 1 + window + side_nodes


def cache_entries(prompt_tokens: int, image_tokens: int, pass_nodes: int) -> int:
    """Entries the session preallocates: what engine/loop.py asks for (the image, the largest pass
    or the auto window's probe, one more) on top of the prompt."""
    return prompt_tokens + image_tokens + max(pass_nodes, max(PROBE_SIZES)) + 1


def kv_cache_bytes(shape: FamilyShape, rows: int, entries: int, dtype: torch.dtype) -> int:
    return shape.layers * 2 * rows * shape.kv_heads * entries * shape.head_dim * _bytes(dtype)


def activation_bytes(shape: FamilyShape, rows: int, entries: int, nodes: int, dtype: torch.dtype) -> int:
    """The largest pass's peak: logits over the restricted head in fp32 (logits, probabilities and
    a working copy), attention scores and their softmax over the whole cache, the pass's additive
    mask (one is kept per pass size: two counted), and the MLP's activations."""
    size = _bytes(dtype)
    logits = rows * nodes * shape.sampler_vocab * 4 * 3
    attention = rows * shape.heads * nodes * entries * size * 2
    masks = rows * nodes * entries * size * 2
    mlp = rows * nodes * (shape.intermediate * 3 + shape.hidden * 4) * size
    return logits + attention + masks + mlp + law_table_bytes(shape.sampler_vocab)


def plan_memory(
    shape: FamilyShape,
    device: torch.device,
    dtype: torch.dtype,
    resolution: Optional[str] = None,
    rows: int = CFG_ROWS,
    window: int = 64,
    prompt_tokens: int = PROMPT_TOKENS,
    free: Optional[int] = -1,
    precisions: Sequence[str] = PRECISIONS,
) -> MemoryPlan:
    """The plan for one checkpoint shape on one device; free=-1 reads the device's free memory. A
    precision whose scheme cannot quantize these layers (4-bit groups that divide no input width)
    has no cost in it: it is not offered for this checkpoint (load_model says why when asked)."""
    resolution = resolution or shape.default_resolution
    nodes = max(largest_pass(window), 128)
    entries = cache_entries(prompt_tokens, shape.image_tokens[resolution], largest_pass(window))
    kv = kv_cache_bytes(shape, rows, entries, dtype)
    act = activation_bytes(shape, rows, entries, nodes, dtype)
    on_cpu = device.type == "cpu"
    host = shape.weights.host * _bytes(dtype)
    widths = [i for _, i in shape.weights.quantizable]
    costs = []
    for precision in precisions:
        scheme = None if precision == "none" else SCHEMES.get((device.type, precision))
        if precision != "none" and (scheme is None or not holds_widths(scheme, widths)):
            continue
        label = str(dtype).replace("torch.", "").replace("bfloat16", "bf16").replace("float16", "fp16").replace(
            "float32", "fp32") if scheme is None else scheme.label
        weights = shape.weights.weight_bytes(dtype, scheme) + (host if on_cpu else 0)
        # Where the weights load: the device itself (the CPU; quantized, as they arrive on a GPU),
        # or CPU memory, prepared there and moved (hf_common.load_pretrained).
        loads_on_device = on_cpu or scheme is not None
        passing = shape.weights.dropped * _bytes(dtype) + (0 if on_cpu else host)
        costs.append(PrecisionCost(precision, label, weights, kv, act, passing if loads_on_device else 0,
                                   0 if on_cpu else host))
    return MemoryPlan(shape.family, str(device), str(dtype).replace("torch.", ""), resolution, rows, entries,
                      tuple(costs), free_memory(device) if free == -1 else free)


def free_memory(device: torch.device) -> Optional[int]:
    """Bytes free on the device (CUDA: the driver's count; CPU: MemAvailable); None if unknown."""
    if device.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "mps" and hasattr(torch, "mps"):
        try:
            return int(torch.mps.recommended_max_memory() - torch.mps.driver_allocated_memory())
        except (AttributeError, RuntimeError):
            return None
    if device.type == "cpu":
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None
