"""Small pieces shared by the Hugging Face families (Lumina-mGPT, Emu3, Janus-Pro)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, List, Optional, Type

import numpy as np
import torch
from PIL import Image
from transformers import PreTrainedModel

from .loader import ModelLoadError, check_loading_info


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


def require_any(folder: Path, names: List[str], what: str, fix: str) -> Path:
    """The first of `names` that exists in folder, else one sentence naming what to download."""
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise ModelLoadError(f"{folder} has no {what} ({' or '.join(names)}); {fix}")


LoadingInfo = dict  # transformers' output_loading_info: missing/unexpected/mismatched keys, error_msgs


def load_pretrained(
    cls: Type[PreTrainedModel],
    folder: Path,
    dtype: torch.dtype,
    device: torch.device,
    device_map: Optional[str],
    repair: Optional[Callable[[PreTrainedModel, LoadingInfo], LoadingInfo]] = None,
) -> PreTrainedModel:
    """from_pretrained on one device, or spread by accelerate when device_map is "auto".

    transformers fills a missing or mis-shaped weight with random values and only logs it; here
    every weight its loading info reports is a ModelLoadError naming the file and the weight.
    repair: a family's fix for a known, harmless difference of its checkpoints; it gets the model
    and the loading info and returns the info without the entries it fixed.
    """
    try:
        kwargs = dict(dtype=dtype, output_loading_info=True, ignore_mismatched_sizes=True)
        if device_map is not None:
            model, info = cls.from_pretrained(folder, device_map=device_map, **kwargs)
        else:
            model, info = cls.from_pretrained(folder, **kwargs)
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(
            f"Loading the weights in {folder} failed ({short(exc)}); "
            "download the checkpoint again or check that it matches config.json."
        ) from exc
    if repair is not None:
        info = repair(model, info)
    check_loading_info(folder, info)
    if device_map is None:
        try:
            model = model.to(device)
        except RuntimeError as exc:
            raise ModelLoadError(f"Moving the weights of {folder} to {device} failed ({short(exc)}).") from exc
    return model.eval()


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
