"""A strict check of a demo image against its caption: colours, shape, position and size.

    python -m sjd_pac_core.demo.tools.quality                 # the shipped model on the 24 held-out prompts
    python -m sjd_pac_core.demo.tools.quality --calibrate     # the check itself, on right and wrong images
    python -m sjd_pac_core.demo.tools.quality --ceiling --n 120   # ground truth through the VQ tokenizer

Every pixel gets its nearest named colour of the data's palette (``captions.COLORS``, Euclidean
distance in RGB). Then, per image:

* ``background``: the caption's background colour is the most common colour of the image and
  covers at least ``BACKGROUND_MIN_SHARE`` (half) of it, so a frame mostly in the object's
  colour fails;
* ``object_colour``: every object of the caption is found: a connected region (8-neighbours,
  after a one-pixel closing that bridges shading gaps) of its colour with at least
  ``OBJECT_MIN_PIXELS`` pixels. An object is its colour's largest region (two objects of one
  colour: the two largest, matched to the named positions by least total distance);
* ``shape``: of the six shape templates (the data generator's own ``data.shape_mask``), each
  fitted to the region's centroid and area, the caption's shape matches the region best
  (intersection over union);
* ``position``: the region's centroid lies in the named third of the frame horizontally and
  vertically ("top left": left third and top third; "top": middle third and top third; ...);
* ``size``: the radius at which the caption's shape template has the region's area lies in
  ``SIZE_RADIUS_BOUNDS`` for the size word, and the region covers at most half the frame.

``all`` holds when every criterion holds for every object. The bounds are calibrated on
ground-truth images of ``data.make_sample`` (data seed 1) and checked on other seeds, where
nearly all pass, and on deliberately wrong images (colours swapped, object moved, shape or size
word changed, a frame-filling blob), which fail the criterion they break:
``python -m sjd_pac_core.demo.tools.quality --calibrate`` prints both (tests/test_demo_quality.py
asserts them).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
from PIL import Image

from ... import arguments
from ..captions import COLOR_NAMES, COLORS, IMAGE_SIZE, POSITIONS, SHAPES, parse_caption
from .data import TEXTURES, shape_mask

PROMPTS_FILE = Path(__file__).with_name("quality_prompts.txt")
BACKGROUND_MIN_SHARE = 0.5
OBJECT_MIN_PIXELS = 12  # the smallest ground-truth object (a small ring, radius 8.5) has ~160 pixels
OUTLINE_WIDTH = 2  # pixels around an object's colour region that count as its edge (anti-aliasing,
# shading, or a decoded outline in another named colour)
MAX_OBJECT_SHARE = 0.5  # "never more than half the frame"
# Fitted radius (px) per size word. The generator draws radii of 8.5-9.5 / 12-13 / 15.5-16.5
# (data.SIZE_RADIUS, data v2: flat objects without outline); the fitted radius of a
# ground-truth object lies within about a pixel of its drawn one (anti-aliased edges, shading
# pixels of another named colour). Measured on data seed 1 (200 images per split): small
# 8.3-11.1, medium 11.8-13.6, large 15.1-17.2; the bounds split the gaps between the words.
SIZE_RADIUS_BOUNDS = {"small": (7.0, 11.45), "medium": (11.45, 14.3), "large": (14.3, 18.5)}
CRITERIA = ("background", "object_colour", "shape", "position", "size")

_PALETTE = np.array([COLORS[c] for c in COLOR_NAMES], dtype=np.float32)  # (12, 3)
# Thirds of the image each position word names: (x third, y third), 0 = left/top, 2 = right/bottom.
_THIRDS = {
    "top left": (0, 0), "top": (1, 0), "top right": (2, 0),
    "left": (0, 1), "in the center": (1, 1), "right": (2, 1),
    "bottom left": (0, 2), "bottom": (1, 2), "bottom right": (2, 2),
}


@dataclass(frozen=True)
class ObjectFinding:
    """What the check found for one object of the caption (``found`` False: no region)."""

    found: bool
    shape: Optional[str] = None  # best-matching template
    centroid: Optional[Tuple[float, float]] = None  # (x, y) in pixels
    pixels: int = 0
    radius: Optional[float] = None  # of the caption's shape template with the region's area
    shape_ok: bool = False
    position_ok: bool = False
    size_ok: bool = False


@dataclass(frozen=True)
class QualityCheck:
    """Result of `check_image`: each criterion True when the image agrees with the caption."""

    background: bool
    object_colour: bool
    shape: bool
    position: bool
    size: bool
    objects: Tuple[ObjectFinding, ...] = ()

    @property
    def all(self) -> bool:
        return all(getattr(self, name) for name in CRITERIA)

    def failed(self) -> List[str]:
        return [name for name in CRITERIA if not getattr(self, name)]


def _as_array(image: Union[Image.Image, np.ndarray]) -> np.ndarray:
    arr = np.asarray(image.convert("RGB") if isinstance(image, Image.Image) else image)
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise ValueError(f"expected an RGB image, got shape {arr.shape}")
    return arr


def color_labels(image: Union[Image.Image, np.ndarray]) -> np.ndarray:
    """(H, W) int: index into ``data.COLOR_NAMES`` of every pixel's nearest named colour."""
    arr = _as_array(image).astype(np.float32)
    d = ((arr[:, :, None, :] - _PALETTE[None, None]) ** 2).sum(-1)
    return d.argmin(-1)


