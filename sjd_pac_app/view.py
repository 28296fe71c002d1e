"""What the page shows, as HTML and Markdown strings built from plain values (run summaries,
run records, a model's defaults): no gradio here, so it renders and tests without a server."""

from __future__ import annotations

import html
import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

import sjd_pac_core as sp
from sjd_pac_core.config import MAX_TREE_NODES
from sjd_pac_core.settings import record_config, settings_line

from .runner import METHOD_LABELS, device_label, prompt_words, run_threads

METHODS: Tuple[str, ...] = ("ar", "sjd", "sjd_pac")
STATUS_LABELS = {
    "idle": "Ready", "waiting": "Waiting", "loading": "Loading model", "progress": "Running", "finished": "Finished",
    "stopped": "Stopped", "failed": "Failed", "skipped": "Not run",
}


# The cards' titles: the charts' method colours, darkened to >= 4.5:1 on white (WCAG AA).
TITLE_COLORS = {"ar": "#374151", "sjd": "#1d4ed8", "sjd_pac": "#c2410c"}


def hints(d: sp.FamilyDefaults) -> Dict[str, str]:
    """Tooltips (gradio's `info`); the numbers in them are the loaded model's own defaults."""
    return {
        "cfg_scale": f"classifier-free guidance; 1 = off; this model's default {d.cfg_scale:g}",
        "temperature": f"this model's default {d.temperature:g}; lower = safer, higher = more varied",
        "top_k": f"0 = off; this model's default {d.top_k or 0}",
        "top_p": f"1 = off; this model's default {d.top_p or 1:g}",
        "window": f"L: draft tokens verified per forward pass; 'auto' picks L from measured speed; "
                  f"this model's default {d.window}. L = 1 commits at most 2 tokens per pass.",
        "tree_depth": f"SJD-PAC's drafting tree after a rejection (1 = none): K + K^2 + ... + K^(D-1) tokens, "
                 f"so the cost grows as K^(D-1); at most {MAX_TREE_NODES}, so the top of D follows K; "
                 f"this model's default {d.tree_depth}",
        "tree_width": f"candidates per tree position; the top of K follows D; this model's default {d.tree_width}",
        "node_budget": "SJD-PAC drafts every pass within this many nodes, its tree and L chosen each pass (L caps "
                       "the main chain: use L = auto or a large L); 0 = off, 'auto' picks it from measured pass "
                       "costs. A GPU pass costs about one token's up to ~128 nodes (with CFG a node is two rows).",
        "seed": "-1 = a new random seed each run (the seed used is shown with the result)",
        "method": "All three sample exactly AR's distribution. AR: one token per forward pass. SJD: "
                  "verifies L drafts per pass. SJD-PAC: SJD plus adaptive continuation and a drafting "
                  "tree, for fewer forward passes; which is faster on the clock depends on the device "
                  "(Compare measures it).",
        "verify": "gumbel: the same seed gives the very same picture with every method; rejection: "
                  "an equally exact sample, different per method (with L = auto, different per run too)",
    }


def small_images(d: sp.FamilyDefaults) -> bool:
    """Whether the model's pictures are small (the demo's 64x64), shown enlarged without smoothing."""
    try:
        return bool(d.resolutions) and max(int(v) for v in d.resolution.lower().split("x")) < 256
    except ValueError:
        return False


def words_md(model: Optional[sp.ARImageModel]) -> str:
    words = prompt_words(model)
    if not words:
        return ""
    return "Words this model knows (another word is an error that names it): " + ", ".join(words)


# --- rendering -----------------------------------------------------------------------------------

