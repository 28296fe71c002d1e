"""The procedural demo data: deterministic, captions describe the pixels, held-out split disjoint."""

import numpy as np
import pytest

from sjd_pac_core.demo import captions as C
from sjd_pac_core.demo.tools import data as D

PALETTE = np.array([C.COLORS[c] for c in C.COLOR_NAMES], dtype=np.float64)


def nearest_color(pixels: np.ndarray) -> np.ndarray:
    """(..., 3) uint8 -> (...,) index into COLOR_NAMES."""
    d = ((pixels[..., None, :].astype(np.float64) - PALETTE) ** 2).sum(-1)
    return d.argmin(-1)


def test_deterministic():
    a = D.make_sample(3, 17)
    b = D.make_sample(3, 17)
    assert a.caption == b.caption
    assert np.array_equal(a.image, b.image)
    c = D.make_sample(3, 18)
    assert not np.array_equal(a.image, c.image)
    d = D.make_sample(4, 17)
    assert not np.array_equal(a.image, d.image)
    ims, caps = D.generate(3, seed=3, start=16)
    assert caps[1] == a.caption and np.array_equal(ims[1], a.image)
    assert ims.shape == (3, 64, 64, 3) and ims.dtype == np.uint8


def test_texture_changes_only_the_background_clouds():
    """The shipped model is trained on "strong" clouds: same captions, objects and masks as
    "fine", a background whose luminance varies more and over longer distances."""
    def background_spread(image: np.ndarray, masks) -> float:
        outside = ~np.any([m > 0.01 for m in masks], axis=0)
        return float(image.mean(-1)[outside].std())

    spreads = {t: [] for t in D.TEXTURES}
    for i in range(12):
        by_texture = {t: D.make_sample(5, i, "heldout", t) for t in D.TEXTURES}
        fine = by_texture["fine"]
        assert np.array_equal(fine.image, D.make_sample(5, i, "heldout").image)  # fine is the default
        for t, s in by_texture.items():
            assert s.caption == fine.caption and s.objects == fine.objects
            assert all(np.array_equal(a, b) for a, b in zip(s.masks, fine.masks))
            spreads[t].append(background_spread(s.image, s.masks))
    assert np.mean(spreads["fine"]) < np.mean(spreads["medium"]) < np.mean(spreads["strong"]), spreads
    with pytest.raises(ValueError, match="texture 'rough' is not one of"):
        D.make_sample(5, 0, texture="rough")


def test_captions_parse_and_use_known_words():
    words = set(C.CAPTION_WORDS)
    n_two = 0
    for i in range(60):
        s = D.make_sample(0, i)
        assert set(s.caption.split()) <= words, s.caption
        objs, bg = C.parse_caption(s.caption)
        assert bg == s.background
        assert [(o["color"], o["shape"], o["size"], o["position"]) for o in objs] == [
            (o.color, o.shape, o.size, o.position) for o in s.objects
        ]
        n_two += len(objs) == 2
    assert 10 <= n_two <= 50  # both one- and two-object images occur


def test_background_colour_matches_pixels():
    for i in range(40):
        s = D.make_sample(1, i)
        border = np.concatenate([s.image[0], s.image[-1], s.image[:, 0], s.image[:, -1]])
        votes = np.bincount(nearest_color(border), minlength=len(C.COLOR_NAMES))
        assert C.COLOR_NAMES[int(votes.argmax())] == s.background, s.caption


def test_object_colour_and_position_match_pixels():
    checked = 0
    for i in range(60):
        s = D.make_sample(2, i)
        objs, bg = C.parse_caption(s.caption)
        if len({o["color"] for o in objs}) != len(objs):
            continue  # two objects of one colour: the pixel test below cannot tell them apart
        cls = nearest_color(s.image)
        ys, xs = np.mgrid[0:64, 0:64]
        for o in objs:
            sel = cls == C.COLOR_NAMES.index(o["color"])
            # a few background pixels may drift to the object's colour class; keep the big blob
            px, py = C.POSITIONS[o["position"]]
            near = sel & (np.abs(xs + 0.5 - px) <= 14) & (np.abs(ys + 0.5 - py) <= 14)
            assert near.sum() >= 20, (s.caption, o, near.sum())
            cx, cy = xs[near].mean() + 0.5, ys[near].mean() + 0.5
            # the blob's centroid is in the named ninth of the image
            assert abs(cx - px) <= 6 and abs(cy - py) <= 6, (s.caption, o, cx, cy)
            # and the object's pixels are mostly its named colour
            inside = s.masks[[ob.position for ob in s.objects].index(o["position"])] > 0.95
            frac = (cls[inside] == C.COLOR_NAMES.index(o["color"])).mean()
            assert frac > 0.4, (s.caption, o, frac)  # outlines and shading take the rest
            checked += 1
    assert checked >= 45


