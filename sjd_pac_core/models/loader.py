"""load_model: a local folder (or "demo") -> an ARImageModel of the right family.

Detection reads only small files (config.json, file names); every check that can fail runs
before any weights are read or any GPU memory is allocated, and each failure is one sentence
that says what is wrong and what to download or change.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple, Union

import torch

from .checks import (  # noqa: F401  (re-exported: the loader's public checks)
    INDEX_NAME,
    FINITE_CHECK_DEFAULT_LIMIT,
    ModelLoadError,
    check_finite_weights,
    check_json_files,
    check_transformers_version,
    check_weight_files,
    checkpoint_numel,
    read_json_dict,
    read_safetensors_header,
)
from .image_model import ARImageModel

if TYPE_CHECKING:
    from .image_model import FamilyDefaults
    from .memory import MemoryPlan

DEMO_NAME = "demo"
DEMO_FOLDER = Path(__file__).resolve().parent.parent / "demo" / "weights"

# family name -> "module:Class". Each class offers `matches(folder, config) -> bool` and
# `load(folder, config, dtype, device) -> ARImageModel`. A new family is one line here.
FAMILIES: Dict[str, str] = {
    "demo": "sjd_pac_core.models.demo:DemoImageModel",
    # before lumina_mgpt: both are Chameleon configs, Lumina-mGPT 2.0's has the larger vocabulary
    "lumina_mgpt2": "sjd_pac_core.models.lumina_mgpt2:LuminaMGPT2ImageModel",
    "lumina_mgpt": "sjd_pac_core.models.lumina_mgpt:LuminaMGPTImageModel",
    "emu3": "sjd_pac_core.models.emu3:Emu3ImageModel",
    "janus": "sjd_pac_core.models.janus:JanusImageModel",
}


def _family_class(spec: str):
    module, cls = spec.split(":")
    return getattr(importlib.import_module(module), cls)


def _mps_available() -> bool:
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def valid_devices() -> List[str]:
    """The device names a model can run on here ("auto" first)."""
    cuda = [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return ["auto", "cpu"] + (["cuda"] + cuda if cuda else []) + (["mps"] if _mps_available() else [])


def resolve_device(device: Union[str, int, torch.device] = "auto") -> torch.device:
    """"auto" -> cuda, else mps, else cpu; an explicit device that is not there is an error.

    An int N (or the string of its digits) means cuda:N, as in torch.device(N). Only the CPU, CUDA
    and MPS run models: any other device (the meta device holds no data, 'tpu' is not a PyTorch
    device) is one sentence that lists the devices available here."""
    choose = "choose one of " + ", ".join(repr(d) for d in valid_devices())
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise ModelLoadError(
            f"device must be a device name or a CUDA index, got {device!r} of type {type(device).__name__}; {choose}."
        )
    if isinstance(device, int):
        if device < 0:
            raise ModelLoadError(f"device={device} is not a CUDA index (0, 1, ...); {choose}.")
        device = f"cuda:{device}"
    name = str(device)
    if name.isdigit():
        name = f"cuda:{name}"
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ModelLoadError(f"{name!r} is not a device name; {choose}.") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(
            "CUDA was asked for but this PyTorch has no CUDA device; use device='cpu' or 'auto', "
            "or install a CUDA build of PyTorch."
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ModelLoadError(f"There is no CUDA device {dev.index} here; {choose}.")
    if dev.type == "mps" and not _mps_available():
        raise ModelLoadError("MPS was asked for but is not available here; use device='cpu' or 'auto'.")
    if dev.type not in ("cpu", "cuda", "mps"):
        what = "holds no data, so a model cannot run on it" if dev.type == "meta" else "is not supported"
        raise ModelLoadError(f"The device {name!r} {what}; {choose}.")
    return dev


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


def read_config(folder: Path) -> dict:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(
            f"{folder} has no config.json, so it is not a Hugging Face model folder; point to the "
            "folder that holds config.json and the *.safetensors weights."
        )
    return read_json_dict(config_path)


def resolve_folder(path: Union[str, os.PathLike]) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise ModelLoadError(
            f"The model path must be a folder path (a str or pathlib.Path) or 'demo', got {path!r} of type "
            f"{type(path).__name__}; pass the folder that holds config.json."
        )
    if str(path) == DEMO_NAME:
        if not (DEMO_FOLDER / "config.json").is_file():
            raise ModelLoadError(
                f"The bundled demo model is missing from {DEMO_FOLDER}; rebuild it with "
                "`python -m sjd_pac_core.demo.tools.train`."
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
    """The family whose `matches` takes the folder."""
    model_type = config.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ModelLoadError(f"{folder / 'config.json'} sets model_type to {model_type!r}, which is not a name "
                             "such as 'emu3'; download config.json of the checkpoint again.")
    for name, spec in FAMILIES.items():
        if _family_class(spec).matches(folder, config):
            return name
    model_type = config.get("model_type", "<none>")
    if model_type in OTHER_FORMATS:
        raise ModelLoadError(f"{folder} holds {OTHER_FORMATS[model_type]}")
    raise ModelLoadError(
        f"{folder} holds a '{model_type}' model, which sjd-pac does not support; supported are "
        "Lumina-mGPT and Lumina-mGPT 2.0 (chameleon), Emu3 (emu3), Janus-Pro (janus) and the bundled demo model."
    )



def _rebuild_demo(exc: ModelLoadError) -> ModelLoadError:
    """The demo model is not downloaded but built by our script: name that as the fix."""
    return ModelLoadError(
        f"{str(exc).rsplit(';', 1)[0]}; rebuild the bundled demo model with `python -m sjd_pac_core.demo.tools.train`."
    )


def model_family(path: Union[str, os.PathLike]) -> Tuple[Path, dict, str]:
    """(folder, config, family) of a checkpoint folder or "demo", from the small files only; a
    config.json value no model can be built from is a ModelLoadError."""
    from .config_checks import check_config_values, check_sizes_against_weights

    folder = resolve_folder(path)
    family = None
    try:
        config = read_config(folder)
        family = detect_family(folder, config)
        check_config_values(folder / "config.json", config)
        check_sizes_against_weights(folder, config)
        return folder, config, family
    except ModelLoadError as exc:
        if folder != DEMO_FOLDER and family != "demo":
            raise
        raise _rebuild_demo(exc) from None


def family_defaults(path: Union[str, os.PathLike]) -> "FamilyDefaults":
    """The settings load_model's model of this folder (or "demo") will have, from its small files
    alone: no weight is read and no model built. Its sizes are empty where only the loaded model
    knows them (they come from the processor). ModelLoadError as load_model would give it."""
    folder, config, family = model_family(path)
    return _family_class(FAMILIES[family]).defaults_for_folder(folder)


def memory_plan(
    path: Union[str, os.PathLike],
    dtype: Union[str, torch.dtype] = "auto",
    device: Union[str, torch.device] = "auto",
    resolution: Optional[str] = None,
    rows: int = 2,
) -> Optional["MemoryPlan"]:
    """What the checkpoint needs on the device at each precision, from config.json alone (no weight
    is read); None for the bundled demo model (a few MB). rows: 2 with guidance (CFG), 1 without;
    resolution: one of the checkpoint's sizes (None: its default)."""
    from .memory import plan_memory

    if isinstance(rows, bool) or not isinstance(rows, int) or rows not in (1, 2):
        raise ModelLoadError(f"rows must be 1 (no guidance) or 2 (guidance, the families' default), got {rows!r}.")
    if resolution is not None and not isinstance(resolution, str):
        raise ModelLoadError(f"resolution must be a size such as '768x768' or None (the model's default), got "
                             f"{resolution!r}.")
    folder, config, family = model_family(path)
    cls = _family_class(FAMILIES[family])
    if not hasattr(cls, "memory_shape"):
        return None
    dev = resolve_device(device)
    shape = cls.memory_shape(config, folder)
    if resolution is not None and resolution not in shape.image_tokens:
        raise ModelLoadError(f"The {family} model in {folder} draws no {resolution} image; choose one of "
                             f"{', '.join(shape.image_tokens)}.")
    return plan_memory(shape, dev, resolve_dtype(dtype, dev), resolution, rows=rows)


