"""Lumina-mGPT (Alpha-VLLM/Lumina-mGPT-7B-512/768/1024): Chameleon weights + Meta's VQGAN.

Sequence (Lumina-mGPT's FlexARItemProcessor and inference_solver):
    <s> "Generate an image of 768x768 according to the following prompt:\\n{prompt}" <reserved08706>
    <racm3:break> <reserved08800+H/32> <reserved08800+W/32>      <- prompt (forced, so fed, not sampled)
    (W/16 image tokens, <reserved08799> end-of-line) x H/16  <eoss>   <- sampled (EOL and <eoss> forced)
The unconditional stream for CFG is the image part alone: <racm3:break> h w, then the same tokens.

Token ids come from the checkpoint's `vocabulary_map` (config.json) by name, never hard-coded; the
image codes are the `IMGIMG...` names (digits spelled with A-J), exactly as transformers and
Lumina-mGPT decode them. The sampler works in a token space of the codes in code order (sampler
id c is VQ code c) plus end-of-line and end-of-image.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
from PIL import Image
from transformers import ChameleonForConditionalGeneration

from .adapters import ImageHeadAdapter
from .chameleon_vqgan import ChameleonVQGANDecoder, VQGANConfig, VQGANLoadError, load_chameleon_vqgan
from .hf_common import free_model, load_pretrained, pixels_to_pil, preview_image, short
from .image_model import ARImageModel, FamilyDefaults, ImageLayout, PromptEncoding
from .loader import ModelLoadError, require_safetensors

REPO_HINT = "Alpha-VLLM/Lumina-mGPT-7B-768 (or -512 / -1024)"
# Square sizes Lumina-mGPT checkpoints are trained for; a checkpoint's own size (from its folder
# name, e.g. lumina-mgpt-7b-768) comes first and is the default.
LUMINA_SIZES: Tuple[int, ...] = (768, 512, 1024)
PROMPT_TEMPLATE = "Generate an image of {size}x{size} according to the following prompt:\n{prompt}"
# Where the Chameleon tokenizer files may sit, relative to the model folder.
VQGAN_DIRS = (".", "chameleon", "tokenizer", "chameleon/tokenizer", "ckpts/chameleon/tokenizer")
VQGAN_FIX = (
    "copy vqgan.yaml, vqgan.ckpt and text_tokenizer.json from Lumina-mGPT's "
    "ckpts/chameleon/tokenizer/ folder (Meta's Chameleon tokenizer) into the model folder."
)

BOS, IMAGE_START, IMAGE_END, END_OF_LINE, END_OF_TURN = "<s>", "<racm3:break>", "<eoss>", "<reserved08799>", "<reserved08706>"
# Lumina-mGPT's size tokens: <reserved{8800 + n:05d}> for n grids of 32 pixels (= 2 codes).
PIXELS_PER_GRID = 32


def grid_token_name(n_grids: int) -> str:
    return f"<reserved{8800 + n_grids:05d}>"


def image_code_of(name: str) -> int:
    """'IMGIMG' + the code's digits spelled with A-J + one final character -> the code."""
    return int("".join(str(ord(c) - ord("A")) for c in name[len("IMGIMG") : -1]))


def find_vqgan_dir(folder: Path) -> Optional[Path]:
    for sub in VQGAN_DIRS:
        d = (folder / sub).resolve()
        if (d / "vqgan.yaml").is_file() and (d / "vqgan.ckpt").is_file():
            return d
    return None


def _default_sizes(folder: Path) -> Tuple[int, ...]:
    sizes = list(LUMINA_SIZES)
    named = [s for s in sizes if re.search(rf"(?<!\d){s}(?!\d)", folder.name)]
    if named:
        sizes.remove(named[0])
        sizes.insert(0, named[0])
    return tuple(sizes)


