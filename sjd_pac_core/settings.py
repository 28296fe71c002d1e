"""The one conversion from user-facing settings (CLI flags, ComfyUI widgets, Gradio fields) to a
SamplerConfig, and the one run record, shared by the CLI, the nodes and the app so that they
cannot disagree.

One name per knob: every surface names a knob by its SamplerConfig field (the run record's keys,
the node widgets, the app's fields; the CLI flag is the field with dashes, `flag()`); people read
its LABELS entry ("CFG scale").

UI conventions handled here once: a value left empty (None or "") takes the loaded model's own
default; top-k 0 and top-p 1 mean "off"; the window may be "auto", and is "auto" when a node
budget is set and no window is given (the budget then chooses the main chain, up to B); whole
numbers may arrive as floats (2.0) but a fraction (2.5) in a whole-number field is refused, never
rounded. The seed's meaning is sampling/seeds.py's (-1 or empty: a random seed, drawn by
generate_image).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Union

from .config import MAX_NODE_BUDGET, ConfigError, SamplerConfig
from .sampling.seeds import check_seed

if TYPE_CHECKING:  # no torch import here: the CLI validates its arguments before loading torch
    from .models.image_model import FamilyDefaults

# What people read for each knob (stats text, app labels, messages); keys, widgets and flags are
# the field names themselves.
LABELS: Dict[str, str] = {
    "method": "method",
    "window": "window L",
    "tree_depth": "tree depth D",
    "tree_width": "tree width K",
    "tree_every_pass": "tree on every pass",
    "tree_first_width": "tree first width",
    "tree_side_chain": "tree side chain",
    "tree_chain_width": "tree chain width",
    "node_budget": "node budget",
    "adaptive_continuation": "adaptive continuation",
    "proactive_drafting": "proactive drafting",
    "verify": "verify",
    "init_proposal": "initial proposal",
    "cfg_scale": "CFG scale",
    "temperature": "temperature",
    "top_k": "top-k",
    "top_p": "top-p",
    "compile": "compile",
}


def flag(field: str) -> str:
    """The command-line flag of a SamplerConfig field: tree_side_chain -> --tree-side-chain."""
    return "--" + field.replace("_", "-")


def _empty(value: object) -> bool:
    return value is None or (isinstance(value, str) and value.strip() == "")


def whole_number(value: object, name: str, example: str) -> int:
    """A UI number that must be whole: 3, 3.0 and "3" are 3; 3.5, "x", NaN are refused by name."""
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a whole number, got {value!r}; try {example}.")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a whole number, got {value!r}; try {example}.") from None
    if not math.isfinite(number) or not number.is_integer():
        raise ConfigError(f"{name} must be a whole number, got {value!r}; try {example}.")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return int(value.strip()) if value.strip().lstrip("+-").isdigit() else int(number)
    return int(number)


def real_number(value: object, name: str, example: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a number, got {value!r}; try {example}.")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {value!r}; try {example}.") from None
    if not math.isfinite(number):
        raise ConfigError(f"{name} must be a finite number, got {value!r}; try {example}.")
    return number


def window_value(value: object) -> Union[int, str]:
    """The window L: a whole number or 'auto'."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    return whole_number(value, LABELS["window"], "32, 64 or 'auto'")


def node_budget_value(value: object) -> Union[None, int, str]:
    """The node budget B: nodes per pass, 'auto', or 0 (None: no budget, the window and tree knobs)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    label = LABELS["node_budget"]
    budget = whole_number(value, label, "128 nodes per pass, 'auto', or 0 (off)")
    if not 0 <= budget <= MAX_NODE_BUDGET:  # SamplerConfig's own message speaks of None, which no UI can enter
        raise ConfigError(f"{label} must be 0 (off), 'auto' or 1 to {MAX_NODE_BUDGET} nodes per pass, got "
                          f"{budget}; try 128.")
    return None if budget == 0 else budget


def seed_value(value: object) -> Optional[int]:
    """A seed as a UI enters it (text, a whole float) -> None (a random seed) or the seed, checked
    by sampling/seeds.py's rule; nothing is drawn here."""
    if _empty(value):
        return None
    return check_seed(whole_number(value, "seed", "0, or -1 for a random seed"))


