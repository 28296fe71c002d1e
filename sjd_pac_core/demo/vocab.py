"""Word-level vocabulary and token layout of the demo text-to-image model.

Ids: special tokens first (<pad>=0, <bos>=1, <boi>=2, <eol>=3, <eoi>=4, <unk>=5), then the
caption words, then the image codes as one contiguous block (code c has id image_offset + c).

Sequence layout (mirrors Lumina-mGPT / Emu3 style models):

    <bos> caption words <boi> (16 image codes, <eol>) x 16 <eoi>

The prompt is ``<bos> words <boi>``; the image part is 16 * 17 = 272 tokens, every 17th an
``<eol>``; the unconditional prompt for classifier-free guidance is ``<bos> <boi>``.

With ``prompt_slots`` set (``demo.train --arch gpt2 --prompt-slots 20``; the shipped Llama has
none), every prompt has the same length: the words are
followed by ``<pad>`` up to ``prompt_slots`` (the unconditional prompt is all ``<pad>``), so image
token (row, column) always sits at the same absolute position and a model with learned position
embeddings (GPT-2) can learn the 2D layout from them. Longer captions keep their first
``prompt_slots`` words.

With ``prompt_format="slots"`` (the default of ``demo.train``), the prompt is a structured
caption of fixed slots, the same length for every prompt (``SLOT_NAMES``): for each of two
objects its vertical place (top / center / bottom), horizontal place (left / center / right),
size (small / medium / large), colour and shape, then the background colour; the second
object's slots are ``<pad>`` when there is one object, and the unconditional prompt is all
``<pad>``. Every image token then sits at one absolute position, and each caption fact at one
slot. Natural-language prompts ("a red circle top left on a blue background", "a large red
square in the center on a white background") are parsed into the slots by `parse_prompt`; a
word the model does not know is an error that lists the words it knows.

With ``row_tokens`` set (``demo.train``'s default; ``--no-row-tokens`` turns it off), each row
ends in its own forced token (``<eol0>`` .. ``<eol15>``, ids between the words and the image
codes) instead of the shared ``<eol>``: the nearest row end then names the row, and the distance
to it names the column, so a 1D-RoPE Llama gets the 2D position of every image token from its
local context. The sequence length and the tokens the sampler is free to choose are unchanged.
"""

from __future__ import annotations

import json
import os
import string
from dataclasses import dataclass, field

import torch

from . import EXAMPLE_PROMPT

SPECIALS = ["<pad>", "<bos>", "<boi>", "<eol>", "<eoi>", "<unk>"]
PROMPT_FORMATS = ("words", "slots")
# the structured prompt: per object (vertical place, horizontal place, size, colour, shape), then
# the background colour
OBJECT_SLOTS = ("vertical", "horizontal", "size", "colour", "shape")
MAX_OBJECTS = 2
SLOT_NAMES = tuple(f"{name}{k + 1}" for k in range(MAX_OBJECTS) for name in OBJECT_SLOTS) + ("background",)
SLOT_WORDS = ["medium"]  # words the slot format needs beyond data.CAPTION_WORDS
PAD, BOS, BOI, EOL, EOI, UNK = range(6)
VOCAB_FILE = "vocab.json"


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
_SIZES = ("small", "medium", "large")


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
    from . import data as D

    words = caption_words(text)
    known = set(_FILLERS) | set(_VERTICAL) | set(_HORIZONTAL) | _MIDDLE | set(_SIZES) | set(D.COLORS) | set(D.SHAPES)
    known |= {"and", "background"}
    unknown = [w for w in dict.fromkeys(words) if w not in known]
    if unknown:
        raise PromptError(
            f"The demo model does not know the word{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}. "
            f"It draws one or two shapes ({', '.join(D.SHAPES)}) in colours ({', '.join(D.COLOR_NAMES)}), "
            f"sizes (small, large) and places (top left, top, top right, left, center, right, bottom left, "
            f"bottom, bottom right) on a coloured background; write e.g. \"{EXAMPLE_PROMPT}\"."
        )
    warnings = []
    background = None
    if "background" in words:
        at = len(words) - 1 - words[::-1].index("background")
        before = [w for w in words[:at] if w not in ("a", "an", "the")]
        if not before or before[-1] not in D.COLORS:
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
            if len(rest) == 1 and rest[0] in D.COLORS:
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
        colours = [w for w in p if w in D.COLORS]
        shapes = [w for w in p if w in D.SHAPES]
        sizes = [w for w in p if w in _SIZES]
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
        light = any(D.color_distance(o["colour"], "white") < D.MIN_CONTRAST for o in objects)
        background = "black" if light else "white"
        warnings.append(f"No background colour given; the demo model paints a {background} background.")
    return ParsedPrompt(tuple(objects), background, tuple(warnings))


