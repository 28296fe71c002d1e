"""Tiny, randomly initialised checkpoints of the three real families, in the on-disk layout users have.

Each builder instantiates the real transformers class from a tiny config (2 layers, hidden 32),
saves it with save_pretrained (config.json + model.safetensors) next to the tokenizer/processor
files the loader reads, and returns the folder. Nothing is downloaded.

* Lumina-mGPT comes in two on-disk layouts, both found in the wild: Lumina-mGPT's own
  (`build_lumina`: what Alpha-VLLM/Lumina-mGPT-7B-* hold - its converter's config keys
  (`model_parallel_size`, `swin_norm`, `z_loss_weight`, `mask_image_logits`, the vq_config with
  the yaml's old and new key names), q/k LayerNorm weights as [model_parallel_size, head_dim] =
  [1, head_dim], no `model.vqmodel.*` weights (its trainer deletes the VQ model)) and
  transformers' (`build_lumina_transformers`: save_pretrained of ChameleonForConditionalGeneration,
  q/k norms [num_heads, head_dim]). Both hold the same network. It keeps Chameleon's real vocabulary layout: 65536 ids, <s>=0, image codes on ids
  4..8195 (here in a shuffled order, so code <-> id mapping bugs show), <eoss>=8196,
  <racm3:break>=8197, <reserved0NNNN> at id NNNN+4 (so end-of-line <reserved08799> = 8803 and the
  size tokens 8804 + n). Only the width is tiny (hidden 32: embeddings 65536 x 32). The VQGAN is
  Meta's checkpoint format: vqgan.yaml + vqgan.ckpt ({"state_dict": ...}, taming key names, with
  encoder and loss keys the loader must skip), 16x downsampling, with attention and a width
  change so every kind of decoder key occurs.
* Emu3 and Janus-Pro use small vocabularies with the families' real special-token names (the
  loader finds every id by name), a 64-code VQ and the families' real processors, configured as
  the real repos' processor configs are (image mean and std 0.5, not transformers' CLIP defaults).

Head and embedding weights are scaled up so that the conditionals are peaked and depend on the
prefix; otherwise every draft would be a coin flip over thousands of codes and the speculative
paths (accepted runs, tree branches) would hardly be exercised.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Dict, List

import torch

TEXT_WORDS = [
    "Generate", "an", "image", "of", "according", "to", "the", "following", "prompt", "a", "red",
    "cat", "on", "blue", "dog", "green", "field", "x", ":", ".", ",",
] + [str(d) for d in range(10)]


def _word_level_tokenizer(vocab: Dict[str, int], specials: List[str]):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    tok.add_special_tokens(specials)
    return tok


def _peaked(head: torch.Tensor, embed: torch.Tensor, head_scale: float) -> None:
    with torch.no_grad():
        head.mul_(head_scale)
        embed.mul_(3.0)


# --- Lumina-mGPT ------------------------------------------------------------------------------
LUMINA_VOCAB = 65536
LUMINA_CODES = 8192


def lumina_image_token_name(code: int) -> str:
    """Chameleon's naming: IMGIMG + the code's digits spelled A-J + a final 'Z'."""
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


def lumina_vocabulary(seed: int = 0) -> Dict[str, int]:
    gen = torch.Generator().manual_seed(seed)
    ids = (torch.randperm(LUMINA_CODES, generator=gen) + 4).tolist()
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({lumina_image_token_name(c): ids[c] for c in range(LUMINA_CODES)})
    vocab["<eoss>"] = 8196
    vocab["<racm3:break>"] = 8197
    for i in range(8198, 8198 + 700):  # <reserved08194> .. ; 8706 = end of turn, 8799 = EOL, 8800+n sizes
        vocab[f"<reserved{i - 4:05d}>"] = i
    vocab["<image>"] = vocab.pop("<reserved08707>")  # as transformers' conversion does
    for i, word in enumerate(TEXT_WORDS):
        vocab[word] = 9000 + i
    return vocab


TINY_VQGAN = {
    "embed_dim": 4, "n_embed": LUMINA_CODES,
    "ddconfig": {"double_z": False, "z_channels": 8, "resolution": 64, "in_channels": 3, "out_ch": 3,
                 "ch": 32, "ch_mult": [1, 1, 1, 1, 2], "num_res_blocks": 1, "attn_resolutions": [4],
                 "dropout": 0.0},
}


class RandomTensors:
    """A state dict written tensor by tensor, each drawn from one generator in the order written
    (the order is part of the checkpoint: tests pin decoded pixels to it)."""

    def __init__(self, seed: int) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.state: Dict[str, torch.Tensor] = {}

    def randn(self, name: str, *shape: int) -> None:
        self.state[name] = torch.randn(*shape, generator=self.gen)

    def conv(self, name: str, cin: int, cout: int, k: int, bias_mean: float = 0.0) -> None:
        self.state[f"{name}.weight"] = torch.randn(cout, cin, k, k, generator=self.gen) * (1.0 / (cin * k * k) ** 0.5)
        self.state[f"{name}.bias"] = bias_mean + torch.randn(cout, generator=self.gen) * 0.05

    def group_norm(self, name: str, c: int) -> None:
        self.state[f"{name}.weight"] = 1 + 0.1 * torch.randn(c, generator=self.gen)
        self.state[f"{name}.bias"] = 0.1 * torch.randn(c, generator=self.gen)


def taming_vq_tensors(params: dict, tensors: RandomTensors, norm: Callable[[str, int], None]) -> None:
    """taming-transformers' VQ decoder tree under its key names, each norm written by `norm`
    (name, channels), then the codebook, post_quant_conv, and the quant_conv and encoder.conv_in
    a decoder must skip. Chameleon's VQGAN and MoVQGAN share this tree; they differ in the norm."""
    dd = params["ddconfig"]
    ch, mult, nrb = dd["ch"], dd["ch_mult"], dd["num_res_blocks"]
    conv = tensors.conv

    def resblock(name: str, cin: int, cout: int) -> None:
        norm(f"{name}.norm1", cin)
        conv(f"{name}.conv1", cin, cout, 3)
        norm(f"{name}.norm2", cout)
        conv(f"{name}.conv2", cout, cout, 3)
        if cin != cout:
            conv(f"{name}.nin_shortcut", cin, cout, 1)

    def attn(name: str, c: int) -> None:
        norm(f"{name}.norm", c)
        for part in ("q", "k", "v", "proj_out"):
            conv(f"{name}.{part}", c, c, 1)

    levels = len(mult)
    block_in = ch * mult[-1]
    res = dd["resolution"] // 2 ** (levels - 1)
    conv("decoder.conv_in", dd["z_channels"], block_in, 3)
    resblock("decoder.mid.block_1", block_in, block_in)
    attn("decoder.mid.attn_1", block_in)
    resblock("decoder.mid.block_2", block_in, block_in)
    for level in reversed(range(levels)):
        block_out = ch * mult[level]
        for i in range(nrb + 1):
            resblock(f"decoder.up.{level}.block.{i}", block_in, block_out)
            block_in = block_out
            if res in dd["attn_resolutions"]:
                attn(f"decoder.up.{level}.attn.{i}", block_in)
        if level != 0:
            conv(f"decoder.up.{level}.upsample.conv", block_in, block_in, 3)
            res *= 2
    norm("decoder.norm_out", block_in)
    conv("decoder.conv_out", block_in, dd["out_ch"], 3)
    tensors.randn("quantize.embedding.weight", params["n_embed"], params["embed_dim"])
    conv("post_quant_conv", params["embed_dim"], dd["z_channels"], 1)
    # Parts a decoder must ignore.
    conv("quant_conv", dd["z_channels"], params["embed_dim"], 1)
    conv("encoder.conv_in", dd["in_channels"], ch, 3)


