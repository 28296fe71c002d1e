"""Lumina-mGPT 2.0 (Alpha-VLLM/Lumina-mGPT-2.0): a Chameleon-architecture 7B trained from scratch,
a Qwen-style text tokenizer, and MoVQGAN-270M images (8 pixels per code).

Sequence (the authors' FlexARItemProcessor, Conversation template and inference_solver):
    bos "Generate an image of {W}x{H} according to the following prompt:\\n{prompt}<reserved08706>"
    <racm3:break> <reserved08800+H/32> <reserved08800+W/32>     <- prompt (forced, so fed, not sampled)
    (W/8 image tokens, <reserved08799> end-of-line) x H/8  <eoss>   <- sampled (EOL and <eoss> forced)
bos is the tokenizer's bos token, or its eos token where it has none (the authors' Tokenizer). Image
code c is the model id 155000 + c (their `get_image_token`); every other id is looked up by name in
the checkpoint's tokenizer. Their sampler stops at <eoss>, which their constraint processor forces
right after the last row's end-of-line: the same stop rule as the layout's forced tail here. The
unconditional stream for CFG is the image part alone (<racm3:break> h w, then the same tokens).

Weights: the authors' Chameleon class (q/k LayerNorm rows [model_parallel_size, head_dim], as
Lumina-mGPT 1) loads through transformers' Chameleon classes (`lumina_mgpt.LuminaLayoutChameleon`).
Sizes: every width x height of whole 32-px patches at the area of 768x768 with aspect ratio up to 4
(the crop-size rule of their code at the README's 768 px), then the same at 512x512 (the target
their inference solver and item processor default to). The decoder is MoVQGAN-270M's
(`movqgan.py`), read from `movqgan_270M.ckpt`, which the authors tell users to download beside
their code and which sjd-pac reads from the model folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
from PIL import Image
from transformers import ChameleonConfig

from .adapters import ImageHeadAdapter
from .checks import ModelLoadError, require_safetensors
from .hf_common import LoadOptions, short
from .image_model import FamilyDefaults
from .kept_parts import keep_what_sampling_uses
from .lumina_mgpt import (END_OF_LINE, END_OF_TURN, IMAGE_END, IMAGE_START, PROMPT_TEMPLATE, LuminaLayoutChameleon,
                          LuminaImageModel, LuminaMGPTImageModel, grid_token_name, parse_size)
from .config_checks import built_config, meta_model
from .memory import FamilyShape
from .movqgan import (MOVQGAN_270M, MoVQDecoder, MoVQLoadError, load_movq_decoder, movq_config_of,
                      pixels_to_pil_rounded)
from .sizes import LUMINA2_TARGETS, PIXELS_PER_GRID, trained_sizes

REPO_HINT = "Alpha-VLLM/Lumina-mGPT-2.0"
# The pixel areas (side of the square) whose crop sizes the checkpoint is offered at; the first
# holds the default (the README's 768x768).
TARGETS: Tuple[int, ...] = LUMINA2_TARGETS
IMAGE_TOKEN_OFFSET = 155000  # model id of MoVQGAN code 0 (the authors' FlexARItemProcessor.get_image_token)
MOVQGAN_FILES = ("movqgan_270M.safetensors", "movqgan_270M.ckpt")  # a safetensors copy first
# Where the MoVQGAN file may sit, relative to the model folder (the authors' code reads
# lumina_mgpt/movqgan/270M/movqgan_270M.ckpt).
MOVQGAN_DIRS = (".", "movqgan/270M", "movqgan", "270M")
MOVQGAN_URL = "https://huggingface.co/ai-forever/MoVQGAN/resolve/main/movqgan_270M.ckpt"
MOVQGAN_FIX = (
    f"download movqgan_270M.ckpt of ai-forever/MoVQGAN ({MOVQGAN_URL}) into the model folder, next to "
    "config.json (a movqgan/270M/ sub-folder, where the authors' code keeps it, works too)."
)
TOKENIZER_FIX = f"download tokenizer.json and tokenizer_config.json of {REPO_HINT} into the model folder."


def find_movqgan(folder: Path) -> Optional[Path]:
    """The MoVQGAN weights beside the checkpoint, or None."""
    for sub in MOVQGAN_DIRS:
        for name in MOVQGAN_FILES:
            path = folder / sub / name
            if path.is_file():
                return path.resolve()
    return None


def trained_resolutions() -> Tuple[str, ...]:
    """Every size offered ("WxH"), the default (768x768) first."""
    seen: Dict[str, None] = {}
    for target in TARGETS:
        seen.update(dict.fromkeys(f"{w}x{h}" for w, h in trained_sizes(target)))
    return tuple(seen)


def image_tokens(resolution: str, code_pixels: int = 8) -> int:
    """Tokens sampled per image after the three image-start tokens: rows of codes plus an
    end-of-line each, then <eoss>."""
    width, height = parse_size(resolution)
    return (height // code_pixels) * (width // code_pixels + 1) + 1


class Lumina2Vocabulary:
    """The ids the sequence needs, by name from the checkpoint's tokenizer; image codes at
    IMAGE_TOKEN_OFFSET + code."""

    def __init__(self, tokenizer, num_codes: int, vocab_size: int, resolutions: Tuple[str, ...]) -> None:
        names = tokenizer.get_vocab()

        def need(name: str) -> int:
            if name not in names:
                raise ModelLoadError(
                    f"The tokenizer in the model folder has no {name!r} token, so it is not Lumina-mGPT 2.0's; "
                    f"{TOKENIZER_FIX}"
                )
            return int(names[name])

        bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        if bos is None:
            raise ModelLoadError(f"The tokenizer in the model folder names no bos or eos token; {TOKENIZER_FIX}")
        self.bos = int(bos)
        self.image_start, self.image_end = need(IMAGE_START), need(IMAGE_END)
        self.end_of_line, self.end_of_turn = need(END_OF_LINE), need(END_OF_TURN)
        grids = {side // PIXELS_PER_GRID for r in resolutions for side in parse_size(r)}
        self.size_tokens = {n: need(grid_token_name(n)) for n in sorted(grids)}
        if IMAGE_TOKEN_OFFSET + num_codes > vocab_size:
            raise ModelLoadError(
                f"config.json has a vocabulary of {vocab_size:,} ids, but the MoVQGAN's {num_codes:,} codes take the "
                f"ids {IMAGE_TOKEN_OFFSET:,}..{IMAGE_TOKEN_OFFSET + num_codes - 1:,}; the model and movqgan_270M.ckpt "
                f"do not belong together - download config.json of {REPO_HINT} and {MOVQGAN_URL} again."
            )
        codes = torch.arange(IMAGE_TOKEN_OFFSET, IMAGE_TOKEN_OFFSET + num_codes)
        # Sampler id c < num_codes is MoVQGAN code c; then end-of-line and end-of-image.
        self.token_space = torch.cat([codes, torch.tensor([self.end_of_line, self.image_end])])
        self.num_codes = num_codes
        self.eol_id, self.end_id = num_codes, num_codes + 1  # in the sampler's token space


def _vocab_size(config: dict) -> int:
    value = config.get("vocab_size")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class LuminaMGPT2ImageModel(LuminaImageModel):
    family = "lumina_mgpt2"
    supports_device_map = True

    def __init__(self, model, movq: MoVQDecoder, tokenizer, vocab: Lumina2Vocabulary,
                 resolutions: Tuple[str, ...]) -> None:
        self.model = model
        self.movq = movq
        self.tokenizer = tokenizer
        self.vocab = vocab
        self.num_codes = vocab.num_codes
        self.code_pixels = movq.downsample
        # The authors' README and sample script: CFG 4.0, image top-k 4096, temperature 1.0.
        self.defaults = FamilyDefaults(resolutions=resolutions,
                                       sampler=dict(cfg_scale=4.0, temperature=1.0, top_k=4096))
        self.token_model = ImageHeadAdapter(model, model.model, vocab.token_space)
        super().__init__()

    display_name = "Lumina-mGPT 2.0"

    # --- loading ------------------------------------------------------------------------------
    @classmethod
    def matches(cls, folder: Path, config: dict) -> bool:
        """A Chameleon config whose vocabulary reaches the MoVQGAN codes at id 155000 (Lumina-mGPT 1
        and Chameleon have 65,536 ids), or one with the MoVQGAN file beside it."""
        if config.get("model_type") != "chameleon":
            return False
        return _vocab_size(config) > IMAGE_TOKEN_OFFSET or find_movqgan(folder) is not None

    @classmethod
    def memory_shape(cls, config: dict, folder: Optional[Path] = None) -> FamilyShape:
        """The plan's view of this config (built on the meta device: no memory), with the MoVQGAN
        decoder (fp32) of the file beside it, or MoVQGAN-270M's."""
        path = (folder or Path(".")) / "config.json"
        cfg = built_config(ChameleonConfig, dict(config, vocabulary_map=config.get("vocabulary_map") or {}), path)
        model = meta_model(LuminaLayoutChameleon, cfg, path)
        movq_path = find_movqgan(folder) if folder is not None else None
        movq = MOVQGAN_270M
        if movq_path is not None:
            try:
                movq = movq_config_of(movq_path)
            except MoVQLoadError:
                pass  # loading names what is wrong with the file; the plan assumes the published one
        with torch.device("meta"):
            decoder_params = sum(p.numel() for p in MoVQDecoder(movq).parameters())
        return cls.chameleon_shape("lumina_mgpt2", model, cfg, movq.n_embed, decoder_params,
                                   {r: image_tokens(r, movq.downsample) for r in trained_resolutions()})

    @classmethod
    def load(
        cls, folder: Path, config: dict, dtype: torch.dtype, device: torch.device, options: Optional[LoadOptions] = None
    ) -> "LuminaMGPT2ImageModel":
        from transformers import AutoTokenizer

        # Every check that reads only small files runs before the weights are touched.
        movq_path = find_movqgan(folder)
        if movq_path is None:
            raise ModelLoadError(f"{folder} has no MoVQGAN decoder (movqgan_270M.ckpt); {MOVQGAN_FIX}")
        if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer_config.json").is_file():
            raise ModelLoadError(f"{folder} has no tokenizer (tokenizer.json); {TOKENIZER_FIX}")
        if not isinstance(config.get("vocabulary_map"), dict):
            raise ModelLoadError(
                f"{folder / 'config.json'} has no vocabulary_map, which the checkpoint's Chameleon class needs; "
                f"download config.json of {REPO_HINT} again."
            )
        try:
            tokenizer = AutoTokenizer.from_pretrained(folder)
        except Exception as exc:  # noqa: BLE001 - transformers raises many kinds for a bad tokenizer
            raise ModelLoadError(f"The tokenizer in {folder} cannot be read ({short(exc)}); {TOKENIZER_FIX}") from None
        try:
            movq_config = movq_config_of(movq_path)
        except MoVQLoadError as exc:
            raise ModelLoadError(str(exc)) from None
        if movq_config.downsample * 4 != PIXELS_PER_GRID:
            raise ModelLoadError(
                f"{movq_path} decodes {movq_config.downsample} pixels per code, but Lumina-mGPT 2.0 writes its "
                f"size tokens in 32-px grids of 4 codes (MoVQGAN-270M's 8 pixels); {MOVQGAN_FIX}"
            )
        resolutions = trained_resolutions()
        vocab = Lumina2Vocabulary(tokenizer, movq_config.n_embed, _vocab_size(config), resolutions)
        require_safetensors(folder, REPO_HINT)
        try:
            # The small decoder first, so a bad file fails before gigabytes of weights are read;
            # fp32 always, as the authors decode.
            movq = load_movq_decoder(movq_path, device)
        except MoVQLoadError as exc:
            raise ModelLoadError(str(exc)) from None
        model = LuminaMGPTImageModel.load_chameleon(folder, config, dtype, device, options,
                                                    prepare=lambda m: keep_what_sampling_uses(m, vocab.token_space),
                                                    repo_hint=REPO_HINT)
        return cls(model, movq, tokenizer, vocab, resolutions)

    # --- prompts and pixels (the rest is LuminaImageModel's) ---------------------------------
    def prompt_text(self, prompt: str, resolution: str) -> str:
        """The human turn of the authors' conversation template, closed by its separator."""
        width, height = parse_size(resolution)
        return PROMPT_TEMPLATE.format(width=width, height=height, prompt=prompt.strip()) + END_OF_TURN

    def text_ids(self, prompt: str, resolution: str) -> List[int]:
        return list(self.tokenizer.encode(self.prompt_text(prompt, resolution), add_special_tokens=False))

    @property
    def decoder(self) -> MoVQDecoder:
        return self.movq

    def to_pictures(self, pixels: torch.Tensor) -> List[Image.Image]:
        return pixels_to_pil_rounded(pixels)  # the authors round where Lumina-mGPT 1 truncates
