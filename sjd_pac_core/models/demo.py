"""The bundled demo model as an ARImageModel (a small GPT-2 or Llama + our VQ; see sjd_pac_core/demo)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch
from PIL import Image

from ..demo.model import DemoModel, load_demo
from ..config import ConfigError, float32_knob_problem
from ..demo import VOCAB_FILE
from ..demo.captions import PromptError, caption_words, parse_prompt
from ..demo.vq import VQ_CONFIG, VQ_WEIGHTS, VQConfig, VQModel
from .causal_lm import CausalLMAdapter
from .image_model import ARImageModel, FamilyDefaults, ImageLayout, PromptEncoding
from .checks import ModelLoadError, check_checkpoint_matches, check_weight_dtypes


# `demo.tools.train` builds a 1D-RoPE Llama (its default, the shipped model) or a GPT-2 with learned
# absolute positions (`--arch gpt2`; README, "The bundled demo model").
DEMO_MODEL_TYPES = ("gpt2", "llama")
# Sampling defaults a demo folder may set in its generation_config.json (transformers' keys).
GENERATION_DEFAULT_KEYS = {"guidance_scale": "cfg_scale", "temperature": "temperature", "top_k": "top_k"}


def folder_defaults(folder: Path, base: FamilyDefaults) -> FamilyDefaults:
    """``base`` with the sampling defaults of ``folder/generation_config.json`` (guidance_scale,
    temperature, top_k) where it sets them: the weights carry the settings they were calibrated
    at (README, "The bundled demo model")."""
    path = Path(folder) / "generation_config.json"
    if not path.is_file():
        return base
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise ModelLoadError(
            f"{path} could not be read ({' '.join(str(exc).split())[:120]}); it only holds sampling "
            "defaults, so delete it or copy it again from sjd_pac_core/demo/weights."
        ) from exc
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path} is not a JSON object; delete it or copy it again from sjd_pac_core/demo/weights.")
    changes = {}
    for key, field in GENERATION_DEFAULT_KEYS.items():
        value = config.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            problem = None if field == "top_k" else float32_knob_problem(field, float(value))
            if problem:
                raise ModelLoadError(f"{path} sets {key} to {value:g}, which {problem}; correct it (or delete the "
                                     "file: it only holds sampling defaults).")
            changes[field] = int(value) if field == "top_k" else float(value)
    return base.with_sampler(**changes) if changes else base


def _vq_floating(folder: Path) -> Dict[str, bool]:
    """The demo VQ's state-dict names -> is floating point, built on the meta device from its
    config (empty when the config is unreadable: loading the VQ then says why)."""
    try:
        config = VQConfig(**json.loads((folder / VQ_CONFIG).read_text()))
        with torch.device("meta"):
            vq = VQModel(config)
    except Exception:  # noqa: BLE001 - any unreadable config
        return {}
    return {name: t.is_floating_point() for name, t in vq.state_dict().items()}


class DemoImageModel(ARImageModel):
    family = "demo"
    # Measured on the shipped weights (README, "Demo model"; `python -m sjd_pac_core.demo.tools.quality`):
    # CFG 2 at temperature 0.8 gets background and object colour right on 96 % of held-out
    # prompts; CFG 3 paints the object colour over the background, temperature 1 adds stray blobs.
    # The sampler's shape is the fastest measured on a 2-core CPU, where the demo runs: a pass costs
    # about 2.7 ms plus 0.13 ms per node there, so a short window with one tree level of K beats the
    # long window and wide tree that win where passes are nearly free (README "Results"; a GPU
    # user of a 7B family keeps that family's L and tree).
    defaults = FamilyDefaults(resolutions=("64x64",), sampler=dict(cfg_scale=2.0, temperature=0.8, window=12,
                                                                   tree_depth=2, tree_width=4, tree_first_width=None))

    def __init__(self, demo: DemoModel) -> None:
        self.demo = demo
        self.defaults = folder_defaults(Path(demo.path), type(self).defaults)
        self.vocab = demo.vocab
        self.token_model = CausalLMAdapter(demo.model)
        grid = self.vocab.grid
        # the vocabulary says which token closes each row (the shared <eol>, or one per row)
        self.layout = ImageLayout(rows=grid, cols=grid, row_end=tuple(self.vocab.row_end_ids().tolist()))
        image_ids = torch.arange(self.vocab.image_offset, self.vocab.vocab_size)
        self.constraints = self.layout.constraints(self.vocab.vocab_size, image_ids)

    @classmethod
    def defaults_for_folder(cls, folder: Path) -> FamilyDefaults:
        return folder_defaults(folder, cls.defaults)

    @classmethod
    def matches(cls, folder: Path, config: dict) -> bool:
        return (
            config.get("model_type") in DEMO_MODEL_TYPES
            and (folder / VOCAB_FILE).is_file()
            and (folder / VQ_CONFIG).is_file()
        )

    @classmethod
    def load(cls, folder: Path, config: dict, dtype: torch.dtype, device: torch.device) -> "DemoImageModel":
        for name in ("model.safetensors", VQ_WEIGHTS):
            if not (folder / name).is_file():
                raise ModelLoadError(
                    f"{folder / name} is missing; rebuild the demo model with "
                    "`python -m sjd_pac_core.demo.tools.train`."
                )
        # transformers would fill a missing weight with random values: compare the file's header
        # with the model config.json builds (on the meta device: no memory) before loading.
        from transformers import AutoConfig, AutoModelForCausalLM

        model_config = AutoConfig.for_model(**config)
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(model_config)
        state = skeleton.state_dict()
        check_checkpoint_matches(folder / "model.safetensors", {k: v.shape for k, v in state.items()})
        check_weight_dtypes(folder, {k: v.is_floating_point() for k, v in state.items()}, [folder / "model.safetensors"])
        check_weight_dtypes(folder, _vq_floating(folder), [folder / VQ_WEIGHTS])
        try:
            demo = load_demo(str(folder), dtype=dtype)
        except (OSError, ValueError, RuntimeError, KeyError) as exc:
            raise ModelLoadError(
                f"The demo model in {folder} could not be loaded ({' '.join(str(exc).split())[:200]}); "
                "rebuild it with `python -m sjd_pac_core.demo.tools.train`."
            ) from None
        demo.model.to(device)
        demo.vq.to(device)
        return cls(demo)

    def encode_prompt(self, prompt: str, negative_prompt: str = "", resolution: Optional[str] = None) -> PromptEncoding:
        resolution = self.check_resolution(resolution)
        if self.vocab.prompt_format == "slots":
            return self._encode_slots(prompt, negative_prompt, resolution)
        words = caption_words(prompt)
        known = [w for w in words if w in self.vocab.words]
        unknown = sorted(set(words) - set(known))
        warnings: List[str] = []
        if unknown:
            warnings.append(
                f"The demo model does not know the words {', '.join(unknown)}; generating from the "
                "rest of the prompt."
            )
        slots = self.vocab.prompt_slots
        if slots is not None and len(known) > slots:
            warnings.append(
                f"The demo model reads {slots} words; the prompt has {len(known)}, so "
                f"'{' '.join(known[slots:])}' is left out (shorten the prompt)."
            )
            known = known[:slots]
        if not known:
            warnings.append("The prompt is empty for the demo model; generating unconditionally.")
        if negative_prompt.strip():
            warnings.append("The demo model ignores negative prompts; guidance uses the empty prompt.")
        return PromptEncoding(
            prompt_ids=self.vocab.prompt_ids(" ".join(known)),
            uncond_ids=self.vocab.uncond_prompt_ids(),
            layout=self.layout,
            constraints=self.constraints,
            resolution=resolution,
            warnings=warnings,
        )

    def _encode_slots(self, prompt: str, negative_prompt: str, resolution: str) -> PromptEncoding:
        """The structured prompt (vocab.parse_prompt): a prompt outside the demo grammar is a
        ConfigError that says how to write one."""
        warnings: List[str] = []
        if prompt.strip():
            try:
                parsed = parse_prompt(prompt)
            except PromptError as exc:
                raise ConfigError(str(exc)) from None
            warnings += list(parsed.warnings)
            prompt_ids = self.vocab.slot_ids(parsed)
        else:
            warnings.append("The prompt is empty for the demo model; generating unconditionally.")
            prompt_ids = self.vocab.uncond_prompt_ids()
        if negative_prompt.strip():
            warnings.append("The demo model ignores negative prompts; guidance uses the empty prompt.")
        return PromptEncoding(
            prompt_ids=prompt_ids,
            uncond_ids=self.vocab.uncond_prompt_ids(),
            layout=self.layout,
            constraints=self.constraints,
            resolution=resolution,
            warnings=warnings,
        )

    def _codes(self, grid_ids: torch.Tensor) -> torch.Tensor:
        return (grid_ids - self.vocab.image_offset).clamp(0, self.vocab.codebook_size - 1)

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, resolution: Optional[str] = None) -> List[Image.Image]:
        rows = self.decode_rows(tokens)
        codes_ids = (self.vocab.image_offset, self.vocab.image_offset + self.vocab.codebook_size)
        self.check_image_tokens(rows, self.layout, codes_ids, self.check_resolution(resolution))
        codes = self._codes(self.layout.grid(rows)).to(self.device)
        arrays = self.demo.vq.decode_to_uint8(codes)
        return [Image.fromarray(a) for a in arrays]

    @torch.inference_mode()
    def preview(self, tokens: torch.Tensor, resolution: Optional[str] = None) -> Optional[Image.Image]:
        """The image so far; cells not sampled yet are shown dimmed."""
        grid = self.layout.partial_grid(tokens, filler=self.vocab.image_offset)
        arr = self.demo.vq.decode_to_uint8(self._codes(grid).unsqueeze(0).to(self.device))[0]
        done = np.zeros((self.layout.rows, self.layout.cols), dtype=bool).reshape(-1)
        n = min(int(tokens.shape[-1]), self.layout.num_tokens)
        n_codes = (n // self.layout.row_length) * self.layout.cols + min(n % self.layout.row_length, self.layout.cols)
        done[:n_codes] = True
        scale = arr.shape[0] // self.layout.rows
        mask = np.kron(done.reshape(self.layout.rows, self.layout.cols), np.ones((scale, scale), dtype=bool))
        arr = np.where(mask[..., None], arr, (arr * 0.25).astype(np.uint8))
        return Image.fromarray(arr)

    def unload(self) -> None:
        self.demo.model.to("cpu")
        self.demo.vq.to("cpu")
