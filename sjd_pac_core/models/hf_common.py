"""Small pieces shared by the Hugging Face families (Lumina-mGPT, Emu3, Janus-Pro)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Type, Union

import numpy as np
import torch
from PIL import Image
from transformers import PreTrainedModel

from .checks import ModelLoadError, check_loading_info, check_weight_dtypes
from .kept_parts import drop_modules


def pixels_to_pil(pixels: torch.Tensor, channels_last: bool = False) -> List[Image.Image]:
    """Float images in about [-1, 1] ([B, 3, H, W], or [B, H, W, 3]) -> PIL images.

    Clamped, mapped to [0, 1], times 255 and truncated to uint8, in float32: bit for bit Meta's
    Chameleon VQGAN code (and what transformers' postprocess and DeepSeek's Janus code do).
    """
    if not channels_last:
        pixels = pixels.permute(0, 2, 3, 1)
    unit = (pixels.detach().float().cpu().clamp(-1.0, 1.0) + 1.0) / 2.0
    arrays = (unit * 255.0).to(torch.uint8).numpy()  # float -> uint8 truncates, like numpy's astype
    return [Image.fromarray(np.ascontiguousarray(a)) for a in arrays]


def postprocess_to_pil(processor, pixels: torch.Tensor) -> List[Image.Image]:
    """Decoder output -> PIL images through the checkpoint's own image processor (`postprocess`):
    its mean/std from the processor config, rescale, clip and uint8 truncation, exactly as
    transformers' image generation examples convert them."""
    out = processor.postprocess(list(pixels.detach().float().cpu()), return_tensors="PIL.Image.Image")
    images = out["pixel_values"]
    return [images] if isinstance(images, Image.Image) else list(images)


def short(exc: BaseException, limit: int = 200) -> str:
    """An exception as one line for a one-sentence error message."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:limit]


# A chat template is code the checkpoint ships (Jinja): a crafted one can loop for hours on one
# prompt. Real templates render in milliseconds; one that takes this long is refused.
CHAT_TEMPLATE_SECONDS = 5.0


class _TemplateOverrun(Exception):
    """Raised inside a chat template's rendering once its time is up (see render_chat_template)."""


def render_chat_template(processor, messages: list, fix: str, seconds: float = CHAT_TEMPLATE_SECONDS) -> str:
    """The processor's chat template applied to `messages` (with the generation prompt), stopped
    after `seconds`: a trace function (Python's own hook, called on every line the template's
    compiled code runs) raises once the time is up. A template that overruns or fails is a
    ModelLoadError whose sentence ends with `fix`."""
    deadline = time.monotonic() + seconds

    def trace(frame, event, arg):
        if time.monotonic() > deadline:
            raise _TemplateOverrun
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        return processor.apply_chat_template(messages, add_generation_prompt=True)
    except _TemplateOverrun:
        raise ModelLoadError(f"The checkpoint's chat template runs for more than {seconds:g} s on one prompt (a "
                             f"template is code, and this one does not finish); {fix}") from None
    except Exception as exc:  # noqa: BLE001 - a template may raise anything (the sandbox's limits, its own errors)
        reason = short(exc).replace(". ", "; ").rstrip(".")  # the template's words inside our one sentence
        raise ModelLoadError(f"The checkpoint's chat template fails on a prompt ({reason}); {fix}") from None
    finally:
        sys.settrace(previous)


def require_any(folder: Path, names: List[str], what: str, fix: str) -> Path:
    """The first of `names` that exists in folder, else one sentence naming what to download."""
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise ModelLoadError(f"{folder} has no {what} ({' or '.join(names)}); {fix}")


LoadingInfo = dict  # transformers' output_loading_info: missing/unexpected/mismatched keys, error_msgs
OFFLOAD_HINT = 'pip install "sjd-pac[offload]"'


@dataclass(frozen=True)
class LoadOptions:
    """How from_pretrained places and stores the weights (load_model fills it in)."""

    quantization: Optional[object] = None  # a transformers quantization_config (TorchAoConfig, BitsAndBytesConfig)
    device_map: Union[None, str, Dict[str, object]] = None  # accelerate's placement ("auto" or module -> device)
    offload_folder: Optional[Path] = None  # where device_map's "disk" entries go


def floating_weights(cls: Type[PreTrainedModel], folder: Path) -> Optional[Dict[str, bool]]:
    """The model's state-dict names -> is floating point, from config.json on the meta device (no
    memory, no weights); None when the config cannot build it (loading then says why)."""
    try:
        config = cls.config_class.from_pretrained(folder)
        with torch.device("meta"):
            skeleton = cls(config)
    except Exception:  # noqa: BLE001 - from_pretrained reports a config it cannot build
        return None
    return {name: t.is_floating_point() for name, t in skeleton.state_dict().items()}


