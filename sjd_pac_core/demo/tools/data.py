"""Procedural captioned 64x64 images for the bundled demo model.

Every image is a deterministic function of ``(seed, split, index)``. An image holds one or two
shapes on a coloured, textured background, and its caption names them in plain English, e.g.
``"a red circle top left on a blue background"`` or
``"a large green triangle bottom left and a small yellow star top right on a black background"``.

The textures are chosen so that the VQ tokens of an image behave like those of natural images
under speculative Jacobi decoding: they carry real entropy, *and* that entropy is locally
correlated (a token's distribution depends on its left and upper neighbours), so a draft token
drawn from a stale distribution is often rejected once its neighbours change. Concretely:

* backgrounds: base colour + a linear gradient in a random direction + band-limited "cloud"
  noise (correlation length about one token) and, for some images, wavy stripes whose
  frequency, orientation, wobble and phase are random; plus a little fine grain;
* objects (data v2): flat colour, mildly shaded from a random light direction, with a faint
  mottling; no outline and no inner stripes. A 512-code VQ tokenizer rounded textured and
  outlined shapes off (ground truth through it kept the right shape in 38 % of images), and the
  shape is what the caption asks for, so the objects carry little texture; the backgrounds keep
  the entropy.

Sizes: radii of 8.5-9.5 / 12-13 / 15.5-16.5 px for small / medium / large (three tokens' worth
apart, so a size word is visible in the tokens). Two objects of one image sit at least two grid
places apart (another third of the frame on one axis at least, e.g. "top left" and "top right").

Held-out split: some (colour, shape) pairs never occur in the training split; every held-out
image contains at least one of them (see ``HELD_OUT_PAIRS``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageDraw

from ..captions import (COLOR_NAMES, COLORS, IMAGE_SIZE, MIN_CONTRAST, POSITION_NAMES, POSITIONS, SHAPES, SIZES,
                        ObjectSpec, color_distance, make_caption, parse_caption)

SIZE_RADIUS = {"small": (8.5, 9.5), "medium": (12.0, 13.0), "large": (15.5, 16.5)}
POSITION_JITTER = 2.0  # px, each axis
# (column, row) of each named position on the 3x3 grid of positions
POSITION_GRID: dict[str, tuple[int, int]] = {name: ((x - 16) // 16, (y - 16) // 16) for name, (x, y) in POSITIONS.items()}
MIN_GRID_DISTANCE = 2  # two objects of one image: at least this many grid places apart (Chebyshev)

# (colour, shape) pairs that never appear in the training split.
HELD_OUT_PAIRS: frozenset[tuple[str, str]] = frozenset(
    {
        ("red", "star"),
        ("blue", "triangle"),
        ("green", "ring"),
        ("yellow", "square"),
        ("purple", "circle"),
        ("white", "diamond"),
        ("pink", "triangle"),
        ("cyan", "square"),
        ("orange", "ring"),
        ("brown", "star"),
    }
)

SPLITS = {"train": 0, "heldout": 1}


@dataclass(frozen=True)
class CloudTexture:
    """The background's cloud noise: its luminance amplitude (0..255 units) and the number of
    noise cells across the frame (fewer cells: longer correlation), each drawn uniformly per image."""

    amplitude: tuple[float, float]
    cells: tuple[int, int]


# "fine" is data v2's (correlation of one to two tokens); "medium" and "strong" are stronger and
# coarser (two to four tokens), which makes a token depend more on its neighbours, as in natural
# images (issue 17: the shipped model is trained on "strong").
TEXTURES = {
    "fine": CloudTexture(amplitude=(8, 20), cells=(8, 15)),
    "medium": CloudTexture(amplitude=(14, 28), cells=(5, 10)),
    "strong": CloudTexture(amplitude=(20, 36), cells=(4, 8)),
}

@dataclass
class Sample:
    image: np.ndarray  # (64, 64, 3) uint8
    caption: str
    background: str
    objects: list[ObjectSpec] = field(default_factory=list)
    masks: list[np.ndarray] = field(default_factory=list)  # per object, float (64, 64) coverage


# ----------------------------------------------------------------------------- rendering


_SS = 4  # supersampling factor for anti-aliased shape masks


def _polygon(cx: float, cy: float, r: float, n: int, rot: float, inner: float | None = None):
    pts = []
    if inner is None:
        for k in range(n):
            a = rot + 2 * np.pi * k / n
            pts.append((cx + r * np.cos(a), cy + r * np.sin(a)))
    else:
        for k in range(2 * n):
            a = rot + np.pi * k / n
            rr = r if k % 2 == 0 else r * inner
            pts.append((cx + rr * np.cos(a), cy + rr * np.sin(a)))
    return pts


def shape_mask(shape: str, cx: float, cy: float, r: float) -> np.ndarray:
    """Anti-aliased coverage mask in [0, 1], shape (64, 64)."""
    S = IMAGE_SIZE * _SS
    img = Image.new("L", (S, S), 0)
    d = ImageDraw.Draw(img)
    X, Y, R = (cx + 0.0) * _SS, (cy + 0.0) * _SS, r * _SS
    if shape == "circle":
        d.ellipse([X - R, Y - R, X + R, Y + R], fill=255)
    elif shape == "ring":
        d.ellipse([X - R, Y - R, X + R, Y + R], fill=255)
        ri = R * 0.55
        d.ellipse([X - ri, Y - ri, X + ri, Y + ri], fill=0)
    elif shape == "square":
        h = R * 0.85
        d.rectangle([X - h, Y - h, X + h, Y + h], fill=255)
    elif shape == "diamond":
        d.polygon(_polygon(X, Y, R, 4, -np.pi / 2), fill=255)
    elif shape == "triangle":
        d.polygon(_polygon(X, Y + 0.15 * R, R * 1.05, 3, -np.pi / 2), fill=255)
    elif shape == "star":
        d.polygon(_polygon(X, Y + 0.05 * R, R * 1.08, 5, -np.pi / 2, inner=0.45), fill=255)
    else:
        raise ValueError(f"unknown shape {shape!r}")
    small = img.resize((IMAGE_SIZE, IMAGE_SIZE), Image.BOX)
    return np.asarray(small, dtype=np.float32) / 255.0


def _grid():
    y, x = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE].astype(np.float32)
    return x + 0.5, y + 0.5


_X, _Y = _grid()


def _cloud_noise(rng: np.random.Generator, cells: int) -> np.ndarray:
    """Band-limited noise, zero mean, unit-ish std; correlation length ~ 64/cells px."""
    g = rng.standard_normal((cells + 3, cells + 3)).astype(np.float32)
    im = Image.fromarray(g, mode="F")
    # crop the margin away so edges are as random as the interior
    scale = IMAGE_SIZE / cells
    big = im.resize((int(round((cells + 3) * scale)),) * 2, Image.BICUBIC)
    off = int(round(1.5 * scale))
    arr = np.asarray(big, dtype=np.float32)[off : off + IMAGE_SIZE, off : off + IMAGE_SIZE]
    s = arr.std()
    return (arr - arr.mean()) / (s if s > 1e-6 else 1.0)


def _stripes(rng: np.random.Generator, period_lo: float, period_hi: float) -> np.ndarray:
    """Wavy stripes in [-1, 1] with random period, orientation, wobble and phase."""
    period = rng.uniform(period_lo, period_hi)
    theta = rng.uniform(0, np.pi)
    u = _X * np.cos(theta) + _Y * np.sin(theta)
    v = -_X * np.sin(theta) + _Y * np.cos(theta)
    wob_amp = rng.uniform(0.0, 2.5)
    wob_period = rng.uniform(16, 48)
    phase = rng.uniform(0, 2 * np.pi)
    return np.sin(
        2 * np.pi * u / period + phase + wob_amp * np.sin(2 * np.pi * v / wob_period + rng.uniform(0, 6.3))
    ).astype(np.float32)


def _background(rng: np.random.Generator, color: str, texture: CloudTexture) -> np.ndarray:
    base = np.array(COLORS[color], dtype=np.float32)
    img = np.broadcast_to(base, (IMAGE_SIZE, IMAGE_SIZE, 3)).copy()
    # luminance modulation field (additive, in 0..255 units), so black/white get texture too
    lum = np.zeros((IMAGE_SIZE, IMAGE_SIZE), np.float32)
    # 1. linear gradient in a random direction
    theta = rng.uniform(0, 2 * np.pi)
    grad = ((_X - 32) * np.cos(theta) + (_Y - 32) * np.sin(theta)) / 32.0
    lum += rng.uniform(6, 22) * grad
    # 2. clouds: correlation length of one to two tokens (4-8 px) for "fine", more for the others
    lo, hi = texture.amplitude
    cells_lo, cells_hi = texture.cells
    lum += rng.uniform(lo, hi) * _cloud_noise(rng, int(rng.integers(cells_lo, cells_hi)))
    # 3. wavy stripes on about half the images
    if rng.random() < 0.5:
        lum += rng.uniform(8, 18) * _stripes(rng, 9, 22)
    img += lum[..., None]
    # slight per-channel tint cloud, so codes are not pure luminance
    tint = _cloud_noise(rng, int(rng.integers(4, 9)))
    img += (rng.uniform(3, 9) * tint)[..., None] * rng.standard_normal(3).astype(np.float32)[None, None]
    # fine grain
    img += rng.normal(0, 2.5, size=img.shape).astype(np.float32)
    return img


def _render_object(rng: np.random.Generator, img: np.ndarray, obj: ObjectSpec) -> np.ndarray:
    """A flat, mildly shaded object (no outline, no stripes: data v2)."""
    cx, cy = obj.center
    m = shape_mask(obj.shape, cx, cy, obj.radius)
    base = np.array(COLORS[obj.color], dtype=np.float32)
    # mild shading from a random light direction
    la = rng.uniform(0, 2 * np.pi)
    shade = ((_X - cx) * np.cos(la) + (_Y - cy) * np.sin(la)) / max(obj.radius, 1.0)
    lum = rng.uniform(4, 12) * shade
    # faint mottling
    lum += rng.uniform(1, 4) * _cloud_noise(rng, int(rng.integers(10, 17)))
    col = base[None, None, :] + lum[..., None]
    return img * (1 - m[..., None]) + col * m[..., None], m


# ----------------------------------------------------------------------------- sampling specs


def _pair_sizes(rng: np.random.Generator, a: str, b: str) -> tuple[str, str]:
    """Size words of two objects at positions ``a`` and ``b``: drawn freely, then the larger one
    is shrunk until the two cannot touch (with the position jitter): same row or column allows at
    most large + small or medium + medium."""
    sizes = [SIZES[int(rng.integers(len(SIZES)))] for _ in range(2)]
    (ax, ay), (bx, by) = POSITIONS[a], POSITIONS[b]
    room = np.hypot(ax - bx, ay - by) - 2 * POSITION_JITTER
    while SIZE_RADIUS[sizes[0]][1] + SIZE_RADIUS[sizes[1]][1] > room:
        k = 0 if SIZES.index(sizes[0]) >= SIZES.index(sizes[1]) else 1
        sizes[k] = SIZES[SIZES.index(sizes[k]) - 1]
    return sizes[0], sizes[1]


def _far_apart(a: str, b: str) -> bool:
    (ac, ar), (bc, br) = POSITION_GRID[a], POSITION_GRID[b]
    return max(abs(ac - bc), abs(ar - br)) >= MIN_GRID_DISTANCE


def _sample_spec(rng: np.random.Generator, split: str):
    """Draw background and objects, rejecting combinations that belong to the other split."""
    while True:
        n_obj = 1 if rng.random() < 0.5 else 2
        bg = COLOR_NAMES[int(rng.integers(len(COLOR_NAMES)))]
        if n_obj == 1:
            names = [POSITION_NAMES[int(rng.integers(len(POSITION_NAMES)))]]
            sizes = [SIZES[int(rng.integers(len(SIZES)))]]
        else:
            pairs = [(a, b) for a in POSITION_NAMES for b in POSITION_NAMES if a != b and _far_apart(a, b)]
            names = list(pairs[int(rng.integers(len(pairs)))])
            sizes = list(_pair_sizes(rng, *names))
        objs = []
        for pos, size in zip(names, sizes):
            choices = [c for c in COLOR_NAMES if color_distance(c, bg) >= MIN_CONTRAST]
            color = choices[int(rng.integers(len(choices)))]
            shape = SHAPES[int(rng.integers(len(SHAPES)))]
            lo, hi = SIZE_RADIUS[size]
            r = float(rng.uniform(lo, hi))
            px, py = POSITIONS[pos]
            jit = POSITION_JITTER
            cx = float(np.clip(px + rng.uniform(-jit, jit), r + 1, IMAGE_SIZE - r - 1))
            cy = float(np.clip(py + rng.uniform(-jit, jit), r + 1, IMAGE_SIZE - r - 1))
            objs.append(ObjectSpec(shape, color, size, pos, (cx, cy), r))
        held = [(o.color, o.shape) in HELD_OUT_PAIRS for o in objs]
        if split == "train" and any(held):
            continue
        if split == "heldout" and not any(held):
            continue
        return bg, objs


def make_sample(seed: int, index: int, split: str = "train", texture: str = "fine") -> Sample:
    """The ``index``-th image of ``split`` for ``seed``; a pure function of its arguments.
    ``texture`` names the background clouds (`TEXTURES`); the caption and objects do not depend
    on it."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}")
    rng = np.random.default_rng([int(seed), SPLITS[split], int(index)])
    bg, objs = _sample_spec(rng, split)
    img, masks = render_scene(rng, bg, objs, texture)
    return Sample(img, make_caption(objs, bg), bg, objs, masks)


