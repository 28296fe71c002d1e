"""Own proposals behind side candidates (engine/side_rows.py, BudgetDrafter(side_rows=True)): the
pieces on hand-made values, the pass's layout of own rows, exactness with planted controls, and
seed-exactness under the gumbel rule."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import sjd_pac_core as sp
from exactness_tools import (
    MarkovChain,
    MarkovModel,
    RejectionConfig,
    SecondOrderChain,
    SecondOrderModel,
    all_pairs_pvalue,
    draw_sequences,
    markov_pair_laws,
    pair_laws_pvalue,
    planted_fault,
    seed_exact_lm,
)
from sjd_pac_core.engine import budget as bd
from sjd_pac_core.engine import drafters, side_rows
from sjd_pac_core.engine.draft import Draft, DraftWindow, TreeDraft
from sjd_pac_core.engine.loop import PassShape
from sjd_pac_core.engine.verdict import Decisions, Verdict
from sjd_pac_core.sampling.tree import TreeShape, tree_layout

P_VALUE_MIN = 1e-3
P_VALUE_PLANTED_MAX = 1e-6


# --- the pieces, on hand-made values ------------------------------------------------------------

def test_own_row_level_names_the_chain_behind_a_first_position_side_candidate():
    assert side_rows.own_row_level((2,)) == 0
    assert side_rows.own_row_level((2, 0, 0)) == 2
    for other in [(), (0,), (0, 1), (2, 1), (2, 0, 1)]:
        assert side_rows.own_row_level(other) == -1


def test_continuation_chain_follows_accepted_then_first_children():
    # root -> (0,) (1,); (0,) -> (0, 0) (0, 1); (0, 1) -> (0, 1, 0)
    layout = tree_layout(TreeShape(((0,), (1,), (0, 0), (0, 1), (0, 1, 0))))
    accepted = [0, 1, -1, -1, -1, -1]  # node 1 = (0,) accepted its slot 1 = (0, 1) = node 4
    assert side_rows.continuation_chain(layout, accepted, 1, 5) == [1, 4, 5]
    assert side_rows.continuation_chain(layout, accepted, 0, 2) == [0, 1]
    assert side_rows.continuation_chain(layout, [-1] * 6, 1, 5) == [1, 3]  # not accepted: the first child


def test_side_proposals_take_the_matching_past_node_chain_else_the_window():
    p = torch.eye(6)  # node u's p puts all mass on token u
    past = side_rows.PastNodes(tokens=torch.tensor([7, 8]), chains=torch.tensor([[1, 2, -1], [3, 4, 5]]),
                               p=p, draft_token=torch.tensor([10, 11, 12, 13, 14, 15]))
    fallback_q = torch.full((4, 6), 1 / 6)
    fallback_tokens = torch.tensor([20, 21, 22, 23])
    side_tokens = torch.tensor([5, 8, 7, 9])  # slot 1 holds 8, slot 2 holds 7, slot 3 matches nothing
    rows = [(1, 0), (1, 2), (2, 1), (2, 2), (3, 0)]
    q, first = side_rows.side_proposals(past, side_tokens, rows, fallback_q, fallback_tokens)
    # (1, 0): node 3; (1, 2): node 5; (2, 1): node 2; (2, 2): past its chain's end; (3, 0): no match
    assert first.tolist() == [13, 15, 12, 22, 20]
    assert torch.equal(q[0], p[3]) and torch.equal(q[1], p[5]) and torch.equal(q[2], p[2])
    assert torch.equal(q[3], fallback_q[2]) and torch.equal(q[4], fallback_q[0])
    q_none, first_none = side_rows.side_proposals(None, side_tokens, rows, fallback_q, fallback_tokens)
    assert first_none.tolist() == [20, 22, 21, 22, 20] and torch.equal(q_none, fallback_q[[0, 2, 1, 2, 0]])


def test_past_nodes_are_the_last_pass_nodes_at_the_position():
    layout = tree_layout(TreeShape(((0,), (1,), (0, 0), (1, 0)), own_rows=((1,),)))
    tokens = torch.tensor([4, 5, 6, 7, 8])
    past = side_rows.PastNodes.of(layout, [0, -1, -1, -1, -1], tokens, torch.zeros(5, 3),
                                  torch.zeros(5, dtype=torch.long), start=10, position=10, length=2)
    assert past.tokens.tolist() == [5, 6] and past.chains.tolist() == [[1, 3], [2, 4]]
    assert side_rows.PastNodes.of(layout, [0] * 5, tokens, torch.zeros(5, 3), tokens, 10, 13, 2) is None


def _last_pass() -> drafters.PassReport:
    """A pass that started at image position 10, as the budget drafter keeps it (`BudgetDrafter.last`):
    it fed token 3 then 1 on its main chain and token 5, 2, 6 behind a side candidate; its main
    chain's draft 1 at position 11 was rejected (position 11 got the residual draw 4), so the next
    window starts at 12. Node 5 (token 6, position 12) accepted its second child (token 9): its
    verdict's draw there, the AC draft, is 9; the token its verdict would commit if the walk
    ended there (`next_token`, a residual draw after its first child's rejection) is 4."""
    shape = TreeShape(((0,), (1,), (0, 0), (1, 0), (1, 0, 0), (1, 0, 0, 0), (1, 0, 0, 1)))
    node_tokens = torch.tensor([8, 3, 5, 1, 2, 6, 1, 9])
    accepted = [0, -1, 0, -1, 0, 1, -1, -1]
    next_token = torch.tensor([3, 4, 2, 0, 6, 4, 0, 0])
    draft_token = torch.tensor([3, 4, 2, 0, 6, 9, 0, 0])  # the accepted child's token, else next_token
    p = torch.eye(10)[:8]  # node u's p puts all mass on token u
    verdict = Verdict(accepted_child=torch.tensor(accepted), next_token=next_token, draft_token=draft_token, p=p,
                      positions=torch.tensor([10, 11, 11, 12, 12, 13, 14, 14]), non_finite_at=torch.tensor([-1]))
    window = DraftWindow(torch.tensor([3, 1, 6, 6]), torch.full((4, 10), 0.1))
    tree = TreeDraft(torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool), tree_layout(shape))
    return drafters.PassReport(start=10, num_committed=12, target=4, draft=Draft(window, tree),
                               node_tokens=node_tokens,
                               children=None, outcome=None, decisions=Decisions(accepted_child=accepted),
                               verdict=verdict, proposal_logits=None, stale=None)