def test_sizes_match_pixels():
    area = {}
    for i in range(80):
        s = D.make_sample(5, i)
        for o, m in zip(s.objects, s.masks):
            area.setdefault(o.shape, {"small": [], "medium": [], "large": []})[o.size].append(m.sum())
    for shape, a in area.items():
        assert all(a.values()), shape
        assert max(a["small"]) < min(a["medium"]) and max(a["medium"]) < min(a["large"]), shape


def test_heldout_split_disjoint():
    train_pairs, held_caps, train_caps = set(), set(), set()
    for i in range(200):
        s = D.make_sample(0, i, "train")
        train_caps.add(s.caption)
        for o in s.objects:
            train_pairs.add((o.color, o.shape))
    assert not (train_pairs & D.HELD_OUT_PAIRS)
    for i in range(60):
        s = D.make_sample(0, i, "heldout")
        held_caps.add(s.caption)
        assert any((o.color, o.shape) in D.HELD_OUT_PAIRS for o in s.objects)
    assert not (held_caps & train_caps)
    # the held-out pairs are rare combinations, not missing words: every colour and shape is trained
    assert {c for c, _ in train_pairs} == set(C.COLOR_NAMES)
    assert {s for _, s in train_pairs} == set(C.SHAPES)


def test_objects_contrast_with_background():
    for i in range(50):
        s = D.make_sample(7, i)
        for o in s.objects:
            assert C.color_distance(o.color, s.background) >= C.MIN_CONTRAST


def test_bad_split_and_caption_raise():
    with pytest.raises(ValueError):
        D.make_sample(0, 0, "test")
    with pytest.raises(ValueError):
        C.parse_caption("a purple elephant on the moon")


def test_caption_regions_cover_the_objects():
    """The loss-weight regions come from the caption alone and contain every object's pixels
    (checked on 200 training images: no object pixel with coverage > 1 % falls outside)."""
    for i in range(200):
        s = D.make_sample(0, i)
        region = D.caption_regions(s.caption)
        assert region.shape == (16, 16) and set(np.unique(region)) <= {0.0, 1.0}
        cover = np.clip(np.sum(s.masks, axis=0), 0, 1).reshape(16, 4, 16, 4).mean(axis=(1, 3))
        assert not ((cover > 0.01) & (region == 0)).any(), s.caption
        assert region.mean() < 0.7, s.caption  # a region, not the whole image (two large objects: 62 %)
    one = D.caption_regions("a small red circle top left on a blue background")
    assert one[1:6, 1:6].all() and not one[7:, :].any() and not one[:, 7:].any()


def test_two_objects_are_two_grid_places_apart_and_never_touch():
    """Data v2: two objects of one image sit at least two places apart on the 3x3 grid of
    positions (another third on one axis at least), and their shapes do not overlap."""
    n = 0
    for i in range(150):
        s = D.make_sample(4, i)
        if len(s.objects) != 2:
            continue
        (ac, ar), (bc, br) = (D.POSITION_GRID[o.position] for o in s.objects)
        assert max(abs(ac - bc), abs(ar - br)) >= D.MIN_GRID_DISTANCE, s.caption
        assert float((s.masks[0] * s.masks[1]).sum()) == 0.0, s.caption
        n += 1
    assert n >= 50


def test_objects_are_flat_and_sizes_in_their_ranges():
    """Data v2: objects are flat colour with mild shading (no outline, no stripes): inside the
    shape, pixels stay near the named colour; radii lie in data.SIZE_RADIUS for their word."""
    for i in range(40):
        s = D.make_sample(6, i)
        for o, m in zip(s.objects, s.masks):
            lo, hi = D.SIZE_RADIUS[o.size]
            assert lo <= o.radius <= hi
            inside = s.image[m > 0.99].astype(np.float64)
            dist = np.linalg.norm(inside - np.array(C.COLORS[o.color]), axis=1)
            assert np.percentile(dist, 95) < 40, (s.caption, o, np.percentile(dist, 95))
            assert (nearest_color(s.image[m > 0.99]) == C.COLOR_NAMES.index(o.color)).mean() > 0.95


