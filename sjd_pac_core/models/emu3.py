"""Emu3 (BAAI/Emu3-Gen-hf): transformers' Emu3ForConditionalGeneration, Emu3Processor, Emu3VQVAE.

Sequence (transformers' Emu3 image-generation example and test):
    <bos> prompt <|image start|> "{h}*{w}" <|image token|>          <- prompt, from Emu3Processor
    (w visual tokens, EOL <|extra_200|>) x h, EOF <|extra_201|>, <|image end|>, <eos>   <- sampled
h*(w+1)+3 tokens, exactly what `decode_image_tokens` wants. CFG's unconditional stream is the
negative prompt through the same processor call (the reference's default negative prompt when
none is given).

Resolutions: aspect ratios at the checkpoint's image area (config.json `image_area`, which the
original Emu3-Gen config carries; 720x720 = 518400 otherwise). The sampler's token space is the
visual tokens in code order (sampler id c = VQ code c), then EOL, EOF, end-of-image, EOS.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import torch
from PIL import Image
from transformers import Emu3Config, Emu3ForConditionalGeneration, Emu3Processor

from .adapters import ImageHeadAdapter
from .kept_parts import keep_what_sampling_uses
from .hf_common import LoadOptions, free_model, load_pretrained, postprocess_to_pil, preview_image, require_any, short
from .image_model import ARImageModel, FamilyDefaults, ImageLayout, PromptEncoding
from .checks import ModelLoadError, require_safetensors
from .config_checks import built_config, meta_model
from .memory import FamilyShape, census
from .sizes import EMU3_RESOLUTIONS

REPO_HINT = "BAAI/Emu3-Gen-hf"
DEFAULT_IMAGE_AREA = 720 * 720
RATIOS = ("1:1", "4:3", "3:4", "16:9", "9:16")  # their sizes at the default area: sizes.EMU3_RESOLUTIONS
PROCESSOR_PIXELS_PER_TOKEN = 8  # Emu3Processor.downsample_ratio: its token grid for a ratio and an area
# Emu3's reference negative prompt (BAAI/Emu3-Gen image_generation.py).
DEFAULT_NEGATIVE_PROMPT = (
    "lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, "
    "cropped, worst quality, low quality, normal quality, jpeg artifacts, signature, watermark, "
    "username, blurry."
)


@dataclass(frozen=True)
class Emu3Size:
    ratio: str
    rows: int  # visual tokens per column (h)
    cols: int  # visual tokens per row (w)


class Emu3ImageModel(ARImageModel):
    family = "emu3"
    supports_device_map = True

    def __init__(self, model: Emu3ForConditionalGeneration, processor: Emu3Processor, image_area: int) -> None:
        self.model = model
        self.processor = processor
        self.image_area = image_area
        self.token_space = self.sampler_ids(model, processor)
        num_codes = self.num_codes = len(self.token_space) - 4
        self.eol_id = num_codes  # sampler ids of EOL, EOF, EOI, EOS follow the codes
        self.tail = (num_codes + 1, num_codes + 2, num_codes + 3)
        vq_factor = 2 ** (len(model.config.vq_config.channel_multiplier) - 1)
        self.sizes: Dict[str, Emu3Size] = {}
        for ratio in RATIOS:
            rows, cols = processor.calculate_generate_size(ratio, image_area, processor.downsample_ratio)
            self.sizes.setdefault(f"{cols * vq_factor}x{rows * vq_factor}", Emu3Size(ratio, rows, cols))
        self.defaults = FamilyDefaults(resolutions=tuple(self.sizes), sampler=self.SAMPLER_DEFAULTS)
        self.token_model = ImageHeadAdapter(model, model.model, self.token_space)
        self._last_resolution: Optional[str] = None

    @staticmethod
    def sampler_ids(model: Emu3ForConditionalGeneration, processor: Emu3Processor) -> torch.Tensor:
        """The model ids of the sampler's token space: the visual tokens in code order, then
        end-of-line, end-of-frame, end-of-image, end-of-sequence."""
        tok = processor.tokenizer
        mapping = model.vocabulary_mapping
        img2bpe = mapping.img2bpe
        num_codes = len(img2bpe)
        if sorted(img2bpe) != list(range(num_codes)) or num_codes != model.config.vq_config.codebook_size:
            raise ModelLoadError(
                f"config.json names {num_codes} visual tokens but the VQ codebook has "
                f"{model.config.vq_config.codebook_size} codes; download config.json of {REPO_HINT} again."
            )
        specials = [mapping.eol_token_id, tok.eof_token_id, tok.convert_tokens_to_ids(tok.eoi_token), tok.eos_token_id]
        if any(s is None for s in specials):
            raise ModelLoadError(
                f"The Emu3 tokenizer lacks end-of-line/end-of-image tokens; download the tokenizer and "
                f"processor files of {REPO_HINT} again."
            )
        return torch.tensor([img2bpe[c] for c in range(num_codes)] + specials, dtype=torch.long)

    # Reference settings (Emu3-Gen README): CFG 3.0, top-k 2048, temperature 1.0.
    SAMPLER_DEFAULTS = dict(cfg_scale=3.0, temperature=1.0, top_k=2048)

    # --- loading ------------------------------------------------------------------------------
    QUANTIZED_LAYERS = r"model\.text_model\.layers"  # the decoder layers: the only quantized linears
    # Pixels come from the VQ decoder alone (decode_image_tokens: codebook, post-quant convolution,
    # decoder); the encoder only turns input images into codes. Dropped after loading, before the
    # move to the device (kept_parts.drop_modules says why not before).
    UNUSED_MODULES = ("model.vqmodel.encoder", "model.vqmodel.quant_conv")

    @classmethod
    def matches(cls, folder: Path, config: dict) -> bool:
        return config.get("model_type") == "emu3"

    @classmethod
    def memory_shape(cls, config: dict, folder: Optional[Path] = None) -> FamilyShape:
        """The plan's view of this config (the model is built on the meta device: no memory)."""
        path = (folder or Path(".")) / "config.json"
        area = cls.image_area(config, path)
        cfg = built_config(Emu3Config, dict(config, vocabulary_map=config.get("vocabulary_map") or {}), path)
        model = meta_model(Emu3ForConditionalGeneration, cfg, path)
        codes = cfg.vq_config.codebook_size
        text = cfg.text_config
        factor = 2 ** (len(cfg.vq_config.channel_multiplier) - 1)
        if area == DEFAULT_IMAGE_AREA:
            grids = [(int(r.split("x")[1]) // factor, int(r.split("x")[0]) // factor) for r in EMU3_RESOLUTIONS]
        else:  # the square size at this area (the processor knows the other ratios)
            side = round(area ** 0.5) // factor
            grids = [(side, side)]
        return FamilyShape(
            family="emu3", weights=census(model, cls.QUANTIZED_LAYERS, head=("lm_head", codes + 4),
                                          embedding=("model.text_model.embed_tokens", codes + 4),
                                          unused=cls.UNUSED_MODULES),
            layers=text.num_hidden_layers, heads=text.num_attention_heads, kv_heads=text.num_key_value_heads,
            head_dim=getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads,
            hidden=text.hidden_size, intermediate=text.intermediate_size, sampler_vocab=codes + 4,
            image_tokens={f"{cols * factor}x{rows * factor}": rows * (cols + 1) + 3 for rows, cols in grids},
        )

    @staticmethod
    def image_area(config: dict, path: Path) -> int:
        """config.json's image_area (720x720 where it sets none), checked: every ratio the family
        offers must be at least one token high and wide there (the processor's rounding, at its
        8 pixels per token), or the first prompt fails deep inside transformers."""
        area = config.get("image_area", DEFAULT_IMAGE_AREA)
        if isinstance(area, bool) or not isinstance(area, int) or area < 1:
            raise ModelLoadError(f"{path} sets image_area to {area!r}, which is not a whole number of pixels >= 1; "
                                 f"download config.json of {REPO_HINT} again.")
        for ratio in RATIOS:
            width, height = map(int, ratio.split(":"))
            scale = (area / (width * height)) ** 0.5 / PROCESSOR_PIXELS_PER_TOKEN
            if min(round(width * scale), round(height * scale)) < 1:
                raise ModelLoadError(f"{path} sets image_area to {area:,} pixels, too small for a {ratio} image of one "
                                     f"token per side; download config.json of {REPO_HINT} again.")
        return area

    @classmethod
    def load(
        cls, folder: Path, config: dict, dtype: torch.dtype, device: torch.device, options: Optional[LoadOptions] = None
    ) -> "Emu3ImageModel":
        fix = f"download the tokenizer and processor files of {REPO_HINT} into the folder."
        require_any(folder, ["tokenizer.json", "vocab.json"], "tokenizer files", fix)
        require_any(folder, ["processor_config.json", "preprocessor_config.json"], "processor config", fix)
        if not isinstance(config.get("vocabulary_map"), dict):
            raise ModelLoadError(
                f"{folder / 'config.json'} has no vocabulary_map; download config.json of {REPO_HINT} again."
            )
        require_safetensors(folder, REPO_HINT)
        try:
            processor = Emu3Processor.from_pretrained(folder)
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            raise ModelLoadError(f"The Emu3 processor in {folder} cannot be loaded ({short(exc)}); {fix}") from None
        model = load_pretrained(Emu3ForConditionalGeneration, folder, dtype, device, options,
                                unused=cls.UNUSED_MODULES,
                                prepare=lambda m: keep_what_sampling_uses(m, cls.sampler_ids(m, processor)))
        return cls(model, processor, cls.image_area(config, folder / "config.json"))

    # --- prompts ------------------------------------------------------------------------------
    def layout(self, resolution: str) -> ImageLayout:
        size = self.sizes[resolution]
        return ImageLayout(rows=size.rows, cols=size.cols, row_end=self.eol_id, tail=self.tail)

    def _ids(self, text: str, size: Emu3Size) -> torch.Tensor:
        out = self.processor(
            text=text, return_for_image_generation=True, ratio=size.ratio, image_area=self.image_area
        )
        if [list(s) for s in out["image_sizes"]] != [[size.rows, size.cols]]:
            raise ValueError(f"Emu3Processor chose {out['image_sizes']} tokens, expected {size}.")
        return torch.as_tensor(out["input_ids"][0]).long().reshape(-1)

    def encode_prompt(self, prompt: str, negative_prompt: str = "", resolution: Optional[str] = None) -> PromptEncoding:
        resolution = self.check_resolution(resolution)
        self._last_resolution = resolution  # what preview() shows when not told
        size = self.sizes[resolution]
        layout = self.layout(resolution)
        return PromptEncoding(
            prompt_ids=self._ids(prompt, size),
            uncond_ids=self._ids(negative_prompt.strip() or DEFAULT_NEGATIVE_PROMPT, size),
            layout=layout,
            constraints=layout.constraints(self.token_model.vocab_size, torch.arange(self.num_codes)),
            resolution=resolution,
        )

    # --- pixels -------------------------------------------------------------------------------
    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, resolution: Optional[str] = None) -> List[Image.Image]:
        rows = self.decode_rows(tokens)
        resolution = self.resolution_for(rows.shape[-1], resolution, self.layout)
        size = self.sizes[resolution]
        self.check_image_tokens(rows, self.layout(resolution), (0, self.num_codes), resolution)
        bpe = self.token_space[rows]  # back to the model's ids
        device = self.model.model.vqmodel.quantize.embedding.weight.device
        pixels = self.model.decode_image_tokens(image_tokens=bpe.to(device), height=size.rows, width=size.cols)
        return postprocess_to_pil(self.processor, pixels)

    def preview(self, tokens: torch.Tensor, resolution: Optional[str] = None) -> Optional[Image.Image]:
        resolution = self.check_resolution(resolution or self._last_resolution)
        return preview_image(self.decode, self.layout(resolution), tokens, resolution)

    def unload(self) -> None:
        self.token_model.release()
        free_model(self.model)
