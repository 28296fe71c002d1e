"""Forward passes per sequence on the exactness tests' Markov chains (a counting benchmark).

    python benchmarks/markov_passes.py                 # V = 6: 3 chains x 4000; V = 16: 2 chains x 3000
    python benchmarks/markov_passes.py --quick         # 400 sequences per chain

The chains of docs/benchmark.md, "Against the authors' sampler, on a Markov chain, within a
budget": `MarkovChain.shifted` with the exactness tests' profile, N = 10 tokens, the recipe's
defaults (no CFG, temperature 1); passes per sequence include the prefill (plain AR = 10). Rows: our sampler at the configuration of that
section (L = 16, D = 3, K = 3, first level 8) and the budget drafter at 16 nodes per pass (the
authors' sampler feeds 16 window nodes) and at 40. Each row also reports the Bonferroni p-value
of its adjacent pairs against the exact marginals (`pair_laws_pvalue`; exact: >= 0.01).
The authors' own numbers (5.23 passes at V = 6, 7.34 at V = 16; biased) come from a local
re-implementation of their sampler that is not in this repository.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the exactness tests' tools build the chains

import sjd_pac_core as sp  # noqa: E402
from exactness_tools import MarkovChain, MarkovModel, markov_pair_laws, pair_laws_pvalue  # noqa: E402

N = 10
PROFILE = (2.0, 1.0, 0.0, -1.0, -2.0, -3.0)  # tests/test_exactness.py's PD_RAMP
SETTINGS = {6: (3, 4000), 16: (2, 3000)}  # vocabulary -> (chains, sequences per chain)
ROWS = {
    "ours, L=16, D=3, K=3, first level 8": dict(window=16, tree_depth=3, tree_width=3, tree_first_width=8),
    "ours, node budget 16": dict(window=16, node_budget=16),
    "ours, node budget 40": dict(window=16, node_budget=40),
}


def run(vocab: int, chains: int, sequences: int, fields: dict, rule: str):
    passes, worst = 0, 1.0
    for c in range(chains):
        chain = MarkovChain.shifted(vocab, N, PROFILE, seed=c)
        config = sp.SamplerConfig(verify=rule, **fields)
        model = MarkovModel({(0,): chain})
        tokens = torch.empty(sequences, N, dtype=torch.long)
        for s in range(sequences):
            out = sp.sample_tokens(model, torch.tensor([0]), N, config=config, seed=s)
            tokens[s] = out.tokens
            passes += out.stats.forward_passes
        p0, trans = chain.processed(config)
        worst = min(worst, pair_laws_pvalue(tokens, markov_pair_laws(p0, trans))[0])
    return passes / (chains * sequences), worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="400 sequences per chain")
    parser.add_argument("--rules", nargs="+", default=["rejection", "gumbel"], choices=["rejection", "gumbel"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| sampler | rule | passes, V = 6 | p (pairs), V = 6 | passes, V = 16 | p (pairs), V = 16 |")
    print("|---|---|---|---|---|---|")
    for name, fields in ROWS.items():
        for rule in args.rules:
            cells = []
            for vocab, (chains, sequences) in SETTINGS.items():
                mean, p_value = run(vocab, chains, 400 if args.quick else sequences, fields, rule)
                cells += [f"{mean:.2f}", f"{p_value:.2g}"]
            print(f"| {name} | {rule} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
