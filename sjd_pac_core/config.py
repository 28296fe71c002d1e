"""SamplerConfig: every knob of the sampler, validated once, with errors that name the fix."""

from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import dataclass, fields, replace
from typing import Any, Dict, Iterable, Literal, Mapping, Optional, Tuple, Union

import numpy as np

Method = Literal["ar", "sjd", "sjd_pac"]
VerifyRule = Literal["rejection", "gumbel"]
InitProposal = Literal["nearest", "uniform"]

METHODS = ("ar", "sjd", "sjd_pac")
VERIFY_RULES = ("rejection", "gumbel")
INIT_PROPOSALS = ("nearest", "uniform")


class ConfigError(ValueError):
    """A setting is out of range; the message says which and how to fix it."""


# Work budget of one forward pass, checked before any work. A Proactive Drafting tree has
# F + F*K + ... + F*K^(D-2) nodes below its root (F the first level's width, K the others'), so
# its cost grows as K^(D-1): D = 8, K = 4 would be 21,844 nodes per pass (and a mask of 21,844^2
# entries). These bounds keep every pass small enough to build and run in well under a second
# of sampler work on any machine.
MAX_TREE_NODES = 256  # PD tree nodes below the root (default D=3, first level 8, K=4: 40)
# Chain siblings grow linearly with L (W - 1 per chain position), not as K^(D-1): at L = 64,
# W = 12-16 adds 693-945 nodes behind one tree level, the widths that reach 6x step compression
# on the demo model (README, "Drafting"); a pass that size still costs milliseconds of sampler work.
MAX_CHAIN_SIBLING_NODES = 1024
MAX_WINDOW = 1024  # draft window L
MAX_NODE_BUDGET = 1024  # SamplerConfig.node_budget: nodes per pass
MAX_AUTO_BUDGET = 256  # the largest budget node_budget="auto" picks (engine/budget.py, BUDGET_CHOICES)
# Pass sizes the auto window's cost probe runs (engine/window.py); the largest sizes the KV cache
# along with the largest pass (engine/loop.py, models/memory.py).
PROBE_SIZES: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128)
DEFAULT_TREE_FIRST_WIDTH = 8  # SamplerConfig.tree_first_width's default (docs/benchmark_history.md, "Drafting")
# The sampling recipe runs in float32 (sampling/recipe.py). Temperature divides the logits and CFG
# multiplies their differences, so each is a scale on the logits: kept to at most 1 / the smallest
# normal float32 (8.5e37), a logit of a few units stays finite. A top_p below the smallest normal
# is 0 on devices that flush subnormals to zero, and keeps no token. Values inside the bounds that
# still overflow with a model's logits stop the run with a sentence (engine/finite.py).
SMALLEST_NORMAL_FLOAT32 = float(np.finfo(np.float32).tiny)
LARGEST_LOGIT_SCALE = 1.0 / SMALLEST_NORMAL_FLOAT32


def float32_knob_problem(name: str, value: float) -> Optional[str]:
    """Why a temperature, cfg_scale or top_p value cannot be sampled with in float32, as a clause
    ("is below ..., so ..."), or None. SamplerConfig and the checkpoints' sampling defaults share it."""
    if name == "temperature" and value < SMALLEST_NORMAL_FLOAT32:
        return (f"is below {SMALLEST_NORMAL_FLOAT32:.3g}, the smallest normal float32 number, so dividing "
                "the logits by it overflows")
    if name == "cfg_scale" and value > LARGEST_LOGIT_SCALE:
        return (f"is above {LARGEST_LOGIT_SCALE:.3g} (1 / the smallest normal float32 number), so the guided "
                "logits overflow float32")
    if name == "top_p" and value < SMALLEST_NORMAL_FLOAT32:
        return (f"is below {SMALLEST_NORMAL_FLOAT32:.3g}, the smallest normal float32 number, where it "
                "rounds to 0 and keeps no token")
    return None