def check_family_window(folder: Path, config: dict, shape) -> None:
    """A sliding attention window shorter than the family's smallest image (plus one prompt token)
    makes every run inexact: refused before any weight is read. A longer window is checked per run
    (the sampler's session refuses a run that does not fit in it)."""
    from .config_checks import config_sliding_window, window_message

    window = config_sliding_window(config)
    shortest = min(shape.image_tokens.values()) + 1
    if window is not None and window < shortest:
        raise ModelLoadError(window_message(
            f"The model in {folder}", window,
            f"even its smallest image needs {shortest:,} positions with a one-token prompt",
            "use a checkpoint without sliding-window attention (or whose window covers its images)"))


def _choose_precision(plan, quantize: str, dev: torch.device, spread: bool) -> str:
    """The precision to load with: quantize, or for "auto" the most precise that fits; a precision
    that does not fit (and is not spread over devices) is one sentence naming what fits."""
    from .quantize import available_precisions

    offered = available_precisions(dev)
    if plan is None:
        return "none" if quantize == "auto" else quantize
    if quantize == "auto":
        chosen = plan.most_precise_fitting(offered)
        if chosen is None and not spread:
            raise ModelLoadError(plan.not_enough("none", offered))
        return chosen or offered[-1]
    if not spread and not plan.fits(quantize):
        raise ModelLoadError(plan.not_enough(quantize, offered))
    return quantize