def taming_vqgan_state(params: dict, seed: int = 0) -> Dict[str, torch.Tensor]:
    """A random state dict under taming-transformers' VQModel key names, written out from its
    naming scheme (not from our module), including encoder/quant_conv/loss keys to be skipped."""
    tensors = RandomTensors(seed)
    taming_vq_tensors(params, tensors, norm=tensors.group_norm)
    tensors.randn("loss.discriminator.main.0.weight", 8, 3, 4, 4)
    return tensors.state


def write_vqgan(folder: Path, params: dict = TINY_VQGAN, seed: int = 0) -> Dict[str, torch.Tensor]:
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    config = {"model": {"base_learning_rate": 4.5e-06, "target": "taming.models.vqgan.VQModel",
                        "params": {**params, "lossconfig": {"target": "taming.modules.losses.DummyLoss"}}}}
    (folder / "vqgan.yaml").write_text(yaml.safe_dump(config))
    state = taming_vqgan_state(params, seed)
    torch.save({"state_dict": state}, folder / "vqgan.ckpt")
    return state


LUMINA_HEADS = 2


def _lumina_model(folder: Path, seed: int):
    """The tiny Chameleon network (and the tokenizer files next to it). Its q/k LayerNorm rows
    are equal over the heads, as in every Lumina-mGPT checkpoint (one row, repeated by its class)."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    folder.mkdir(parents=True, exist_ok=True)
    vocab = lumina_vocabulary(seed)
    specials = [n for n in vocab if n.startswith("<")]
    text_vocab = dict(vocab)
    _word_level_tokenizer(text_vocab, specials).save(str(folder / "text_tokenizer.json"))
    write_vqgan(folder, seed=seed)
    config = ChameleonConfig(
        vocab_size=LUMINA_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=LUMINA_HEADS, num_key_value_heads=LUMINA_HEADS, max_position_embeddings=512,
        bos_token_id=0, pad_token_id=1, eos_token_id=2, vocabulary_map=vocab,
        vq_config={"embed_dim": 4, "num_embeddings": LUMINA_CODES, "latent_channels": 8, "resolution": 64,
                   "base_channels": 32, "channel_multiplier": [1, 2], "num_res_blocks": 1,
                   "attn_resolutions": []},
    )
    torch.manual_seed(seed)
    model = ChameleonForConditionalGeneration(config).eval()
    _peaked(model.lm_head.weight, model.model.embed_tokens.weight, head_scale=60.0)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for layer in model.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                heads, head_dim = norm.weight.shape
                norm.weight.copy_((1 + 0.3 * torch.randn(1, head_dim, generator=gen)).expand(heads, -1))
                norm.bias.copy_((0.2 * torch.randn(1, head_dim, generator=gen)).expand(heads, -1))
    return model


def build_lumina_transformers(folder: Path, seed: int = 0) -> Path:
    """Lumina-mGPT in transformers' layout (ChameleonForConditionalGeneration.save_pretrained)."""
    _lumina_model(folder, seed).save_pretrained(folder)
    return folder