def level_node_count(widths: Iterable[int], limit: Optional[int] = None) -> int:
    """Nodes of a full tree's levels (widths[0] + widths[0] * widths[1] + ...): every node at
    every level gets the next level's candidates. Stops counting once past `limit`, so an absurd
    depth costs nothing to check."""
    total, size = 0, 1
    for width in widths:
        size *= width
        total += size
        if limit is not None and total > limit:
            break
    return total


@dataclass(frozen=True)
class TreeLevels:
    """The Proactive Drafting tree in numbers: the one place D, the level widths and the node
    counts of a pass come from.

    A node is a row of a pass beyond its root (the last committed token); with classifier-free
    guidance each node is two rows of the forward, but budgets and counts are in nodes.
    widths: candidates at each of the D - 1 positions the tree branches at (D counts the root,
    as the paper does); side_chain: drafts hung off each leaf one deviation from the main branch
    (`sampling.tree.one_deviation_leaves`); chain_width: candidates at each chain position past
    the levels (1: the chain's draft alone).
    """

    widths: Tuple[int, ...] = ()
    side_chain: int = 0
    chain_width: int = 1

    @classmethod
    def of(cls, depth: int, width: int, first_width: Optional[int] = None, side_chain: int = 0,
           chain_width: int = 1) -> "TreeLevels":
        """D and K, the first level `first_width` wide (None: K)."""
        widths = ((first_width or width,) + (width,) * (depth - 2)) if depth >= 2 else ()
        return cls(widths, side_chain, chain_width)

    @property
    def depth(self) -> int:
        return len(self.widths) + 1

    @property
    def level_nodes(self) -> int:
        """Nodes of the levels, main branch included (K + K^2 + ... for D = 3 and width K)."""
        return level_node_count(self.widths)

    @property
    def side_leaves(self) -> int:
        """Leaves one deviation from the main branch (sum of width - 1): where side chains hang."""
        return sum(w - 1 for w in self.widths)

    def chain_siblings(self, window: int) -> int:
        """Sibling nodes beside the chain's drafts in a pass of `window` drafts."""
        return (self.chain_width - 1) * max(window - len(self.widths), 0)

    def side_nodes(self, window: int) -> int:
        """Nodes beyond the main branch (the window's drafts) in a pass of `window` drafts."""
        return (self.level_nodes - len(self.widths) + self.side_chain * self.side_leaves
                + self.chain_siblings(window))

    def nodes(self, window: int) -> int:
        """Every node of a pass of `window` drafts (its rows beyond the root)."""
        return window + self.side_nodes(window)


def tree_node_count(
    depth: int, width: int, limit: int = MAX_TREE_NODES, first_width: Optional[int] = DEFAULT_TREE_FIRST_WIDTH
) -> int:
    """Nodes of the levels of a tree of depth D, first level `first_width` (None: K), then K
    (TreeLevels.level_nodes, without building an absurd D's widths; stops past `limit`)."""
    widths = itertools.chain([first_width or width], itertools.repeat(width, depth - 2)) if depth >= 2 else ()
    return level_node_count(widths, limit)


def max_tree_depth(
    width: int, limit: int = MAX_TREE_NODES, first_width: Optional[int] = DEFAULT_TREE_FIRST_WIDTH
) -> int:
    """The largest tree depth D whose tree fits the node budget for tree width K."""
    depth = 1
    while depth < 64 and tree_node_count(depth + 1, width, limit, first_width) <= limit:
        depth += 1
    return depth