def test_an_own_rows_first_draft_is_the_last_pass_ac_draft():
    """Behind side candidate 6 at position 12, the own row's q is the p of the last pass's node
    that held 6 there, and its first draft that node's AC draft (9, distributed as that p), not
    the token the pass would have committed after it (4, a draw from a residual). The planted
    fault takes the latter and must fail the same check."""
    drafter = drafters.BudgetDrafter(True, 16, side_rows=True)
    drafter.last = _last_pass()
    fallback_q, fallback_tokens = torch.full((3, 10), 0.1), torch.tensor([7, 7, 7])

    def own_row():
        return side_rows.side_proposals(drafter.past_nodes(12), torch.tensor([7, 6]), [(1, 0)], fallback_q,
                                        fallback_tokens)

    q, first = own_row()
    assert torch.equal(q[0], torch.eye(10)[5]) and first.tolist() == [9]
    with planted_fault("own_row_first_from_next_token") as calls:
        _, faulty = own_row()
    assert calls.count > 0 and faulty.tolist() == [4]


def test_tree_shape_checks_its_own_rows():
    TreeShape(((0,), (1,), (1, 0)), own_rows=((1,),)).check()
    for bad in [((0,),), ((1,), (1,)), ((),)]:  # a leaf, twice, the root
        with pytest.raises(ValueError, match="owns a proposal"):
            TreeShape(((0,), (1,), (1, 0)), own_rows=bad).check()


def test_a_pass_reads_own_row_children_from_their_rows_and_q():
    # window 3, position rows 1 (width 2), own rows for (1,) and (1, 0)
    shape = TreeShape(((0,), (1,), (0, 0), (1, 0), (1, 1), (0, 0, 0), (1, 0, 0)), own_rows=((1,), (1, 0)))
    shape.check()
    layout = tree_layout(shape)
    plan = PassShape.build(layout, levels=1, width=2, window=3, envelope=10, device=torch.device("cpu"))
    # flat source: root 0, position row 1-2, own row 0 at 3-4, own row 1 at 5-6, window 7-9, pad 10
    assert plan.token_source.tolist() == [0, 1, 2, 8, 3, 4, 9, 5] + [10, 10]
    q_rows = plan.q_rows.tolist()
    assert q_rows[0] == 0 and q_rows[1] == 1 and q_rows[3] == 2  # root, (0,), (0, 0): their depths
    assert q_rows[2] == 3 and q_rows[4] == 4  # (1,) and (1, 0): own rows after the window's 3


