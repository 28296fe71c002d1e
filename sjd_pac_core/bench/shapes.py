"""Model shapes the benchmarks build with random weights (no download), and their token ids."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Shape:
    """A model family's transformer shape and the context a real image generation runs at."""

    name: str
    family: str  # chameleon | emu3 | llama
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    image_vocab: int  # tokens the sampler chooses from (the image codes)
    prompt_tokens: int
    image_tokens: int
    note: str = ""

    @property
    def context(self) -> int:
        return self.prompt_tokens + self.image_tokens


# Real shapes (shared/spec/models.md): Chameleon-7B as Lumina-mGPT ships it (qk-LayerNorm), 768x768
# = 2,356 image tokens incl. size tokens and end-of-lines; Emu3-Gen 8B (GQA, 184,622-word vocabulary),
# 720x720 = 90 rows x (90 + EOL) + 3 = 8,193 tokens. Prompts of ~64 tokens.
SHAPES = {
    "lumina-mgpt-7b-768": Shape("lumina-mgpt-7b-768", "chameleon", 4096, 11008, 32, 32, 32, 65536, 8192, 64, 2356,
                                "Chameleon-7B (Lumina-mGPT), 768x768"),
    "emu3-gen-8b-720": Shape("emu3-gen-8b-720", "emu3", 4096, 14336, 32, 32, 8, 184622, 32768, 64, 8193,
                             "Emu3-Gen, 720x720"),
}
# Issue 13's CPU target: a ~110M-parameter random Llama (12 layers, hidden 768) with an 8,192-code
# image vocabulary at a 2,400-token context, in fp32 on the CPU: sampler work outside the forward
# and the bytes compaction moves per tree pass, at L = 64 with a tree.
CPU_SHAPES = {
    "llama-110m-2400": Shape("llama-110m-2400", "llama", 768, 2048, 12, 12, 12, 16384, 8192, 64, 2336,
                             "Llama 110M, 8,192 image codes, 2,400-token context (CPU target)"),
}
TINY_SHAPES = {
    "lumina-mgpt-tiny": Shape("lumina-mgpt-tiny", "chameleon", 64, 128, 2, 4, 4, 1024, 256, 8, 56,
                              "tiny Chameleon (CI only)"),
    "emu3-tiny": Shape("emu3-tiny", "emu3", 64, 128, 2, 4, 2, 1024, 256, 8, 72, "tiny Emu3 (CI only)"),
}


def build_random_model(shape: Shape, dtype: torch.dtype, device: torch.device):
    """The family's transformers model with random weights, built on the device (no download)."""
    if shape.family == "chameleon":
        from transformers import ChameleonConfig, ChameleonForConditionalGeneration as cls

        config = ChameleonConfig(hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                                 num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                                 num_key_value_heads=shape.kv_heads, vocab_size=shape.vocab, qk_layernorm=True,
                                 max_position_embeddings=shape.context + 256,
                                 vocabulary_map={"<image>": shape.vocab - shape.image_vocab - 1})
        if shape.hidden < 1024:  # a tiny VQ for the tiny shape (its weights are never used here)
            config.vq_config.embed_dim = config.vq_config.base_channels = 32
            config.vq_config.num_embeddings = shape.image_vocab
            config.vq_config.channel_multiplier = [1, 1]
    elif shape.family == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM as cls

        config = LlamaConfig(hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                             num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                             num_key_value_heads=shape.kv_heads, vocab_size=shape.vocab,
                             max_position_embeddings=shape.context + 256, pad_token_id=0, bos_token_id=1,
                             eos_token_id=2)
    elif shape.family == "emu3":
        from transformers import Emu3ForCausalLM as cls, Emu3TextConfig

        config = Emu3TextConfig(hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                                num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                                num_key_value_heads=shape.kv_heads, vocab_size=shape.vocab,
                                max_position_embeddings=shape.context + 256, pad_token_id=0, bos_token_id=1,
                                eos_token_id=2)
    else:
        raise ValueError(f"unknown family {shape.family!r}")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # initialise in the target dtype: a 7B model never exists in fp32
    try:
        with torch.device(device):
            model = cls(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def image_token_ids(shape: Shape, device: torch.device) -> torch.Tensor:
    """Model ids of the image codes (a contiguous block at the end of the vocabulary will do for
    random weights; only the count matters for cost)."""
    return torch.arange(shape.vocab - shape.image_vocab, shape.vocab, device=device)


def text_vocab(shape: Shape) -> int:
    """Prompt ids are drawn below the image block and Chameleon's <image> placeholder id."""
    return shape.vocab - shape.image_vocab - 1


def family_adapter(model, shape: Shape, device: torch.device):
    """The sampler's adapter for the shape's model, as the family's loader builds it: Lumina-mGPT
    and Emu3 score the image codes with those rows of the head on the decoder's last state."""
    from ..models.adapters import ImageHeadAdapter
    from ..models.causal_lm import CausalLMAdapter

    ids = image_token_ids(shape, device)
    if shape.family in ("chameleon", "emu3"):
        return ImageHeadAdapter(model, model.model, ids)
    return CausalLMAdapter(model, token_space=ids)
