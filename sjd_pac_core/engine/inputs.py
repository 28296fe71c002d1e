"""Every check on sample_tokens' arguments, before any work: one ConfigError sentence each.

`check_sample_inputs` turns what a user passed (tensors, arrays or lists; numpy integers; a
config dict; seed None) into a `SampleInputs` the decoding loop can trust, or names the argument
that is wrong and how to fix it. Nothing here runs the model.
"""

from __future__ import annotations

import inspect
import numbers
import os
from dataclasses import dataclass
from typing import Any, Callable, List, Mapping, Optional, Sequence, Union

import numpy as np
import torch

from ..config import ConfigError, SamplerConfig, coerce_config
from ..models.base import TokenModel
from ..sampling.recipe import TokenConstraints
from ..sampling.seeds import resolve_seed


@dataclass(frozen=True)
class SampleInputs:
    """sample_tokens' arguments, checked and in the form the loop uses."""

    config: SamplerConfig
    prompts: List[torch.Tensor]  # long 1-D: [conditional] or [conditional, unconditional] (CFG)
    num_tokens: int
    seed: int  # in [0, 2**64): the user's seed, or the random one drawn for None or -1 (seeds.py)
    constraints: TokenConstraints
    callback: Optional[Callable[[Any], None]]


def check_sample_inputs(
    token_model: TokenModel,
    prompt_ids: object,
    num_tokens: object,
    config: Union[None, SamplerConfig, Mapping[str, Any]],
    seed: object,
    uncond_prompt_ids: object,
    allowed_tokens: object,
    callback: object,
) -> SampleInputs:
    config = coerce_config(config)
    tokens = check_num_tokens(num_tokens)
    prompt_vocab = prompt_vocabulary_size(token_model)
    prompts = [check_prompt("prompt_ids", prompt_ids, prompt_vocab)]
    uncond = None if uncond_prompt_ids is None else check_prompt("uncond_prompt_ids", uncond_prompt_ids, prompt_vocab)
    if config.uses_cfg:
        if uncond is None:
            raise ConfigError(
                f"cfg_scale={config.cfg_scale} needs an unconditional prompt; pass uncond_prompt_ids "
                "(for example just the image-start tokens) or set cfg_scale=1.0."
            )
        prompts.append(uncond)
    check_run_fits(token_model, prompts, tokens, config)
    constraints = TokenConstraints.from_user(allowed_tokens, token_model.vocab_size, tokens)
    largest_support = int(constraints.free_support_sizes().max())
    if config.use_pd and config.node_budget is None and config.tree_width > largest_support:
        raise ConfigError(
            f"tree_width (K) = {config.tree_width} is larger than the {largest_support} tokens the "
            f"model may choose from; use a tree width of at most {largest_support}."
        )
    return SampleInputs(
        config=config,
        prompts=prompts,
        num_tokens=tokens,
        seed=resolve_seed(seed),
        constraints=constraints,
        callback=check_callback(callback),
    )


def check_num_tokens(num_tokens: object) -> int:
    if isinstance(num_tokens, (bool, np.bool_)) or not isinstance(num_tokens, numbers.Integral) or num_tokens < 1:
        raise ConfigError(
            f"num_tokens must be an integer >= 1, got {num_tokens!r}; pass the image's token count "
            "(model.layout(resolution).num_tokens)."
        )
    return int(num_tokens)


def check_prompt(name: str, ids: object, vocab_size: Optional[int]) -> torch.Tensor:
    """A prompt as a long 1-D CPU tensor of ids in 0..vocab_size-1 (a [1, S] batch of one is
    taken as its row); a tensor, numpy array or list of whole numbers."""
    if isinstance(ids, np.ndarray):
        ids = torch.from_numpy(np.ascontiguousarray(ids))
    elif isinstance(ids, (list, tuple)):
        try:
            ids = torch.as_tensor(ids)
        except (TypeError, ValueError, RuntimeError):
            ids = None
    if not isinstance(ids, torch.Tensor):
        raise ConfigError(
            f"{name} must be a LongTensor (or list) of token ids, got {type(ids).__name__}; encode the prompt first "
            "(model.encode_prompt)."
        )
    if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        raise ConfigError(f"{name} must hold integer token ids, got dtype {ids.dtype}; pass a LongTensor.")
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1:
        raise ConfigError(
            f"{name} must be one prompt (a 1-D tensor of ids), got shape {tuple(ids.shape)}; for several "
            "images call sample_tokens once per prompt or use generate_image(batch_size=...)."
        )
    if ids.numel() < 1:
        raise ConfigError(f"{name} must be a non-empty LongTensor of token ids; encode the prompt first.")
    ids = ids.detach().cpu().long()
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or (vocab_size is not None and high >= vocab_size):
        bad = low if low < 0 else high
        limit = "" if vocab_size is None else f" 0..{vocab_size - 1}"
        raise ConfigError(
            f"{name} holds the token id {bad}, outside the model's vocabulary{limit}; encode the prompt "
            "with this model's tokenizer."
        )
    return ids