def write_xllmx_config(folder: Path, cfg, vq_config: dict, transformers_version: str) -> None:
    """config.json and generation_config.json as the Lumina-mGPT authors' trainers save their
    ChameleonXLLMXConfig (1.0 and 2.0 alike): transformers' Chameleon keys, their own
    (model_parallel_size, swin_norm, z_loss_weight, mask_image_logits) and the vq_config they keep."""
    config = {
        "architectures": ["ChameleonXLLMXForConditionalGeneration"], "model_type": "chameleon",
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": cfg.bos_token_id, "dropout": 0.05,
        "eos_token_id": cfg.eos_token_id, "hidden_act": "silu", "hidden_size": cfg.hidden_size,
        "initializer_range": 0.02, "intermediate_size": cfg.intermediate_size, "mask_image_logits": False,
        "max_position_embeddings": cfg.max_position_embeddings, "mlp_bias": False, "model_parallel_size": 1,
        "num_attention_heads": cfg.num_attention_heads, "num_hidden_layers": cfg.num_hidden_layers,
        "num_key_value_heads": cfg.num_key_value_heads, "pad_token_id": cfg.pad_token_id, "qk_layernorm": True,
        "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0, "swin_norm": False,
        "tie_word_embeddings": False, "torch_dtype": "float32", "transformers_version": transformers_version,
        "use_cache": True, "vocab_size": cfg.vocab_size, "vq_config": vq_config, "z_loss_weight": 1e-05,
        "vocabulary_map": cfg.vocabulary_map,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    ids = {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id}
    (folder / "generation_config.json").write_text(json.dumps(
        {**{k: v for k, v in ids.items() if v is not None}, "transformers_version": transformers_version}))


def build_lumina(folder: Path, seed: int = 0) -> Path:
    """Lumina-mGPT in its own layout, as Alpha-VLLM/Lumina-mGPT-7B-* publish it (see module doc)."""
    from safetensors.torch import save_file

    model = _lumina_model(folder, seed)
    state = {}
    for key, value in model.state_dict().items():
        if key.startswith("model.vqmodel."):
            continue  # Lumina-mGPT's trainer deletes the VQ model before saving
        if key.endswith(("self_attn.q_norm.weight", "self_attn.q_norm.bias", "self_attn.k_norm.weight",
                         "self_attn.k_norm.bias")):
            value = value[:1]  # [model_parallel_size = 1, head_dim]
        state[key] = value.detach().clone().contiguous()
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    vq = dict(TINY_VQGAN, **TINY_VQGAN["ddconfig"])  # the converter: yaml params + ddconfig, old names kept
    vq.pop("ddconfig")
    for old, new in (("ch", "base_channels"), ("out_ch", "out_channels"), ("n_embed", "num_embeddings"),
                     ("ch_mult", "channel_multiplier"), ("double_z", "double_latent"),
                     ("z_channels", "latent_channels")):
        vq[new] = vq[old]
    write_xllmx_config(folder, model.config, vq, transformers_version="4.44.0")
    return folder


# --- Emu3 -------------------------------------------------------------------------------------
EMU3_CODES = 64
EMU3_SPECIALS = ["<|endoftext|>", "<|extra_203|>", "<|extra_204|>", "<|image start|>", "<|image end|>",
                 "<|image token|>", "<|extra_200|>", "<|extra_201|>", "<image>"]


def build_emu3(folder: Path, image_area: int = 48 * 48, seed: int = 0, width: int = 32, inner: int = 64) -> Path:
    """width / inner: the language model's hidden and MLP sizes (multiples of 32 by default, as the
    published checkpoints' are; others have no 4-bit group size)."""
    from transformers import Emu3Config, Emu3ForConditionalGeneration, Emu3ImageProcessor, Emu3Processor
    from transformers import PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    vocab: Dict[str, int] = {"<unk>": 0}
    for word in TEXT_WORDS + ["*", "lowres", "blurry"]:
        vocab.setdefault(word, len(vocab))
    for name in EMU3_SPECIALS:
        vocab[name] = len(vocab)
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(EMU3_CODES, generator=gen).tolist()  # visual ids in shuffled code order
    base = len(vocab)
    visual = {f"<|visual token {c:06d}|>": base + order[c] for c in range(EMU3_CODES)}
    vocab.update(visual)
    tok = _word_level_tokenizer(vocab, EMU3_SPECIALS + list(visual))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|extra_203|>", eos_token="<|extra_204|>", pad_token="<|endoftext|>",
        extra_special_tokens={"image_token": "<image>", "boi_token": "<|image start|>", "eoi_token": "<|image end|>",
                              "image_wrapper_token": "<|image token|>", "eof_token": "<|extra_201|>"},
    )
    image_processor = Emu3ImageProcessor(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])  # as BAAI's repo
    Emu3Processor(image_processor, tokenizer).save_pretrained(folder)
    config = Emu3Config(
        vq_config={"codebook_size": EMU3_CODES, "embed_dim": 4, "latent_channels": 4, "base_channels": 32,
                   "channel_multiplier": [1, 1, 1, 1], "num_res_blocks": 1, "attn_resolutions": [],
                   "hidden_size": 32, "num_attention_heads": 1},
        text_config={"vocab_size": len(vocab), "hidden_size": width, "intermediate_size": inner,
                     "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                     "max_position_embeddings": 512,
                     "pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
                     "eos_token_id": tokenizer.eos_token_id},
        vocabulary_map=dict(vocab), image_area=image_area,
    )
    torch.manual_seed(seed)
    model = Emu3ForConditionalGeneration(config).eval()
    _peaked(model.lm_head.weight, model.get_input_embeddings().weight, head_scale=60.0)
    model.save_pretrained(folder)
    return folder


