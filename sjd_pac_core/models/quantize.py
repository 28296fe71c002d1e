"""Weight-only quantization at load time: which scheme runs where, and what stays in full precision.

Only weight-only schemes are offered: a quantized linear layer then computes each row of its input
on its own (x @ dequantized(W)), so a position's logits do not depend on the other rows of the
pass (the draft window, the tree, the CFG row). Schemes that quantize activations with scales
taken from the whole input (bitsandbytes' LLM.int8 with its outlier columns, torchao's dynamic
int8 activations at per-tensor granularity) make a drafted position's logits depend on what else
is in the pass: that breaks seed-exactness and, strictly, the exactness argument. They are never
offered (tests/test_quantized.py plants one and shows it fails the same tests).

| quantize | CUDA                          | CPU                                     | Apple MPS |
|----------|-------------------------------|-----------------------------------------|-----------|
| int8     | torchao int8 weight-only      | torchao int8 weight-only                | refused   |
| 4bit     | bitsandbytes NF4              | torchao int4 weight-only (int8 storage) | refused   |

Weights are quantized as they load (transformers' `quantization_config`), and only the decoder
layers' linear maps are: the family names them with one module-path prefix, and everything else
(embeddings, the LM head rows that sampling uses, norms, VQ tokenizer/decoder, image aligners and
Janus-Pro's image head) stays in the load dtype.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from .checks import ModelLoadError

QUANTIZE_CHOICES = ("none", "int8", "4bit", "auto")
PRECISIONS = ("none", "int8", "4bit")  # what "auto" chooses from, most precise first
EXTRA_HINT = 'pip install "sjd-pac[quant]"'
# Names a user may reach for that we do not offer, with the reason (one sentence each).
NOT_OFFERED = {
    "llm_int8": "bitsandbytes' LLM.int8 picks outlier columns from the whole pass, so a position's logits "
                "would depend on the other rows of the pass",
    "int8_dynamic": "dynamic int8 activations take their scales from the whole input, so a position's "
                    "logits would depend on the other rows of the pass",
    "fp8": "no fp8 weight-only path is tested here",
    "nf4": "it is offered as quantize='4bit' (NF4 on CUDA)",
}


@dataclass(frozen=True)
class Scheme:
    """One way to quantize the decoder layers' linear weights, with its storage cost per weight."""

    precision: str  # "int8" or "4bit"
    backend: str  # "torchao" or "bitsandbytes": the package that must be importable
    label: str  # for messages and the plan: "torchao int8 weight-only"
    weight_bits: int  # bits stored per weight (int4 values on the CPU are stored one per byte)
    group_size: Optional[int]  # weights per scale along the input; None = one scale per output row
    zero_point_bytes: int  # per group (asymmetric schemes)
    scale_bytes: Optional[int]  # bytes per scale; None = the load dtype's size
    build: Callable[["Scheme", torch.dtype, List[str], int], object]  # -> transformers quantization_config

    def quantized_bytes(self, out_features: int, in_features: int, dtype: torch.dtype, group: int) -> int:
        """Bytes one quantized linear weight [out, in] occupies (data, scales and zero points)."""
        scale = self.scale_bytes if self.scale_bytes is not None else torch.empty((), dtype=dtype).element_size()
        groups = 1 if self.group_size is None else in_features // group
        return out_features * in_features * self.weight_bits // 8 + out_features * groups * (scale + self.zero_point_bytes)


# The quantization libraries are imported only here, when a scheme is built for a load that asks for
# one; their known start-up noise is filtered for the whole package (library_noise.py).
def _torchao_int8(scheme: Scheme, dtype: torch.dtype, skip: List[str], group: int):
    from torchao.quantization import Int8WeightOnlyConfig
    from transformers import TorchAoConfig

    return TorchAoConfig(Int8WeightOnlyConfig(), modules_to_not_convert=skip)


def _torchao_int4(scheme: Scheme, dtype: torch.dtype, skip: List[str], group: int):
    from torchao.quantization import IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerGroup
    from transformers import TorchAoConfig

    return TorchAoConfig(IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(group)),
                         modules_to_not_convert=skip)


def _bnb_nf4(scheme: Scheme, dtype: torch.dtype, skip: List[str], group: int):
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype,
                              bnb_4bit_use_double_quant=False, llm_int8_skip_modules=skip)


TORCHAO_INT8 = Scheme("int8", "torchao", "torchao int8 weight-only", 8, None, 0, None, _torchao_int8)
# torchao 0.18's CPU int4 weight-only layout keeps each int4 value in a byte (IntxUnpackedToInt8):
# 4-bit accuracy, int8 memory. Its packed layouts need kernels the CPU wheels do not ship.
TORCHAO_INT4_CPU = Scheme("4bit", "torchao", "torchao int4 weight-only (one byte per weight)", 8, 128, 1, None,
                          _torchao_int4)
# NF4, 64 weights per fp32 absmax, no double quantization (bitsandbytes' defaults otherwise).
BNB_NF4 = Scheme("4bit", "bitsandbytes", "bitsandbytes NF4", 4, 64, 0, 4, _bnb_nf4)

# (device type, precision) -> scheme. A missing entry is refused with DEVICE_NOTES' sentence.
SCHEMES: Dict[Tuple[str, str], Scheme] = {
    ("cuda", "int8"): TORCHAO_INT8,
    ("cuda", "4bit"): BNB_NF4,
    ("cpu", "int8"): TORCHAO_INT8,
    ("cpu", "4bit"): TORCHAO_INT4_CPU,
}
DEVICE_NOTES = {
    "mps": "no weight-only int8/4-bit kernel has been verified on Apple MPS; use quantize='none' with "
           "dtype='fp16' there, or device='cpu' with quantize='int8'",
}
GROUP_SIZES = (128, 64, 32)  # int4 group sizes tried, largest first


