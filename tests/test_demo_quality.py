"""The demo model's quality check (sjd_pac_core/demo/quality.py): calibrated on ground truth, and
the shipped model's measured pass rates on the held-out prompts as a regression floor."""

from functools import lru_cache

import numpy as np
import pytest

from sjd_pac_core.demo import data as D
from sjd_pac_core.demo import quality as Q


@lru_cache(maxsize=None)
def _samples(split: str, n: int = 200):
    return [D.make_sample(0, i, split) for i in range(n)]


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_checker_passes_ground_truth(split):
    """On 200 generator images per split the checker passes everything (measured: 100 % on all
    three criteria in both splits, data seed 0); the floors leave room for texture outliers."""
    r = Q.pass_rates([Q.check_image(s.caption, s.image) for s in _samples(split)])
    assert r.n == 200 and r.n_position > 50
    assert r.background >= 0.98, r
    assert r.objects >= 0.95, r
    assert r.position >= 0.90, r


def _caption(objs, bg):
    specs = [D.ObjectSpec(o["shape"], o["color"], o["size"], o["position"], (0.0, 0.0), 0.0) for o in objs]
    return D.make_caption(specs, bg)


_OPPOSITE = {
    "top left": "bottom right", "top": "bottom", "top right": "bottom left", "left": "right",
    "in the center": "top left", "right": "left", "bottom left": "top right", "bottom": "top",
    "bottom right": "top left",
}


def test_checker_rejects_wrong_captions():
    """The same ground-truth images against wrong captions: another background colour always
    fails, the opposite position always fails; a first object's colour swapped for one absent
    from the image passes only on texture/outline specks (measured 5 % of 200, all "small")."""
    n = n_pos = bg_pass = obj_pass = pos_pass = 0
    for i, s in enumerate(_samples("train")):
        objs, bg = D.parse_caption(s.caption)
        used = {o["color"] for o in objs} | {bg}
        alt_bg = [c for c in D.COLOR_NAMES if c != bg and all(D.color_distance(o["color"], c) >= D.MIN_CONTRAST for o in objs)]
        bg_pass += Q.check_image(_caption(objs, alt_bg[i % len(alt_bg)]), s.image).background
        alt = [c for c in D.COLOR_NAMES if c not in used and D.color_distance(c, bg) >= D.MIN_CONTRAST]
        wrong = [dict(o) for o in objs]
        wrong[0]["color"] = alt[i % len(alt)]
        obj_pass += Q.check_image(_caption(wrong, bg), s.image).objects
        if len(objs) == 1:
            moved = [dict(objs[0], position=_OPPOSITE[objs[0]["position"]])]
            pos_pass += bool(Q.check_image(_caption(moved, bg), s.image).position)
            n_pos += 1
        n += 1
    assert bg_pass / n <= 0.02, bg_pass
    assert obj_pass / n <= 0.10, obj_pass
    assert pos_pass / n_pos <= 0.02, pos_pass


def test_quality_prompts_are_held_out():
    prompts = Q.load_prompts()
    assert len(prompts) == 24
    for p in prompts:
        objs, bg = D.parse_caption(p)
        assert any((o["color"], o["shape"]) in D.HELD_OUT_PAIRS for o in objs), p
        assert all(D.color_distance(o["color"], bg) >= D.MIN_CONTRAST for o in objs), p


def test_check_image_shapes_and_types():
    s = D.make_sample(0, 1)
    from PIL import Image

    a = Q.check_image(s.caption, s.image)
    b = Q.check_image(s.caption, Image.fromarray(s.image))
    assert a == b and isinstance(a.background, bool) and isinstance(a.objects, bool)
    assert Q.color_labels(s.image).shape == (64, 64)
    with pytest.raises(ValueError):
        Q.check_image("a dog", s.image)
    blank = np.zeros((64, 64, 3), np.uint8)
    r = Q.check_image("a red circle top left on a black background", blank)
    assert r.background and not r.objects and r.position is False and not r.all


@pytest.mark.slow
def test_shipped_model_quality_floor(demo_model):
    """Shipped demo model, its defaults (cfg_scale 2.0, temperature 0.8, top_k None, window 32),
    SJD-PAC with verify="gumbel" and seed 0, so the images are deterministic.

    Measured on the 24 held-out quality prompts, seed 0 (2026-11-30): background 23/24, object
    colour 23/24, position 4/20. Seeds 0-3 (96 images): background 96 %, object colour 96 %
    (the defaults were chosen on seeds 0-1 and confirmed on seeds 2-3; README, "Demo model").
    The issue's target, >= 90 % on background and object colour at the default CFG, is what
    the floors assert (one prompt of slack: 22/24 = 92 %). Position is not a target and stays
    weak (the model paints the right colours as blobs, often not where the caption says), so
    it is only kept from regressing below chance.

    The images are deterministic; re-measure if the weights or the defaults change.
    """
    m = demo_model
    config = m.defaults.sampler_config(method="sjd_pac", verify="gumbel")
    rates, rows = Q.evaluate_model(m, Q.load_prompts(), seeds=(0,), config=config)
    assert rates.n == 24
    assert rates.background >= 22 / 24, rates
    assert rates.objects >= 22 / 24, rates
    assert rates.background >= 0.9 and rates.objects >= 0.9  # the target
    assert rates.position >= 2 / 20, rates


def test_captioned_grid_frames_pass_and_fail():
    """The docs grid: one cell per image, a green frame where every check passes, red otherwise."""
    from PIL import Image

    s = D.make_sample(0, 0)
    good = Q.check_image(s.caption, s.image)
    bad = Q.check_image("a red circle top left on a black background", np.zeros((64, 64, 3), np.uint8))
    rows = [(s.caption, 0, good, Image.fromarray(s.image)), ("a red circle top left on a black background", 0, bad,
            Image.fromarray(np.zeros((64, 64, 3), np.uint8)))]
    grid = np.asarray(Q.captioned_grid(rows, cols=2, scale=2))
    assert grid.shape[1] == 2 * (128 + 12) and grid.shape[0] > 128
    assert good.all and not bad.all
    assert tuple(grid[4, 4]) == (40, 160, 60) and tuple(grid[4, 140 + 4]) == (200, 40, 40)
    assert (grid[6:134, 6:134] == np.asarray(Image.fromarray(s.image).resize((128, 128), Image.NEAREST))).all()
