"""Checks of config.json's values before any model is built from them, each failure one sentence.

transformers builds a model from whatever numbers config.json holds: a zero head count divides by
zero, a negative vocabulary size trips an assertion, a float size fails its dataclass validation
and a vocabulary_map id past the vocabulary indexes out of range at the first prompt. Here the
sizes of the top level and of `text_config` must be whole numbers >= 1 that fit together, a norm
epsilon a finite number >= 0 (a negative one loads, then makes every logit NaN), and a
vocabulary_map must be a table of token name -> id inside the vocabulary.

Sliding-window attention (Mistral, Gemma 2/3, Qwen2 with use_sliding_window, ...) is found here
too: the sampler's cache and masks let every position attend to every earlier one, which is what
such a model computes only while the whole sequence fits in its window.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import List, Optional, Tuple

from .checks import ModelLoadError

# Sizes (transformers' names and GPT-2's) that must be whole numbers >= 1 where config.json sets them.
SIZE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window",
             "n_embd", "n_head", "n_layer", "n_positions", "n_inner")


def _sections(path: Path, config: dict) -> List[Tuple[str, dict]]:
    """(prefix, settings) of the top level and of text_config (where the language model's are)."""
    text = config.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ModelLoadError(
            f"{path} has a text_config that is a JSON {type(text).__name__}, not an object of settings; "
            "download config.json of the checkpoint again."
        )
    return [("", config)] + ([("text_config.", text)] if text is not None else [])


# The norm layers' epsilons (transformers' names and GPT-2's), where config.json sets them.
EPSILON_KEYS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps")


def _epsilon(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_config_values(path: Path, config: dict) -> None:
    """ModelLoadError naming the first key of config.json (at `path`) that no model can be built from."""
    sections = _sections(path, config)
    fix = "download config.json of the checkpoint again"
    for prefix, section in sections:
        for key in SIZE_KEYS:
            value = section.get(key)
            if value is not None and not _whole(value):
                raise ModelLoadError(
                    f"{path} sets {prefix}{key} to {value!r}, which is not a whole number >= 1; {fix}."
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
    vocab = next((s["vocab_size"] for _, s in reversed(sections) if s.get("vocab_size") is not None), None)
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
