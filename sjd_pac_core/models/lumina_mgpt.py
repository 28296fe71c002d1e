"""Lumina-mGPT (Alpha-VLLM/Lumina-mGPT-7B-512/768/1024): Chameleon weights + Meta's VQGAN.

Sequence (Lumina-mGPT's FlexARItemProcessor and inference_solver):
    <s> "Generate an image of {W}x{H} according to the following prompt:\\n{prompt}" <reserved08706>
    <racm3:break> <reserved08800+H/32> <reserved08800+W/32>      <- prompt (forced, so fed, not sampled)
    (W/16 image tokens, <reserved08799> end-of-line) x H/16  <eoss>   <- sampled (EOL and <eoss> forced)
The unconditional stream for CFG is the image part alone: <racm3:break> h w, then the same tokens.
Lumina-mGPT's own sampler samples <racm3:break> h w as well; a trained model emits them with near
certainty after this prompt, and the reference applies guidance and constraints only after them.

Sizes: each checkpoint is trained at one pixel area (its target size squared: 512, 768 or 1024)
on every width x height of whole 32-px patches the reference's crop-size rule lists (aspect
ratio up to 4). Weight layout: Lumina-mGPT's converter stores the q/k LayerNorm weights as
[model_parallel_size, head_dim] rows that its class repeats over the heads; they are expanded to
transformers' [num_heads, head_dim] while loading (`LuminaLayoutChameleon`).

Token ids come from the checkpoint's `vocabulary_map` (config.json) by name, never hard-coded; the
image codes are the `IMGIMG...` names (digits spelled with A-J), exactly as transformers and
Lumina-mGPT decode them. The sampler works in a token space of the codes in code order (sampler
id c is VQ code c) plus end-of-line and end-of-image.
"""

from __future__ import annotations

import json
import re
import struct
from abc import abstractmethod
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
from PIL import Image
from torch import nn
from transformers import ChameleonConfig, ChameleonForConditionalGeneration

from .adapters import ImageHeadAdapter
from .kept_parts import drop_modules, keep_what_sampling_uses, unused_key_patterns
from .chameleon_vqgan import ChameleonVQGANDecoder, VQGANConfig, VQGANLoadError, load_chameleon_vqgan
from .hf_common import LoadOptions, free_model, load_pretrained, pixels_to_pil, preview_image, short
from .image_model import ARImageModel, FamilyDefaults, ImageLayout, PromptEncoding
from .checks import ModelLoadError, require_safetensors
from .config_checks import built_config, meta_model
from .memory import FamilyShape, census
from .sizes import PIXELS_PER_GRID, trained_sizes

REPO_HINT = "Alpha-VLLM/Lumina-mGPT-7B-768 (or -512 / -1024)"
# Target sizes of the Lumina-mGPT checkpoints (the side of the square whose area every trained
# size shares); a checkpoint's own (from its folder name, e.g. lumina-mgpt-7b-768) comes first.
LUMINA_SIZES: Tuple[int, ...] = (768, 512, 1024)
PROMPT_TEMPLATE = "Generate an image of {width}x{height} according to the following prompt:\n{prompt}"
# Where the Chameleon tokenizer files may sit, relative to the model folder.
VQGAN_DIRS = (".", "chameleon", "tokenizer", "chameleon/tokenizer", "ckpts/chameleon/tokenizer")
VQGAN_FIX = (
    "copy vqgan.yaml, vqgan.ckpt and text_tokenizer.json from Lumina-mGPT's "
    "ckpts/chameleon/tokenizer/ folder (Meta's Chameleon tokenizer) into the model folder."
)

# Meta's Chameleon VQGAN (ckpts/chameleon/tokenizer/vqgan.yaml), for plans made without the file:
# the shape transformers' ChameleonVQVAEConfig defaults to.
CHAMELEON_VQGAN = VQGANConfig(embed_dim=256, n_embed=8192, z_channels=256, ch=128, ch_mult=(1, 1, 2, 2, 4),
                              num_res_blocks=2, attn_resolutions=(), resolution=512, out_ch=3)

BOS, IMAGE_START, IMAGE_END, END_OF_LINE, END_OF_TURN = "<s>", "<racm3:break>", "<eoss>", "<reserved08799>", "<reserved08706>"
# Lumina-mGPT's size tokens: <reserved{8800 + n:05d}> for n grids of PIXELS_PER_GRID = 32 pixels (= 2 codes).


def grid_token_name(n_grids: int) -> str:
    return f"<reserved{8800 + n_grids:05d}>"


def image_code_of(name: str) -> int:
    """'IMGIMG' + the code's digits spelled with A-J + one final character -> the code."""
    return int("".join(str(ord(c) - ord("A")) for c in name[len("IMGIMG") : -1]))


