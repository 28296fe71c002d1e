"""Checked argparse types for the command-line tools (`sjd-pac generate`, `bench`, `lossless`,
the demo tools): a bad count, rate or list is refused while the arguments are parsed, before any
work, with one sentence (argparse adds the flag: "argument --prompts: must be ..."). Upper bounds
keep a typo from asking for unbounded work (a seed range of 10^11 seeds, 99,999 threads).

No torch here: the tools parse their arguments before importing it.
"""

from __future__ import annotations

import argparse
import math
import os
from typing import Callable, List, Optional, Union

from .config import MAX_NODE_BUDGET, ConfigError
from .settings import node_budget_value, window_value

MAX_SEEDS = 100_000  # seeds one bench or lossless run may take (the lossless default is 120)


def _describe(low: Optional[float], high: Optional[float]) -> str:
    if low is not None and high is not None:
        return f"between {low:g} and {high:g}"
    return f"at least {low:g}" if low is not None else f"at most {high:g}"


def whole(low: int, high: Optional[int] = None, hint: str = "") -> Callable[[str], int]:
    """A whole number in [low, high]; `hint` says what to do instead ("0 skips it")."""
    tail = f"; {hint}" if hint else ""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number {_describe(low, high)}, got {text!r}{tail}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {_describe(low, high)}, got {value}{tail}")
        return value

    parse.__name__ = "whole number"  # argparse names the type in its own messages
    return parse


def real(low: Optional[float] = None, high: Optional[float] = None, *, above: bool = False, below: bool = False,
         hint: str = "") -> Callable[[str], float]:
    """A finite number with low <= x <= high (`above`: low < x; `below`: x < high)."""
    tail = f"; {hint}" if hint else ""
    words = []
    if low is not None:
        words.append(f"above {low:g}" if above else f"at least {low:g}")
    if high is not None:
        words.append(f"below {high:g}" if below else f"at most {high:g}")
    bound = " and ".join(words) or "finite"

    def parse(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number {bound}, got {text!r}{tail}") from None
        if not math.isfinite(value) or (low is not None and (value <= low if above else value < low)) or (
                high is not None and (value >= high if below else value > high)):
            raise argparse.ArgumentTypeError(f"must be a number {bound}, got {text}{tail}")
        return value

    parse.__name__ = "number"
    return parse


def threads(allow_default: bool = True) -> Callable[[str], int]:
    """A torch CPU thread count: 1 to this machine's cores (0: torch's default, where allowed)."""
    cores = os.cpu_count() or 1
    return whole(0 if allow_default else 1, cores,
                 f"this machine has {cores} cores" + ("; 0 = torch's default" if allow_default else ""))


def seed(text: str) -> int:
    """One seed, 0 to 2^64-1."""
    return _one_seed(text, text)


def _one_seed(part: str, text: str) -> int:
    try:
        value = int(part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a seed list; use whole numbers, lists (0,1,2) or ranges (0-9)") from None
    if not 0 <= value <= 2**64 - 1:
        raise argparse.ArgumentTypeError(f"seeds run from 0 to 2^64-1, got {value}; try 0-9")
    return value


def seed_list(text: str) -> List[int]:
    """'0', '0,3,7', '0-9' or a mix ('0-4,10'): at most MAX_SEEDS seeds, none twice."""
    seeds: List[int] = []
    for part in text.split(","):
        if not part.strip():
            continue
        lo, dash, hi = part.strip().partition("-")
        if dash:
            first, last = _one_seed(lo, text), _one_seed(hi, text)
            if last < first:
                raise argparse.ArgumentTypeError(f"the range {part.strip()} runs backwards; write {last}-{first}")
            count = last - first + 1
        else:
            first = last = _one_seed(part, text)
            count = 1
        if len(seeds) + count > MAX_SEEDS:
            raise argparse.ArgumentTypeError(
                f"{text!r} asks for more than {MAX_SEEDS:,} seeds; use a shorter range such as 0-119")
        seeds.extend(range(first, last + 1))
    if not seeds:
        raise argparse.ArgumentTypeError("names no seed; give at least one, e.g. 0 or 0-9")
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"{text!r} names a seed twice; give each seed once")
    return seeds


def nonempty(what: str, example: str) -> Callable[[str], str]:
    """A list given as text that must name something (an empty value does not mean 'the default')."""
    def parse(text: str) -> str:
        if not text.strip().strip(","):
            raise argparse.ArgumentTypeError(f"is empty; give {what}, e.g. {example}, or leave the flag out "
                                             "for the default")
        return text

    parse.__name__ = what
    return parse


def window(text: str):
    """The draft window L: a whole number or 'auto' (settings.window_value's rule)."""
    try:
        return window_value(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def node_budget(text: str):
    """The node budget B: nodes per pass, 'auto', or 0 (off) (settings.node_budget_value's rule)."""
    try:
        return node_budget_value(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def budget_list(text: str) -> List[Union[None, int, str]]:
    """The bench's node-budget axis: 'none,32,64,128,256' -> [None, 32, 64, 128, 256] (none: a
    row's own window and tree; auto: chosen per pass), each budget 1 to MAX_NODE_BUDGET, none twice."""
    budgets: List[Union[None, int, str]] = []
    for part in (p.strip().lower() for p in text.split(",")):
        if not part:
            continue
        if part in ("none", "auto"):
            budgets.append(None if part == "none" else part)
            continue
        try:
            value = int(part)
        except ValueError:
            value = 0
        if not 1 <= value <= MAX_NODE_BUDGET:
            raise argparse.ArgumentTypeError(
                f"{part!r} is not a node budget; use whole numbers of nodes per pass from 1 to {MAX_NODE_BUDGET}, "
                "auto or none, comma-separated (e.g. none,32,64,128,256)")
        budgets.append(value)
    if not budgets:
        raise argparse.ArgumentTypeError("names no budget; give at least one, e.g. 32,64,128,256")
    if len(set(budgets)) != len(budgets):
        raise argparse.ArgumentTypeError(f"{text!r} names a budget twice; give each once")
    return budgets
