"""Where a pass loses tokens, by drafting variant and verification rule (a counting benchmark).

    python -m sjd_pac_core.bench.drafting --prompts 4 --seeds 0 1 --window 64
    python -m sjd_pac_core.bench.drafting --prompt-set sjd_pac_core/demo/tools/quality_prompts.txt \\
        --seeds 0 1 --budgets 32 64 128 256

Runs each drafting variant under both rules on the same prompts and seeds, and reports step
compression (image tokens per forward pass: a count, valid on a loaded machine), the nodes per
pass (rows beyond the root; with CFG each node is two rows of the forward), the
acceptance-length histogram, and where each pass's first rejection fell:

* tree:      inside the Proactive Drafting levels (window positions 0..levels-1; for a node
             budget's tree, the first position, where it puts the most candidates);
* continued: on a draft carried over from the previous pass (kept by AC or redrawn from the
             stale p), i.e. a position the previous pass already verified;
* new:       on a draft for a position new to the window (from the furthest stale logits);
* side end:  no rejection, but the accepted path ended on a side leaf (its bonus token ends
             the pass; the chain hangs off the main branch only);
* none:      the whole window was accepted.

`--budgets` adds, for each budget B, today's tree (first level 8, then K = 4) with the window
that fills B (`within_budget`) and the budget drafter (`SamplerConfig(node_budget=B)`).
Everything comes from the per-pass records of `generate_image`; no timing is reported.
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from .. import arguments
from ..config import MAX_NODE_BUDGET, SamplerConfig, TreeLevels
from ..engine.stats import RunStats
from ..generate import generate_image
from .runner import load_prompts

# name -> SamplerConfig changes on top of the model's defaults (method sjd_pac, window L).
NO_SIDE = dict(tree_side_chain=0)  # the chain hangs off the main branch only
PAPER_PD = dict(tree_every_pass=False, tree_first_width=None, **NO_SIDE)  # the paper's tree: after a rejection
VARIANTS: Dict[str, dict] = {
    "sjd": dict(method="sjd"),
    "pac (tree after a rejection)": dict(PAPER_PD),
    "pac, tree every pass": dict(tree_every_pass=True, tree_first_width=None, **NO_SIDE),
    "pac, every pass, first level 8": dict(tree_every_pass=True, tree_first_width=8, **NO_SIDE),
    "pac, every pass, first level 8, D=2": dict(tree_every_pass=True, tree_depth=2, tree_first_width=8, **NO_SIDE),
    "pac, every pass, first level 16, D=2": dict(tree_every_pass=True, tree_depth=2, tree_first_width=16, **NO_SIDE),
    "pac, every pass, first level 16, K=2": dict(tree_every_pass=True, tree_width=2, tree_first_width=16, **NO_SIDE),
    "pac, every pass, D=4 K=3": dict(tree_every_pass=True, tree_depth=4, tree_width=3, tree_first_width=None, **NO_SIDE),
    "pac, every pass, first level 8, side chains 8": dict(tree_every_pass=True, tree_first_width=8, tree_side_chain=8),
    "pac, every pass, first level 8, side chains 16": dict(tree_every_pass=True, tree_first_width=8, tree_side_chain=16),
    "pac, every pass, first level 8, K=2, side chains 16": dict(tree_every_pass=True, tree_width=2, tree_first_width=8,
                                                                tree_side_chain=16),
    "pac, every pass, first level 8, chain width 2": dict(tree_every_pass=True, tree_first_width=8, tree_chain_width=2,
                                                          **NO_SIDE),
    "pac, every pass, first level 8, chain width 3": dict(tree_every_pass=True, tree_first_width=8, tree_chain_width=3,
                                                          **NO_SIDE),
    "pac, every pass, first level 8, chain width 4": dict(tree_every_pass=True, tree_first_width=8, tree_chain_width=4,
                                                          **NO_SIDE),
    "pac, every pass, first level 8, chain width 3, side chains 16": dict(
        tree_every_pass=True, tree_first_width=8, tree_chain_width=3, tree_side_chain=16),
}
WHERE = ("tree", "continued", "new", "side end", "none")
TODAY = dict(tree_every_pass=True, tree_depth=3, tree_width=4, tree_first_width=8, tree_chain_width=1, **NO_SIDE)


def within_budget(budget: int) -> dict:
    """Today's every-pass tree (first level 8, then K = 4; one level of 8 below 64 nodes) with the
    window that fills `budget` nodes: the fixed drafter's best use of the same rows."""
    tree = dict(TODAY) if budget >= 64 else dict(TODAY, tree_depth=2)
    side = TreeLevels.of(tree["tree_depth"], tree["tree_width"], tree["tree_first_width"]).side_nodes(0)
    return dict(tree, window=budget - side)


@dataclass
class Tally:
    """Counts pooled over the runs of one (variant, rule) cell."""

    tokens: int = 0
    passes: int = 0
    runs: int = 0
    nodes: int = 0  # nodes fed over the passes after the prefill
    most_nodes: int = 0  # the most nodes one pass fed
    where: Counter = field(default_factory=Counter)  # first rejection's place -> passes
    lost_at: Counter = field(default_factory=Counter)  # place -> tokens committed by those passes
    lengths: Counter = field(default_factory=Counter)  # tokens committed per pass -> passes
    side_branch: int = 0  # passes whose accepted path left the main branch of the tree

    @property
    def step_compression(self) -> float:
        return self.tokens / max(1, self.passes)

    @property
    def mean_nodes(self) -> float:
        return self.nodes / max(1, sum(self.lengths.values()))

    def add(self, stats: RunStats, tree_levels: int) -> None:
        self.runs += 1
        self.tokens += stats.tokens_committed
        self.passes += stats.forward_passes
        records = stats.records
        for prev, rec in zip(records, records[1:]):  # the prefill (records[0]) drafts nothing
            continued = max(0, prev.window - prev.committed)
            levels = min(tree_levels, rec.window) if rec.tree_nodes else 0
            where = classify(rec.first_reject, levels, continued, any(rec.branch))
            self.where[where] += 1
            self.lost_at[where] += rec.committed
            self.lengths[rec.committed] += 1
            self.side_branch += any(rec.branch)
            self.nodes += rec.window + rec.tree_nodes
            self.most_nodes = max(self.most_nodes, rec.window + rec.tree_nodes)