def test_budget_tree_splits_position_rows_from_own_rows():
    paths = [(0,), (1,), (2,), (0, 0), (1, 0), (1, 1), (2, 0), (0, 0, 0), (1, 0, 0)]
    tree = bd.BudgetTree.of(paths, [0.0] * 9, own_rows=True)
    assert tree.window == 3 and tree.widths == (3, 1, 1)
    assert tree.own_rows == ((1,), (2,), (1, 0)) and tree.own_widths == (2, 1, 1)  # parents as they appear
    plain = bd.BudgetTree.of(paths, tree.expected, own_rows=False)
    assert plain.widths == (3, 2, 1) and plain.own_rows == ()
    assert tree.first(4) == bd.BudgetTree.of(paths[:4], [0.0] * 4, own_rows=True)


def test_greedy_tree_values_own_rows_by_their_own_class():
    win = bd.AcceptanceTable().win_probabilities()
    win[:] = 0.0
    win[:, 0] = 0.5
    win[1, 1] = 0.4  # a side candidate at the first position wins often
    win[bd.OWN_ROW, 0] = 0.9  # and its own child too
    tree = bd.greedy_tree(win, bd.position_classes(6, 6, False), 12, 8, own_rows=True)
    assert (1, 0) in tree.paths and (1,) in tree.own_rows
    win[bd.OWN_ROW, 0] = 0.0
    assert (1, 0) not in bd.greedy_tree(win, bd.position_classes(6, 6, False), 12, 8, own_rows=True).paths


# --- exactness ----------------------------------------------------------------------------------

@pytest.fixture
def side_row_drafters(monkeypatch):
    """The budget drafter with own rows behind side candidates, for every run in the test; yields
    the drafters made (their acceptance tables say how often own rows were reached)."""
    made = []

    def make(config):
        made.append(drafters.BudgetDrafter(config.use_ac, config.pass_nodes, side_rows=True))
        return made[-1]

    monkeypatch.setattr(drafters, "make_drafter", make)
    return made


def own_row_positions(made) -> float:
    """Own-row positions the accepted paths reached (counted by the drafters' tables)."""
    return float(sum(d.table.seen_at_risk[bd.OWN_ROW:, 0].sum() for d in made))


def _uniform_rows_verified_as_their_q(monkeypatch):
    """Planted: the own rows' candidates drawn uniformly (without replacement) but verified as
    draws from the rows' own q: a row whose tokens do not come from the q it is checked with."""
    original = drafters.BudgetDrafter.tree_draft
    calls = []
    generator = torch.Generator().manual_seed(11)

    def faulty(self, ctx, window, start, tree, nodes, kept):
        draft = original(self, ctx, window, start, tree, nodes, kept)
        tree = draft.tree
        if tree is None or tree.own_q is None:
            return draft
        calls.append(1)
        vocab, own = tree.own_q.shape[-1], len(tree.shape.own_rows)
        keys = torch.rand(own, vocab, generator=generator)
        uniform = keys.argsort(-1)[:, : tree.width]
        candidates = torch.cat([tree.candidates[: tree.levels], uniform.to(tree.candidates.device)])
        return dataclasses.replace(draft, tree=dataclasses.replace(tree, candidates=candidates))

    monkeypatch.setattr(drafters.BudgetDrafter, "tree_draft", faulty)
    return calls


SECOND_ORDER = dict(chain=SecondOrderChain(4, 8, (2.0, 1.0, 0.0, -1.0), seed=0, parent=0.5, grand=1.0),
                    config=RejectionConfig(window=7, node_budget=32))


def test_side_rows_match_a_second_order_chain(side_row_drafters):
    """The own rows' q come from a pass that fed the side candidate's token behind another one: a
    chain whose token follows its grandparent tells a row verified in the wrong context."""
    model = SecondOrderModel(SECOND_ORDER["chain"])
    tokens = draw_sequences(model, torch.tensor([0]), 8, SECOND_ORDER["config"], 1000)
    p_value, worst = all_pairs_pvalue(tokens, model.chain.joint(SECOND_ORDER["config"]))
    assert own_row_positions(side_row_drafters) >= 300, "own rows were rarely reached"
    assert p_value > P_VALUE_MIN, f"p = {p_value:.2e} at {worst}"


def test_planted_own_row_verified_in_the_main_context_is_caught(side_row_drafters):
    # 1000 samples: p = 7e-61 and 8e-64 at seeds 10**6+ and 2 x 10**6+
    model = SecondOrderModel(SECOND_ORDER["chain"])
    with planted_fault("branch_behind_side_main_context") as calls:
        tokens = draw_sequences(model, torch.tensor([0]), 8, SECOND_ORDER["config"], 1000, seed0=10**6)
    p_value, worst = all_pairs_pvalue(tokens, model.chain.joint(SECOND_ORDER["config"]))
    assert calls.count > 0 and own_row_positions(side_row_drafters) >= 300
    assert p_value < P_VALUE_PLANTED_MAX, f"rows verified in the main context went unnoticed: p = {p_value:.2e}"


