"""The run's neighbour laws (engine/neighbour_laws.py) on hand-made passes."""

import torch

from sjd_pac_core.engine.neighbour_laws import FLOOR, NeighbourLaws

V, ROW = 4, 3  # 4 tokens; a grid row of 3 positions
ALL = torch.ones(V, dtype=torch.bool)


def laws_after(tokens, positions, p, committed, num_committed, row_length=ROW):
    laws = NeighbourLaws(V, row_length, torch.device("cpu"))
    laws.add(torch.tensor(tokens), torch.tensor(positions), torch.tensor(p), torch.as_tensor(committed), num_committed)
    return laws


def test_the_law_behind_a_token_is_the_average_p_computed_behind_it():
    # two nodes holding token 2 computed p for positions 1 and 2 (no token above either: row 0)
    laws = laws_after([2, 2], [1, 2], [[0.5, 0.5, 0.0, 0.0], [0.0, 0.5, 0.5, 0.0]], [0, 2, 0, 0, 0, 0], 2)
    q, seen = laws.law(2, torch.tensor([0, 2, 0, 0, 0, 0]), ALL)  # token 2 to the left, nothing above
    assert bool(seen)
    expected = torch.tensor([0.25, 0.5, 0.25, 0.0]).clamp(min=FLOOR)
    assert torch.allclose(q, expected / expected.sum())


def test_with_a_token_above_the_law_is_the_normalised_geometric_mean_of_both():
    committed = [1, 3, 0, 1, 0, 0]
    # node holding token 1 computed p for position 4: left law of token 1; above position 1: token 3
    laws = laws_after([1], [4], [[0.1, 0.4, 0.4, 0.1]], committed, 4)
    # the above law of token 3 is that same p; left of position 4 is token 1 (committed[3])
    q, seen = laws.law(4, torch.tensor(committed), ALL)
    assert bool(seen) and torch.allclose(q, torch.tensor([0.1, 0.4, 0.4, 0.1]))
    left = torch.tensor([0.5, 0.5, 0.0, 0.0])
    laws.add(torch.tensor([1]), torch.tensor([1]), left.unsqueeze(0), torch.tensor(committed), 4)  # no token above
    q, _ = laws.law(4, torch.tensor(committed), ALL)
    left_law = (torch.tensor([0.1, 0.4, 0.4, 0.1]) + left) / 2
    product = (left_law.clamp(min=FLOOR) * torch.tensor([0.1, 0.4, 0.4, 0.1])).sqrt()
    assert torch.allclose(q, product / product.sum())


def test_only_final_tokens_above_and_positions_inside_the_image_count():
    committed = torch.tensor([1, 3, 0, 1, 0, 0])
    # position 5's token above is position 2, not yet final (2 committed); position 9 is past the end
    laws = laws_after([1, 1], [5, 9], [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]], committed, 2)
    assert float(laws.above_count.sum()) == 0.0
    assert torch.equal(laws.left_count, torch.tensor([0.0, 1.0, 0.0, 0.0]))  # the p for position 9 is not kept
    assert torch.allclose(laws.left_sum[1], torch.tensor([0.0, 1.0, 0.0, 0.0]))


def test_the_law_keeps_to_the_allowed_tokens_and_knows_when_it_has_seen_nothing():
    laws = laws_after([2], [1], [[0.7, 0.1, 0.1, 0.1]], [0, 2, 0], 2, row_length=0)
    allowed = torch.tensor([False, True, True, True])
    q, seen = laws.law(2, torch.tensor([0, 2, 0]), allowed)
    assert bool(seen) and q[0] == 0 and torch.allclose(q[1:], torch.full((3,), 1 / 3))
    _, seen = laws.law(1, torch.tensor([0, 2, 0]), allowed)  # token 0 to the left: never seen
    assert not bool(seen)
