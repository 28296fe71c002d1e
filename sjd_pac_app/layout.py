"""The page's layout: its components, and the wiring of their events to SjdPacApp's handlers.

`build(app)` takes the app (its handlers and state) and returns the gr.Blocks; the pictures and
texts it shows come from view.py.
"""

from __future__ import annotations

from typing import Any, Dict

import gradio as gr

from sjd_pac_core.config import MAX_TREE_NODES, SamplerConfig, max_tree_depth, tree_node_count
from sjd_pac_core.demo import EXAMPLE_PROMPT
from sjd_pac_core.settings import LABELS

from . import plots
from .runner import DEFAULT_REPEATS, METHOD_LABELS, canonical_spec, defaults_of, prompt_words
from .view import METHODS, compare_card, hints, message_md, model_info_html, small_images, stats_html, words_md

METHOD_CHOICES = [(METHOD_LABELS[m], m) for m in METHODS]
VERIFY_CHOICES = [
    ("rejection (exact in distribution)", "rejection"),
    ("gumbel (seed-exact: same tokens as AR)", "gumbel"),
]
WINDOW_CHOICES = ["auto", "8", "12", "16", "24", "32", "64", "128"]
NODE_BUDGET_CHOICES = ["0", "auto", "64", "128", "256"]  # 0: off (the window and tree above decide)
MAX_DEPTH_FIELD = 8  # the D slider's top (the budget allows D = 6 at K = 2 and more at K = 1)
# Runs (and model switches) that Gradio hands to the app at once: one holds the sampler, the rest
# wait for it in the app (runner.SamplerSlot), where a Stop ends them at once; more wait in
# Gradio's queue. Each waiting run holds a server thread, so the number is bounded.
RUNS_AT_ONCE = 8
IMAGE_HEIGHT = 420  # px: the image panel, and the live picture in its place while a run goes on
COMPARE_IMAGE_HEIGHT = 300  # px: the same for each method on the Compare tab
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
.pixel-art img, .live-frame img.pixelated {image-rendering: pixelated;}  /* small models' token patches stay sharp */
@media (max-width: 600px) {
  .gradio-container {padding-left: 8px !important; padding-right: 8px !important;}
  .stat-grid {grid-template-columns: repeat(2, minmax(0, 1fr));}
}
""" + f"""#live-image .live-frame {{height: {IMAGE_HEIGHT}px;}}
.compare-live .live-frame {{height: {COMPARE_IMAGE_HEIGHT}px;}}
.live-frame {{border: 1px solid var(--border-color-primary); border-radius: 8px;
  background: var(--background-fill-secondary);}}