@dataclass(frozen=True)
class SamplerConfig:
    """How to sample image tokens.

    method: "ar" (one token per forward pass), "sjd" (Speculative Jacobi Decoding) or
        "sjd_pac" (SJD with Adaptive Continuation and Proactive Drafting). All three are lossless.
    window: L, the number of draft tokens verified per forward pass (sjd, sjd_pac), or "auto":
        chosen every pass from the measured forward cost of each window size on this hardware
        and the acceptance seen so far, to maximise tokens per second. On an eager run with a
        Proactive Drafting tree, "auto" chooses the tree too, among the configured tree and
        narrower ones (fewer levels, fewer candidates): where every node costs, as on a CPU, a
        small tree wins; where passes are nearly free, the configured one.
    tree_depth, tree_width: D and K of Proactive Drafting; the tree branches at the D-1
        positions after a rejection, with at most K candidates each.
    tree_every_pass: put the Proactive Drafting tree on the first D-1 positions of every pass's
        window (as the authors' sampler does), not only after a rejection (the paper's PD).
    tree_first_width: candidates at the tree's first level (None: K at every level). The
        defaults (every pass, 8 then K=4) gave the highest step compression on the demo model
        (docs/benchmark_history.md, "Drafting: where passes lose tokens, and what helped").
    tree_side_chain: also hang the first this-many drafts of the continued chain off every tree
        leaf that leaves the main branch at exactly one level, so a pass won by such a side leaf
        runs on into the chain (0: the chain hangs off the main branch only, and a side-branch win
        ends the pass after the tree). Cut so the side chains add at most MAX_TREE_NODES nodes
        (`tree`); the default tree with 16 adds 160 nodes per pass.
    tree_chain_width: candidates at every chain position past the tree's levels (1: the chain's
        draft only, the default). Candidates 1 .. W - 1 of a position's draw sit beside its
        draft as leaves, so a pass whose chain draft is rejected still commits the token after
        the position when a sibling holds the verified token. Adds (W - 1) x (L - D + 1) nodes
        per pass; needs a fixed window (at most MAX_CHAIN_SIBLING_NODES sibling nodes).
    node_budget: B, the nodes one pass may carry (its rows beyond the root; with CFG each node
        is two rows of the forward), None (the tree knobs above) or "auto". With a budget, every
        pass spends its B nodes where the acceptance measured so far in the run says they are
        worth most: the main chain's length (at most `window`; "auto": at most B, which the
        CLI, nodes and app take when a budget is given without a window), the
        candidates at each position, and the branches behind them (engine/budget.py); the tree
        knobs are not used. "auto" also picks B every pass, up to 256, for the most tokens per
        second on this hardware (the forward cost measured as for window="auto"; eager only).
        sjd_pac with Proactive Drafting only.
    adaptive_continuation, proactive_drafting: switch AC and PD separately (sjd_pac only), so
        the paper's ablation SJD / +PD / +AC / +PD+AC is one flag each.
    verify: "gumbel" (the default; seed-exact: every method gives the same tokens as plain AR for
        the same seed, up to floating-point ties, and is exact in distribution) or "rejection"
        (speculative rejection sampling, exact in distribution, the paper's rule). Gumbel was
        faster or equal for every method and window measured (README, "Both verification rules").
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
    tree_side_chain: int = 0
    tree_chain_width: int = 1
    node_budget: Union[None, int, str] = None
    adaptive_continuation: bool = True
    proactive_drafting: bool = True
    verify: VerifyRule = "gumbel"
    init_proposal: InitProposal = "nearest"
    cfg_scale: float = 1.0
    temperature: float = 1.0
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    compile: bool = False

    def __post_init__(self) -> None:
        # Types first (and numpy scalars turned into Python ones), then the ranges. The dataclass
        # is frozen, so a validated config cannot change under a running sampler.
        for name, value in coerced_fields(self).items():
            object.__setattr__(self, name, value)
        self.validate()

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "SamplerConfig":
        """A validated SamplerConfig from a dict of its fields (e.g. read from JSON or a UI)."""
        if not isinstance(values, Mapping):
            raise ConfigError(
                f"config must be a SamplerConfig or a dict of its fields, got {type(values).__name__}; "
                "build one with SamplerConfig(...)."
            )
        check_field_names(values)
        return cls(**values)

    def validate(self) -> None:
        coerced_fields(self)  # the types first: a ConfigError naming the field, never a TypeError
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
        if not isinstance(self.tree_side_chain, int) or self.tree_side_chain < 0:
            raise ConfigError(
                f"tree_side_chain must be an integer >= 0, got {self.tree_side_chain!r}; 0 hangs the "
                "chain off the main branch only."
            )
        if not isinstance(self.tree_chain_width, int) or self.tree_chain_width < 1:
            raise ConfigError(
                f"tree_chain_width must be an integer >= 1, got {self.tree_chain_width!r}; 1 drafts one "
                "token per chain position (no siblings)."
            )
        # A node budget's tree ignores the tree knobs: the auto window it defaults to is no conflict.
        if self.tree_chain_width > 1 and self.window == "auto" and self.use_pd and self.node_budget is None:
            raise ConfigError(
                f"tree_chain_width = {self.tree_chain_width} needs a fixed window (the auto window prices a "
                "fixed tree); set window to a number such as 64, or tree_chain_width to 1."
            )
        if self.window != "auto" and self.window > MAX_WINDOW:
            raise ConfigError(
                f"window (L) = {self.window} is above the limit of {MAX_WINDOW} drafts per pass; use 32, 64 or 'auto'."
            )
        if self.method == "sjd_pac" and self.proactive_drafting and self.tree_depth > 1:
            first = self.tree_first_width
            nodes = tree_node_count(self.tree_depth, self.tree_width, first_width=first)
            if nodes > MAX_TREE_NODES:
                first_text = f" (first level {first})" if first else ""
                raise ConfigError(
                    f"A tree of depth D = {self.tree_depth} and width K = {self.tree_width}{first_text} has "
                    f"more than {MAX_TREE_NODES} nodes (the cost grows as K^(D-1)); with K = "
                    f"{self.tree_width} use D <= {max_tree_depth(self.tree_width, first_width=first)}."
                )
        if self.node_budget is not None:
            if self.node_budget != "auto" and not (
                    isinstance(self.node_budget, int) and 1 <= self.node_budget <= MAX_NODE_BUDGET):
                raise ConfigError(
                    f"node_budget must be None, an integer from 1 to {MAX_NODE_BUDGET} or 'auto', got "
                    f"{self.node_budget!r}; try 128 (nodes per pass)."
                )
            if self.node_budget == "auto" and self.compile:
                raise ConfigError(
                    "node_budget='auto' picks a pass size every pass, which a compiled run cannot follow; "
                    "give a number such as 128 with compile=True, or set compile=False."
                )
            if not self.use_pd:
                raise ConfigError(
                    "node_budget spends a pass's nodes on Proactive Drafting's tree; use method='sjd_pac' with "
                    "proactive_drafting=True and tree_depth >= 2, or node_budget=None."
                )
        siblings = self.tree.chain_siblings(self.window_size) if self.use_pd else 0
        if siblings > MAX_CHAIN_SIBLING_NODES:
            positions = self.window_size - len(self.tree.widths)
            raise ConfigError(
                f"tree_chain_width = {self.tree_chain_width} at window L = {self.window} adds "
                f"{siblings} sibling nodes per pass, above the limit of {MAX_CHAIN_SIBLING_NODES}; "
                f"use tree_chain_width <= {max(1, 1 + MAX_CHAIN_SIBLING_NODES // max(1, positions))} "
                "or a shorter window."
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
        fixes = {"temperature": "use 1.0 for the model's own distribution",
                 "cfg_scale": "use 1-10 (1.0 disables guidance)", "top_p": "use 0.9, or None to turn it off"}
        for name, fix in fixes.items():
            value = getattr(self, name)
            problem = None if value is None else float32_knob_problem(name, value)
            if problem:
                raise ConfigError(f"{name} = {value:g} {problem}; {fix}.")

    # Derived switches: the loop reads these, never the raw method string.
    @property
    def auto_window(self) -> bool:
        return self.method != "ar" and self.window == "auto"

    @property
    def window_size(self) -> int:
        """Draft tokens per pass (fixed windows); plain AR is SJD with an empty window."""
        return 0 if self.method == "ar" or self.window == "auto" else self.window

    @property
    def tree(self) -> TreeLevels:
        """The configured tree (D, widths, side chains, chain width), whether or not the method
        drafts one; side chains cut so they add at most MAX_TREE_NODES nodes, none without PD."""
        levels = TreeLevels.of(self.tree_depth, self.tree_width, self.tree_first_width)
        leaves = levels.side_leaves
        side_chain = min(self.tree_side_chain, MAX_TREE_NODES // leaves) if self.use_pd and leaves else 0
        return TreeLevels(levels.widths, side_chain, self.tree_chain_width)

    @property
    def tree_side_nodes(self) -> int:
        """Nodes a full pass's PD tree adds beyond the main branch (side chains and chain siblings
        too); 0 without PD."""
        return self.tree.side_nodes(self.window_size) if self.use_pd else 0

    @property
    def pass_nodes(self) -> int:
        """The most nodes one pass may carry beyond its root (the budget, else the window and
        the tree's side nodes)."""
        if self.node_budget is not None:
            return MAX_AUTO_BUDGET if self.node_budget == "auto" else self.node_budget
        return self.window_size + self.tree_side_nodes

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
        check_field_names(changes)
        return replace(self, **changes)


def coerce_config(config: Union[None, SamplerConfig, Mapping[str, Any]]) -> SamplerConfig:
    """What the sampler accepts as its config: None (the defaults), a SamplerConfig (validated
    again, in case it was changed behind the frozen dataclass's back) or a dict of fields."""
    if config is None:
        return SamplerConfig()
    if isinstance(config, SamplerConfig):
        return replace(config)
    return SamplerConfig.from_mapping(config)


def check_field_names(values: Mapping[str, Any]) -> None:
    known = [f.name for f in fields(SamplerConfig)]
    unknown = [str(name) for name in values if name not in known]
    if unknown:
        raise ConfigError(
            f"SamplerConfig has no field {unknown[0]!r}; the fields are {', '.join(known)}."
        )


# --- field types ------------------------------------------------------------------------------
# Each field's annotation (a string under `from __future__ import annotations`) decides how its
# value is checked. bool is an int subclass in Python, so numeric fields refuse it by name;
# numpy integers and floats are what they look like and are accepted as such.
_INT_FIELDS = {"int", "Optional[int]"}
_FLOAT_FIELDS = {"float", "Optional[float]"}


def _kind(value: Any) -> str:
    return f"{value!r} of type {type(value).__name__}"


def _is_bool(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_))


