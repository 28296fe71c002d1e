"""Any decoder-only transformers causal LM as a TokenModel.

Mechanics (verified in ../shared/spec/models.md): a DynamicCache kept across passes, cropped
after a chain pass, compacted with index_select after a tree pass; tree passes carry an additive
4D mask and explicit position ids; CFG rows are left-padded to one batch.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from ..sampling.tree import tree_attention_mask, tree_position_ids
from .base import DecoderSession, TokenModel


class NotACausalLMError(TypeError):
    pass


def is_causal_lm(model: object) -> bool:
    return isinstance(model, PreTrainedModel) and model.get_output_embeddings() is not None


class CausalLMSession(DecoderSession):
    def __init__(self, adapter: "CausalLMAdapter", prompts: Sequence[torch.Tensor]) -> None:
        self.adapter = adapter
        device = adapter.device
        lengths = [int(p.shape[0]) for p in prompts]
        width = max(lengths)
        self.pad = torch.tensor([width - n for n in lengths], device=device)
        ids = torch.zeros(len(prompts), width, dtype=torch.long, device=device)
        for row, prompt in enumerate(prompts):  # one row per prompt (1 or 2), not per token
            ids[row, width - lengths[row] :] = prompt.to(device)
        self.prompt_ids = ids
        self.key_valid = torch.arange(width, device=device).unsqueeze(0) >= self.pad.unsqueeze(1)
        self.cache: Optional[DynamicCache] = DynamicCache(config=adapter.model.config)
        self.past = 0  # cache length before the last pass
        self.last_pass = 0  # nodes fed in the last pass

    # Each row's position id for the next new token: its real (unpadded) length so far.
    def _next_positions(self) -> torch.Tensor:
        return self.past - self.pad

    def prefill(self) -> torch.Tensor:
        width = self.prompt_ids.shape[1]
        causal = torch.ones(width, width, dtype=torch.bool, device=self.prompt_ids.device).tril()
        # Padding queries attend to themselves so their states stay finite (a fully masked row
        # gives NaN, and NaN values poison later layers even behind a zero attention weight).
        allowed = causal & (self.key_valid.unsqueeze(1) | torch.eye(width, dtype=torch.bool, device=causal.device))
        dtype = self.adapter.mask_dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=causal.device).masked_fill(
            ~allowed, torch.finfo(dtype).min
        )
        positions = (torch.arange(width, device=causal.device).unsqueeze(0) - self.pad.unsqueeze(1)).clamp(min=0)
        logits = self.adapter.forward_logits(
            self.adapter.embed_prompt(self.prompt_ids), mask.unsqueeze(1), positions, self.cache, last_only=True
        )
        self.past = width
        self.last_pass = 0
        return logits[:, -1]

    def forward(self, tokens: torch.Tensor, depths: torch.Tensor, attend: torch.Tensor) -> torch.Tensor:
        b = self.prompt_ids.shape[0]
        mask = tree_attention_mask(attend, self.key_valid, self.adapter.mask_dtype)
        positions = tree_position_ids(depths, self._next_positions())
        inputs = self.adapter.embed_tokens(tokens.unsqueeze(0).expand(b, -1))
        logits = self.adapter.forward_logits(inputs, mask, positions, self.cache, last_only=False)
        self.last_pass = int(tokens.shape[0])
        return logits

    def keep(self, nodes: Sequence[int]) -> None:
        nodes = list(nodes)
        past = self.past
        if nodes == list(range(len(nodes))):
            surplus = self.last_pass - len(nodes)
            if surplus > 0:
                self.cache.crop(-surplus)  # transformers 5 takes the number of entries to drop
        else:
            index = torch.tensor([past + n for n in nodes], device=self.prompt_ids.device)
            keep_all = torch.cat([torch.arange(past, device=index.device), index])
            for layer in self.cache.layers:
                # Layers may sit on different GPUs when accelerate spread the model (device_map).
                keep = keep_all.to(layer.keys.device)
                layer.keys = layer.keys.index_select(2, keep)
                layer.values = layer.values.index_select(2, keep)
        self.past = past + len(nodes)
        ones = torch.ones(self.key_valid.shape[0], len(nodes), dtype=torch.bool, device=self.key_valid.device)
        self.key_valid = torch.cat([self.key_valid, ones], dim=1)
        self.last_pass = 0

    def close(self) -> None:
        self.cache = None
        self.key_valid = None


class CausalLMAdapter(TokenModel):
    """Wraps a transformers causal LM. Subclasses override the three hooks below.

    token_space: optional long [V'] of model vocabulary ids the sampler works in; sampler id i
    is model id token_space[i]. Restricting logits to it is exact when every other id is
    disallowed at every image position, and it saves most of the head's cost on big vocabularies.
    """

    def __init__(self, model: PreTrainedModel, token_space: Optional[torch.Tensor] = None) -> None:
        if not is_causal_lm(model):
            raise NotACausalLMError(
                f"{type(model).__name__} is not a causal language model; pass a transformers "
                "*ForCausalLM model, or a model loaded with sjd_pac_core.load_model."
            )
        self.model = model.eval()
        vocab = model.get_output_embeddings().weight.shape[0]
        self.token_space = None if token_space is None else token_space.to(self.device)
        self.vocab_size = vocab if token_space is None else int(token_space.shape[0])

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def mask_dtype(self) -> torch.dtype:
        dtype = self.model.dtype
        return dtype if dtype.is_floating_point else torch.float32

    def open_session(self, prompts: Sequence[torch.Tensor]) -> CausalLMSession:
        return CausalLMSession(self, prompts)

    # --- hooks -----------------------------------------------------------------------------
    def embed_prompt(self, prompt_ids: torch.Tensor) -> dict:
        """Model inputs for the prompt rows (model vocabulary ids)."""
        return {"input_ids": prompt_ids}

    def embed_tokens(self, token_ids: torch.Tensor) -> dict:
        """Model inputs for sampler-space tokens [B, S]."""
        ids = token_ids if self.token_space is None else self.token_space[token_ids]
        return {"input_ids": ids}

    @torch.inference_mode()
    def forward_logits(self, inputs: dict, mask, positions, cache, last_only: bool) -> torch.Tensor:
        """Logits [B, S, V] in the sampler's token space."""
        out = self.model(
            **inputs,
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
        )
        logits = out.logits
        if self.token_space is not None:
            logits = logits.index_select(-1, self.token_space)
        return logits


def as_token_model(model: object) -> TokenModel:
    """A TokenModel for the sampler: adapters pass through, causal LMs get wrapped."""
    if isinstance(model, TokenModel):
        return model
    token_model = getattr(model, "token_model", None)  # an ARImageModel from load_model
    if isinstance(token_model, TokenModel):
        return token_model
    if is_causal_lm(model):
        return CausalLMAdapter(model)
    raise NotACausalLMError(
        f"{type(model).__name__} is not a causal language model; pass a transformers "
        "*ForCausalLM model, or a model loaded with sjd_pac_core.load_model."
    )
