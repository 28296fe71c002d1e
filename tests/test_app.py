"""The Gradio app: its generator functions driven directly, and the served app through
gradio_client on 127.0.0.1 (a free port, inside the test process)."""

from __future__ import annotations

import json
import os
import socket
import statistics
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import torch

import sjd_pac_core as sp
from sjd_pac_app import runner
from sjd_pac_app.runner import JobRegistry, ModelManager, run_settings, stream_generation

gr = pytest.importorskip("gradio")
from sjd_pac_app.app import SjdPacApp  # noqa: E402
from sjd_pac_app.layout import launch_kwargs  # noqa: E402

DEMO_READY = (Path(sp.__file__).resolve().parent / "demo" / "weights" / "config.json").is_file()
PROMPT = "a red circle top left on a blue background"
# Argument order of SjdPacApp.generate / compare (and of the /generate, /compare endpoints).
ARG_NAMES = ("model_choice", "model_path", "prompt", "negative_prompt", "resolution", "seed", "method",
             "verify", "cfg_scale", "temperature", "top_k", "top_p", "window", "tree_depth", "tree_width",
             "node_budget")

_SHARED: Dict[str, object] = {}  # one model and one server per test session (both test files)


# --- fixtures ------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def app_model(request) -> Tuple[str, sp.ARImageModel]:
    """(spec, model): the bundled demo once its weights exist, else a smoke-trained checkpoint."""
    if "model" not in _SHARED:
        override = os.environ.get("SJD_PAC_APP_TEST_MODEL")  # e.g. a partly trained demo run
        if override:
            _SHARED["model"] = (runner.canonical_spec(override), sp.load_model(override, device="cpu"))
        elif DEMO_READY:
            _SHARED["model"] = ("demo", request.getfixturevalue("demo_model"))
        else:
            folder = request.getfixturevalue("smoke_demo_folder")
            _SHARED["model"] = (runner.canonical_spec(folder), sp.load_model(folder, device="cpu"))
    return _SHARED["model"]


def make_app(spec: str, model: sp.ARImageModel, interval: float = 0.05) -> SjdPacApp:
    """An app whose loader hands out the already loaded test model (no second load)."""

    def loader(path: str, **kwargs) -> sp.ARImageModel:
        return model if path == spec else sp.load_model(path, **kwargs)

    app = SjdPacApp(ModelManager(None, device="cpu", loader=loader), spec, interval=interval)
    app.preload()
    assert app.startup_error == ""
    return app


@pytest.fixture()
def app(app_model) -> SjdPacApp:
    return make_app(*app_model)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def served_app(app_model, request) -> Tuple[SjdPacApp, str]:
    """The app served on 127.0.0.1 at a free port, in this process."""
    if "server" not in _SHARED:
        app = make_app(*app_model, interval=0.1)
        blocks = app.build()
        blocks.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True,
                      **launch_kwargs())
        request.addfinalizer(blocks.close)
        _SHARED["server"] = (app, blocks.local_url.rstrip("/"))
    return _SHARED["server"]


def args_for(spec: str, model: sp.ARImageModel, **changes) -> List[object]:
    d = model.defaults
    values = dict(model_choice=spec, model_path="", prompt=PROMPT, negative_prompt="",
                  resolution=d.resolution, seed=0, method="sjd_pac", verify="gumbel", cfg_scale=d.cfg_scale,
                  temperature=d.temperature, top_k=d.top_k or 0, top_p=d.top_p or 1.0, window=d.window,
                  tree_depth=d.tree_depth, tree_width=d.tree_width, node_budget="0")
    values.update(changes)
    return [values[name] for name in ARG_NAMES]


# Generate's outputs, by position (layout.build wires them in this order), and Compare's: the
# three image panels, the three live panels, the three cards, the summary.
TABS, IMAGE, LIVE, DOWNLOAD, PASS_CHART, HIST_CHART, STATS, MESSAGE, SUMMARY = range(9)
CMP_IMAGES, CMP_LIVES, CMP_CARDS, CMP_SUMMARY = slice(1, 4), slice(4, 7), slice(7, 10), 10


def panel_image(frame: tuple):
    """The picture in the image panel of a generate frame (a gr.update, or the image itself)."""
    value = frame[IMAGE]
    return value.get("value") if isinstance(value, dict) else value


def reference_stats(model: sp.ARImageModel, method: str, verify: str = "gumbel", seed: int = 0) -> sp.RunStats:
    """What the sampler itself reports for the app's default settings (cached: runs cost seconds)."""
    key = ("reference", id(model), method, verify, seed)
    if key not in _SHARED:
        config = model.defaults.sampler_config(method=method, verify=verify)
        _SHARED[key] = sp.generate_image(model, PROMPT, config, seed=seed).stats
    return _SHARED[key]


