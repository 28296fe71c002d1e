"""The first-draft mixture's weight: fixed, or chosen by the run from passes already verified."""

import torch

from sjd_pac_core.engine.mixture import FirstDraftMixture

CPU = torch.device("cpu")
ROW0, MIXTURE = torch.tensor([0.8, 0.2, 0.0]), torch.tensor([0.1, 0.2, 0.7])


def test_a_fixed_weight_is_used_as_given_and_never_scored():
    mixture = FirstDraftMixture(0.3)
    assert mixture.weight(CPU) == 0.3 and not mixture.off
    mixture.drafted(5, ROW0, MIXTURE)
    mixture.observe(5, MIXTURE)
    assert mixture.score is None
    assert FirstDraftMixture(0.0).off


def test_the_run_moves_to_the_weight_whose_q_the_next_pass_would_have_accepted_most():
    mixture = FirstDraftMixture()
    assert float(mixture.weight(CPU)) == 0.0  # the paper's draft until a redraw is scored
    mixture.drafted(7, ROW0, MIXTURE)
    mixture.observe(7, MIXTURE)  # the exact p there was the mixture: all mixture wins
    assert float(mixture.weight(CPU)) == 1.0
    for _ in range(3):  # then three passes where the p behind the rejected draft was right
        mixture.drafted(9, ROW0, MIXTURE)
        mixture.observe(9, ROW0)
    assert float(mixture.weight(CPU)) == 0.0


def test_a_pass_at_another_position_does_not_score_the_redraw():
    mixture = FirstDraftMixture()
    mixture.drafted(7, ROW0, MIXTURE)
    mixture.observe(8, MIXTURE)  # not the redrawn position (say, the drafter was bypassed)
    assert mixture.score is None and mixture.pending is None