# ----------------------------------------------------------------------------- segmentation


def _dilate(mask: np.ndarray) -> np.ndarray:
    out = mask.copy()
    out[1:] |= mask[:-1]
    out[:-1] |= mask[1:]
    out[:, 1:] |= mask[:, :-1]
    out[:, :-1] |= mask[:, 1:]
    return out


def close_mask(mask: np.ndarray) -> np.ndarray:
    """Morphological closing with a 4-neighbour cross: fills one-pixel gaps, keeps the outline."""
    return ~_dilate(~_dilate(mask))


def regions(mask: np.ndarray, min_pixels: int = OBJECT_MIN_PIXELS) -> List[np.ndarray]:
    """8-connected regions of ``mask`` with at least ``min_pixels`` pixels, largest first, each
    a bool mask of the frame's shape."""
    h, w = mask.shape
    seen = np.zeros(mask.shape, dtype=bool)
    found = []
    for y0, x0 in zip(*np.nonzero(mask)):
        if seen[y0, x0]:
            continue
        seen[y0, x0] = True
        queue, pixels = deque([(y0, x0)]), []
        while queue:
            y, x = queue.popleft()
            pixels.append((y, x))
            for ny in (y - 1, y, y + 1):
                for nx in (x - 1, x, x + 1):
                    if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and not seen[ny, nx]:
                        seen[ny, nx] = True
                        queue.append((ny, nx))
        if len(pixels) >= min_pixels:
            region = np.zeros(mask.shape, dtype=bool)
            ys, xs = zip(*pixels)
            region[list(ys), list(xs)] = True
            found.append(region)
    return sorted(found, key=lambda r: -int(r.sum()))


def with_outline(region: np.ndarray, not_background: np.ndarray, width: int = OUTLINE_WIDTH) -> np.ndarray:
    """The region plus the non-background pixels within ``width`` pixels of it: an object's
    outline (drawn darker or lighter, so often another named colour) belongs to the object."""
    grown = region
    for _ in range(width):
        grown = _dilate(grown)
    return region | (grown & not_background)


def centroid(region: np.ndarray) -> Tuple[float, float]:
    ys, xs = np.nonzero(region)
    return float(xs.mean()) + 0.5, float(ys.mean()) + 0.5


# ----------------------------------------------------------------------------- shape templates


@lru_cache(maxsize=None)
def _unit_area(shape: str) -> float:
    """Template pixels per squared radius (measured once at radius 14, centred)."""
    return float((shape_mask(shape, 32.0, 32.0, 14.0) >= 0.5).sum()) / 14.0**2


@lru_cache(maxsize=4096)
def _centred_template(shape: str, radius: float) -> Tuple[np.ndarray, Tuple[float, float]]:
    mask = shape_mask(shape, IMAGE_SIZE / 2, IMAGE_SIZE / 2, radius) >= 0.5
    return mask, centroid(mask) if mask.any() else (IMAGE_SIZE / 2, IMAGE_SIZE / 2)


