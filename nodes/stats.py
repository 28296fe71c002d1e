"""SJD Stats: SJD_STATS -> a plot (IMAGE) and a text summary (STRING), drawn with PIL."""

from __future__ import annotations

from typing import List, Optional, Tuple

from PIL import Image, ImageDraw, ImageFont

from sjd_pac_core.settings import auto_budget_line, settings_line

from . import speedup
from .datatypes import SJD_STATS, SJDStats
from .decode import pil_to_image

METHOD_NAMES = {"ar": "AR", "sjd": "SJD", "sjd_pac": "SJD-PAC"}

BG, FG, GRID = (24, 24, 28), (225, 225, 230), (70, 70, 80)
BAR, LINE, ACCENT = (90, 160, 240), (250, 170, 60), (120, 210, 140)


def summarize(stats: SJDStats, baseline: Optional[SJDStats]) -> str:
    name = METHOD_NAMES.get(stats.method, stats.method)
    lengths = stats.accept_lengths
    lines = [f"warning: {note}" for note in stats.notes]
    lines += [
        f"{name} on {stats.model_name}, seed {stats.seed}, {stats.resolution}, {len(stats.runs)} image(s)",
        f"settings: {settings_line(stats.config, stats.threads)}",
    ]
    picked = auto_budget_line(stats.config, [r.envelope for run in stats.runs for r in run.records])
    if picked:  # what 'auto' chose, which the settings line cannot say
        lines.append(picked)
    lines += [
        f"forward passes: {stats.forward_passes} for {stats.tokens_committed} tokens = "
        f"{stats.step_compression:.2f} tokens per forward pass (plain AR: 1)",
        f"accepted per pass: mean {stats.step_compression:.2f}, longest {max(lengths, default=0)}",
        f"wall time: {stats.wall_time:.2f} s ({sum(r.forward_time for r in stats.runs):.2f} s in the "
        f"model), {stats.tokens_committed / max(stats.wall_time, 1e-9):.1f} tokens/s",
    ]
    if stats.method == "ar":
        lines.append("speedup: this is the AR baseline (1.00x).")
    elif baseline is None:
        lines.append("speedup: no AR run of the same prompt, seed and settings yet; add a sampler with "
                     "method ar (or connect its stats to ar_baseline) to measure it.")
    else:
        wall = baseline.wall_time / max(stats.wall_time, 1e-9)
        passes = baseline.forward_passes / max(stats.forward_passes, 1)
        lines.append(f"speedup vs AR: {wall:.2f}x wall time ({baseline.wall_time:.2f} s -> "
                     f"{stats.wall_time:.2f} s), {passes:.2f}x fewer forward passes")
        if baseline.baseline_key != stats.baseline_key:
            lines.append("note: the AR baseline ran a different prompt, seed or settings.")
        elif stats.config.verify == "gumbel" and baseline.config.verify == "gumbel":
            same = baseline.tokens.shape == stats.tokens.shape and bool((baseline.tokens == stats.tokens).all())
            lines.append(f"tokens identical to AR (gumbel, seed-exact): {'yes' if same else 'NO'}")
    return "\n".join(lines)


def _axes(draw: ImageDraw.ImageDraw, box: Tuple[int, int, int, int], title: str, font) -> None:
    x0, y0, x1, y1 = box
    draw.rectangle(box, outline=GRID)
    for i in range(1, 4):
        y = y1 - (y1 - y0) * i // 4
        draw.line([(x0, y), (x1, y)], fill=GRID)
    draw.text((x0, y0 - 14), title, fill=FG, font=font)


def _bars(draw, box, values: List[float], top: float, color) -> None:
    x0, y0, x1, y1 = box
    n = max(1, len(values))
    width = (x1 - x0 - 2) / n
    for i, v in enumerate(values):
        h = (y1 - y0 - 2) * (v / top if top > 0 else 0)
        left = x0 + 1 + i * width
        draw.rectangle([left, y1 - 1 - h, max(left, left + width - (1 if width > 3 else 0)), y1 - 1], fill=color)