def config_from_settings(
    defaults: Optional[FamilyDefaults] = None,
    *,
    method: Optional[str] = None,
    window: object = None,
    tree_depth: object = None,
    tree_width: object = None,
    tree_side_chain: object = None,
    tree_first_width: object = None,
    tree_chain_width: object = None,
    node_budget: object = None,
    verify: Optional[str] = None,
    cfg_scale: object = None,
    temperature: object = None,
    top_k: object = None,
    top_p: object = None,
    adaptive_continuation: bool = True,
    proactive_drafting: bool = True,
    compile: object = None,
) -> SamplerConfig:
    """User settings -> a validated SamplerConfig; anything left empty takes `defaults`.

    Raises ConfigError with one sentence naming the field and the fix.
    """
    base = defaults.sampler_config() if defaults is not None else SamplerConfig()
    values = {"adaptive_continuation": bool(adaptive_continuation), "proactive_drafting": bool(proactive_drafting)}
    if not _empty(method):
        values["method"] = method
    if not _empty(verify):
        values["verify"] = verify
    if not _empty(window):
        values["window"] = window_value(window)
    if not _empty(tree_depth):
        values["tree_depth"] = whole_number(tree_depth, LABELS["tree_depth"], "3")
    if not _empty(tree_width):
        values["tree_width"] = whole_number(tree_width, LABELS["tree_width"], "4")
    if not _empty(tree_first_width):  # 0: K at every level
        label = LABELS["tree_first_width"]
        first = whole_number(tree_first_width, label, "8 (0 = K at every level)")
        if first < 0:  # SamplerConfig's own message speaks of None, which no UI can enter
            raise ConfigError(f"{label} must be 0 (K at every level) or more, got {first}; try 8.")
        values["tree_first_width"] = None if first == 0 else first
    if not _empty(tree_side_chain):
        values["tree_side_chain"] = whole_number(tree_side_chain, LABELS["tree_side_chain"],
                                                 "16 (0 = off, the default)")
    if not _empty(tree_chain_width):
        values["tree_chain_width"] = whole_number(tree_chain_width, LABELS["tree_chain_width"],
                                                  "3 (1 = off, the default)")
    if not _empty(node_budget):
        values["node_budget"] = node_budget_value(node_budget)
        if _empty(window) and values["node_budget"] is not None:
            # A budget's tree chooses its main chain every pass, up to the window: a family's
            # window (the demo's 12) would cap it below what the budget can carry.
            values["window"] = "auto"
    if not _empty(cfg_scale):
        values["cfg_scale"] = real_number(cfg_scale, LABELS["cfg_scale"], "2 (1 = off)")
    if not _empty(temperature):
        values["temperature"] = real_number(temperature, LABELS["temperature"], "1.0")
    if not _empty(top_k):
        k = whole_number(top_k, LABELS["top_k"], "0 (off)")
        if k < 0:  # SamplerConfig's own message speaks of None, which no UI can enter
            raise ConfigError(f"top_k must be 0 (off) or more, got {k}; try 0.")
        values["top_k"] = None if k == 0 else k
    if not _empty(top_p):
        p = real_number(top_p, LABELS["top_p"], "1.0 (off)")
        if p <= 0:
            raise ConfigError(f"top_p must be above 0 (1 = off), got {p:g}; try 0.9, or 1 to turn it off.")
        values["top_p"] = None if p >= 1.0 else p
    if not _empty(compile):
        values["compile"] = switch(compile, "compile")
    # Whether there is a tree to spend the budget on, asked without the budget (and without the
    # chain width, a fixed tree's knob whose checks depend on a fixed window).
    if values.get("node_budget") is not None and not base.with_(
            **{**values, "node_budget": None, "tree_chain_width": 1}).use_pd:
        # SamplerConfig's own message speaks of node_budget=None, which no UI can enter
        raise ConfigError("The node budget spends a pass's nodes on Proactive Drafting's tree; set the method to "
                          f"sjd_pac with Proactive Drafting on and {LABELS['tree_depth']} of 2 or more, or the node "
                          "budget to 0 (off).")
    return base.with_(**values)


# The settings a front end passes to config_from_settings, by name (CLI arguments, widgets).
SETTINGS = tuple(inspect.signature(config_from_settings).parameters)[1:]


