"""SamplerConfig: every knob of the sampler, validated once, with errors that name the fix."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Optional, Sequence, Tuple, Union

Method = Literal["ar", "sjd", "sjd_pac"]
VerifyRule = Literal["rejection", "gumbel"]
InitProposal = Literal["nearest", "uniform"]

METHODS = ("ar", "sjd", "sjd_pac")
VERIFY_RULES = ("rejection", "gumbel")
INIT_PROPOSALS = ("nearest", "uniform")


def tree_side_nodes(widths: Sequence[int]) -> int:
    """Nodes a full tree with these level widths adds beyond the main branch."""
    total, size = 0, 1
    for width in widths:
        size *= width
        total += size - 1
    return total


class ConfigError(ValueError):
    """A setting is out of range; the message says which and how to fix it."""


@dataclass(frozen=True)
class SamplerConfig:
    """How to sample image tokens.

    method: "ar" (one token per forward pass), "sjd" (Speculative Jacobi Decoding) or
        "sjd_pac" (SJD with Adaptive Continuation and Proactive Drafting). All three are lossless.
    window: L, the number of draft tokens verified per forward pass (sjd, sjd_pac), or "auto":
        chosen every pass from the measured forward cost of each window size on this hardware
        and the acceptance seen so far, to maximise tokens per second.
    tree_depth, tree_width: D and K of Proactive Drafting; the tree branches at the D-1
        positions after a rejection, with at most K candidates each.
    tree_every_pass: put the Proactive Drafting tree on the first D-1 positions of every pass's
        window (as the authors' sampler does), not only after a rejection (the paper's PD).
    tree_first_width: candidates at the tree's first level (None: K at every level). The
        defaults (every pass, 8 then K=4) gave the highest step compression on the demo model
        (docs/benchmark.md, "Drafting: where passes lose tokens, and what helped").
    adaptive_continuation, proactive_drafting: switch AC and PD separately (sjd_pac only), so
        the paper's ablation SJD / +PD / +AC / +PD+AC is one flag each.
    verify: "rejection" (speculative rejection sampling, exact in distribution) or "gumbel"
        (seed-exact: every method gives the same tokens as plain AR for the same seed).
    init_proposal: how positions new to the window are drafted: "nearest" (the stale
        distribution of the furthest position the last pass computed) or "uniform".
    cfg_scale, temperature, top_k, top_p: the sampling recipe, applied identically by every
        method (classifier-free guidance needs an unconditional prompt).
    compile: compile the fixed-shape forward pass with torch.compile (CUDA graphs on a GPU).
        The first run pays the compilation (see the README); the tokens are the same.
    """

    method: Method = "sjd_pac"
    window: Union[int, str] = 64
    tree_depth: int = 3
    tree_width: int = 4
    tree_every_pass: bool = True
    tree_first_width: Optional[int] = 8
    adaptive_continuation: bool = True
    proactive_drafting: bool = True
    verify: VerifyRule = "rejection"
    init_proposal: InitProposal = "nearest"
    cfg_scale: float = 1.0
    temperature: float = 1.0
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    compile: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"Unknown method {self.method!r}; choose one of {', '.join(METHODS)}.")
        if self.verify not in VERIFY_RULES:
            raise ConfigError(f"Unknown verify rule {self.verify!r}; choose 'rejection' or 'gumbel'.")
        if self.init_proposal not in INIT_PROPOSALS:
            raise ConfigError(
                f"Unknown init_proposal {self.init_proposal!r}; choose 'nearest' or 'uniform'."
            )
        if self.window != "auto" and (not isinstance(self.window, int) or self.window < 1):
            raise ConfigError(
                f"window (L) must be an integer >= 1 or 'auto', got {self.window!r}; try 32, 64 or 'auto'."
            )
        if not isinstance(self.tree_depth, int) or self.tree_depth < 1:
            raise ConfigError(
                f"tree_depth (D) must be an integer >= 1, got {self.tree_depth!r}; the paper uses 3."
            )
        if not isinstance(self.tree_width, int) or self.tree_width < 1:
            raise ConfigError(
                f"tree_width (K) must be an integer >= 1, got {self.tree_width!r}; the paper uses 4."
            )
        if self.tree_first_width is not None and (
            not isinstance(self.tree_first_width, int) or self.tree_first_width < 1
        ):
            raise ConfigError(
                f"tree_first_width must be None or an integer >= 1, got {self.tree_first_width!r}; "
                "None uses tree_width (K) at every level."
            )
        if self.temperature is None or not self.temperature > 0:
            raise ConfigError(
                f"temperature must be > 0, got {self.temperature!r}; use 1.0 for the model's own "
                "distribution (for a reproducible picture use verify='gumbel' instead of temperature 0)."
            )
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ConfigError(f"top_k must be None or an integer >= 1, got {self.top_k!r}.")
        if self.top_p is not None and not (0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top_p must be None or in (0, 1], got {self.top_p!r}.")
        if self.cfg_scale is None or self.cfg_scale < 0:
            raise ConfigError(f"cfg_scale must be >= 0, got {self.cfg_scale!r}; 1.0 disables guidance.")

    # Derived switches: the loop reads these, never the raw method string.
    @property
    def auto_window(self) -> bool:
        return self.method != "ar" and self.window == "auto"

    @property
    def window_size(self) -> int:
        """Draft tokens per pass (fixed windows); plain AR is SJD with an empty window."""
        return 0 if self.method == "ar" or self.window == "auto" else self.window

    @property
    def tree_widths(self) -> Tuple[int, ...]:
        """Candidates at each of the D - 1 PD levels."""
        if self.tree_depth < 2:
            return ()
        first = self.tree_first_width or self.tree_width
        return (first,) + (self.tree_width,) * (self.tree_depth - 2)

    @property
    def tree_side_nodes(self) -> int:
        """Nodes a full PD tree adds beyond the main branch."""
        if not self.use_pd:
            return 0
        return tree_side_nodes(self.tree_widths)

    @property
    def use_ac(self) -> bool:
        return self.method == "sjd_pac" and self.adaptive_continuation

    @property
    def use_pd(self) -> bool:
        return self.method == "sjd_pac" and self.proactive_drafting and self.tree_depth > 1

    @property
    def uses_cfg(self) -> bool:
        return self.cfg_scale != 1.0

    def with_(self, **changes) -> "SamplerConfig":
        """A validated copy with some fields changed."""
        return replace(self, **changes)