def classify(first_reject: int, tree_levels: int, continued: int, side_branch: bool = False) -> str:
    """Where a pass's first rejection fell (see the module docstring)."""
    if first_reject < 0:
        return "side end" if side_branch else "none"
    if first_reject < tree_levels:
        return "tree"
    return "continued" if first_reject < continued else "new"


def tree_levels(config: SamplerConfig) -> int:
    """The window positions counted as "tree" (a budget's tree: its first, widest position)."""
    if config.node_budget is not None:
        return 1
    return len(config.tree.widths) if config.use_pd else 0


def measure(model, prompts: Sequence[str], seeds: Sequence[int], configs: Dict[str, SamplerConfig]) -> Dict[str, Tally]:
    """Run every configuration on every (prompt, seed); pooled tallies by name."""
    tallies = {name: Tally() for name in configs}
    for prompt in prompts:
        for seed in seeds:
            for name, config in configs.items():
                stats = generate_image(model, prompt, config=config, seed=seed).stats
                for run in stats if isinstance(stats, list) else [stats]:
                    tallies[name].add(run, tree_levels(config))
    return tallies


def grid(defaults: SamplerConfig, window: int, variants: Sequence[str], rules: Sequence[str],
         budgets: Sequence[int] = ()) -> Dict[str, SamplerConfig]:
    configs = {f"{v} | {r}": defaults.with_(**{"method": "sjd_pac", "window": window, "verify": r, **VARIANTS[v]})
               for v in variants for r in rules}
    for budget in budgets:
        for rule in rules:
            today = within_budget(budget)
            configs[f"today's tree, L={today['window']} | {rule}"] = defaults.with_(
                method="sjd_pac", verify=rule, node_budget=None, **today)
            configs[f"node budget {budget} | {rule}"] = defaults.with_(
                method="sjd_pac", verify=rule, window=window, node_budget=budget)
    return configs


def table(tallies: Dict[str, Tally], max_length: int = 12) -> str:
    """A markdown table: step compression, nodes, where the first rejection fell, accept lengths."""
    head = ("| variant | rule | step compression | runs | nodes per pass, mean / most "
            "| first rejection: tree / continued / new / side end / none "
            f"| side branch taken | passes committing 1 / 2-4 / 5-{max_length - 1} / >={max_length} |")
    lines = [head, "|" + "---|" * 8]
    for name, t in tallies.items():
        variant, rule = name.split(" | ")
        n = max(1, sum(t.where.values()))
        where = " / ".join(f"{100 * t.where[w] / n:.0f}%" for w in WHERE)
        short = sum(c for k, c in t.lengths.items() if k == 1)
        mid = sum(c for k, c in t.lengths.items() if 2 <= k <= 4)
        long_ = sum(c for k, c in t.lengths.items() if 5 <= k < max_length)
        longest = sum(c for k, c in t.lengths.items() if k >= max_length)
        lengths = " / ".join(f"{100 * c / n:.0f}%" for c in (short, mid, long_, longest))
        lines.append(f"| {variant} | {rule} | {t.step_compression:.2f}x | {t.runs} | {t.mean_nodes:.0f} / "
                     f"{t.most_nodes} | {where} | {100 * t.side_branch / n:.0f}% | {lengths} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--prompt-set", default=None,
                        help="demo, general or a text file (default: demo for the demo model, general otherwise)")
    parser.add_argument("--prompts", type=arguments.whole(1, 100_000), default=None,
                        help="first N prompts of the set (default: all)")
    parser.add_argument("--seeds", type=arguments.seed, nargs="+", default=[0, 1])
    parser.add_argument("--window", type=arguments.whole(1, 1024), default=64,
                        help="L (for a budget: the longest main chain)")
    parser.add_argument("--variants", nargs="*", default=None, choices=list(VARIANTS),
                        help="default: all of them, or none with --budgets")
    parser.add_argument("--budgets", type=arguments.whole(1, MAX_NODE_BUDGET), nargs="*", default=[],
                        help="nodes per pass: today's tree within each budget and the budget drafter")
    parser.add_argument("--rules", nargs="+", default=["rejection", "gumbel"], choices=["rejection", "gumbel"])
    args = parser.parse_args(argv)
    from .. import load_model

    import torch

    torch.set_num_threads(1)
    model = load_model(args.model)
    variants = args.variants if args.variants is not None else ([] if args.budgets else list(VARIANTS))
    configs = grid(model.defaults.sampler_config(), args.window, variants, args.rules, args.budgets)
    prompt_set = args.prompt_set or ("demo" if args.model == "demo" else "general")
    prompts = load_prompts(prompt_set, args.prompts)
    print(f"{args.model}, L={args.window}, {len(prompts)} prompts of {prompt_set} x seeds {args.seeds}, "
          "model defaults otherwise")
    print(table(measure(model, prompts, args.seeds, configs)))


if __name__ == "__main__":
    main()
