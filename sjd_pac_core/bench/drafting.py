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

A second table says where passes stopped: the window position after the accepted drafts (0:
right behind the changed token), on the main chain or on a path that took a side candidate.
`--out` also writes every count to a JSON file.

`--budgets` adds, for each budget B, the default tree (first level 8, then K = 4) with the window
that fills B (`within_budget`) and the budget drafter (`SamplerConfig(node_budget=B)`, window
"auto" as `sjd-pac generate --node-budget B` runs it; `--budget-window 64` caps its main chain).
Everything comes from the per-pass records of `generate_image`; no timing is reported.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Union

import numpy as np

from .. import arguments
from ..config import MAX_NODE_BUDGET, SamplerConfig, TreeLevels
from ..engine import drafters
from ..engine.budget import LEAF_START, MAX_DISTANCE, NEW, AcceptanceTable
from ..engine.stats import RunStats
from ..generate import generate_image
from .runner import load_prompts

# name -> SamplerConfig changes on top of the model's defaults (method sjd_pac, window L).
NO_SIDE = dict(tree_side_chain=0)  # the chain hangs off the main branch only
PAPER_PD = dict(tree_every_pass=False, tree_first_width=None, **NO_SIDE)  # the paper's tree: after a rejection
# The SJD Lumina-mGPT 2.0 ships (methods.LUMINA2_AUTHORS_SJD): window 16 whatever --window says,
# random initial drafts; its rule is rejection (--rules rejection).
LUMINA2_AUTHORS = "sjd@16, random drafts (Lumina-mGPT 2.0's own)"
VARIANTS: Dict[str, dict] = {
    "sjd": dict(method="sjd"),
    LUMINA2_AUTHORS: dict(method="sjd", window=16, init_proposal="uniform"),
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
DEFAULT_TREE = dict(tree_every_pass=True, tree_depth=3, tree_width=4, tree_first_width=8, tree_chain_width=1, **NO_SIDE)


def within_budget(budget: int) -> dict:
    """The default every-pass tree (first level 8, then K = 4; one level of 8 below 64 nodes) with the
    window that fills `budget` nodes: the fixed drafter's best use of the same rows."""
    tree = dict(DEFAULT_TREE) if budget >= 64 else dict(DEFAULT_TREE, tree_depth=2)
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
    # (depth band of the position where the pass stopped, "main" / "side" path) -> passes
    ends: Counter = field(default_factory=Counter)
    # the budget drafter's own counts (AcceptanceTable.seen_*), summed over its runs: [class, slot]
    at_risk: Optional[np.ndarray] = None
    wins: Optional[np.ndarray] = None

    def add_table(self, table: AcceptanceTable) -> None:
        if self.at_risk is None:
            self.at_risk, self.wins = np.zeros_like(table.seen_at_risk), np.zeros_like(table.seen_wins)
        self.at_risk += table.seen_at_risk
        self.wins += table.seen_wins

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
            self.ends[(depth_band(rec.committed - 1), "side" if any(rec.branch) else "main")] += 1
            self.nodes += rec.window + rec.tree_nodes
            self.most_nodes = max(self.most_nodes, rec.window + rec.tree_nodes)


DEPTH_BANDS = ((0, 0), (1, 1), (2, 3), (4, 7), (8, 15), (16, None))


def depth_band(depth: int) -> str:
    """The band of a window position ("0", "2-3", "16+") where a pass stopped: its accepted drafts."""
    for low, high in DEPTH_BANDS:
        if high is None or depth <= high:
            return f"{low}+" if high is None else (str(low) if low == high else f"{low}-{high}")
    raise AssertionError(depth)


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


@contextlib.contextmanager
def drafters_made() -> Iterator[List[drafters.Drafter]]:
    """The drafters the sampler makes meanwhile (through its strategy seam, `make_drafter`)."""
    made: List[drafters.Drafter] = []
    original = drafters.make_drafter

    def make(config: SamplerConfig) -> drafters.Drafter:
        made.append(original(config))
        return made[-1]

    drafters.make_drafter = make
    try:
        yield made
    finally:
        drafters.make_drafter = original


def measure(model, prompts: Sequence[str], seeds: Sequence[int], configs: Dict[str, SamplerConfig]) -> Dict[str, Tally]:
    """Run every configuration on every (prompt, seed); pooled tallies by name."""
    tallies = {name: Tally() for name in configs}
    for prompt in prompts:
        for seed in seeds:
            for name, config in configs.items():
                with drafters_made() as made:
                    stats = generate_image(model, prompt, config=config, seed=seed).stats
                for run in stats if isinstance(stats, list) else [stats]:
                    tallies[name].add(run, tree_levels(config))
                for drafter in made:
                    if isinstance(drafter, drafters.BudgetDrafter):
                        tallies[name].add_table(drafter.table)
    return tallies


def grid(defaults: SamplerConfig, window: int, variants: Sequence[str], rules: Sequence[str],
         budgets: Sequence[int] = (), budget_window: Union[int, str] = "auto") -> Dict[str, SamplerConfig]:
    """The runs by name: every variant at `window` under every rule; for each budget, the default
    tree within it and the budget drafter, whose main chain `budget_window` caps ("auto": up to B,
    what a budget given without a window gets)."""
    configs = {f"{v} | {r}": defaults.with_(**{"method": "sjd_pac", "window": window, "verify": r, **VARIANTS[v]})
               for v in variants for r in rules}
    for budget in budgets:
        for rule in rules:
            fixed = within_budget(budget)
            configs[f"default tree, L={fixed['window']} | {rule}"] = defaults.with_(
                method="sjd_pac", verify=rule, node_budget=None, **fixed)
            configs[f"node budget {budget} | {rule}"] = defaults.with_(
                method="sjd_pac", verify=rule, window=budget_window, node_budget=budget)
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


def ends_table(tallies: Dict[str, Tally]) -> str:
    """Where passes stopped: the window position after the accepted drafts (0: right behind the
    changed token), split by whether the accepted path took a side candidate."""
    bands = [depth_band(low) for low, _ in DEPTH_BANDS]
    lines = ["| variant | rule | " + " | ".join(f"stop at {b}: main / side" for b in bands) + " |",
             "|" + "---|" * (2 + len(bands))]
    for name, t in tallies.items():
        variant, rule = name.split(" | ")
        n = max(1, sum(t.ends.values()))
        cells = [f"{100 * t.ends[(b, 'main')] / n:.0f}% / {100 * t.ends[(b, 'side')] / n:.0f}%" for b in bands]
        lines.append(f"| {variant} | {rule} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


CLASS_BANDS = (("1", (1,)), ("2", (2,)), ("3", (3,)), ("4-7", (4, 5, 6, 7)), ("8+", tuple(range(8, MAX_DISTANCE + 1))),
               ("after a side-leaf end", (LEAF_START,)), ("new to the window", (NEW,)))
SLOT_SHARES = (1, 4, 16)


def class_table(tallies: Dict[str, Tally]) -> str:
    """The budget drafter's measured acceptance by position class (distance from the last changed
    token; the first position after a side-leaf end; positions new to the window): the share of
    positions where the draft (slot 0) won, and where one of the first 4 / 16 candidates did,
    from the survival counts (a position whose candidates all lost tells only that more were
    needed), and how many positions were counted."""
    head = "| variant | rule | " + " | ".join(f"distance {b}" if b[0].isdigit() else b for b, _ in CLASS_BANDS) + " |"
    lines = [head, "|" + "---|" * (2 + len(CLASS_BANDS)),
             "| | | " + " | ".join("draft / 4 / 16 candidates (positions)" for _ in CLASS_BANDS) + " |"]
    for name, t in tallies.items():
        if t.at_risk is None:
            continue
        variant, rule = name.split(" | ")
        cells = []
        for _, classes in CLASS_BANDS:
            at_risk, wins = t.at_risk[list(classes)].sum(0), t.wins[list(classes)].sum(0)
            hazard = np.divide(wins, at_risk, out=np.zeros_like(wins), where=at_risk > 0)
            reached = np.cumprod(np.concatenate([[1.0], 1.0 - hazard]))  # P(slots < s all lost)
            won = [1.0 - reached[min(k, len(hazard))] for k in SLOT_SHARES]
            cells.append(" / ".join(f"{100 * w:.0f}%" for w in won) + f" ({at_risk[0]:.0f})")
        lines.append(f"| {variant} | {rule} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def as_json(tallies: Dict[str, Tally]) -> dict:
    """The tallies as plain JSON (Counter keys as text)."""
    out = {}
    for name, t in tallies.items():
        out[name] = dict(step_compression=t.step_compression, tokens=t.tokens, passes=t.passes, runs=t.runs,
                         mean_nodes=t.mean_nodes, most_nodes=t.most_nodes, where=dict(t.where),
                         lost_at=dict(t.lost_at), lengths={str(k): v for k, v in sorted(t.lengths.items())},
                         side_branch=t.side_branch, ends={f"{b} {path}": v for (b, path), v in t.ends.items()},
                         at_risk=None if t.at_risk is None else t.at_risk.tolist(),
                         wins=None if t.wins is None else t.wins.tolist())
    return out


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--prompt-set", default=None,
                        help="demo, general or a text file (default: demo for the demo model, general otherwise)")
    parser.add_argument("--prompts", type=arguments.whole(1, 100_000), default=None,
                        help="first N prompts of the set (default: all)")
    parser.add_argument("--seeds", type=arguments.seed, nargs="+", default=[0, 1])
    parser.add_argument("--window", type=arguments.whole(1, 1024), default=64, help="the variants' window L")
    parser.add_argument("--budget-window", type=arguments.window, default="auto",
                        help="the budget drafter's longest main chain: 'auto' (the default, up to B: what "
                             "--node-budget B gets without a window) or L")
    parser.add_argument("--variants", nargs="*", default=None, choices=list(VARIANTS),
                        help="default: all of them, or none with --budgets")
    parser.add_argument("--budgets", type=arguments.whole(1, MAX_NODE_BUDGET), nargs="*", default=[],
                        help="nodes per pass: the default tree within each budget and the budget drafter")
    parser.add_argument("--rules", nargs="+", default=["rejection", "gumbel"], choices=["rejection", "gumbel"])
    parser.add_argument("--out", default=None, help="also write the counts to this JSON file")
    args = parser.parse_args(argv)
    from .. import load_model

    import torch

    torch.set_num_threads(1)
    model = load_model(args.model)
    variants = args.variants if args.variants is not None else ([] if args.budgets else list(VARIANTS))
    configs = grid(model.defaults.sampler_config(), args.window, variants, args.rules, args.budgets,
                   args.budget_window)
    prompt_set = args.prompt_set or ("demo" if args.model == "demo" else "general")
    prompts = load_prompts(prompt_set, args.prompts)
    print(f"{args.model}, L={args.window} (budgets: L={args.budget_window}), {len(prompts)} prompts of {prompt_set} "
          f"x seeds {args.seeds}, model defaults otherwise")
    tallies = measure(model, prompts, args.seeds, configs)
    print(table(tallies))
    print()
    print(ends_table(tallies))
    if any(t.at_risk is not None for t in tallies.values()):
        print()
        print(class_table(tallies))
    if args.out:
        from ..files import write_atomic

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(Path(args.out), json.dumps(dict(model=args.model, window=args.window,
                                                     budget_window=args.budget_window, prompt_set=prompt_set,
                                                     prompts=len(prompts), seeds=args.seeds,
                                                     cells=as_json(tallies)), indent=1).encode())
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
