"""Checks of config.json's values before any model is built from them, each failure one sentence.

transformers builds a model from whatever numbers config.json holds: a zero head count divides by
zero, a negative vocabulary size trips an assertion, a float size fails its dataclass validation
and a vocabulary_map id past the vocabulary indexes out of range at the first prompt. Here the
sizes of the top level and of `text_config`, `vision_config` and `vq_config` must be whole numbers
>= 1 that fit together (the main ones not null), a norm epsilon a finite number >= 0 (a negative one
loads, then makes every logit NaN), a channel multiplier list a short list of whole numbers, and a
vocabulary_map must be a table of token name -> id inside the vocabulary.

Sizes no checkpoint has are refused from the numbers alone, before anything is built: a layer count
past MAX_LAYERS (building 100,000 layers on the meta device alone takes many minutes), and decoder
layers that need more parameters than the folder's weight files hold (from their headers).

Sliding-window attention (Mistral, Gemma 2/3, Qwen2 with use_sliding_window, ...) is found here
too: the sampler's cache and masks let every position attend to every earlier one, which is what
such a model computes only while the whole sequence fits in its window.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, List, Optional, Tuple

from .checks import INDEX_NAME, ModelLoadError, checkpoint_numel, read_weight_map

# Sizes (transformers' names and GPT-2's, the image parts' names) that must be whole numbers >= 1
# where config.json sets them; NON_NULL_KEYS may not be null either (transformers refuses a null
# there, or divides by it), the others may (null head_dim, sliding_window, ... take a default).
TEXT_SIZE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window",
                  "n_embd", "n_head", "n_layer", "n_positions", "n_inner")
IMAGE_SIZE_KEYS = ("image_size", "patch_size", "num_image_tokens", "codebook_size", "num_embeddings", "embed_dim",
                   "latent_channels", "base_channels", "num_res_blocks", "projection_dim", "image_token_embed_dim",
                   "image_area", "in_channels", "out_channels", "num_channels")
SIZE_KEYS = TEXT_SIZE_KEYS + IMAGE_SIZE_KEYS
NON_NULL_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "n_embd", "n_head", "n_layer") + IMAGE_SIZE_KEYS
# Repeated blocks: each is Python objects to build, even on the meta device. The largest published
# language models have under 130 layers; a VQ decoder has a few blocks per level.
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_res_blocks", "depth")
MAX_LAYERS = 512
# A VQ model's channel multipliers, one per resolution level (each halves the image): 4-5 in practice.
LIST_KEYS = ("channel_multiplier", "ch_mult")
MAX_LEVELS = 10
SECTIONS = ("text_config", "vision_config", "vq_config")  # the parts' settings, beside the top level's
FIX = "download config.json of the checkpoint again"


def _sections(path: Path, config: dict) -> List[Tuple[str, dict]]:
    """(prefix, settings) of the top level and of each part's section (text_config holds the
    language model's, vision_config and vq_config the image parts')."""
    found = [("", config)]
    for name in SECTIONS:
        section = config.get(name)
        if section is not None and not isinstance(section, dict):
            raise ModelLoadError(
                f"{path} has a {name} that is a JSON {type(section).__name__}, not an object of settings; {FIX}."
            )
        if section is not None:
            found.append((f"{name}.", section))
    return found


# The norm layers' epsilons (transformers' names and GPT-2's), where config.json sets them.
EPSILON_KEYS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps")


def _epsilon(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _levels(value: object) -> bool:
    return isinstance(value, list) and 1 <= len(value) <= MAX_LEVELS and all(_whole(v) for v in value)


def check_config_values(path: Path, config: dict) -> None:
    """ModelLoadError naming the first key of config.json (at `path`) that no model can be built from."""
    sections = _sections(path, config)
    fix = FIX
    for prefix, section in sections:
        for key in SIZE_KEYS:
            value = section.get(key)
            if value is None and key in section and key in NON_NULL_KEYS:
                raise ModelLoadError(f"{path} sets {prefix}{key} to null, but a model needs its size; {fix}.")
            if value is not None and not _whole(value):
                raise ModelLoadError(
                    f"{path} sets {prefix}{key} to {value!r}, which is not a whole number >= 1; {fix}."
                )
        for key in LAYER_KEYS:
            value = section.get(key)
            if _whole(value) and value > MAX_LAYERS:
                raise ModelLoadError(
                    f"{path} sets {prefix}{key} to {value:,}, far more than any checkpoint has (at most "
                    f"{MAX_LAYERS}); {fix}."
                )
        for key in LIST_KEYS:
            value = section.get(key)
            if key in section and not _levels(value):
                raise ModelLoadError(
                    f"{path} sets {prefix}{key} to {value!r}, which is not a list of 1 to {MAX_LEVELS} whole "
                    f"numbers >= 1 (one per resolution level); {fix}."
                )
        for key in EPSILON_KEYS:
            value = section.get(key)
            if value is not None and not _epsilon(value):
                raise ModelLoadError(
                    f"{path} sets {prefix}{key} to {value!r}, which is not a finite number >= 0 (a norm layer divides "
                    f"by the square root of a mean square plus it, so a negative one gives NaN); {fix}."
                )
        heads = section.get("num_attention_heads", section.get("n_head"))
        hidden = section.get("hidden_size", section.get("n_embd"))
        kv_heads = section.get("num_key_value_heads")
        if heads and hidden and section.get("head_dim") is None and hidden % heads:
            raise ModelLoadError(
                f"{path} sets {prefix}hidden_size = {hidden} with {heads} attention heads, which do not divide "
                f"it; {fix}."
            )
        if heads and kv_heads and heads % kv_heads:
            raise ModelLoadError(
                f"{path} sets {prefix}num_attention_heads = {heads}, which {kv_heads} key/value heads do not "
                f"divide; {fix}."
            )
    vocab = next((s["vocab_size"] for prefix, s in reversed(sections)
                  if prefix in ("", "text_config.") and s.get("vocab_size") is not None), None)
    for prefix, section in sections:
        table = section.get("vocabulary_map")
        if table is None:
            continue
        if not isinstance(table, dict):
            raise ModelLoadError(
                f"{path} has a {prefix}vocabulary_map that is a JSON {type(table).__name__}, not a table of "
                f"token name -> id; {fix}."
            )
        for name, token_id in table.items():
            if isinstance(token_id, bool) or not isinstance(token_id, int):
                raise ModelLoadError(
                    f"{path} maps the token {name!r} to {token_id!r} in {prefix}vocabulary_map, which is not a "
                    f"token id; {fix}."
                )
            if token_id < 0 or (vocab is not None and token_id >= vocab):
                raise ModelLoadError(
                    f"{path} maps the token {name!r} to the id {token_id} in {prefix}vocabulary_map, outside the "
                    f"vocabulary of {vocab} ids; {fix}."
                )


def sliding_window(config: object) -> Optional[int]:
    """The attention window of a transformers config whose layers use one shorter than the model's
    context (so a run may reach past it), else None: no sliding layers, or a window that covers
    every position, where full attention is exactly what the model computes.

    As transformers' own masks decide: with layer_types, where one is "sliding_attention"; without,
    wherever sliding_window is set (its generate applies even a stray key of a Llama config)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(text, "sliding_window", None)
    if isinstance(window, bool) or not isinstance(window, int):
        return None
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    context = getattr(text, "max_position_embeddings", None)
    if isinstance(context, int) and window >= context:
        return None
    return window