def load_model(
    path: Union[str, os.PathLike] = DEMO_NAME,
    dtype: Union[str, torch.dtype] = "auto",
    device: Union[str, torch.device] = "auto",
    check_finite: Optional[bool] = None,
    quantize: str = "none",
    device_map: Union[None, str, dict] = None,
    offload_folder: Union[None, str, os.PathLike] = None,
) -> ARImageModel:
    """Load the bundled demo model ("demo") or a local checkpoint folder of a supported family.

    device: "auto" (CUDA, else MPS, else the CPU), "cpu", "cuda", "cuda:N", "mps", a torch.device or
    an int N (cuda:N); anything else is one sentence listing the devices available here.
    quantize: "none", "int8" or "4bit" (weight-only: the decoder layers' linear weights, quantized
    as they load), or "auto": the most precise that fits the device by the memory plan. Every
    check - the folder, the family, the weight files, the scheme's library, the plan against free
    memory - runs before any weight is read, each failure one sentence naming the fix.
    device_map / offload_folder: spread the model with accelerate (e.g. {"model.layers.1": "disk",
    ...} or "auto"); the model's `memory_plan` says what each precision needs.

    Every missing, unexpected or mis-shaped weight is a ModelLoadError naming the file and the
    weight. check_finite: look for NaN/inf in every weight after loading (a damaged data section
    passes every other check); None checks models of up to FINITE_CHECK_DEFAULT_LIMIT parameters.
    """
    from .hf_common import OFFLOAD_HINT, LoadOptions
    from .memory import plan_memory
    from .quantize import check_choice, group_size_for, quantization_config, scheme_for

    if check_finite is not None and not isinstance(check_finite, bool):
        raise ModelLoadError(f"check_finite must be None, True or False, got {check_finite!r}.")
    quantize = check_choice(quantize)
    check_transformers_version()
    folder, config, family = model_family(path)
    is_demo = folder == DEMO_FOLDER or family == "demo"
    try:
        check_json_files(folder)  # transformers reads them with Python's JSON: a damaged one named here
        check_weight_files(folder)
    except ModelLoadError as exc:
        if not is_demo:
            raise
        raise _rebuild_demo(exc) from None
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    cls = _family_class(FAMILIES[family])
    if not getattr(cls, "supports_device_map", False):  # the demo model: a few MB in its own format
        if quantize not in ("none", "auto"):
            from ..demo import quantize_refusal

            raise ModelLoadError(quantize_refusal(f"quantize={quantize!r}", "use quantize='none'"))
        if device_map is not None:
            raise ModelLoadError(f"The {family} model is a few MB and loads whole on one device; leave device_map "
                                 "unset (None).")
        try:
            model = cls.load(folder, config, torch_dtype, dev)
        except ModelLoadError as exc:
            raise _rebuild_demo(exc) from None
        plan = None
    else:
        try:
            shape = cls.memory_shape(config, folder)
        except ModelLoadError:
            raise
        except Exception:  # noqa: BLE001 - a folder the family's own checks explain better (no VQGAN files)
            shape = None
        if shape is None:  # the family's load names what is wrong with the folder
            cls.load(folder, config, torch_dtype, dev)
            raise ModelLoadError(f"{folder / 'config.json'} does not describe a model sjd-pac can plan for; "
                                 "download config.json of the checkpoint again.")
        check_family_window(folder, config, shape)
        if quantize not in ("none", "auto"):  # what was asked for, checked before its cost is planned
            group_size_for(scheme_for(quantize, dev), [i for _, i in shape.weights.quantizable])
        plan = plan_memory(shape, dev, torch_dtype)
        spread = device_map is not None
        if not spread and str(device) == "auto" and dev.type == "cuda" and quantize == "none" and not plan.fits("none"):
            spread, device_map = True, "auto"  # only an "auto" device may spill onto the CPU
        if spread and importlib.util.find_spec("accelerate") is None:
            raise ModelLoadError(
                f"Spreading the model over devices (device_map={device_map!r}) needs accelerate, which is not "
                f"installed; install it with `{OFFLOAD_HINT}` (or `pip install accelerate`), or load on one device."
            )
        precision = _choose_precision(plan, quantize, dev, spread)
        scheme = scheme_for(precision, dev)
        options = LoadOptions(
            quantization=None if scheme is None else quantization_config(
                scheme, torch_dtype, cls.QUANTIZED_LAYERS, [i for _, i in shape.weights.quantizable]),
            device_map=device_map,
            offload_folder=None if offload_folder is None else Path(offload_folder),
        )
        model = cls.load(folder, config, torch_dtype, dev, options)
        model.quantize = precision
    try:
        if check_finite or (check_finite is None and checkpoint_numel(folder) <= FINITE_CHECK_DEFAULT_LIMIT):
            check_finite_weights(model, folder)
    except ModelLoadError as exc:
        if not is_demo:
            raise
        raise _rebuild_demo(exc) from None
    model.memory_plan = plan
    model.name = model.name or (DEMO_NAME if folder == DEMO_FOLDER else folder.name)
    return model


