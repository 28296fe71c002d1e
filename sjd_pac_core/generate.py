"""generate_image: prompt -> images, the one entry point of the CLI, nodes, app and benchmark."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import List, Optional, Union

import torch
from PIL import Image

from .config import ConfigError, SamplerConfig
from .engine.finite import NonFiniteError
from .engine.loop import Callback, sample_tokens
from .engine.stats import RunStats
from .models.image_model import ARImageModel, PromptEncoding
from .sampling.seeds import image_seed, resolve_seed
from .threads import check_threads, threads_for, torch_threads


@dataclass
class ImageResult:
    images: List[Image.Image]
    tokens: torch.Tensor  # long [num_tokens] for one image, [B, num_tokens] for a batch
    stats: RunStats  # the first image's statistics (all of them in `all_stats`)
    all_stats: List[RunStats]
    encoding: PromptEncoding
    config: SamplerConfig
    seed: int  # the seed used (the random one drawn for None or -1); image i used image_seeds[i]

    @property
    def image_seeds(self) -> List[int]:
        return [image_seed(self.seed, i) for i in range(len(self.images))]


def _short_repr(value: object, limit: int = 40) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def generate_image(
    model: ARImageModel,
    prompt: str,
    config: Optional[SamplerConfig] = None,
    seed: Optional[int] = 0,
    negative_prompt: Optional[str] = "",
    resolution: Optional[str] = None,
    callback: Optional[Callback] = None,
    batch_size: int = 1,
    threads: Union[None, int, str] = "auto",
) -> ImageResult:
    """Generate `batch_size` images (seeds seed, seed+1, ...) for one prompt.

    seed: 0 .. 2**64-1, or None or -1 for a fresh random one, reported in the result
        (sampling/seeds.py: the one meaning of every value; front ends pass the user's value here).
    prompt, negative_prompt: text (str); a negative prompt of None means none. Anything else is
        a ConfigError before any work.

    config: None takes the family's recommended settings (model.defaults).
    callback: called after every forward pass with a Progress (see sample_tokens); raise
        GenerationCancelled in it to stop.
    threads: torch CPU threads for the run: "auto" (the default) takes the CLI's choice for the
        model (threads.threads_for: one thread for a small model such as the demo on the CPU,
        torch's setting otherwise), a number that many, None torch's setting as it is. The
        caller's setting is restored when the call returns or raises.
    """
    if not isinstance(model, ARImageModel):
        raise ConfigError(
            f"model must be a model from sjd_pac_core.load_model, got {type(model).__name__}; load one with "
            "load_model(path) (or load_model('demo'))."
        )
    for name, text in (("prompt", prompt), ("negative_prompt", negative_prompt)):
        if not isinstance(text, str) and not (name == "negative_prompt" and text is None):
            raise ConfigError(
                f"{name} must be text (a str), got {_short_repr(text)} of type {type(text).__name__}; pass "
                f"the words {'that describe the image' if name == 'prompt' else 'to steer away from'} ('' for none)."
            )
    negative_prompt = negative_prompt or ""  # None means none
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be an integer >= 1, got {batch_size!r}.")
    seed = resolve_seed(seed)
    count = threads_for(model) if check_threads(threads) == "auto" else threads
    config = config or model.defaults.sampler_config()
    with torch_threads(count):
        return _generate(model, prompt, config, seed, negative_prompt, resolution, callback, batch_size)


def _generate(model: ARImageModel, prompt: str, config: SamplerConfig, seed: int, negative_prompt: str,
              resolution: Optional[str], callback: Optional[Callback], batch_size: int) -> ImageResult:
    encoding = model.encode_prompt(prompt, negative_prompt, resolution)
    for message in encoding.warnings:
        warnings.warn(message, stacklevel=3)
    tokens, all_stats = [], []
    for i in range(batch_size):  # images run one after another: each has its own accept lengths
        try:
            out = sample_tokens(
                model, encoding.prompt_ids, encoding.layout.num_tokens, config=config, seed=image_seed(seed, i),
                uncond_prompt_ids=encoding.uncond_ids, allowed_tokens=encoding.constraints, callback=callback,
            )
        except NonFiniteError as exc:  # name the token's place in the picture too
            raise exc.on_grid(encoding.layout.rows, encoding.layout.row_length) from None
        tokens.append(out.tokens)
        all_stats.append(out.stats)
    stacked = torch.stack(tokens)
    images = model.decode(stacked, encoding.resolution)
    return ImageResult(
        images=images,
        tokens=stacked[0] if batch_size == 1 else stacked,
        stats=all_stats[0],
        all_stats=all_stats,
        encoding=encoding,
        config=config,
        seed=seed,
    )