def slot_caption(parsed: ParsedPrompt) -> str:
    """The parsed prompt written back in the data generator's caption grammar."""
    from . import data as D

    specs = []
    for o in parsed.objects:
        v = "" if o["vertical"] == "center" else o["vertical"]
        h = "" if o["horizontal"] == "center" else o["horizontal"]
        pos = " ".join(x for x in (v, h) if x) or "in the center"
        specs.append(D.ObjectSpec(o["shape"], o["colour"], o["size"], pos, (0.0, 0.0), 0.0))
    return D.make_caption(specs, parsed.background)


@dataclass
class DemoVocab:
    words: list[str]
    codebook_size: int = 512
    grid: int = 16
    specials: list[str] = field(default_factory=lambda: list(SPECIALS))
    prompt_slots: int | None = None  # fixed number of word slots per prompt; None = as many as words
    row_tokens: bool = False  # a distinct forced token at the end of each row (else the shared <eol>)
    prompt_format: str = "words"  # "words": the caption's words; "slots": the structured caption

    def __post_init__(self):
        if self.specials != SPECIALS:
            raise ValueError(f"special tokens must be {SPECIALS}")
        if self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"prompt_format must be one of {PROMPT_FORMATS}, got {self.prompt_format!r}")
        if self.prompt_format == "slots":
            if self.prompt_slots is not None:
                raise ValueError("prompt_slots applies to the words format; the slot format has its own fixed length")
            from . import data as D

            need = set(D.COLORS) | set(D.SHAPES) | set(_SIZES) | {"top", "bottom", "left", "right", "center"}
            missing = sorted(need - set(self.words))
            if missing:
                raise ValueError(f"the slot format needs the words {missing} in the vocabulary")
        if self.prompt_slots is not None and (isinstance(self.prompt_slots, bool) or self.prompt_slots < 1):
            raise ValueError(f"prompt_slots must be a positive int or None, got {self.prompt_slots!r}")
        self._word_id = {w: len(self.specials) + i for i, w in enumerate(self.words)}

    # -- sizes / ids -----------------------------------------------------------------------
    pad_id, bos_id, boi_id, eol_id, eoi_id, unk_id = PAD, BOS, BOI, EOL, EOI, UNK

    @property
    def row_token_offset(self) -> int:
        return len(self.specials) + len(self.words)

    @property
    def image_offset(self) -> int:
        return self.row_token_offset + (self.grid if self.row_tokens else 0)

    @property
    def vocab_size(self) -> int:
        return self.image_offset + self.codebook_size

    @property
    def row_length(self) -> int:
        return self.grid + 1  # codes + <eol>

    @property
    def num_image_tokens(self) -> int:
        """Tokens to sample after the prompt: grid rows of (grid codes, <eol>); <eoi> excluded."""
        return self.grid * self.row_length

    # -- text ------------------------------------------------------------------------------
    def encode_caption(self, caption: str) -> list[int]:
        return [self._word_id.get(w, UNK) for w in caption_words(caption)]

    @property
    def prompt_length(self) -> int | None:
        """Tokens of every prompt (``<bos>`` and ``<boi>`` included) when it is fixed, else None."""
        if self.prompt_format == "slots":
            return len(SLOT_NAMES) + 2
        return None if self.prompt_slots is None else self.prompt_slots + 2

    def slot_ids(self, parsed: ParsedPrompt | None) -> torch.Tensor:
        """``<bos> slots <boi>`` of a parsed prompt (None: the unconditional prompt, all <pad>)."""
        slots = parsed.slots() if parsed is not None else [None] * len(SLOT_NAMES)
        ids = [PAD if w is None else self._word_id[w] for w in slots]
        return torch.tensor([BOS, *ids, BOI], dtype=torch.long)

    def prompt_ids(self, caption: str | None) -> torch.Tensor:
        """``<bos> words <boi>`` (words padded or cut to ``prompt_slots`` when it is set; the
        structured caption's slots with ``prompt_format="slots"``, raising PromptError for a
        prompt it cannot read); ``None`` or ``""`` gives the unconditional prompt."""
        if self.prompt_format == "slots":
            return self.slot_ids(parse_prompt(caption) if caption and caption.strip() else None)
        words = self.encode_caption(caption) if caption else []
        if self.prompt_slots is not None:
            words = words[: self.prompt_slots] + [PAD] * max(0, self.prompt_slots - len(words))
        return torch.tensor([BOS, *words, BOI], dtype=torch.long)

    def uncond_prompt_ids(self) -> torch.Tensor:
        return self.prompt_ids(None)

    def decode_ids(self, ids) -> str:
        out = []
        for i in torch.as_tensor(ids).tolist():
            if i < len(self.specials):
                out.append(self.specials[i])
            elif i < self.row_token_offset:
                out.append(self.words[i - len(self.specials)])
            elif i < self.image_offset:
                out.append(f"<eol{i - self.row_token_offset}>")
            else:
                out.append(f"<img{i - self.image_offset}>")
        return " ".join(out)

    # -- image tokens ----------------------------------------------------------------------
    def image_ids(self, codes: torch.Tensor) -> torch.Tensor:
        """codes (..., grid, grid) -> ids (..., grid * (grid + 1)) with an <eol> after each row."""
        codes = torch.as_tensor(codes).long()
        lead = codes.shape[:-2]
        ids = codes + self.image_offset
        eol = self.row_end_ids().reshape(self.grid, 1).expand(*lead, self.grid, 1)
        return torch.cat([ids, eol], dim=-1).reshape(*lead, self.num_image_tokens)

    def codes_from_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (..., 272) -> codes (..., grid, grid); raises if the layout is broken."""
        ids = torch.as_tensor(ids).long()
        lead = ids.shape[:-1]
        rows = ids.reshape(*lead, self.grid, self.row_length)
        if not bool((rows[..., -1] == self.row_end_ids()).all()):
            raise ValueError("image tokens do not end every row with its row-end token")
        codes = rows[..., :-1] - self.image_offset
        if bool((codes < 0).any()) or bool((codes >= self.codebook_size).any()):
            raise ValueError("image tokens contain non-image ids at code positions")
        return codes

    def allowed_tokens(self) -> torch.Tensor:
        """bool [num_image_tokens, vocab]: code positions allow exactly the image codes,
        every 17th position allows only its row-end token."""
        m = torch.zeros(self.num_image_tokens, self.vocab_size, dtype=torch.bool)
        eol_pos = self.eol_positions()
        free = torch.ones(self.num_image_tokens, dtype=torch.bool)
        free[eol_pos] = False
        m[free, self.image_offset :] = True
        m[eol_pos, self.row_end_ids()] = True
        return m

    def row_end_ids(self) -> torch.Tensor:
        """long [grid]: the forced token that closes each row (<eol>, or <eol0>.. with row_tokens)."""
        if self.row_tokens:
            return torch.arange(self.grid, dtype=torch.long) + self.row_token_offset
        return torch.full((self.grid,), EOL, dtype=torch.long)

    def eol_positions(self) -> torch.Tensor:
        return torch.arange(self.grid, dtype=torch.long) * self.row_length + self.grid

    def forced_tokens(self) -> torch.Tensor:
        """long [num_image_tokens]: the row-end token at every row end, -1 elsewhere."""
        f = torch.full((self.num_image_tokens,), -1, dtype=torch.long)
        f[self.eol_positions()] = self.row_end_ids()
        return f

    def image_token_mask(self) -> torch.Tensor:
        """bool [vocab]: True for image-code ids."""
        m = torch.zeros(self.vocab_size, dtype=torch.bool)
        m[self.image_offset :] = True
        return m

    # -- persistence -----------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "specials": self.specials,
            "words": self.words,
            "image_offset": self.image_offset,
            "codebook_size": self.codebook_size,
            "grid": self.grid,
            "vocab_size": self.vocab_size,
            "layout": "<bos> caption <boi> (grid codes, <eol>) x grid <eoi>",
            "prompt_format": self.prompt_format,
            "prompt_slots": self.prompt_slots,
            "row_tokens": self.row_tokens,
            "uncond_prompt": self.decode_ids(self.uncond_prompt_ids()).split(),
            **({"slot_names": list(SLOT_NAMES)} if self.prompt_format == "slots" else {}),
        }

    def save(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, VOCAB_FILE), "w") as f:
            json.dump(self.to_dict(), f, indent=2)

    @classmethod
    def load(cls, path: str) -> "DemoVocab":
        p = path if path.endswith(".json") else os.path.join(path, VOCAB_FILE)
        with open(p) as f:
            d = json.load(f)
        v = cls(words=d["words"], codebook_size=d["codebook_size"], grid=d["grid"], specials=d["specials"],
                prompt_slots=d.get("prompt_slots"), row_tokens=bool(d.get("row_tokens", False)),
                prompt_format=d.get("prompt_format", "words"))
        if v.image_offset != d["image_offset"]:
            raise ValueError("vocab.json image_offset does not match its word list")
        return v