def check_callback(callback: object) -> Optional[Callable[[Any], None]]:
    """None, or a callable that can be called with one argument (the Progress)."""
    if callback is None:
        return None
    if not callable(callback):
        raise ConfigError(
            f"callback must be a function that takes one Progress argument, got {type(callback).__name__}; "
            "pass a function or None."
        )
    try:
        signature = inspect.signature(callback)
    except (TypeError, ValueError):  # some builtins have no signature: trust them
        return callback
    try:
        signature.bind(None)
    except TypeError:
        name = getattr(callback, "__name__", type(callback).__name__)
        raise ConfigError(
            f"callback {name}{signature} cannot be called with one argument; define it as "
            "`def callback(progress)`, which receives a Progress after every forward pass."
        ) from None
    return callback


# --- the model's limits ---------------------------------------------------------------------------
def _text_config(token_model: TokenModel):
    config = getattr(getattr(token_model, "model", None), "config", None)
    if config is None:
        return None
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def prompt_vocabulary_size(token_model: TokenModel) -> Optional[int]:
    """Ids a prompt may hold: the rows of the model's input embedding (None when unknown)."""
    model = getattr(token_model, "model", None)
    embeddings = getattr(model, "get_input_embeddings", lambda: None)() if model is not None else None
    rows = getattr(embeddings, "num_embeddings", None)  # nn.Embedding's, and a split embedding's table
    return rows if isinstance(rows, int) and rows > 0 else None


def context_length(token_model: TokenModel) -> Optional[int]:
    """Positions the model was built for (max_position_embeddings), or None when unknown."""
    config = _text_config(token_model)
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def kv_bytes_per_position(token_model: TokenModel, rows: int) -> int:
    """Bytes the KV cache takes per position for `rows` prompt rows (0 when unknown)."""
    config = _text_config(token_model)
    model = getattr(token_model, "model", None)
    if config is None or model is None:
        return 0
    layers = getattr(config, "num_hidden_layers", 0) or 0
    heads = getattr(config, "num_attention_heads", 0) or 0
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or (getattr(config, "hidden_size", 0) // max(heads, 1))
    dtype = getattr(model, "dtype", torch.float32)
    return 2 * layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size() * rows


def available_memory(device: torch.device) -> Optional[int]:
    """Bytes a run may use on the device (CUDA: the free memory; CPU: the machine's RAM, since
    the OS can reclaim caches), None when unknown."""
    try:
        if device.type == "cuda":
            # Free on the device plus what PyTorch's allocator holds cached but unused.
            cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
            return int(torch.cuda.mem_get_info(device)[0]) + int(cached)
        if device.type == "cpu":
            return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError, RuntimeError):
        return None
    return None


def _size(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:,.1f} GiB" if num_bytes >= 2**30 else f"{num_bytes / 2**20:,.2f} MiB"


def check_run_fits(
    token_model: TokenModel, prompts: Sequence[torch.Tensor], num_tokens: int, config: SamplerConfig
) -> None:
    """num_tokens must fit the model's context length and the memory a run needs."""
    prompt_length = max(int(p.shape[0]) for p in prompts)
    limit = context_length(token_model)
    if limit is not None and prompt_length + num_tokens > limit:
        room = limit - prompt_length
        raise ConfigError(
            f"num_tokens = {num_tokens:,} plus the prompt's {prompt_length} tokens exceed the model's context "
            f"length of {limit:,} positions; ask for at most {max(room, 0):,} tokens (a smaller resolution) or "
            "shorten the prompt."
        )
    # The KV cache over prompt, image and one pass's drafts, plus the committed tokens.
    need = kv_bytes_per_position(token_model, len(prompts)) * (prompt_length + num_tokens + config.pass_nodes)
    need += 8 * num_tokens
    free = available_memory(token_model.device)
    if free is not None and need > free:
        raise ConfigError(
            f"num_tokens = {num_tokens:,} needs about {_size(need)} for the cache, but only "
            f"{_size(free)} are free on {token_model.device}; ask for fewer tokens."
        )
