"""A 7B-cost twin of the demo model: real acceptance at a real model's cost.

The demo model is trained (its conditionals are peaked, so drafts get accepted as on a real
image model) but tiny (its passes cost nothing on a GPU). A random-weight model of a 7B family's
shape costs what the real one costs, but its near-uniform conditionals accept almost nothing.
The twin runs both in every pass the sampler makes: the big model over the same rows, nodes,
mask and cache growth (its logits are dropped), and the demo (whose logits the sampler gets). So
a run on the twin has the demo's acceptance and the 7B model's cost per pass, through the
sampler's own entry points (`generate_image` / `sample_tokens`, compiled or not).

Context: the demo's image is shorter than the 7B family's. The twin's big rows start with a
prompt as long as the family's plus the image tokens before the demo's span, placed at the
middle of the family's image, so the span's mean context is a whole image's mean context; and
the big session reserves the rest of the image, so its cache (all of which a compiled pass
reads) has the size a real run's has.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List, Optional, Sequence

import torch

from ..models.base import DecoderSession, TokenModel
from ..models.causal_lm import CausalLMAdapter
from ..models.image_model import ARImageModel, FamilyDefaults, ImageLayout, PromptEncoding
from .shapes import Shape, text_vocab

# Tokens of a Lumina-mGPT unconditional prompt (image start and two size tokens): the second row's
# prompt before the image.
UNCOND_PROMPT_TOKENS = 3


@dataclass(frozen=True)
class TwinContext:
    """Where the demo's image tokens sit in the big model's image (token counts)."""

    prompt_tokens: int  # the family's prompt
    before: int  # image tokens of the big model's image before the demo's span (in its prompt)
    after: int  # image tokens after the span (reserved in its cache, never computed)

    @classmethod
    def middle(cls, shape: Shape, span: int) -> "TwinContext":
        """The demo's `span` tokens at the middle of the shape's image (at its start when the
        image is shorter than the span)."""
        spare = max(0, shape.image_tokens - span)
        return cls(shape.prompt_tokens, spare // 2, spare - spare // 2)


def cost_prompts(shape: Shape, context: TwinContext, rows: int, seed: int = 0) -> List[torch.Tensor]:
    """The big model's prompt rows: the conditional prompt, then (with CFG) the unconditional
    one, each followed by the image tokens before the span. Random ids below the image block: the
    cost of a pass does not depend on them."""
    g = torch.Generator().manual_seed(seed)
    lengths = [context.prompt_tokens, UNCOND_PROMPT_TOKENS][:rows]
    return [torch.randint(0, text_vocab(shape), (n + context.before,), generator=g) for n in lengths]


class TwinSession(DecoderSession):
    """Every call goes to both sessions; the logits are the demo's."""

    def __init__(self, logits: DecoderSession, cost: DecoderSession, cost_vocab: int, after: int) -> None:
        self.logits, self.cost = logits, cost
        self.cost_vocab = cost_vocab
        self.after = after

    def configure(self, extra_tokens: int, vocabulary: Optional[torch.Tensor] = None, compile: bool = False) -> None:
        self.logits.configure(extra_tokens, vocabulary, compile)
        # the rest of the big model's image: its cache has a whole image's size
        self.cost.configure(extra_tokens + self.after, None, compile)

    def start_compiled(self) -> None:
        self.logits.start_compiled()
        self.cost.start_compiled()

    def prefill(self) -> torch.Tensor:
        self.cost.prefill()
        return self.logits.prefill()

    def forward(self, tokens: torch.Tensor, depths: torch.Tensor, attend: torch.Tensor) -> torch.Tensor:
        self.cost.forward(tokens % self.cost_vocab, depths, attend)  # the same nodes, in its token space
        return self.logits.forward(tokens, depths, attend)

    def keep(self, nodes: Sequence[int]) -> None:
        self.cost.keep(nodes)
        self.logits.keep(nodes)

    @property
    def compaction_bytes(self) -> int:
        return self.cost.compaction_bytes + self.logits.compaction_bytes

    def compiled_shape_ready(self, size: int) -> bool:
        return self.cost.compiled_shape_ready(size) and self.logits.compiled_shape_ready(size)

    def close(self) -> None:
        try:
            self.cost.close()
        finally:
            self.logits.close()