class LuminaVocabulary:
    """The ids the sequence needs, looked up by name in the checkpoint's vocabulary_map."""

    def __init__(self, vocabulary_map: Dict[str, int], num_codes: int, sizes: Tuple[int, ...]) -> None:
        def need(name: str) -> int:
            if name not in vocabulary_map:
                raise ModelLoadError(
                    f"The vocabulary_map in config.json has no {name!r} token, so this is not a "
                    f"Lumina-mGPT checkpoint; download config.json of {REPO_HINT} again."
                )
            return int(vocabulary_map[name])

        self.bos, self.image_start, self.image_end = need(BOS), need(IMAGE_START), need(IMAGE_END)
        self.end_of_line, self.end_of_turn = need(END_OF_LINE), need(END_OF_TURN)
        self.size_tokens = {s: need(grid_token_name(s // PIXELS_PER_GRID)) for s in sizes}
        try:
            codes = {image_code_of(n): int(i) for n, i in vocabulary_map.items() if n.startswith("IMGIMG")}
        except ValueError:
            codes = {}  # a malformed image-token name: reported as a mismatch below
        if sorted(codes) != list(range(num_codes)):
            raise ModelLoadError(
                f"config.json names {len(codes)} image tokens (IMGIMG...), but vqgan.yaml has a "
                f"{num_codes}-code codebook; the model and the Chameleon tokenizer files do not belong "
                f"together - download both again ({REPO_HINT})."
            )
        code_bpe = torch.tensor([codes[c] for c in range(num_codes)], dtype=torch.long)
        # Sampler id c < num_codes is VQ code c; then end-of-line and end-of-image.
        self.token_space = torch.cat([code_bpe, torch.tensor([self.end_of_line, self.image_end])])
        self.num_codes = num_codes
        self.eol_id, self.end_id = num_codes, num_codes + 1  # in the sampler's token space


class LuminaMGPTImageModel(ARImageModel):
    family = "lumina_mgpt"
    supports_device_map = True

    def __init__(
        self,
        model: ChameleonForConditionalGeneration,
        vqgan: ChameleonVQGANDecoder,
        text_tokenizer,
        vocab: LuminaVocabulary,
        sizes: Tuple[int, ...],
    ) -> None:
        self.model = model
        self.vqgan = vqgan
        self.text_tokenizer = text_tokenizer
        self.vocab = vocab
        self.num_codes = vocab.num_codes
        # Reference settings (Lumina-mGPT inference_solver): CFG 3.0 (its README uses 4.0), image
        # top-k 2000, temperature 1.0.
        self.defaults = FamilyDefaults(
            resolutions=tuple(f"{s}x{s}" for s in sizes), cfg_scale=3.0, temperature=1.0, top_k=2000
        )
        self.token_model = ImageHeadAdapter(model, model.model, vocab.token_space)
        self._layouts: Dict[str, ImageLayout] = {}
        self._last_resolution: Optional[str] = None

    # --- loading ------------------------------------------------------------------------------
    @classmethod
    def matches(cls, folder: Path, config: dict) -> bool:
        return config.get("model_type") == "chameleon"

    @classmethod
    def load(
        cls, folder: Path, config: dict, dtype: torch.dtype, device: torch.device, device_map: Optional[str] = None
    ) -> "LuminaMGPTImageModel":
        from tokenizers import Tokenizer

        # Every check that reads only small files runs before the weights are touched.
        vq_dir = find_vqgan_dir(folder)
        if vq_dir is None:
            raise ModelLoadError(f"{folder} has no Chameleon VQGAN (vqgan.yaml + vqgan.ckpt); {VQGAN_FIX}")
        tokenizer_file = next(
            (p for p in (vq_dir / "text_tokenizer.json", folder / "text_tokenizer.json", folder / "tokenizer.json")
             if p.is_file()),
            None,
        )
        if tokenizer_file is None:
            raise ModelLoadError(f"{folder} has no text tokenizer (text_tokenizer.json); {VQGAN_FIX}")
        vocabulary_map = config.get("vocabulary_map")
        if not isinstance(vocabulary_map, dict):
            raise ModelLoadError(
                f"{folder / 'config.json'} has no vocabulary_map, so it is not a Lumina-mGPT (Chameleon) "
                f"config; download config.json of {REPO_HINT} again."
            )
        try:
            vq_config = VQGANConfig.from_yaml(vq_dir / "vqgan.yaml")
        except VQGANLoadError as exc:
            raise ModelLoadError(str(exc)) from None
        sizes = _default_sizes(folder)
        vocab = LuminaVocabulary(vocabulary_map, vq_config.n_embed, sizes)
        try:
            text_tokenizer = Tokenizer.from_file(str(tokenizer_file))
        except Exception as exc:  # noqa: BLE001 - tokenizers raises its own exception type
            raise ModelLoadError(
                f"{tokenizer_file} is not a tokenizers JSON file ({short(exc)}); download it again: {VQGAN_FIX}"
            ) from None
        require_safetensors(folder, REPO_HINT)

        try:
            # The small VQGAN first, so a bad vqgan.ckpt fails before gigabytes of weights are read;
            # fp32 always: the decoder is small, and the reference decodes in fp32.
            vqgan = load_chameleon_vqgan(vq_dir / "vqgan.yaml", vq_dir / "vqgan.ckpt", device)
        except VQGANLoadError as exc:
            raise ModelLoadError(str(exc)) from None
        model = load_pretrained(ChameleonForConditionalGeneration, folder, dtype, device, device_map)
        return cls(model, vqgan, text_tokenizer, vocab, sizes)

    # --- prompts ------------------------------------------------------------------------------
    def _size(self, resolution: str) -> int:
        return int(resolution.split("x")[0])

    def layout(self, resolution: str) -> ImageLayout:
        if resolution not in self._layouts:
            side = self._size(resolution) // (PIXELS_PER_GRID // 2)  # codes per side
            self._layouts[resolution] = ImageLayout(
                rows=side, cols=side, row_end=self.vocab.eol_id, tail=(self.vocab.end_id,)
            )
        return self._layouts[resolution]

    def encode_prompt(self, prompt: str, negative_prompt: str = "", resolution: Optional[str] = None) -> PromptEncoding:
        resolution = self.check_resolution(resolution)
        self._last_resolution = resolution  # what preview() shows when not told
        size = self._size(resolution)
        text = PROMPT_TEMPLATE.format(size=size, prompt=prompt.strip())
        text_ids = self.text_tokenizer.encode(text, add_special_tokens=False).ids
        v = self.vocab
        image_start = [v.image_start, v.size_tokens[size], v.size_tokens[size]]
        prompt_ids = torch.tensor([v.bos, *text_ids, v.end_of_turn, *image_start], dtype=torch.long)
        warnings: List[str] = []
        if negative_prompt.strip():
            warnings.append(
                "Lumina-mGPT ignores negative prompts; guidance uses the image part alone, as its "
                "reference code does."
            )
        layout = self.layout(resolution)
        return PromptEncoding(
            prompt_ids=prompt_ids,
            uncond_ids=torch.tensor(image_start, dtype=torch.long),
            layout=layout,
            constraints=layout.constraints(self.token_model.vocab_size, torch.arange(v.num_codes)),
            resolution=resolution,
            warnings=warnings,
        )

    # --- pixels -------------------------------------------------------------------------------
    def _resolution_of(self, tokens: torch.Tensor, resolution: Optional[str]) -> str:
        if resolution is not None:
            return self.check_resolution(resolution)
        for res in self.defaults.resolutions:  # the only one whose layout has this many tokens
            if self.layout(res).num_tokens == tokens.shape[-1]:
                return res
        raise ValueError(f"{tokens.shape[-1]} tokens match no Lumina-mGPT resolution; pass resolution=.")

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, resolution: Optional[str] = None) -> List[Image.Image]:
        tokens = tokens.reshape(-1, tokens.shape[-1]).cpu()
        layout = self.layout(self._resolution_of(tokens, resolution))
        codes = layout.grid(tokens.reshape(-1, layout.num_tokens)).clamp(0, self.vocab.num_codes - 1)
        return pixels_to_pil(self.vqgan.decode_codes(codes))

    def preview(self, tokens: torch.Tensor, resolution: Optional[str] = None) -> Optional[Image.Image]:
        resolution = self.check_resolution(resolution or self._last_resolution)
        return preview_image(self.decode, self.layout(resolution), tokens, resolution)

    def unload(self) -> None:
        if getattr(self, "token_model", None) is not None:
            self.token_model.release()
        free_model(self.model)
        self.vqgan.to("cpu")