def config_sliding_window(config: dict) -> Optional[int]:
    """sliding_window() of the language model config.json describes (its text_config, if any)."""
    from transformers import AutoConfig

    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    settings = {k: v for k, v in text.items() if k != "model_type"}
    try:
        built = AutoConfig.for_model(text.get("model_type") or config.get("model_type"), **settings)
    except Exception:  # noqa: BLE001 - a config transformers cannot build: loading says why
        return None
    return sliding_window(built)


def window_message(subject: str, window: int, need: str, fix: str) -> str:
    """The one sentence for a run (or every run) that reaches past a model's sliding window."""
    return (
        f"{subject} uses sliding-window attention over {window:,} positions, which the sampler does not apply "
        f"(it lets every position see every earlier one, exactly what the model computes while a run fits "
        f"in the window), and {need}; {fix}."
    )


def _text_section(config: dict) -> Tuple[str, dict]:
    text = config.get("text_config")
    return ("text_config.", text) if isinstance(text, dict) else ("", config)


def decoder_parameters(config: dict) -> Optional[int]:
    """At least how many parameters the decoder layers config.json describes hold (the attention's
    four projections and two MLP matrices per layer; a gated MLP has a third), or None when the
    config does not say."""
    _, text = _text_section(config)
    layers = text.get("num_hidden_layers") or text.get("n_layer")
    hidden = text.get("hidden_size") or text.get("n_embd")
    heads = text.get("num_attention_heads") or text.get("n_head")
    if not (_whole(layers) and _whole(hidden) and _whole(heads)):
        return None
    head_dim = text.get("head_dim") if _whole(text.get("head_dim")) else hidden // heads
    kv_heads = text.get("num_key_value_heads") if _whole(text.get("num_key_value_heads")) else heads
    inner = next((v for v in (text.get("intermediate_size"), text.get("n_inner")) if _whole(v)), 0)
    per_layer = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 2 * hidden * inner
    return layers * per_layer