def test_token_layout_marks_the_tokens_each_object_covers():
    """token_layout: 0 on background tokens, k on the tokens the caption's k-th object covers by
    majority, matching the pixel masks; a caption's first object is 1 (the slot prompt's first)."""
    for i in range(60):
        s = D.make_sample(0, i)
        layout = D.token_layout(s)
        assert layout.shape == (16, 16) and set(np.unique(layout)) <= set(range(len(s.objects) + 1))
        for k, mask in enumerate(s.masks, start=1):
            cover = mask.reshape(16, 4, 16, 4).mean(axis=(1, 3))
            assert (layout == k).sum() >= 1, s.caption
            assert (cover[layout == k] > 0.5).all()
            assert ((cover > 0.5) <= (layout > 0)).all()  # a majority-covered token is some object's
        assert not (layout > 0)[np.clip(np.sum(s.masks, axis=0), 0, 1).reshape(16, 4, 16, 4).mean(axis=(1, 3)) < 0.5].any()
    images, captions, layouts = D.generate(3, 0, layouts=True)
    assert layouts.shape == (3, 16, 16) and (layouts[1] == D.token_layout(D.make_sample(0, 1))).all()
    assert len(D.generate(3, 0)) == 2  # without layouts: (images, captions) as before


def test_layout_labels_align_with_the_image_labels():
    """The auxiliary layout targets of `demo.tools.train --layout-weight` sit exactly on the image tokens
    of `make_batch` (row ends, <eoi>, the prompt and dropped captions are ignored)."""
    import torch

    from sjd_pac_core.demo.tools import train as T
    from sjd_pac_core.demo.vocab import SLOT_WORDS, DemoVocab

    vocab = DemoVocab(words=list(C.CAPTION_WORDS) + SLOT_WORDS, codebook_size=16, grid=16, prompt_format="slots")
    layouts = np.zeros((2, 16, 16), np.int8)
    layouts[0, 3, 5] = 1
    layouts[1, 15, 15] = 2
    seq = T.layout_sequences(vocab, layouts)
    assert seq.shape == (2, vocab.num_image_tokens + 1)
    assert seq[0, 3 * vocab.row_length + 5] == 1 and seq[1, 15 * vocab.row_length + 15] == 2
    assert (seq[:, vocab.row_length - 1 :: vocab.row_length] == -100).all() and (seq[:, -1] == -100).all()
    prompts = [vocab.prompt_ids("a red circle top left on a blue background")] * 2
    codes = torch.zeros(2, 16, 16, dtype=torch.long)
    img = T.build_sequences(vocab, ["a red circle top left on a blue background"] * 2, codes)[1]
    ids, labels, _ = T.make_batch(vocab, prompts, img, [0, 1], [False, True])
    targets = T.layout_labels(vocab, prompts, seq, [0, 1], [False, True], ids.shape[1])
    assert ((targets[0] != -100) <= (labels[0] != -100)).all()  # only where the LM has a label
    plen = len(prompts[0])
    assert targets[0, plen + 3 * vocab.row_length + 5] == 1 and (targets[1] == -100).all()


def test_sub_token_layout_is_the_outline_inside_each_token():
    """`token_layout(cells=2)` marks 2 px sub-patches (the shape inside a token, no colour), and
    `demo.tools.train`'s layout sequences put each token's sub-patches on that token in raster order,
    with row ends and <eoi> ignored; one cell per token is the plain layout."""
    import torch

    from sjd_pac_core.demo.tools import train as T
    from sjd_pac_core.demo.vocab import SLOT_WORDS, DemoVocab

    s = D.make_sample(0, 3)
    fine = D.token_layout(s, cells=2)
    assert fine.shape == (32, 32)
    cover = np.stack(s.masks).max(0).reshape(32, 2, 32, 2).mean(axis=(1, 3))
    assert ((cover > 0.5) <= (fine > 0)).all() and not (fine > 0)[cover < 0.5].any()
    vocab = DemoVocab(words=list(C.CAPTION_WORDS) + SLOT_WORDS, codebook_size=16, grid=16, prompt_format="slots")
    seq = T.layout_sequences(vocab, fine[None], cells=2)
    assert seq.shape == (1, vocab.num_image_tokens + 1, 4)
    for r, c in [(0, 0), (7, 9), (15, 15)]:
        assert seq[0, r * vocab.row_length + c].tolist() == fine[2 * r : 2 * r + 2, 2 * c : 2 * c + 2].reshape(-1).tolist()
    assert (seq[0, vocab.row_length - 1 :: vocab.row_length] == -100).all() and (seq[0, -1] == -100).all()
    coarse = D.token_layout(s)
    assert torch.equal(T.layout_sequences(vocab, coarse[None], cells=1), T.layout_sequences(vocab, coarse[None]))
