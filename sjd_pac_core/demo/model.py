"""Load the bundled demo text-to-image model and turn its tokens into pictures.

    from sjd_pac_core.demo.model import load_demo
    demo = load_demo()                       # the LM (GPT-2 or Llama; fp32, eval) + VQ + vocabulary
    prompt = demo.prompt_ids("a red circle top left on a blue background")
    ...sample demo.num_image_tokens tokens with demo.allowed_tokens() ...
    image = demo.tokens_to_image(tokens)     # PIL.Image, 64x64

``reference_ar_sample`` is a small plain-AR sampler (KV cache, CFG, temperature, top-k) for
eyeballing the model; the library's samplers live in ``sjd_pac_core.sampling``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from . import WEIGHTS_DIR
from .vocab import DemoVocab
from .vq import VQModel


@dataclass
class DemoModel:
    model: "torch.nn.Module"
    vq: VQModel
    vocab: DemoVocab
    path: str

    @property
    def num_image_tokens(self) -> int:
        return self.vocab.num_image_tokens

    def prompt_ids(self, caption: str | None) -> torch.Tensor:
        return self.vocab.prompt_ids(caption)

    def uncond_prompt_ids(self) -> torch.Tensor:
        return self.vocab.uncond_prompt_ids()

    def allowed_tokens(self) -> torch.Tensor:
        return self.vocab.allowed_tokens()

    def tokens_to_array(self, tokens: torch.Tensor) -> np.ndarray:
        """272 image tokens (or a batch) -> uint8 (64, 64, 3) (or (B, 64, 64, 3))."""
        tokens = torch.as_tensor(tokens)
        single = tokens.dim() == 1
        codes = self.vocab.codes_from_ids(tokens.reshape(-1, self.num_image_tokens))
        arr = self.vq.decode_to_uint8(codes)
        return arr[0] if single else arr

    def tokens_to_image(self, tokens: torch.Tensor):
        from PIL import Image

        return Image.fromarray(self.tokens_to_array(tokens))


def load_demo(path: str | os.PathLike | None = None, dtype: torch.dtype = torch.float32) -> DemoModel:
    """Load LM (upcast to ``dtype``, eval mode), VQ and vocabulary from ``path`` (default: the shipped weights)."""
    from transformers import AutoModelForCausalLM

    path = os.fspath(path or WEIGHTS_DIR)
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        raise FileNotFoundError(
            f"no demo weights in {path}; rebuild them with `python -m sjd_pac_core.demo.tools.train --out {path}`"
        )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    vq = VQModel.from_pretrained(path)
    vocab = DemoVocab.load(path)
    if model.config.vocab_size != vocab.vocab_size:
        raise ValueError(f"LM vocab {model.config.vocab_size} != vocab.json {vocab.vocab_size}")
    return DemoModel(model, vq, vocab, path)


def _process(logits_c, logits_u, allowed_row, cfg_scale, temperature, top_k):
    l = logits_c if logits_u is None else logits_u + cfg_scale * (logits_c - logits_u)
    l = l.masked_fill(~allowed_row, float("-inf")) / temperature
    if top_k is not None and top_k < int(allowed_row.sum()):
        kth = torch.topk(l, top_k, dim=-1).values[..., -1:]
        l = l.masked_fill(l < kth, float("-inf"))
    return torch.softmax(l.float(), -1)


@torch.no_grad()
def reference_ar_sample(
    demo: DemoModel,
    captions: list[str | None],
    cfg_scale: float = 1.0,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
) -> torch.Tensor:
    """Plain AR sampling of a batch of captions -> image tokens (B, 272). Captions are
    left-padded to a common length so the batch shares one KV cache."""
    from transformers import DynamicCache

    vocab, model = demo.vocab, demo.model
    g = torch.Generator().manual_seed(seed)
    prompts = [vocab.prompt_ids(c) for c in captions]
    use_cfg = cfg_scale != 1.0
    if use_cfg:
        prompts = prompts + [vocab.uncond_prompt_ids() for _ in captions]
    B = len(prompts)
    T = max(len(p) for p in prompts)
    ids = torch.full((B, T), vocab.pad_id, dtype=torch.long)
    att = torch.zeros((B, T), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, T - len(p) :] = p
        att[i, T - len(p) :] = 1
    pos = (att.cumsum(1) - 1).clamp(min=0)
    allowed = vocab.allowed_tokens()
    cache = DynamicCache()
    out = model(input_ids=ids, attention_mask=att, position_ids=pos, cache=cache, use_cache=True)
    logits = out.logits[:, -1]
    n = len(captions)
    result = torch.empty((n, vocab.num_image_tokens), dtype=torch.long)
    for t in range(vocab.num_image_tokens):
        lc = logits[:n]
        lu = logits[n:] if use_cfg else None
        p = _process(lc, lu, allowed[t], cfg_scale, temperature, top_k)
        tok = torch.multinomial(p, 1, generator=g).squeeze(1)
        result[:, t] = tok
        nxt = torch.cat([tok, tok]) if use_cfg else tok
        att = torch.cat([att, torch.ones((B, 1), dtype=torch.long)], 1)
        pos = pos[:, -1:] + 1
        out = model(input_ids=nxt[:, None], attention_mask=att, position_ids=pos, cache=cache, use_cache=True)
        logits = out.logits[:, -1]
    return result
