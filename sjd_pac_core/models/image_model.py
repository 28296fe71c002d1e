"""ARImageModel: one loaded text-to-image family (tokenizer, token layout, sampler adapter, decoder).

Every family (the bundled demo model, Lumina-mGPT, Emu3, Janus-Pro) is one subclass, returned by
`load_model`. The sampler only sees `token_model`; the nodes, the app, the CLI and the benchmark
only see this class and `generate_image`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from PIL import Image

from ..config import ConfigError, SamplerConfig
from ..sampling.recipe import TokenConstraints
from .base import TokenModel

SAMPLER_FIELDS = frozenset(f.name for f in fields(SamplerConfig))


@dataclass(frozen=True)
class ImageLayout:
    """The image part of the sequence: rows of codes, each optionally closed by a forced token.

    Token ids are in the sampler's token space. Layout: for each row, `cols` free image tokens,
    then `row_end` if given (one id for every row, or one id per row); after the last row, the
    `tail` tokens (forced as well).
    """

    rows: int
    cols: int
    row_end: Union[int, Tuple[int, ...], None] = None  # end-of-line token id (or one per row), or None
    tail: Tuple[int, ...] = ()  # forced tokens after the grid (end-of-image, ...)

    def __post_init__(self) -> None:
        if isinstance(self.row_end, tuple) and len(self.row_end) != self.rows:
            raise ValueError(f"row_end has {len(self.row_end)} ids for {self.rows} rows")

    @property
    def row_length(self) -> int:
        return self.cols + (1 if self.row_end is not None else 0)

    @property
    def num_tokens(self) -> int:
        return self.rows * self.row_length + len(self.tail)

    def forced_tokens(self) -> torch.Tensor:
        """long [num_tokens]: the forced token at each position, -1 where free."""
        forced = torch.full((self.num_tokens,), -1, dtype=torch.long)
        if self.row_end is not None:
            forced[self.cols : self.rows * self.row_length : self.row_length] = torch.as_tensor(self.row_end)
        if self.tail:
            forced[self.rows * self.row_length :] = torch.tensor(self.tail)
        return forced

    def constraints(self, vocab_size: int, image_tokens: torch.Tensor) -> TokenConstraints:
        """Free positions may take only `image_tokens` (ids or a bool mask); the rest are forced."""
        if image_tokens.dtype == torch.bool:
            allowed = image_tokens
        else:
            allowed = torch.zeros(vocab_size, dtype=torch.bool)
            allowed[image_tokens] = True
        return TokenConstraints(vocab_size, self.num_tokens, allowed=allowed, forced=self.forced_tokens(),
                                row_length=self.row_length)

    def grid(self, tokens: torch.Tensor) -> torch.Tensor:
        """[..., num_tokens] -> [..., rows, cols]: the image codes without the forced tokens."""
        body = tokens[..., : self.rows * self.row_length]
        body = body.reshape(*tokens.shape[:-1], self.rows, self.row_length)
        return body[..., : self.cols]

    def partial_grid(self, tokens: torch.Tensor, filler: int) -> torch.Tensor:
        """The grid of a partially sampled image, unsampled cells set to `filler`."""
        full = torch.full((self.num_tokens,), filler, dtype=torch.long)
        n = min(int(tokens.shape[-1]), self.num_tokens)
        full[:n] = tokens[:n].cpu()
        return self.grid(full)


@dataclass(frozen=True)
class FamilyDefaults:
    """A family's resolutions and its recommended sampler settings (from its reference code).

    `sampler` holds only what the family changes from SamplerConfig's own defaults (e.g. its CFG
    scale and top-k), so a new SamplerConfig field needs no edit here; `sampler_config()` is the
    one way to get the family's config. A setting reads as an attribute too (`defaults.cfg_scale`
    is `defaults.sampler_config().cfg_scale`).
    """

    resolutions: Tuple[str, ...]  # e.g. ("768x768", "512x512"); the first is the default
    sampler: Dict[str, Any] = field(default_factory=dict, hash=False)  # SamplerConfig fields -> values

    def __post_init__(self) -> None:
        object.__setattr__(self, "sampler", dict(self.sampler))
        self.sampler_config()  # a wrong override fails where the family writes it, naming the field

    @property
    def resolution(self) -> str:
        return self.resolutions[0]

    def sampler_config(self, **overrides) -> SamplerConfig:
        """SamplerConfig's defaults, then the family's settings, then `overrides`."""
        return SamplerConfig.from_mapping({**self.sampler, **overrides})

    def with_sampler(self, **changes) -> "FamilyDefaults":
        """A copy whose sampler settings also set `changes`."""
        return FamilyDefaults(self.resolutions, {**self.sampler, **changes})

    def __getattr__(self, name: str) -> Any:
        # Only for names normal lookup misses: the sampler settings, read from the family's config.
        if name in SAMPLER_FIELDS:
            return getattr(self.sampler_config(), name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")


@dataclass
class PromptEncoding:
    """What the sampler needs for one prompt at one resolution."""

    prompt_ids: torch.Tensor  # long [T], model vocabulary ids
    uncond_ids: Optional[torch.Tensor]  # long [T'], for classifier-free guidance
    layout: ImageLayout
    constraints: TokenConstraints
    resolution: str
    warnings: List[str] = field(default_factory=list)


class ARImageModel(ABC):
    """A loaded AR text-to-image model of one family."""

    family: str = "base"
    name: str = ""
    quantize: str = "none"  # the precision load_model chose: "none", "int8" or "4bit"
    memory_plan = None  # load_model's MemoryPlan (None for the demo model)
    defaults: FamilyDefaults
    token_model: TokenModel
    # The resolution encode_prompt last set up (families with several sizes): what decode reads
    # tokens as when several sizes have as many tokens, and what preview shows when not told.
    _last_resolution: Optional[str] = None
    # The family's recommended sampler settings (its reference code), changes of SamplerConfig's.
    SAMPLER_DEFAULTS: Dict[str, Any] = {}

    @classmethod
    def defaults_for_folder(cls, folder: Path) -> FamilyDefaults:
        """The family's settings for a checkpoint folder from its small files alone (no model is
        built); its sizes are left empty where only the loaded model knows them. `sjd-pac batch`
        checks its jobs against these before loading."""
        return FamilyDefaults((), cls.SAMPLER_DEFAULTS)

    @property
    def device(self) -> torch.device:
        return self.token_model.device

    def check_resolution(self, resolution: Optional[str]) -> str:
        """The resolution to use; one sentence naming the choices if it is not supported."""
        resolution = resolution or self.defaults.resolution
        if isinstance(resolution, int):
            resolution = f"{resolution}x{resolution}"
        if resolution not in self.defaults.resolutions:
            raise ConfigError(
                f"{self.family} does not support resolution {resolution}; choose one of "
                f"{', '.join(self.defaults.resolutions)}."
            )
        return resolution

    @abstractmethod
    def encode_prompt(
        self, prompt: str, negative_prompt: str = "", resolution: Optional[str] = None
    ) -> PromptEncoding:
        """Prompt text -> ids, unconditional ids, token layout and constraints."""

    @abstractmethod
    def decode(self, tokens: torch.Tensor, resolution: Optional[str] = None) -> List[Image.Image]:
        """Image tokens [num_tokens] or [B, num_tokens] (sampler token space) -> PIL images.

        Tokens that cannot be this model's image - another length than the resolution's layout,
        or an id outside the codebook at an image position (another model's tokens) - are a
        ConfigError before any decoding (`decode_rows`, `check_image_tokens`)."""

    # --- decode's input checks ----------------------------------------------------------------
    _DECODE_FIX = "pass tokens this model sampled (a result's tokens; another model's tokens do not decode)"

    def decode_rows(self, tokens: object) -> torch.Tensor:
        """decode's tokens as a long [B, num_tokens] tensor on the CPU; ConfigError for anything
        that is not one image's or a batch's integer token ids."""
        if not isinstance(tokens, torch.Tensor):
            try:
                tokens = torch.as_tensor(tokens)
            except (TypeError, ValueError, RuntimeError):
                raise ConfigError(
                    f"decode needs image tokens (a LongTensor of ids), got a {type(tokens).__name__}; "
                    f"{self._DECODE_FIX}."
                ) from None
        if tokens.dtype == torch.bool or tokens.is_floating_point() or tokens.is_complex():
            raise ConfigError(f"decode needs integer token ids, got a {tokens.dtype} tensor; {self._DECODE_FIX}.")
        if tokens.dim() not in (1, 2) or tokens.numel() == 0:
            raise ConfigError(
                f"decode needs one image's tokens [num_tokens] or a batch [B, num_tokens], got shape "
                f"{list(tokens.shape)}; {self._DECODE_FIX}."
            )
        return tokens.reshape(-1, tokens.shape[-1]).long().cpu()

    def resolution_for(self, count: int, resolution: Optional[str], layout_of) -> str:
        """The resolution of `count` tokens per image: the one given (checked), else the one whose
        layout (layout_of(resolution)) has that many tokens - the last encoded or the default first
        where several do (e.g. a transposed size)."""
        if resolution is not None:
            return self.check_resolution(resolution)
        matches = [r for r in self.defaults.resolutions if layout_of(r).num_tokens == count]
        for preferred in (self._last_resolution, self.defaults.resolution):
            if preferred in matches:
                return preferred
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise ConfigError(
                f"{count:,} tokens fit several {self.family} sizes ({', '.join(matches)}); pass resolution=."
            )
        sizes = ", ".join(f"{r}: {layout_of(r).num_tokens:,}" for r in self.defaults.resolutions)
        raise ConfigError(
            f"decode got {count:,} tokens per image, which is no {self.family} image size ({sizes}); "
            f"{self._DECODE_FIX}."
        )

    def check_image_tokens(self, rows: torch.Tensor, layout: ImageLayout, codes: Tuple[int, int],
                           resolution: str) -> torch.Tensor:
        """rows (from decode_rows) must have the layout's length, ids of the sampler's token space,
        and image codes (ids codes[0]..codes[1]-1) at every image position."""
        if rows.shape[-1] != layout.num_tokens:
            raise ConfigError(
                f"decode got {rows.shape[-1]:,} tokens per image, but a {resolution} {self.family} image has "
                f"{layout.num_tokens:,}; {self._DECODE_FIX}."
            )
        vocab = self.token_model.vocab_size
        outside = rows[(rows < 0) | (rows >= vocab)]
        if outside.numel():
            raise ConfigError(
                f"decode got the id {int(outside[0])}, outside the {vocab:,} ids of {self.family}'s token space; "
                f"{self._DECODE_FIX}."
            )
        grid = layout.grid(rows)
        off_code = grid[(grid < codes[0]) | (grid >= codes[1])]
        if off_code.numel():
            raise ConfigError(
                f"decode got the id {int(off_code[0])} where an image code belongs, but {self.family} image codes "
                f"are the ids {codes[0]}..{codes[1] - 1}; {self._DECODE_FIX}."
            )
        return rows

    def preview(self, tokens: torch.Tensor, resolution: Optional[str] = None) -> Optional[Image.Image]:
        """A picture of a partially sampled image; families override with something cheaper."""
        return None

    def unload(self) -> None:
        """Release weights (ComfyUI's free-memory hook calls this)."""
