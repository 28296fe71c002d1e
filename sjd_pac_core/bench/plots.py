"""The benchmark's figures as small PNGs, drawn with PIL (no plotting library needed).

* acceptance-length histograms (the paper's key figure: SJD's mass at 1 vs SJD-PAC's long runs)
* the locality curve: total variation of p_{i+d} after changing the token at i
* step compression and latency speedup against the window L (with window="auto" beside them)
* latency speedup per method with its interquartile range
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

from PIL import Image, ImageDraw, ImageFont

Color = Tuple[int, int, int]
WHITE: Color = (255, 255, 255)
GRID: Color = (229, 231, 235)
AXIS: Color = (75, 85, 99)
TEXT: Color = (31, 41, 55)
MUTED: Color = (107, 114, 128)
VARIANT_COLORS: Dict[str, Color] = {
    "ar": (107, 114, 128),
    "sjd": (37, 99, 235),
    "sjd+pd": (147, 51, 234),
    "sjd+ac": (22, 163, 74),
    "sjd-pac": (234, 88, 12),
}


def load_font(size: int = 13) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # pragma: no cover - Pillow < 10.1
        return ImageFont.load_default()


def _nice_ticks(lo: float, hi: float, count: int = 5) -> List[float]:
    span = max(hi - lo, 1e-12)
    raw = span / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step - 1e-9) * step
    ticks, t = [], start
    while t <= hi + 1e-9:
        ticks.append(round(t, 10))
        t += step
    return ticks


def _fmt(v: float) -> str:
    if abs(v - round(v)) < 1e-9:
        return str(int(round(v)))
    return f"{v:.2f}".rstrip("0").rstrip(".") if abs(v) < 10 else f"{v:.1f}"


class Axes:
    """A plotting area inside a PIL image: data -> pixel mapping, grid, ticks, marks."""

    def __init__(self, img: Image.Image, box: Tuple[int, int, int, int], xlim, ylim,
                 xlog: bool = False, title: str = "", xlabel: str = "", ylabel: str = "") -> None:
        self.img, self.draw = img, ImageDraw.Draw(img)
        self.x0, self.y0, self.x1, self.y1 = box
        self.xlim, self.ylim, self.xlog = xlim, ylim, xlog
        self.font, self.small = load_font(13), load_font(11)
        if title:
            self.draw.text((self.x0, self.y0 - 22), title, fill=TEXT, font=load_font(14))
        if xlabel:
            w = self.draw.textlength(xlabel, font=self.font)
            self.draw.text(((self.x0 + self.x1 - w) / 2, self.y1 + 22), xlabel, fill=TEXT, font=self.font)
        if ylabel:
            label = Image.new("RGBA", (int(self.draw.textlength(ylabel, font=self.font)) + 4, 18), (0, 0, 0, 0))
            ImageDraw.Draw(label).text((2, 0), ylabel, fill=TEXT, font=self.font)
            label = label.rotate(90, expand=True)
            self.img.paste(label, (self.x0 - 58, (self.y0 + self.y1 - label.height) // 2), label)

    def _tx(self, x: float) -> float:
        return math.log2(x) if self.xlog else x

    def X(self, x: float) -> float:
        lo, hi = self._tx(self.xlim[0]), self._tx(self.xlim[1])
        return self.x0 + (self._tx(x) - lo) / (hi - lo) * (self.x1 - self.x0)

    def Y(self, y: float) -> float:
        lo, hi = self.ylim
        return self.y1 - (y - lo) / (hi - lo) * (self.y1 - self.y0)

    def frame(self, xticks: Sequence[float], yticks: Optional[Sequence[float]] = None,
              xtick_labels: Optional[Sequence[str]] = None, yfmt=_fmt) -> None:
        yticks = yticks if yticks is not None else _nice_ticks(*self.ylim)
        for y in yticks:
            py = self.Y(y)
            self.draw.line([(self.x0, py), (self.x1, py)], fill=GRID)
            label = yfmt(y)
            w = self.draw.textlength(label, font=self.small)
            self.draw.text((self.x0 - w - 6, py - 7), label, fill=MUTED, font=self.small)
        labels = xtick_labels or [_fmt(x) for x in xticks]
        for x, label in zip(xticks, labels):
            px = self.X(x)
            self.draw.line([(px, self.y1), (px, self.y1 + 4)], fill=AXIS)
            w = self.draw.textlength(label, font=self.small)
            self.draw.text((px - w / 2, self.y1 + 6), label, fill=MUTED, font=self.small)
        self.draw.line([(self.x0, self.y1), (self.x1, self.y1)], fill=AXIS)
        self.draw.line([(self.x0, self.y0), (self.x0, self.y1)], fill=AXIS)

    def line(self, xs, ys, color: Color, width: int = 2, marker: int = 4) -> None:
        pts = [(self.X(x), self.Y(y)) for x, y in zip(xs, ys)]
        if len(pts) > 1:
            self.draw.line(pts, fill=color, width=width, joint="curve")
        for px, py in pts:
            if marker:
                self.draw.ellipse([px - marker, py - marker, px + marker, py + marker], fill=color)

    def hline(self, y: float, color: Color, dash: int = 6, width: int = 2) -> None:
        py, x = self.Y(y), self.x0
        while x < self.x1:
            self.draw.line([(x, py), (min(x + dash, self.x1), py)], fill=color, width=width)
            x += 2 * dash

    def vline(self, x: float, color: Color, dash: int = 4) -> None:
        px, y = self.X(x), self.y0
        while y < self.y1:
            self.draw.line([(px, y), (px, min(y + dash, self.y1))], fill=color, width=1)
            y += 2 * dash

    def bar(self, x_left: float, x_right: float, y: float, color: Color) -> None:
        self.draw.rectangle([self.X(x_left), self.Y(y), self.X(x_right), self.Y(self.ylim[0])], fill=color)

    def text(self, x: float, y: float, text: str, color: Color = TEXT, anchor: str = "la") -> None:
        self.draw.text((self.X(x), self.Y(y)), text, fill=color, font=self.small, anchor=anchor)


def _legend(draw: ImageDraw.ImageDraw, x: int, y: int, items: Sequence[Tuple[str, Color, bool]]) -> None:
    """One row of legend entries starting at (x, y)."""
    font = load_font(12)
    for label, color, dashed in items:
        if dashed:
            for k in range(0, 22, 8):
                draw.line([(x + k, y + 7), (x + k + 4, y + 7)], fill=color, width=2)
        else:
            draw.line([(x, y + 7), (x + 22, y + 7)], fill=color, width=3)
        draw.text((x + 28, y), label, fill=TEXT, font=font)
        x += 28 + int(draw.textlength(label, font=font)) + 22


def _variant(key: str) -> str:
    return key.split(":", 1)[0].split("@", 1)[0]


def _save(img: Image.Image, path: Union[str, Path]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, optimize=True)
    return path


# --- the figures -----------------------------------------------------------------------------


def acceptance_histograms(hists: Dict[str, Dict[int, int]], path: Union[str, Path],
                          title: str = "Tokens committed per forward pass") -> Path:
    """One panel per method: the fraction of verification passes committing n tokens."""
    panels = [(label, h) for label, h in hists.items() if h]
    if not panels:
        raise ValueError("no acceptance data to plot")
    xmax = max(max(h) for _, h in panels)
    xmax = max(8, xmax)
    width, panel_h = 760, 190
    img = Image.new("RGB", (width, 40 + panel_h * len(panels) + 30), WHITE)
    ImageDraw.Draw(img).text((16, 10), title, fill=TEXT, font=load_font(15))
    ymax = max(max(h.values()) / sum(h.values()) for _, h in panels)
    ymax = min(1.0, math.ceil(ymax * 10 + 0.5) / 10)
    for k, (label, h) in enumerate(panels):
        total = sum(h.values())
        top = 40 + k * panel_h + 28
        ax = Axes(img, (76, top, width - 20, top + panel_h - 70), (0.5, xmax + 0.5), (0.0, ymax),
                  title=label, xlabel="tokens committed in one pass" if k == len(panels) - 1 else "",
                  ylabel="passes")
        step = 1 if xmax <= 20 else (4 if xmax <= 72 else 8)
        ax.frame([x for x in range(1, xmax + 1) if x == 1 or x % step == 0],
                 _nice_ticks(0, ymax, 4), yfmt=lambda v: f"{100 * v:.0f}%")
        color = VARIANT_COLORS.get(_variant(label.split(" ")[0].lower()), VARIANT_COLORS["sjd-pac"])
        for n, c in h.items():
            ax.bar(n - 0.42, n + 0.42, c / total, color)
        mean = sum(n * c for n, c in h.items()) / total
        note = f"1 token: {100 * h.get(1, 0) / total:.0f}% of passes   mean {mean:.2f}   passes {total}"
        ax.text(xmax + 0.5, ymax, note, MUTED, anchor="ra")
    return _save(img, path)


def locality_curve(tv: Sequence[float], path: Union[str, Path], row_length: Optional[int] = None,
                   title: str = "Locality: how far a changed token moves the next distributions") -> Path:
    """tv[d-1] = mean total variation of p_{i+d} after changing the token at i."""
    d = list(range(1, len(tv) + 1))
    img = Image.new("RGB", (760, 340), WHITE)
    ymax = max(tv) * 1.15 if tv and max(tv) > 0 else 1.0
    ax = Axes(img, (76, 50, 740, 280), (0.5, len(tv) + 0.5), (0.0, ymax), title=title,
              xlabel="distance d (tokens after the changed one)", ylabel="TV of p(i+d)")
    ax.frame([x for x in d if x == 1 or x % 4 == 0])
    if row_length:
        for r in range(1, len(tv) // row_length + 1):
            ax.vline(r * row_length, MUTED)
            ax.text(r * row_length + 0.3, ymax * 0.97, f"{r} row{'s' if r > 1 else ''} below", MUTED)
    ax.line(d, tv, VARIANT_COLORS["sjd-pac"])
    return _save(img, path)


def compression_vs_window(summary: Dict[str, dict], path: Union[str, Path]) -> Path:
    """Left: step compression against L per variant; right: latency speedup over AR.
    window='auto' is drawn as a dashed horizontal line in its variant's colour."""
    fixed: Dict[str, List[Tuple[int, dict]]] = {}
    auto: Dict[str, dict] = {}
    for key, row in summary.items():
        head, _, modifiers = key.partition(":")  # e.g. sjd-pac@32:gumbel -> its own line
        variant, _, window = head.partition("@")
        variant = f"{variant}:{modifiers}" if modifiers else variant
        if window == "auto":
            auto[variant] = row
        elif window:
            fixed.setdefault(variant, []).append((int(window), row))
    if not fixed and not auto:
        raise ValueError("no windowed methods to plot")
    windows = sorted({w for pts in fixed.values() for w, _ in pts}) or [16, 64]
    lo, hi = windows[0] / 1.4, windows[-1] * 1.4
    img = Image.new("RGB", (900, 420), WHITE)
    draw = ImageDraw.Draw(img)
    for col, (field, title, ylabel) in enumerate([
        ("step_compression", "Step compression (tokens per forward pass)", "x AR"),
        ("speedup_median", "Latency speedup over AR (median)", "x AR"),
    ]):
        vals = [row.get(field) for pts in fixed.values() for _, row in pts] + [r.get(field) for r in auto.values()]
        vals = [v for v in vals if v is not None]
        if not vals:
            continue
        ymax = max(vals + [1.0]) * 1.12
        x0 = 70 + col * 450
        ax = Axes(img, (x0, 50, x0 + 360, 330), (lo, hi), (0.0, ymax), xlog=True, title=title,
                  xlabel="window L", ylabel=ylabel)
        ax.frame(windows)
        ax.hline(1.0, VARIANT_COLORS["ar"], dash=3, width=1)
        for variant, pts in sorted(fixed.items()):
            pts = sorted(pts)
            ys = [row.get(field) for _, row in pts]
            if all(y is not None for y in ys):
                ax.line([w for w, _ in pts], ys, VARIANT_COLORS.get(_variant(variant), TEXT))
        for variant, row in auto.items():
            if row.get(field) is not None:
                ax.hline(row[field], VARIANT_COLORS.get(_variant(variant), TEXT))
    items = [(v.upper(), VARIANT_COLORS.get(_variant(v), TEXT), False) for v in sorted(fixed)]
    items += [(f"{v.upper()} L=auto", VARIANT_COLORS.get(_variant(v), TEXT), True) for v in auto]
    items += [("AR = 1", VARIANT_COLORS["ar"], True)]
    _legend(draw, 70, 388, items)
    return _save(img, path)


