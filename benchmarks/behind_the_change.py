"""Proposals behind a changed token, inside exact verification (a counting experiment).

    python benchmarks/behind_the_change.py --prompts 24 --seeds 0 1 --budgets 128 256 --rule gumbel

Within a node budget, passes lose the most right behind a changed token: the first window
position's draft was drawn behind the token the last pass rejected, and after a side candidate
wins there, the next position is again behind a change. Two proposals that use p's the last
pass computed (known before the pass, so verification stays exact under both rules), against
the budget drafter (`SamplerConfig(node_budget=B)`, main chain at most L = 64):

* own rows:    `BudgetDrafter(side_rows=True)`: the nodes behind a side candidate at the first
               position draw their children from the p's the last pass computed behind a node
               holding the same token there (engine/side_rows.py), valued by their own counts;
* mixture w:   `BudgetDrafter(mixture_weight=w)`: after a rejection among several candidates,
               the first position's draft is drawn from (1 - w) x the p behind the rejected
               draft + w x the mixture of the p's behind every rejected candidate, each weighted
               by its probability under the p that rejected it (sampling/drafting.py,
               `rejected_mixture`);
* run's choice: the mixture's weight and that of the run's neighbour law
               (engine/neighbour_laws.py) chosen by the run (the default).

The other variants have no mixture and no law (w = 0). Reports step compression (image tokens per
forward pass, a count: valid on a loaded machine),
the share of passes with a side win at the first position, how many of those candidates had
children of their own, and how often the first own child won (docs/benchmark_history.md,
"Proposals behind a changed token").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import sjd_pac_core as sp  # noqa: E402
from sjd_pac_core import arguments  # noqa: E402
from sjd_pac_core.config import MAX_NODE_BUDGET  # noqa: E402
from sjd_pac_core.demo.tools.quality import load_prompts  # noqa: E402
from sjd_pac_core.engine import drafters  # noqa: E402
from sjd_pac_core.engine.budget import OWN_ROW  # noqa: E402


class CountingDrafter(drafters.BudgetDrafter):
    """The budget drafter with the variant's proposals, counting side wins at the first
    position and whether the winning candidate had children of its own."""

    side_wins = covered = 0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.owners: frozenset = frozenset()

    def next(self, ctx, report):
        branch = report.outcome.branch
        if branch and branch[0] > 0:
            CountingDrafter.side_wins += 1
            CountingDrafter.covered += (branch[0],) in self.owners
        return super().next(ctx, report)

    def budget_draft(self, ctx, window, start, carried, kept):
        draft = super().budget_draft(ctx, window, start, carried, kept)
        self.owners = frozenset(draft.tree.shape.own_rows) if draft.tree is not None else frozenset()
        return draft


VARIANTS: Dict[str, dict] = {  # BudgetDrafter's arguments
    "budget drafter": dict(mixture_weight=0.0, law_weight=0.0),
    "own rows behind side candidates": dict(side_rows=True, mixture_weight=0.0, law_weight=0.0),
    "first draft: mixture w = 0.2": dict(mixture_weight=0.2, law_weight=0.0),
    "first draft: mixture w = 1": dict(mixture_weight=1.0, law_weight=0.0),
    "first draft: the run's choice (mixture and neighbour law)": dict(),
}


def run(model, prompts, seeds, budget: int, rule: str, name: str) -> str:
    fields = VARIANTS[name]
    side_rows = fields.get("side_rows", False)
    made = []

    def make(config):
        made.append(CountingDrafter(config.use_ac, config.pass_nodes, **fields))
        return made[-1]

    drafters.make_drafter = make  # the loop's strategy seam
    CountingDrafter.side_wins = CountingDrafter.covered = 0
    config = model.defaults.sampler_config(window=64, node_budget=budget, verify=rule)
    tokens = passes = 0
    for prompt in prompts:
        for seed in seeds:
            stats = sp.generate_image(model, prompt, config=config, seed=seed).stats
            tokens, passes = tokens + stats.tokens_committed, passes + stats.forward_passes
    at_risk = sum(d.table.seen_at_risk for d in made)
    wins = sum(d.table.seen_wins for d in made)
    own = at_risk[OWN_ROW, 0]
    covered = f"{CountingDrafter.covered / max(1, CountingDrafter.side_wins):.0%}" if side_rows else "-"
    first = f"{wins[OWN_ROW, 0] / own:.0%} ({own:.0f})" if side_rows and own else "-"
    draft = wins[1, 0] / max(1.0, at_risk[1, 0])  # class 1: right behind the change
    return (f"| {budget} | {name} | {tokens / passes:.2f}x | {draft:.0%} | {CountingDrafter.side_wins / passes:.0%} | "
            f"{covered} | {first} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=arguments.whole(1, 24), default=24,
                        help="first N of the 24 held-out quality prompts")
    parser.add_argument("--seeds", type=arguments.seed, nargs="+", default=[0, 1])
    parser.add_argument("--budgets", type=arguments.whole(1, MAX_NODE_BUDGET), nargs="+", default=[128, 256])
    parser.add_argument("--rule", default="gumbel", choices=["gumbel", "rejection"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS), metavar="NAME",
                        help=f"any of: {'; '.join(VARIANTS)}")
    args = parser.parse_args()
    torch.set_num_threads(1)
    np.seterr(all="ignore")
    model = sp.load_model("demo")
    prompts = load_prompts()[: args.prompts]
    print(f"{len(prompts)} prompts x seeds {args.seeds}, {args.rule}\n")
    print("| nodes | variant | step compression | first draft behind the change won | passes with a side win at "
          "the first position | of those, the candidate had children of its own | own first child won "
          "(positions) |\n|---|---|---|---|---|---|---|")
    for budget in args.budgets:
        for name in args.variants:
            print(run(model, prompts, args.seeds, budget, args.rule, name), flush=True)


if __name__ == "__main__":
    main()
