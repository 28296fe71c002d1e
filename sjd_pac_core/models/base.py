"""The one small interface between the sampler and a model.

The sampling loop needs only this: open a session over a prompt (one row, or two for CFG),
get the logits for the first image token, run a forward pass over a tree of nodes on top of the
cache, and keep the cache entries of the nodes that were committed. Token ids here are in the
sampler's token space (an adapter may map them to a subset of the model's vocabulary, e.g. the
image codes plus end-of-line, which is exact because nothing else is allowed there).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional, Sequence

import torch


class DecoderSession(ABC):
    """One generation's model state: the KV cache over the prompt and the committed tokens."""

    @abstractmethod
    def prefill(self) -> torch.Tensor:
        """Run the prompt; return logits [B, V] for the first image token."""

    @abstractmethod
    def forward(
        self, tokens: torch.Tensor, depths: torch.Tensor, attend: torch.Tensor
    ) -> torch.Tensor:
        """One pass over S new nodes on top of the cache.

        tokens: long [S] (the same for every row); depths: long [S], the node's offset from the
        first node (its position id is the row's next position plus depth); attend: bool [S, S],
        node i sees node j. Returns logits [B, S, V]. The cache grows by S entries.
        """

    def configure(self, extra_tokens: int, vocabulary: Optional[torch.Tensor] = None, compile: bool = False) -> None:
        """Hints before the prefill (a session may ignore them): the most entries the run adds
        to the cache after the prompt, the tokens that may ever be sampled (bool [V]), and
        whether passes will run as compiled fixed shapes (a compiled session sizes its cache so
        that one graph serves every prompt length; passes stay eager until `start_compiled`)."""

    def start_compiled(self) -> None:
        """Run every later pass compiled (after the prefill and any eager probing; the session
        was configured with compile=True). A session without compiled passes ignores it."""

    @property
    def compaction_bytes(self) -> int:
        """Bytes of keys and values the session has copied to compact its cache (0 if it never does)."""
        return 0

    def compiled_shape_ready(self, size: int) -> bool:
        """Whether a compiled pass of this size already ran on this model with this session's
        shapes (its graph exists, so a warm-up may skip it). False unless the session compiles."""
        return False

    @abstractmethod
    def keep(self, nodes: Sequence[int]) -> None:
        """Keep the cache entries of these nodes of the last pass (in order), drop the others."""

    @abstractmethod
    def close(self) -> None:
        """Free the cache. Called on every exit path, interrupts included."""


class TokenModel(ABC):
    """What the sampler needs from a model family."""

    vocab_size: int  # size of the sampler's token space (the logits' last axis)

    @property
    @abstractmethod
    def device(self) -> torch.device: ...

    @abstractmethod
    def open_session(self, prompts: Sequence[torch.Tensor]) -> DecoderSession:
        """A session over one prompt (or two: conditional, unconditional for CFG)."""
