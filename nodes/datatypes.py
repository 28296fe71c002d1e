"""The values that travel along the graph's links: AR_IMAGE_MODEL (model_cache.ModelHandle),
AR_IMAGE_TOKENS, SJD_STATS."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import torch

from sjd_pac_core import RunStats, SamplerConfig

from .model_cache import ModelHandle

AR_IMAGE_MODEL = "AR_IMAGE_MODEL"
AR_IMAGE_TOKENS = "AR_IMAGE_TOKENS"
SJD_STATS = "SJD_STATS"


@dataclass
class ARImageTokens:
    """AR_IMAGE_TOKENS: sampled image tokens, ready for Decode AR Image Tokens."""

    tokens: torch.Tensor  # long [B, num_tokens] on the CPU, in the sampler's token space
    resolution: str
    model: ModelHandle
    seeds: List[int] = field(default_factory=list)

    @property
    def batch_size(self) -> int:
        return int(self.tokens.shape[0])


@dataclass
class SJDStats:
    """SJD_STATS: statistics of one sampler run (one RunStats per image of the batch)."""

    runs: List[RunStats]
    config: SamplerConfig
    model_name: str
    prompt: str
    seed: int
    resolution: str
    tokens: torch.Tensor  # long [B, num_tokens], to tell whether two runs gave the same picture
    baseline_key: tuple  # runs with the same key are the same job, whatever the method
    threads: Optional[int] = None  # CPU threads the forward passes ran with (None: a GPU run)
    notes: List[str] = field(default_factory=list)  # warnings: unknown words, pointless settings

    @property
    def method(self) -> str:
        return self.config.method

    @property
    def forward_passes(self) -> int:
        return sum(r.forward_passes for r in self.runs)

    @property
    def tokens_committed(self) -> int:
        return sum(r.tokens_committed for r in self.runs)

    @property
    def step_compression(self) -> float:
        return self.tokens_committed / max(1, self.forward_passes)

    @property
    def wall_time(self) -> float:
        return sum(r.wall_time for r in self.runs)

    @property
    def accept_lengths(self) -> List[int]:
        return [n for r in self.runs for n in r.accept_lengths]
