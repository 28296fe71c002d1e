"""The demo model's strict quality check (sjd_pac_core/demo/tools/quality.py): it passes ground truth,
fails wrong images, and the shipped model's measured pass rates are a regression floor."""

from functools import lru_cache

import numpy as np
import pytest

from sjd_pac_core.demo import captions as C
from sjd_pac_core.demo.tools import data as D
from sjd_pac_core.demo.tools import quality as Q


# Seed-0 floors of the shipped model at its defaults, one or two images under what was measured
# with the weights of 2026-12-03 (Llama + row tokens + layout loss, strong texture, 5,400 LM
# steps): background 24, object colour 24, shape 18, position 24, size 20, all 17 of 24.
SHIPPED_FLOORS = {"background": 23 / 24, "object_colour": 23 / 24, "shape": 16 / 24, "position": 22 / 24,
                  "size": 18 / 24, "all": 15 / 24}


@lru_cache(maxsize=None)
def _samples(split: str, n: int = 120):
    return [D.make_sample(0, i, split) for i in range(n)]


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_checker_passes_ground_truth(split):
    """On 120 generator images per split (data seed 0; the bounds were fitted on seed 1) every
    criterion holds for nearly all (data v2, measured on 200 per split with `--calibrate`: every
    criterion and all together 100 %)."""
    r = Q.pass_rates([Q.check_image(s.caption, s.image) for s in _samples(split)])
    assert r.n == 120
    assert r.background >= 0.99 and r.object_colour >= 0.99, r
    assert r.shape >= 0.95 and r.position >= 0.95 and r.size >= 0.95, r
    assert r.all >= 0.93, r


@pytest.mark.parametrize("kind", Q.WRONG_KINDS)
def test_checker_fails_wrong_images(kind):
    """Images that break the caption in one way fail the criterion they break (data v2, measured
    on 200 each: 100 % for every kind; 60 here) and almost never pass as a whole."""
    checks = [Q.check_image(*Q.wrong_image(kind, 0, i)) for i in range(60)]
    criterion = Q.WRONG_KIND_CRITERION[kind]
    caught = sum(not getattr(c, criterion) for c in checks) / len(checks)
    assert caught >= 0.95, (kind, caught)
    assert Q.pass_rates(checks).all <= 0.04, kind


def _caption(objs, bg):
    specs = [C.ObjectSpec(o["shape"], o["color"], o["size"], o["position"], (0.0, 0.0), 0.0) for o in objs]
    return C.make_caption(specs, bg)


def test_checker_rejects_wrong_captions():
    """The same ground-truth images against wrong captions: another background colour or
    another first-object colour (absent from the image) fails; texture specks of the absent
    colour can form a region only rarely."""
    n = bg_pass = obj_pass = 0
    for i, s in enumerate(_samples("train")[:100]):
        objs, bg = C.parse_caption(s.caption)
        used = {o["color"] for o in objs} | {bg}
        alt_bg = [c for c in C.COLOR_NAMES if c != bg and all(C.color_distance(o["color"], c) >= C.MIN_CONTRAST for o in objs)]
        bg_pass += Q.check_image(_caption(objs, alt_bg[i % len(alt_bg)]), s.image).background
        alt = [c for c in C.COLOR_NAMES if c not in used and C.color_distance(c, bg) >= C.MIN_CONTRAST]
        wrong = [dict(o) for o in objs]
        wrong[0]["color"] = alt[i % len(alt)]
        obj_pass += Q.check_image(_caption(wrong, bg), s.image).all
        n += 1
    assert bg_pass == 0, bg_pass
    assert obj_pass / n <= 0.05, obj_pass


def test_shape_templates_recognise_every_shape():
    """A clean template of each shape, at each size, is recognised as itself."""
    for shape in C.SHAPES:
        for r in (7.0, 10.0, 13.5):
            region = D.shape_mask(shape, 30.3, 33.1, r) >= 0.5
            scores = Q.shape_scores(region)
            assert max(scores, key=scores.get) == shape, (shape, r, scores)


def test_quality_prompts_are_held_out():
    prompts = Q.load_prompts()
    assert len(prompts) == 24
    for p in prompts:
        objs, bg = C.parse_caption(p)
        assert any((o["color"], o["shape"]) in D.HELD_OUT_PAIRS for o in objs), p
        assert all(C.color_distance(o["color"], bg) >= C.MIN_CONTRAST for o in objs), p