def speedup_bars(summary: Dict[str, dict], labels: Dict[str, str], path: Union[str, Path],
                 title: str = "Latency speedup over AR (median, bar = interquartile range)") -> Path:
    rows = [(k, r) for k, r in summary.items() if r.get("speedup_median") is not None]
    if not rows:
        raise ValueError("no speedups to plot (is AR in the grid?)")
    height = 60 + 28 * len(rows) + 40
    img = Image.new("RGB", (760, height), WHITE)
    draw = ImageDraw.Draw(img)
    draw.text((16, 10), title, fill=TEXT, font=load_font(15))
    xmax = max(max(r.get("speedup_q75", r["speedup_median"]) for _, r in rows) * 1.1, 1.2)
    ax = Axes(img, (190, 44, 720, 44 + 28 * len(rows)), (0.0, xmax), (len(rows), 0))
    ticks = _nice_ticks(0, xmax, 6)
    for t in ticks:
        ax.vline(t, GRID, dash=2)
        label = f"{_fmt(t)}x"
        w = draw.textlength(label, font=ax.small)
        draw.text((ax.X(t) - w / 2, ax.y1 + 6), label, fill=MUTED, font=ax.small)
    for i, (key, r) in enumerate(rows):
        color = VARIANT_COLORS.get(_variant(key), TEXT)
        y = ax.Y(i + 0.5)
        draw.rectangle([ax.X(0), y - 8, ax.X(r["speedup_median"]), y + 8], fill=color)
        if "speedup_q25" in r:
            draw.line([(ax.X(r["speedup_q25"]), y), (ax.X(r["speedup_q75"]), y)], fill=TEXT, width=2)
            for q in (r["speedup_q25"], r["speedup_q75"]):
                draw.line([(ax.X(q), y - 5), (ax.X(q), y + 5)], fill=TEXT, width=2)
        label = labels.get(key, key)
        w = draw.textlength(label, font=ax.font)
        draw.text((ax.x0 - w - 8, y - 8), label, fill=TEXT, font=ax.font)
        draw.text((ax.X(max(r.get("speedup_q75", 0), r["speedup_median"])) + 6, y - 7),
                  f"{r['speedup_median']:.2f}x", fill=TEXT, font=ax.small)
    ax.vline(1.0, AXIS)
    return _save(img, path)
