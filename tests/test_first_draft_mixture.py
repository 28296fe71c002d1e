"""The first draft's blend weights: fixed, or chosen by the run from passes already verified."""

import pytest
import torch

from sjd_pac_core.models import memory
from sjd_pac_core.engine.mixture import FirstDraftMixture

CPU = torch.device("cpu")
ROW0, MIXTURE, LAW = torch.tensor([0.8, 0.2, 0.0]), torch.tensor([0.1, 0.2, 0.7]), torch.tensor([0.0, 0.9, 0.1])


def weights(mixture):
    return tuple(float(w) for w in mixture.weight(CPU))


def test_fixed_weights_are_used_as_given_and_never_scored():
    mixture = FirstDraftMixture(0.3, 0.2)
    assert weights(mixture) == pytest.approx((0.3, 0.2)) and not mixture.off
    mixture.drafted(5, ROW0, MIXTURE, LAW)
    mixture.observe(5, MIXTURE)
    assert mixture.score is None
    assert FirstDraftMixture(0.0, 0.0).off  # the paper's PAC: no redraw
    assert not FirstDraftMixture(0.0).off  # the law is still chosen by the run


def test_the_blend_is_the_law_over_the_mixture_over_row0():
    q = FirstDraftMixture(0.5, 0.5).blend(ROW0, MIXTURE, LAW)
    assert torch.allclose(q, 0.5 * (0.5 * ROW0 + 0.5 * MIXTURE) + 0.5 * LAW)


def test_the_run_moves_to_the_pair_whose_q_the_next_pass_would_have_accepted_most():
    mixture = FirstDraftMixture()
    assert weights(mixture) == (0.0, 0.0)  # the paper's draft until a redraw is scored
    mixture.drafted(7, ROW0, MIXTURE, LAW)
    mixture.observe(7, MIXTURE)  # the exact p there was the mixture: all mixture, no law
    assert weights(mixture) == (1.0, 0.0)
    for _ in range(3):  # then three passes where the law was right (with all law, w_mixture is moot)
        mixture.drafted(9, ROW0, MIXTURE, LAW)
        mixture.observe(9, LAW)
    assert weights(mixture) == (0.0, 1.0)
    for _ in range(9):  # and then the p behind the rejected draft
        mixture.drafted(11, ROW0, MIXTURE, LAW)
        mixture.observe(11, ROW0)
    assert weights(mixture) == (0.0, 0.0)


def test_a_pass_at_another_position_does_not_score_the_redraw():
    mixture = FirstDraftMixture()
    mixture.drafted(7, ROW0, MIXTURE, LAW)
    mixture.observe(8, MIXTURE)  # not the redrawn position (say, the drafter was bypassed)
    assert mixture.score is None and mixture.pending is None


def test_a_vocabulary_whose_laws_do_not_fit_leaves_the_law_out(monkeypatch):
    monkeypatch.setattr(memory, "LAW_DENSE_MAX_BYTES", (3 + 1) * 3 * 4)  # one 3-token table, not two
    monkeypatch.setattr(memory, "LAW_COMPACT_MAX_BYTES", 0)  # and no compact rows
    mixture = FirstDraftMixture()
    p = torch.tensor([[0.5, 0.5, 0.0]])
    mixture.learn(torch.tensor([1]), torch.tensor([3]), p, torch.zeros(6, dtype=torch.long), 3, row_length=2)
    assert mixture.laws is None and mixture.fixed_law == 0.0
    assert mixture.law(3, torch.zeros(6, dtype=torch.long), torch.ones(3, dtype=torch.bool), ROW0) is ROW0
    off_grid = FirstDraftMixture()  # no grid: one table, which fits
    off_grid.learn(torch.tensor([1]), torch.tensor([3]), p, torch.zeros(6, dtype=torch.long), 3, row_length=0)
    assert off_grid.laws is not None