def test_trained_pair_prompts_mirror_the_held_out_ones():
    """The README's control set: each held-out prompt with only its held-out colours changed."""
    held_out = Q.load_prompts()
    trained = Q.load_prompts(Q.PROMPTS_FILE.with_name("quality_prompts_trained_pairs.txt"))
    assert len(trained) == len(held_out)
    for h, t in zip(held_out, trained):
        (h_objs, h_bg), (t_objs, t_bg) = C.parse_caption(h), C.parse_caption(t)
        assert t_bg == h_bg and len(t_objs) == len(h_objs), (h, t)
        for ho, to in zip(h_objs, t_objs):
            assert (to["color"], to["shape"]) not in D.HELD_OUT_PAIRS, t
            assert {k: v for k, v in to.items() if k != "color"} == {k: v for k, v in ho.items() if k != "color"}
            assert to["color"] == ho["color"] or (ho["color"], ho["shape"]) in D.HELD_OUT_PAIRS, (h, t)
            assert C.color_distance(to["color"], t_bg) >= C.MIN_CONTRAST, t


def test_check_image_shapes_and_types():
    s = D.make_sample(0, 1)
    from PIL import Image

    a = Q.check_image(s.caption, s.image)
    b = Q.check_image(s.caption, Image.fromarray(s.image))
    assert a == b and all(isinstance(getattr(a, name), bool) for name in Q.CRITERIA)
    assert Q.color_labels(s.image).shape == (64, 64)
    with pytest.raises(ValueError):
        Q.check_image("a dog", s.image)
    blank = np.zeros((64, 64, 3), np.uint8)
    r = Q.check_image("a red circle top left on a black background", blank)
    assert r.background and not r.object_colour and not r.position and not r.all
    assert r.failed() == ["object_colour", "shape", "position", "size"]


def test_calibrate_cli_checks_the_texture_the_model_learned(capsys):
    """--calibrate judges the check on the shipped model's own (strong) backgrounds by default."""
    from sjd_pac_core.demo import WEIGHTS_DIR

    assert Q.trained_texture(WEIGHTS_DIR) == "strong"
    Q.main(["--calibrate", "--n", "3"])
    assert capsys.readouterr().out.startswith("calibration (strong texture):")
    Q.main(["--calibrate", "--n", "3", "--texture", "fine"])
    assert capsys.readouterr().out.startswith("calibration (fine texture):")


@pytest.mark.slow
def test_shipped_model_quality_floor(demo_model):
    """Shipped demo model, its defaults, SJD-PAC with verify="gumbel" and seed 0, so the images
    are deterministic: the floors sit one or two images under what was measured on seed 0
    (README, "Demo model", has seeds 0-3). Re-measure if the weights or the defaults change."""
    m = demo_model
    config = m.defaults.sampler_config(method="sjd_pac", verify="gumbel")
    rates, rows = Q.evaluate_model(m, Q.load_prompts(), seeds=(0,), config=config)
    assert rates.n == 24
    for name, floor in SHIPPED_FLOORS.items():
        assert getattr(rates, name) >= floor, (name, rates)


def test_captioned_grid_frames_pass_and_fail():
    """The docs grid: one cell per image, a green frame where every check passes, red otherwise."""
    from PIL import Image

    s = D.make_sample(0, 0)
    good = Q.check_image(s.caption, s.image)
    assert good.all, good
    bad = Q.check_image("a red circle top left on a black background", np.zeros((64, 64, 3), np.uint8))
    rows = [(s.caption, 0, good, Image.fromarray(s.image)), ("a red circle top left on a black background", 0, bad,
            Image.fromarray(np.zeros((64, 64, 3), np.uint8)))]
    grid = np.asarray(Q.captioned_grid(rows, cols=2, scale=2))
    assert grid.shape[1] == 2 * (128 + 12) and grid.shape[0] > 128
    assert good.all and not bad.all
    assert tuple(grid[4, 4]) == (40, 160, 60) and tuple(grid[4, 140 + 4]) == (200, 40, 40)
    assert (grid[6:134, 6:134] == np.asarray(Image.fromarray(s.image).resize((128, 128), Image.NEAREST))).all()


def test_grid_path_keeps_one_file_per_setting():
    """`--grid` with several CFG/temperature settings writes one grid per setting (it used to keep
    only the last); with one setting the path is used as given."""
    assert Q.grid_path("docs/g.png", 2.0, 0.8, several=False).as_posix() == "docs/g.png"
    paths = {Q.grid_path("docs/g.png", c, t, several=True).as_posix() for c in (1.5, 2.0) for t in (0.8, 1.0)}
    assert paths == {"docs/g_cfg1.5_t0.8.png", "docs/g_cfg1.5_t1.png", "docs/g_cfg2_t0.8.png", "docs/g_cfg2_t1.png"}
