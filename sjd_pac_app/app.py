"""The Gradio app's handlers and their state: SjdPacApp, a thin shell over load_model /
generate_image and its per-pass callback.

The handlers are plain generator functions, callable without a server (which is how the tests
drive them); layout.build(app) wires them into the page, view.py renders what they return, and
runner.py runs a generation in a worker thread.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import gradio as gr

import sjd_pac_core as sp
from sjd_pac_core.files import FileSaveError
from sjd_pac_core.settings import auto_budget_line, pointless_setting_warnings, seed_note

from . import layout, plots
from .runner import (
    DEFAULT_REPEATS,
    DEMO,
    METHOD_LABELS,
    JobRegistry,
    ModelManager,
    RunSettings,
    SamplerSlot,
    Update,
    canonical_spec,
    check_repeats,
    defaults_of,
    free_memory,
    friendly_error,
    pace_of,
    png_text,
    prompt_words,
    run_settings,
    run_summary,
    save_image,
    slow_shape_notes,
    stream_generation,
    ticket_value,
    tokens_identical,
)
from .view import (METHODS, compare_card, compare_summary_html, hints, live_image_html, message_md,
                   model_info_html, stats_html, words_md)

LOCAL_SESSION = "local"  # the session key when handlers are called without a server


def session_key(request: Optional[gr.Request]) -> str:
    return getattr(request, "session_hash", None) or LOCAL_SESSION


class SjdPacApp:
    """Handlers and layout. One instance serves every browser session."""

    def __init__(self, manager: ModelManager, initial_model: str = DEMO, interval: float = 0.1,
                 output_dir: Optional[str] = None) -> None:
        self.manager = manager
        self.initial_model = initial_model
        self.interval = interval  # seconds between live updates
        self.jobs = JobRegistry()
        self.slot = SamplerSlot()  # one run or model switch at a time, in click order
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
        """Load the chosen model (after the run in progress: runs and switches share the sampler);
        its family's defaults (and the hints that quote them) fill the controls."""
        order = self.jobs.ticket()
        self.slot.acquire(order)
        try:
            return self._select_model(choice, path)
        finally:
            self.slot.release(order)

    def window_for_budget(self, budget: object, window: object) -> Any:
        """A node budget picked while L still shows the model's own window: L becomes 'auto'.
        A budget's tree chooses its main chain up to L, and a family's window (the demo's 12)
        would cap it far below what 128 nodes carry; a window the user chose stays."""
        model = self.manager.model
        picked = str(budget).strip() not in ("", "0")
        if model is not None and picked and str(window).strip() == str(model.defaults.window):
            return gr.update(value="auto")
        return gr.skip()

    def _select_model(self, choice: str, path: str) -> tuple:
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
            gr.update(value=d.cfg_scale, info=h["cfg_scale"]),
            gr.update(value=d.temperature, info=h["temperature"]),
            gr.update(value=d.top_k or 0, info=h["top_k"]),
            gr.update(value=d.top_p or 1.0, info=h["top_p"]),
            gr.update(value=str(d.window), info=h["window"]),
            gr.update(value=d.tree_depth, maximum=layout.depth_limit(d.tree_width), info=h["tree_depth"]),
            gr.update(value=d.tree_width, maximum=layout.width_limit(d.tree_depth), info=h["tree_width"]),
            gr.update(value=words_md(model), visible=bool(prompt_words(model))),
            message_md(notes=[f"Loaded {model.name} ({model.family}); settings set to its defaults."]),
        )

    def check(
        self, model_choice: str, model_path: str, prompt: str, negative_prompt: str, resolution: Optional[str],
        seed: object, method: str, verify: str, cfg_scale: object, temperature: object, top_k: object,
        top_p: object, window: object, tree_depth: object, tree_width: object, node_budget: object,
        request: Optional[gr.Request] = None, kind: str = "generate",
    ) -> Tuple[str, str, Any]:
        """Runs at once on a click, outside the queue: settings refused before any work (and
        before waiting for another tab's run), and a ticket for the run that will queue (its
        stop mark: see JobRegistry). Outputs: message, ticket ("" when refused), and the run's
        status card saying it waits (unchanged while this session's run of the same kind goes on:
        Gradio drops that click)."""
        try:
            settings = run_settings(defaults_of(self.manager.model), prompt, negative_prompt, resolution,
                                    seed, method, verify, cfg_scale, temperature, top_k, top_p, window,
                                    tree_depth, tree_width, node_budget)
        except Exception as exc:
            return message_md([friendly_error(exc)]), "", gr.skip()
        notes = pointless_setting_warnings(settings.config)
        if self.jobs.running(session_key(request), kind):
            waiting: Any = gr.skip()
        elif kind == "compare":
            waiting = compare_summary_html({}, "", 0, "waiting")
        else:
            waiting = stats_html({"status": "waiting"})
        return message_md(notes=notes), str(self.jobs.ticket()), waiting

    def check_compare(
        self, model_choice: str, model_path: str, prompt: str, negative_prompt: str, resolution: Optional[str],
        seed: object, method: str, verify: str, cfg_scale: object, temperature: object, top_k: object,
        top_p: object, window: object, tree_depth: object, tree_width: object, node_budget: object,
        repeats: object,
        request: Optional[gr.Request] = None,
    ) -> Tuple[str, str, Any]:
        """`check` for Compare: the same settings plus the repeat count."""
        try:
            check_repeats(repeats)
        except Exception as exc:
            return message_md([friendly_error(exc)]), "", gr.skip()
        return self.check(model_choice, model_path, prompt, negative_prompt, resolution, seed, method, verify,
                          cfg_scale, temperature, top_k, top_p, window, tree_depth, tree_width, node_budget,
                          request=request,
                          kind="compare")

    @staticmethod
    def gate(ticket: str) -> None:
        """Ends the click's chain when `check` refused the settings (its message is shown)."""
        if not ticket:
            raise gr.Error("settings refused", visible=False, print_exception=False)

    def stop(self, request: Optional[gr.Request] = None) -> None:
        """Stop this session's run after the forward pass in flight, and its queued runs."""
        self.jobs.stop(session_key(request))

    def generate(
        self, model_choice: str, model_path: str, prompt: str, negative_prompt: str, resolution: Optional[str],
        seed: object, method: str, verify: str, cfg_scale: object, temperature: object, top_k: object,
        top_p: object, window: object, tree_depth: object, tree_width: object, node_budget: object,
        ticket: object = None,
        request: Optional[gr.Request] = None,
    ) -> Iterator[tuple]:
        """One image, streamed. Outputs: tabs, image, live picture, download, per-pass chart,
        histogram, stats, message, JSON. `ticket`: the click's, from `check` (none from the API);
        the run waits for the sampler in its order (SamplerSlot)."""
        key = session_key(request)
        order = ticket_value(ticket)
        stop = self.jobs.begin(key, order, "generate")
        order = self.jobs.ticket() if order is None else order
        held = False
        try:
            held = yield from self._take_sampler(order, stop, live=True)
            if not held:
                yield self._status_outputs(True, "stopped", notes=[
                    "Stopped before it started (it was waiting for another run); nothing was generated."])
                return
            setup = yield from self._setup(
                model_choice, model_path, prompt, negative_prompt, resolution, seed, method, verify,
                cfg_scale, temperature, top_k, top_p, window, tree_depth, tree_width, node_budget, live=True,
            )
            if setup is None:
                return
            model, settings, encoding = setup
            pace = pace_of(model, encoding, settings.config)
            label = METHOD_LABELS[settings.config.method]
            warnings = pointless_setting_warnings(settings.config) + ([f"{label}: {pace.before}"] if pace.before
                                                                      else [])
            notes = [*warnings, *encoding.warnings]
            first = True
            for update in stream_generation(model, settings.prompt, settings.config, settings.seed, stop,
                                            settings.negative_prompt, encoding.resolution, self.interval):
                slow_now = pace.during(update.stats) if update.stats is not None else None
                if slow_now:  # measured on the run's first passes: shown from this frame on
                    warnings.append(f"{label}: {slow_now}")
                    notes.append(warnings[-1])
                yield self._live_outputs(model, update, settings, warnings, notes, select_tab=first)
                first = False
        finally:
            if held:
                self.slot.release(order)
            self.jobs.end(key, stop)

    def compare(
        self, model_choice: str, model_path: str, prompt: str, negative_prompt: str, resolution: Optional[str],
        seed: object, method: str, verify: str, cfg_scale: object, temperature: object, top_k: object,
        top_p: object, window: object, tree_depth: object, tree_width: object, node_budget: object,
        repeats: object = DEFAULT_REPEATS,
        ticket: object = None, request: Optional[gr.Request] = None,
    ) -> Iterator[tuple]:
        """AR, SJD and SJD-PAC with the same prompt and seed (`method` is ignored), `repeats`
        times interleaved (AR, SJD, SJD-PAC, AR, ...) so that the speedup, a ratio of median wall
        times, is not one noisy measurement. Outputs: tabs, 3 images, 3 live pictures, 3 cards, summary,
        message, JSON."""
        key = session_key(request)
        order = ticket_value(ticket)
        stop = self.jobs.begin(key, order, "compare")
        order = self.jobs.ticket() if order is None else order
        held = False
        try:
            held = yield from self._take_sampler(order, stop, live=False)
            if not held:
                yield self._compare_outputs({m: {"status": "skipped"} for m in METHODS}, [gr.skip()] * 3, "stopped",
                                            0, verify or "", 1, [], [
                                                "Stopped before it started (it was waiting for another run)."])
                return
            setup = yield from self._setup(
                model_choice, model_path, prompt, negative_prompt, resolution, seed, "sjd_pac", verify,
                cfg_scale, temperature, top_k, top_p, window, tree_depth, tree_width, node_budget, live=False,
                repeats=repeats,
            )
            if setup is None:
                return
            model, settings, encoding = setup
            count = check_repeats(repeats)
            encoding.warnings.extend(slow_shape_notes(model, encoding, [settings.config.with_(method=m)
                                                                        for m in ("sjd", "sjd_pac")]))
            yield from self._compare_runs(model, settings, encoding, count, stop)
        finally:
            if held:
                self.slot.release(order)
            self.jobs.end(key, stop)

    # --- pieces -----------------------------------------------------------------------------
    def _take_sampler(self, order: int, stop, live: bool):
        """Hold the sampler for this run, waiting (and saying so) while another run holds it;
        False at once when the run is stopped first (it then never starts)."""
        if stop.is_set():
            return False
        if self.slot.acquire(order, stop, timeout=0):
            return True
        yield self._status_outputs(live, "waiting", keep_message=True)
        return self.slot.acquire(order, stop)

    def _setup(self, model_choice, model_path, prompt, negative_prompt, resolution, seed, method, verify,
               cfg_scale, temperature, top_k, top_p, window, tree_depth, tree_width, node_budget, live: bool,
               repeats: object = 1):
        """Validate the settings and load the model; on a problem yield the error and return None."""
        try:
            if not live:
                check_repeats(repeats)
            spec = (model_path or "").strip() or model_choice
            # Validate against the defaults of the model that will run (empty fields take them).
            loaded = self.manager.model if self.manager.spec == canonical_spec(spec) else None
            settings = run_settings(defaults_of(loaded), prompt, negative_prompt, resolution, seed, method,
                                    verify, cfg_scale, temperature, top_k, top_p, window, tree_depth, tree_width,
                                    node_budget)
            if loaded is None:
                yield self._status_outputs(live, "loading", notes=[f"Loading {spec} …"])
            model = self.manager.get(spec)
            if loaded is None:  # re-read empty fields against the model just loaded
                settings = run_settings(model.defaults, prompt, negative_prompt, resolution, seed, method,
                                        verify, cfg_scale, temperature, top_k, top_p, window, tree_depth,
                                        tree_width, node_budget)
            encoding = model.encode_prompt(settings.prompt, settings.negative_prompt, settings.resolution)
        except Exception as exc:
            message = friendly_error(exc)
            free_memory()  # a load that ran out of memory leaves half a model behind
            gr.Warning(message)
            yield self._status_outputs(live, "failed", errors=[message])
            return None
        return model, settings, encoding

    def _status_outputs(self, live: bool, status: str, errors: Sequence[str] = (),
                        notes: Sequence[str] = (), keep_message: bool = False) -> tuple:
        summary = {"status": status, "elapsed": 0.0}
        if errors:
            summary["error"] = errors[0]
        message = gr.skip() if keep_message else message_md(errors, notes)  # (the click's own notes stay)
        if live:
            return (gr.skip(),) * 6 + (stats_html(summary), message, summary)
        cards = (gr.skip(),) * 3 if status in ("loading", "progress", "waiting") else tuple(
            compare_card(m, {"status": "skipped"}) for m in METHODS)
        return (gr.skip(),) * 7 + cards + (compare_summary_html({}, "", 0, status), message, summary)

    def _image_for(self, model: sp.ARImageModel, update: Update, record: dict) -> Any:
        if update.result is not None:
            image = plots.upscale_for_display(update.result.images[0])
            image.info.update(png_text(record))  # Gradio's download button keeps PNG text chunks
            return image
        if update.progress is None:
            return gr.skip()
        return plots.upscale_for_display(self._partial_picture(model, update.progress))

    @staticmethod
    def _partial_picture(model: sp.ARImageModel, progress: sp.Progress) -> Any:
        """The picture of the tokens so far, at the model's own preview size (or a placeholder)."""
        try:
            preview = model.preview(progress.tokens)
        except Exception:  # a preview is a nicety; never let it end a run
            preview = None
        if preview is None:
            n, total = int(progress.tokens.shape[-1]), progress.num_tokens
            return plots.placeholder_image(text=f"no preview for this family · {n}/{total} tokens")
        return preview

    def _pictures(self, model: sp.ARImageModel, update: Update, record: dict, first: bool) -> Tuple[Any, Any]:
        """(image panel, live panel) of a frame. While a run goes on, its picture travels inline in
        the live panel, in the same update as its numbers, and the image panel is hidden; the final
        picture (with its settings inside, for the panel's download button) goes to the image panel."""
        if update.kind == "progress":
            picture = self._partial_picture(model, update.progress)
            small = max(picture.size) < 256
            alt = f"The picture so far: {update.stats.tokens_committed} of {update.stats.num_tokens} tokens"
            live = gr.update(value=live_image_html(plots.inline_image(picture), alt, small), visible=True)
            return (gr.update(visible=False) if first else gr.skip()), live
        hidden = gr.update(value="", visible=False)
        if update.result is None and update.progress is None:  # ended before its first pass
            return gr.update(visible=True), hidden
        return gr.update(value=self._image_for(model, update, record), visible=True), hidden

    def _live_outputs(self, model: sp.ARImageModel, update: Update, settings: RunSettings, warnings: Sequence[str],
                      notes: Sequence[str], select_tab: bool) -> tuple:
        record = settings.record(model, update.result.seed if update.result else settings.seed)
        summary = run_summary(update.stats, update.kind, update.elapsed,
                              {"settings": record, "seed": record["seed"], "prompt": record["prompt"]})
        if warnings:
            summary["warnings"] = list(warnings)
        picked = auto_budget_line(settings.config, [r.envelope for r in update.stats.records]) if update.stats else None
        if picked:  # node budget 'auto': what it chose so far, beside the settings
            summary["budget_picked"] = picked
        errors: List[str] = []
        notes = list(notes)
        download: Any = gr.skip()
        if update.kind == "stopped":
            passes = update.stats.forward_passes if update.stats else 0
            notes.insert(0, f"Stopped after {passes} forward passes; memory freed. Generate again any time.")
        elif update.kind == "failed":
            errors.append(friendly_error(update.error, settings.config, model.device))
            summary["error"] = errors[0]
            gr.Warning(errors[0])
        elif update.kind == "finished":
            note = seed_note(settings.config)
            notes.insert(0, f"Seed {record['seed']}{' (random)' if record['random_seed'] else ''}: "
                            f"{note or 'enter it as the seed to get this picture again'}.")
            try:
                kept = save_image(update.result.images[0], record, self.output_dir)
            except FileSaveError as exc:  # the picture stays on the page; only the download is missing
                errors.append(f"The picture is shown above but its download could not be saved: {exc}.")
            else:
                summary["file"] = kept.path.name
                download = str(kept.path)
                if kept.moved:
                    notes.append(kept.note)
        stats = update.stats
        method = stats.method if stats else "sjd_pac"
        lengths = stats.accept_lengths if stats else []
        total = stats.num_tokens if stats else 0
        picture, live = self._pictures(model, update, record, first=select_tab)
        return (
            gr.Tabs(selected="live") if select_tab else gr.skip(),
            picture,
            live,
            download,
            plots.tokens_per_pass_chart(lengths, method, min_passes=total if method == "ar" else 24),
            plots.histogram_chart(stats.histogram() if stats else {}, method),
            stats_html(summary),
            message_md(errors, notes),
            summary,
        )

    def _compare_outputs(self, summaries: Dict[str, Dict[str, Any]], images: List[Any], overall: str,
                         seed: Optional[int], verify: str, repeats: int, errors: Sequence[str], notes: Sequence[str],
                         select_tab: bool = False, record: Optional[dict] = None,
                         lives: Optional[List[Any]] = None) -> tuple:
        """Compare's outputs: tabs, the 3 image panels, the 3 live panels (`lives`; as `_pictures`),
        the 3 cards, the summary, the message and the JSON report."""
        report: Dict[str, Any] = {"status": overall, "seed": seed, "verify": verify, "repeats": repeats,
                                  "methods": summaries}
        if record:  # the comparison's settings: every method's but the method
            report["settings"] = {key: value for key, value in record.items() if key != "method"}
        if errors:
            report["error"] = errors[0]
        return (
            gr.Tabs(selected="compare") if select_tab else gr.skip(),
            *images,
            *(lives or [gr.skip()] * len(METHODS)),
            *(compare_card(m, summaries.get(m)) for m in METHODS),
            compare_summary_html(summaries, verify, seed, overall, repeats),
            message_md(errors, notes),
            report,
        )

    def _compare_runs(self, model: sp.ARImageModel, settings: RunSettings, encoding: sp.PromptEncoding,
                      repeats: int, stop) -> Iterator[tuple]:
        config, seed = settings.config, settings.seed  # a random seed: the first run draws it, the rest reuse it
        summaries: Dict[str, Dict[str, Any]] = {}
        times: Dict[str, List[float]] = {m: [] for m in METHODS}
        tokens: Dict[str, Any] = {}
        first = True
        notes = list(encoding.warnings)
        live_shown: set = set()  # methods whose live panel has replaced their image panel
        for repeat in range(repeats):
            for method in METHODS:
                live = repeat == 0  # later repeats only time the runs: no frames
                for update in stream_generation(model, settings.prompt, config.with_(method=method), seed, stop,
                                                settings.negative_prompt, encoding.resolution, self.interval,
                                                frames=live):
                    images: List[Any] = [gr.skip()] * 3
                    lives: List[Any] = [gr.skip()] * 3
                    if update.kind == "finished":
                        seed = update.result.seed
                    record = settings.record(model, seed, config.with_(method=method))
                    if live:  # its picture: inline while it runs, in the image panel once it ends
                        column = METHODS.index(method)
                        images[column], lives[column] = self._pictures(model, update, record,
                                                                       first=method not in live_shown)
                        live_shown.add(method)
                    if update.kind in ("progress", "finished") and live:
                        summaries[method] = run_summary(update.stats, update.kind, update.elapsed)
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
                                                    record=record, lives=lives)
                        return
                    all_done = repeat == repeats - 1 and method == METHODS[-1] and update.kind == "finished"
                    if not live and not all_done and update.kind != "finished":
                        continue
                    yield self._compare_outputs(summaries, images, "finished" if all_done else "progress", seed,
                                                config.verify, repeats, [], notes, select_tab=first, record=record,
                                                lives=lives)
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

    def build(self) -> gr.Blocks:
        """The page (layout.build), wired to these handlers."""
        return layout.build(self)