def switch(value: object, name: str) -> bool:
    """An on/off setting: True/False, 1/0 or "true"/"false" (any case); anything else is refused by name."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "on", "off"):
        return value.strip().lower() in ("true", "1", "on")
    raise ConfigError(f"{name} must be on or off (true/false), got {value!r}; try false.")


def pointless_setting_warnings(config: SamplerConfig) -> List[str]:
    """Settings that are valid but hold the chosen method back or make it pointless, one sentence each.

    The CLI prints them, the nodes add them to the stats text, the app shows them: a run with
    such a setting is still correct (every method is lossless), just not as fast as it could be.
    """
    messages: List[str] = []
    if config.method != "ar" and config.window == 1:
        messages.append(window_one_note(config))
    if config.method == "sjd_pac" and not config.adaptive_continuation and not config.use_pd:
        messages.append(
            "sjd_pac with Adaptive Continuation off and no Proactive Drafting tree is plain sjd; "
            "switch one of them on or choose method sjd."
        )
    wasted = candidates_beyond_top_k(config)
    if wasted:
        messages.append(wasted)
    return messages


def candidates_beyond_top_k(config: SamplerConfig) -> Optional[str]:
    """K above top-k: the tree's candidates at a position are distinct tokens, and only the top-k
    tokens can ever be accepted there, so the rest are nodes every pass feeds for nothing. The run
    is still exact (the sampler marks them), so this is a warning on every surface, never a refusal."""
    if not config.use_pd or config.node_budget is not None or config.top_k is None:
        return None  # (a node budget sizes its tree itself: K is not used)
    widest = max(config.tree.widths)
    if widest <= config.top_k:
        return None
    k, first = config.top_k, config.tree_first_width
    wide_first = first is not None and first != config.tree_width and config.tree_depth > 1
    shape = f"{LABELS['tree_width']} = {config.tree_width}" + (f" (first level {first})" if wide_first else "")
    smaller = [f"{LABELS['tree_width']} <= {k}"] if config.tree_width > k else []
    if wide_first and first > k:
        smaller.append(f"{LABELS['tree_first_width']} <= {k}")
    return (f"{shape} drafts up to {widest} candidates at a position, but top-k = {k} leaves only {k} tokens a "
            f"position can take, so {widest - k} of them can never be accepted and only cost time; use "
            f"{' and '.join(smaller) + ' or ' if smaller else ''}a top-k of at least {widest} (0 = off).")


def auto_budget_line(config: SamplerConfig, envelopes: Sequence[int]) -> Optional[str]:
    """What node_budget='auto' picked, from the passes' envelopes (tokens fed, the root included;
    the prompt's pass, 0, left out), for the stats text and the app: 'node budget auto picked 48
    nodes per pass' or '... 32 to 48 nodes per pass, 48 on most passes'. None for any other run."""
    if config.node_budget != "auto":
        return None
    picked = [e - 1 for e in envelopes if e > 0]
    if not picked:
        return None
    low, high = min(picked), max(picked)
    if low == high:
        return f"{LABELS['node_budget']} auto picked {low} nodes per pass"
    most = max(sorted(set(picked)), key=picked.count)
    return f"{LABELS['node_budget']} auto picked {low} to {high} nodes per pass, {most} on most passes"


def window_one_note(config: SamplerConfig) -> str:
    """What L = 1 does: one draft per pass, so at most 2 tokens per pass whatever the method (AR
    commits 1). SJD-PAC's tree still offers K candidates for that one draft, which raises how often
    it is accepted, but a tree level past the first has no window position to fill."""
    text = (f"window L = 1 verifies one draft per forward pass, so {config.method} commits at most 2 tokens "
            "per pass (AR: 1)")
    if config.use_pd:
        text += (f"; the drafting tree's {config.tree.widths[0]} candidates raise the chance that the one draft "
                 "is accepted")
        if config.tree_depth > 2:
            text += f", and its levels past the first (D = {config.tree_depth}) go unused"
    return text + "; use L = 16-64 or the auto window for more."