def load_pretrained(
    cls: Type[PreTrainedModel],
    folder: Path,
    dtype: torch.dtype,
    device: torch.device,
    options: Optional[LoadOptions] = None,
    repair: Optional[Callable[[PreTrainedModel, LoadingInfo], LoadingInfo]] = None,
    prepare: Optional[Callable[[PreTrainedModel], None]] = None,
    unused: Sequence[str] = (),
) -> PreTrainedModel:
    """from_pretrained on one device, or spread by accelerate (options.device_map), quantized as
    it loads when options.quantization is set.

    transformers fills a missing or mis-shaped weight with random values and only logs it; here
    every weight its loading info reports is a ModelLoadError naming the file and the weight.
    repair: a family's fix for a known, harmless difference of its checkpoints; it gets the model
    and the loading info and returns the info without the entries it fixed. unused: modules
    sampling never runs, dropped after loading (a device map need not place them: they load on
    the CPU). prepare: cuts what sampling never uses of the rest (kept_parts.keep_what_sampling_uses).
    Both run before the model moves to the device.
    """
    floating = floating_weights(cls, folder)
    if floating is not None:
        check_weight_dtypes(folder, floating)
    options = options or LoadOptions()
    device_map = options.device_map
    if isinstance(device_map, dict):
        device_map = {**{name: "cpu" for name in unused if not _placed(name, device_map)}, **device_map}
    if device_map is None and options.quantization is not None and device.type != "cpu":
        device_map = {"": str(device)}  # quantize on the device, as the weights arrive
    kwargs = dict(dtype=dtype, output_loading_info=True, ignore_mismatched_sizes=True)
    if options.quantization is not None:
        kwargs["quantization_config"] = options.quantization
    if device_map is not None:
        kwargs["device_map"] = device_map
    if options.offload_folder is not None:
        kwargs["offload_folder"] = str(options.offload_folder)
    try:
        model, info = cls.from_pretrained(folder, **kwargs)
    except ImportError as exc:  # a library the placement or the quantization needs
        raise ModelLoadError(f"Loading {folder} needs a library that is missing ({short(exc)}); install the "
                             f"quantization or offload extra (`{OFFLOAD_HINT}`, `pip install \"sjd-pac[quant]\"`).") from exc
    except (OSError, ValueError, RuntimeError) as exc:
        if options.quantization is not None or device_map is not None:
            raise ModelLoadError(
                f"Loading the weights in {folder} with quantization or offload failed ({short(exc)}); "
                "load with quantize='none' on one device to tell a damaged checkpoint from a placement problem."
            ) from exc
        raise ModelLoadError(
            f"Loading the weights in {folder} failed ({short(exc)}); "
            "download the checkpoint again or check that it matches config.json."
        ) from exc
    if repair is not None:
        info = repair(model, info)
    check_loading_info(folder, info)
    drop_modules(model, unused)
    placement = getattr(model, "hf_device_map", None) or {}
    for key in [k for k in placement if any(k == n or k.startswith(n + ".") for n in unused)]:
        del placement[key]  # what is gone holds no device (the cache asks which devices hold layers)
    if prepare is not None:
        prepare(model)
    if device_map is None:
        try:
            model = model.to(device)
        except RuntimeError as exc:
            raise ModelLoadError(f"Moving the weights of {folder} to {device} failed ({short(exc)}).") from exc
    return model.eval()


def _placed(name: str, device_map: Dict[str, object]) -> bool:
    """Whether a device map says where module `name` (or a part of it) goes."""
    return any(key in ("", name) or name.startswith(key + ".") or key.startswith(name + ".") for key in device_map)


def free_model(model: Optional[torch.nn.Module]) -> None:
    """Move weights off the GPU (ComfyUI's unload hook); accelerate-dispatched models stay put."""
    if model is None or getattr(model, "hf_device_map", None):
        return
    model.to("cpu")
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def preview_image(decode, layout, tokens: torch.Tensor, resolution: str) -> Image.Image:
    """A partially sampled image: unsampled codes set to code 0 (sampler id 0 in every family's
    token space), forced tokens in place, decoded with the family's decoder; unsampled cells dimmed."""
    n = min(int(tokens.shape[-1]), layout.num_tokens)
    full = layout.forced_tokens().clamp(min=0)
    full[:n] = tokens.reshape(-1)[:n].cpu()
    arr = np.asarray(decode(full.unsqueeze(0), resolution)[0]).copy()
    done = layout.grid((torch.arange(layout.num_tokens) < n).long()).bool().numpy()
    scale_y, scale_x = arr.shape[0] // layout.rows, arr.shape[1] // layout.cols
    mask = np.kron(done, np.ones((scale_y, scale_x), dtype=bool))
    arr[~mask] = (arr[~mask] * 0.25).astype(np.uint8)
    return Image.fromarray(arr)