def _template(shape: str, region_centroid: Tuple[float, float], radius: float) -> np.ndarray:
    """The generator's shape at ``radius`` (to a quarter pixel), moved by whole pixels so its
    centroid is nearest the region's. Cached: one render per shape and radius."""
    mask, (tx, ty) = _centred_template(shape, round(radius * 4) / 4)
    dx, dy = int(round(region_centroid[0] - tx)), int(round(region_centroid[1] - ty))
    out = np.zeros_like(mask)
    h, w = mask.shape
    out[max(dy, 0) : h + min(dy, 0), max(dx, 0) : w + min(dx, 0)] = mask[max(-dy, 0) : h - max(dy, 0),
                                                                        max(-dx, 0) : w - max(dx, 0)]
    return out


def equivalent_radius(shape: str, pixels: int) -> float:
    """The radius at which ``shape``'s template covers ``pixels`` pixels."""
    return float(np.sqrt(pixels / _unit_area(shape)))


def shape_scores(region: np.ndarray) -> Dict[str, float]:
    """Intersection over union of the region with each shape's template, fitted to the region's
    centroid and area (best of three radii around the area-equivalent one)."""
    pixels = int(region.sum())
    c = centroid(region)
    scores = {}
    for shape in SHAPES:
        r0 = equivalent_radius(shape, pixels)
        best = 0.0
        for r in (0.92 * r0, r0, 1.08 * r0):
            t = _template(shape, c, r)
            union = int((t | region).sum())
            best = max(best, int((t & region).sum()) / union if union else 0.0)
        scores[shape] = best
    return scores