def settings_line(config: SamplerConfig, threads: Optional[int] = None) -> str:
    """The settings a run used, for summary lines (CLI, SJD Stats, the app), in LABELS' words:
    'method sjd_pac, window L 32, tree depth D 3, tree width K 4, CFG scale 2, temperature 0.8,
    verify gumbel, 1 CPU thread'."""
    def part(field: str, value: object) -> str:
        return f"{LABELS[field]} {value:g}" if isinstance(value, float) else f"{LABELS[field]} {value}"

    parts = [part("method", config.method)]
    if config.method != "ar":
        parts.append(part("window", config.window))
    if config.node_budget is not None:
        parts.append(part("node_budget", config.node_budget))
    elif config.use_pd:
        parts += [part("tree_depth", config.tree_depth), part("tree_width", config.tree_width)]
        if config.tree_first_width is not None and config.tree_depth > 1:
            parts.append(part("tree_first_width", config.tree_first_width))
        if config.tree_side_chain:
            parts.append(part("tree_side_chain", config.tree_side_chain))
        if config.tree_chain_width > 1:
            parts.append(part("tree_chain_width", config.tree_chain_width))
    elif config.method == "sjd_pac":
        parts.append(f"no {LABELS['proactive_drafting']}")
    if config.method == "sjd_pac" and not config.adaptive_continuation:
        parts.append(f"no {LABELS['adaptive_continuation']}")
    parts += [part("cfg_scale", config.cfg_scale), part("temperature", config.temperature)]
    if config.top_k is not None:
        parts.append(part("top_k", config.top_k))
    if config.top_p is not None:
        parts.append(part("top_p", config.top_p))
    parts.append(part("verify", config.verify))
    if config.compile:
        parts.append("compiled")
    if threads is not None:
        parts.append(f"{threads} CPU thread{'s' if threads != 1 else ''}")
    return ", ".join(parts)


def seed_reproduces_picture(config: SamplerConfig) -> bool:
    """Whether the same seed (and settings, model, device) gives this very picture again.

    verify="gumbel" fixes every token by (seed, position), whatever the windows were: seed-exact.
    verify="rejection" draws its coins in the order the passes ask for them, so the tokens depend
    on every pass's window; window="auto" chooses it from this device's measured speed, which
    differs from run to run; node_budget="auto" likewise sizes every pass from measured costs. Only
    rejection with either reproduces the distribution of pictures, not the picture. Under a fixed
    node budget window="auto" times nothing (the budget's tree chooses its chain from counts).
    """
    timed_window = config.auto_window and config.node_budget is None
    return not (config.verify == "rejection" and (timed_window or config.node_budget == "auto"))


def seed_note(config: SamplerConfig) -> Optional[str]:
    """What the seed reproduces, for a run whose seed does not give its picture again (else None)."""
    if seed_reproduces_picture(config):
        return None
    if config.node_budget == "auto":
        chosen, fixed = "node budget 'auto' the pass size", "a node budget such as 128"
    else:
        chosen, fixed = "window 'auto' the window", "a fixed window"
    return (f"with verify 'rejection' and {chosen} follows this device's measured speed, so the "
            "seed reproduces the distribution of pictures, not this picture; use verify 'gumbel' (seed-exact "
            f"for every window) or {fixed} to get a picture again from its seed")


RECORD_PNG_KEY = "sjd_pac"  # the PNG text chunk that holds a run record (CLI, nodes, app)


def run_record(config: SamplerConfig, *, prompt: str, seed: Optional[int], random_seed: bool = False,
               negative_prompt: str = "", resolution: Optional[str] = None, model: str = "",
               family: str = "", batch_size: int = 1, device: str = "", threads: Optional[int] = None) -> dict:
    """Everything needed to reproduce a run, as plain JSON: the one record the CLI, the nodes and
    the app save (in PNG metadata) and show. Knobs are keyed by their SamplerConfig field names,
    every field included; `seed` is the seed used (None only while a random one is not drawn
    yet), `random_seed` whether it was drawn; `threads` the CPU threads (None off the CPU);
    `seed_reproduces` "picture" or "distribution" (seed_reproduces_picture)."""
    knobs = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}  # every knob, new ones too
    return {
        "model": model, "family": family, "device": device, "threads": threads, "prompt": prompt,
        "negative_prompt": negative_prompt, "resolution": resolution, "seed": None if seed is None else int(seed),
        "random_seed": bool(random_seed), "batch_size": int(batch_size),
        "seed_reproduces": "picture" if seed_reproduces_picture(config) else "distribution", **knobs,
    }


def record_config(record: dict) -> SamplerConfig:
    """The SamplerConfig a run record describes (run_record's inverse for its knobs)."""
    return SamplerConfig(**{f.name: record[f.name] for f in dataclasses.fields(SamplerConfig)})
