"""transformers' own `generate` as a plain-AR baseline that does the same work as our AR.

`generate` cannot apply our recipe by itself: its `guidance_scale` runs the unconditional
prompt as a second, unbatched forward with its own cache, and it knows nothing of the image
layout's constraints (forced end-of-line tokens, image codes only). So the baseline feeds
`generate` both prompts as one left-padded batch (conditional row, unconditional row) and puts
the whole recipe into one logits processor, `RecipeLogitsProcessor`: CFG over the two rows,
the position's constraints, temperature, top-k/top-p (the library's own `processed_logits`),
then the draw; it returns scores where only the drawn token is finite, on both rows, so greedy
`generate` appends that token to both rows, exactly as our sampler feeds the committed token to
both.

With verify="gumbel" the draw is `argmax(log p + G_t)` with the library's position-keyed noise,
taken from the processed logits as the Gumbel rule's target is, so the baseline must return our
AR's tokens for the same seed (tests/test_bench.py checks it); with "rejection" it is a
multinomial draw from p.

Three rows: dynamic cache (`generate`), static cache, and static cache + `torch.compile`
(transformers' own auto-compilation of the decoding step; mode "reduce-overhead" on CUDA,
inductor's default elsewhere).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

import torch
from transformers import LogitsProcessor

from ..config import SamplerConfig
from ..models.causal_lm import CausalLMAdapter
from ..models.image_model import ARImageModel, PromptEncoding
from ..sampling.recipe import SamplingRecipe, TokenConstraints, processed_logits
from ..sampling.verify import gumbel_argmax_of_logs, gumbel_noise


class BaselineUnsupported(ValueError):
    """The model's family cannot run the `generate` baseline; the message says why."""


def causal_lm_of(model: Union[ARImageModel, CausalLMAdapter]):
    """The transformers model behind `model` (a loaded model, or a plain adapter itself) and its
    token space, when `generate` on it gives the sampler's logits."""
    adapter = model if isinstance(model, CausalLMAdapter) else getattr(model, "token_model", None)
    if type(adapter) is not CausalLMAdapter:  # family adapters change inputs or logits in hooks
        family = getattr(model, "family", type(adapter).__name__)
        raise BaselineUnsupported(
            f"the transformers-generate baseline needs a plain causal-LM adapter (the demo model or a "
            f"generic *ForCausalLM); the {family} family feeds its model through its own hooks, "
            "so drop generate* from --methods for it.")
    return adapter.model, adapter.token_space


class RecipeLogitsProcessor(LogitsProcessor):
    """CFG + constraints + temperature/top-k/top-p + the draw, for batched `generate`.

    Rows of `scores`: [conditional] or [conditional, unconditional]. `prompt_width` is the
    (left-padded) prompt length, so image position t = input_ids.shape[1] - prompt_width.
    """

    def __init__(self, recipe: SamplingRecipe, constraints: TokenConstraints, prompt_width: int,
                 verify: str, seed: int, token_space: Optional[torch.Tensor], device: torch.device) -> None:
        self.recipe = recipe
        self.constraints = constraints.to(device)
        self.prompt_width = prompt_width
        self.verify = verify
        self.seed = seed
        self.token_space = token_space
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.device = device
        self.first_drawn_at: Optional[float] = None  # clock after the first token (the prompt's pass)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        position = torch.tensor([input_ids.shape[1] - self.prompt_width], device=scores.device)
        logits = scores if self.token_space is None else scores.index_select(-1, self.token_space)
        processed = processed_logits(logits.unsqueeze(1), position, self.recipe, self.constraints)  # [1, V']
        if self.verify == "gumbel":  # the Gumbel rule's target (GumbelRule.target)
            token = gumbel_argmax_of_logs(processed, gumbel_noise(self.seed, position, processed.shape[-1]))
        else:
            token = torch.multinomial(torch.softmax(processed, dim=-1), 1, generator=self.generator).reshape(1)
        if self.token_space is not None:
            token = self.token_space[token]
        out = torch.full_like(scores, float("-inf"))
        out[:, token] = 0.0
        if self.first_drawn_at is None:  # once per run: the sampler's clocks also start here
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.first_drawn_at = time.perf_counter()
        return out


@dataclass
class GenerateOutput:
    tokens: torch.Tensor  # long [num_tokens], sampler token space, on the CPU
    seconds: float  # wall clock of the generate call alone
    after_first_seconds: float  # of which after the first token was drawn (the prompt's pass excluded)


def static_cache_length_supported() -> bool:
    """Whether this transformers sizes generate's static cache beyond the run (max_cache_len)."""
    from transformers import GenerationConfig

    return hasattr(GenerationConfig(), "max_cache_len")


