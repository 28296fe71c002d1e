"""The Gradio page: a thin shell over load_model / generate_image and its per-pass callback.

SjdPacApp holds the handlers (plain generator functions, callable without a server, which is
how the tests drive them) and `build()` wires them into gr.Blocks.
"""

from __future__ import annotations

import os

# Before gradio is imported: no usage statistics, no version check, nothing leaves the machine.
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"

import html
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import gradio as gr

import sjd_pac_core as sp
from sjd_pac_core.config import SamplerConfig

from . import plots
from .runner import (
    DEMO,
    METHOD_LABELS,
    JobRegistry,
    ModelManager,
    Update,
    build_config,
    canonical_spec,
    check_seed,
    device_label,
    free_memory,
    friendly_error,
    run_summary,
    stream_generation,
    tokens_identical,
)

METHODS: Tuple[str, ...] = ("ar", "sjd", "sjd_pac")
METHOD_CHOICES = [(METHOD_LABELS[m], m) for m in METHODS]
VERIFY_CHOICES = [
    ("rejection (exact in distribution)", "rejection"),
    ("gumbel (seed-exact: same tokens as AR)", "gumbel"),
]
LOCAL_SESSION = "local"  # the session key when handlers are called without a server
STATUS_LABELS = {
    "idle": "Ready", "loading": "Loading model", "progress": "Running", "finished": "Finished",
    "stopped": "Stopped", "failed": "Failed",
}
FALLBACK_DEFAULTS = sp.FamilyDefaults(resolutions=())  # until a model is loaded

CSS = """
.gradio-container {max-width: 1360px !important; margin: 0 auto;}
#app-title h1 {margin-bottom: 0;}
#app-title p {margin-top: 2px; color: var(--body-text-color-subdued);}
#device-info {padding: 6px 0;}
.model-info {font-size: 14px; line-height: 1.5;}
.model-info .chip {display: inline-block; padding: 1px 8px; margin: 0 4px 2px 0; border-radius: 999px;
  background: var(--background-fill-secondary); border: 1px solid var(--border-color-primary);}
.model-info .chip.gpu {border-color: #16a34a; color: #15803d;}
.model-info .err {color: var(--error-text-color);}
.stat-grid {display: grid; grid-template-columns: repeat(6, minmax(0, 1fr)); gap: 8px;}
@media (max-width: 900px) {.stat-grid {grid-template-columns: repeat(3, minmax(0, 1fr));}}
.hint p {font-size: 12px; color: var(--body-text-color-subdued); margin: 0;}
.stat {border: 1px solid var(--border-color-primary); border-radius: 10px; padding: 8px 12px;
  background: var(--background-fill-secondary);}
.stat .label {font-size: 11px; text-transform: uppercase; letter-spacing: .05em;
  color: var(--body-text-color-subdued);}
.stat .value {font-size: 20px; white-space: nowrap; font-weight: 600; font-variant-numeric: tabular-nums; line-height: 1.3;}
.stat .sub {font-size: 12px; color: var(--body-text-color-subdued);}
.track {height: 6px; border-radius: 3px; background: var(--border-color-primary); margin-top: 4px; overflow: hidden;}
.fill {height: 100%; background: #ea580c;}
.status-progress .value.status {color: #2563eb;}
.status-finished .value.status {color: #16a34a;}
.status-stopped .value.status {color: #d97706;}
.status-failed .value.status {color: #dc2626;}
#message .error-line {color: var(--error-text-color); font-weight: 600;}
#message .note-line {color: var(--body-text-color-subdued);}
.card {border: 1px solid var(--border-color-primary); border-radius: 10px; padding: 8px 12px; font-size: 14px;}
.card h4 {margin: 0 0 6px 0; font-size: 15px;}
.card table {width: 100%; border-collapse: collapse; border: none !important; margin: 0;}
.card tr, .card td {border: none !important; background: transparent !important;}
.card td {padding: 2px 0 !important; font-size: 14px;}
.card td.v {text-align: right; font-variant-numeric: tabular-nums; font-weight: 600; white-space: nowrap;}
.yes {color: #16a34a;} .no {color: #dc2626;}
#compare-summary {font-size: 15px;}
"""


