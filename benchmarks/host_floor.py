"""The floor of a budget pass's host work, next to the host work plain AR and the budget drafter
take in the same process (a timing benchmark).

    python benchmarks/host_floor.py --budget 128          # the demo model, one thread

Under the gumbel rule, every pass of the budget drafter must at least guide and temper its rows'
logits, take their softmax (the neighbour law learns the p's), find each row's Gumbel target, add
the p's to the law, read the law at the positions that get candidates and rank the candidates
there. This runs exactly those steps, with the library's own functions, at the shapes of the run
(its rows, vocabulary, candidate rows and width), warm and right after reading a buffer as large
as the model's weights (as a forward pass does, which leaves the CPU's caches cold), and prints
them beside the median host work per pass (wall time less forward time) of plain AR and of the
budget, measured in turn in the same process; and the ranked tree's choice alone, on the inputs
the run gave it. What the two leave out (the pass's layout, the walk, the first draft's mixture,
the fresh drafts, the bookkeeping) is the difference.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import sjd_pac_core as sp  # noqa: E402
from sjd_pac_core.arguments import MAX_SEEDS  # noqa: E402
from sjd_pac_core.bench.baselines import causal_lm_of  # noqa: E402
from sjd_pac_core.bench.runner import load_prompts  # noqa: E402
from sjd_pac_core.engine import drafters  # noqa: E402
from sjd_pac_core.engine.neighbour_laws import NeighbourLaws  # noqa: E402
from sjd_pac_core.files import check_file_name, write_atomic  # noqa: E402
from sjd_pac_core.sampling.constraint_table import ConstraintTable  # noqa: E402
from sjd_pac_core.sampling.recipe import SamplingRecipe, processed_logits  # noqa: E402
from sjd_pac_core.sampling.rules import make_rule  # noqa: E402

MAX_REPS = 100_000  # timed calls of each floor row (each takes about a millisecond)


@contextlib.contextmanager
def recorded_drafting() -> Iterator[Dict[str, List[tuple]]]:
    """What the budget drafter drafts from meanwhile: (rows, width) of every candidate draw, and
    the arguments of every ranked tree it chooses (its two seams; both put back after)."""
    seen: Dict[str, List[tuple]] = {"candidates": [], "trees": []}
    original_candidates, original_tree = drafters.Drafter.candidates_from_law, drafters.ranked_tree

    def candidates(ctx, laws, window, start, rows, width):
        seen["candidates"].append((rows, width))
        return original_candidates(ctx, laws, window, start, rows, width)

    def tree(*args, **kwargs):
        seen["trees"].append((args, kwargs))
        return original_tree(*args, **kwargs)

    drafters.Drafter.candidates_from_law, drafters.ranked_tree = staticmethod(candidates), tree
    try:
        yield seen
    finally:
        drafters.Drafter.candidates_from_law, drafters.ranked_tree = staticmethod(original_candidates), original_tree


def host_work(model, prompts: List[str], seeds: List[int], configs: Dict[str, object]) -> Dict[str, List[float]]:
    """Per configuration, every pass's wall time less its forward (ms), the configurations run in
    turn per (prompt, seed) after one warm-up run each."""
    for config in configs.values():
        sp.generate_image(model, prompts[0], config, seed=seeds[0])
    host: Dict[str, List[float]] = {name: [] for name in configs}
    for prompt in prompts:
        for seed in seeds:
            for name, config in configs.items():
                stats = sp.generate_image(model, prompt, config, seed=seed).stats
                host[name] += [1e3 * (r.wall_time - r.forward_time) for r in stats.records if r.envelope]
    return host


def floor_step(model, config, rows: int, candidates: int, width: int, seed: int = 0) -> Callable[[], None]:
    """One pass's unavoidable tensor work under the gumbel rule at the run's shapes, as a call."""
    encoding = model.encode_prompt("a red circle")
    constraints = ConstraintTable(encoding.constraints, torch.device("cpu"))
    vocab, num_tokens = constraints.vocab_size, constraints.num_tokens
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(2 if config.uses_cfg else 1, rows, vocab, generator=generator)
    start = num_tokens // 4
    positions = torch.arange(start, start + rows).clamp(max=num_tokens - 1)
    committed = torch.randint(0, vocab, (num_tokens,), generator=generator)
    tokens = torch.randint(0, vocab, (rows,), generator=generator)
    drafts = torch.randint(0, vocab, (candidates,), generator=generator)
    recipe = SamplingRecipe(config.cfg_scale, config.temperature, config.top_k, config.top_p)
    rule = make_rule("gumbel", seed, vocab, torch.device("cpu"), num_tokens=num_tokens, span=rows + 2)
    rule.prepare(start)
    laws = NeighbourLaws(vocab, encoding.layout.row_length, torch.device("cpu"))

    def step() -> None:
        processed = processed_logits(logits, positions, recipe, constraints)
        p = torch.softmax(processed, dim=-1)
        rule.target(p, processed, positions)
        laws.add(tokens, positions, p, committed, start)
        log_law, _ = laws.window_log_law(start, drafts, committed, candidates)
        rule.candidates_beside_of_logs(log_law, drafts, width, positions[:candidates])

    return step


def timed(step: Callable[[], None], reps: int, flush: Callable[[], object] = lambda: None) -> float:
    """The median thread time of `step` (ms) over `reps` calls, each after `flush`."""
    for _ in range(max(2, reps // 10)):
        step()
    times = []
    for _ in range(reps):
        flush()
        begin = time.thread_time()
        step()
        times.append(time.thread_time() - begin)
    return 1e3 * statistics.median(times)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--budget", type=int, default=128, help="nodes per pass (default 128)")
    parser.add_argument("--prompts", type=int, default=2, help="the first N prompts of the demo set (default 2)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--reps", type=int, default=300, help="timed calls of the floor (default 300)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--out", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if min(args.budget, args.reps, args.prompts, args.threads) < 1:
        parser.error("--budget, --reps, --prompts and --threads must be at least 1")
    if args.reps > MAX_REPS or len(args.seeds) > MAX_SEEDS:
        parser.error(f"--reps takes at most {MAX_REPS:,} and --seeds at most {MAX_SEEDS:,} seeds; 300 and 0 1 are enough")
    try:  # the budget's bounds, before the model is loaded
        sp.SamplerConfig(method="sjd_pac", node_budget=args.budget)
    except sp.ConfigError as exc:
        parser.error(str(exc))
    if args.out:
        try:
            check_file_name(args.out, "--out")
        except ValueError as exc:
            parser.error(str(exc))
    torch.set_num_threads(args.threads)
    model = sp.load_model(args.model, device="cpu")
    defaults = model.defaults.sampler_config()
    budget = defaults.with_(method="sjd_pac", verify="gumbel", window="auto", node_budget=args.budget)
    configs = {"AR": defaults.with_(method="ar", verify="gumbel"), f"B={args.budget}": budget}
    with recorded_drafting() as seen:
        host = host_work(model, load_prompts("demo", args.prompts), args.seeds, configs)
    draws, trees = seen["candidates"], seen["trees"]
    candidates = int(statistics.median(r for r, _ in draws)) if draws else 1
    width = int(statistics.median(w for _, w in draws)) if draws else 1
    rows = 1 + args.budget
    step = floor_step(model, budget, rows, candidates, width)
    lm, _ = causal_lm_of(model)
    weights = np.ones(sum(t.numel() * t.element_size() for t in lm.parameters()) // 8)
    tree_calls = iter(trees * (1 + 2 * args.reps // max(len(trees), 1)))

    def choose_tree() -> None:  # the run's own trees, one after another
        tree_args, tree_kwargs = next(tree_calls)
        drafters.ranked_tree(*tree_args, **tree_kwargs)

    figures = {
        "AR host work": statistics.median(host["AR"]),
        f"B={args.budget} host work": statistics.median(host[f"B={args.budget}"]),
        "floor, warm": timed(step, args.reps),
        "floor, after a weights-sized read": timed(step, args.reps, weights.sum),
    }
    if trees:  # the tree's choice alone, on the inputs the run gave it
        figures["the ranked tree's choice, warm"] = timed(choose_tree, args.reps)
        figures["the ranked tree's choice, after a weights-sized read"] = timed(choose_tree, args.reps, weights.sum)
    ar = figures["AR host work"]
    print(f"{args.model} on cpu, torch threads {args.threads}, gumbel; B={args.budget}: {rows} rows a pass, "
          f"{candidates} candidate rows of width {width} (the run's medians)")
    print("| per pass | ms | x AR's host work |\n|---|---|---|")
    for name, ms in figures.items():
        print(f"| {name} | {ms:.3f} | {ms / ar:.2f}x |")
    print(f"| 3 x AR's host work | {3 * ar:.3f} | 3.00x |")
    result = dict(model=args.model, budget=args.budget, rows=rows, candidate_rows=candidates, width=width,
                  threads=args.threads, ms_per_pass=figures)
    if args.out:  # readers see the old file or the whole new one
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.out, json.dumps(result, indent=1).encode())
    return result


if __name__ == "__main__":
    main()