class GenerateBaseline:
    """One `generate` configuration: dynamic or static cache, compiled or not.

    model: a loaded model (its plain causal-LM adapter), or such an adapter itself.
    prompt_width: left-pad every prompt to this many tokens (exact: padding is masked and the
    position ids follow the attention mask), so a static cache has one shape for the whole
    benchmark and the compiled step compiles once.
    cache_length: a static cache of at least this many positions (default: the prompt and the
    tokens), e.g. a whole image's when a run samples only part of one.
    compile_backend: torch.compile's backend for the compiled step (None: inductor).
    """

    def __init__(self, model: Union[ARImageModel, CausalLMAdapter], static: bool, compiled: bool,
                 prompt_width: int = 0, cache_length: Optional[int] = None,
                 compile_backend: Optional[str] = None) -> None:
        if compiled and not static:
            raise ValueError("transformers compiles generate only with a static cache; use static=True.")
        if cache_length is not None and not static:
            raise ValueError("cache_length sizes a static cache; use static=True.")
        if cache_length is not None and not static_cache_length_supported():
            raise ValueError("this transformers cannot size generate's static cache (GenerationConfig.max_cache_len); "
                             "upgrade transformers, or leave cache_length out.")
        self.model = model
        self.lm, self.token_space = causal_lm_of(model)
        self.static = static
        self.compiled = compiled
        self.prompt_width = prompt_width
        self.cache_length = cache_length
        self.compile_backend = compile_backend

    def _batch(self, encoding: PromptEncoding, use_cfg: bool):
        prompts = [encoding.prompt_ids] + ([encoding.uncond_ids] if use_cfg else [])
        width = max([self.prompt_width] + [int(p.numel()) for p in prompts])
        pad = self.lm.config.pad_token_id if self.lm.config.pad_token_id is not None else 0
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):  # one row per prompt (1 or 2)
            ids[row, width - prompt.numel():] = prompt.reshape(-1)
            attention[row, width - prompt.numel():] = 1
        device = self.model.device
        return ids.to(device), attention.to(device), width

    def _generation_config(self, num_tokens: int):
        from transformers import CompileConfig, GenerationConfig

        # guidance_scale=1.0 (not None): generate fills unset fields from the model folder's
        # generation_config.json, and a guidance_scale there (the demo's weights carry 2.0) would
        # add transformers' own CFG on top of the processor's.
        config = GenerationConfig(max_new_tokens=num_tokens, do_sample=False, eos_token_id=None,
                                  pad_token_id=self.lm.config.pad_token_id or 0, guidance_scale=1.0,
                                  cache_implementation="static" if self.static else None)
        if self.cache_length is not None:
            config.max_cache_len = self.cache_length  # the static cache's size, when larger than the run's
        if self.compiled:
            on_gpu = self.model.device.type == "cuda"
            compile_config = CompileConfig(mode="reduce-overhead" if on_gpu else "default")
            if self.compile_backend is not None:  # modes are inductor's
                compile_config.backend, compile_config.mode = self.compile_backend, None
            # transformers compiles automatically only on accelerators; this documented flag of
            # CompileConfig lets it compile on the CPU too.
            compile_config._compile_all_devices = True
            config.compile_config = compile_config
        else:
            config.disable_compile = True
        return config

    @torch.inference_mode()
    def generate(self, encoding: PromptEncoding, config: SamplerConfig, seed: int) -> GenerateOutput:
        from transformers import LogitsProcessorList

        use_cfg = config.uses_cfg
        if use_cfg and encoding.uncond_ids is None:
            raise ValueError("cfg_scale != 1 needs the model's unconditional prompt; this prompt has none.")
        ids, attention, width = self._batch(encoding, use_cfg)
        recipe = SamplingRecipe(config.cfg_scale, config.temperature, config.top_k, config.top_p)
        processor = RecipeLogitsProcessor(recipe, encoding.constraints, width, config.verify, seed,
                                          self.token_space, self.model.device)
        num_tokens = encoding.layout.num_tokens
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # generate's notes on unused flags
            start = time.perf_counter()
            out = self.lm.generate(input_ids=ids, attention_mask=attention,
                                   generation_config=self._generation_config(num_tokens),
                                   logits_processor=LogitsProcessorList([processor]))
            if self.model.device.type == "cuda":
                torch.cuda.synchronize(self.model.device)
            end = time.perf_counter()
        tokens = out[0, width:]
        if self.token_space is not None:  # model ids -> sampler ids
            lookup = torch.full((int(self.token_space.max()) + 1,), -1, dtype=torch.long, device=tokens.device)
            lookup[self.token_space] = torch.arange(self.token_space.numel(), device=tokens.device)
            tokens = lookup[tokens]
        return GenerateOutput(tokens=tokens.cpu(), seconds=end - start,
                              after_first_seconds=end - (processor.first_drawn_at or start))


def prompt_width(model: ARImageModel, prompts: Sequence[str]) -> int:
    """The longest prompt (conditional or unconditional) of a prompt list, in model tokens."""
    widths: List[int] = []
    for prompt in prompts:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            encoding = model.encode_prompt(prompt)
        widths.append(int(encoding.prompt_ids.numel()))
        if encoding.uncond_ids is not None:
            widths.append(int(encoding.uncond_ids.numel()))
    return max(widths)
