"""The Gradio page: a thin shell over load_model / generate_image and its per-pass callback.

SjdPacApp holds the handlers (plain generator functions, callable without a server, which is
how the tests drive them) and `build()` wires them into gr.Blocks.
"""

from __future__ import annotations

import os

# Before gradio is imported: no usage statistics, no version check, nothing leaves the machine.
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"

import html
import statistics
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import gradio as gr

import sjd_pac_core as sp
from sjd_pac_core.config import MAX_TREE_NODES, SamplerConfig, max_tree_depth, tree_node_count
from sjd_pac_core.demo import EXAMPLE_PROMPT

from . import plots
from .runner import (
    DEMO,
    METHOD_LABELS,
    JobRegistry,
    ModelManager,
    RunSettings,
    Update,
    canonical_spec,
    device_label,
    free_memory,
    friendly_error,
    pointless_setting_warnings,
    prompt_words,
    run_settings,
    run_summary,
    run_threads,
    save_image,
    stream_generation,
    tokens_identical,
)

METHODS: Tuple[str, ...] = ("ar", "sjd", "sjd_pac")
METHOD_CHOICES = [(METHOD_LABELS[m], m) for m in METHODS]
VERIFY_CHOICES = [
    ("rejection (exact in distribution)", "rejection"),
    ("gumbel (seed-exact: same tokens as AR)", "gumbel"),
]
WINDOW_CHOICES = ["auto", "8", "12", "16", "24", "32", "64", "128"]
LOCAL_SESSION = "local"  # the session key when handlers are called without a server
STATUS_LABELS = {
    "idle": "Ready", "loading": "Loading model", "progress": "Running", "finished": "Finished",
    "stopped": "Stopped", "failed": "Failed", "skipped": "Not run",
}
FALLBACK_DEFAULTS = sp.FamilyDefaults(resolutions=())  # until a model is loaded
DEFAULT_REPEATS = 3  # Compare: interleaved runs per method; the speedup is the ratio of medians
MAX_REPEATS = 10
MAX_DEPTH_FIELD = 8  # the D slider's top (the budget allows D = 6 at K = 2 and more at K = 1)
MAX_WIDTH_FIELD = 16

CSS = """
.gradio-container {max-width: 1360px !important; margin: 0 auto;}
#app-title h1 {margin-bottom: 0;}
#app-title p {margin-top: 2px;}
#device-info {padding: 6px 0;}
.model-info {font-size: 14px; line-height: 1.5;}
.model-info .chip {display: inline-block; padding: 1px 8px; margin: 0 4px 2px 0; border-radius: 999px;
  background: var(--background-fill-secondary); border: 1px solid var(--border-color-primary);}
.model-info .chip.gpu {border-color: #16a34a; color: #15803d;}
.model-info .err {color: var(--error-text-color);}
.stat-grid {display: grid; grid-template-columns: repeat(auto-fit, minmax(190px, 1fr)); gap: 8px;}
.stat {border: 1px solid var(--border-color-primary); border-radius: 10px; padding: 8px 10px;
  background: var(--background-fill-secondary); min-width: 0; overflow: hidden;}
.stat .label {font-size: 11px; text-transform: uppercase; letter-spacing: .05em; color: #374151;}
.stat .value {font-size: 19px; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; font-weight: 600;
  font-variant-numeric: tabular-nums; line-height: 1.3;}
.stat .sub {font-size: 12px; color: #374151; overflow-wrap: anywhere;}
.run-line {font-size: 13px; margin-top: 6px; color: #374151; overflow-wrap: anywhere;}
.run-line .warn {color: #b45309; font-weight: 600;}
.hint, .hint p {font-size: 13px; color: #374151 !important; margin: 0;}
.dark .hint, .dark .hint p, .dark .stat .label, .dark .stat .sub, .dark .run-line {color: #d1d5db !important;}
.dark .run-line .warn {color: #fbbf24;}
.track {height: 6px; border-radius: 3px; background: var(--border-color-primary); margin-top: 4px; overflow: hidden;}
.fill {height: 100%; background: #ea580c;}
.status-progress .value.status {color: #1d4ed8;}
.status-finished .value.status {color: #15803d;}
.status-stopped .value.status {color: #b45309;}
.status-failed .value.status {color: #b91c1c;}
#message .error-line {color: var(--error-text-color); font-weight: 600;}
.card {border: 1px solid var(--border-color-primary); border-radius: 10px; padding: 8px 12px; font-size: 14px;}
.card h4 {margin: 0 0 6px 0; font-size: 15px;}
.card table {width: 100%; border-collapse: collapse; border: none !important; margin: 0;}
.card tr, .card td {border: none !important; background: transparent !important;}
.card td {padding: 2px 0 !important; font-size: 14px;}
.card td.v {text-align: right; font-variant-numeric: tabular-nums; font-weight: 600; white-space: nowrap;}
.yes {color: #15803d;} .no {color: #b91c1c;}
#compare-summary {font-size: 15px;}
img {max-width: 100%;}
.pixel-art img {image-rendering: pixelated;}  /* small models' token patches stay sharp */
@media (max-width: 600px) {
  .gradio-container {padding-left: 8px !important; padding-right: 8px !important;}
  .stat-grid {grid-template-columns: repeat(2, minmax(0, 1fr));}
}
"""

