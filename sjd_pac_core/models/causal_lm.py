"""Any decoder-only transformers causal LM as a TokenModel.

Mechanics (verified in ../shared/spec/models.md): a preallocated KV cache (kv_cache.py) kept
across passes: a pass writes its nodes after the committed entries, rollback moves the write
pointer, and compaction after a tree pass moves only the accepted path's entries. Tree passes
carry an additive 4D mask, updated in place per pass size, and explicit position ids; CFG rows
are left-padded to one batch.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from ..config import ConfigError
from ..transfer import to_device
from ..sampling import tree as tree_lib
from .base import DecoderSession, TokenModel
from .config_checks import sliding_window, window_message
from .kv_cache import CacheCursor, TreeKVCache

# Cache entries a session reserves beyond its prompt when the sampler does not say how many.
DEFAULT_EXTRA_ENTRIES = 1024
# Families whose head is a plain linear map of the last hidden state, so computing only some of
# its rows is exact (no logit scaling or soft-capping after it).
PLAIN_HEAD_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# torch.compile backend of compiled passes; None = the default (inductor). Tests may use
# "aot_eager", which traces the same graph without generating kernels.
COMPILE_BACKEND: Optional[str] = None
# Graphs one compiled pass function may build (one per pass size and cache capacity).
COMPILED_GRAPH_LIMIT = 64
# A compiled pass is specialised to the cache's capacity. Rounding the capacity of compiled
# sessions up to a multiple of this keeps prompts of different lengths on one graph (the bench
# recompiled for every new prompt length before); the extra slots stay masked out.
COMPILED_CAPACITY_STEP = 256


class NotACausalLMError(TypeError):
    pass


def is_causal_lm(model: object) -> bool:
    return isinstance(model, PreTrainedModel) and model.get_output_embeddings() is not None


@dataclass
class _PassMask:
    """The additive mask of one pass size, [B, 1, S, capacity], kept and updated in place."""

    values: torch.Tensor
    valid_upto: int = 0  # columns [0, valid_upto) hold the committed keys' validity
    dirty_upto: int = 0  # columns up to here may still hold the last pass's tree block


class CausalLMSession(DecoderSession):
    def __init__(self, adapter: "CausalLMAdapter", prompts: Sequence[torch.Tensor]) -> None:
        self.adapter = adapter
        device = adapter.device
        lengths = [int(p.shape[0]) for p in prompts]
        width = max(lengths)
        self.pad = torch.tensor([width - n for n in lengths], device=device)
        ids = torch.zeros(len(prompts), width, dtype=torch.long, device=device)
        for row, prompt in enumerate(prompts):  # one row per prompt (1 or 2), not per token
            ids[row, width - lengths[row] :] = prompt.to(device)
        self.prompt_ids = ids
        self.width = width
        self.cursor = CacheCursor(capacity=width + DEFAULT_EXTRA_ENTRIES)
        self.cache: Optional[TreeKVCache] = TreeKVCache(self.cursor, adapter.cache_layers)
        self.compiled = False
        self.masks: Dict[int, _PassMask] = {}
        self._set_capacity(self.cursor.capacity)
        self.past = 0  # committed cache entries (the write pointer)
        self.last_pass = 0  # nodes fed in the last pass

    def _set_capacity(self, capacity: int) -> None:
        device = self.prompt_ids.device
        with torch.inference_mode(False):  # read inside compiled passes (as the cache's slots)
            self.columns = torch.arange(capacity, device=device)
        # A key is valid unless it is a left-padding column of its row (CFG rows differ in length).
        self.key_valid = self.columns.unsqueeze(0) >= self.pad.unsqueeze(1)
        self.masks = {}

    def _check_window(self, positions: int, need: str) -> None:
        """A model with a sliding attention window is sampled exactly only while every position
        of the run fits in the window (our masks let each position see all earlier ones)."""
        window = self.adapter.sliding_window
        if window is not None and positions > window:
            raise ConfigError(window_message(
                type(self.adapter.model).__name__, window, need,
                "ask for fewer tokens (a run that fits in the window is exact), or use a model without "
                "sliding-window attention"))

    def configure(self, extra_tokens: int, vocabulary: Optional[torch.Tensor] = None, compile: bool = False) -> None:
        self._check_window(self.width + extra_tokens, (
            f"this run reserves {self.width + extra_tokens:,} positions (the {self.width}-token prompt, the tokens "
            "asked for and room for one pass)"))
        capacity = self.width + extra_tokens
        if compile:
            capacity = -(-capacity // COMPILED_CAPACITY_STEP) * COMPILED_CAPACITY_STEP
        if capacity != self.cursor.capacity and self.past == 0:
            self.cursor.capacity = capacity
            self._set_capacity(capacity)
        self.adapter.restrict_head(vocabulary)

    def start_compiled(self) -> None:
        self.compiled = True

    def _ensure_capacity(self, needed: int) -> None:
        if needed > self.cursor.capacity:  # only when a caller outgrows what it reserved
            capacity = max(needed, 2 * self.cursor.capacity)
            self.cache.grow(capacity)
            self._set_capacity(capacity)

    # Each row's position id for the next new token: its real (unpadded) length so far.
    def _next_positions(self) -> torch.Tensor:
        return self.past - self.pad

    def prefill(self) -> torch.Tensor:
        width = self.prompt_ids.shape[1]
        self._check_window(width, f"the prompt alone has {width:,} tokens")
        causal = torch.ones(width, width, dtype=torch.bool, device=self.prompt_ids.device).tril()
        # Padding queries attend to themselves so their states stay finite (a fully masked row
        # gives NaN, and NaN values poison later layers even behind a zero attention weight).
        key_valid = self.key_valid[:, :width]
        allowed = causal & (key_valid.unsqueeze(1) | torch.eye(width, dtype=torch.bool, device=causal.device))
        dtype = self.adapter.mask_dtype
        mask = torch.zeros(allowed.shape, dtype=dtype, device=causal.device).masked_fill(
            ~allowed, torch.finfo(dtype).min
        )
        positions = (torch.arange(width, device=causal.device).unsqueeze(0) - self.pad.unsqueeze(1)).clamp(min=0)
        self._point(0, width, visible=width)
        logits = self.adapter.forward_logits(
            self.adapter.embed_prompt(self.prompt_ids), mask.unsqueeze(1), positions, self.cache, last_only=True
        )
        self.past = width
        self.last_pass = 0
        return logits[:, -1]

    def _point(self, past: int, size: int, visible: Optional[int]) -> None:
        self.cursor.slots = self.columns[past : past + size]
        self.cursor.visible = visible
        self.cursor.length = past

    def _mask(self, attend: torch.Tensor, past: int, size: int) -> torch.Tensor:
        """The pass's additive mask: committed keys by validity, the new block by `attend`,
        everything after blocked. Only the columns that changed since the last pass of this
        size are written: those `tree_attention_mask` gives for the keys committed since then
        and the new block."""
        buf = self.masks.get(size)
        if buf is None:
            shape = (self.key_valid.shape[0], 1, size, self.cursor.capacity)
            with torch.inference_mode(False):  # updated in place, in and out of inference mode
                values = torch.full(shape, torch.finfo(self.adapter.mask_dtype).min, dtype=self.adapter.mask_dtype,
                                    device=self.key_valid.device)
            buf = self.masks[size] = _PassMask(values)
        if past < buf.valid_upto:  # the cache shrank (a new prompt on a reused session): redo those
            buf.dirty_upto, buf.valid_upto = max(buf.dirty_upto, buf.valid_upto), past
        first = buf.valid_upto
        if buf.dirty_upto > past + size:
            buf.values[:, :, :, past + size : buf.dirty_upto] = torch.finfo(self.adapter.mask_dtype).min
        changed = tree_lib.tree_attention_mask(attend, self.key_valid[:, first:past], self.adapter.mask_dtype)
        buf.values[:, :, :, first : past + size] = changed
        buf.valid_upto, buf.dirty_upto = past, past + size
        return buf.values if self.compiled else buf.values[..., : past + size]

    def forward(self, tokens: torch.Tensor, depths: torch.Tensor, attend: torch.Tensor) -> torch.Tensor:
        b = self.prompt_ids.shape[0]
        size, past = int(tokens.shape[0]), self.past
        self._check_window(past + size, f"this pass reaches position {past + size:,}")
        self._ensure_capacity(past + size)
        mask = self._mask(attend, past, size)
        positions = tree_lib.tree_position_ids(depths, self._next_positions())
        inputs = self.adapter.embed_tokens(tokens.unsqueeze(0).expand(b, -1))
        self._point(past, size, visible=None if self.compiled else past + size)
        if self.compiled:
            logits = self.adapter.compiled_step(inputs, mask, positions, self.cache)
            self.adapter.compiled_shapes.add(self._graph_key(size))
        else:
            logits = self.adapter.forward_logits(inputs, mask, positions, self.cache, last_only=False)
        self.last_pass = size
        return logits

    def _graph_key(self, size: int) -> tuple:
        head = self.adapter.restricted_ids
        return (self.prompt_ids.shape[0], size, self.cursor.capacity, None if head is None else int(head.numel()))

    def compiled_shape_ready(self, size: int) -> bool:
        return self.compiled and self._graph_key(size) in self.adapter.compiled_shapes

    def keep(self, nodes: Sequence[int]) -> None:
        """Keep these nodes of the last pass: the write pointer moves past them, and only the
        entries not already in place are copied (none after a pass that accepted a prefix)."""
        nodes = list(nodes)
        past = self.past
        moved = next((i for i, node in enumerate(nodes) if node != i), len(nodes))
        if moved < len(nodes):
            source = to_device([past + node for node in nodes[moved:]], self.columns.device)
            self.cache.move(source, self.columns[past + moved : past + len(nodes)])
        self.past = past + len(nodes)
        self.last_pass = 0

    @property
    def compaction_bytes(self) -> int:
        """Bytes compaction has copied in this session (keys and values, every layer)."""
        return self.cursor.moved_bytes

    def close(self) -> None:
        self.cache = None
        self.key_valid = None
        self.masks = {}


class CausalLMAdapter(TokenModel):
    """Wraps a transformers causal LM. Subclasses override the three hooks below.

    token_space: optional long [V'] of model vocabulary ids the sampler works in; sampler id i
    is model id token_space[i]. Restricting logits to it is exact when every other id is
    disallowed at every image position, and it saves most of the head's cost on big vocabularies.
    """

    def __init__(self, model: PreTrainedModel, token_space: Optional[torch.Tensor] = None) -> None:
        if not is_causal_lm(model):
            raise NotACausalLMError(
                f"{type(model).__name__} is not a causal language model; pass a transformers "
                "*ForCausalLM model, or a model loaded with sjd_pac_core.load_model."
            )
        self.model = model.eval()
        head = model.get_output_embeddings()
        vocab = int(getattr(head, "out_features", None) or head.weight.shape[0])
        self.token_space = None if token_space is None else token_space.to(self.device)
        self.vocab_size = vocab if token_space is None else int(token_space.shape[0])
        # Where the model attends over a sliding window shorter than its context, its length: a run
        # is exact (and allowed) only while all its positions fit in it.
        self.sliding_window = sliding_window(model.config)
        self.restricted_ids: Optional[torch.Tensor] = None  # restricted head: these rows only
        self.restricted_rows: Optional[torch.Tensor] = None
        self._compiled = None
        # (rows, pass size, cache capacity, head rows) of every compiled pass run so far: a later
        # run's warm-up skips those shapes (their graphs exist; running them again costs time).
        self.compiled_shapes: set = set()

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def cache_layers(self) -> Optional[int]:
        """The decoder's layer count when every layer sits on one device (their cache then
        shares one storage), else None."""
        config = self.model.config
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        layers = getattr(text, "num_hidden_layers", None)  # GPT-2's n_layer too (its attribute map)
        devices = set(getattr(self.model, "hf_device_map", {}).values())
        if not isinstance(layers, int) or layers < 1 or len(devices) > 1:
            return None
        return layers

    @property
    def mask_dtype(self) -> torch.dtype:
        dtype = self.model.dtype
        return dtype if dtype.is_floating_point else torch.float32

    def open_session(self, prompts: Sequence[torch.Tensor]) -> CausalLMSession:
        return CausalLMSession(self, prompts)

    # --- hooks -----------------------------------------------------------------------------
    def embed_prompt(self, prompt_ids: torch.Tensor) -> dict:
        """Model inputs for the prompt rows (model vocabulary ids)."""
        return {"input_ids": prompt_ids}

    def embed_tokens(self, token_ids: torch.Tensor) -> dict:
        """Model inputs for sampler-space tokens [B, S]."""
        ids = token_ids if self.token_space is None else self.token_space[token_ids]
        return {"input_ids": ids}

    def restrict_head(self, vocabulary: Optional[torch.Tensor]) -> None:
        """Compute only the head rows of tokens that may ever be sampled (bool [V] in the
        sampler's token space, or None for the whole head).

        Exact: every other token is masked out at every position anyway. Done where the head is
        a plain linear map of the last hidden state (PLAIN_HEAD_MODEL_TYPES); the rows are
        copied once per distinct set.
        """
        head = self.model.get_output_embeddings()
        plain = (
            getattr(self.model.config, "model_type", None) in PLAIN_HEAD_MODEL_TYPES
            and isinstance(head, torch.nn.Linear) and head.bias is None
            and head.weight.device.type != "meta"
        )
        if not plain or vocabulary is None:
            self.restricted_ids = self.restricted_rows = None
            return
        ids = vocabulary.nonzero().flatten().to(head.weight.device)
        if self.restricted_ids is not None and torch.equal(ids, self.restricted_ids):
            return
        if self.token_space is None and ids.numel() == self.vocab_size:
            self.restricted_ids = self.restricted_rows = None  # the whole head is needed
            return
        model_ids = ids if self.token_space is None else self.token_space.to(ids.device)[ids]
        with torch.no_grad():
            self.restricted_rows = head.weight.index_select(0, model_ids).detach()
        self.restricted_ids = ids

    def _fixed_shape_step(self, inputs: dict, mask, positions, cache) -> torch.Tensor:
        # forward_logits without its inference_mode decorator: torch.compile cannot trace views
        # made in inference mode; the caller runs this under no_grad instead.
        forward = inspect.unwrap(type(self).forward_logits)
        return forward(self, inputs, mask, positions, cache, last_only=False)

    def compiled_step(self, inputs: dict, mask, positions, cache) -> torch.Tensor:
        """A fixed-shape pass through forward_logits compiled with torch.compile (CUDA graphs on
        a GPU). The graph is built once per adapter and pass size. torch.compile cannot trace
        views of inference tensors, so the pass runs on ordinary copies of its small inputs."""
        import torch._dynamo  # noqa: F401  (its config; loaded by torch.compile in any case)

        if self._compiled is None:
            if COMPILE_BACKEND is not None:
                self._compiled = torch.compile(self._fixed_shape_step, backend=COMPILE_BACKEND, dynamic=False)
            else:
                mode = "reduce-overhead" if self.device.type == "cuda" else None
                self._compiled = torch.compile(self._fixed_shape_step, mode=mode, dynamic=False)
        # One graph per pass size is by design (an auto window has up to eight): allow them all
        # here rather than fall back to eager at torch.compile's default limit of eight.
        with torch.inference_mode(False), torch.no_grad(), \
                torch._dynamo.config.patch(recompile_limit=COMPILED_GRAPH_LIMIT):
            inputs = {name: value.clone() for name, value in inputs.items()}
            return self._compiled(inputs, mask, positions.clone(), cache)

    @torch.inference_mode()
    def forward_logits(self, inputs: dict, mask, positions, cache, last_only: bool) -> torch.Tensor:
        """Logits [B, S, V] in the sampler's token space."""
        if self.restricted_rows is not None:
            out = self.model.get_decoder()(
                **inputs, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True
            )
            hidden = out.last_hidden_state
            if last_only:
                hidden = hidden[:, -1:]
            rows = F.linear(hidden.to(self.restricted_rows.device), self.restricted_rows)
            # Tokens outside the head's rows are never allowed; their logits only need to exist.
            logits = rows.new_zeros(rows.shape[:-1] + (self.vocab_size,))
            return logits.index_copy_(-1, self.restricted_ids, rows).to(self.device)
        out = self.model(
            **inputs,
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
        )
        logits = out.logits
        if self.token_space is not None:
            logits = logits.index_select(-1, self.token_space)
        return logits


def as_token_model(model: object) -> TokenModel:
    """A TokenModel for the sampler: adapters pass through, causal LMs get wrapped."""
    if isinstance(model, TokenModel):
        return model
    token_model = getattr(model, "token_model", None)  # an ARImageModel from load_model
    if isinstance(token_model, TokenModel):
        return token_model
    if is_causal_lm(model):
        return CausalLMAdapter(model)
    raise NotACausalLMError(
        f"{type(model).__name__} is not a causal language model; pass a transformers "
        "*ForCausalLM model, or a model loaded with sjd_pac_core.load_model."
    )
