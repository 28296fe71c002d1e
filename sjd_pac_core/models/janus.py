"""Janus-Pro (deepseek-community/Janus-Pro-1B / -7B): transformers' JanusForConditionalGeneration.

Image generation bypasses the text vocabulary: image codes are embedded with
`prepare_embeddings_for_image_generation` and scored by `model.model.generation_head`, so the
sampler's token space is the VQ codebook itself (16384 codes) and there are no forced tokens: a
24x24 grid (384x384 pixels), 576 tokens, no end-of-line.

Prompt: the chat template with the user's text, then the processor in `generation_mode="image"`
(appends the begin-of-image token). CFG (as JanusForConditionalGeneration.generate): the
unconditional row is the same prompt with every token except BOS and begin-of-image replaced by pad.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import torch
from PIL import Image
from transformers import JanusConfig, JanusForConditionalGeneration, JanusProcessor

from .adapters import GenerationHeadAdapter
from .kept_parts import keep_what_sampling_uses
from .hf_common import (LoadOptions, free_model, load_pretrained, postprocess_to_pil, preview_image,
                        render_chat_template, require_any, short)
from .image_model import ARImageModel, FamilyDefaults, ImageLayout, PromptEncoding
from .checks import ModelLoadError, require_safetensors
from .config_checks import built_config, meta_model
from .memory import FamilyShape, census

REPO_HINT = "deepseek-community/Janus-Pro-7B (or -1B)"
TEMPLATE_FIX = f"download chat_template.jinja and the processor files of {REPO_HINT} again."


def user_message(text: str) -> list:
    """The chat the prompt is sent as: one user turn holding the text."""
    return [{"role": "user", "content": [{"type": "text", "text": text}]}]


class JanusImageModel(ARImageModel):
    family = "janus"
    supports_device_map = True

    def __init__(self, model: JanusForConditionalGeneration, processor: JanusProcessor) -> None:
        self.model = model
        self.processor = processor
        vq = model.config.vq_config
        grid = self.image_grid(model.config, Path("config.json"))
        self.num_codes = vq.num_embeddings
        pixels = grid * 2 ** (len(vq.channel_multiplier) - 1)
        self.resolution = f"{pixels}x{pixels}"
        self.layout = ImageLayout(rows=grid, cols=grid)
        self.constraints = self.layout.constraints(self.num_codes, torch.arange(self.num_codes))
        tok = processor.tokenizer
        gen = model.generation_config
        boi = (getattr(gen, "generation_kwargs", None) or {}).get("boi_token_id")
        self.bos_id = gen.bos_token_id if gen.bos_token_id is not None else tok.bos_token_id
        self.boi_id = boi if boi is not None else tok.convert_tokens_to_ids(tok.boi_token)
        self.pad_id = gen.pad_token_id if gen.pad_token_id is not None else tok.pad_token_id
        if None in (self.bos_id, self.boi_id, self.pad_id):
            raise ModelLoadError(
                f"The Janus tokenizer/generation config lacks BOS, begin-of-image or pad; download "
                f"generation_config.json and the tokenizer files of {REPO_HINT} again."
            )
        self.defaults = FamilyDefaults(resolutions=(self.resolution,), sampler=self.SAMPLER_DEFAULTS)
        self.token_model = GenerationHeadAdapter(model, self.num_codes)

    # Reference settings (JanusForConditionalGeneration.generate / Janus-Pro demo): CFG 5,
    # temperature 1, no top-k.
    SAMPLER_DEFAULTS = dict(cfg_scale=5.0, temperature=1.0)

    # --- loading ------------------------------------------------------------------------------
    QUANTIZED_LAYERS = r"model\.language_model\.layers"  # the decoder layers: the only quantized linears
    # Image understanding's SigLIP encoder and aligner, and the VQ encoder (pixels come from the VQ
    # decoder alone): generation never runs them. Dropped after loading, before the move to the
    # device (kept_parts.drop_modules says why not before). The generation embeddings, aligner
    # and head and the VQ decoder stay.
    UNUSED_MODULES = ("model.vision_model", "model.aligner", "model.vqmodel.encoder", "model.vqmodel.quant_conv")

    @classmethod
    def matches(cls, folder: Path, config: dict) -> bool:
        return config.get("model_type") == "janus"

    @classmethod
    def memory_shape(cls, config: dict, folder: Optional[Path] = None) -> FamilyShape:
        """The plan's view of this config (the model is built on the meta device: no memory). The
        text LM head is never used for images: none of its rows is kept; the text embedding only
        embeds the prompt: none of its rows is on the device."""
        path = (folder or Path(".")) / "config.json"
        cfg = built_config(JanusConfig, config, path)
        grid = cls.image_grid(cfg, path)
        model = meta_model(JanusForConditionalGeneration, cfg, path)
        text = cfg.text_config
        pixels = grid * 2 ** (len(cfg.vq_config.channel_multiplier) - 1)
        return FamilyShape(
            family="janus", weights=census(model, cls.QUANTIZED_LAYERS, head=("lm_head", 0),
                                           embedding=("model.language_model.embed_tokens", 0),
                                           unused=cls.UNUSED_MODULES),
            layers=text.num_hidden_layers, heads=text.num_attention_heads, kv_heads=text.num_key_value_heads,
            head_dim=getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads,
            hidden=text.hidden_size, intermediate=text.intermediate_size, sampler_vocab=cfg.vq_config.num_embeddings,
            image_tokens={f"{pixels}x{pixels}": grid * grid},
        )

    @staticmethod
    def image_grid(cfg: JanusConfig, path: Path) -> int:
        """Codes per side of the image: image_size / patch_size, which num_image_tokens must square."""
        vision = cfg.vision_config
        grid = vision.image_size // vision.patch_size
        if grid < 1 or grid * grid != vision.num_image_tokens:
            raise ModelLoadError(
                f"{path} is inconsistent (vision_config: image_size {vision.image_size} / patch_size "
                f"{vision.patch_size} gives a {grid}x{grid} grid, but num_image_tokens is "
                f"{vision.num_image_tokens}); download config.json of {REPO_HINT} again."
            )
        return grid

    @classmethod
    def load(
        cls, folder: Path, config: dict, dtype: torch.dtype, device: torch.device, options: Optional[LoadOptions] = None
    ) -> "JanusImageModel":
        fix = f"download the tokenizer and processor files of {REPO_HINT} into the folder."
        require_any(folder, ["tokenizer.json", "tokenizer.model"], "tokenizer files", fix)
        require_any(folder, ["processor_config.json", "preprocessor_config.json"], "processor config", fix)
        require_safetensors(folder, REPO_HINT)
        try:
            processor = JanusProcessor.from_pretrained(folder)
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            raise ModelLoadError(f"The Janus processor in {folder} cannot be loaded ({short(exc)}); {fix}") from None
        if processor.chat_template is not None:  # a template that fails or never ends, found before the weights
            render_chat_template(processor, user_message("a red cat on a blue field"), TEMPLATE_FIX)
        # Image codes bypass the text vocabulary: no row of the text head is kept, and the text
        # embedding (the prompt's) stays in CPU memory.
        model = load_pretrained(JanusForConditionalGeneration, folder, dtype, device, options,
                                unused=cls.UNUSED_MODULES,
                                prepare=lambda m: keep_what_sampling_uses(m, torch.zeros(0, dtype=torch.long)))
        return cls(model, processor)

    # --- prompts ------------------------------------------------------------------------------
    def encode_prompt(self, prompt: str, negative_prompt: str = "", resolution: Optional[str] = None) -> PromptEncoding:
        resolution = self.check_resolution(resolution)
        text = prompt.strip()
        if self.processor.chat_template is not None:
            text = render_chat_template(self.processor, user_message(text), TEMPLATE_FIX)
        ids = torch.as_tensor(self.processor(text=text, generation_mode="image")["input_ids"][0]).long().reshape(-1)
        keep = (ids == self.bos_id) | (ids == self.boi_id)
        warnings: List[str] = []
        if negative_prompt.strip():
            warnings.append(
                "Janus-Pro ignores negative prompts; guidance uses the padded prompt, as its reference code does."
            )
        return PromptEncoding(
            prompt_ids=ids,
            uncond_ids=torch.where(keep, ids, torch.full_like(ids, self.pad_id)),
            layout=self.layout,
            constraints=self.constraints,
            resolution=resolution,
            warnings=warnings,
        )

    # --- pixels -------------------------------------------------------------------------------
    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, resolution: Optional[str] = None) -> List[Image.Image]:
        codes = self.check_image_tokens(self.decode_rows(tokens), self.layout, (0, self.num_codes), self.resolution)
        device = self.model.model.vqmodel.quantize.embedding.weight.device
        pixels = self.model.decode_image_tokens(codes.to(device))  # [B, H, W, 3]
        # Channels first: the processor's PIL backend (used without torchvision) misreads channels-last input.
        return postprocess_to_pil(self.processor, pixels.permute(0, 3, 1, 2))

    def preview(self, tokens: torch.Tensor, resolution: Optional[str] = None) -> Optional[Image.Image]:
        return preview_image(self.decode, self.layout, tokens, self.resolution)

    def unload(self) -> None:
        free_model(self.model)