def render_scene(rng: np.random.Generator, background: str, objects: list[ObjectSpec],
                 texture: str = "fine") -> tuple[np.ndarray, list[np.ndarray]]:
    """The uint8 image (64, 64, 3) of ``objects`` on a textured ``background``, drawn with
    ``rng``, and each object's coverage mask (later objects drawn over earlier ones)."""
    if texture not in TEXTURES:
        raise ValueError(f"texture {texture!r} is not one of {list(TEXTURES)}; pick one of them")
    img = _background(rng, background, TEXTURES[texture])
    masks = []
    for o in objects:
        img, m = _render_object(rng, img, o)
        masks.append(m)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8), masks


def caption_regions(caption: str, grid: int = 16) -> np.ndarray:
    """(grid, grid) 0/1: the tokens where the caption's objects can lie.

    A box around each object's named position, as large as its size word allows plus the
    position jitter. It depends on the caption only, never on the pixels, so a loss weighted by
    it keeps the model's optimum at the true conditional distribution (a weight that looked at
    the target pixels would teach the model to over-predict object tokens)."""
    objects, _ = parse_caption(caption)
    cell = IMAGE_SIZE / grid
    centres = (np.arange(grid) + 0.5) * cell
    region = np.zeros((grid, grid), np.float32)
    for o in objects:
        px, py = POSITIONS[o["position"]]
        half = SIZE_RADIUS[o["size"]][1] + POSITION_JITTER + cell / 2  # radius, jitter, and any token it touches
        inside_x = np.abs(centres - px) <= half
        inside_y = np.abs(centres - py) <= half
        region[np.ix_(inside_y, inside_x)] = 1.0
    return region