.live-frame img {{width: 100%; height: 100%; object-fit: contain; display: block;}}
"""

# The fields whose list only suggests values (TYPED_FIELDS): Enter keeps what was typed.
TYPED_FIELDS = ("window", "node_budget")

# Ctrl+Enter (Cmd+Enter on a Mac) generates, from anywhere on the page.
# In a field of TYPED_FIELDS, Gradio's list picks on Enter the first choice that contains the typed
# text (4 became 24, 12 became 128). Enter there leaves the field instead, which keeps the typed
# value as the field's (it is checked, with a sentence, when the run is asked for), unless the
# arrow keys chose a listed value since the last keystroke.
HEAD = """<script>
const SJD_TYPED = '%s';
document.addEventListener('keydown', (e) => {
  if ((e.ctrlKey || e.metaKey) && e.key === 'Enter') {
    const button = document.querySelector('#generate-btn');
    if (button) { e.preventDefault(); button.click(); }
    return;
  }
  const field = e.target;
  if (!(field instanceof HTMLInputElement) || !field.matches(SJD_TYPED)) return;
  if (e.key === 'ArrowDown' || e.key === 'ArrowUp') field.dataset.sjdChosen = '1';
  if (e.key !== 'Enter' || e.altKey || e.shiftKey || e.isComposing || field.dataset.sjdChosen) return;
  e.preventDefault();
  e.stopPropagation();  // in the capture phase: Gradio's own Enter never sees it
  field.blur();
}, true);
document.addEventListener('input', (e) => {
  if (e.target instanceof HTMLInputElement && e.target.matches(SJD_TYPED)) delete e.target.dataset.sjdChosen;
}, true);
</script>""" % ", ".join(f"#{field.replace('_', '-')} input" for field in TYPED_FIELDS)


# Stop, as the page sends it. Browsers open at most six connections per host for a profile, and a
# tab whose run is going or waiting holds one (its queue stream): with six such tabs, a plain
# request waits for a run to end (seen: 6.9 s, until the run it was meant to stop had finished).
# A request without credentials travels on connections of its own, so Stop is answered at once.
STOP_JS = """() => {
  const url = new URL('gradio_api/run/stop', window.location.href.replace(/[?#].*$/, '').replace(/\\/?$/, '/'));
  fetch(url, {method: 'POST', credentials: 'omit', headers: {'Content-Type': 'application/json'},
              body: JSON.stringify({data: [], session_hash: window.__gradio_session_hash__})});
  return [];
}"""


def theme() -> gr.themes.Base:
    """Gradio's Soft theme with every text dark enough for WCAG AA (>= 4.5:1): hints and info text,
    the field and image labels (orange 800 on orange 100, not 500), the primary button and the
    selected radio choice (white on orange 700, not 500), the selected tab (orange 700)."""
    return gr.themes.Soft(primary_hue="orange", secondary_hue="blue").set(
        body_text_color_subdued="*neutral_700",
        body_text_color_subdued_dark="*neutral_300",
        block_info_text_color="*neutral_700",
        block_info_text_color_dark="*neutral_300",
        block_label_text_color="*primary_800",
        block_title_text_color="*primary_800",
        button_primary_background_fill="*primary_700",
        button_primary_background_fill_hover="*primary_800",
        checkbox_label_background_fill_selected="*primary_700",
        color_accent="*primary_700",
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


# --- the tree budget bounds D and K together -----------------------------------------------------

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


def knob(field: str, hints: Dict[str, str]) -> Dict[str, str]:
    """A knob's field on the page: labelled as everywhere (settings.LABELS), its element id the
    SamplerConfig field name (tree_depth -> #tree-depth), its hint quoting the model's default."""
    label = LABELS[field]
    return dict(label=label[0].upper() + label[1:], info=hints[field], elem_id=field.replace("_", "-"))


def build(app: Any) -> gr.Blocks:
    """The page for `app` (an SjdPacApp): its handlers answer the page's events."""
    model = app.manager.model
    d = defaults_of(model)
    h = hints(d)
    base = SamplerConfig()
    pixel_classes = ["pixel-art"] if small_images(d) else []
    choices = app.manager.choices()
    value = app.manager.spec or canonical_spec(app.initial_model)
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
        model_info = gr.HTML(model_info_html(model, app.startup_error), elem_id="device-info")

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
        message = gr.Markdown(message_md([app.startup_error] if app.startup_error else []),
                              elem_id="message")

        with gr.Row():
            with gr.Column(scale=7, min_width=300):
                with gr.Tabs(selected="live") as tabs:
                    with gr.Tab("Live", id="live"):
                        stats = gr.HTML(stats_html({"status": "idle"}), elem_id="run-stats")
                        with gr.Row(equal_height=True):
                            with gr.Column(scale=3, min_width=280):
                                # While a run goes on its picture shows here, inline in the
                                # update that carries its numbers (app._pictures); the panel below
                                # holds the finished picture and its download button.
                                live_image = gr.HTML(visible=False, elem_id="live-image")
                                preview = gr.Image(plots.placeholder_image(text="press Generate"),
                                                   type="pil", format="png", label="Image", height=IMAGE_HEIGHT,
                                                   alt_text="The generated picture: it fills in as the sampler "
                                                            "accepts tokens, then shows the decoded image",
                                                   interactive=False, elem_id="preview-image",
                                                   elem_classes=pixel_classes)
                                download = gr.File(label="Download (512 px PNG; prompt, seed and settings inside)",
                                                   interactive=False, elem_id="download-file")
                            with gr.Column(scale=2, min_width=240):
                                hist_chart = gr.Image(plots.histogram_chart({}), type="pil", format="png",
                                                      interactive=False, height=340,
                                                      label="Acceptance-length histogram",
                                                      alt_text="Bar chart: how many forward passes committed "
                                                               "1, 2, 3 or more tokens (the numbers are in the JSON below)",
                                                      elem_id="hist-chart", elem_classes=["chart"])
                        pass_chart = gr.Image(plots.tokens_per_pass_chart([]), type="pil", format="png",
                                              interactive=False, label="Tokens accepted per forward pass",
                                              alt_text="Bar chart: tokens accepted by each forward pass, with "
                                                       "plain AR's 1 per pass and this run's mean",
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
                        cmp_images, cmp_lives, cmp_cards = [], [], []
                        with gr.Row():
                            for m in METHODS:
                                with gr.Column(min_width=200):
                                    cmp_lives.append(gr.HTML(visible=False, elem_id=f"compare-live-{m}",
                                                             elem_classes=["compare-live"]))
                                    cmp_images.append(gr.Image(
                                        plots.placeholder_image(text=METHOD_LABELS[m]), type="pil",
                                        format="png", interactive=False, label=METHOD_LABELS[m],
                                        alt_text=f"The picture {METHOD_LABELS[m]} sampled",
                                        height=COMPARE_IMAGE_HEIGHT, elem_id=f"compare-image-{m}",
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
                method = gr.Radio(METHOD_CHOICES, value=base.method, **knob("method", h))
                verify = gr.Radio(VERIFY_CHOICES, value=base.verify, **knob("verify", h))
                cfg_scale = gr.Slider(0.0, 15.0, value=d.cfg_scale, step=0.1, **knob("cfg_scale", h))
                temperature = gr.Slider(0.05, 2.0, value=d.temperature, step=0.05, **knob("temperature", h))
                with gr.Row():
                    top_k = gr.Number(value=d.top_k or 0, precision=None, min_width=120, **knob("top_k", h))
                    top_p = gr.Slider(0.01, 1.0, value=d.top_p or 1.0, step=0.01, min_width=120, **knob("top_p", h))
                with gr.Accordion("Speculative decoding (SJD / SJD-PAC)", open=True):
                    window = gr.Dropdown(WINDOW_CHOICES, value=str(d.window), allow_custom_value=True,
                                         **knob("window", h))
                    tree_depth = gr.Slider(1, depth_limit(d.tree_width), value=d.tree_depth, step=1,
                                           **knob("tree_depth", h))
                    tree_width = gr.Slider(1, width_limit(d.tree_depth), value=d.tree_width, step=1,
                                           **knob("tree_width", h))
                    node_budget = gr.Dropdown(NODE_BUDGET_CHOICES, value="0", allow_custom_value=True,
                                              **knob("node_budget", h))

        gen_inputs = [model_dd, model_path, prompt, negative, resolution, seed, method, verify, cfg_scale,
                      temperature, top_k, top_p, window, tree_depth, tree_width, node_budget]
        cmp_inputs = [*gen_inputs[:7], cmp_verify, *gen_inputs[8:], repeats]
        model_outputs = [model_info, model_dd, model_path, resolution, cfg_scale, temperature, top_k, top_p,
                         window, tree_depth, tree_width, words, message]
        # One sampler at a time across all sessions: runs and model switches share the device
        # (runner.SamplerSlot, in click order).
        common = dict(concurrency_limit=RUNS_AT_ONCE, concurrency_id="sampler")
        instant = dict(queue=False, show_progress="hidden", api_name=False)
        model_dd.input(app.select_model, [model_dd, model_path], model_outputs, api_name="load_model",
                       **common)
        load_btn.click(app.select_model, [model_dd, model_path], model_outputs, api_name=False, **common)
        model_path.submit(app.select_model, [model_dd, model_path], model_outputs, api_name=False,
                          **common)
        # The tree budget bounds D and K together: each slider's top follows the other's value.
        # preprocess=False: a value typed past the top reaches our check, which names the budget.
        tree_width.input(follow_width, [tree_depth, tree_width], tree_depth, preprocess=False, **instant)
        tree_depth.input(follow_depth, [tree_depth, tree_width], tree_width, preprocess=False, **instant)
        # A budget picked over the model's own window takes window auto (a window typed stays).
        node_budget.input(app.window_for_budget, [node_budget, window], window, preprocess=False, **instant)
        # A click is checked at once (outside the queue), then waits its turn for the sampler.
        # preprocess=False everywhere: the values are plain numbers and strings, and our check
        # (not the sliders' current tops) decides, with a sentence that names the fix.
        # The click's ticket (JobRegistry) travels to its run in a hidden field, not a gr.State:
        # a page with a State holds a heartbeat connection open for its whole life, and browsers
        # allow six connections per host, so six open tabs would leave none for Stop.
        gen_ticket = gr.Textbox("", visible=False, elem_id="generate-ticket")
        cmp_ticket = gr.Textbox("", visible=False, elem_id="compare-ticket")
        gen_check = gen_btn.click(app.check, gen_inputs, [message, gen_ticket, stats], preprocess=False,
                                  **instant)
        gen_check.success(app.gate, gen_ticket, None, preprocess=False, **instant).success(
            app.generate, [*gen_inputs, gen_ticket],
            [tabs, preview, live_image, download, pass_chart, hist_chart, stats, message, run_json],
            api_name="generate", preprocess=False, **common)
        cmp_check = cmp_btn.click(app.check_compare, cmp_inputs, [message, cmp_ticket, cmp_summary],
                                  preprocess=False, **instant)
        cmp_check.success(app.gate, cmp_ticket, None, preprocess=False, **instant).success(
            app.compare, [*cmp_inputs, cmp_ticket],
            [tabs, *cmp_images, *cmp_lives, *cmp_cards, cmp_summary, message, cmp_json],
            api_name="compare", preprocess=False, **common)
        # Not queued: Stop must act while the sampler's slot is busy and on queued runs. The button
        # posts to the API's /stop itself, without credentials (STOP_JS); the hidden button only
        # gives /stop its endpoint (API clients call it too).
        stop_api = gr.Button(visible=False, elem_id="stop-api")
        stop_api.click(app.stop, None, None, api_name="stop", queue=False, show_progress="hidden")
        stop_btn.click(None, None, None, js=STOP_JS, queue=False, show_progress="hidden", api_name=False)
    blocks.queue(max_size=32)
    return blocks