def _fmt_time(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds < 60 else f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def run_line(summary: Dict[str, Any]) -> str:
    """'Seed 42 (random) · method sjd_pac, window L 32, ..., 1 CPU thread': the seed and the run
    record's settings in the words the CLI and SJD Stats use (settings.settings_line)."""
    record = summary.get("settings")
    if not record:
        return ""
    seed = "random" if record["seed"] is None else record["seed"]
    parts = [f'Seed {seed}{" (random)" if record["random_seed"] and record["seed"] is not None else ""}',
             settings_line(record_config(record), record["threads"])]
    if record["threads"] is None:  # off the CPU: name the device
        parts.append(record["device"])
    if summary.get("budget_picked"):  # node budget 'auto': what it picked
        parts.append(summary["budget_picked"])
    return " · ".join(html.escape(str(p)) for p in parts)


def stats_html(summary: Dict[str, Any]) -> str:
    """The live numbers as cards; `data-status` lets scripts (and the browser test) wait for a run."""
    status = summary.get("status", "idle")
    done = summary.get("tokens_committed", 0)
    total = summary.get("num_tokens", 0)
    pct = 100.0 * done / total if total else 0.0
    passes = summary.get("forward_passes")
    compression = summary.get("step_compression")
    tps = summary.get("tokens_per_second")
    method = METHOD_LABELS.get(summary.get("method", ""), "")

    def card(label: str, value: str, sub: str = "", extra: str = "", cls: str = "") -> str:
        return (f'<div class="stat"><div class="label">{label}</div>'
                f'<div class="value {cls}">{value}</div>{extra}'
                f'{f"<div class=sub>{sub}</div>" if sub else ""}</div>')

    cards = [
        card("Status", STATUS_LABELS.get(status, status.title()),
             "in the queue for the sampler" if status == "waiting" else method, cls="status"),
        card("Tokens", f"{done} / {total}" if total else "–",
             extra=f'<div class="track"><div class="fill" style="width:{pct:.1f}%"></div></div>'),
        card("Forward passes", str(passes) if passes is not None else "–",
             f"AR needs {total}" if total else ""),
        card("Step compression", f"{compression:.2f}×" if compression else "–", "tokens per forward pass"),
        card("Tokens / s", f"{tps:.1f}" if tps else "–", "sampler time"),
        card("Elapsed", _fmt_time(summary.get("elapsed", 0.0)) if status != "idle" else "–", "wall clock"),
    ]
    line = run_line(summary)
    warnings = "".join(f'<div class="warn">⚠ {html.escape(w)}</div>' for w in summary.get("warnings", ()))
    below = f'<div class="run-line">{line}{warnings}</div>' if line or warnings else ""
    return (f'<div class="stat-grid status-{status}" data-status="{status}" '
            f'data-passes="{passes if passes is not None else ""}">{"".join(cards)}</div>{below}')


def live_image_html(url: str, alt: str, pixelated: bool) -> str:
    """The picture of a running run, inline (plots.inline_image), in the box the image panel has."""
    cls = ' class="pixelated"' if pixelated else ""
    return f'<div class="live-frame"><img src="{url}" alt="{html.escape(alt)}"{cls}></div>'


def message_md(errors: Sequence[str] = (), notes: Sequence[str] = ()) -> str:
    lines = [f'<div class="error-line">⚠ {html.escape(e)}</div>' for e in errors]
    lines += [f'<div class="note-line">{html.escape(n)}</div>' for n in notes]
    return "\n".join(lines)


def model_info_html(model: Optional[sp.ARImageModel], error: str = "") -> str:
    if model is None:
        device = device_label()
        body = f'<span class="err">{html.escape(error)}</span>' if error else "No model loaded."
        return f'<div class="model-info"><span class="chip">{html.escape(device)}</span> {body}</div>'
    device = device_label(model.device, run_threads(model))
    gpu = " gpu" if model.device.type != "cpu" else ""
    res = ", ".join(model.defaults.resolutions)
    return (
        f'<div class="model-info"><span class="chip{gpu}">{html.escape(device)}</span>'
        f'<span class="chip">model: {html.escape(model.name or "?")}</span>'
        f'<span class="chip">family: {html.escape(model.family)}</span>'
        f'<span class="chip">{html.escape(res)}</span>'
        + memory_chip(model) + "</div>"
    )


def memory_chip(model: sp.ARImageModel) -> str:
    """The load's memory plan (precision, GB needed and free), one line; none for the demo model."""
    plan = getattr(model, "memory_plan", None)
    if plan is None:
        return ""
    return f'<span class="chip" title="{html.escape(plan.table())}">{html.escape(plan.one_line(model.quantize))}</span>'


def compare_card(method: str, summary: Optional[Dict[str, Any]]) -> str:
    title = f'<h4 style="color:{TITLE_COLORS[method]}">{METHOD_LABELS[method]}</h4>'
    if summary is None:
        return f'<div class="card" data-status="waiting">{title}<span class="sub">waiting</span></div>'
    status = summary["status"]
    rows: List[Tuple[str, str]] = []
    if status == "progress":
        rows.append(("running", f'{summary.get("tokens_committed", 0)} / {summary.get("num_tokens", 0)} tokens'))
        rows.append(("forward passes", str(summary.get("forward_passes", 0))))
    elif status == "finished":
        times = summary.get("wall_times", [summary["wall_time"]])
        label = f"wall time (median of {len(times)})" if len(times) > 1 else "wall time (1 run)"
        rows.append((label, _fmt_time(statistics.median(times))))
        rows.append(("forward passes", str(summary["forward_passes"])))
        rows.append(("step compression", f'{summary["step_compression"]:.2f}×'))
        speedup = summary.get("speedup_vs_ar")
        rows.append(("speedup over AR", "1.00×" if method == "ar" else
                     (f"{speedup:.2f}×" if speedup else "–")))
        same = summary.get("identical_to_ar")
        if method == "ar":
            rows.append(("identical to AR", "reference"))
        elif same is not None:
            rows.append(("identical to AR", f'<span class="{"yes" if same else "no"}">'
                                            f'{"yes" if same else "no"}</span>'))
        if summary.get("timing"):
            rows.append(("timing", summary["timing"]))
    else:
        rows.append(("status", STATUS_LABELS.get(status, status)))
    table = "".join(f'<tr><td>{k}</td><td class="v">{v}</td></tr>' for k, v in rows)
    return f'<div class="card" data-status="{status}">{title}<table>{table}</table></div>'


def compare_summary_html(summaries: Dict[str, Dict[str, Any]], verify: str, seed: int, status: str,
                         repeats: int = 1) -> str:
    if status == "waiting":
        return f'<div data-status="{status}">Waiting in the queue for the sampler…</div>'
    if status != "finished":
        return f'<div data-status="{status}"></div>'
    parts = []
    for m in ("sjd", "sjd_pac"):
        s = summaries.get(m)
        if s and s.get("speedup_vs_ar"):
            parts.append(f'<b>{METHOD_LABELS[m]}</b> {s["speedup_vs_ar"]:.2f}×')
    same = [f'{METHOD_LABELS[m]}: {"yes" if summaries[m].get("identical_to_ar") else "no"}'
            for m in ("sjd", "sjd_pac") if m in summaries]
    if repeats > 1:
        how = (f"median wall time of {repeats} interleaved runs per method; wall times vary with the "
               "machine's load, forward passes do not")
    else:
        how = ("one run per method: a single wall-clock measurement is noisy (set Repeats to 3 or more); "
               "the forward-pass counts are exact")
    text = (f'Seed {seed}, {verify} verification. Speedup over AR on the clock: ' + ", ".join(parts)
            + f" ({how}). Tokens identical to AR — " + ", ".join(same) + ".")
    if verify == "rejection":
        text += (" Rejection verification is exact in distribution, not per seed, so the images may "
                 "differ; choose gumbel for a token-identical comparison.")
    return f'<div data-status="finished">{text}</div>'
