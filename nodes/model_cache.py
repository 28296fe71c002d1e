"""Loaded models, keyed by (path, dtype, device), shared by every loader node of the graph.

A loader with the same settings reuses the loaded model; a few models stay loaded at most (the
least recently used is unloaded first); ComfyUI's free-memory path unloads ours from a device that
still lacks memory (see comfy_bridge.install_free_memory_hook), and the next run loads them again.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

import torch

import sjd_pac_core as sp
from sjd_pac_core import ARImageModel
from sjd_pac_core.models.loader import resolve_folder

from . import comfy_bridge

log = logging.getLogger("sjd_pac.nodes")

MAX_LOADED = int(os.environ.get("SJD_PAC_MAX_LOADED_MODELS", "2"))


@dataclass(frozen=True)
class ModelHandle:
    """AR_IMAGE_MODEL, what the loader outputs: a reference to a model held in this cache.

    ComfyUI caches node outputs, so the graph keeps this handle, not the weights: after ComfyUI
    frees memory (our models are unloaded and dropped from the cache) `get()` loads them again.
    """

    name: str  # the loader's choice: "demo" or a folder name under models/autoregressive
    path: str  # what load_model gets: "demo" or the folder's absolute path
    dtype: str  # auto / bf16 / fp16 / fp32
    device: str  # a concrete device string ("cpu", "cuda:0", ...)
    family: str = ""
    resolutions: Tuple[str, ...] = ()
    quantize: str = "none"  # none / int8 / 4bit / auto (weight-only)
    memory: str = ""  # the loaded model's memory plan, one line
    check_finite: bool = False  # every weight checked for NaN/inf after loading, whatever the size

    @property
    def key(self) -> Tuple[str, ...]:
        return (self.path, self.dtype, self.device, self.quantize, str(self.check_finite))

    def get(self) -> ARImageModel:
        return get_model(self)


_lock = threading.RLock()
_models: "OrderedDict[Tuple[str, ...], ARImageModel]" = OrderedDict()

def _weights_bytes(path: str) -> int:
    try:
        folder = resolve_folder(path)
    except sp.ModelLoadError:
        return 0
    return sum(p.stat().st_size for p in Path(folder).glob("*.safetensors"))


def get_model(handle: ModelHandle) -> ARImageModel:
    """The model for `handle`, loading it if it is not (or no longer) loaded."""
    with _lock:
        model = _models.get(handle.key)
        if model is not None:
            _models.move_to_end(handle.key)
            return model
        comfy_bridge.install_free_memory_hook(release_device)
        comfy_bridge.free_memory_for(_weights_bytes(handle.path), handle.device)
        model = sp.load_model(handle.path, dtype=handle.dtype, device=handle.device, quantize=handle.quantize,
                              check_finite=True if handle.check_finite else None)
        if model.memory_plan is not None:
            log.info("sjd-pac: %s", model.memory_plan.one_line(model.quantize))
        _models[handle.key] = model
        while len(_models) > max(1, MAX_LOADED):
            _, old = _models.popitem(last=False)
            _unload(old)
        return model


def _unload(model: ARImageModel) -> None:
    try:
        model.unload()
    except Exception:
        log.warning("sjd-pac: unloading %s failed", getattr(model, "name", "?"), exc_info=True)


def release_device(device: Optional[torch.device] = None) -> int:
    """Unload the cached models on `device`'s type (every GPU when None; models on the CPU stay,
    since ComfyUI frees GPU memory here); returns how many were unloaded."""
    released = 0
    with _lock:
        for key in list(_models):
            model = _models[key]
            if device is not None and torch.device(key[2]).type != torch.device(device).type:
                continue
            if torch.device(key[2]).type == "cpu":
                continue  # nothing to move off a GPU; RAM is not what ComfyUI is freeing here
            del _models[key]
            _unload(model)
            released += 1
    if released:
        log.info("sjd-pac: unloaded %d AR image model(s) to free memory", released)
        comfy_bridge.soft_empty_cache()
    return released


def clear() -> None:
    """Unload everything (tests; also what a full reset would do)."""
    with _lock:
        while _models:
            _, model = _models.popitem()
            _unload(model)
