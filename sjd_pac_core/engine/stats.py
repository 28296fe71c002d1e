"""Per-pass records and run statistics (spec section 5)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple


@dataclass(frozen=True)
class PassRecord:
    """What one forward pass did."""

    index: int  # 0 = the prompt prefill, which commits the first image token
    committed: int  # image tokens committed by this pass (>= 1)
    total_committed: int  # image tokens committed so far
    window: int  # draft tokens fed (main branch + chain; 0 for AR and the prefill)
    tree_nodes: int  # extra nodes fed for Proactive Drafting's side branches
    first_reject: int  # offset of the first rejection in the window, -1 if none
    kept_by_ac: int  # later drafts Adaptive Continuation kept unchanged for the next pass
    branch: Tuple[int, ...]  # candidate chosen at each accepted tree level (0 = main branch)
    wall_time: float  # seconds for the whole iteration (host clock, pass start to next draft)
    forward_time: float  # seconds inside the model's forward (CUDA events on a GPU)
    envelope: int = 0  # nodes fed, padding included (the pass's fixed shape; 0 for the prefill)
    host_syncs: int = 0  # device-to-host syncs the pass made (one)
    compaction_bytes: int = 0  # key/value bytes copied to compact the cache after this pass


@dataclass
class RunStats:
    """Statistics of one sampling run; filled pass by pass."""

    num_tokens: int
    method: str
    records: List[PassRecord] = field(default_factory=list)
    warmup_time: float = 0.0  # seconds compiling pass shapes before the timed passes (compile=True)

    @property
    def forward_passes(self) -> int:
        return len(self.records)

    @property
    def tokens_committed(self) -> int:
        return self.records[-1].total_committed if self.records else 0

    @property
    def step_compression(self) -> float:
        """Image tokens per forward pass (plain AR = 1.00)."""
        return self.tokens_committed / max(1, self.forward_passes)

    @property
    def accept_lengths(self) -> List[int]:
        """Tokens committed by each forward pass, prefill included."""
        return [r.committed for r in self.records]

    @property
    def mean_accept_length(self) -> float:
        return self.step_compression

    @property
    def wall_time(self) -> float:
        return sum(r.wall_time for r in self.records)

    @property
    def forward_time(self) -> float:
        return sum(r.forward_time for r in self.records)

    @property
    def sampler_time(self) -> float:
        """Seconds outside the model's forward: planning, verification, the walk, drafting."""
        return self.wall_time - self.forward_time

    @property
    def host_syncs(self) -> int:
        return sum(r.host_syncs for r in self.records)

    @property
    def overhead_fraction(self) -> float:
        """Time outside the model's forward, as a fraction of forward time."""
        fwd = self.forward_time
        return (self.wall_time - fwd) / fwd if fwd > 0 else 0.0

    @property
    def tokens_per_second(self) -> float:
        t = self.wall_time
        return self.tokens_committed / t if t > 0 else 0.0

    def histogram(self, max_length: Optional[int] = None) -> Dict[int, int]:
        """Acceptance-length histogram: {tokens committed in a pass: number of passes}."""
        hist: Dict[int, int] = {}
        for n in self.accept_lengths:
            key = n if max_length is None else min(n, max_length)
            hist[key] = hist.get(key, 0) + 1
        return dict(sorted(hist.items()))

    def summary(self) -> str:
        return (
            f"{self.method}: {self.tokens_committed} tokens in {self.forward_passes} forward passes "
            f"(step compression {self.step_compression:.2f}x), {self.wall_time:.2f} s, "
            f"{self.tokens_per_second:.1f} tokens/s"
        )

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "num_tokens": self.num_tokens,
            "forward_passes": self.forward_passes,
            "step_compression": self.step_compression,
            "wall_time": self.wall_time,
            "forward_time": self.forward_time,
            "sampler_time": self.sampler_time,
            "warmup_time": self.warmup_time,
            "host_syncs": self.host_syncs,
            "tokens_per_second": self.tokens_per_second,
            "accept_lengths": self.accept_lengths,
            "histogram": self.histogram(),
        }
