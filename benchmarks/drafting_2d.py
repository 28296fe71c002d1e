"""Drafts from the image's two dimensions, inside exact verification (a counting experiment).

    python benchmarks/drafting_2d.py --prompts 12 --seeds 0 1 --budget 128

The budget drafter (SamplerConfig(node_budget=B)) with proposals that use the grid, each a known
q that the draft is drawn from, so verification stays exact under both rules:

* front:  the first `--front` drafts of every window redrawn from (1 - w) q + w x uniform over
          {the token to the left (the committed one, then the drafts), the token above (committed,
          one row up)}: the stale q of those drafts saw another token to their left;
* new:    positions new to the window drafted from (1 - w) x the nearest stale logits' p + w x the
          position above: its stale distribution where the window holds it, else its committed
          token.

Step compression is counted (image tokens per forward pass), valid on a loaded machine. Not
shipped: neither beat the plain budget drafter (docs/benchmark_history.md, "Proposals from
the image's two dimensions"). A look-ahead row verified in the same pass is not tried: its q would come from the pass
that verifies it, which exactness forbids; computed a pass ahead it is what a long main chain
already gives new positions.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import sjd_pac_core as sp  # noqa: E402
from sjd_pac_core import arguments  # noqa: E402
from sjd_pac_core.config import MAX_NODE_BUDGET  # noqa: E402
from sjd_pac_core.demo.tools.quality import load_prompts  # noqa: E402
from sjd_pac_core.engine import drafters  # noqa: E402
from sjd_pac_core.engine.draft import DraftWindow  # noqa: E402


def neighbour_mix(q: torch.Tensor, neighbours: torch.Tensor, allowed: torch.Tensor, weight: float) -> torch.Tensor:
    """(1 - weight) q + weight x the mean of `neighbours` (rows of distributions over V), kept to
    the tokens each position allows; a position with no neighbour keeps q."""
    mass = (neighbours * allowed).sum(-1, keepdim=True)
    mixed = (1.0 - weight) * q + weight * neighbours * allowed / mass.clamp(min=1e-30)
    return torch.where(mass > 0, mixed, q)


class GridDrafter(drafters.BudgetDrafter):
    row_length = 0
    front, front_weight, new_weight = 0, 0.0, 0.0

    def budget_draft(self, ctx, window, start, carried, kept):
        if len(window):
            window = self.grid_proposals(ctx, window, start, carried)
        return super().budget_draft(ctx, window, start, carried, kept)

    def grid_proposals(self, ctx, window, start, carried):
        vocab, n, row = window.q.shape[-1], len(window), self.row_length
        positions = ctx.positions[start : start + n]
        allowed = ctx.constraints.mask(positions).to(window.q.dtype)
        q = window.q.clone()
        one_hot = torch.nn.functional.one_hot
        if self.front and self.front_weight:
            m = min(self.front, n)
            left = torch.cat([ctx.committed[start - 1 : start], window.tokens[: m - 1]])
            up = (positions[:m] - row).clamp(min=0)
            votes = one_hot(left, vocab).to(q.dtype) + one_hot(ctx.committed[up], vocab).to(q.dtype) * (
                positions[:m] >= row).unsqueeze(-1)
            q[:m] = neighbour_mix(q[:m], votes, allowed[:m], self.front_weight)
        if self.new_weight and carried < n:
            rows = torch.arange(carried, n)
            above_index = rows - row  # the window position above, if the window holds it
            in_window = above_index >= 0
            above = torch.zeros(len(rows), vocab, dtype=q.dtype)
            above[in_window] = window.q[above_index[in_window]]
            up = (positions[rows] - row).clamp(min=0)
            committed = (~in_window) & (positions[rows] >= row)
            above[committed] = one_hot(ctx.committed[up[committed]], vocab).to(q.dtype)
            q[rows] = neighbour_mix(q[rows], above, allowed[rows], self.new_weight)
        tokens = ctx.rule.draw(q, positions)
        changed = (q != window.q).any(-1)  # a row with a new q gets a draft drawn from it
        return DraftWindow(torch.where(changed, tokens, window.tokens), q)


VARIANTS = {
    "budget drafter": dict(),
    "front 1, w = 0.15": dict(front=1, front_weight=0.15),
    "front 1, w = 0.3": dict(front=1, front_weight=0.3),
    "front 2, w = 0.3": dict(front=2, front_weight=0.3),
    "new positions, w = 0.3": dict(new_weight=0.3),
    "new positions, w = 0.6": dict(new_weight=0.6),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=arguments.whole(1, 24), default=12,
                        help="first N of the 24 held-out quality prompts")
    parser.add_argument("--seeds", type=arguments.seed, nargs="+", default=[0, 1])
    parser.add_argument("--budget", type=arguments.whole(1, MAX_NODE_BUDGET), default=128)
    parser.add_argument("--rule", default="gumbel", choices=["gumbel", "rejection"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = sp.load_model("demo")
    prompts = load_prompts()[: args.prompts]
    config = model.defaults.sampler_config(window=64, node_budget=args.budget, verify=args.rule)
    print(f"| proposal | step compression ({len(prompts)} prompts x seeds {args.seeds}, {args.rule}, "
          f"{args.budget} nodes) |\n|---|---|")
    for name, fields in VARIANTS.items():
        kind = type("Variant", (GridDrafter,), dict(fields, row_length=model.layout.row_length))
        drafters.make_drafter = lambda c, kind=kind: kind(c.use_ac, c.pass_nodes)  # the loop's strategy seam
        tokens = passes = 0
        for prompt in prompts:
            for seed in args.seeds:
                stats = sp.generate_image(model, prompt, config=config, seed=seed).stats
                tokens, passes = tokens + stats.tokens_committed, passes + stats.forward_passes
        print(f"| {name} | {tokens / passes:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