# --- pure pieces -------------------------------------------------------------------------------

def settings_for(**changes) -> runner.RunSettings:
    values = dict(prompt=PROMPT, negative_prompt="", resolution=None, seed=0, method="sjd", verify="gumbel",
                  cfg_scale=3.0, temperature=1.0, top_k=0, top_p=1.0, window=16.0, tree_depth=3, tree_width=4)
    values.update(changes)
    return run_settings(sp.FamilyDefaults(resolutions=("64x64",), sampler=dict(cfg_scale=2.0, window=32)), **values)


def test_settings_map_to_a_validated_config():
    config = settings_for().config
    assert (config.method, config.verify, config.top_k, config.top_p, config.window) == ("sjd", "gumbel", None, None, 16)
    assert settings_for(top_k=50, top_p=0.9).config.top_k == 50
    assert settings_for(window="auto").config.window == "auto"
    # empty fields take the model's defaults (as the page's fields show them)
    assert settings_for(cfg_scale=None, window="").config.cfg_scale == 2.0
    assert settings_for(window="").config.window == 32
    for bad, needle in [(dict(window=0), "window (L)"), (dict(window=2.5), "window L must be a whole number"),
                        (dict(window="2.5"), "window L must be a whole number"),
                        (dict(seed=2.5), "seed must be a whole number"), (dict(seed=10**30), "seed must be between"),
                        (dict(seed=-7), "seed must be between"), (dict(top_p=0.0), "top_p"),
                        (dict(temperature=0.0), "temperature"),
                        (dict(method="sjd_pac", tree_depth=8, tree_width=4), "with K = 4 use D <= 4"),
                        (dict(prompt="red " * 2100), "shorten it")]:
        with pytest.raises(sp.ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
            settings_for(**bad)
    # -1 (or empty) asks for a random seed: passed on as None, generate_image draws it
    assert settings_for(seed=-1).seed is None and settings_for(seed=" -1 ").seed is None
    assert settings_for(seed="").seed is None
    assert settings_for(seed=2**64 - 1).seed == 2**64 - 1 and settings_for(seed=3.0).seed == 3
    assert settings_for(seed="18446744073709551615").seed == 2**64 - 1  # the page's seed field is text


def test_saved_picture_is_large_named_and_reproducible(tmp_path, app_model):
    from PIL import Image

    from sjd_pac_core.settings import RECORD_PNG_KEY, run_record

    _, model = app_model
    record = settings_for(seed=42, method="sjd_pac").record(model, 42)
    kept = runner.save_image(Image.new("RGB", (64, 64), (200, 30, 30)), record, tmp_path)
    path = kept.path
    assert not kept.moved
    assert path.name == "a-red-circle-top-left-on-a-blue-background_seed-42_sjd_pac.png"
    with Image.open(path) as image:
        assert image.size == (512, 512)
        saved = json.loads(image.text[RECORD_PNG_KEY])
    assert saved == json.loads(json.dumps(record))
    # the one record the CLI and the nodes write too: the same keys, every knob among them
    assert set(saved) == set(run_record(sp.SamplerConfig(), prompt="", seed=0))
    assert saved["seed"] == 42 and saved["threads"] == 1 and saved["method"] == "sjd_pac"
    assert runner.image_file_name("", 1, "ar") == "unconditional_seed-1_ar.png"
    assert runner.image_file_name("A/B: c?" * 20, 2, "ar").count("/") == 0


def test_defaults_are_local_and_private():
    from sjd_pac_app.main import parse_args

    args = parse_args([])
    assert (args.host, args.port, args.model) == ("127.0.0.1", 7860, "demo")
    assert os.environ["GRADIO_ANALYTICS_ENABLED"] == "False"
    assert launch_kwargs()["share"] is False and launch_kwargs()["quiet"] is True  # no share=True banner


def test_model_list_offers_demo_and_local_folders(tmp_path):
    for name in ("lumina_7b", "janus_pro"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    (tmp_path / "not_a_model").mkdir()
    values = [value for _, value in ModelManager(tmp_path).choices()]
    assert values == ["demo", str((tmp_path / "janus_pro").resolve()), str((tmp_path / "lumina_7b").resolve())]
    with pytest.raises(sp.ModelLoadError, match="not a Hugging Face model folder"):
        ModelManager(tmp_path).get(tmp_path / "not_a_model")


def test_app_starts_and_serves_even_if_the_start_model_is_missing(app_model, tmp_path):
    spec, model = app_model
    app = SjdPacApp(ModelManager(None, device="cpu"), str(tmp_path / "missing"))
    app.preload()
    assert "does not exist" in app.startup_error
    app.build()  # the page renders, with the error shown and generic controls
    out = app.select_model(spec, "")  # picking a working model fills in its family's defaults
    assert app.manager.spec == runner.canonical_spec(spec) and out[4]["value"] == model.defaults.cfg_scale
    assert f"default {model.defaults.cfg_scale:g}" in out[4]["info"]  # the hint quotes the model's own


def test_charts_cover_short_long_and_empty_runs():
    from sjd_pac_app import plots

    for lengths in ([], [1], [1] * 2357, [1, 5, 64, 3] * 900, [1, 300, 2]):
        chart = plots.tokens_per_pass_chart(lengths, "sjd_pac")
        hist = plots.histogram_chart(dict(Counter(lengths)), "ar")
        assert chart.size == plots.CHART_SIZE and hist.size == plots.HIST_SIZE
    big = plots.upscale_for_display(plots.placeholder_image(768))
    small = plots.upscale_for_display(plots.placeholder_image(64))
    assert big.size == (512, 512) and small.size == (512, 512)


def test_oom_and_other_errors_read_as_one_sentence():
    oom = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    tree = sp.SamplerConfig(method="sjd_pac", window=32, tree_depth=4, tree_width=5)
    message = runner.friendly_error(oom, tree, cpu)
    assert message.startswith("Out of memory in this computer's memory") and "lower D or K" in message
    assert "GPU" not in message and "lower L" not in message
    message = runner.friendly_error(oom, sp.SamplerConfig(method="sjd", window=512), gpu)
    assert "the GPU" in message and "lower L" in message and "lower D" not in message
    message = runner.friendly_error(MemoryError(), sp.SamplerConfig(method="sjd_pac", window=32), cpu)
    assert "the model itself" in message
    assert runner.friendly_error(sp.ModelLoadError("X is missing; fix it.")) == "X is missing; fix it."


def test_job_registry_stops_only_its_own_session_and_queued_runs():
    jobs = JobRegistry()
    a, b = jobs.begin("a"), jobs.begin("b")
    assert jobs.stop("a") and a.is_set() and not b.is_set()
    assert not jobs.stop("a")  # already stopping
    jobs.end("a", a)
    assert not jobs.running("a") and jobs.running("b")
    again = jobs.begin("b")  # a new run in a session ends the old one
    assert b.is_set() and not again.is_set()
    # A click takes a ticket before its run waits in the queue; a Stop after it reaches it there.
    queued = jobs.ticket()
    assert not jobs.stop("c")  # nothing of c's runs yet
    assert jobs.begin("c", queued).is_set()  # it starts already stopped
    jobs.end("c", jobs.begin("c", jobs.ticket()))  # a click after the Stop runs
    assert not jobs.begin("c", jobs.ticket()).is_set()
    assert not jobs.begin("d", queued).is_set()  # another session's Stop is not d's
    assert not jobs.begin("c").is_set()  # no ticket (the API): never stopped before it starts


def test_job_registry_keeps_nothing_for_a_click_whose_run_never_starts():
    """Gradio drops a Generate pressed while its run goes on: that click's ticket is never used.
    A Stop, then a new click, must run (the stop belongs to the running run and to older clicks)."""
    jobs = JobRegistry()
    running = jobs.begin("s", jobs.ticket())
    dropped = jobs.ticket()  # the click Gradio drops: nothing is registered for it
    assert jobs.remembered() == 1
    assert jobs.stop("s") and running.is_set()
    jobs.end("s", running)
    nxt = jobs.begin("s", jobs.ticket())
    assert not nxt.is_set()
    jobs.end("s", nxt)
    assert jobs.remembered() == 0 and dropped  # nothing left behind by either click or the Stop


# --- generator functions, driven directly -----------------------------------------------------

def test_generate_streams_updates_and_matches_the_sampler(app, app_model):
    spec, model = app_model
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the run must use the model's thread count and restore this one
    try:
        outputs = list(app.generate(*args_for(spec, model, method="sjd_pac", verify="gumbel")))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    summaries = [o[-1] for o in outputs]
    assert [s["status"] for s in summaries[:-1]] == ["progress"] * (len(summaries) - 1)
    assert summaries[-1]["status"] == "finished"
    # Enough frames to watch the picture fill in (one per 1/16 of the image at least), and every
    # frame carries its own picture with its numbers (never numbers beside an older image).
    assert len(summaries) - 1 >= runner.FRAME_MILESTONES - 1
    # ...inline, in the update that carries its numbers, with the image panel hidden meanwhile
    assert all("data:image/png;base64," in o[LIVE]["value"] for o in outputs[:-1])
    assert outputs[0][IMAGE]["visible"] is False and outputs[-1][IMAGE]["visible"] is True
    assert outputs[-1][LIVE] == {"__type__": "update", "value": "", "visible": False}
    assert summaries[-1]["settings"]["threads"] == 1 and "1 CPU thread" in outputs[-1][STATS]
    passes = [s["forward_passes"] for s in summaries]
    assert passes == sorted(passes)  # the stream only moves forward

    expected = reference_stats(model, "sjd_pac")
    final = summaries[-1]
    assert final["forward_passes"] == expected.forward_passes
    assert final["step_compression"] == pytest.approx(expected.step_compression)
    assert final["accept_lengths"] == expected.accept_lengths
    assert final["tokens_committed"] == final["num_tokens"] == expected.num_tokens
    assert final["histogram"] == {str(k): v for k, v in expected.histogram().items()}

    tabs, _, _, download, pass_chart, hist_chart, stats_html, message, _ = outputs[-1]
    image = panel_image(outputs[-1])
    assert min(image.size) >= 512  # the 64x64 picture, upscaled (nearest) for display
    assert Path(download).name == "a-red-circle-top-left-on-a-blue-background_seed-0_sjd_pac.png"
    assert final["settings"]["seed"] == 0 and final["settings"]["prompt"] == PROMPT
    from sjd_pac_core.settings import run_record

    assert set(final["settings"]) == set(run_record(sp.SamplerConfig(), prompt="", seed=0))  # the one record
    assert final["settings"]["cfg_scale"] == model.defaults.cfg_scale and final["settings"]["random_seed"] is False
    assert pass_chart.size[0] >= 400 and hist_chart.size[0] >= 400
    assert 'data-status="finished"' in stats_html and f'data-passes="{expected.forward_passes}"' in stats_html
    assert "⚠" not in message


def test_stop_ends_the_run_within_one_forward_pass(app_model):
    spec, model = app_model
    stop = threading.Event()
    config = model.defaults.sampler_config(method="ar")
    updates = stream_generation(model, PROMPT, config, 0, stop, interval=0.0)
    first = next(updates)
    stop.set()
    live_stats = first.progress.stats  # the worker's own, still growing, RunStats
    passes_at_stop = len(live_stats.records)
    final = list(updates)[-1]
    assert final.kind == "stopped"
    assert final.stats.forward_passes <= passes_at_stop + 1  # at most the pass in flight
    assert final.stats.forward_passes < final.stats.num_tokens


def test_stop_button_then_next_run_works(app, app_model):
    spec, model = app_model
    run = app.generate(*args_for(spec, model, method="ar"))
    first = next(run)
    assert first[-1]["status"] in ("progress", "loading")
    app.stop()  # what the Stop button calls (no request: the local session)
    rest = list(run)
    final = rest[-1][-1]
    assert final["status"] == "stopped" and final["forward_passes"] < final["num_tokens"]
    assert "Stopped after" in rest[-1][MESSAGE] and panel_image(rest[-1]).size[0] >= 256  # the picture so far
    assert not app.jobs.running("local")

    again = list(app.generate(*args_for(spec, model, method="sjd")))[-1][-1]
    assert again["status"] == "finished" and again["tokens_committed"] == again["num_tokens"]


def test_bad_inputs_show_a_readable_message_and_the_app_keeps_working(app, app_model, tmp_path, monkeypatch):
    spec, model = app_model
    missing = tmp_path / "no_such_model"
    # Each failure is also a toast (gr.Warning, a UserWarning when no page is attached).
    with pytest.warns(UserWarning, match="does not exist"):
        out = list(app.generate(*args_for(spec, model, model_path=str(missing))))[-1]
    assert out[-1]["status"] == "failed" and "does not exist" in out[MESSAGE] and "⚠" in out[MESSAGE]

    with pytest.warns(UserWarning, match="window"):
        out = list(app.generate(*args_for(spec, model, window=0)))[-1]
    assert out[-1]["status"] == "failed" and "window (L) must be an integer >= 1" in out[-1]["error"]

    with pytest.warns(UserWarning, match="resolution"):
        out = list(app.generate(*args_for(spec, model, resolution="4096x4096")))[-1]
    assert "does not support resolution" in out[-1]["error"]

    # Out of memory in the middle of a run: reported, and the next run is unaffected.
    real = sp.generate_image

    def oom_after_one_pass(model_, prompt, config, callback=None, **kwargs):
        return real(model_, prompt, config, callback=_raise_oom_after(callback), **kwargs)

    monkeypatch.setattr(runner.sp, "generate_image", oom_after_one_pass)
    with pytest.warns(UserWarning, match="Out of memory"):
        out = list(app.generate(*args_for(spec, model)))[-1]
    assert out[-1]["status"] == "failed" and out[-1]["error"].startswith("Out of memory")
    monkeypatch.undo()

    with pytest.warns(UserWarning, match="does not exist"):
        loaded = app.select_model(spec, str(missing))
    assert "does not exist" in loaded[-1] and app.manager.model is model  # still the old model

    assert list(app.generate(*args_for(spec, model)))[-1][-1]["status"] == "finished"


def _raise_oom_after(callback):
    def wrapped(progress):
        callback(progress)
        if progress.record.index >= 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    return wrapped


def test_compare_runs_all_three_interleaved_and_gumbel_is_token_identical(app, app_model):
    spec, model = app_model
    outputs = list(app.compare(*args_for(spec, model, verify="gumbel"), 1))
    report = outputs[-1][-1]
    assert report["status"] == "finished" and report["verify"] == "gumbel" and report["repeats"] == 1
    methods = report["methods"]
    assert list(methods) == ["ar", "sjd", "sjd_pac"]
    assert methods["ar"]["forward_passes"] == methods["ar"]["num_tokens"]
    for m in ("sjd", "sjd_pac"):
        assert methods[m]["identical_to_ar"] is True
        assert methods[m]["speedup_vs_ar"] == pytest.approx(
            statistics.median(methods["ar"]["wall_times"]) / statistics.median(methods[m]["wall_times"]))
        assert methods[m]["forward_passes"] <= methods["ar"]["forward_passes"]
    assert report["settings"]["seed"] == 0 and report["settings"]["verify"] == "gumbel"
    # the images: one per method, side by side (skipped slots keep the earlier picture)
    finals = {}
    for out in outputs:
        for i, m in enumerate(("ar", "sjd", "sjd_pac")):
            panel = out[CMP_IMAGES][i]
            picture = panel.get("value") if isinstance(panel, dict) else panel
            if hasattr(picture, "size"):
                finals[m] = picture
    assert set(finals) == {"ar", "sjd", "sjd_pac"}
    assert finals["ar"].tobytes() == finals["sjd"].tobytes() == finals["sjd_pac"].tobytes()
    cards = outputs[-1][CMP_CARDS]
    assert all('data-status="finished"' in c for c in cards) and cards[2].count('class="yes"') == 1
    assert "1 run" in cards[1] and "a single wall-clock measurement is noisy" in outputs[-1][CMP_SUMMARY]
    for column in range(3):  # each method's picture came inline while it ran; its live panel is hidden at its end
        updates = [o[CMP_LIVES][column] for o in outputs if "visible" in o[CMP_LIVES][column]]
        assert any("data:image/png;base64," in u["value"] for u in updates) and updates[-1]["visible"] is False


def test_compare_speedup_is_the_ratio_of_median_wall_times():
    summaries = {m: {"status": "finished"} for m in ("ar", "sjd", "sjd_pac")}
    times = {"ar": [3.0, 9.0, 4.0], "sjd": [2.0, 1.0, 6.0], "sjd_pac": [1.0]}
    tokens = {m: torch.arange(4) for m in ("ar", "sjd")} | {"sjd_pac": torch.arange(1, 5)}
    SjdPacApp._update_timing(summaries, times, tokens, repeat=2, repeats=3)
    assert summaries["sjd"]["speedup_vs_ar"] == pytest.approx(4.0 / 2.0)
    assert summaries["sjd_pac"]["speedup_vs_ar"] == pytest.approx(4.0 / 1.0)
    assert summaries["sjd"]["identical_to_ar"] is True and summaries["sjd_pac"]["identical_to_ar"] is False
    assert summaries["sjd_pac"]["timing"] == "run 1 of 3" and summaries["sjd"]["timing"] == ""
    from sjd_pac_app.app import compare_card

    assert "median of 3" in compare_card("sjd", summaries["sjd"] | {"wall_time": 6.0, "forward_passes": 9,
                                                                     "step_compression": 2.0})


def test_stop_in_compare_leaves_every_card_final(app, app_model):
    spec, model = app_model
    run = app.compare(*args_for(spec, model), 1)
    for out in run:
        if out[-1]["methods"].get("ar", {}).get("status") == "progress":
            break
    app.stop()
    final = list(run)[-1]
    assert final[-1]["status"] == "stopped"
    statuses = [final[-1]["methods"][m]["status"] for m in ("ar", "sjd", "sjd_pac")]
    assert statuses == ["stopped", "skipped", "skipped"]
    assert all("waiting" not in card for card in final[CMP_CARDS]) and "Not run" in final[CMP_CARDS][2]


def test_a_run_stopped_while_queued_never_starts(app, app_model, monkeypatch):
    spec, model = app_model
    started = []
    monkeypatch.setattr(runner.sp, "generate_image", lambda *a, **k: started.append(1))
    for handler, check, extra in ((app.generate, app.check, ()), (app.compare, app.check_compare, (1,))):
        message, ticket, waiting = check(*args_for(spec, model), *extra)  # the click, before the run queues
        assert ticket and message == "" and 'data-status="waiting"' in waiting
        app.stop()  # Stop pressed while it waits
        outputs = list(handler(*args_for(spec, model), *extra, ticket=ticket))
        assert outputs[-1][-1]["status"] == "stopped" and "before it started" in outputs[-1][-2]
    assert started == []
    final_cards = outputs[-1][CMP_CARDS]
    assert all('data-status="skipped"' in card for card in final_cards)
    monkeypatch.undo()
    _, ticket, _ = app.check(*args_for(spec, model))  # a new click after the stop runs normally
    assert list(app.generate(*args_for(spec, model, method="sjd"), ticket=ticket))[-1][-1]["status"] == "finished"


def test_the_sampler_is_taken_in_click_order_and_a_stop_ends_the_wait():
    slot = runner.SamplerSlot()
    assert slot.acquire(1)
    assert not slot.acquire(5, timeout=0)  # held: no waiting when asked not to
    order: List[int] = []

    def run(ticket: int) -> None:
        if slot.acquire(ticket):
            order.append(ticket)
            slot.release(ticket)

    threads = [threading.Thread(target=run, args=(t,)) for t in (3, 2)]
    for t in threads:
        t.start()
    deadline = time.time() + 10
    while slot.waiting() < 2 and time.time() < deadline:
        time.sleep(0.01)
    stop = threading.Event()
    stopped: List[bool] = []
    waiter = threading.Thread(target=lambda: stopped.append(slot.acquire(4, stop)))
    waiter.start()
    stop.set()
    waiter.join(timeout=10)
    assert stopped == [False]  # a stopped waiter leaves at once, while the sampler is still held
    slot.release(1)
    for t in threads:
        t.join(timeout=10)
    assert order == [2, 3] and slot.waiting() == 0  # the earlier click first
    assert slot.acquire(6, timeout=0)  # and nobody is left holding it


def test_a_run_waiting_for_another_tabs_run_stops_at_once(app, app_model):
    """Another tab's run holds the sampler: a run asked for now says it waits; a Stop ends it at
    once (before, it showed "Waiting" until the other run ended); a run not stopped starts when the
    sampler is free."""
    spec, model = app_model
    other = 0  # the other tab's run: the smallest ticket
    assert app.slot.acquire(other)
    try:
        _, ticket, _ = app.check(*args_for(spec, model, method="sjd"))
        run = app.generate(*args_for(spec, model, method="sjd"), ticket=ticket)
        waiting = next(run)
        assert waiting[SUMMARY]["status"] == "waiting" and 'data-status="waiting"' in waiting[STATS]
        threading.Timer(0.2, app.stop).start()
        started = time.time()
        final = list(run)[-1]
        assert time.time() - started < 10 and final[SUMMARY]["status"] == "stopped"
        assert "before it started" in final[MESSAGE]

        _, ticket, _ = app.check(*args_for(spec, model, method="sjd"))
        frames: List[tuple] = []
        worker = threading.Thread(target=lambda: frames.extend(
            app.generate(*args_for(spec, model, method="sjd"), ticket=ticket)))
        worker.start()
        deadline = time.time() + 30
        while not frames and time.time() < deadline:
            time.sleep(0.01)
        assert frames and frames[0][SUMMARY]["status"] == "waiting"
    finally:
        app.slot.release(other)
    worker.join(timeout=120)
    assert frames[-1][SUMMARY]["status"] == "finished" and app.jobs.remembered() == 0


def test_tree_candidates_beyond_top_k_are_warned_as_everywhere(app, app_model):
    spec, model = app_model
    message, ticket, _ = app.check(*args_for(spec, model, top_k=2, tree_width=4))
    assert ticket and "can never be accepted" in message  # it runs (exact), with the one warning


def test_generate_clicked_during_a_run_then_stop_then_generate_runs(app, app_model):
    """The stale stop flag: a second Generate during a run (its run dropped by Gradio), a Stop,
    then a Generate must run, not end with "Stopped before it started"."""
    spec, model = app_model
    _, ticket, _ = app.check(*args_for(spec, model, method="ar"))
    run = app.generate(*args_for(spec, model, method="ar"), ticket=ticket)
    next(run)
    message, dropped, waiting = app.check(*args_for(spec, model, method="ar"))  # the click Gradio drops
    assert dropped and not isinstance(waiting, str)  # the running run's card is left as it is
    app.stop()
    assert list(run)[-1][-1]["status"] == "stopped"
    _, ticket, _ = app.check(*args_for(spec, model, method="sjd"))
    final = list(app.generate(*args_for(spec, model, method="sjd"), ticket=ticket))[-1]
    assert final[-1]["status"] == "finished" and "before it started" not in final[-2]
    assert app.jobs.remembered() == 0


def test_check_refuses_bad_settings_at_once(app, app_model):
    spec, model = app_model
    message, ticket, _ = app.check(*args_for(spec, model, tree_depth=8, tree_width=4))
    assert not ticket and "with K = 4 use D &lt;= 4" in message
    message, ticket, _ = app.check(*args_for(spec, model, prompt="red " * 2100))
    assert not ticket and "2100 words" in message
    message, ticket, _ = app.check_compare(*args_for(spec, model), 0)
    assert not ticket and "Repeats must be between 1" in message
    message, ticket, _ = app.check(*args_for(spec, model, window=1))
    assert ticket and "L = 1" in message


def test_random_seeds_give_different_pictures(app, app_model):
    spec, model = app_model
    runs = [list(app.generate(*args_for(spec, model, seed=-1, method="sjd")))[-1] for _ in range(2)]
    seeds = [run[-1]["settings"]["seed"] for run in runs]
    assert all(run[-1]["settings"]["random_seed"] for run in runs) and seeds[0] != seeds[1]
    assert panel_image(runs[0]).tobytes() != panel_image(runs[1]).tobytes()
    for run, seed in zip(runs, seeds):
        assert f"Seed {seed} (random)" in run[STATS] and f"seed-{seed}" in Path(run[DOWNLOAD]).name


def test_the_seed_message_says_what_the_seed_reproduces(app, app_model):
    """With rejection and L = auto the window follows the measured speed: the seed reproduces the
    distribution, and the page says so instead of promising this picture."""
    spec, model = app_model
    rejection = list(app.generate(*args_for(spec, model, method="sjd", verify="rejection", window="auto")))[-1]
    assert "reproduces the distribution of pictures, not this picture" in rejection[MESSAGE]
    assert "to get this picture again" not in rejection[MESSAGE]
    assert rejection[-1]["settings"]["seed_reproduces"] == "distribution"
    gumbel = list(app.generate(*args_for(spec, model, method="sjd", verify="gumbel", window="auto")))[-1]
    assert "enter it as the seed to get this picture again" in gumbel[MESSAGE]
    assert gumbel[-1]["settings"]["seed_reproduces"] == "picture"


@pytest.mark.parametrize("field, value", [("0", None), ("", None), ("auto", "auto"), ("128", 128), ("64.0", 64)])
def test_the_node_budget_field_goes_through_the_shared_conversion(field, value):
    assert settings_for(method="sjd_pac", window="auto", node_budget=field).config.node_budget == value


@pytest.mark.parametrize("field, words", [("5000", "1 to 1024 nodes per pass, got 5000"), ("-3", "got -3"),
                                          ("lots", "whole number")])
def test_a_bad_node_budget_is_one_sentence(field, words):
    with pytest.raises(sp.ConfigError, match=words) as info:
        settings_for(method="sjd_pac", node_budget=field)
    assert str(info.value).startswith("node budget must") and str(info.value).count(". ") == 0


def test_the_node_budget_reaches_the_run_and_its_record(app, app_model):
    """A run within 64 nodes per pass: the record, the settings line under the numbers and the
    refusal of a budget without the tree (in the UI's words) come from the one conversion."""
    spec, model = app_model
    run = list(app.generate(*args_for(spec, model, window="auto", node_budget="64")))[-1]
    record = run[-1]["settings"]
    assert record["node_budget"] == 64 and "node budget 64" in run[STATS]
    message, ticket, _ = app.check(*args_for(spec, model, method="sjd", node_budget="128"))
    assert not ticket and "set the method to sjd_pac" in message and "node budget to 0 (off)" in message
    frames = list(app.generate(*args_for(spec, model, window="auto", node_budget="auto")))
    final = frames[-1]
    picked = final[SUMMARY]["budget_picked"]
    assert "node budget auto picked" in picked and picked in final[STATS]
    assert all("node budget auto picked" in f[STATS] for f in frames[1:] if f[SUMMARY]["status"] == "progress")


def test_a_budget_picked_over_the_models_window_takes_window_auto(app, app_model):
    """The model's own window would cap the budget's main chain: picking a budget while L shows
    it turns L to auto; a window the user chose stays, and no budget changes nothing."""
    _, model = app_model
    default = str(model.defaults.window)
    assert app.window_for_budget("128", default) == gr.update(value="auto")
    assert app.window_for_budget("auto", f" {default} ") == gr.update(value="auto")
    chosen = str(model.defaults.window + 20)
    for budget, window in (("128", chosen), ("128", "auto"), ("0", default), ("", default)):
        assert app.window_for_budget(budget, window) == gr.skip(), (budget, window)


def test_the_check_finite_switch_reaches_the_loader(app_model):
    calls = []

    def loader(path, **kwargs):
        calls.append(kwargs)
        return sp.load_model(path, **kwargs)

    spec, _ = app_model
    runner.ModelManager(None, device="cpu", loader=loader, check_finite=True).get(spec)
    runner.ModelManager(None, device="cpu", loader=loader).get(spec)
    assert calls[0]["check_finite"] is True and "check_finite" not in calls[1]


# --- the served app, through gradio_client ------------------------------------------------------

def test_served_app_streams_stops_and_survives_errors(served_app, app_model):
    from gradio_client import Client

    app, url = served_app
    spec, model = app_model
    assert url.startswith("http://127.0.0.1:")
    client = Client(url, verbose=False, download_files=False, analytics_enabled=False)

    job = client.submit(*args_for(spec, model, method="sjd_pac"), api_name="/generate")
    final = job.result(timeout=60)
    streamed = [o[-1] for o in job.outputs()]
    assert len(streamed) >= 2 and streamed[-1]["status"] == "finished"
    expected = reference_stats(model, "sjd_pac")
    assert final[-1]["forward_passes"] == expected.forward_passes
    assert final[-1]["step_compression"] == pytest.approx(expected.step_compression)

    # Stop: an AR run (one token per pass, the longest) ends early; the stop call shares the session.
    job = client.submit(*args_for(spec, model, method="ar"), api_name="/generate")
    deadline = time.time() + 30
    while not any(o[-1].get("status") == "progress" for o in job.outputs()) and time.time() < deadline:
        time.sleep(0.05)
    client.predict(api_name="/stop")
    stopped = job.result(timeout=30)[-1]
    assert stopped["status"] == "stopped" and stopped["forward_passes"] < stopped["num_tokens"]

    # A bad folder and an out-of-range knob: readable messages, and the server keeps serving.
    bad = client.predict(*args_for(spec, model, model_path="/nonexistent/model"), api_name="/generate")
    assert bad[-1]["status"] == "failed" and "does not exist" in bad[-1]["error"]
    bad = client.predict(*args_for(spec, model, window="2.5"), api_name="/generate")
    assert "window L must be a whole number" in bad[-1]["error"]
    bad = client.predict(*args_for(spec, model, tree_depth=8, tree_width=4), api_name="/generate")
    assert "with K = 4 use D <= 4" in bad[-1]["error"]
    # 8 + 16 + 32 + 64 + 128 = 248 nodes (first level 8, then K = 2): inside the budget
    ok = client.predict(*args_for(spec, model, tree_depth=6, tree_width=2), api_name="/generate")
    assert ok[-1]["status"] == "finished"  # within the budget, though above the page's first D top

    again = client.predict(*args_for(spec, model, method="sjd"), api_name="/generate")
    assert again[-1]["status"] == "finished"
    assert again[-1]["forward_passes"] == reference_stats(model, "sjd").forward_passes


def test_a_download_that_cannot_be_saved_keeps_the_picture(app, app_model, full_folder, monkeypatch):
    """A full disk under the download folder: the download goes to the temp dir (the page says
    where); if that fails too, the picture stays on the page with one sentence, and the run ends
    as finished."""
    from sjd_pac_core import files

    spec, model = app_model
    app.output_dir = full_folder
    final = list(app.generate(*args_for(spec, model, method="sjd")))[-1]
    assert final[-1]["status"] == "finished" and "kept it as" in final[MESSAGE]
    assert Path(final[DOWNLOAD]).is_file() and not Path(final[DOWNLOAD]).is_relative_to(full_folder)
    monkeypatch.setattr(files.tempfile, "mkdtemp", lambda prefix: str(full_folder))
    final = list(app.generate(*args_for(spec, model, method="sjd")))[-1]
    assert final[-1]["status"] == "finished" and panel_image(final) is not None and panel_image(final).size[0] >= 256
    assert "its download could not be saved" in final[MESSAGE] and "free some disk space" in final[MESSAGE]