class TwinTokenModel(TokenModel):
    """The demo's TokenModel with a big model's cost in every pass (see the module docstring).

    It has no `model` attribute on purpose: the engine keys its measured pass costs by the
    network behind a TokenModel, and the twin's cost is not the demo network's.
    """

    def __init__(self, logits: TokenModel, cost: CausalLMAdapter, shape: Shape, span: int) -> None:
        self.logits_model, self.cost_model = logits, cost
        self.shape = shape
        self.context = TwinContext.middle(shape, span)
        self.vocab_size = logits.vocab_size

    @property
    def device(self) -> torch.device:
        return self.logits_model.device

    def cost_prompts(self, rows: int) -> List[torch.Tensor]:
        return cost_prompts(self.shape, self.context, rows)

    def open_session(self, prompts: Sequence[torch.Tensor]) -> TwinSession:
        logits = self.logits_model.open_session(prompts)
        try:
            cost = self.cost_model.open_session(self.cost_prompts(len(prompts)))
        except BaseException:
            logits.close()
            raise
        return TwinSession(logits, cost, self.cost_model.vocab_size, self.context.after)


def image_strip(encoding: PromptEncoding, rows: int) -> PromptEncoding:
    """The encoding of the first `rows` rows of the image (the whole image if it has no more)."""
    full = encoding.layout
    if rows >= full.rows:
        return encoding
    row_end = full.row_end[:rows] if isinstance(full.row_end, tuple) else full.row_end
    layout = ImageLayout(rows, full.cols, row_end=row_end)
    allowed = encoding.constraints.allowed
    allowed = allowed if allowed.dim() == 1 else allowed[: layout.num_tokens]
    return replace(encoding, layout=layout, constraints=layout.constraints(encoding.constraints.vocab_size, allowed))


class TwinImageModel(ARImageModel):
    """The demo model's prompts, layout and decoder, sampled through the twin.

    Its sampler defaults are the demo's recipe (CFG, temperature, top-k: what its acceptance was
    calibrated at) with the library's drafting defaults, which a 7B family keeps. `rows` samples
    only the image's first rows (a quick check; decoded as the demo's preview of a partial image).
    """

    family = "demo-7b-twin"

    def __init__(self, demo: ARImageModel, cost: CausalLMAdapter, shape: Shape, rows: Optional[int] = None) -> None:
        self.demo = demo
        self.name = f"demo + {shape.name} (random weights)"
        recipe = demo.defaults.sampler_config()
        self.defaults = FamilyDefaults(demo.defaults.resolutions, dict(
            cfg_scale=recipe.cfg_scale, temperature=recipe.temperature, top_k=recipe.top_k, top_p=recipe.top_p))
        full = demo.encode_prompt("")
        self.full_tokens = full.layout.num_tokens
        self.rows = full.layout.rows if rows is None else min(rows, full.layout.rows)
        self.layout = image_strip(full, self.rows).layout
        self.token_model = TwinTokenModel(demo.token_model, cost, shape, self.layout.num_tokens)

    def encode_prompt(self, prompt: str, negative_prompt: str = "", resolution: Optional[str] = None) -> PromptEncoding:
        return image_strip(self.demo.encode_prompt(prompt, negative_prompt, resolution), self.rows)

    def decode(self, tokens: torch.Tensor, resolution: Optional[str] = None):
        if tokens.shape[-1] == self.full_tokens:
            return self.demo.decode(tokens, resolution)
        return [self.demo.preview(row, resolution) for row in tokens.reshape(-1, tokens.shape[-1])]

    def cost_encoding(self, rows: int) -> PromptEncoding:
        """The big model's own prompt for a run of the same image tokens (transformers' `generate`
        on the big model alone): its prompt rows, and the demo's layout in its token space, the
        last code standing for the end-of-line token."""
        twin = self.token_model
        prompts = twin.cost_prompts(rows)
        vocab = twin.cost_model.vocab_size
        row_end = None if self.layout.row_end is None else vocab - 1
        layout = ImageLayout(self.layout.rows, self.layout.cols, row_end=row_end,
                             tail=(vocab - 1,) * len(self.layout.tail))
        codes = torch.arange(vocab - 1)
        return PromptEncoding(prompt_ids=prompts[0], uncond_ids=prompts[1] if rows > 1 else None, layout=layout,
                              constraints=layout.constraints(vocab, codes), resolution=self.defaults.resolution)

    def unload(self) -> None:
        self.demo.unload()
