"""Load AR Image Model: the bundled demo model or a checkpoint folder under models/autoregressive."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import sjd_pac_core as sp
from sjd_pac_core.models.loader import DEMO_NAME, folder_resolutions, resolve_device

from . import comfy_bridge
from .datatypes import AR_IMAGE_MODEL
from .model_cache import ModelHandle

DTYPES = ["auto", "bf16", "fp16", "fp32"]
DEVICES = ["auto", "gpu", "cpu"]
QUANTIZE = ["none", "int8", "4bit", "auto"]


def model_choices() -> List[str]:
    """"demo" first, then every checkpoint folder (one holding config.json) under the model roots."""
    names = [DEMO_NAME]
    for root in comfy_bridge.model_roots():
        for folder in sp.list_model_folders(root):
            if folder.name not in names:
                names.append(folder.name)
    return names


def _missing_model_message(name: str) -> str:
    return (
        f"Model folder '{name}' was not found under models/{comfy_bridge.MODEL_FOLDER_NAME}; download "
        "the checkpoint into that folder (see docs/comfyui.md), press Refresh, or pick another model."
    )


def resolve_choice(name: str) -> str:
    """A loader choice -> what load_model takes ("demo" or an absolute folder path)."""
    if name == DEMO_NAME:
        return DEMO_NAME
    for root in comfy_bridge.model_roots():
        folder = Path(root) / name
        if (folder / "config.json").is_file():
            return str(folder.resolve())
    raise ValueError(_missing_model_message(name))


def resolutions_for_choice(name: str) -> Dict[str, Any]:
    """What the front end shows in the sampler's resolution list for a loader choice, read from the
    folder's config.json and name without loading the model: {"model", "family", "resolutions"}
    (resolutions None = show every size), or {"model", "error"} for a folder that is not there or
    not loadable (the sampler then keeps every size; running names the problem)."""
    try:
        family, sizes = folder_resolutions(resolve_choice(name))
    except (ValueError, OSError) as exc:  # ModelLoadError is a ValueError
        return {"model": name, "error": str(exc)}
    return {"model": name, "family": family, "resolutions": list(sizes) if sizes is not None else None}


def quantize_problem(model: Any, quantize: Any) -> Optional[str]:
    """Why `quantize` cannot load the loader choice `model`, from its folder's config.json alone, or
    None (a linked input, None, is checked when the node runs)."""
    if quantize is None:
        return None
    if quantize not in QUANTIZE:
        return f"quantize must be one of {', '.join(QUANTIZE)}, got {quantize!r}; try none."
    if quantize in ("none", "auto") or model is None:
        return None
    if resolutions_for_choice(model).get("family") == "demo":  # a few MB in its own format
        return (f"The {model} model is small and always loads whole and unquantized; set quantize to none "
                "(quantization is for Lumina-mGPT, Emu3 and Janus-Pro).")
    return None


class LoadARImageModel:
    DESCRIPTION = (
        "Loads an autoregressive text-to-image model (the bundled 64x64 demo model, Lumina-mGPT, "
        "Lumina-mGPT 2.0, Emu3 or Janus-Pro) from models/autoregressive/<folder>. Loading again with the same "
        "settings reuses the loaded model."
    )
    CATEGORY = "sjd-pac"
    SEARCH_ALIASES = ["lumina", "lumina-mgpt", "lumina-mgpt-2", "janus", "janus-pro", "emu3", "autoregressive image model",
                      "speculative decoding"]
    RETURN_TYPES = (AR_IMAGE_MODEL,)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = ("The loaded model, for SJD-PAC Sampler, Decode AR Image Tokens and SJD-PAC Text to Image.",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls) -> dict:
        return {
            "required": {
                "model": (model_choices(), {
                    "default": DEMO_NAME,
                    "tooltip": "Which model: 'demo' is the small bundled model (64x64, runs on a CPU); the "
                               "others are the folders under models/autoregressive (each holding config.json "
                               "and *.safetensors).",
                }),
                "dtype": (DTYPES, {
                    "default": "auto",
                    "tooltip": "Weight precision: auto picks bf16 on GPUs that support it, else fp16 on a GPU "
                               "and fp32 on the CPU.",
                }),
                "device": (DEVICES, {
                    "default": "auto",
                    "tooltip": "Where the model runs: auto follows ComfyUI (the CPU when started with --cpu); "
                               "gpu insists on a GPU; cpu is slow for the large models.",
                }),
            },
            "optional": {
                "quantize": (QUANTIZE, {
                    "default": "none",
                    "tooltip": "Weight-only quantization of the transformer layers (sampling stays exact): int8 "
                               "halves the weights, 4bit quarters them on a GPU; auto picks the most precise that "
                               "fits. Needs torchao (and bitsandbytes for 4bit on a GPU).",
                }),
                "check_finite": ("BOOLEAN", {
                    "default": False,
                    "tooltip": "Look for NaN or infinite values in every weight after loading. Done anyway for "
                               "models of up to 2e9 parameters (the demo); for a 7B checkpoint it takes a while. "
                               "Sampling stops with a message if the probabilities ever become NaN, either way.",
                }),
            },
        }

    @classmethod
    def VALIDATE_INPUTS(cls, model: str, quantize: Any = None):
        # `model` (the folders change while ComfyUI runs) and `quantize` (the demo loads whole): ComfyUI
        # leaves both to this check, before anything runs; it checks dtype and device against their lists.
        if model is not None and model not in model_choices():
            return _missing_model_message(model)
        return quantize_problem(model, quantize) or True

    def load(self, model: str, dtype: str, device: str, quantize: str = "none",
             check_finite: bool = False) -> Tuple[ModelHandle]:
        path = resolve_choice(model)
        dev = comfy_bridge.choose_device(device)
        if dev == "auto":
            dev = str(resolve_device("auto"))
        handle = ModelHandle(name=model, path=path, dtype=dtype, device=dev, quantize=quantize,
                             check_finite=bool(check_finite))
        ar = handle.get()
        plan = ar.memory_plan.one_line(ar.quantize) if ar.memory_plan is not None else ""
        return (replace(handle, family=ar.family, resolutions=tuple(ar.defaults.resolutions), memory=plan),)