def check_choice(quantize: object) -> str:
    """The quantize value, checked: one sentence naming the choices otherwise."""
    if isinstance(quantize, str) and quantize in QUANTIZE_CHOICES:
        return quantize
    if isinstance(quantize, str) and quantize in NOT_OFFERED:
        raise ModelLoadError(f"quantize={quantize!r} is not offered: {NOT_OFFERED[quantize]}; "
                             f"choose one of {', '.join(QUANTIZE_CHOICES)}.")
    raise ModelLoadError(f"Unknown quantize value {quantize!r}; choose one of {', '.join(QUANTIZE_CHOICES)} "
                         "(int8 and 4bit are weight-only).")


def scheme_for(precision: str, device: torch.device) -> Optional[Scheme]:
    """The scheme that runs `precision` on this device; None for "none". ModelLoadError (one
    sentence, before any weight is read) when the device has none or its library is missing."""
    if precision == "none":
        return None
    scheme = SCHEMES.get((device.type, precision))
    if scheme is None:
        note = DEVICE_NOTES.get(device.type, f"sjd-pac offers no weight-only {precision} scheme on {device.type}")
        raise ModelLoadError(f"quantize={precision!r} cannot run on {device}: {note}.")
    if importlib.util.find_spec(scheme.backend) is None:
        raise ModelLoadError(
            f"quantize={precision!r} on {device.type} uses {scheme.backend}, which is not installed; install it "
            f"with `{EXTRA_HINT}` (or `pip install {scheme.backend}` into the Python that runs sjd-pac), "
            "or use quantize='none'."
        )
    return scheme


def available_precisions(device: torch.device) -> Tuple[str, ...]:
    """The precisions this device can load with what is installed, most precise first."""
    found = ["none"]
    for precision in PRECISIONS[1:]:
        scheme = SCHEMES.get((device.type, precision))
        if scheme is not None and importlib.util.find_spec(scheme.backend) is not None:
            found.append(precision)
    return tuple(found)


def _group_size(scheme: Scheme, in_features: List[int]) -> Optional[int]:
    """The largest group size (of GROUP_SIZES, at most the scheme's) dividing every input width;
    0 for a scheme without groups, None when none divides them all."""
    if scheme.group_size is None:
        return 0
    return next((size for size in GROUP_SIZES
                 if size <= scheme.group_size and all(n % size == 0 for n in in_features)), None)


def holds_widths(scheme: Scheme, in_features: List[int]) -> bool:
    """Whether the scheme can quantize linear layers of these input widths (its groups divide them)."""
    return _group_size(scheme, in_features) is not None


def group_size_for(scheme: Scheme, in_features: List[int]) -> int:
    """The scheme's group size for these input widths; one sentence naming the quantize value asked
    for when no group size divides them."""
    size = _group_size(scheme, in_features)
    if size is None:
        raise ModelLoadError(
            f"quantize={scheme.precision!r} ({scheme.label}) needs the decoder layers' input widths "
            f"({', '.join(map(str, sorted(set(in_features))))}) to be multiples of {GROUP_SIZES[-1]}, which this "
            "checkpoint's are not; use quantize='int8' or 'none' for it."
        )
    return size


def keep_full_precision(quantized_prefix: str) -> List[str]:
    """transformers' modules_to_not_convert for "quantize only modules under this prefix": one
    pattern that matches every module name that does not start with it (an include filter)."""
    return [rf"(?!{quantized_prefix}\.).*"]


def quantization_config(scheme: Scheme, dtype: torch.dtype, quantized_prefix: str, in_features: List[int]):
    """transformers' quantization_config for from_pretrained: the scheme on the prefix's linears only."""
    return scheme.build(scheme, dtype, keep_full_precision(quantized_prefix), group_size_for(scheme, in_features))


def is_quantized(tensor: torch.Tensor) -> bool:
    """A weight held by a quantization library (torchao tensor subclass, bitsandbytes Params4bit)."""
    return type(tensor) not in (torch.Tensor, nn.Parameter) or hasattr(tensor, "quant_state")


def quantized_modules(model: nn.Module) -> List[str]:
    """Names of the modules whose weight is quantized."""
    return [name for name, module in model.named_modules()
            if isinstance(getattr(module, "weight", None), torch.Tensor) and is_quantized(module.weight)]


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes a tensor really occupies, for quantized weights their data, scales and zero points."""
    names = getattr(tensor, "tensor_data_names", None)
    if names:  # torchao tensor subclasses
        return sum(tensor_bytes(getattr(tensor, n)) for n in names if getattr(tensor, n, None) is not None)
    state = getattr(tensor, "quant_state", None)
    if state is not None:  # bitsandbytes 4-bit: packed data + absmax
        return tensor.data.numel() * tensor.data.element_size() + state.absmax.numel() * state.absmax.element_size()
    return tensor.numel() * tensor.element_size()


def weight_bytes(modules: List[nn.Module]) -> int:
    """Bytes of every parameter and buffer of these modules (each tensor once)."""
    seen: Dict[int, int] = {}
    for module in modules:
        for tensor in list(module.parameters()) + list(module.buffers()):
            if tensor.device.type != "meta":
                seen[id(tensor)] = tensor_bytes(tensor)
    return sum(seen.values())