def check_sizes_against_weights(folder: Path, config: dict) -> None:
    """Decoder layers that need more parameters than the folder's weight files hold (read from their
    headers, no weight) are a damaged config.json: one sentence, before any model is built. Folders
    without all of the model's weight files (a plan from config.json alone, model.safetensors or a
    shard missing) are left to the loader, which names the missing file."""
    needed = decoder_parameters(config)
    if needed is None:
        return
    if (folder / INDEX_NAME).is_file():
        shards = set(read_weight_map(folder / INDEX_NAME).values())
        if any(not (folder / shard).is_file() for shard in shards):
            return
    elif not (folder / "model.safetensors").is_file():
        return
    held = checkpoint_numel(folder)
    if needed > held:
        prefix, text = _text_section(config)
        key = "num_hidden_layers" if "num_hidden_layers" in text else "n_layer"
        raise ModelLoadError(
            f"{folder / 'config.json'} describes decoder layers of at least {needed:,} parameters ({prefix}{key} = "
            f"{text.get(key)}), but the weight files beside it hold {held:,}; {FIX}."
        )


def _key_path(config: dict, key: str) -> str:
    """Where config.json sets `key`: "key" or "section.key" (the first found), for a sentence."""
    if key in config:
        return key
    return next((f"{name}.{key}" for name in SECTIONS if isinstance(config.get(name), dict) and key in config[name]),
                key)


def built_config(config_class: Any, values: dict, path: Path) -> Any:
    """transformers' config class built from config.json's values; a value its validation refuses
    (a strict dataclass field of the wrong type) is one sentence naming the key."""
    try:
        return config_class.from_dict(values)
    except Exception as exc:  # noqa: BLE001 - transformers' validation errors have no common base class
        field = re.search(r"field '([^']+)'", str(exc))
        where = f"the value of {_key_path(values, field.group(1))}" if field else "a value"
        reason = " ".join(str(exc).split())[:160]
        raise ModelLoadError(f"{path} holds {where} that transformers' {config_class.__name__} refuses ({reason}); "
                             f"{FIX}.") from None


def meta_model(model_class: Any, config: Any, path: Path) -> Any:
    """The model built on the meta device (no memory, no weights); a config transformers cannot
    build a model from is one sentence naming the file."""
    import torch

    try:
        with torch.device("meta"):
            return model_class(config)
    except Exception as exc:  # noqa: BLE001 - any failure of the model's own constructor
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:160]
        raise ModelLoadError(f"{path} describes a model transformers cannot build ({reason}); {FIX}.") from None
