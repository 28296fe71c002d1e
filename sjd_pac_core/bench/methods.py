"""The benchmark's grid: which methods run, written as a small grammar.

    ar, sjd@32, sjd+pd@64, sjd+ac@32, sjd-pac@auto, generate, generate-static:compile,
    sjd-pac@64:gumbel, ar:compile, sjd-pac@32:s0, sjd-pac@32:d2:f8, sjd-pac@64:b128, sjd@16:random

A row is a variant (plain AR, SJD, SJD with Proactive Drafting or Adaptive Continuation only,
SJD-PAC, transformers' generate), a window L, and modifiers: a verification rule, compilation,
a tree shape (depth, widths, side chain) or a node budget per pass (engine/budget.py chooses the
tree), and random initial drafts (:random: positions new to the window drafted uniformly over the
image codes, as the SJD that Lumina-mGPT 2.0 ships does). `MethodSpec.config` turns a row into
the SamplerConfig it runs.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, fields, replace
from typing import List, Optional, Sequence, Tuple, Union

from .. import arguments
from ..config import SamplerConfig

# The paper's tables (spec section 6): AR; SJD at L=16, 32; SJD+PD, SJD+AC, SJD-PAC at L=32, 64;
# plus SJD-PAC with the window chosen from measured costs.
DEFAULT_METHODS = (
    "ar,sjd@16,sjd@32,sjd+pd@32,sjd+ac@32,sjd-pac@32,sjd+pd@64,sjd+ac@64,sjd-pac@64,sjd-pac@auto"
)

_VARIANTS = {
    # name: (method, adaptive_continuation, proactive_drafting, label)
    "ar": ("ar", False, False, "AR"),
    "sjd": ("sjd", False, False, "SJD"),
    "sjd+pd": ("sjd_pac", False, True, "SJD+PD"),
    "sjd+ac": ("sjd_pac", True, False, "SJD+AC"),
    "sjd-pac": ("sjd_pac", True, True, "SJD-PAC"),
    # transformers' own generate with our recipe in a logits processor (bench/baselines.py)
    "generate": ("ar", False, False, "transformers generate"),
    "generate-static": ("ar", False, False, "transformers generate, static cache"),
}
_ALIASES = {"sjd_pac": "sjd-pac", "pac": "sjd-pac", "sjd+pd+ac": "sjd-pac", "sjd+ac+pd": "sjd-pac",
            "sjd-pd": "sjd+pd", "sjd-ac": "sjd+ac", "hf": "generate", "hf-static": "generate-static"}
# Plain-AR rows: every latency ratio is taken against the fastest of these in the same run.
AR_VARIANTS = ("ar", "generate", "generate-static")
GENERATE_VARIANTS = ("generate", "generate-static")
_RULES = ("rejection", "gumbel")
_COMPILE = ("compile", "compiled")
_RANDOM_DRAFTS = ("random", "uniform")
_TREE_MODIFIER = re.compile(r"([dkfs])(\d+)|(b)(\d+|auto)")
# modifier letter -> (MethodSpec / SamplerConfig field, label); one table for parse, key, label, config
_TREE_KNOBS = {"d": ("tree_depth", "D"), "k": ("tree_width", "K"), "f": ("tree_first_width", "first K"),
               "s": ("tree_side_chain", "side chain"), "b": ("node_budget", "B")}

# Issue 13's honest baselines: transformers' generate (dynamic cache; static cache; static cache +
# torch.compile), our AR, SJD and SJD-PAC, each eager and compiled (SamplerConfig(compile=True)).
# The speculative decoding Lumina-mGPT 2.0 ships (its generate_examples/jacobi_utils_static.py, as
# its generate.py calls it): SJD with a 16-token window, random initial drafts, rejection sampling.
LUMINA2_AUTHORS_SJD = "sjd@16:rejection:random"
BASELINE_METHODS = ("generate,generate-static,generate-static:compile,ar,ar:compile,sjd@16,sjd@16:compile,"
                    "sjd-pac@32,sjd-pac@32:compile")
# Issue 15's rule ablation (rejection vs gumbel), as --variants/--windows/--rules give it.
RULE_VARIANTS = ("sjd", "sjd+ac", "sjd+pd", "sjd-pac")
RULE_WINDOWS = ("16", "32", "64", "auto")
PRESETS = {"paper": DEFAULT_METHODS, "baselines": BASELINE_METHODS,
           "lumina2": f"ar,{LUMINA2_AUTHORS_SJD},sjd-pac@64"}  # theirs against our default


@dataclass(frozen=True)
class MethodSpec:
    """One column of the grid: a variant, a window (None for AR rows), optionally its own
    verification rule (None: the base config's) and compilation."""

    variant: str  # ar, sjd, sjd+pd, sjd+ac, sjd-pac, generate, generate-static
    window: Union[int, str, None] = None
    verify: Optional[str] = None
    compiled: bool = False
    tree_depth: Optional[int] = None  # :dD, None = the base config's D
    tree_width: Optional[int] = None  # :kK
    tree_first_width: Optional[int] = None  # :fF (f0: the first level as wide as the others)
    tree_side_chain: Optional[int] = None  # :sS (s0: no side chains, fewer nodes per pass)
    node_budget: Union[int, str, None] = None  # :bB, :bauto (nodes per pass; the window L caps the chain)
    random_drafts: bool = False  # :random (init_proposal "uniform")

    def _tree_knobs(self) -> List[Tuple[str, str, str, int]]:
        """(modifier letter, field, label, value) of every tree knob this row sets."""
        return [(letter, name, label, getattr(self, name)) for letter, (name, label) in _TREE_KNOBS.items()
                if getattr(self, name) is not None]

    @property
    def tree_text(self) -> str:
        return "".join(f":{letter}{value}" for letter, _, _, value in self._tree_knobs())

    @property
    def key(self) -> str:
        key = self.variant if self.window is None else f"{self.variant}@{self.window}"
        return (key + (f":{self.verify}" if self.verify else "") + (":compile" if self.compiled else "")
                + self.tree_text + (":random" if self.random_drafts else ""))

    @property
    def label(self) -> str:
        name = _VARIANTS[self.variant][3]
        name = name if self.window is None else f"{name} L={self.window}"
        knobs = self._tree_knobs()
        if self.node_budget is not None:  # a budget chooses the tree: the shape knobs do not apply
            knobs = [knob for knob in knobs if knob[1] == "node_budget"]
        tree = ", ".join(f"{label}={value}" for _, _, label, value in knobs)
        return (name + (f", {self.verify}" if self.verify else "") + (", compiled" if self.compiled else "")
                + (f", {tree}" if tree else "") + (", random drafts" if self.random_drafts else ""))

    @property
    def is_ar(self) -> bool:
        """A plain autoregressive row (ours or transformers'): a candidate reference."""
        return self.variant in AR_VARIANTS

    @property
    def is_generate(self) -> bool:
        return self.variant in GENERATE_VARIANTS

    def config(self, base: SamplerConfig) -> SamplerConfig:
        method, ac, pd, _ = _VARIANTS[self.variant]
        changes = dict(method=method, adaptive_continuation=ac, proactive_drafting=pd)
        if self.window is not None:
            changes["window"] = self.window
        if self.verify is not None:
            changes["verify"] = self.verify
        # generate rows compile through transformers (bench/baselines.py), not through our engine
        changes["compile"] = self.compiled and not self.is_generate
        if self.random_drafts:
            changes["init_proposal"] = "uniform"
        for _, name, _, value in self._tree_knobs():
            # f0 asks for no separate first-level width (None in SamplerConfig)
            changes[name] = None if name == "tree_first_width" and value == 0 else value
        return base.with_(**changes)


def parse_method(text: str) -> MethodSpec:
    """'ar', 'sjd@32', 'sjd+pd@64', 'sjd-pac@auto', 'generate', 'generate-static:compile',
    'sjd-pac@64:gumbel', 'ar:compile', 'sjd-pac@32:s0' -> MethodSpec. Modifiers after ':' are
    a verification rule (rejection, gumbel), compile and a tree shape: dD (depth), kK (width), fF
    (first level's width; f0 = as wide as the others), sS (side chain; s0 = none), e.g.
    'sjd-pac@32:d2:f8', or a node budget bB / bauto (nodes per pass; the window L then caps the
    main chain), e.g. 'sjd-pac@64:b128', and random (initial drafts uniform over the image codes,
    e.g. 'sjd@16:random')."""
    head, *modifiers = text.strip().lower().split(":")
    name, _, window = head.partition("@")
    name = _ALIASES.get(name, name)
    if name not in _VARIANTS:
        raise ValueError(
            f"Unknown method {text!r} in --methods; use ar, generate, generate-static, sjd@L, sjd+pd@L, "
            "sjd+ac@L or sjd-pac@L (L an integer or auto), optionally with :gumbel / :rejection / :compile, "
            "comma-separated.")
    verify, compiled, random_drafts = None, False, False
    tree: dict = {}
    for modifier in modifiers:
        shape = _TREE_MODIFIER.fullmatch(modifier)
        letter, value = (shape.group(1) or shape.group(3), shape.group(2) or shape.group(4)) if shape else ("", "")
        if shape and _TREE_KNOBS[letter][0] not in tree:
            tree[_TREE_KNOBS[letter][0]] = value if value == "auto" else int(value)
        elif modifier in _RULES and verify is None:
            verify = modifier
        elif modifier in _COMPILE and not compiled:
            compiled = True
        elif modifier in _RANDOM_DRAFTS and not random_drafts:
            random_drafts = True
        else:
            raise ValueError(f"Modifier {modifier!r} in {text!r}: use at most one of :rejection / :gumbel, "
                             ":compile, a tree shape :dD / :kK / :fF / :sS, a node budget :bB / :bauto and "
                             ":random.")
    if tree and name not in ("sjd+pd", "sjd-pac"):
        raise ValueError(f"{text!r}: a tree shape or budget (:d / :k / :f / :s / :b) needs a method with a tree, "
                         "sjd+pd or sjd-pac.")
    if name == "generate" and compiled:
        raise ValueError(f"{text!r}: transformers compiles generate only with a static cache; write "
                         "generate-static:compile.")
    if name in AR_VARIANTS:
        if window:
            raise ValueError(f"{_VARIANTS[name][3]} has no window; write {name!r}, not {text!r}.")
        if random_drafts:
            raise ValueError(f"{_VARIANTS[name][3]} drafts nothing; :random applies to sjd, sjd+pd, sjd+ac and "
                             f"sjd-pac, not {text!r}.")
        return MethodSpec(name, None, verify, compiled, **tree)
    if not window:
        raise ValueError(f"Method {text!r} needs a window, e.g. {name}@32 or {name}@auto.")
    if window != "auto":
        try:
            window = int(window)
        except ValueError:
            raise ValueError(f"Window in {text!r} must be an integer or 'auto'.") from None
        if window < 1:
            raise ValueError(f"Window in {text!r} must be >= 1.")
    return MethodSpec(name, window, verify, compiled, random_drafts=random_drafts, **tree)


def parse_methods(text: str) -> List[MethodSpec]:
    """A comma-separated list of methods, or a preset name: paper (default), baselines."""
    text = PRESETS.get(text.strip().lower(), text)
    specs = [parse_method(t) for t in text.split(",") if t.strip()]
    if not specs:
        raise ValueError("--methods is empty; give at least one, e.g. ar,sjd-pac@64.")
    keys = [s.key for s in specs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"--methods names a method twice: {','.join(keys)}.")
    return specs


def rule_grid(variants: Sequence[str] = RULE_VARIANTS, windows: Sequence[str] = RULE_WINDOWS,
              rules: Sequence[str] = _RULES, ar: bool = True) -> List[MethodSpec]:
    """The cross product variant x window x rule (plus plain AR under each rule): issue 15's
    ablation of the two verification rules."""
    items = [f"ar:{r}" for r in rules] if ar else []
    items += [f"{v}@{w}:{r}" for v in variants for w in windows for r in rules]
    return parse_methods(",".join(items))


def with_rules(specs: Sequence[MethodSpec], rules: Sequence[str]) -> List[MethodSpec]:
    """Every method without its own rule, once under each of `rules`."""
    out: List[MethodSpec] = []
    for spec in specs:
        if spec.verify is not None:
            out.append(spec)
        else:
            out.extend(replace(spec, verify=rule) for rule in rules)
    keys = [s.key for s in out]
    if len(set(keys)) != len(keys):
        raise ValueError(f"--rules repeats a method already given with its rule: {','.join(keys)}.")
    return out


def with_budgets(specs: Sequence[MethodSpec], budgets: Sequence[Union[int, str, None]]) -> List[MethodSpec]:
    """The node-budget axis: every SJD-PAC row without its own budget, once per budget of
    `budgets` (nodes per pass, "auto", or None: the row as it is; arguments.budget_list)."""
    out: List[MethodSpec] = []
    for spec in specs:
        if not budgets or spec.variant != "sjd-pac" or spec.node_budget is not None:
            out.append(spec)
        else:
            out.extend(replace(spec, node_budget=value) for value in budgets)
    return out

def method_label(key: str) -> str:
    """A row's human label ('SJD-PAC L=32, gumbel'), or the key itself if it is not a method."""
    try:
        return parse_method(key).label
    except ValueError:
        return key


# The sampling recipe (SamplingRecipe's fields): what every method samples from, not how.
RECIPE_FIELDS = ("cfg_scale", "temperature", "top_k", "top_p")


def method_key(config: SamplerConfig, base: SamplerConfig) -> str:
    """The key of the row that turns `base` into `config` ('sjd-pac@64', 'sjd@32:rejection',
    'sjd-pac@32:d2'): MethodSpec.config's inverse, for settings written out field by field. Fields
    a key has no modifier for are appended as ':field=value', so that two different settings never
    share a key. The recipe (RECIPE_FIELDS) is not part of a method."""
    pac = config.method == "sjd_pac"
    variant = next((name for name, (method, ac, pd, _) in _VARIANTS.items()
                    if name not in GENERATE_VARIANTS and method == config.method
                    and (not pac or (ac, pd) == (config.adaptive_continuation, config.proactive_drafting))),
                   "sjd-pac")
    has_tree = variant in ("sjd+pd", "sjd-pac")
    tree = {name: 0 if name == "tree_first_width" and getattr(config, name) is None else getattr(config, name)
            for name, _ in _TREE_KNOBS.values() if has_tree and getattr(config, name) != getattr(base, name)}
    spec = MethodSpec(variant, None if variant in AR_VARIANTS else config.window,
                      verify=config.verify if config.verify != base.verify else None, compiled=config.compile,
                      random_drafts=(variant not in AR_VARIANTS and config.init_proposal == "uniform"
                                     and base.init_proposal != "uniform"), **tree)
    row = spec.config(base.with_(**{name: getattr(config, name) for name in RECIPE_FIELDS}))
    rest = [f":{f.name}={getattr(config, f.name)}" for f in fields(SamplerConfig)
            if getattr(config, f.name) != getattr(row, f.name)
            and (pac or f.name not in ("adaptive_continuation", "proactive_drafting"))]
    return spec.key + "".join(rest)


def parse_seeds(text: str) -> List[int]:
    """'0', '0,3,7', '0-9' or a mix: '0-4,10' (the rule of arguments.seed_list: at most
    arguments.MAX_SEEDS seeds, none twice), refused as a ValueError."""
    try:
        return arguments.seed_list(text)
    except argparse.ArgumentTypeError as exc:
        raise ValueError(f"--seeds {exc}.") from None