def _as_int(name: str, value: Any) -> int:
    if _is_bool(value) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name} must be an integer, got {_kind(value)}; pass a whole number such as 4.")
    return int(value)


def _as_float(name: str, value: Any) -> float:
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name} must be a number, got {_kind(value)}; pass a number such as 1.0.")
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}; pass a number such as 1.0.")
    return value


def coerced_fields(config: SamplerConfig) -> Dict[str, Any]:
    """Every typed field's value as a plain Python int/float/bool; ConfigError naming the field
    for a value of the wrong type (a string, a bool where a number belongs, NaN, inf)."""
    out: Dict[str, Any] = {}
    for field in fields(config):
        name, kind, value = field.name, field.type, getattr(config, field.name)
        if kind.startswith("Optional[") and value is None:
            continue
        if kind == "bool":
            if not _is_bool(value):
                raise ConfigError(f"{name} must be True or False, got {_kind(value)}.")
            out[name] = bool(value)
        elif kind in _INT_FIELDS:
            out[name] = _as_int(name, value)
        elif kind in _FLOAT_FIELDS:
            out[name] = _as_float(name, value)
        elif name == "node_budget" and value is not None and not (isinstance(value, str) and value == "auto"):
            if _is_bool(value) or not isinstance(value, numbers.Integral):
                raise ConfigError(
                    f"node_budget must be None, a whole number or 'auto', got {_kind(value)}; try 128."
                )
            out[name] = int(value)
        elif name == "window" and not (isinstance(value, str) and value == "auto"):
            if _is_bool(value) or not isinstance(value, numbers.Integral):
                raise ConfigError(
                    f"window (L) must be an integer >= 1 or 'auto', got {_kind(value)}; try 32, 64 or 'auto'."
                )
            out[name] = int(value)
        elif kind in ("Method", "VerifyRule", "InitProposal") and not isinstance(value, str):
            raise ConfigError(f"{name} must be a string, got {_kind(value)}.")
    return out

