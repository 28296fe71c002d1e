"""Word-level vocabulary and token layout of the demo text-to-image model.

Ids: special tokens first (<pad>=0, <bos>=1, <boi>=2, <eol>=3, <eoi>=4, <unk>=5), then the
caption words, then the image codes as one contiguous block (code c has id image_offset + c).

Sequence layout (mirrors Lumina-mGPT / Emu3 style models):

    <bos> caption words <boi> (16 image codes, <eol>) x 16 <eoi>

The prompt is ``<bos> words <boi>``; the image part is 16 * 17 = 272 tokens, every 17th an
``<eol>``; the unconditional prompt for classifier-free guidance is ``<bos> <boi>``.

With ``prompt_slots`` set (``demo.tools.train --arch gpt2 --prompt-slots 20``; the shipped Llama has
none), every prompt has the same length: the words are
followed by ``<pad>`` up to ``prompt_slots`` (the unconditional prompt is all ``<pad>``), so image
token (row, column) always sits at the same absolute position and a model with learned position
embeddings (GPT-2) can learn the 2D layout from them. Longer captions keep their first
``prompt_slots`` words.

With ``prompt_format="slots"`` (the default of ``demo.tools.train``), the prompt is a structured
caption of fixed slots, the same length for every prompt (``SLOT_NAMES``): for each of two
objects its vertical place (top / center / bottom), horizontal place (left / center / right),
size (small / medium / large), colour and shape, then the background colour; the second
object's slots are ``<pad>`` when there is one object, and the unconditional prompt is all
``<pad>``. Every image token then sits at one absolute position, and each caption fact at one
slot. Natural-language prompts ("a red circle top left on a blue background", "a large red
square in the center on a white background") are parsed into the slots by `parse_prompt`; a
word the model does not know is an error that lists the words it knows.

With ``row_tokens`` set (``demo.tools.train``'s default; ``--no-row-tokens`` turns it off), each row
ends in its own forced token (``<eol0>`` .. ``<eol15>``, ids between the words and the image
codes) instead of the shared ``<eol>``: the nearest row end then names the row, and the distance
to it names the column, so a 1D-RoPE Llama gets the 2D position of every image token from its
local context. The sequence length and the tokens the sampler is free to choose are unchanged.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import torch

from . import VOCAB_FILE
from .captions import COLORS, SHAPES, SIZES, SLOT_NAMES, ParsedPrompt, caption_words, parse_prompt

SPECIALS = ["<pad>", "<bos>", "<boi>", "<eol>", "<eoi>", "<unk>"]
PROMPT_FORMATS = ("words", "slots")
SLOT_WORDS = ["medium"]  # words the slot format needs beyond captions.CAPTION_WORDS
PAD, BOS, BOI, EOL, EOI, UNK = range(6)


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
            need = set(COLORS) | set(SHAPES) | set(SIZES) | {"top", "bottom", "left", "right", "center"}
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
    def load(cls, path: str | os.PathLike) -> "DemoVocab":
        path = os.fspath(path)
        p = path if path.endswith(".json") else os.path.join(path, VOCAB_FILE)
        with open(p) as f:
            d = json.load(f)
        v = cls(words=d["words"], codebook_size=d["codebook_size"], grid=d["grid"], specials=d["specials"],
                prompt_slots=d.get("prompt_slots"), row_tokens=bool(d.get("row_tokens", False)),
                prompt_format=d.get("prompt_format", "words"))
        if v.image_offset != d["image_offset"]:
            raise ValueError("vocab.json image_offset does not match its word list")
        return v