def render_plot(stats: SJDStats, width: int = 768, height: int = 384) -> Image.Image:
    """Left: acceptance-length histogram. Right: tokens accepted per pass, running step compression."""
    image = Image.new("RGB", (width, height), BG)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    name = METHOD_NAMES.get(stats.method, stats.method)
    draw.text((12, 8), f"{name}: {stats.forward_passes} passes, {stats.tokens_committed} tokens, "
                       f"step compression {stats.step_compression:.2f}x, {stats.wall_time:.2f} s",
              fill=FG, font=font)
    lengths = stats.accept_lengths
    mid = width * 2 // 5
    left = (40, 50, mid - 16, height - 40)
    right = (mid + 30, 50, width - 16, height - 40)

    # Histogram of acceptance lengths.
    hist = {}
    for n in lengths:
        hist[n] = hist.get(n, 0) + 1
    longest = max(hist, default=1)
    counts = [hist.get(i, 0) for i in range(1, longest + 1)]
    top = max(counts, default=1)
    _axes(draw, left, "passes by tokens accepted (histogram)", font)
    _bars(draw, left, counts, top, BAR)
    draw.text((left[0], left[3] + 4), "1", fill=FG, font=font)
    draw.text((left[2] - 18, left[3] + 4), str(longest), fill=FG, font=font)
    draw.text((left[0] - 30, left[1]), str(top), fill=FG, font=font)

    # Accepted per pass, with the running step compression as a line on the same scale.
    _axes(draw, right, "tokens accepted per pass (bars), running step compression (line)", font)
    peak = max(lengths, default=1)
    _bars(draw, right, lengths, peak, ACCENT)
    if lengths:
        x0, y0, x1, y1 = right
        step = (x1 - x0 - 2) / len(lengths)
        total, points = 0, []
        for i, n in enumerate(lengths):
            total += n
            running = total / (i + 1)
            points.append((x0 + 1 + (i + 0.5) * step, y1 - 1 - (y1 - y0 - 2) * min(running / peak, 1.0)))
        if len(points) > 1:
            draw.line(points, fill=LINE, width=2)
        else:
            draw.ellipse([points[0][0] - 2, points[0][1] - 2, points[0][0] + 2, points[0][1] + 2], fill=LINE)
    draw.text((right[0] - 24, right[1]), str(peak), fill=FG, font=font)
    draw.text((right[0], right[3] + 4), "pass 1", fill=FG, font=font)
    draw.text((right[2] - 60, right[3] + 4), f"pass {len(lengths)}", fill=FG, font=font)
    draw.text((12, height - 18), f"seed {stats.seed}  {stats.resolution}  {stats.model_name}  "
                                 f"verify {stats.config.verify}", fill=GRID, font=font)
    return image


class SJDStatsNode:
    DESCRIPTION = (
        "Shows how a sampler run went: the acceptance-length histogram, tokens accepted per pass, "
        "step compression, wall time, and the speedup over an AR run of the same job in this graph."
    )
    CATEGORY = "sjd-pac"
    SEARCH_ALIASES = ["speculative decoding", "speedup", "acceptance length", "step compression"]
    RETURN_TYPES = ("IMAGE", "STRING")
    RETURN_NAMES = ("plot", "summary")
    OUTPUT_TOOLTIPS = ("The plot, for Preview Image or Save Image.", "The summary as text.")
    FUNCTION = "report"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls) -> dict:
        return {
            "required": {
                "stats": (SJD_STATS, {"tooltip": "Statistics from SJD-PAC Sampler or SJD-PAC Text to Image."}),
            },
            "optional": {
                "ar_baseline": (SJD_STATS, {
                    "tooltip": "Optional: stats of a sampler with method ar and the same prompt, seed and "
                               "settings, for the speedup. Unconnected, the last such AR run is used if any.",
                }),
            },
        }

    def report(self, stats: SJDStats, ar_baseline: Optional[SJDStats] = None) -> dict:
        if ar_baseline is not None and ar_baseline.method != "ar":
            raise ValueError(
                f"ar_baseline comes from a {ar_baseline.method} run; connect the stats of a sampler whose "
                "method is ar, or leave ar_baseline unconnected."
            )
        baseline = ar_baseline if ar_baseline is not None else speedup.baseline_for(stats)
        text = summarize(stats, baseline)
        plot = pil_to_image([render_plot(stats)])
        return {"ui": {"text": [text]}, "result": (plot, text)}