def _third(v: float, size: int) -> int:
    return min(max(int(v * 3 // size), 0), 2)


def _assign(objects: List[dict], found: List[np.ndarray]) -> List[Optional[np.ndarray]]:
    """Match objects of one colour to that colour's largest regions: by least total distance
    to their named positions when there are several (a single object takes the largest)."""
    if len(objects) == 1:
        return [found[0] if found else None]
    candidates = found[: len(objects)]
    best, best_cost = None, float("inf")
    for perm in itertools.permutations(range(len(objects)), len(candidates)):
        cost = sum(np.hypot(*np.subtract(centroid(candidates[k]), POSITIONS[objects[i]["position"]]))
                   for k, i in enumerate(perm))
        if cost < best_cost:
            best, best_cost = perm, cost
    out: List[Optional[np.ndarray]] = [None] * len(objects)
    for k, i in enumerate(best or ()):
        out[i] = candidates[k]
    return out


def _finding(obj: dict, region: Optional[np.ndarray]) -> ObjectFinding:
    if region is None:
        return ObjectFinding(found=False)
    h, w = region.shape
    pixels = int(region.sum())
    scores = shape_scores(region)
    best_shape = max(scores, key=scores.get)
    cx, cy = centroid(region)
    radius = equivalent_radius(obj["shape"], pixels)
    lo, hi = SIZE_RADIUS_BOUNDS[obj["size"]]
    return ObjectFinding(
        found=True,
        shape=best_shape,
        centroid=(cx, cy),
        pixels=pixels,
        radius=radius,
        shape_ok=best_shape == obj["shape"],
        position_ok=(_third(cx, w), _third(cy, h)) == _THIRDS[obj["position"]],
        size_ok=lo <= radius <= hi and pixels <= MAX_OBJECT_SHARE * h * w,
    )


def check_image(caption: str, image: Union[Image.Image, np.ndarray]) -> QualityCheck:
    """Check a decoded image against its demo caption (see the module docstring)."""
    objects, background = parse_caption(caption)
    labels = color_labels(image)
    counts = np.bincount(labels.reshape(-1), minlength=len(COLOR_NAMES))
    bg_index = COLOR_NAMES.index(background)
    background_ok = int(counts.argmax()) == bg_index and counts[bg_index] >= BACKGROUND_MIN_SHARE * labels.size
    not_background = labels != bg_index
    findings: List[Optional[ObjectFinding]] = [None] * len(objects)
    for colour in {o["color"] for o in objects}:
        members = [i for i, o in enumerate(objects) if o["color"] == colour]
        found = [with_outline(r, not_background) for r in regions(close_mask(labels == COLOR_NAMES.index(colour)))]
        for i, region in zip(members, _assign([objects[i] for i in members], found)):
            findings[i] = _finding(objects[i], region)
    done = tuple(f for f in findings if f is not None)
    return QualityCheck(
        background=bool(background_ok),
        object_colour=all(f.found for f in done),
        shape=all(f.shape_ok for f in done),
        position=all(f.position_ok for f in done),
        size=all(f.size_ok for f in done),
        objects=done,
    )


# ----------------------------------------------------------------------------- pass rates


def load_prompts(path: Union[str, Path] = PROMPTS_FILE) -> List[str]:
    """The held-out quality prompts (one per line; '#' comments and blank lines skipped)."""
    lines = Path(path).read_text().splitlines()
    return [s.strip() for s in lines if s.strip() and not s.strip().startswith("#")]


@dataclass(frozen=True)
class PassRates:
    n: int
    background: float
    object_colour: float
    shape: float
    position: float
    size: float
    all: float

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in ("n", *CRITERIA, "all")}

    def line(self) -> str:
        return "  ".join(f"{name} {100 * getattr(self, name):.0f}%" for name in (*CRITERIA, "all")) + f"  (n={self.n})"


def pass_rates(checks: Sequence[QualityCheck]) -> PassRates:
    """Share of `checks` that pass each criterion, and all of them."""
    n = len(checks)
    if n == 0:
        raise ValueError("no checks")
    rate = {name: sum(bool(getattr(c, name)) for c in checks) / n for name in CRITERIA}
    return PassRates(n=n, all=sum(c.all for c in checks) / n, **rate)


# ----------------------------------------------------------------------------- calibration


WRONG_KINDS = ("swapped_colours", "moved", "other_shape", "other_size", "frame_filling_blob")
# The criterion each kind of wrong image must fail.
WRONG_KIND_CRITERION = {
    "swapped_colours": "background", "moved": "position", "other_shape": "shape",
    "other_size": "size", "frame_filling_blob": "background",
}
_OTHER_SIZE = {"small": "large", "medium": "large", "large": "small"}


def _far_position(name: str) -> str:
    """A named position in another third on both axes where it can (the farthest one)."""
    px, py = POSITIONS[name]
    return max(POSITIONS, key=lambda other: np.hypot(POSITIONS[other][0] - px, POSITIONS[other][1] - py))


def _render(seed: int, index: int, background: str, objects: list, texture: str = "fine") -> np.ndarray:
    from .data import render_scene  # the generator's own rendering

    return render_scene(np.random.default_rng([int(seed), 7, int(index)]), background, objects, texture)[0]


def _spec_at(spec, **changes):
    """An ObjectSpec with changed fields, its centre/radius redrawn to match them."""
    from .data import SIZE_RADIUS

    new = replace(spec, **changes)
    if "size" in changes:
        lo, hi = SIZE_RADIUS[new.size]
        new = replace(new, radius=(lo + hi) / 2)
    if "position" in changes or "size" in changes:
        px, py = POSITIONS[new.position]
        r = new.radius
        new = replace(new, center=(float(np.clip(px, r + 1, IMAGE_SIZE - r - 1)),
                                   float(np.clip(py, r + 1, IMAGE_SIZE - r - 1))))
    return new


def wrong_image(kind: str, seed: int, index: int, texture: str = "fine") -> Tuple[str, np.ndarray]:
    """(the original caption, an image that breaks it in one way) for one-object samples.

    swapped_colours: object and background colours exchanged; moved: the object drawn at the
    farthest named position; other_shape: another shape; other_size: another size word's
    radius; frame_filling_blob: the object's colour over 60-80 % of the frame."""
    from .data import make_sample

    i = index
    while True:
        s = make_sample(seed, i, "train", texture)
        if len(s.objects) == 1:
            break
        i += 1_000_003
    spec = s.objects[0]
    if kind == "swapped_colours":
        return s.caption, _render(seed, i, spec.color, [replace(spec, color=s.background)], texture)
    if kind == "moved":
        return s.caption, _render(seed, i, s.background, [_spec_at(spec, position=_far_position(spec.position))], texture)
    if kind == "other_shape":
        others = [sh for sh in SHAPES if sh != spec.shape]
        return s.caption, _render(seed, i, s.background, [replace(spec, shape=others[i % len(others)])], texture)
    if kind == "other_size":
        return s.caption, _render(seed, i, s.background, [_spec_at(spec, size=_OTHER_SIZE[spec.size])], texture)
    if kind == "frame_filling_blob":
        rng = np.random.default_rng([seed, 8, i])
        r = float(rng.uniform(26, 34))
        blob = replace(spec, shape="circle", center=(32 + rng.uniform(-4, 4), 32 + rng.uniform(-4, 4)), radius=r)
        return s.caption, _render(seed, i, s.background, [blob], texture)
    raise ValueError(f"kind must be one of {WRONG_KINDS}")


@dataclass(frozen=True)
class Calibration:
    ground_truth: Dict[str, PassRates]  # split -> pass rates on the generator's own images
    wrong: Dict[str, Tuple[PassRates, float]]  # kind -> (pass rates, share failing its criterion)

    def lines(self) -> List[str]:
        out = [f"ground truth {split:8s} {r.line()}" for split, r in self.ground_truth.items()]
        for kind, (r, caught) in self.wrong.items():
            out.append(f"wrong: {kind:19s} fails {WRONG_KIND_CRITERION[kind]} in {100 * caught:.0f}%  "
                       f"passes all in {100 * r.all:.0f}%")
        return out


def calibrate(n: int = 200, seed: int = 0, texture: str = "fine") -> Calibration:
    """The check on ``n`` ground-truth images per split and ``n`` wrong images per kind, their
    backgrounds of ``texture`` (`data.TEXTURES`)."""
    from .data import make_sample

    truth = {}
    for split in ("train", "heldout"):
        truth[split] = pass_rates([check_image(s.caption, s.image)
                                   for s in (make_sample(seed, i, split, texture) for i in range(n))])
    wrong = {}
    for kind in WRONG_KINDS:
        checks = [check_image(*wrong_image(kind, seed, i, texture)) for i in range(n)]
        caught = sum(not getattr(c, WRONG_KIND_CRITERION[kind]) for c in checks) / n
        wrong[kind] = (pass_rates(checks), caught)
    return Calibration(truth, wrong)


def vq_ceiling(vq, n: int = 120, seed: int = 0, split: str = "heldout", texture: str = "fine") -> PassRates:
    """The check on ``n`` ground-truth images of ``split`` after a round trip through the VQ
    tokenizer ``vq`` (encode, decode): the most any LM over its tokens can reach."""
    from .data import make_sample

    samples = [make_sample(seed, i, split, texture) for i in range(n)]
    rec = vq.decode_to_uint8(vq.encode(np.stack([s.image for s in samples])))
    return pass_rates([check_image(s.caption, r) for s, r in zip(samples, rec)])


# ----------------------------------------------------------------------------- the model


def evaluate_model(model, prompts: Optional[Iterable[str]] = None, seeds: Sequence[int] = (0,), config=None):
    """Generate every prompt with every seed through ``generate_image`` and check it.

    Returns (PassRates, list of (prompt, seed, QualityCheck, PIL image))."""
    from ...generate import generate_image

    prompts = list(prompts) if prompts is not None else load_prompts()
    rows = []
    for p in prompts:
        for s in seeds:
            img = generate_image(model, p, config=config, seed=s, threads=None).images[0]  # --threads
            rows.append((p, s, check_image(p, img), img))
    return pass_rates([r[2] for r in rows]), rows


def captioned_grid(rows, cols: int = 8, scale: int = 3, caption_lines: int = 4) -> Image.Image:
    """A grid of `evaluate_model` rows: each image upscaled, its prompt under it, the criteria it
    fails in red, and a green (all criteria hold) or red frame."""
    from PIL import ImageDraw, ImageFont
    import textwrap

    font = ImageFont.load_default(size=11)
    side = IMAGE_SIZE * scale
    pad, line_h = 6, 13
    cell_w, cell_h = side + 2 * pad, side + 2 * pad + caption_lines * line_h
    n_rows = (len(rows) + cols - 1) // cols
    sheet = Image.new("RGB", (cols * cell_w, n_rows * cell_h), "white")
    draw = ImageDraw.Draw(sheet)
    for i, (prompt, _seed, check, image) in enumerate(rows):
        r, c = divmod(i, cols)
        x, y = c * cell_w + pad, r * cell_h + pad
        frame = (40, 160, 60) if check.all else (200, 40, 40)
        draw.rectangle([x - 3, y - 3, x + side + 2, y + side + 2], outline=frame, width=3)
        sheet.paste(image.convert("RGB").resize((side, side), Image.NEAREST), (x, y))
        lines = textwrap.wrap(prompt, width=side // 6)[: caption_lines - 1]
        for k, text in enumerate(lines):
            draw.text((x, y + side + 4 + k * line_h), text, fill="black", font=font)
        verdict = "all criteria hold" if check.all else "wrong: " + ", ".join(check.failed())
        draw.text((x, y + side + 4 + len(lines) * line_h), verdict[: side // 6], fill=frame, font=font)
    return sheet


def grid_path(grid: str, cfg: float, temperature: float, several: bool) -> Path:
    """``--grid`` as given for one setting; with several, one file per setting
    (``grid.png`` -> ``grid_cfg2_t0.8.png``), so no setting's grid overwrites another's."""
    path = Path(grid)
    if not several:
        return path
    return path.with_name(f"{path.stem}_cfg{cfg:g}_t{temperature:g}{path.suffix or '.png'}")


def trained_texture(folder: Union[str, Path]) -> str:
    """The background texture a demo.tools.train folder was trained on (its training_log.json;
    "fine" for logs older than the option)."""
    log = Path(folder) / "training_log.json"
    if not log.is_file():
        return "fine"
    import json

    return json.loads(log.read_text()).get("texture", "fine")


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``python -m sjd_pac_core.demo.tools.quality [--calibrate] [--cfg-scale 1 2 3] [--seeds 0 1 2 3]``."""
    import argparse
    import json

    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibrate", action="store_true", help="check the check: ground truth and wrong images")
    ap.add_argument("--n", type=arguments.whole(1, 100_000), default=200, help="images per set for --calibrate / --ceiling")
    ap.add_argument("--ceiling", action="store_true",
                    help="ground-truth held-out images through the model's VQ tokenizer (no LM), checked")
    ap.add_argument("--texture", default=None, choices=list(TEXTURES),
                    help="background texture of the ground truth for --calibrate / --ceiling (data.TEXTURES; "
                         "default: the one --model was trained on, strong for the shipped demo)")
    ap.add_argument("--cfg-scale", type=arguments.real(0.0, 100.0), nargs="+", default=None, help="CFG scales (default: the model's)")
    ap.add_argument("--temperature", type=arguments.real(0.0, 100.0, above=True), nargs="+", default=None)
    ap.add_argument("--top-k", type=arguments.whole(0, 1_000_000, "0 = off"), default=None)
    ap.add_argument("--seeds", type=arguments.seed, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--prompts", default=None, help="a prompts file (default: the 24 held-out prompts)")
    ap.add_argument("--threads", type=arguments.threads(allow_default=False), default=1)
    ap.add_argument("--model", default="demo", help="the demo model, or a folder written by demo.tools.train")
    ap.add_argument("--grid", default=None, help="save the images, captioned and framed, to this PNG")
    ap.add_argument("--json", default=None, help="write every image's verdict to this JSON file")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    if a.calibrate or a.ceiling:
        from .. import WEIGHTS_DIR

        folder = WEIGHTS_DIR if a.model == "demo" else a.model
        texture = a.texture or trained_texture(folder)  # judge the check on the images the model learned
    if a.calibrate:
        print(f"calibration ({texture} texture):", flush=True)
        for line in calibrate(a.n, texture=texture).lines():
            print(line, flush=True)
        return
    if a.ceiling:
        from ..vq import VQModel

        rates = vq_ceiling(VQModel.from_pretrained(folder), a.n, texture=texture)
        print(f"ceiling ({folder}, {texture} texture): {rates.line()}", flush=True)
        return
    from ...models.loader import load_model

    m = load_model(a.model, device="cpu")
    prompts = load_prompts(a.prompts) if a.prompts else load_prompts()
    overrides = {"top_k": a.top_k} if a.top_k is not None else {}
    records = []
    for cfg in a.cfg_scale or [m.defaults.cfg_scale]:
        for temperature in a.temperature or [m.defaults.temperature]:
            config = m.defaults.sampler_config(method="sjd_pac", verify="gumbel", cfg_scale=cfg,
                                               temperature=temperature, **overrides)
            rates, rows = evaluate_model(m, prompts, seeds=a.seeds, config=config)
            print(f"cfg_scale {cfg} temperature {temperature} seeds {a.seeds}: {rates.line()}", flush=True)
            records.append({"cfg_scale": cfg, "temperature": temperature, **overrides, "seeds": a.seeds,
                            **rates.as_dict(),
                            "images": [{"prompt": p, "seed": s, "failed": c.failed()} for p, s, c, _ in rows]})
            if a.grid:
                several = len(a.cfg_scale or [0]) * len(a.temperature or [0]) > 1
                path = grid_path(a.grid, cfg, temperature, several=several)
                captioned_grid(rows).save(path)
                print(f"wrote {path}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
