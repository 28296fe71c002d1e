"""Adapters for multimodal checkpoints whose image logits do not come from `model(...).logits`.

* `ImageHeadAdapter`: the inner transformer's hidden states times the rows of `lm_head` that the
  sampler may use (Lumina-mGPT, Emu3). For Chameleon this is also a correctness fix: its
  `forward` overwrites every image-token logit with the dtype minimum.
* `GenerationHeadAdapter`: separate image-token embeddings and head (Janus-Pro).

Both keep CausalLMAdapter's session (cache, tree masks, CFG rows) and its embedding hooks (the
prompt from the CPU table, sampled tokens from the device rows: models/kept_parts.py), and
override only the logits.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from .causal_lm import CausalLMAdapter
from .kept_parts import HeadRows


class ImageHeadAdapter(CausalLMAdapter):
    """Logits = F.linear(hidden, lm_head.weight[token_space]): exact, and most of the head's cost
    saved, because no id outside token_space is ever allowed at an image position."""

    def __init__(self, model: PreTrainedModel, body: nn.Module, token_space: torch.Tensor) -> None:
        super().__init__(model, token_space)
        self.body = body
        head_module = model.get_output_embeddings()
        self.head_rows: Optional[torch.Tensor] = None
        if isinstance(head_module, HeadRows):  # the loader kept these rows only
            if not torch.equal(head_module.ids.cpu(), self.token_space.cpu()):
                raise ValueError("the LM head keeps other rows than the sampler's token space")
            self.head_rows = head_module.rows
            return
        head = head_module.weight
        # A copy of the rows, made once (a gather per pass would copy them every time); under
        # accelerate offloading the weight may live on the meta device - then use the full head.
        if head.device.type != "meta":
            with torch.no_grad():
                self.head_rows = head.index_select(0, self.token_space.to(head.device)).detach()

    @torch.inference_mode()
    def forward_logits(self, inputs: dict, mask, positions, cache, last_only: bool) -> torch.Tensor:
        out = self.body(**inputs, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
        hidden = out.last_hidden_state
        if last_only:
            hidden = hidden[:, -1:]
        if self.head_rows is None or self.head_rows.device.type == "meta":
            logits = self.model.get_output_embeddings()(hidden)
            logits = logits.index_select(-1, self.token_space.to(logits.device))
        else:
            logits = F.linear(hidden.to(self.head_rows.device), self.head_rows)
        return logits.to(self.device)

    def release(self) -> None:
        self.head_rows = None


class GenerationHeadAdapter(CausalLMAdapter):
    """Janus-style image generation: codes are embedded by `prepare_embeddings_for_image_generation`
    and scored by `model.model.generation_head`; the sampler's token ids are the VQ codes."""

    def __init__(self, model: PreTrainedModel, num_codes: int) -> None:
        super().__init__(model)
        self.vocab_size = num_codes

    def embed_tokens(self, token_ids: torch.Tensor) -> dict:
        return {"inputs_embeds": self.model.prepare_embeddings_for_image_generation(token_ids)}

    @torch.inference_mode()
    def forward_logits(self, inputs: dict, mask, positions, cache, last_only: bool) -> torch.Tensor:
        out = self.model.model.language_model(
            **inputs, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True
        )
        hidden = out.last_hidden_state
        if last_only:
            hidden = hidden[:, -1:]
        head = self.model.model.generation_head
        return head(hidden.to(head.proj_out.weight.device)).to(self.device)