# --- Janus-Pro --------------------------------------------------------------------------------
JANUS_CODES = 64
JANUS_SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<image_placeholder>",
                  "<begin_of_image>", "<end_of_image>", "<|User|>", "<|Assistant|>"]
JANUS_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] | capitalize }}|>: {% for c in m['content'] %}"
    "{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}\n\n{% endfor %}"
    "{% if add_generation_prompt %}<|Assistant|>:{% endif %}"
)


def build_janus(folder: Path, grid: int = 6, seed: int = 0) -> Path:
    from tokenizers import processors
    from transformers import (GenerationConfig, JanusConfig, JanusForConditionalGeneration, JanusImageProcessor,
                              JanusProcessor, PreTrainedTokenizerFast)

    folder.mkdir(parents=True, exist_ok=True)
    vocab: Dict[str, int] = {"<unk>": 0}
    for word in TEXT_WORDS:
        vocab.setdefault(word, len(vocab))
    for name in JANUS_SPECIALS:
        vocab[name] = len(vocab)
    tok = _word_level_tokenizer(vocab, JANUS_SPECIALS)
    bos = JANUS_SPECIALS[0]
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=JANUS_SPECIALS[1], pad_token=JANUS_SPECIALS[2],
        extra_special_tokens={"image_token": "<image_placeholder>", "boi_token": "<begin_of_image>",
                              "eoi_token": "<end_of_image>"},
    )
    pixels = grid * 16
    image_processor = JanusImageProcessor(size={"height": pixels, "width": pixels},  # mean/std as DeepSeek's repo
                                          image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    processor = JanusProcessor(image_processor, tokenizer,
                               chat_template=JANUS_CHAT_TEMPLATE, num_image_tokens=grid * grid)
    processor.save_pretrained(folder)
    config = JanusConfig(
        text_config={"model_type": "llama", "vocab_size": len(vocab), "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
                     "max_position_embeddings": 512, "bos_token_id": tokenizer.bos_token_id,
                     "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id},
        vision_config={"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": pixels,
                       "patch_size": 16, "projection_dim": 32, "num_image_tokens": grid * grid, "mlp_ratio": 2.0},
        vq_config={"num_embeddings": JANUS_CODES, "embed_dim": 8, "latent_channels": 32, "base_channels": 32,
                   "channel_multiplier": [1, 1, 1, 1, 1], "num_res_blocks": 1, "projection_dim": 32,
                   "image_token_embed_dim": 32, "num_hidden_layers": 2},
        image_token_id=vocab["<image_placeholder>"],
    )
    torch.manual_seed(seed)
    model = JanusForConditionalGeneration(config).eval()
    _peaked(model.model.generation_head.vision_head.weight, model.model.generation_embeddings.weight, 20.0)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(3.0)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        generation_kwargs={"boi_token_id": vocab["<begin_of_image>"]}, guidance_scale=5.0,
    )
    model.save_pretrained(folder)
    return folder


# --- Lumina-mGPT 2.0 ------------------------------------------------------------------------------
# The real ids the authors' code hard-codes: MoVQGAN code c at 155000 + c (16384 codes), <racm3:break>
# = 151665, <eoss> = 151666 (their stop token), <reserved08799> = 151670 (their decode drops it as the
# end-of-line), after the Qwen2.5 tokenizer's 151643 <|endoftext|> and its specials. Every other name
# (the size tokens <reserved08800+n>, the turn separator <reserved08706>) sits at an id of ours:
# the loader finds them by name, as the authors' code does.
LUMINA2_OFFSET = 155000
LUMINA2_CODES = 16384
LUMINA2_VOCAB = 172032  # > 155000 + 16384; the width is tiny instead (hidden 32)
LUMINA2_HEADS = 2


def lumina2_vocabulary() -> Dict[str, int]:
    vocab = {"<unk>": 0}
    for i, word in enumerate(TEXT_WORDS):
        vocab[word] = 1000 + i  # far from len(vocab): the authors' processor adds "<|image|>" at that id
    vocab.update({"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
                  "<racm3:break>": 151665, "<eoss>": 151666})
    for n in range(8796, 8900):  # <reserved08796> .. <reserved08899>: 08799 = EOL, 08800 + n = n grids of 32 px
        vocab[f"<reserved{n:05d}>"] = 151667 + n - 8796
    vocab["<reserved08706>"] = 151800  # the turn separator of the authors' Conversation template
    return vocab


# MoVQGAN's ddconfig (ai-forever's 270M: ch 256, ch_mult 1 2 2 4, 2 res blocks, attention at 32 of a
# nominal 256) made tiny, keeping what decides the key layout: 8x downsampling, attention at the
# coarsest level, a width change, 16384 codes of 4 channels.
TINY_MOVQ = {"n_embed": LUMINA2_CODES, "embed_dim": 4,
             "ddconfig": {"double_z": False, "z_channels": 4, "resolution": 64, "in_channels": 3, "out_ch": 3,
                          "ch": 32, "ch_mult": [1, 1, 1, 2], "num_res_blocks": 1, "attn_resolutions": [8],
                          "dropout": 0.0}}


def movqgan_state(params: dict = TINY_MOVQ, seed: int = 0) -> Dict[str, torch.Tensor]:
    """A random state dict under MoVQGAN's key names (movqgan/models/vqgan.py MOVQ with its
    MOVQDecoder: every norm a SpatialNorm of norm_layer, conv_y, conv_b), written out from its naming
    scheme (not from our module), with encoder and quant_conv keys a decoder must skip."""
    tensors = RandomTensors(seed)
    zq = params["embed_dim"]

    def spatial_norm(name: str, c: int) -> None:
        tensors.group_norm(f"{name}.norm_layer", c)
        tensors.conv(f"{name}.conv_y", zq, c, 1, bias_mean=1.0)
        tensors.conv(f"{name}.conv_b", zq, c, 1)

    taming_vq_tensors(params, tensors, norm=spatial_norm)
    return tensors.state


def write_movqgan(path: Path, params: dict = TINY_MOVQ, seed: int = 0) -> Dict[str, torch.Tensor]:
    """movqgan_270M.ckpt as ai-forever publishes it: the state dict itself, torch.save'd."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = movqgan_state(params, seed)
    torch.save(state, path)
    return state


def build_lumina2(folder: Path, seed: int = 0) -> Path:
    """Lumina-mGPT 2.0 as Alpha-VLLM/Lumina-mGPT-2.0 holds it, by its authors' code: their trainer's
    save_pretrained of their Chameleon class (config keys of their ChameleonXLLMXConfig, q/k
    LayerNorm rows [model_parallel_size = 1, head_dim], no model.vqmodel.* weights), an HF tokenizer
    (tokenizer.json + tokenizer_config.json, no bos token: the authors' code then starts with eos),
    and movqgan_270M.ckpt beside them (where this project tells users to put it). No pad token: the
    authors' generate masks out every prompt token equal to the pad id, and with pad = <|endoftext|>
    (the eos their prompt starts with when the tokenizer has no bos) it would hide that first token,
    which their training shows the model (docs/models.md, "Lumina-mGPT 2.0")."""
    from safetensors.torch import save_file
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    folder.mkdir(parents=True, exist_ok=True)
    vocab = lumina2_vocabulary()
    specials = [n for n in vocab if n.startswith("<")]
    _word_level_tokenizer(vocab, specials).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>", "unk_token": "<unk>", "clean_up_tokenization_spaces": False,
        "model_max_length": 131072}))
    write_movqgan(folder / "movqgan_270M.ckpt", seed=seed)
    config = ChameleonConfig(
        vocab_size=LUMINA2_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=LUMINA2_HEADS, num_key_value_heads=LUMINA2_HEADS, max_position_embeddings=1024,
        bos_token_id=151643, pad_token_id=None, eos_token_id=151643, vocabulary_map=vocab,
    )
    torch.manual_seed(seed)
    model = ChameleonForConditionalGeneration(config).eval()
    _peaked(model.lm_head.weight, model.model.embed_tokens.weight, head_scale=60.0)
    gen = torch.Generator().manual_seed(seed + 1)
    state = {}
    for key, value in model.state_dict().items():
        if key.startswith("model.vqmodel."):
            continue  # the authors' trainer deletes the VQ model before saving
        if key.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):
            value = 1 + 0.3 * torch.randn(1, value.shape[1], generator=gen)  # [model_parallel_size, head_dim]
        elif key.endswith(("self_attn.q_norm.bias", "self_attn.k_norm.bias")):
            value = 0.2 * torch.randn(1, value.shape[1], generator=gen)
        state[key] = value.detach().clone().contiguous()
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    write_xllmx_config(folder, model.config, transformers_version="4.46.2", vq_config={
        "embed_dim": 256, "num_embeddings": 8192, "double_latent": False, "latent_channels": 256,
        "resolution": 512, "in_channels": 3, "base_channels": 128,
        "channel_multiplier": [1, 1, 2, 2, 4], "num_res_blocks": 2, "attn_resolutions": None,
        "dropout": 0.0, "attn_type": "vanilla", "initializer_range": 0.02})
    return folder


BUILDERS = {"lumina_mgpt": build_lumina, "emu3": build_emu3, "janus": build_janus, "lumina_mgpt2": build_lumina2}
# Every on-disk layout load_model must read (Lumina-mGPT in both of its layouts).
LAYOUT_BUILDERS = {**BUILDERS, "lumina_mgpt_transformers": build_lumina_transformers}


def describe(folder: Path) -> str:
    return json.dumps(sorted(p.name for p in folder.iterdir()))


# --- Emu3 as BAAI/Emu3-Gen-hf publishes it ------------------------------------------------------
def _byte_to_char() -> Dict[int, str]:
    """GPT-2's byte -> printable character table (byte-level BPE)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def build_emu3_hub(folder: Path, seed: int = 0, shards: int = 2) -> Path:
    """Emu3 in the layout of BAAI/Emu3-Gen-hf (transformers' converter, convert_emu3_weights_to_hf.py,
    at transformers 4.48): a byte-level BPE tokenizer saved as GPT2Tokenizer (vocab.json, merges.txt,
    tokenizer.json, tokenizer_config.json with extra_special_tokens, special_tokens_map.json), the
    image processor in preprocessor_config.json, a chat_template.json, config.json in 4.48's keys
    (torch_dtype, text_config with rope_scaling; no image_area - the loader's default 720x720 area
    applies, so tests shrink DEFAULT_IMAGE_AREA), and the weights in shards + index under the
    4.48 class's names (text_model.model.*, text_model.lm_head.weight, vqmodel.*).
    The same network as build_emu3(seed) except for the token ids (another tokenizer)."""
    from safetensors.torch import load_file, save_file
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    folder.mkdir(parents=True, exist_ok=True)
    byte_chars = _byte_to_char()
    vocab: Dict[str, int] = {byte_chars[b]: b for b in range(256)}  # tiktoken's first 256 ranks
    merges: List[str] = []
    space = byte_chars[ord(" ")]
    for word in TEXT_WORDS + ["lowres", "blurry"]:
        for form in (word, space + word):
            for i in range(2, len(form) + 1):
                left, right = form[: i - 1], form[i - 1]
                if form[:i] not in vocab:
                    merges.append(f"{left} {right}")
                    vocab[form[:i]] = len(vocab)
    specials = list(EMU3_SPECIALS)
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(EMU3_CODES, generator=gen).tolist()
    base = len(vocab) + len(specials)
    visual = {f"<|visual token {c:06d}|>": base + order[c] for c in range(EMU3_CODES)}
    added = {name: len(vocab) + i for i, name in enumerate(specials)}
    added.update(visual)
    full_vocab = dict(vocab, **added)
    added_tokens = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                     "normalized": False, "special": True} for t, i in sorted(added.items(), key=lambda x: x[1])]
    tokenizer_json = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens, "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "vocab": full_vocab, "merges": merges},
    }
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json, ensure_ascii=False))
    (folder / "vocab.json").write_text(json.dumps(full_vocab, ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges))
    special_map = {"bos_token": "<|extra_203|>", "eos_token": "<|extra_204|>", "pad_token": "<|endoftext|>"}
    (folder / "special_tokens_map.json").write_text(json.dumps(special_map))
    extra = {"image_token": "<image>", "boi_token": "<|image start|>", "eoi_token": "<|image end|>",
             "image_wrapper_token": "<|image token|>", "eof_token": "<|extra_201|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "add_prefix_space": False, "added_tokens_decoder": {str(t["id"]): {k: v for k, v in t.items() if k != "id"}
                                                            for t in added_tokens},
        **special_map, "clean_up_tokenization_spaces": False, "extra_special_tokens": extra,
        "model_max_length": 1000000000000000019884624838656, "padding_side": "left",
        "processor_class": "Emu3Processor", "tokenizer_class": "GPT2Tokenizer",
    }))
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Emu3ImageProcessor", "image_std": [0.5, 0.5, 0.5],
        "max_pixels": 1048576, "min_pixels": 262144, "processor_class": "Emu3Processor", "resample": 3,
        "rescale_factor": 0.00392156862745098, "spatial_factor": 8,
    }))
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": (
        "{% for message in messages %}{{ message['role'].upper() + ': ' }}{% for c in message['content'] %}"
        "{% if c['type'] == 'text' %}{{ c['text'] + ' ' }}{% endif %}{% endfor %}{% endfor %}"
        "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}")}))
    ids = {name: full_vocab[name] for name in ("<|extra_203|>", "<|extra_204|>", "<|endoftext|>")}
    config = Emu3Config(
        vq_config={"codebook_size": EMU3_CODES, "embed_dim": 4, "latent_channels": 4, "base_channels": 32,
                   "channel_multiplier": [1, 1, 1, 1], "num_res_blocks": 1, "attn_resolutions": [],
                   "hidden_size": 32, "num_attention_heads": 1},
        text_config={"vocab_size": len(full_vocab), "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                     "max_position_embeddings": 512, "pad_token_id": ids["<|endoftext|>"],
                     "bos_token_id": ids["<|extra_203|>"], "eos_token_id": ids["<|extra_204|>"]},
        vocabulary_map=dict(full_vocab),
    )
    torch.manual_seed(seed)
    model = Emu3ForConditionalGeneration(config).eval()
    _peaked(model.lm_head.weight, model.get_input_embeddings().weight, head_scale=60.0)
    model.save_pretrained(folder)  # writes the 4.48 names (text_model.model.*, vqmodel.*)
    # Shards + index, as the hub repo holds them (8 shards there).
    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    keys = sorted(state)
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: state[k] for k in keys[i::shards]}
        save_file(part, str(folder / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, name))
    total = sum(v.numel() * v.element_size() for v in state.values())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    # config.json in transformers 4.48's keys, as the hub's config.json has them.
    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("image_area", None)
    cfg["torch_dtype"] = cfg.pop("dtype", "float32")
    text = cfg["text_config"]
    rope = text.pop("rope_parameters", None) or {}
    text["rope_scaling"] = {"rope_type": rope.get("rope_type", "default")}
    text["rope_theta"] = rope.get("rope_theta", 1000000.0)
    text["model_type"] = "emu3_text_model"
    cfg["transformers_version"] = "4.48.0.dev0"
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({
        "do_sample": True, "eos_token_id": ids["<|extra_204|>"], "max_new_tokens": 50000,
        "pad_token_id": ids["<|endoftext|>"], "top_k": 2048, "transformers_version": "4.48.0.dev0"}))
    return folder