def parse_size(resolution: str) -> Tuple[int, int]:
    """"WxH" -> (width, height)."""
    width, height = resolution.split("x")
    return int(width), int(height)


def qk_norm_rows(folder: Path) -> Optional[int]:
    """Rows of layer 0's q_norm weight, read from the safetensors headers (no weights read)."""
    key = "model.layers.0.self_attn.q_norm.weight"
    index = folder / "model.safetensors.index.json"
    try:
        if index.is_file():
            files = [folder / json.loads(index.read_text())["weight_map"][key]]
        else:
            files = sorted(folder.glob("*.safetensors"))
        for path in files:
            with open(path, "rb") as f:
                (header_len,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(header_len))
            if key in header:
                return int(header[key]["shape"][0])
    except (OSError, KeyError, TypeError, ValueError, RecursionError, struct.error):
        return None  # unreadable files are reported by the loader's own checks
    return None


class LuminaLayoutChameleon(ChameleonForConditionalGeneration):
    """transformers' Chameleon that accepts Lumina-mGPT's q/k LayerNorm layout.

    Lumina-mGPT's converter writes q_norm/k_norm weights and biases as [rows, head_dim] with
    rows = model_parallel_size ([1, 128] for the 7B models); its class repeats each row over
    heads/rows heads. The parameters are created with that shape so `from_pretrained` loads the
    file as it is, then `expand_qk_norms` repeats the rows to transformers' [heads, head_dim].
    """

    qk_rows = 1  # set on a subclass per checkpoint (see `with_qk_rows`)
    # transformers' Chameleon VQ model is an image encoder (it has no decoder): sampling never
    # runs it, and Lumina-mGPT's trainer deletes it before saving. It is not built; weights of it
    # in a transformers-layout file are skipped.
    UNUSED = ("model.vqmodel",)
    _keys_to_ignore_on_load_unexpected = unused_key_patterns(UNUSED)

    def __init__(self, config) -> None:
        super().__init__(config)
        drop_modules(self, self.UNUSED)
        for layer in self.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm.weight = nn.Parameter(norm.weight.data[: self.qk_rows].clone())
                norm.bias = nn.Parameter(norm.bias.data[: self.qk_rows].clone())

    @classmethod
    def with_qk_rows(cls, rows: int) -> type:
        return type(cls.__name__, (cls,), {"qk_rows": rows})

    def expand_qk_norms(self) -> None:
        if self.qk_rows == 1:
            # One row broadcasts over the heads in ChameleonLayerNorm (weight * x + bias): the same
            # numbers with no copy, and an offloaded layer reloads the file's shape unchanged.
            return
        for layer in self.model.layers:
            attn = layer.self_attn
            for norm, heads in ((attn.q_norm, attn.num_heads), (attn.k_norm, self.config.num_key_value_heads)):
                repeats = heads // norm.weight.shape[0]
                with torch.no_grad():
                    norm.weight = nn.Parameter(norm.weight.repeat_interleave(repeats, 0), requires_grad=False)
                    norm.bias = nn.Parameter(norm.bias.repeat_interleave(repeats, 0), requires_grad=False)


# The VQGAN's weights: a safetensors copy (see chameleon_vqgan.CONVERT_COMMAND) before Meta's file.
VQGAN_WEIGHTS = ("vqgan.safetensors", "vqgan.ckpt")


def vqgan_weights(vq_dir: Path) -> Optional[Path]:
    return next((vq_dir / name for name in VQGAN_WEIGHTS if (vq_dir / name).is_file()), None)


def find_vqgan_dir(folder: Path) -> Optional[Path]:
    for sub in VQGAN_DIRS:
        d = (folder / sub).resolve()
        if (d / "vqgan.yaml").is_file() and vqgan_weights(d) is not None:
            return d
    return None


def default_sizes(folder: Path) -> Tuple[int, ...]:
    sizes = list(LUMINA_SIZES)
    named = [s for s in sizes if re.search(rf"(?<!\d){s}(?!\d)", folder.name)]
    if named:
        sizes.remove(named[0])
        sizes.insert(0, named[0])
    return tuple(sizes)


