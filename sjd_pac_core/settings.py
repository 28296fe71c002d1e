"""The one conversion from user-facing settings (CLI flags, ComfyUI widgets, Gradio fields) to a
SamplerConfig, shared by the CLI, the nodes and the app so that they cannot disagree.

UI conventions handled here once: a value left empty (None or "") takes the loaded model's own
default; top-k 0 and top-p 1 mean "off"; the window may be "auto"; whole numbers may arrive as
floats (2.0) but a fraction (2.5) in a whole-number field is refused, never rounded; seed -1 (or
empty) asks for a random seed, which is returned so that the run can be reproduced.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import TYPE_CHECKING, List, Optional, Union

from .config import ConfigError, SamplerConfig

if TYPE_CHECKING:  # no torch import here: the CLI validates its arguments before loading torch
    from .models.image_model import FamilyDefaults

# Random seeds are drawn below 2^32 so that they are easy to read, type and store in JSON.
RANDOM_SEED_RANGE = 2**32
SEED_MAX = 2**64 - 1  # ComfyUI's seed widget range; larger seeds are refused by name


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
    return whole_number(value, "window (L)", "32, 64 or 'auto'")


def resolve_seed(value: object = None) -> int:
    """The seed to run with: a given whole number as it is; -1 or empty -> a fresh random seed."""
    if _empty(value):
        return random.randrange(RANDOM_SEED_RANGE)
    seed = whole_number(value, "seed", "0, or -1 for a random seed")
    if seed == -1:
        return random.randrange(RANDOM_SEED_RANGE)
    if seed < 0 or seed > SEED_MAX:
        raise ConfigError(
            f"seed must be between 0 and 2^64-1 (or -1 for a random one), got {seed}; try 0."
        )
    return seed


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
        values["tree_depth"] = whole_number(tree_depth, "tree depth (D)", "3")
    if not _empty(tree_width):
        values["tree_width"] = whole_number(tree_width, "tree width (K)", "4")
    if not _empty(tree_first_width):  # 0: K at every level
        first = whole_number(tree_first_width, "tree first-level width", "8 (0 = K at every level)")
        if first < 0:  # SamplerConfig's own message speaks of None, which no UI can enter
            raise ConfigError(f"tree first-level width must be 0 (K at every level) or more, got {first}; try 8.")
        values["tree_first_width"] = None if first == 0 else first
    if not _empty(tree_side_chain):
        values["tree_side_chain"] = whole_number(tree_side_chain, "side chain length", "16 (0 = off, the default)")
    if not _empty(tree_chain_width):
        values["tree_chain_width"] = whole_number(tree_chain_width, "chain width", "3 (1 = off, the default)")
    if not _empty(node_budget):  # 0: no budget (the window and tree knobs)
        if isinstance(node_budget, str) and node_budget.strip().lower() == "auto":
            values["node_budget"] = "auto"
        else:
            budget = whole_number(node_budget, "node budget", "128 nodes per pass, 'auto', or 0 (off)")
            if budget < 0:
                raise ConfigError(f"node budget must be 0 (off), 'auto' or a number of nodes, got {budget}; try 128.")
            values["node_budget"] = None if budget == 0 else budget
    if not _empty(cfg_scale):
        values["cfg_scale"] = real_number(cfg_scale, "CFG scale", "2 (1 = off)")
    if not _empty(temperature):
        values["temperature"] = real_number(temperature, "temperature", "1.0")
    if not _empty(top_k):
        k = whole_number(top_k, "top-k", "0 (off)")
        if k < 0:  # SamplerConfig's own message speaks of None, which no UI can enter
            raise ConfigError(f"top_k must be 0 (off) or more, got {k}; try 0.")
        values["top_k"] = None if k == 0 else k
    if not _empty(top_p):
        p = real_number(top_p, "top-p", "1.0 (off)")
        if p <= 0:
            raise ConfigError(f"top_p must be above 0 (1 = off), got {p:g}; try 0.9, or 1 to turn it off.")
        values["top_p"] = None if p >= 1.0 else p
    if not _empty(compile):
        values["compile"] = switch(compile, "compile")
    return base.with_(**values)


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
    """Settings that are valid but make the chosen method pointless, one sentence each.

    The CLI prints them, the nodes add them to the stats text, the app shows them: a run with
    such a setting is still correct (every method is lossless), just not faster.
    """
    messages: List[str] = []
    if config.method != "ar" and config.window == 1:
        messages.append(
            f"window L = 1 verifies a single draft per forward pass, so {config.method} cannot beat ar "
            "and its verification only adds cost; use L = 16-64 or 'auto'."
        )
    if config.method == "sjd_pac" and not config.adaptive_continuation and not config.use_pd:
        messages.append(
            "sjd_pac with Adaptive Continuation off and no Proactive Drafting tree is plain sjd; "
            "switch one of them on or choose method sjd."
        )
    return messages


def settings_line(config: SamplerConfig, threads: Optional[int] = None) -> str:
    """The settings a run used, for summary lines: method, L, D, K, CFG, temperature, verify, threads."""
    parts = [f"method {config.method}"]
    if config.method != "ar":
        parts.append(f"L {config.window}")
    if config.node_budget is not None:
        parts.append(f"node budget {config.node_budget}")
    elif config.use_pd:
        parts.append(f"D {config.tree_depth}, K {config.tree_width}")
    elif config.method == "sjd_pac":
        parts.append("no PD tree")
    if config.method == "sjd_pac" and not config.adaptive_continuation:
        parts.append("no AC")
    parts.append(f"CFG {config.cfg_scale:g}")
    parts.append(f"temperature {config.temperature:g}")
    if config.top_k is not None:
        parts.append(f"top-k {config.top_k}")
    if config.top_p is not None:
        parts.append(f"top-p {config.top_p:g}")
    parts.append(f"verify {config.verify}")
    if config.compile:
        parts.append("compiled")
    if threads is not None:
        parts.append(f"{threads} CPU thread{'s' if threads != 1 else ''}")
    return ", ".join(parts)


def run_record(config: SamplerConfig, *, prompt: str, seed: int, negative_prompt: str = "",
               resolution: Optional[str] = None, model: str = "", family: str = "",
               batch_size: int = 1) -> dict:
    """Everything needed to reproduce a run, as plain JSON (saved in PNG metadata by the CLI and nodes)."""
    knobs = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}  # every knob, new ones too
    knobs["cfg"] = knobs.pop("cfg_scale")
    return {
        "model": model, "family": family, "prompt": prompt, "negative_prompt": negative_prompt,
        "resolution": resolution, "seed": int(seed), "batch_size": int(batch_size), **knobs,
    }