# Ctrl+Enter (Cmd+Enter on a Mac) generates, from anywhere on the page.
HEAD = """<script>
document.addEventListener('keydown', (e) => {
  if ((e.ctrlKey || e.metaKey) && e.key === 'Enter') {
    const button = document.querySelector('#generate-btn');
    if (button) { e.preventDefault(); button.click(); }
  }
});
</script>"""


def theme() -> gr.themes.Base:
    """Gradio's Soft theme with hint and info text dark enough for WCAG AA (>= 4.5:1)."""
    return gr.themes.Soft(primary_hue="orange", secondary_hue="blue").set(
        body_text_color_subdued="*neutral_700",
        body_text_color_subdued_dark="*neutral_300",
        block_info_text_color="*neutral_700",
        block_info_text_color_dark="*neutral_300",
    )


def launch_kwargs() -> Dict[str, Any]:
    """Arguments for Blocks.launch that every start of the app shares (gradio 6 takes the
    theme, css and head here). Never share=True: the app stays on this machine; quiet, because
    gradio's banner suggests share=True (main.py prints the address itself)."""
    return dict(
        share=False,
        quiet=True,
        theme=theme(),
        css=CSS,
        head=HEAD,
        ssr_mode=False,  # no Node server
        footer_links=["api", "settings"],
    )


def session_key(request: Optional[gr.Request]) -> str:
    return getattr(request, "session_hash", None) or LOCAL_SESSION


# --- hints that follow the model ---------------------------------------------------------------

def widest_tree(depth: int, limit: int = MAX_TREE_NODES, top: int = MAX_WIDTH_FIELD) -> int:
    """The largest tree width K whose depth-`depth` tree fits the node budget."""
    width = 1
    while width < top and tree_node_count(depth, width + 1, limit) <= limit:
        width += 1
    return width


def depth_limit(width: object) -> int:
    try:
        return min(MAX_DEPTH_FIELD, max_tree_depth(max(1, int(float(width)))))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return MAX_DEPTH_FIELD


def width_limit(depth: object) -> int:
    try:
        return widest_tree(max(1, int(float(depth))))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return MAX_WIDTH_FIELD


def _fits(depth: object, width: object) -> bool:
    try:
        return tree_node_count(int(float(depth)), int(float(width))) <= MAX_TREE_NODES  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def follow_width(depth: object, width: object) -> Any:
    """K changed: D's top becomes the largest D that fits with this K (nothing changes while the
    pair is over the budget: the check names the fix)."""
    return gr.update(maximum=depth_limit(width)) if _fits(depth, width) else gr.skip()


def follow_depth(depth: object, width: object) -> Any:
    return gr.update(maximum=width_limit(depth)) if _fits(depth, width) else gr.skip()


