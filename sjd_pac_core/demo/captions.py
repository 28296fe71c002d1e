"""The demo's picture language: what a scene may hold (colours, shapes, sizes, places) and how
captions and prompts say it. Pure Python, no torch: the CLI checks a prompt with it before any
weights load, the demo model reads prompts with it, and the data generator (tools/data.py)
writes its captions with it.

Captions are the generator's canonical sentences ("a large red circle top left on a blue
background", `make_caption` / `parse_caption`); prompts are what people type, read into the
structured caption's slots by `parse_prompt`, which names the fix for anything it cannot read.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from . import EXAMPLE_PROMPT, VOCAB_FILE

IMAGE_SIZE = 64  # pixels per side; POSITIONS are centres on this frame

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (215, 40, 40),
    "green": (40, 165, 60),
    "blue": (40, 80, 215),
    "yellow": (240, 215, 45),
    "orange": (240, 135, 30),
    "purple": (135, 60, 185),
    "pink": (245, 135, 190),
    "white": (238, 238, 238),
    "black": (22, 22, 22),
    "gray": (128, 128, 128),
    "cyan": (45, 200, 210),
    "brown": (125, 78, 40),
}
COLOR_NAMES = list(COLORS)
SHAPES = ["circle", "square", "triangle", "star", "diamond", "ring"]
SIZES = ["small", "medium", "large"]  # "medium" is captioned without a size word
POSITIONS: dict[str, tuple[int, int]] = {  # name -> (x, y) centre in pixels
    "top left": (16, 16),
    "top": (32, 16),
    "top right": (48, 16),
    "left": (16, 32),
    "in the center": (32, 32),
    "right": (48, 32),
    "bottom left": (16, 48),
    "bottom": (32, 48),
    "bottom right": (48, 48),
}
POSITION_NAMES = list(POSITIONS)

MIN_CONTRAST = 120.0  # minimum RGB distance between an object's colour and the background's

# Every word a caption can contain, in a fixed order (the vocabulary is built from this).
CAPTION_WORDS: list[str] = (
    ["a", "an", "and", "on", "background", "in", "the", "top", "bottom", "left", "right", "center"]
    + ["small", "large"]
    + COLOR_NAMES
    + SHAPES
)


def color_distance(a: str, b: str) -> float:
    """The RGB distance between two named colours."""
    return math.dist(COLORS[a], COLORS[b])


@dataclass
class ObjectSpec:
    shape: str
    color: str
    size: str
    position: str
    center: tuple[float, float]  # pixel centre (x, y) after jitter
    radius: float

    def phrase(self) -> str:
        first = self.color if self.size == "medium" else self.size
        article = "an" if first[0] in "aeiou" else "a"
        size = "" if self.size == "medium" else self.size + " "
        return f"{article} {size}{self.color} {self.shape} {self.position}"


def make_caption(objects: list[ObjectSpec], background: str) -> str:
    article = "an" if background[0] in "aeiou" else "a"
    return " and ".join(o.phrase() for o in objects) + f" on {article} {background} background"


def parse_caption(caption: str) -> tuple[list[dict], str]:
    """Inverse of ``make_caption``: -> ([{size, color, shape, position}, ...], background).

    Raises ValueError if the caption is not in the demo grammar."""
    words = caption.lower().split()
    if len(words) < 4 or words[-1] != "background" or words[-4] != "on":
        raise ValueError(f"not a demo caption: {caption!r}")
    background = words[-2]
    body = " ".join(words[:-4])
    objects = []
    for part in body.split(" and "):
        w = part.split()
        if not w or w[0] not in ("a", "an"):
            raise ValueError(f"not a demo caption: {caption!r}")
        w = w[1:]
        size = "medium"
        if w and w[0] in ("small", "large"):
            size, w = w[0], w[1:]
        if len(w) < 3 or w[0] not in COLORS or w[1] not in SHAPES:
            raise ValueError(f"not a demo caption: {caption!r}")
        pos = " ".join(w[2:])
        if pos not in POSITIONS:
            raise ValueError(f"unknown position {pos!r} in {caption!r}")
        objects.append({"size": size, "color": w[0], "shape": w[1], "position": pos})
    if background not in COLORS:
        raise ValueError(f"unknown background colour in {caption!r}")
    return objects, background


# --- prompts ------------------------------------------------------------------------------------
# the structured prompt: per object (vertical place, horizontal place, size, colour, shape), then
# the background colour
OBJECT_SLOTS = ("vertical", "horizontal", "size", "colour", "shape")
MAX_OBJECTS = 2
SLOT_NAMES = tuple(f"{name}{k + 1}" for k in range(MAX_OBJECTS) for name in OBJECT_SLOTS) + ("background",)


def caption_words(text: str) -> list[str]:
    """Lower-case words of a caption, without the punctuation around them ("background." and
    "(red)" are the words "background" and "red"; a sentence may end in a full stop)."""
    words = (w.strip(string.punctuation) for w in text.lower().replace(",", " ").split())
    return [w for w in words if w]


class PromptError(ValueError):
    """A prompt the demo model cannot read; the message says how to fix it."""


_FILLERS = {"a", "an", "the", "in", "at", "of", "with", "on"}
_VERTICAL = {"top": "top", "upper": "top", "bottom": "bottom", "lower": "bottom"}
_HORIZONTAL = {"left": "left", "right": "right"}
_MIDDLE = {"center", "centre", "middle"}


@dataclass(frozen=True)
class ParsedPrompt:
    """A prompt in the demo grammar: objects as dicts (vertical, horizontal, size, colour, shape)
    and the background colour, plus warnings for what was filled in."""

    objects: tuple
    background: str
    warnings: tuple = ()

    def slots(self) -> list:
        """The words of the ``SLOT_NAMES`` slots (None for an empty slot)."""
        out = []
        for k in range(MAX_OBJECTS):
            o = self.objects[k] if k < len(self.objects) else None
            out += [None if o is None else o[name] for name in OBJECT_SLOTS]
        return out + [self.background]


def parse_prompt(text: str) -> ParsedPrompt:
    """Read a natural-language demo prompt into the structured caption's slots.

    "a small red circle top left and a blue star bottom right on a white background": objects
    joined by "and", each with an optional size word (no size word: medium), one colour, one
    shape and a place (top / bottom and left / right, or center; none: the center, with a
    warning); then "on a <colour> background" (none: white, or black next to a light object, with
    a warning). Raises PromptError naming the fix for a word the demo does not know, more than
    two objects, or an object without exactly one colour and one shape."""
    words = caption_words(text)
    known = set(_FILLERS) | set(_VERTICAL) | set(_HORIZONTAL) | _MIDDLE | set(SIZES) | set(COLORS) | set(SHAPES)
    known |= {"and", "background"}
    unknown = [w for w in dict.fromkeys(words) if w not in known]
    if unknown:
        places = ", ".join(name.replace("in the ", "") for name in POSITION_NAMES)
        raise PromptError(
            f"The demo model does not know the word{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: "
            f"it draws one or two shapes ({', '.join(SHAPES)}) in colours ({', '.join(COLOR_NAMES)}), "
            f"sizes ({', '.join(SIZES)}) and places ({places}) on a coloured background, for example "
            f"\"{EXAMPLE_PROMPT}\"."
        )
    warnings = []
    background = None
    if "background" in words:
        at = len(words) - 1 - words[::-1].index("background")
        before = [w for w in words[:at] if w not in ("a", "an", "the")]
        if not before or before[-1] not in COLORS:
            raise PromptError(f"Name the background's colour right before \"background\", e.g. \"{EXAMPLE_PROMPT}\".")
        background = before[-1]
        # drop "on a <colour> background"
        k = at - 1
        while k >= 0 and words[k] != background:
            k -= 1
        body = words[:k] + words[at + 1 :]
        while body and body[-1] in ("on", "a", "an", "the"):
            body = body[:-1]
    else:
        body = list(words)
        if "on" in body:
            at = len(body) - 1 - body[::-1].index("on")
            rest = [w for w in body[at + 1 :] if w not in ("a", "an", "the")]
            if len(rest) == 1 and rest[0] in COLORS:
                background, body = rest[0], body[:at]
    phrases, cur = [], []
    for w in body:
        if w == "and":
            phrases.append(cur)
            cur = []
        else:
            cur.append(w)
    phrases.append(cur)
    phrases = [p for p in phrases if any(w not in _FILLERS for w in p)]
    if not phrases:
        raise PromptError(f"Name at least one shape and its colour, e.g. \"{EXAMPLE_PROMPT}\".")
    if len(phrases) > MAX_OBJECTS:
        raise PromptError(f"The demo model draws at most {MAX_OBJECTS} objects; the prompt names {len(phrases)}.")
    objects = []
    for p in phrases:
        colours = [w for w in p if w in COLORS]
        shapes = [w for w in p if w in SHAPES]
        sizes = [w for w in p if w in SIZES]
        if len(colours) != 1 or len(shapes) != 1 or len(sizes) > 1:
            raise PromptError(
                f"Give each object one colour and one shape (and at most one size word); "
                f"\"{' '.join(p)}\" has colours {colours or 'none'}, shapes {shapes or 'none'}. "
                f"Write e.g. \"{EXAMPLE_PROMPT}\"."
            )
        vertical = [_VERTICAL[w] for w in p if w in _VERTICAL]
        horizontal = [_HORIZONTAL[w] for w in p if w in _HORIZONTAL]
        if len(set(vertical)) > 1 or len(set(horizontal)) > 1:
            raise PromptError(f"\"{' '.join(p)}\" names two places; give one (e.g. top left).")
        if not vertical and not horizontal and not any(w in _MIDDLE for w in p):
            warnings.append(f"No place given for the {colours[0]} {shapes[0]}; the demo model draws it in the center.")
        objects.append({"vertical": vertical[0] if vertical else "center",
                        "horizontal": horizontal[0] if horizontal else "center",
                        "size": sizes[0] if sizes else "medium", "colour": colours[0], "shape": shapes[0]})
    if background is None:
        light = any(color_distance(o["colour"], "white") < MIN_CONTRAST for o in objects)
        background = "black" if light else "white"
        warnings.append(f"No background colour given; the demo model paints a {background} background.")
    return ParsedPrompt(tuple(objects), background, tuple(warnings))


def check_prompt(prompt: str, folder: Union[str, Path]) -> None:
    """Raise PromptError for a prompt the demo model in `folder` cannot read, from its vocab.json
    alone (before any weights load). Only the structured-caption format refuses prompts; the
    words format generates from the words it knows (and warns), and a folder without vocab.json
    is not a demo model."""
    import json

    path = Path(folder) / VOCAB_FILE
    try:
        prompt_format = json.loads(path.read_text()).get("prompt_format", "words")
    except (OSError, ValueError, AttributeError, RecursionError):
        return  # not a (readable) demo folder: loading it names the problem
    if prompt_format == "slots" and prompt.strip():
        parse_prompt(prompt)