class LuminaVocabulary:
    """The ids the sequence needs, looked up by name in the checkpoint's vocabulary_map."""

    def __init__(self, vocabulary_map: Dict[str, int], num_codes: int, sizes: Tuple[Tuple[int, int], ...]) -> None:
        def need(name: str) -> int:
            if name not in vocabulary_map:
                raise ModelLoadError(
                    f"The vocabulary_map in config.json has no {name!r} token, so this is not a "
                    f"Lumina-mGPT checkpoint; download config.json of {REPO_HINT} again."
                )
            return int(vocabulary_map[name])

        self.bos, self.image_start, self.image_end = need(BOS), need(IMAGE_START), need(IMAGE_END)
        self.end_of_line, self.end_of_turn = need(END_OF_LINE), need(END_OF_TURN)
        # Size tokens for every side length of the trained sizes, in 32-px grids.
        grids = {side // PIXELS_PER_GRID for s in sizes for side in s}
        self.size_tokens = {n: need(grid_token_name(n)) for n in sorted(grids)}
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


class LuminaImageModel(ARImageModel):
    """What both Lumina-mGPT generations share: the prompt (the authors' template with the size
    tokens, height first; guidance on the image part alone), the image layout (rows of codes, each
    ended by an end-of-line token, then the end of the image), decoding and previews. A
    generation names its text ids (`text_ids`), its decoder (`decoder`), how the decoder's pixels
    become pictures (`to_pictures`) and its pixels per code (`code_pixels`)."""

    display_name = "Lumina-mGPT"
    code_pixels: int
    vocab: object  # LuminaVocabulary or lumina_mgpt2.Lumina2Vocabulary

    def __init__(self) -> None:
        self._layouts: Dict[str, ImageLayout] = {}
        self._last_resolution: Optional[str] = None

    @abstractmethod
    def text_ids(self, prompt: str, resolution: str) -> List[int]:
        """The prompt's text turn as token ids, its end-of-turn included."""

    @property
    @abstractmethod
    def decoder(self) -> torch.nn.Module:
        """The VQ decoder (with decode_codes(grid) -> pixels)."""

    QUANTIZED_LAYERS = r"model\.layers"  # the decoder layers: the only quantized linears

    @classmethod
    def chameleon_shape(cls, family: str, model: torch.nn.Module, cfg: ChameleonConfig, codes: int,
                        decoder_params: int, image_tokens: Dict[str, int]) -> FamilyShape:
        """The memory plan's view of a Lumina Chameleon built on the meta device: its weights by
        kind (the image head and embedding rows of `codes` image codes plus the row and image
        ends, the fp32 decoder's `decoder_params`), its attention shape and tokens per image."""
        return FamilyShape(
            family=family,
            weights=census(model, cls.QUANTIZED_LAYERS, head=("lm_head", codes + 2),
                           embedding=("model.embed_tokens", codes + 2), extra_fp32=decoder_params),
            layers=cfg.num_hidden_layers, heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.hidden_size // cfg.num_attention_heads, hidden=cfg.hidden_size,
            intermediate=cfg.intermediate_size, sampler_vocab=codes + 2, image_tokens=image_tokens,
        )

    def to_pictures(self, pixels: torch.Tensor) -> List[Image.Image]:
        return pixels_to_pil(pixels)

    # --- prompts ------------------------------------------------------------------------------
    def layout(self, resolution: str) -> ImageLayout:
        if resolution not in self._layouts:
            width, height = parse_size(resolution)
            self._layouts[resolution] = ImageLayout(
                rows=height // self.code_pixels, cols=width // self.code_pixels,
                row_end=self.vocab.eol_id, tail=(self.vocab.end_id,),
            )
        return self._layouts[resolution]

    def encode_prompt(self, prompt: str, negative_prompt: str = "", resolution: Optional[str] = None) -> PromptEncoding:
        resolution = self.check_resolution(resolution)
        self._last_resolution = resolution  # what preview() shows when not told
        width, height = parse_size(resolution)
        v = self.vocab
        # Height first, then width (FlexARItemProcessor).
        image_start = [v.image_start, v.size_tokens[height // PIXELS_PER_GRID], v.size_tokens[width // PIXELS_PER_GRID]]
        prompt_ids = torch.tensor([v.bos, *self.text_ids(prompt, resolution), *image_start], dtype=torch.long)
        warnings: List[str] = []
        if negative_prompt.strip():
            warnings.append(
                f"{self.display_name} ignores negative prompts; guidance uses the image part alone, as its "
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
    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, resolution: Optional[str] = None) -> List[Image.Image]:
        rows = self.decode_rows(tokens)
        resolution = self.resolution_for(rows.shape[-1], resolution, self.layout)
        layout = self.layout(resolution)
        self.check_image_tokens(rows, layout, (0, self.vocab.num_codes), resolution)
        return self.to_pictures(self.decoder.decode_codes(layout.grid(rows)))

    def preview(self, tokens: torch.Tensor, resolution: Optional[str] = None) -> Optional[Image.Image]:
        resolution = self.check_resolution(resolution or self._last_resolution)
        return preview_image(self.decode, self.layout(resolution), tokens, resolution)

    def unload(self) -> None:
        if getattr(self, "token_model", None) is not None:
            self.token_model.release()
        free_model(self.model)
        self.decoder.to("cpu")


class LuminaMGPTImageModel(LuminaImageModel):
    family = "lumina_mgpt"
    supports_device_map = True

    def __init__(
        self,
        model: ChameleonForConditionalGeneration,
        vqgan: ChameleonVQGANDecoder,
        text_tokenizer,
        vocab: LuminaVocabulary,
        sizes: Tuple[Tuple[int, int], ...],
    ) -> None:
        self.model = model
        self.vqgan = vqgan
        self.text_tokenizer = text_tokenizer
        self.vocab = vocab
        self.num_codes = vocab.num_codes
        self.defaults = FamilyDefaults(resolutions=tuple(f"{w}x{h}" for w, h in sizes), sampler=self.SAMPLER_DEFAULTS)
        self.token_model = ImageHeadAdapter(model, model.model, vocab.token_space)
        super().__init__()

    code_pixels = PIXELS_PER_GRID // 2  # 16 pixels per code

    # Reference settings (Lumina-mGPT inference_solver): CFG 3.0 (its README uses 4.0), image
    # top-k 2000, temperature 1.0.
    SAMPLER_DEFAULTS = dict(cfg_scale=3.0, temperature=1.0, top_k=2000)

    # --- loading ------------------------------------------------------------------------------
    @classmethod
    def matches(cls, folder: Path, config: dict) -> bool:
        return config.get("model_type") == "chameleon"

    @classmethod
    def memory_shape(cls, config: dict, folder: Optional[Path] = None) -> FamilyShape:
        """The plan's view of this config (the model is built on the meta device: no memory), with
        Meta's VQGAN decoder (fp32) read from vqgan.yaml, or Chameleon's published one."""
        path = (folder or Path(".")) / "config.json"
        cfg = built_config(ChameleonConfig, dict(config, vocabulary_map=config.get("vocabulary_map") or {}), path)
        model = meta_model(LuminaLayoutChameleon, cfg, path)
        vq_dir = find_vqgan_dir(folder) if folder is not None else None
        try:
            vq_config = VQGANConfig.from_yaml(vq_dir / "vqgan.yaml") if vq_dir is not None else CHAMELEON_VQGAN
        except VQGANLoadError as exc:
            raise ModelLoadError(str(exc)) from None
        with torch.device("meta"):
            decoder_params = sum(p.numel() for p in ChameleonVQGANDecoder(vq_config).parameters())
        target = default_sizes(folder)[0] if folder is not None else LUMINA_SIZES[0]
        return cls.chameleon_shape("lumina_mgpt", model, cfg, vq_config.n_embed, decoder_params,
                                   {f"{w}x{h}": (h // 16) * (w // 16 + 1) + 1 for w, h in trained_sizes(target)})

    @classmethod
    def load(
        cls, folder: Path, config: dict, dtype: torch.dtype, device: torch.device, options: Optional[LoadOptions] = None
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
        sizes = trained_sizes(default_sizes(folder)[0])
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
            vqgan = load_chameleon_vqgan(vq_dir / "vqgan.yaml", vqgan_weights(vq_dir), device)
        except VQGANLoadError as exc:
            raise ModelLoadError(str(exc)) from None
        model = cls.load_chameleon(folder, config, dtype, device, options,
                                   prepare=lambda m: keep_what_sampling_uses(m, vocab.token_space))
        return cls(model, vqgan, text_tokenizer, vocab, sizes)

    @staticmethod
    def load_chameleon(
        folder: Path, config: dict, dtype: torch.dtype, device: torch.device, options: Optional[LoadOptions] = None,
        prepare=None, repo_hint: str = REPO_HINT,
    ) -> ChameleonForConditionalGeneration:
        """The weights in either layout: transformers' ([heads, head_dim] q/k norms) or Lumina-mGPT's
        own ([model_parallel_size, head_dim], expanded over the heads here). repo_hint names the
        repository to download again (Lumina-mGPT 2.0 loads through here too)."""
        rows = qk_norm_rows(folder)
        heads = int(config.get("num_attention_heads", 0) or 0)
        kv_heads = int(config.get("num_key_value_heads", heads) or heads)
        rows = heads if rows is None else rows
        if rows <= 0 or heads % rows or kv_heads % rows:
            raise ModelLoadError(
                f"The q/k LayerNorm weights in {folder} have {rows} rows, which divides neither "
                f"{heads} attention heads nor {kv_heads} key/value heads; download the checkpoint of {repo_hint} again."
            )
        model = load_pretrained(LuminaLayoutChameleon.with_qk_rows(rows), folder, dtype, device, options, prepare=prepare)
        model.expand_qk_norms()
        return model

    # --- prompts and pixels (the rest is LuminaImageModel's) ---------------------------------
    def text_ids(self, prompt: str, resolution: str) -> List[int]:
        width, height = parse_size(resolution)
        text = PROMPT_TEMPLATE.format(width=width, height=height, prompt=prompt.strip())
        return [*self.text_tokenizer.encode(text, add_special_tokens=False).ids, self.vocab.end_of_turn]

    @property
    def decoder(self) -> ChameleonVQGANDecoder:
        return self.vqgan