def launch_kwargs() -> Dict[str, Any]:
    """Arguments for Blocks.launch that every start of the app shares (gradio 6 takes the
    theme and css here). Never share=True: the app stays on this machine."""
    return dict(
        share=False,
        theme=gr.themes.Soft(primary_hue="orange", secondary_hue="blue"),
        css=CSS,
        ssr_mode=False,  # no Node server
        footer_links=["api", "settings"],
    )


def session_key(request: Optional[gr.Request]) -> str:
    return getattr(request, "session_hash", None) or LOCAL_SESSION


# --- rendering -----------------------------------------------------------------------------------

def _fmt_time(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds < 60 else f"{int(seconds // 60)} min {seconds % 60:.0f} s"


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
    return (f'<div class="stat-grid status-{status}" data-status="{status}" '
            f'data-passes="{passes if passes is not None else ""}">{"".join(cards)}</div>')


def message_md(errors: Sequence[str] = (), notes: Sequence[str] = ()) -> str:
    lines = [f'<div class="error-line">⚠ {html.escape(e)}</div>' for e in errors]
    lines += [f'<div class="note-line">{html.escape(n)}</div>' for n in notes]
    return "\n".join(lines)


def model_info_html(model: Optional[sp.ARImageModel], error: str = "") -> str:
    if model is None:
        device = device_label()
        body = f'<span class="err">{html.escape(error)}</span>' if error else "No model loaded."
        return f'<div class="model-info"><span class="chip">{html.escape(device)}</span> {body}</div>'
    device = device_label(model.device)
    gpu = " gpu" if model.device.type != "cpu" else ""
    res = ", ".join(model.defaults.resolutions)
    return (
        f'<div class="model-info"><span class="chip{gpu}">{html.escape(device)}</span>'
        f'<span class="chip">model: {html.escape(model.name or "?")}</span>'
        f'<span class="chip">family: {html.escape(model.family)}</span>'
        f'<span class="chip">{html.escape(res)}</span></div>'
    )


def compare_card(method: str, summary: Optional[Dict[str, Any]]) -> str:
    color = "#%02x%02x%02x" % plots.METHOD_COLORS[method]
    title = f'<h4 style="color:{color}">{METHOD_LABELS[method]}</h4>'
    if summary is None:
        return f'<div class="card">{title}<span class="sub">waiting</span></div>'
    status = summary["status"]
    rows: List[Tuple[str, str]] = []
    if status == "progress":
        rows.append(("running", f'{summary.get("tokens_committed", 0)} / {summary.get("num_tokens", 0)} tokens'))
        rows.append(("forward passes", str(summary.get("forward_passes", 0))))
    elif status == "finished":
        rows.append(("wall time", _fmt_time(summary["wall_time"])))
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
    else:
        rows.append(("status", STATUS_LABELS.get(status, status)))
    table = "".join(f'<tr><td>{k}</td><td class="v">{v}</td></tr>' for k, v in rows)
    return f'<div class="card" data-status="{status}">{title}<table>{table}</table></div>'


def compare_summary_html(summaries: Dict[str, Dict[str, Any]], verify: str, seed: int, status: str) -> str:
    if status != "finished":
        return f'<div data-status="{status}"></div>'
    parts = []
    for m in ("sjd", "sjd_pac"):
        s = summaries.get(m)
        if s and s.get("speedup_vs_ar"):
            parts.append(f'<b>{METHOD_LABELS[m]}</b> {s["speedup_vs_ar"]:.2f}× faster than AR')
    same = [f'{METHOD_LABELS[m]}: {"yes" if summaries[m].get("identical_to_ar") else "no"}'
            for m in ("sjd", "sjd_pac") if m in summaries]
    text = f'Seed {seed}, {verify} verification. ' + "; ".join(parts) + " (measured in this run). "
    text += "Tokens identical to AR — " + ", ".join(same) + "."
    if verify == "rejection":
        text += (" Rejection verification is exact in distribution, not per seed, so the images may "
                 "differ; choose gumbel for a token-identical comparison.")
    return f'<div data-status="finished">{text}</div>'


def _defaults_of(model: Optional[sp.ARImageModel]) -> sp.FamilyDefaults:
    return model.defaults if model is not None else FALLBACK_DEFAULTS


# --- the app -------------------------------------------------------------------------------------

class SjdPacApp:
    """Handlers and layout. One instance serves every browser session."""

    def __init__(self, manager: ModelManager, initial_model: str = DEMO, interval: float = 0.1) -> None:
        self.manager = manager
        self.initial_model = initial_model
        self.interval = interval  # seconds between live updates
        self._next_preview = 0.0  # perf_counter time before which no new preview is drawn
        self.jobs = JobRegistry()
        self.startup_error = ""

    def preload(self) -> None:
        """Load the start model so the controls show its family's defaults; a failure is shown
        in the page instead of stopping the app."""
        try:
            self.manager.get(self.initial_model)
        except Exception as exc:
            self.startup_error = friendly_error(exc)

    # --- handlers ---------------------------------------------------------------------------
    def select_model(self, choice: str, path: str = "") -> tuple:
        """Load the chosen model; its family's defaults fill the controls."""
        spec = (path or "").strip() or choice
        try:
            model = self.manager.get(spec)
        except Exception as exc:
            message = friendly_error(exc)
            gr.Warning(message)
            return (model_info_html(self.manager.model),) + (gr.skip(),) * 10 + (message_md([message]),)
        d = model.defaults
        return (
            model_info_html(model),
            gr.update(choices=self.manager.choices(), value=self.manager.spec),
            "",  # the path now sits in the list
            gr.update(choices=list(d.resolutions), value=d.resolution),
            d.cfg_scale, d.temperature, d.top_k or 0, d.top_p or 1.0, d.window, d.tree_depth, d.tree_width,
            message_md(notes=[f"Loaded {model.name} ({model.family}); settings set to its defaults."]),
        )

    def stop(self, request: Optional[gr.Request] = None) -> None:
        """Stop this session's run after the forward pass in flight."""
        self.jobs.stop(session_key(request))

    def generate(
        self, model_choice: str, model_path: str, prompt: str, negative_prompt: str, resolution: Optional[str],
        seed: float, method: str, verify: str, cfg_scale: float, temperature: float, top_k: float,
        top_p: float, window: float, tree_depth: float, tree_width: float,
        request: Optional[gr.Request] = None,
    ) -> Iterator[tuple]:
        """One image, streamed. Outputs: tabs, preview, per-pass chart, histogram, stats, message, JSON."""
        key = session_key(request)
        stop = self.jobs.begin(key)
        try:
            setup = yield from self._setup(
                model_choice, model_path, prompt, negative_prompt, resolution, seed, method, verify,
                cfg_scale, temperature, top_k, top_p, window, tree_depth, tree_width, live=True,
            )
            if setup is None:
                return
            model, config, seed_value, encoding = setup
            first = True
            for update in stream_generation(model, prompt, config, seed_value, stop, negative_prompt,
                                            encoding.resolution, self.interval):
                yield self._live_outputs(model, update, encoding.warnings, select_tab=first)
                first = False
        finally:
            self.jobs.end(key, stop)

    def compare(
        self, model_choice: str, model_path: str, prompt: str, negative_prompt: str, resolution: Optional[str],
        seed: float, method: str, verify: str, cfg_scale: float, temperature: float, top_k: float,
        top_p: float, window: float, tree_depth: float, tree_width: float,
        request: Optional[gr.Request] = None,
    ) -> Iterator[tuple]:
        """AR, SJD and SJD-PAC one after the other with the same prompt and seed (`method` is
        ignored). Outputs: tabs, 3 images, 3 cards, summary, message, JSON."""
        key = session_key(request)
        stop = self.jobs.begin(key)
        try:
            setup = yield from self._setup(
                model_choice, model_path, prompt, negative_prompt, resolution, seed, method, verify,
                cfg_scale, temperature, top_k, top_p, window, tree_depth, tree_width, live=False,
            )
            if setup is None:
                return
            model, config, seed_value, encoding = setup
            yield from self._compare_runs(model, prompt, negative_prompt, config, seed_value, encoding, stop)
        finally:
            self.jobs.end(key, stop)

    # --- pieces -----------------------------------------------------------------------------
    def _setup(self, model_choice, model_path, prompt, negative_prompt, resolution, seed, method, verify,
               cfg_scale, temperature, top_k, top_p, window, tree_depth, tree_width, live: bool):
        """Validate the settings and load the model; on a problem yield the error and return None."""
        try:
            config = build_config(method if live else "sjd_pac", verify, cfg_scale, temperature, top_k,
                                  top_p, window, tree_depth, tree_width)
            seed_value = check_seed(seed)
            spec = (model_path or "").strip() or model_choice
            if self.manager.model is None or self.manager.spec != canonical_spec(spec):
                yield self._status_outputs(live, "loading", notes=[f"Loading {spec} …"])
            model = self.manager.get(spec)
            encoding = model.encode_prompt(prompt or "", negative_prompt or "", resolution or None)
        except Exception as exc:
            message = friendly_error(exc)
            free_memory()  # a load that ran out of memory leaves half a model behind
            gr.Warning(message)
            yield self._status_outputs(live, "failed", errors=[message])
            return None
        return model, config, seed_value, encoding

    def _status_outputs(self, live: bool, status: str, errors: Sequence[str] = (),
                        notes: Sequence[str] = ()) -> tuple:
        summary = {"status": status, "elapsed": 0.0}
        if errors:
            summary["error"] = errors[0]
        message = message_md(errors, notes)
        if live:
            return (gr.skip(),) * 4 + (stats_html(summary), message, summary)
        return (gr.skip(),) * 7 + (compare_summary_html({}, "", 0, status), message, summary)

    def _image_for(self, model: sp.ARImageModel, update: Update) -> Any:
        if update.result is not None:
            return plots.upscale_for_display(update.result.images[0])
        if update.progress is None or time.perf_counter() < self._next_preview:
            return gr.skip()
        start = time.perf_counter()
        try:
            preview = model.preview(update.progress.tokens)
        except Exception:  # a preview is a nicety; never let it end a run
            preview = None
        # A family whose preview decodes the whole image (large VQ decoders) would otherwise
        # compete with the sampler for the device: spend at most ~1/4 of the time on previews.
        self._next_preview = time.perf_counter() + 3 * (time.perf_counter() - start)
        if preview is None:
            n, total = int(update.progress.tokens.shape[-1]), update.progress.num_tokens
            return plots.placeholder_image(text=f"no preview for this family · {n}/{total} tokens")
        return plots.upscale_for_display(preview)

    def _live_outputs(self, model: sp.ARImageModel, update: Update, notes: Sequence[str],
                      select_tab: bool) -> tuple:
        summary = run_summary(update.stats, update.kind, update.elapsed)
        errors: List[str] = []
        notes = list(notes)
        if update.kind == "stopped":
            passes = update.stats.forward_passes if update.stats else 0
            notes.insert(0, f"Stopped after {passes} forward passes; memory freed. Generate again any time.")
        elif update.kind == "failed":
            errors.append(friendly_error(update.error))
            summary["error"] = errors[0]
            gr.Warning(errors[0])
        stats = update.stats
        method = stats.method if stats else "sjd_pac"
        lengths = stats.accept_lengths if stats else []
        total = stats.num_tokens if stats else 0
        return (
            gr.Tabs(selected="live") if select_tab else gr.skip(),
            self._image_for(model, update),
            plots.tokens_per_pass_chart(lengths, method, min_passes=total if method == "ar" else 24),
            plots.histogram_chart(stats.histogram() if stats else {}, method),
            stats_html(summary),
            message_md(errors, notes),
            summary,
        )

    def _compare_runs(self, model: sp.ARImageModel, prompt: str, negative_prompt: str, config: SamplerConfig,
                      seed: int, encoding: sp.PromptEncoding, stop) -> Iterator[tuple]:
        summaries: Dict[str, Dict[str, Any]] = {}
        tokens: Dict[str, Any] = {}
        first = True
        for method in METHODS:
            for update in stream_generation(model, prompt, config.with_(method=method), seed, stop,
                                            negative_prompt, encoding.resolution, self.interval):
                summary = run_summary(update.stats, update.kind, update.elapsed)
                if update.kind == "finished":
                    tokens[method] = update.result.tokens
                    ar = summaries.get("ar")
                    if method != "ar" and ar is not None:
                        summary["speedup_vs_ar"] = ar["wall_time"] / max(summary["wall_time"], 1e-9)
                        summary["identical_to_ar"] = tokens_identical(tokens["ar"], tokens[method])
                summaries[method] = summary
                errors: List[str] = []
                notes = list(encoding.warnings)
                if update.kind == "stopped":
                    notes.insert(0, f"Stopped during {METHOD_LABELS[method]}; memory freed.")
                elif update.kind == "failed":
                    errors.append(friendly_error(update.error))
                    gr.Warning(errors[0])
                ended = update.kind in ("stopped", "failed")
                all_done = method == METHODS[-1] and update.kind == "finished"
                overall = "finished" if all_done else ("progress" if not ended else update.kind)
                images = [gr.skip()] * 3
                images[METHODS.index(method)] = self._image_for(model, update)
                report = {"status": overall, "seed": seed, "verify": config.verify, "methods": summaries}
                if errors:
                    report["error"] = errors[0]
                yield (
                    gr.Tabs(selected="compare") if first else gr.skip(),
                    *images,
                    *(compare_card(m, summaries.get(m)) for m in METHODS),
                    compare_summary_html(summaries, config.verify, seed, overall),
                    message_md(errors, notes),
                    report,
                )
                first = False
                if ended:
                    return

    # --- layout -----------------------------------------------------------------------------
    def build(self) -> gr.Blocks:
        model = self.manager.model
        d = _defaults_of(model)
        base = SamplerConfig()
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
                model_dd = gr.Dropdown(choices=choices, value=value, label="Model", scale=2,
                                       elem_id="model-picker", allow_custom_value=True)
                model_path = gr.Textbox(label="…or a model folder", placeholder="/path/to/checkpoint",
                                        scale=3, elem_id="model-path")
                load_btn = gr.Button("Load", scale=0, min_width=80, elem_id="load-model")
            model_info = gr.HTML(model_info_html(model, self.startup_error), elem_id="device-info")

            with gr.Row():
                with gr.Column(scale=4, min_width=340):
                    prompt = gr.Textbox(label="Prompt", lines=2, elem_id="prompt",
                                        value="a red circle on a blue background" if model is not None
                                        and model.family == "demo" else "")
                    negative = gr.Textbox(label="Negative prompt", lines=1, elem_id="negative-prompt")
                    with gr.Row():
                        gen_btn = gr.Button("Generate", variant="primary", elem_id="generate-btn", scale=2)
                        cmp_btn = gr.Button("Compare all 3", variant="secondary", elem_id="compare-btn",
                                            scale=2)
                        stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn", scale=1, min_width=70)
                    message = gr.Markdown(message_md([self.startup_error] if self.startup_error else []),
                                          elem_id="message")
                    with gr.Row():
                        resolution = gr.Dropdown(choices=list(d.resolutions), value=d.resolutions[0]
                                                 if d.resolutions else None, label="Resolution",
                                                 elem_id="resolution", allow_custom_value=True)
                        seed = gr.Number(value=0, precision=0, label="Seed", elem_id="seed")
                    method = gr.Radio(METHOD_CHOICES, value=base.method, label="Method", elem_id="method")
                    verify = gr.Radio(VERIFY_CHOICES, value=base.verify, label="Verification",
                                      elem_id="verify")
                    with gr.Row():
                        cfg = gr.Slider(0.0, 15.0, value=d.cfg_scale, step=0.1, label="CFG",
                                        elem_id="cfg")
                        temperature = gr.Slider(0.0, 2.0, value=d.temperature, step=0.05,
                                                label="Temperature", elem_id="temperature")
                    with gr.Row():
                        top_k = gr.Number(value=d.top_k or 0, precision=0, label="Top-k",
                                          elem_id="top-k")
                        top_p = gr.Slider(0.0, 1.0, value=d.top_p or 1.0, step=0.01, label="Top-p",
                                          elem_id="top-p")
                    gr.Markdown("CFG 1 = no guidance · top-k 0 = off · top-p 1 = off", elem_classes=["hint"])
                    with gr.Accordion("Speculative decoding (SJD / SJD-PAC)", open=True):
                        with gr.Row():
                            window = gr.Number(value=d.window, precision=0, label="L: window",
                                               elem_id="window", min_width=80)
                            depth = gr.Number(value=d.tree_depth, precision=0, label="D: depth",
                                              elem_id="tree-depth", min_width=80)
                            width = gr.Number(value=d.tree_width, precision=0, label="K: width",
                                              elem_id="tree-width", min_width=80)
                        gr.Markdown("L: draft tokens verified per forward pass. D, K: SJD-PAC's tree of "
                                    "K candidates at the D-1 positions after a rejection.",
                                    elem_classes=["hint"])

                with gr.Column(scale=7):
                    with gr.Tabs(selected="live") as tabs:
                        with gr.Tab("Live", id="live"):
                            stats = gr.HTML(stats_html({"status": "idle"}), elem_id="run-stats")
                            with gr.Row(equal_height=True):
                                preview = gr.Image(plots.placeholder_image(text="press Generate"),
                                                   type="pil", format="png", label="Image", height=360,
                                                   interactive=False, elem_id="preview-image")
                                hist_chart = gr.Image(plots.histogram_chart({}), type="pil", format="png",
                                                      interactive=False, height=360,
                                                      label="Acceptance-length histogram",
                                                      elem_id="hist-chart", elem_classes=["chart"])
                            pass_chart = gr.Image(plots.tokens_per_pass_chart([]), type="pil", format="png",
                                                  interactive=False, label="Tokens accepted per forward pass",
                                                  elem_id="pass-chart", elem_classes=["chart"])
                            with gr.Accordion("Run statistics (JSON)", open=False):
                                run_json = gr.JSON(label="Run statistics", elem_id="run-json")
                        with gr.Tab("Compare", id="compare"):
                            cmp_images, cmp_cards = [], []
                            with gr.Row():
                                for m in METHODS:
                                    with gr.Column(min_width=200):
                                        cmp_images.append(gr.Image(
                                            plots.placeholder_image(text=METHOD_LABELS[m]), type="pil",
                                            format="png", interactive=False, label=METHOD_LABELS[m],
                                            height=300, elem_id=f"compare-image-{m}"))
                                        cmp_cards.append(gr.HTML(compare_card(m, None),
                                                                 elem_id=f"compare-card-{m}"))
                            cmp_summary = gr.HTML(elem_id="compare-summary")
                            with gr.Accordion("Comparison statistics (JSON)", open=False):
                                cmp_json = gr.JSON(label="Comparison", elem_id="compare-json")

            gen_inputs = [model_dd, model_path, prompt, negative, resolution, seed, method, verify, cfg,
                          temperature, top_k, top_p, window, depth, width]
            model_outputs = [model_info, model_dd, model_path, resolution, cfg, temperature, top_k, top_p,
                             window, depth, width, message]
            # One sampler at a time across all sessions: runs and model switches share the device.
            common = dict(concurrency_limit=1, concurrency_id="sampler")
            model_dd.input(self.select_model, [model_dd, model_path], model_outputs, api_name="load_model",
                           **common)
            load_btn.click(self.select_model, [model_dd, model_path], model_outputs, api_name=False, **common)
            model_path.submit(self.select_model, [model_dd, model_path], model_outputs, api_name=False,
                              **common)
            gen_btn.click(self.generate, gen_inputs,
                          [tabs, preview, pass_chart, hist_chart, stats, message, run_json],
                          api_name="generate", **common)
            cmp_btn.click(self.compare, gen_inputs,
                          [tabs, *cmp_images, *cmp_cards, cmp_summary, message, cmp_json],
                          api_name="compare", **common)
            # Not limited: Stop must run while the sampler's slot is busy.
            stop_btn.click(self.stop, None, None, api_name="stop", concurrency_limit=None)
        blocks.queue(max_size=32)
        return blocks