def token_layout(sample: Sample, grid: int = 16, cells: int = 1) -> np.ndarray:
    """(grid * cells, grid * cells) int8: which object each image token shows (0: background, k:
    the caption's k-th object), by majority coverage of the token's patch; a later object covers
    an earlier one as in rendering. With ``cells`` > 1, of each of the cells x cells sub-patches of
    a token instead: the object's outline inside the token, which is its shape at sub-token
    resolution and carries no colour. A training target for `demo.tools.train --layout-weight`."""
    side = grid * cells
    cell = IMAGE_SIZE // side
    layout = np.zeros((side, side), np.int8)
    for k, mask in enumerate(sample.masks, start=1):
        coverage = mask.reshape(side, cell, side, cell).mean(axis=(1, 3))
        layout[coverage > 0.5] = k
    return layout


def generate(n: int, seed: int = 0, split: str = "train", start: int = 0, progress: bool = False,
             layouts: bool = False, layout_cells: int = 1, texture: str = "fine"):
    """``n`` samples -> (uint8 images (n, 64, 64, 3), list of captions), and with ``layouts`` also
    their `token_layout`s (n, 16 * layout_cells, 16 * layout_cells)."""
    images = np.empty((n, IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8)
    side = 16 * layout_cells
    token_layouts = np.zeros((n, side, side), np.int8) if layouts else None
    captions = []
    it = range(n)
    if progress:
        from tqdm import tqdm

        it = tqdm(it, desc=f"data/{split}", unit="img", leave=False)
    for i in it:
        s = make_sample(seed, start + i, split, texture)
        images[i] = s.image
        captions.append(s.caption)
        if layouts:
            token_layouts[i] = token_layout(s, cells=layout_cells)
    return (images, captions, token_layouts) if layouts else (images, captions)


def contact_sheet(images: np.ndarray, cols: int = 8, scale: int = 2) -> Image.Image:
    """Tile uint8 images (n, h, w, 3) into one PIL image (for docs and eyeballing)."""
    n, h, w, _ = images.shape
    rows = (n + cols - 1) // cols
    sheet = np.full((rows * (h + 2), cols * (w + 2), 3), 255, np.uint8)
    for i in range(n):
        r, c = divmod(i, cols)
        sheet[r * (h + 2) : r * (h + 2) + h, c * (w + 2) : c * (w + 2) + w] = images[i]
    im = Image.fromarray(sheet)
    return im.resize((im.width * scale, im.height * scale), Image.NEAREST) if scale != 1 else im