def list_model_folders(root: Union[str, os.PathLike]) -> List[Path]:
    """Sub-folders of root that look like checkpoints (hold a config.json)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / "config.json").is_file())


def folder_resolutions(path: Union[str, os.PathLike]) -> Tuple[str, Optional[Tuple[str, ...]]]:
    """(family, its sizes "WxH", default first) of a checkpoint folder (or "demo"), read from
    config.json and the folder name alone - no weights, tokenizer or processor are loaded. The
    sizes are None where they need the processor (an Emu3 config with its own image_area).
    ModelLoadError when the folder is not a checkpoint of a supported family."""
    from . import sizes

    folder = resolve_folder(path)
    config = read_config(folder)
    family = detect_family(folder, config)
    if family == "lumina_mgpt":
        from .lumina_mgpt import default_sizes

        return family, tuple(f"{w}x{h}" for w, h in sizes.trained_sizes(default_sizes(folder)[0]))
    if family == "lumina_mgpt2":
        from .lumina_mgpt2 import trained_resolutions

        return family, trained_resolutions()
    if family == "emu3":
        from .emu3 import DEFAULT_IMAGE_AREA

        area = config.get("image_area", DEFAULT_IMAGE_AREA)
        return family, (sizes.EMU3_RESOLUTIONS if area == 720 * 720 else None)
    return family, sizes.family_resolutions().get(family)
