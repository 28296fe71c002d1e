"""How many samples each planted control needs: the power of the exactness tests' chi-square.

Not a test (pytest does not collect it): the tool that set the sample counts of the planted
controls in test_exactness.py. For each control it draws a pilot run of the faulty sampler
(seeds 10**7 on, apart from every test's seeds), estimates the faulty law of every table the
test compares (pair tables, or the whole joint), and from the noncentral chi-square computes
the samples at which the fault fails the test at p < 1e-6 with power 0.999 (a control), and at
p < 1e-3 with power 0.99 (the case's own check); then the power at the counts the tests use.

    PYTHONPATH=$PWD python tests/planted_power.py                     # every control and guard
    PYTHONPATH=$PWD python tests/planted_power.py defaults_top_k_3    # one Markov case's faults
    PYTHONPATH=$PWD python tests/planted_power.py one_level_of_6 --fault all_slots_valid  # any fault on a case

A few minutes for all on one core (the pilots are the cost).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import exactness_tools as tools  # noqa: E402
import test_exactness as ex  # noqa: E402
from sjd_pac_core.sampling import rules  # noqa: E402

PILOT_SEED = 10**7


def _line(name: str, power_at, used: int, case_samples: int = 0) -> str:
    control = tools.samples_for_power(lambda n: power_at(n, 1e-6))
    check = tools.samples_for_power(lambda n: power_at(n, 1e-3), target=0.99)
    power, median = power_at(used, 1e-6)[:2]
    text = (f"{name}: needs {control} (p < 1e-6, power 0.999) / {check} (p < 1e-3, power 0.99); "
            f"control uses {used}: power {power:.4f}, median p {median:.1e}")
    if case_samples:
        text += f"; the case's check uses {case_samples}: power {power_at(case_samples, 1e-3)[0]:.4f} at p < 1e-3"
    return text


def markov_control(name: str, fault: str, pilot: int) -> str:
    case = ex.MARKOV_CASES[name]
    chain = ex.MARKOV_MODELS[case.model]()
    laws = chain.pair_laws(case.config)
    with ex.neighbour_law(case.law), tools.planted_fault(fault):
        tokens = tools.draw_sequences(chain.model(), ex.CHAIN_PROMPT, chain.num_tokens, case.config, pilot,
                                      seed0=PILOT_SEED)
    p_value, worst = tools.pair_laws_pvalue(tokens, laws)
    used = dict(case.controls).get(fault, 0)
    return (f"[pilot p {p_value:.1e} at {worst}] "
            + _line(f"{name} / {fault}", lambda n, a: tools.pair_laws_power(tokens, laws, n, a), used, case.samples))


def auto_window_control(pilot: int) -> str:
    """The changing-trees control: the auto window's choices drawn at random."""
    import pytest

    fault, used = ex.AUTO_TREE_CONTROL
    chain = ex.MARKOV_MODELS["ramp"]()
    laws = chain.pair_laws(ex.AUTO_TREE_CONFIG)
    with pytest.MonkeyPatch.context() as patch, tools.planted_fault(fault):
        ex.random_auto_choices(patch, seed=1)
        tokens = tools.draw_sequences(chain.model(), ex.CHAIN_PROMPT, chain.num_tokens, ex.AUTO_TREE_CONFIG, pilot,
                                      seed0=PILOT_SEED)
    return _line(f"auto window, changing trees / {fault}",
                 lambda n, a: tools.pair_laws_power(tokens, laws, n, a), used, ex.AUTO_TREE_SAMPLES)


def joint_power(counts, joint, pilot: int):
    keys = sorted(joint)
    exact = torch.tensor([joint[k] for k in keys], dtype=torch.float64)
    faulty = torch.tensor([counts.get(k, 0) for k in keys], dtype=torch.float64) / pilot
    return lambda n, a: tools.chi_square_power(faulty, exact, n, a, pilot=pilot)


