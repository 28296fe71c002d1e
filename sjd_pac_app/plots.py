"""Charts for the app, drawn with PIL so the app needs no plotting library and every live
update is one small PNG (cheap to stream, looks the same in every browser)."""

from __future__ import annotations

import base64
import io
import math
from typing import Dict, List, Sequence, Tuple

from PIL import Image, ImageDraw, ImageFont

Color = Tuple[int, int, int]

BACKGROUND: Color = (255, 255, 255)
GRID: Color = (229, 231, 235)
AXIS: Color = (107, 114, 128)
TEXT: Color = (55, 65, 81)
METHOD_COLORS: Dict[str, Color] = {
    "ar": (107, 114, 128),  # grey: the baseline
    "sjd": (59, 130, 246),  # blue
    "sjd_pac": (234, 88, 12),  # orange: the method this project is about
}
MEAN_COLOR: Color = (22, 163, 74)

CHART_SIZE = (760, 240)  # the per-pass chart spans the page
HIST_SIZE = (440, 340)  # the histogram sits next to the square image
DISPLAY_SIZE = 512  # the side the image panels aim for (the demo's 64x64 -> 512, nearest)
_MARGIN = (46, 14, 14, 34)  # left, top, right, bottom: room for tick labels


def _font(size: int = 12) -> ImageFont.ImageFont:
    # Pillow >= 10.1 ships a scalable default font; older ones fall back to the bitmap font.
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # pragma: no cover - old Pillow
        return ImageFont.load_default()


def upscale_for_display(image: Image.Image, target: int = DISPLAY_SIZE) -> Image.Image:
    """Small images (the demo's 64x64) grow by a whole factor with NEAREST so every token's
    patch stays sharp; large ones shrink to at most 512 px so streaming stays cheap."""
    side = max(image.size)
    if side < 256:
        factor = max(1, round(target / side))
        return image.resize((image.width * factor, image.height * factor), Image.NEAREST)
    if side > 512:
        scale = 512 / side
        return image.resize((round(image.width * scale), round(image.height * scale)), Image.BILINEAR)
    return image


def inline_image(image: Image.Image) -> str:
    """The picture as a data: URL, so it travels in the same page update as the numbers it goes
    with (an image file is fetched by the browser on its own, on a connection that busy tabs may
    all hold, and then lags the counter). Small pictures (the demo's 64x64) go as PNG at their own
    size, which the page enlarges without smoothing; large ones as JPEG of at most 512 px."""
    buffer = io.BytesIO()
    if max(image.size) < 256:
        image.save(buffer, format="PNG")
        kind = "png"
    else:
        upscale_for_display(image).convert("RGB").save(buffer, format="JPEG", quality=85)
        kind = "jpeg"
    return f"data:image/{kind};base64,{base64.b64encode(buffer.getvalue()).decode('ascii')}"


def placeholder_image(size: int = DISPLAY_SIZE, text: str = "") -> Image.Image:
    """A neutral square shown before a preview exists (or for families without preview)."""
    img = Image.new("RGB", (size, size), (243, 244, 246))
    if text:
        draw = ImageDraw.Draw(img)
        font = _font(14)
        w = draw.textlength(text, font=font)
        draw.text(((size - w) / 2, size / 2 - 8), text, fill=AXIS, font=font)
    return img


def _nice_max(value: float) -> int:
    """A round axis maximum at or above value (1, 2, 5, 10, 20, 50, ...)."""
    value = max(value, 1.0)
    exp = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * exp >= value:
            return int(step * exp)
    return int(10 * exp)  # pragma: no cover


def _ticks(top: int, count: int = 4) -> List[int]:
    step = max(1, _nice_max(top / count))
    return list(range(0, top + 1, step))