MV, MN = 6, 6
RAMP = (2.0, 1.0, 0.0, -1.0, -2.0, -3.0)


# Budget 96: own rows often reached, so a wrong first draft on one shows. An own row's first draft
# taken from the token the last pass would commit after its node (a residual draw) instead of its
# AC draft needs 2,400 sequences for power 0.99 at p < 1e-3 here (tests/planted_power.py's
# estimate from 2,000 faulty sequences at seeds 10**7+) against 9,250 at budget 48 (where 4,000
# gave p = 2e-4); at this case's 2,500 sequences and seeds, p = 6e-10 (correct: 0.10). The unit
# test test_an_own_rows_first_draft_is_the_last_pass_ac_draft sees it at once.
MARKOV_CONFIG = RejectionConfig(window=8, node_budget=96, cfg_scale=2.0)
MARKOV_SAMPLES = 2500


def _markov_check(samples: int, seed0: int = 0):
    chains = {(0,): MarkovChain.shifted(MV, MN, RAMP, seed=0), (1,): MarkovChain.shifted(MV, MN, RAMP, seed=1)}
    p0, trans = chains[(0,)].processed(MARKOV_CONFIG, uncond=chains[(1,)])
    tokens = draw_sequences(MarkovModel(chains), torch.tensor([0]), MN, MARKOV_CONFIG, samples,
                            uncond=torch.tensor([1]), seed0=seed0)
    return pair_laws_pvalue(tokens, markov_pair_laws(p0, trans))


def test_side_rows_match_the_exact_markov_marginals_with_cfg(side_row_drafters):
    p_value, worst = _markov_check(MARKOV_SAMPLES)
    assert own_row_positions(side_row_drafters) >= 300, "own rows were rarely reached"
    assert p_value > P_VALUE_MIN, f"p = {p_value:.2e} at {worst}"


def test_planted_own_row_not_drawn_from_its_q_is_caught(side_row_drafters, monkeypatch):
    # 600 samples: p = 2e-57 at seeds 10**6+ (at budget 48, 1500 samples gave 2e-128 and 1e-180 at
    # seeds 10**6+ and 2 x 10**6+)
    calls = _uniform_rows_verified_as_their_q(monkeypatch)
    p_value, worst = _markov_check(600, seed0=10**6)
    assert calls
    assert p_value < P_VALUE_PLANTED_MAX, f"a row not drawn from its q went unnoticed: p = {p_value:.2e} at {worst}"


@pytest.mark.parametrize("seed", [0, 1])
def test_side_rows_give_the_ar_tokens_under_gumbel(side_row_drafters, seed):
    lm = seed_exact_lm()
    prompt, uncond = torch.tensor([5, 9, 13, 21, 3]), torch.tensor([5, 3])
    common = dict(verify="gumbel", cfg_scale=3.0, top_k=40)
    ar = sp.sample_tokens(lm, prompt, 160, config=sp.SamplerConfig(method="ar", **common), seed=seed,
                          uncond_prompt_ids=uncond)
    for budget in (16, 96):
        out = sp.sample_tokens(lm, prompt, 160, config=sp.SamplerConfig(node_budget=budget, **common), seed=seed,
                               uncond_prompt_ids=uncond)
        assert torch.equal(out.tokens, ar.tokens), budget
        assert all(r.host_syncs == 1 for r in out.stats.records)
    assert own_row_positions(side_row_drafters) > 0, "no own row was ever reached"


def test_the_behind_the_change_benchmark_runs_on_the_demo(monkeypatch, capsys):
    """benchmarks/behind_the_change.py end to end on one prompt at a small budget: every variant
    gives a row of counts."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "behind_the_change.py"
    spec = importlib.util.spec_from_file_location("behind_the_change", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(drafters, "make_drafter", drafters.make_drafter)  # the script replaces it
    monkeypatch.setattr("sys.argv", ["behind_the_change.py", "--prompts", "1", "--seeds", "0", "--budgets", "16"])
    threads, numpy_errors = torch.get_num_threads(), np.geterr()
    try:
        bench.main()
    finally:  # the script sets both for the process
        torch.set_num_threads(threads)
        np.seterr(**numpy_errors)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 16 |")]
    assert [row.split(" | ")[1] for row in rows] == list(bench.VARIANTS)
    assert all(float(row.split(" | ")[2].rstrip("x")) > 1.0 for row in rows)