def hints(d: sp.FamilyDefaults) -> Dict[str, str]:
    """Tooltips (gradio's `info`); the numbers in them are the loaded model's own defaults."""
    return {
        "cfg": f"classifier-free guidance; 1 = off; this model's default {d.cfg_scale:g}",
        "temperature": f"this model's default {d.temperature:g}; lower = safer, higher = more varied",
        "top_k": f"0 = off; this model's default {d.top_k or 0}",
        "top_p": f"1 = off; this model's default {d.top_p or 1:g}",
        "window": f"L: draft tokens verified per forward pass; 'auto' picks L from measured speed; "
                  f"this model's default {d.window}. L = 1 cannot beat AR.",
        "depth": f"SJD-PAC's drafting tree after a rejection (1 = none): K + K^2 + ... + K^(D-1) tokens, "
                 f"so the cost grows as K^(D-1); at most {MAX_TREE_NODES}, so the top of D follows K; "
                 f"this model's default {d.tree_depth}",
        "width": f"candidates per tree position; the top of K follows D; this model's default {d.tree_width}",
        "seed": "-1 = a new random seed each run (the seed used is shown with the result)",
        "method": "All three sample exactly AR's distribution. AR: one token per forward pass. SJD: "
                  "verifies L drafts per pass. SJD-PAC: SJD plus adaptive continuation and a drafting "
                  "tree, for fewer forward passes; which is faster on the clock depends on the device "
                  "(Compare measures it).",
        "verify": "gumbel: the same seed gives the very same picture with every method; rejection: "
                  "an equally exact sample, different per method",
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


def settings_line(summary: Dict[str, Any]) -> str:
    """'Seed 42 (random) · SJD-PAC, L 32, D 3, K 4, gumbel, CFG 2, T 0.8 · CPU, 1 thread'."""
    s = summary.get("settings")
    if not s:
        return ""
    seed = f'Seed {s["seed"]}{" (random)" if s.get("seed_was_random") else ""}'
    knobs = [METHOD_LABELS.get(s["method"], s["method"])]
    if s["method"] != "ar":
        knobs.append(f'L {s["window"]}')
    if s["method"] == "sjd_pac":
        knobs.append(f'D {s["tree_depth"]}, K {s["tree_width"]}')
    knobs += [s["verify"], f'CFG {s["cfg_scale"]:g}', f'T {s["temperature"]:g}']
    parts = [seed, ", ".join(knobs)]
    if s.get("threads"):
        parts.append(f'CPU, {s["threads"]} thread{"s" if s["threads"] != 1 else ""}'
                     if s.get("device", "cpu") == "cpu" else s["device"])
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
        card("Status", STATUS_LABELS.get(status, status.title()), method, cls="status"),
        card("Tokens", f"{done} / {total}" if total else "–",
             extra=f'<div class="track"><div class="fill" style="width:{pct:.1f}%"></div></div>'),
        card("Forward passes", str(passes) if passes is not None else "–",
             f"AR needs {total}" if total else ""),
        card("Step compression", f"{compression:.2f}×" if compression else "–", "tokens per forward pass"),
        card("Tokens / s", f"{tps:.1f}" if tps else "–", "sampler time"),
        card("Elapsed", _fmt_time(summary.get("elapsed", 0.0)) if status != "idle" else "–", "wall clock"),
    ]
    line = settings_line(summary)
    warnings = "".join(f'<div class="warn">⚠ {html.escape(w)}</div>' for w in summary.get("warnings", ()))
    below = f'<div class="run-line">{line}{warnings}</div>' if line or warnings else ""
    return (f'<div class="stat-grid status-{status}" data-status="{status}" '
            f'data-passes="{passes if passes is not None else ""}">{"".join(cards)}</div>{below}')


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
    color = "#%02x%02x%02x" % plots.METHOD_COLORS[method]
    title = f'<h4 style="color:{color}">{METHOD_LABELS[method]}</h4>'
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


def _defaults_of(model: Optional[sp.ARImageModel]) -> sp.FamilyDefaults:
    return model.defaults if model is not None else FALLBACK_DEFAULTS


# --- the app -------------------------------------------------------------------------------------

