"""The sampler's work between two forwards does not grow with the tree.

On a GPU every tensor operation between two forwards is a kernel launch on the host's critical
path, and a compiled forward of a 7B model takes a few milliseconds: a loop over a pass's nodes
there would cost more than the nodes save. The operations a pass runs outside the model's forward
are counted with a dispatch mode (every aten call, whatever the device), for budgets of 16 and 256
nodes under both rules: the larger tree may cost a little more (rejection's recursive rejection
runs once per candidate slot, and wider trees have more slots), never in proportion to its nodes.
A planted per-node loop in the children's gather (same results, one gather per node) must fail.
"""

from __future__ import annotations

import statistics

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import sjd_pac_core as sp
from sjd_pac_core.engine.loop import PassShape
from sjd_pac_core.models.causal_lm import CausalLMSession
from sjd_pac_core.sampling.rules import NodeChildren

PROMPT = "a blue triangle top left on a black background"
SMALL, LARGE = 16, 256
GROWTH_MAX = 1.3  # measured 0.72x (gumbel) and 1.15x (rejection) from 16 to 256 nodes; the planted loop 1.95x


class PassOps(TorchDispatchMode):
    """Counts aten calls outside the session's forward, one count per pass (the calls before
    each forward: the last pass's verification and the drafting of this one)."""

    def __init__(self) -> None:
        super().__init__()
        self.count, self.per_pass, self.in_forward = 0, [], False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.in_forward:
            self.count += 1
        return func(*args, **(kwargs or {}))


def median_ops_per_pass(model, monkeypatch, verify: str, budget: int) -> float:
    counter = PassOps()
    forward = CausalLMSession.forward

    def counted_forward(self, *args, **kwargs):
        counter.per_pass.append(counter.count)
        counter.count, counter.in_forward = 0, True
        try:
            return forward(self, *args, **kwargs)
        finally:
            counter.in_forward = False

    monkeypatch.setattr(CausalLMSession, "forward", counted_forward)
    config = model.defaults.sampler_config().with_(method="sjd_pac", verify=verify, window="auto",
                                                   node_budget=budget)
    with counter:
        sp.generate_image(model, PROMPT, config, seed=0)
    monkeypatch.setattr(CausalLMSession, "forward", forward)
    passes = counter.per_pass[1:]  # the first count holds the prefill's drafting too
    assert len(passes) >= 10, f"only {len(passes)} passes counted"
    return statistics.median(passes)


def growth(model, monkeypatch, verify: str) -> float:
    return (median_ops_per_pass(model, monkeypatch, verify, LARGE)
            / median_ops_per_pass(model, monkeypatch, verify, SMALL))


@pytest.mark.parametrize("verify", ["gumbel", "rejection"])
def test_ops_between_forwards_do_not_grow_with_the_budget(demo_model, monkeypatch, verify):
    ratio = growth(demo_model, monkeypatch, verify)
    assert ratio <= GROWTH_MAX, f"{verify}: {ratio:.2f}x the operations per pass at {LARGE} nodes as at {SMALL}"


def test_planted_per_node_gather_fails_the_growth_bound(demo_model, monkeypatch):
    """Control: the children gathered node by node (the same tensors) grow with the tree."""
    def per_node_children(self, flat_tokens, flat_valid):
        tokens = torch.stack([flat_tokens[row] for row in self.child_source])
        valid = torch.stack([flat_valid[row] for row in self.child_source])
        return NodeChildren(tokens=tokens, valid=valid, q_rows=self.q_rows, single=self.single,
                            multi=self.multi, leaves=self.leaves)

    monkeypatch.setattr(PassShape, "children", per_node_children)
    ratio = growth(demo_model, monkeypatch, "gumbel")
    assert ratio > GROWTH_MAX, f"a per-node loop went unnoticed: {ratio:.2f}x"