def v3_control(name: str, pilot: int) -> str:
    attribute, faulty, config, used = ex.V3_CONTROLS[name]
    tiny = tools.tiny_joint()
    joint = tools.exact_joint([tiny.cond] + ([tiny.uncond] if config.uses_cfg else []), tools.V, tools.N, config)
    original = getattr(rules, attribute)
    setattr(rules, attribute, faulty)
    try:
        counts = tools.draw_samples(tiny.table, tools.PROMPT, tools.N, config, pilot, uncond=tools.UNCOND,
                                    seed0=PILOT_SEED)
    finally:
        setattr(rules, attribute, original)
    return _line(name, joint_power(counts, joint, pilot), used)


def real_model_control(pilot: int) -> str:
    fault, used = ex.REAL_MODEL_CONTROL
    model = tools.tiny_causal_lm(tools.V, attention_scale=ex.REAL_MODEL_ATTENTION_SCALE)
    n = ex.REAL_MODEL_TOKENS
    cond = tools.conditional_logits(model, tools.PROMPT, tools.V, n)
    uncond = tools.conditional_logits(model, tools.UNCOND, tools.V, n)
    joint = tools.exact_joint([cond, uncond], tools.V, n, ex.REAL_MODEL_CONFIG)
    with tools.planted_fault(fault):
        counts = tools.draw_samples(model, tools.PROMPT, n, ex.REAL_MODEL_CONFIG, pilot, uncond=tools.UNCOND,
                                    seed0=PILOT_SEED)
    return _line(f"real model / {fault}", joint_power(counts, joint, pilot), used, ex.REAL_MODEL_SAMPLES)


def drafters_controls(pilot: int) -> list:
    """test_drafters.py's controls: a greedy first tree draft (whole joint, V = 3) and side chains
    verified in the main chain's context (every pair, second-order chain)."""
    import pytest
    import test_drafters as dr

    lines = []
    tiny = tools.tiny_joint()
    config = dr.GREEDY_CONFIG
    joint = tools.exact_joint([tiny.cond], tools.V, tools.N, config)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dr.drafters, "make_drafter", dr.greedy_first_drafter)
        counts = tools.draw_samples(tiny.table, tools.PROMPT, tools.N, config, pilot, uncond=tools.UNCOND,
                                    seed0=PILOT_SEED)
    lines.append(_line("drafters: greedy first tree draft", joint_power(counts, joint, pilot), dr.GREEDY_SAMPLES))
    chain = dr.side_chain_model().chain
    laws = chain.pair_laws(dr.SIDE_CONFIG)
    with tools.planted_fault("side_chain_main_context"):
        tokens = tools.draw_sequences(chain.model(), ex.CHAIN_PROMPT, dr.SIDE_N, dr.SIDE_CONFIG, pilot,
                                      seed0=PILOT_SEED)
    lines.append(_line("drafters: side_chain_main_context", lambda n, a: tools.pair_laws_power(tokens, laws, n, a),
                       dr.SIDE_PLANTED_SAMPLES, dr.SIDE_SAMPLES))
    return lines


def main(argv=None) -> None:
    torch.set_num_threads(1)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", help="Markov cases (default: every control of every test)")
    parser.add_argument("--fault", action="append", help="a planted fault to try on the cases (repeatable)")
    parser.add_argument("--pilot", type=int, default=3000, help="samples of each pilot run (default 3000)")
    args = parser.parse_args(argv)
    for name in args.cases or list(ex.MARKOV_CASES):
        case = ex.MARKOV_CASES[name]
        for fault in args.fault or [f for f, _ in case.controls] + list(case.guards):
            print(markov_control(name, fault, args.pilot), flush=True)
    if args.cases:
        return
    print(auto_window_control(args.pilot), flush=True)
    for name in ex.V3_CONTROLS:
        print(v3_control(name, args.pilot), flush=True)
    print(real_model_control(args.pilot), flush=True)
    for line in drafters_controls(args.pilot):
        print(line, flush=True)


if __name__ == "__main__":
    main()