class SjdPacApp:
    """Handlers and layout. One instance serves every browser session."""

    def __init__(self, manager: ModelManager, initial_model: str = DEMO, interval: float = 0.1,
                 output_dir: Optional[str] = None) -> None:
        self.manager = manager
        self.initial_model = initial_model
        self.interval = interval  # seconds between live updates
        self.jobs = JobRegistry()
        self.startup_error = ""
        # Pictures to download: named after prompt and seed, with the settings in the PNG.
        self.output_dir = Path(output_dir) if output_dir else Path(tempfile.mkdtemp(prefix="sjd-pac-app-"))

    def preload(self) -> None:
        """Load the start model so the controls show its family's defaults; a failure is shown
        in the page instead of stopping the app."""
        try:
            self.manager.get(self.initial_model)
        except Exception as exc:
            self.startup_error = friendly_error(exc)

    # --- handlers ---------------------------------------------------------------------------
    def select_model(self, choice: str, path: str = "") -> tuple:
        """Load the chosen model; its family's defaults (and the hints that quote them) fill the
        controls."""
        spec = (path or "").strip() or choice
        try:
            model = self.manager.get(spec)
        except Exception as exc:
            message = friendly_error(exc)
            gr.Warning(message)
            return (model_info_html(self.manager.model),) + (gr.skip(),) * 11 + (message_md([message]),)
        d = model.defaults
        h = hints(d)
        return (
            model_info_html(model),
            gr.update(choices=self.manager.choices(), value=self.manager.spec),
            "",  # the path now sits in the list
            gr.update(choices=list(d.resolutions), value=d.resolution),
            gr.update(value=d.cfg_scale, info=h["cfg"]),
            gr.update(value=d.temperature, info=h["temperature"]),
            gr.update(value=d.top_k or 0, info=h["top_k"]),
            gr.update(value=d.top_p or 1.0, info=h["top_p"]),
            gr.update(value=str(d.window), info=h["window"]),
            gr.update(value=d.tree_depth, maximum=depth_limit(d.tree_width), info=h["depth"]),
            gr.update(value=d.tree_width, maximum=width_limit(d.tree_depth), info=h["width"]),
            gr.update(value=words_md(model), visible=bool(prompt_words(model))),
            message_md(notes=[f"Loaded {model.name} ({model.family}); settings set to its defaults."]),
        )

    def check(
        self, model_choice: str, model_path: str, prompt: str, negative_prompt: str, resolution: Optional[str],
        seed: object, method: str, verify: str, cfg_scale: object, temperature: object, top_k: object,
        top_p: object, window: object, tree_depth: object, tree_width: object,
        request: Optional[gr.Request] = None,
    ) -> Tuple[str, bool]:
        """Runs at once on a click, outside the queue: settings refused before any work (and
        before waiting for another tab's run), and a stop flag for the run that will queue.
        Outputs: message, ok."""
        try:
            settings = run_settings(_defaults_of(self.manager.model), prompt, negative_prompt, resolution,
                                    seed, method, verify, cfg_scale, temperature, top_k, top_p, window,
                                    tree_depth, tree_width)
        except Exception as exc:
            return message_md([friendly_error(exc)]), False
        self.jobs.submit(session_key(request))
        notes = pointless_setting_warnings(settings.config)
        return message_md(notes=notes), True

    def check_compare(
        self, model_choice: str, model_path: str, prompt: str, negative_prompt: str, resolution: Optional[str],
        seed: object, method: str, verify: str, cfg_scale: object, temperature: object, top_k: object,
        top_p: object, window: object, tree_depth: object, tree_width: object, repeats: object,
        request: Optional[gr.Request] = None,
    ) -> Tuple[str, bool]:
        """`check` for Compare: the same settings plus the repeat count."""
        try:
            check_repeats(repeats)
        except Exception as exc:
            return message_md([friendly_error(exc)]), False
        return self.check(model_choice, model_path, prompt, negative_prompt, resolution, seed, method, verify,
                          cfg_scale, temperature, top_k, top_p, window, tree_depth, tree_width, request=request)

    @staticmethod
    def gate(ok: bool) -> None:
        """Ends the click's chain when `check` refused the settings (its message is shown)."""
        if not ok:
            raise gr.Error("settings refused", visible=False, print_exception=False)

    def stop(self, request: Optional[gr.Request] = None) -> None:
        """Stop this session's run after the forward pass in flight, and its queued runs."""
        self.jobs.stop(session_key(request))

    def generate(
        self, model_choice: str, model_path: str, prompt: str, negative_prompt: str, resolution: Optional[str],
        seed: object, method: str, verify: str, cfg_scale: object, temperature: object, top_k: object,
        top_p: object, window: object, tree_depth: object, tree_width: object,
        request: Optional[gr.Request] = None,
    ) -> Iterator[tuple]:
        """One image, streamed. Outputs: tabs, image, download, per-pass chart, histogram, stats,
        message, JSON."""
        key = session_key(request)
        stop = self.jobs.begin(key)
        try:
            if stop.is_set():
                yield self._status_outputs(True, "stopped", notes=[
                    "Stopped before it started (it was waiting for another run); nothing was generated."])
                return
            setup = yield from self._setup(
                model_choice, model_path, prompt, negative_prompt, resolution, seed, method, verify,
                cfg_scale, temperature, top_k, top_p, window, tree_depth, tree_width, live=True,
            )
            if setup is None:
                return
            model, settings, encoding = setup
            record = self._record(model, settings)
            warnings = pointless_setting_warnings(settings.config)
            notes = [*warnings, *encoding.warnings]
            first = True
            for update in stream_generation(model, settings.prompt, settings.config, settings.seed, stop,
                                            settings.negative_prompt, encoding.resolution, self.interval):
                yield self._live_outputs(model, update, record, warnings, notes, select_tab=first)
                first = False
        finally:
            self.jobs.end(key, stop)

    def compare(
        self, model_choice: str, model_path: str, prompt: str, negative_prompt: str, resolution: Optional[str],
        seed: object, method: str, verify: str, cfg_scale: object, temperature: object, top_k: object,
        top_p: object, window: object, tree_depth: object, tree_width: object, repeats: object = DEFAULT_REPEATS,
        request: Optional[gr.Request] = None,
    ) -> Iterator[tuple]:
        """AR, SJD and SJD-PAC with the same prompt and seed (`method` is ignored), `repeats`
        times interleaved (AR, SJD, SJD-PAC, AR, ...) so that the speedup, a ratio of median wall
        times, is not one noisy measurement. Outputs: tabs, 3 images, 3 cards, summary, message, JSON."""
        key = session_key(request)
        stop = self.jobs.begin(key)
        try:
            if stop.is_set():
                yield self._compare_outputs({m: {"status": "skipped"} for m in METHODS}, [gr.skip()] * 3, "stopped",
                                            0, verify or "", 1, [], [
                                                "Stopped before it started (it was waiting for another run)."])
                return
            setup = yield from self._setup(
                model_choice, model_path, prompt, negative_prompt, resolution, seed, "sjd_pac", verify,
                cfg_scale, temperature, top_k, top_p, window, tree_depth, tree_width, live=False,
                repeats=repeats,
            )
            if setup is None:
                return
            model, settings, encoding = setup
            count = check_repeats(repeats)
            yield from self._compare_runs(model, settings, encoding, count, stop)
        finally:
            self.jobs.end(key, stop)

    # --- pieces -----------------------------------------------------------------------------
    def _setup(self, model_choice, model_path, prompt, negative_prompt, resolution, seed, method, verify,
               cfg_scale, temperature, top_k, top_p, window, tree_depth, tree_width, live: bool,
               repeats: object = 1):
        """Validate the settings and load the model; on a problem yield the error and return None."""
        try:
            if not live:
                check_repeats(repeats)
            spec = (model_path or "").strip() or model_choice
            # Validate against the defaults of the model that will run (empty fields take them).
            loaded = self.manager.model if self.manager.spec == canonical_spec(spec) else None
            settings = run_settings(_defaults_of(loaded), prompt, negative_prompt, resolution, seed, method,
                                    verify, cfg_scale, temperature, top_k, top_p, window, tree_depth, tree_width)
            if loaded is None:
                yield self._status_outputs(live, "loading", notes=[f"Loading {spec} …"])
            model = self.manager.get(spec)
            if loaded is None:  # re-read empty fields against the model just loaded
                settings = run_settings(model.defaults, prompt, negative_prompt, resolution, seed, method,
                                        verify, cfg_scale, temperature, top_k, top_p, window, tree_depth,
                                        tree_width)
            encoding = model.encode_prompt(settings.prompt, settings.negative_prompt, settings.resolution)
        except Exception as exc:
            message = friendly_error(exc)
            free_memory()  # a load that ran out of memory leaves half a model behind
            gr.Warning(message)
            yield self._status_outputs(live, "failed", errors=[message])
            return None
        return model, settings, encoding

    def _record(self, model: sp.ARImageModel, settings: RunSettings) -> dict:
        record = settings.record(model.name or "", run_threads(model) if model.device.type == "cpu" else None)
        record["device"] = model.device.type if model.device.type == "cpu" else device_label(model.device)
        return record

    def _status_outputs(self, live: bool, status: str, errors: Sequence[str] = (),
                        notes: Sequence[str] = ()) -> tuple:
        summary = {"status": status, "elapsed": 0.0}
        if errors:
            summary["error"] = errors[0]
        message = message_md(errors, notes)
        if live:
            return (gr.skip(),) * 5 + (stats_html(summary), message, summary)
        cards = (gr.skip(),) * 3 if status in ("loading", "progress") else tuple(
            compare_card(m, {"status": "skipped"}) for m in METHODS)
        return (gr.skip(),) * 4 + cards + (compare_summary_html({}, "", 0, status), message, summary)

    def _image_for(self, model: sp.ARImageModel, update: Update, record: dict) -> Any:
        if update.result is not None:
            image = plots.upscale_for_display(update.result.images[0])
            image.info["sjd-pac"] = _json(record)  # gradio keeps PNG text chunks
            return image
        if update.progress is None:
            return gr.skip()
        try:
            preview = model.preview(update.progress.tokens)
        except Exception:  # a preview is a nicety; never let it end a run
            preview = None
        if preview is None:
            n, total = int(update.progress.tokens.shape[-1]), update.progress.num_tokens
            return plots.placeholder_image(text=f"no preview for this family · {n}/{total} tokens")
        return plots.upscale_for_display(preview)

    def _live_outputs(self, model: sp.ARImageModel, update: Update, record: dict, warnings: Sequence[str],
                      notes: Sequence[str], select_tab: bool) -> tuple:
        summary = run_summary(update.stats, update.kind, update.elapsed,
                              {"settings": record, "seed": record["seed"], "prompt": record["prompt"]})
        if warnings:
            summary["warnings"] = list(warnings)
        errors: List[str] = []
        notes = list(notes)
        download: Any = gr.skip()
        if update.kind == "stopped":
            passes = update.stats.forward_passes if update.stats else 0
            notes.insert(0, f"Stopped after {passes} forward passes; memory freed. Generate again any time.")
        elif update.kind == "failed":
            errors.append(friendly_error(update.error, model_config(record), model.device))
            summary["error"] = errors[0]
            gr.Warning(errors[0])
        elif update.kind == "finished":
            path = save_image(update.result.images[0], record, self.output_dir)
            summary["file"] = path.name
            download = str(path)
            notes.insert(0, f"Seed {record['seed']}{' (random)' if record['seed_was_random'] else ''}: "
                            "enter it as the seed to get this picture again.")
        stats = update.stats
        method = stats.method if stats else "sjd_pac"
        lengths = stats.accept_lengths if stats else []
        total = stats.num_tokens if stats else 0
        return (
            gr.Tabs(selected="live") if select_tab else gr.skip(),
            self._image_for(model, update, record),
            download,
            plots.tokens_per_pass_chart(lengths, method, min_passes=total if method == "ar" else 24),
            plots.histogram_chart(stats.histogram() if stats else {}, method),
            stats_html(summary),
            message_md(errors, notes),
            summary,
        )

    def _compare_outputs(self, summaries: Dict[str, Dict[str, Any]], images: List[Any], overall: str,
                         seed: int, verify: str, repeats: int, errors: Sequence[str], notes: Sequence[str],
                         select_tab: bool = False, record: Optional[dict] = None) -> tuple:
        report: Dict[str, Any] = {"status": overall, "seed": seed, "verify": verify, "repeats": repeats,
                                  "methods": summaries}
        if record:
            report["settings"] = record
        if errors:
            report["error"] = errors[0]
        return (
            gr.Tabs(selected="compare") if select_tab else gr.skip(),
            *images,
            *(compare_card(m, summaries.get(m)) for m in METHODS),
            compare_summary_html(summaries, verify, seed, overall, repeats),
            message_md(errors, notes),
            report,
        )

    def _compare_runs(self, model: sp.ARImageModel, settings: RunSettings, encoding: sp.PromptEncoding,
                      repeats: int, stop) -> Iterator[tuple]:
        config, seed = settings.config, settings.seed
        record = self._record(model, settings)
        record.pop("method")
        summaries: Dict[str, Dict[str, Any]] = {}
        times: Dict[str, List[float]] = {m: [] for m in METHODS}
        tokens: Dict[str, Any] = {}
        first = True
        notes = list(encoding.warnings)
        for repeat in range(repeats):
            for method in METHODS:
                live = repeat == 0  # later repeats only time the runs: no frames
                for update in stream_generation(model, settings.prompt, config.with_(method=method), seed, stop,
                                                settings.negative_prompt, encoding.resolution, self.interval,
                                                frames=live):
                    images: List[Any] = [gr.skip()] * 3
                    if update.kind in ("progress", "finished") and live:
                        summaries[method] = run_summary(update.stats, update.kind, update.elapsed)
                        images[METHODS.index(method)] = self._image_for(model, update, record)
                    if update.kind == "finished":
                        times[method].append(update.stats.wall_time)
                        if live:
                            tokens[method] = update.result.tokens
                        self._update_timing(summaries, times, tokens, repeat, repeats)
                    if update.kind in ("stopped", "failed"):
                        errors: List[str] = []
                        if update.kind == "failed":
                            errors.append(friendly_error(update.error, config.with_(method=method), model.device))
                            gr.Warning(errors[0])
                        if live:
                            summaries[method] = run_summary(update.stats, update.kind, update.elapsed)
                        for m in METHODS:  # every card ends in a final state
                            summaries.setdefault(m, {"status": "skipped"})
                        stop_note = (f"Stopped during {METHOD_LABELS[method]}"
                                     + (f" (timing repeat {repeat + 1} of {repeats})" if not live else "")
                                     + "; memory freed.")
                        yield self._compare_outputs(summaries, images, update.kind, seed, config.verify, repeats,
                                                    errors, [stop_note] if update.kind == "stopped" else [],
                                                    record=record)
                        return
                    all_done = repeat == repeats - 1 and method == METHODS[-1] and update.kind == "finished"
                    if not live and not all_done and update.kind != "finished":
                        continue
                    yield self._compare_outputs(summaries, images, "finished" if all_done else "progress", seed,
                                                config.verify, repeats, [], notes, select_tab=first, record=record)
                    first = False

    @staticmethod
    def _update_timing(summaries: Dict[str, Dict[str, Any]], times: Dict[str, List[float]],
                       tokens: Dict[str, Any], repeat: int, repeats: int) -> None:
        """Medians of the wall times so far; identical-to-AR from the first (live) runs."""
        for m in METHODS:
            s = summaries.get(m)
            if not s or s.get("status") != "finished" or not times[m]:
                continue
            s["wall_times"] = list(times[m])
            s["wall_time_median"] = statistics.median(times[m])
            s["timing"] = (f"run {len(times[m])} of {repeats}" if len(times[m]) < repeats else "")
            if m != "ar" and times["ar"]:
                s["speedup_vs_ar"] = statistics.median(times["ar"]) / max(s["wall_time_median"], 1e-9)
                if "ar" in tokens and m in tokens:
                    s["identical_to_ar"] = tokens_identical(tokens["ar"], tokens[m])

    # --- layout -----------------------------------------------------------------------------
    def build(self) -> gr.Blocks:
        model = self.manager.model
        d = _defaults_of(model)
        h = hints(d)
        base = SamplerConfig()
        pixel_classes = ["pixel-art"] if small_images(d) else []
        choices = self.manager.choices()
        value = self.manager.spec or canonical_spec(self.initial_model)
        if all(v != value for _, v in choices):
            choices.append((value, value))

        with gr.Blocks(title="SJD-PAC", analytics_enabled=False, delete_cache=(3600, 3600)) as blocks:
            gr.Markdown(
                "# SJD-PAC\nLossless speculative Jacobi decoding for autoregressive text-to-image "
                "models — watch tokens being accepted, pass by pass.",
                elem_id="app-title",
            )
            with gr.Row(equal_height=True):
                model_dd = gr.Dropdown(choices=choices, value=value, label="Model", scale=2, min_width=160,
                                       elem_id="model-picker", allow_custom_value=True)
                model_path = gr.Textbox(label="…or a model folder", placeholder="/path/to/checkpoint",
                                        scale=3, min_width=160, elem_id="model-path")
                load_btn = gr.Button("Load", scale=0, min_width=80, elem_id="load-model")
            model_info = gr.HTML(model_info_html(model, self.startup_error), elem_id="device-info")

            prompt = gr.Textbox(label="Prompt", lines=2, elem_id="prompt",
                                value=EXAMPLE_PROMPT if model is not None
                                and model.family == "demo" else "")
            words = gr.Markdown(words_md(model), visible=bool(prompt_words(model)), elem_id="prompt-words",
                                elem_classes=["hint"])
            with gr.Row():
                gen_btn = gr.Button("Generate", variant="primary", elem_id="generate-btn", scale=2, min_width=100)
                cmp_btn = gr.Button("Compare all 3", variant="secondary", elem_id="compare-btn", scale=2,
                                    min_width=100)
                stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn", scale=1, min_width=70)
            gr.Markdown("Ctrl+Enter generates.", elem_classes=["hint"])
            message = gr.Markdown(message_md([self.startup_error] if self.startup_error else []),
                                  elem_id="message")

            with gr.Row():
                with gr.Column(scale=7, min_width=300):
                    with gr.Tabs(selected="live") as tabs:
                        with gr.Tab("Live", id="live"):
                            stats = gr.HTML(stats_html({"status": "idle"}), elem_id="run-stats")
                            with gr.Row(equal_height=True):
                                with gr.Column(scale=3, min_width=280):
                                    preview = gr.Image(plots.placeholder_image(text="press Generate"),
                                                       type="pil", format="png", label="Image", height=420,
                                                       interactive=False, elem_id="preview-image",
                                                       elem_classes=pixel_classes)
                                    download = gr.File(label="Download (512 px PNG; prompt, seed and settings inside)",
                                                       interactive=False, elem_id="download-file")
                                with gr.Column(scale=2, min_width=240):
                                    hist_chart = gr.Image(plots.histogram_chart({}), type="pil", format="png",
                                                          interactive=False, height=340,
                                                          label="Acceptance-length histogram",
                                                          elem_id="hist-chart", elem_classes=["chart"])
                            pass_chart = gr.Image(plots.tokens_per_pass_chart([]), type="pil", format="png",
                                                  interactive=False, label="Tokens accepted per forward pass",
                                                  elem_id="pass-chart", elem_classes=["chart"])
                            with gr.Accordion("Run statistics and settings (JSON)", open=False):
                                run_json = gr.JSON(label="Run statistics", elem_id="run-json")
                        with gr.Tab("Compare", id="compare"):
                            with gr.Row():
                                cmp_verify = gr.Radio(VERIFY_CHOICES, value="gumbel", label="Compare with",
                                                      info="gumbel: all three must give the very same tokens",
                                                      elem_id="compare-verify", scale=3, min_width=240)
                                repeats = gr.Number(value=DEFAULT_REPEATS, precision=None, label="Repeats",
                                                    info="interleaved runs per method; speedup = ratio of medians",
                                                    elem_id="compare-repeats", scale=1, min_width=140)
                            cmp_images, cmp_cards = [], []
                            with gr.Row():
                                for m in METHODS:
                                    with gr.Column(min_width=200):
                                        cmp_images.append(gr.Image(
                                            plots.placeholder_image(text=METHOD_LABELS[m]), type="pil",
                                            format="png", interactive=False, label=METHOD_LABELS[m],
                                            height=300, elem_id=f"compare-image-{m}",
                                            elem_classes=pixel_classes))
                                        cmp_cards.append(gr.HTML(compare_card(m, None),
                                                                 elem_id=f"compare-card-{m}"))
                            cmp_summary = gr.HTML(elem_id="compare-summary")
                            with gr.Accordion("Comparison statistics (JSON)", open=False):
                                cmp_json = gr.JSON(label="Comparison", elem_id="compare-json")

                with gr.Column(scale=4, min_width=300):
                    negative = gr.Textbox(label="Negative prompt", lines=1, elem_id="negative-prompt")
                    with gr.Row():
                        resolution = gr.Dropdown(choices=list(d.resolutions), value=d.resolutions[0]
                                                 if d.resolutions else None, label="Resolution",
                                                 elem_id="resolution", allow_custom_value=True, min_width=120)
                        # Text, not a number field: a browser's numbers lose digits above 2^53.
                        seed = gr.Textbox(value="-1", label="Seed", info=h["seed"], max_lines=1,
                                          elem_id="seed", min_width=140)
                    method = gr.Radio(METHOD_CHOICES, value=base.method, label="Method", info=h["method"],
                                      elem_id="method")
                    verify = gr.Radio(VERIFY_CHOICES, value=base.verify, label="Verification", info=h["verify"],
                                      elem_id="verify")
                    cfg = gr.Slider(0.0, 15.0, value=d.cfg_scale, step=0.1, label="CFG", info=h["cfg"],
                                    elem_id="cfg")
                    temperature = gr.Slider(0.05, 2.0, value=d.temperature, step=0.05, label="Temperature",
                                            info=h["temperature"], elem_id="temperature")
                    with gr.Row():
                        top_k = gr.Number(value=d.top_k or 0, precision=None, label="Top-k", info=h["top_k"],
                                          elem_id="top-k", min_width=120)
                        top_p = gr.Slider(0.01, 1.0, value=d.top_p or 1.0, step=0.01, label="Top-p",
                                          info=h["top_p"], elem_id="top-p", min_width=120)
                    with gr.Accordion("Speculative decoding (SJD / SJD-PAC)", open=True):
                        window = gr.Dropdown(WINDOW_CHOICES, value=str(d.window), allow_custom_value=True,
                                             label="L: window", info=h["window"], elem_id="window")
                        depth = gr.Slider(1, depth_limit(d.tree_width), value=d.tree_depth, step=1,
                                          label="D: tree depth", info=h["depth"], elem_id="tree-depth")
                        width = gr.Slider(1, width_limit(d.tree_depth), value=d.tree_width, step=1,
                                          label="K: tree width", info=h["width"], elem_id="tree-width")

            gen_inputs = [model_dd, model_path, prompt, negative, resolution, seed, method, verify, cfg,
                          temperature, top_k, top_p, window, depth, width]
            cmp_inputs = [*gen_inputs[:7], cmp_verify, *gen_inputs[8:], repeats]
            model_outputs = [model_info, model_dd, model_path, resolution, cfg, temperature, top_k, top_p,
                             window, depth, width, words, message]
            # One sampler at a time across all sessions: runs and model switches share the device.
            common = dict(concurrency_limit=1, concurrency_id="sampler")
            instant = dict(queue=False, show_progress="hidden", api_name=False)
            model_dd.input(self.select_model, [model_dd, model_path], model_outputs, api_name="load_model",
                           **common)
            load_btn.click(self.select_model, [model_dd, model_path], model_outputs, api_name=False, **common)
            model_path.submit(self.select_model, [model_dd, model_path], model_outputs, api_name=False,
                              **common)
            # The tree budget bounds D and K together: each slider's top follows the other's value.
            # preprocess=False: a value typed past the top reaches our check, which names the budget.
            width.input(follow_width, [depth, width], depth, preprocess=False, **instant)
            depth.input(follow_depth, [depth, width], width, preprocess=False, **instant)
            # A click is checked at once (outside the queue), then waits its turn for the sampler.
            # preprocess=False everywhere: the values are plain numbers and strings, and our check
            # (not the sliders' current tops) decides, with a sentence that names the fix.
            ok = gr.State(False)
            gen_check = gen_btn.click(self.check, gen_inputs, [message, ok], preprocess=False, **instant)
            gen_check.success(self.gate, ok, None, **instant).success(
                self.generate, gen_inputs, [tabs, preview, download, pass_chart, hist_chart, stats, message,
                                            run_json],
                api_name="generate", preprocess=False, **common)
            cmp_check = cmp_btn.click(self.check_compare, cmp_inputs, [message, ok], preprocess=False, **instant)
            cmp_check.success(self.gate, ok, None, **instant).success(
                self.compare, cmp_inputs, [tabs, *cmp_images, *cmp_cards, cmp_summary, message, cmp_json],
                api_name="compare", preprocess=False, **common)
            # Not queued: Stop must act while the sampler's slot is busy and on queued runs.
            stop_btn.click(self.stop, None, None, api_name="stop", queue=False, show_progress="hidden")
        blocks.queue(max_size=32)
        return blocks


def check_repeats(value: object) -> int:
    from sjd_pac_core.settings import whole_number

    count = whole_number(DEFAULT_REPEATS if value in (None, "") else value, "Repeats", "3")
    if not 1 <= count <= MAX_REPEATS:
        raise sp.ConfigError(f"Repeats must be between 1 and {MAX_REPEATS}, got {count}; try 3.")
    return count


def model_config(record: dict) -> Optional[SamplerConfig]:
    """The SamplerConfig a run record describes (for naming what ran out of memory)."""
    try:
        return SamplerConfig(method=record["method"], window=record["window"], tree_depth=record["tree_depth"],
                             tree_width=record["tree_width"])
    except Exception:
        return None


def _json(record: dict) -> str:
    import json

    return json.dumps(record, sort_keys=True)
