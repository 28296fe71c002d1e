"""load_model: a local folder (or "demo") -> an ARImageModel of the right family.

Detection reads only small files (config.json, file names); every check that can fail runs
before any weights are read or any GPU memory is allocated, and each failure is one sentence
that says what is wrong and what to download or change.
"""

from __future__ import annotations

import importlib
import json
import os
import struct
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import torch

from .image_model import ARImageModel


class ModelLoadError(ValueError):
    """The folder is not a checkpoint we can load; the message names the fix."""


DEMO_NAME = "demo"
DEMO_FOLDER = Path(__file__).resolve().parent.parent / "demo" / "weights"

# family name -> "module:Class". Each class offers `matches(folder, config) -> bool` and
# `load(folder, config, dtype, device) -> ARImageModel`. A new family is one line here.
FAMILIES: Dict[str, str] = {
    "demo": "sjd_pac_core.models.demo:DemoImageModel",
    "lumina_mgpt": "sjd_pac_core.models.lumina_mgpt:LuminaMGPTImageModel",
    "emu3": "sjd_pac_core.models.emu3:Emu3ImageModel",
    "janus": "sjd_pac_core.models.janus:JanusImageModel",
}


def _family_class(spec: str):
    module, cls = spec.split(":")
    return getattr(importlib.import_module(module), cls)


def resolve_device(device: Union[str, torch.device] = "auto") -> torch.device:
    """"auto" -> cuda, else mps, else cpu; an explicit device that is not there is an error."""
    name = str(device)
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(
            "CUDA was asked for but this PyTorch has no CUDA device; use device='cpu' or 'auto', "
            "or install a CUDA build of PyTorch."
        )
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ModelLoadError("MPS was asked for but is not available here; use device='cpu' or 'auto'.")
    return torch.device(name)


_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16,
           "float16": torch.float16, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


def resolve_dtype(dtype: Union[str, torch.dtype], device: torch.device) -> torch.dtype:
    """"auto" -> bf16 on a GPU that supports it, fp16 on other GPUs, fp32 on the CPU."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if device.type == "mps":
            return torch.float16
        return torch.float32
    if dtype not in _DTYPES:
        raise ModelLoadError(f"Unknown dtype {dtype!r}; choose auto, bf16, fp16 or fp32.")
    return _DTYPES[dtype]


def check_safetensors(path: Path) -> None:
    """Raise ModelLoadError if a .safetensors file is truncated or not a safetensors file."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            if header_len <= 0 or 8 + header_len > size:
                raise ValueError("header longer than the file")
            header = json.loads(f.read(header_len))
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise ModelLoadError(
            f"{path} is not a readable safetensors file ({exc}); download it again."
        ) from None
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + header_len + end > size:
        raise ModelLoadError(
            f"{path} is truncated ({size:,} of {8 + header_len + end:,} bytes); download it again."
        )


def check_weight_files(folder: Path) -> None:
    for path in sorted(folder.glob("*.safetensors")):
        check_safetensors(path)


def require_safetensors(folder: Path, repo_hint: str) -> None:
    """The folder must hold the weights as safetensors, every shard its index names included."""
    index_path = folder / "model.safetensors.index.json"
    if index_path.is_file():
        try:
            shards = set(json.loads(index_path.read_text())["weight_map"].values())
        except (json.JSONDecodeError, KeyError, AttributeError) as exc:
            raise ModelLoadError(f"{index_path} is not a valid index ({exc}); download it again.") from None
        missing = sorted(s for s in shards if not (folder / s).is_file())
        if missing:
            raise ModelLoadError(
                f"{folder} lacks {len(missing)} weight shard(s) named in model.safetensors.index.json "
                f"(first: {missing[0]}); download all model-*.safetensors files of {repo_hint}."
            )
    elif not any(folder.glob("*.safetensors")):
        raise ModelLoadError(
            f"{folder} has no *.safetensors weights; download the model*.safetensors files of {repo_hint} "
            "into it (PyTorch .bin checkpoints are not loaded)."
        )


_SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "I64": 8, "I32": 4, "F16": 2, "BF16": 2, "I16": 2,
                      "U8": 1, "I8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def checkpoint_numel(folder: Path) -> int:
    """Parameters in the folder's safetensors files, from their headers (no weights read)."""
    total = 0
    for path in folder.glob("*.safetensors"):
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
        for key, value in header.items():
            if key == "__metadata__":
                continue
            count = 1
            for dim in value["shape"]:
                count *= dim
            total += count
    return total


def auto_device_map(folder: Path, dtype: torch.dtype, device: torch.device) -> Optional[str]:
    """"auto" (accelerate spreads layers over GPU and CPU) when the weights would not fit into the
    free GPU memory with ~15% headroom for activations and the KV cache; None otherwise."""
    if device.type != "cuda":
        return None
    need = checkpoint_numel(folder) * torch.empty((), dtype=dtype).element_size()
    free, _total = torch.cuda.mem_get_info(device)
    return "auto" if need > 0.85 * free else None


def read_config(folder: Path) -> dict:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(
            f"{folder} has no config.json, so it is not a Hugging Face model folder; point to the "
            "folder that holds config.json and the *.safetensors weights."
        )
    try:
        return json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{config_path} is not valid JSON ({exc}); download it again.") from None


def resolve_folder(path: Union[str, os.PathLike]) -> Path:
    if str(path) == DEMO_NAME:
        if not (DEMO_FOLDER / "config.json").is_file():
            raise ModelLoadError(
                f"The bundled demo model is missing from {DEMO_FOLDER}; rebuild it with "
                "`python -m sjd_pac_core.demo.train`."
            )
        return DEMO_FOLDER
    folder = Path(path).expanduser()
    if not folder.exists():
        raise ModelLoadError(f"Model folder {folder} does not exist; check the path (or use 'demo').")
    if not folder.is_dir():
        raise ModelLoadError(f"{folder} is a file, not a model folder; pass the folder that holds config.json.")
    return folder


# Original (remote-code) formats of supported models: say which transformers version to get.
OTHER_FORMATS = {
    "multi_modality": "DeepSeek's original Janus format; download the transformers version "
    "deepseek-community/Janus-Pro-7B (or -1B) instead.",
    "Emu3": "BAAI's original remote-code Emu3 format; download the transformers version BAAI/Emu3-Gen-hf instead.",
}


def detect_family(folder: Path, config: dict) -> str:
    for name, spec in FAMILIES.items():
        if _family_class(spec).matches(folder, config):
            return name
    model_type = config.get("model_type", "<none>")
    if model_type in OTHER_FORMATS:
        raise ModelLoadError(f"{folder} holds {OTHER_FORMATS[model_type]}")
    raise ModelLoadError(
        f"{folder} holds a '{model_type}' model, which sjd-pac does not support; supported are "
        "Lumina-mGPT (chameleon), Emu3 (emu3), Janus-Pro (janus) and the bundled demo model."
    )



def load_model(
    path: Union[str, os.PathLike] = DEMO_NAME,
    dtype: Union[str, torch.dtype] = "auto",
    device: Union[str, torch.device] = "auto",
) -> ARImageModel:
    """Load the bundled demo model ("demo") or a local checkpoint folder of a supported family."""
    folder = resolve_folder(path)
    try:
        config = read_config(folder)
        family = detect_family(folder, config)
        check_weight_files(folder)
    except ModelLoadError as exc:
        if folder != DEMO_FOLDER:
            raise
        # The demo model is not downloaded but built by our script: name that instead.
        raise ModelLoadError(
            f"{str(exc).rsplit(';', 1)[0]}; rebuild the bundled demo model with "
            "`python -m sjd_pac_core.demo.train`."
        ) from None
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    cls = _family_class(FAMILIES[family])
    if getattr(cls, "supports_device_map", False):
        # Only an "auto" device may spill onto the CPU; an explicit device is a promise to fit.
        device_map = auto_device_map(folder, torch_dtype, dev) if str(device) == "auto" else None
        model = cls.load(folder, config, torch_dtype, dev, device_map=device_map)
    else:
        model = cls.load(folder, config, torch_dtype, dev)
    model.name = model.name or (DEMO_NAME if folder == DEMO_FOLDER else folder.name)
    return model


def list_model_folders(root: Union[str, os.PathLike]) -> List[Path]:
    """Sub-folders of root that look like checkpoints (hold a config.json)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / "config.json").is_file())