class _Axes:
    """A plot area with a y axis from 0 to y_max and x in data units [x_min, x_max)."""

    def __init__(self, size: Tuple[int, int], y_max: int, x_min: float, x_max: float) -> None:
        self.image = Image.new("RGB", size, BACKGROUND)
        self.draw = ImageDraw.Draw(self.image)
        self.font = _font(12)
        left, top, right, bottom = _MARGIN
        self.box = (left, top, size[0] - right, size[1] - bottom)
        self.y_max, self.x_min, self.x_max = y_max, x_min, max(x_max, x_min + 1e-9)
        for tick in _ticks(y_max):
            y = self.y(tick)
            self.draw.line([(self.box[0], y), (self.box[2], y)], fill=GRID)
            label = str(tick)
            w = self.draw.textlength(label, font=self.font)
            self.draw.text((self.box[0] - 6 - w, y - 7), label, fill=TEXT, font=self.font)
        self.draw.line([(self.box[0], self.box[3]), (self.box[2], self.box[3])], fill=AXIS)
        self.draw.line([(self.box[0], self.box[1]), (self.box[0], self.box[3])], fill=AXIS)

    def x(self, value: float) -> float:
        frac = (value - self.x_min) / (self.x_max - self.x_min)
        return self.box[0] + frac * (self.box[2] - self.box[0])

    def y(self, value: float) -> float:
        frac = min(value, self.y_max) / self.y_max
        return self.box[3] - frac * (self.box[3] - self.box[1])

    def bar(self, x0: float, x1: float, height: float, color: Color) -> None:
        left, right = self.x(x0), self.x(x1)
        if right - left >= 3:  # leave a gap between wide bars, none between 1-px ones
            right -= 1
        bottom = self.box[3] - 1
        top = min(self.y(height), bottom)  # a short bar under a tall axis is still 1 px high
        self.draw.rectangle([left, top, max(left, right - 1), bottom], fill=color)

    def hline(self, value: float, color: Color, label: str, dashed: bool = False) -> None:
        y = self.y(value)
        x0, x1 = self.box[0], self.box[2]
        if dashed:
            for start in range(int(x0), int(x1), 8):
                self.draw.line([(start, y), (min(start + 4, x1), y)], fill=color, width=1)
        else:
            self.draw.line([(x0, y), (x1, y)], fill=color, width=2)
        w = self.draw.textlength(label, font=self.font)
        self.draw.rectangle([x1 - w - 6, y - 15, x1, y - 2], fill=BACKGROUND)
        self.draw.text((x1 - w - 3, y - 15), label, fill=color, font=self.font)

    def x_label(self, text: str) -> None:
        w = self.draw.textlength(text, font=self.font)
        mid = (self.box[0] + self.box[2]) / 2
        self.draw.text((mid - w / 2, self.box[3] + 16), text, fill=TEXT, font=self.font)

    def x_tick(self, value: float, label: str) -> None:
        x = self.x(value)
        self.draw.line([(x, self.box[3]), (x, self.box[3] + 3)], fill=AXIS)
        w = self.draw.textlength(label, font=self.font)
        self.draw.text((x - w / 2, self.box[3] + 3), label, fill=TEXT, font=self.font)

    def note(self, text: str) -> None:
        w = self.draw.textlength(text, font=self.font)
        mid_x = (self.box[0] + self.box[2]) / 2
        mid_y = (self.box[1] + self.box[3]) / 2
        self.draw.text((mid_x - w / 2, mid_y - 7), text, fill=AXIS, font=self.font)


def tokens_per_pass_chart(
    accept_lengths: Sequence[int], method: str = "sjd_pac", size: Tuple[int, int] = CHART_SIZE,
    min_passes: int = 24,
) -> Image.Image:
    """Bars: image tokens committed by each forward pass (prefill = pass 0); lines: plain AR's
    one token per pass and this run's mean (the step compression)."""
    n = len(accept_lengths)
    color = METHOD_COLORS.get(method, METHOD_COLORS["sjd_pac"])
    width_px = size[0] - _MARGIN[0] - _MARGIN[2]
    if n <= width_px:
        bars = [(i, i + 1, float(v)) for i, v in enumerate(accept_lengths)]
    else:  # thousands of AR passes: one bar per pixel column, the bin's mean
        per = n / width_px
        bars = []
        for col in range(width_px):
            lo, hi = int(col * per), max(int((col + 1) * per), int(col * per) + 1)
            chunk = accept_lengths[lo:hi]
            bars.append((lo, hi, sum(chunk) / len(chunk)))
    y_max = _nice_max(max((b[2] for b in bars), default=1) * 1.15)
    span = max(n, min_passes, 1)
    axes = _Axes(size, y_max, 0, span)
    if n == 0:
        axes.note("waiting for the first forward pass")
        return axes.image
    for x0, x1, value in bars:
        axes.bar(x0, x1, value, color)
    for tick in _ticks(span, 5):
        if tick < span:
            axes.x_tick(tick + 0.5 if span <= 40 else tick, str(tick))
    axes.x_label("forward pass")
    mean = sum(accept_lengths) / n
    if mean > 1.05:
        axes.hline(1, AXIS, "AR: 1 token/pass", dashed=True)
    axes.hline(mean, MEAN_COLOR, f"mean {mean:.2f} tokens/pass")
    return axes.image


def histogram_chart(
    histogram: Dict[int, int], method: str = "sjd_pac", size: Tuple[int, int] = HIST_SIZE,
    max_length: int = 128, min_span: int = 12,
) -> Image.Image:
    """Bars: how many forward passes committed 1, 2, 3, ... tokens."""
    color = METHOD_COLORS.get(method, METHOD_COLORS["sjd_pac"])
    clipped: Dict[int, int] = {}
    for length, count in histogram.items():  # one bar for the (rare) very long accepts
        key = min(int(length), max_length)
        clipped[key] = clipped.get(key, 0) + int(count)
    top_length = max(max(clipped, default=1), min_span)  # one lonely AR bar must not fill the plot
    y_max = _nice_max(max(clipped.values(), default=1) * 1.15)
    axes = _Axes(size, y_max, 0.5, top_length + 0.5)
    if not clipped:
        axes.note("waiting for the first forward pass")
        return axes.image
    for length, count in clipped.items():
        axes.bar(length - 0.5, length + 0.5, count, color)
        label = str(count)
        w = axes.draw.textlength(label, font=axes.font)
        if axes.x(length + 0.5) - axes.x(length - 0.5) >= w + 2:  # counts on bars wide enough
            axes.draw.text((axes.x(length) - w / 2, axes.y(count) - 15), label, fill=TEXT, font=axes.font)
    step = max(1, _nice_max(top_length / 8))
    ticks = sorted({1, *range(step, top_length + 1, step)})
    for tick in ticks:
        label = f"{tick}+" if tick == max_length and top_length == max_length else str(tick)
        axes.x_tick(tick, label)
    axes.x_label("tokens committed in one forward pass")
    return axes.image
