"""The app's logic without gradio: model picking, settings -> SamplerConfig, and a generation
run in a worker thread that streams its progress and can be stopped between forward passes.

Kept free of gradio so it can be tested (and reused) on its own; app.py only renders.
"""

from __future__ import annotations

import gc
import heapq
import io
import itertools
import json
import queue
import re
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple, Union

import torch
from PIL import Image, PngImagePlugin

import sjd_pac_core as sp
from sjd_pac_core.config import ConfigError, SamplerConfig
from sjd_pac_core.files import Kept, keep
from sjd_pac_core.pass_cost import RunPace, run_pace, slow_shape_warning
from sjd_pac_core.settings import RECORD_PNG_KEY, config_from_settings, run_record, seed_value, whole_number
from sjd_pac_core.threads import threads_for, torch_threads
from sjd_pac_core.models.loader import detect_family, read_config, resolve_device, resolve_folder

DEMO = "demo"
DEFAULT_MODELS_DIR = Path("models") / "autoregressive"
METHOD_LABELS: Dict[str, str] = {"ar": "AR", "sjd": "SJD", "sjd_pac": "SJD-PAC"}


# --- models ------------------------------------------------------------------------------------

def canonical_spec(spec: Union[str, Path, None]) -> str:
    """"demo" stays "demo"; a folder becomes its absolute path, so one folder is loaded once."""
    text = str(spec or "").strip()
    if not text:
        raise sp.ModelLoadError("No model chosen; pick one in the list or enter a model folder path.")
    if text == DEMO:
        return DEMO
    return str(Path(text).expanduser().resolve())


class ModelManager:
    """Holds at most one loaded model: a 7B checkpoint and a second one rarely fit together."""

    def __init__(
        self,
        models_dir: Union[str, Path, None] = None,
        device: str = "auto",
        dtype: str = "auto",
        loader: Callable[..., sp.ARImageModel] = sp.load_model,
        precheck: bool = True,
        quantize: str = "none",
        check_finite: bool = False,
    ) -> None:
        self.models_dir = Path(models_dir).expanduser() if models_dir else None
        self.device, self.dtype = device, dtype
        self.quantize = quantize  # none / int8 / 4bit / auto, passed to load_model when not "none"
        self.check_finite = check_finite  # check every weight for NaN/inf, whatever the model's size
        self._loader = loader
        self.precheck = precheck  # run load_model's cheap folder checks before unloading
        self._lock = threading.Lock()
        self.spec: Optional[str] = None
        self.model: Optional[sp.ARImageModel] = None
        self._extra: List[str] = []  # folders loaded by path, offered in the list afterwards

    def choices(self) -> List[Tuple[str, str]]:
        """(label, value) pairs for the model picker: the demo, the models folder, loaded paths."""
        items: List[Tuple[str, str]] = [("demo (bundled, 64x64)", DEMO)]
        folders = sp.list_model_folders(self.models_dir) if self.models_dir else []
        for folder in folders:
            items.append((folder.name, str(folder.resolve())))
        for spec in self._extra:
            if all(value != spec for _, value in items):
                items.append((Path(spec).name or spec, spec))
        return items

    def get(self, spec: Union[str, Path]) -> sp.ARImageModel:
        """The loaded model for spec, loading it (and releasing the previous one) if needed."""
        key = canonical_spec(spec)
        with self._lock:
            if self.model is not None and self.spec == key:
                return self.model
            if self.precheck:
                # The loader's cheap checks first (path, config.json, family): a typo in the
                # folder field must not unload the model that is working.
                folder = resolve_folder(key)
                detect_family(folder, read_config(folder))
            self._release()
            extra = {} if self.quantize == "none" else {"quantize": self.quantize}
            if self.check_finite:
                extra["check_finite"] = True
            model = self._loader(key, dtype=self.dtype, device=self.device, **extra)
            self.model, self.spec = model, key
            if key != DEMO and key not in self._extra:
                self._extra.append(key)
            return model

    def _release(self) -> None:
        if self.model is not None:
            try:
                self.model.unload()
            finally:
                self.model, self.spec = None, None
                free_memory()


def free_memory() -> None:
    """Return freed tensors to the system / the CUDA allocator after a run or a model switch."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def device_label(device: Optional[torch.device] = None, threads: Optional[int] = None) -> str:
    """A short human description of the device a model runs on (or would run on); on the CPU,
    `threads` is the thread count runs use (threads_for(model); default: torch's setting)."""
    if device is None:
        try:
            device = resolve_device("auto")
        except Exception:  # a broken CUDA install must not stop the page from rendering
            device = torch.device("cpu")
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return f"GPU: {props.name} ({props.total_memory / 2**30:.0f} GiB, cuda:{index})"
    if device.type == "mps":
        return "GPU: Apple Silicon (MPS)"
    threads = threads or torch.get_num_threads()
    return f"CPU, {threads} thread{'s' if threads != 1 else ''} (no GPU in use)"


def run_threads(model: sp.ARImageModel) -> int:
    """The CPU thread count a run of `model` uses (the shared rule of sjd_pac_core.threads)."""
    return threads_for(model) or torch.get_num_threads()


FALLBACK_DEFAULTS = sp.FamilyDefaults(resolutions=())  # what the page shows until a model is loaded


def defaults_of(model: Optional[sp.ARImageModel]) -> sp.FamilyDefaults:
    """The loaded model's recommended settings (the fields' values), or generic ones."""
    return model.defaults if model is not None else FALLBACK_DEFAULTS


def prompt_words(model: Optional[sp.ARImageModel]) -> List[str]:
    """The words a word-level model (the demo) knows; empty for models with a real tokenizer."""
    vocab = getattr(model, "vocab", None)
    words = getattr(vocab, "words", None)
    return list(words) if isinstance(words, (list, tuple)) else []


# --- settings ----------------------------------------------------------------------------------

# A prompt longer than this is refused before any work: the demo model reads a handful of words,
# and the real families' text encoders truncate far earlier (a 2,100-word prompt took 35 s of
# tokenising in the demo for nothing).
MAX_PROMPT_WORDS = 400


@dataclass(frozen=True)
class RunSettings:
    """Everything a run needs besides the model, validated. `seed` is the user's value, passed
    through to generate_image: None draws a random seed there, which the result reports."""

    prompt: str
    negative_prompt: str
    resolution: Optional[str]
    seed: Optional[int]
    config: SamplerConfig

    def record(self, model: sp.ARImageModel, seed: Optional[int], config: Optional[SamplerConfig] = None) -> dict:
        """The run record (settings.run_record, as the CLI and the nodes write it) of a run of
        `config` (default: these settings') with the seed it used (None while a random one is
        not drawn yet)."""
        cpu = model.device.type == "cpu"
        return run_record(config or self.config, prompt=self.prompt, seed=seed, random_seed=self.seed is None,
                          negative_prompt=self.negative_prompt, resolution=self.resolution, model=model.name or "",
                          family=model.family, device=str(model.device), threads=run_threads(model) if cpu else None)


def check_prompt(prompt: object) -> str:
    text = "" if prompt is None else str(prompt)
    words = len(text.split())
    if words > MAX_PROMPT_WORDS:
        raise ConfigError(
            f"The prompt has {words} words, more than the {MAX_PROMPT_WORDS} the app accepts; shorten it."
        )
    return text


def run_settings(
    defaults: Optional[sp.FamilyDefaults], prompt: object, negative_prompt: object, resolution: Optional[str],
    seed: object, method: Optional[str], verify: Optional[str], cfg_scale: object, temperature: object,
    top_k: object, top_p: object, window: object, tree_depth: object, tree_width: object,
    node_budget: object = None,
) -> RunSettings:
    """The page's values -> validated RunSettings (ConfigError: one sentence naming the field).

    The conversion itself is sjd_pac_core.settings (shared with the CLI and the nodes): empty
    fields take the model's defaults, top-k 0 / top-p 1 are off, L and the node budget may be
    'auto' (node budget 0 or empty: off), fractions in whole-number fields are refused; seed -1 (or empty) is None: generate_image draws a random one.
    """
    text = check_prompt(prompt)
    negative = check_prompt(negative_prompt)
    config = config_from_settings(
        defaults, method=method, window=window, tree_depth=tree_depth, tree_width=tree_width,
        node_budget=node_budget, verify=verify, cfg_scale=cfg_scale, temperature=temperature, top_k=top_k,
        top_p=top_p,
    )
    return RunSettings(text, negative, resolution or None, seed_value(seed), config)


DEFAULT_REPEATS = 3  # Compare: interleaved runs per method; the speedup is the ratio of medians
MAX_REPEATS = 10


def check_repeats(value: object) -> int:
    """Compare's repeat count: empty takes the default; a whole number from 1 to MAX_REPEATS."""
    count = whole_number(DEFAULT_REPEATS if value in (None, "") else value, "Repeats", "3")
    if not 1 <= count <= MAX_REPEATS:
        raise ConfigError(f"Repeats must be between 1 and {MAX_REPEATS}, got {count}; try 3.")
    return count


def friendly_error(exc: BaseException, config: Optional[SamplerConfig] = None,
                   device: Optional[torch.device] = None) -> str:
    """One readable sentence for the page; the library's own errors already name the fix."""
    if isinstance(exc, (ConfigError, sp.ModelLoadError, sp.NonFiniteError)):
        return str(exc)
    if isinstance(exc, torch.cuda.OutOfMemoryError) or isinstance(exc, MemoryError) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
    ):
        return out_of_memory_message(config, device)
    return f"Generation failed ({type(exc).__name__}: {exc}); check the settings and try again."


def out_of_memory_message(config: Optional[SamplerConfig], device: Optional[torch.device]) -> str:
    """Name what was big: the PD tree (D, K), the window L, or neither (then the model and device)."""
    where = "the GPU" if device is not None and device.type == "cuda" else (
        "the Mac's GPU" if device is not None and device.type == "mps" else "this computer's memory")
    if config is None or config.method == "ar":
        return f"Out of memory in {where} while generating; close other programs or load the model in a smaller dtype."
    if config.node_budget is not None and config.use_pd:
        return (f"Out of memory in {where}: each forward pass carries up to {config.pass_nodes} draft nodes "
                "(the node budget); lower the node budget (64 or 32).")
    tree = config.tree.level_nodes if config.use_pd else 0
    window = config.window if isinstance(config.window, int) else 0
    if tree > max(window, 64):
        return (f"Out of memory in {where}: each forward pass also scores the D = {config.tree_depth}, "
                f"K = {config.tree_width} drafting tree ({tree} extra tokens); lower D or K.")
    if window > 64:
        return f"Out of memory in {where}: each forward pass verifies L = {window} draft tokens; lower L (32 or 'auto')."
    return (f"Out of memory in {where} with small passes (L = {config.window}, a {tree}-node tree): the model "
            "itself needs more memory; close other programs, use a smaller dtype or another device.")


def slow_shape_notes(model: sp.ARImageModel, encoding: sp.PromptEncoding, configs: List[SamplerConfig]) -> List[str]:
    """Before a run: a sentence for each of `configs` whose pass shape is expected to be slower than
    AR on this device (pass_cost; the measurement is a few passes, once per shape). A measurement
    that fails says nothing: the run itself then reports the problem."""
    notes: List[str] = []
    for config in configs:
        try:
            with torch_threads(threads_for(model)):  # timed as the run will run
                note = slow_shape_warning(model, encoding, config)
        except Exception:
            note = None
        if note and note not in notes:
            notes.append(f"{METHOD_LABELS[config.method]}: {note}")
    return notes


def pace_of(model: sp.ARImageModel, encoding: sp.PromptEncoding, config: SamplerConfig) -> RunPace:
    """pass_cost's RunPace for a Generate run: the certain sentence before it, the measured one
    once during it. A measurement that fails says nothing: the run itself then reports the problem."""
    try:
        with torch_threads(threads_for(model)):  # timed as the run will run
            return run_pace(model, encoding, config)
    except Exception:
        return RunPace(config, None)


# --- stopping ----------------------------------------------------------------------------------

class JobRegistry:
    """Stop flags, one per run, by browser session.

    A click whose settings pass takes a ticket (`ticket`: a number that only grows), which its
    run carries through the queue. The run's stop flag is made when the run starts (`begin`),
    so a click whose run never starts (Gradio drops a click on an event still running) leaves
    nothing behind. Stop sets the running run's flag and marks the session with a new number:
    a run whose ticket is older than that mark was clicked before the Stop, so it starts already
    stopped (a run stopped while it waited never runs). A run without a ticket (the API) is
    never stopped before it starts.
    """

    def __init__(self) -> None:
        self._running: Dict[str, Tuple[threading.Event, str]] = {}  # session -> (flag, "generate"/"compare")
        self._stopped_at: Dict[str, int] = {}  # session -> the number of its last Stop
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()

    def ticket(self) -> int:
        with self._lock:
            return next(self._numbers)

    def begin(self, key: str, ticket: Optional[int] = None, kind: str = "generate") -> threading.Event:
        """The stop flag of the run now starting, already set if its click came before a Stop."""
        with self._lock:
            mark = self._stopped_at.get(key)
            event = threading.Event()
            if ticket is not None and mark is not None:
                if ticket < mark:
                    event.set()
                else:  # clicked after the Stop: runs start in click order, so no older run waits
                    del self._stopped_at[key]
            old = self._running.get(key)
            if old is not None:
                old[0].set()  # one run per session: a new one ends the old one
            self._running[key] = (event, kind)
            return event

    def stop(self, key: str) -> bool:
        """Stop the session's running run after the forward pass in flight, and its runs still
        waiting in the queue before they start; whether a run was running."""
        with self._lock:
            self._stopped_at[key] = next(self._numbers)
            event = self._running.get(key, (None, ""))[0]
            if event is None or event.is_set():
                return False
            event.set()
            return True

    def end(self, key: str, event: threading.Event) -> None:
        with self._lock:
            if self._running.get(key, (None, ""))[0] is event:
                del self._running[key]

    def running(self, key: str, kind: Optional[str] = None) -> bool:
        """Whether the session has a run going (of this kind, if given)."""
        with self._lock:
            return key in self._running and kind in (None, self._running[key][1])

    def remembered(self) -> int:
        """Sessions with something kept: a running run or a Stop that queued runs may still meet."""
        with self._lock:
            return len(set(self._running) | set(self._stopped_at))


class SamplerSlot:
    """The sampler, held by one run (or model switch) at a time across every session, given in the
    order of the clicks (their tickets).

    Runs wait for it here rather than in Gradio's queue: a run waiting here sees its stop flag at
    once and ends with its own "stopped" frame, where a run in Gradio's queue could only learn of
    the Stop when its turn came (16-33 s behind another tab's run).
    """

    POLL = 0.05  # seconds between looks at a waiting run's stop flag

    def __init__(self) -> None:
        self._turn = threading.Condition()
        self._holder: Optional[int] = None
        self._waiting: List[int] = []  # the tickets waiting, as a heap

    def acquire(self, order: int, stop: Optional[threading.Event] = None, timeout: Optional[float] = None) -> bool:
        """Wait until no one holds the sampler and no smaller ticket waits, then hold it; False
        (not held) when `stop` is set or `timeout` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._turn:
            heapq.heappush(self._waiting, order)
            try:
                while self._holder is not None or self._waiting[0] != order:
                    left = None if deadline is None else deadline - time.monotonic()
                    if (stop is not None and stop.is_set()) or (left is not None and left <= 0):
                        return False
                    self._turn.wait(self.POLL if left is None else min(self.POLL, left))
                self._holder = order
                return True
            finally:
                self._waiting.remove(order)
                heapq.heapify(self._waiting)
                self._turn.notify_all()

    def release(self, order: int) -> None:
        with self._turn:
            if self._holder == order:
                self._holder = None
                self._turn.notify_all()

    def waiting(self) -> int:
        with self._turn:
            return len(self._waiting)


def ticket_value(value: object) -> Optional[int]:
    """A run's ticket as the page sends it back (a string or number; empty: none, as from the API)."""
    try:
        return int(str(value).strip()) if value not in (None, "") else None
    except ValueError:
        return None


# --- streaming a run ---------------------------------------------------------------------------

@dataclass
class Update:
    """One step of a streamed run, as the UI sees it.

    kind: "progress" (running), "finished", "stopped" or "failed".
    stats: a consistent snapshot of the run so far (None before the first forward pass);
    progress.tokens are the tokens committed at exactly that snapshot, so an image drawn from
    them matches the numbers shown beside it.
    threads: the CPU thread count the run used.
    """

    kind: str
    elapsed: float
    progress: Optional[sp.Progress] = None
    stats: Optional[sp.RunStats] = None
    result: Optional[sp.ImageResult] = None
    error: Optional[BaseException] = None
    threads: Optional[int] = None

    @property
    def done(self) -> bool:
        return self.kind != "progress"


def snapshot_stats(progress: sp.Progress) -> sp.RunStats:
    """The worker keeps appending to progress.stats; copy the passes up to this one."""
    records = progress.stats.records[: progress.record.index + 1]
    return sp.RunStats(num_tokens=progress.stats.num_tokens, method=progress.stats.method, records=list(records))


def snapshot_progress(progress: sp.Progress) -> sp.Progress:
    """A frozen copy of the worker's Progress (its tokens and stats keep growing)."""
    return replace(progress, stats=snapshot_stats(progress), tokens=progress.tokens.detach().clone())


# Frames per run: a frame is shown at each 1/FRAME_MILESTONES of the image (so even a 2-second
# run visibly fills in) and at most every `interval` seconds in between.
FRAME_MILESTONES = 16
# The sampler waits while a frame is drawn (its per-pass times exclude callbacks, so waiting
# does not change the measured speed); this bounds the wait if the page has gone away.
FRAME_HANDOFF_TIMEOUT = 10.0


@dataclass
class _Frame:
    progress: sp.Progress
    shown: threading.Event


@dataclass
class _Finished:
    result: Optional[sp.ImageResult] = None
    error: Optional[BaseException] = None
    cancelled: bool = False


def stream_generation(
    model: sp.ARImageModel,
    prompt: str,
    config: SamplerConfig,
    seed: Optional[int],
    stop: threading.Event,
    negative_prompt: str = "",
    resolution: Optional[str] = None,
    interval: float = 0.1,
    frames: bool = True,
) -> Iterator[Update]:
    """Run generate_image in a worker thread; yield "progress" Updates while it runs, then one
    final Update.

    With `frames`, the worker hands over a frame at every 1/FRAME_MILESTONES of the tokens and
    whenever `interval` seconds (or 3x the time the consumer took for the last frame, so that
    drawing never takes more than ~1/4 of the run) have passed, and waits until the consumer
    asks for the next update: the frame's tokens and numbers are exactly the sampler's at that
    pass. Without `frames`, only the final Update comes.

    Setting `stop` ends the run after the forward pass in flight (the callback raises
    GenerationCancelled; the sampler frees its cache on the way out). The run uses the thread
    count of the shared rule (threads_for), restored afterwards.
    """
    events: "queue.Queue[Union[_Frame, _Finished]]" = queue.Queue()
    last: List[sp.Progress] = []  # the worker's latest pass, for a stopped or failed run
    threads = run_threads(model)
    pace = {"next_milestone": 0, "next_time": 0.0, "wait": interval}

    def frame_due(progress: sp.Progress) -> bool:
        committed = int(progress.tokens.shape[-1])
        if committed >= pace["next_milestone"] or time.perf_counter() >= pace["next_time"]:
            step = max(1, progress.num_tokens // FRAME_MILESTONES)
            pace["next_milestone"] = (committed // step + 1) * step
            return committed < progress.num_tokens  # the last one comes with the result
        return False

    def callback(progress: sp.Progress) -> None:
        if stop.is_set():
            raise sp.GenerationCancelled("stopped from the app")
        last[:] = [progress]
        if frames and frame_due(progress):
            frame = _Frame(snapshot_progress(progress), threading.Event())
            events.put(frame)
            frame.shown.wait(FRAME_HANDOFF_TIMEOUT)
            pace["next_time"] = time.perf_counter() + pace["wait"]
            if stop.is_set():
                raise sp.GenerationCancelled("stopped from the app")

    def work() -> None:
        try:
            with torch_threads(threads_for(model)):
                result = sp.generate_image(
                    model, prompt, config, seed=seed, negative_prompt=negative_prompt,
                    resolution=resolution, callback=callback,
                )
            events.put(_Finished(result=result))
        except sp.GenerationCancelled:
            events.put(_Finished(cancelled=True))
        except BaseException as exc:  # reported in the page; the app keeps serving
            events.put(_Finished(error=exc))

    start = time.perf_counter()
    worker = threading.Thread(target=work, name="sjd-pac-generate", daemon=True)
    worker.start()
    try:
        while True:
            item = events.get()
            if isinstance(item, _Frame):
                handed = time.perf_counter()
                try:
                    yield Update("progress", handed - start, progress=item.progress,
                                 stats=item.progress.stats, threads=threads)
                finally:
                    # The consumer is back for more: the time it took is the cost of a frame.
                    pace["wait"] = max(interval, 3.0 * (time.perf_counter() - handed))
                    item.shown.set()
                continue
            worker.join()
            elapsed = time.perf_counter() - start
            latest = snapshot_progress(last[0]) if last else None
            if item.result is not None:
                yield Update("finished", elapsed, stats=item.result.stats, result=item.result,
                             progress=latest, threads=threads)
            elif item.cancelled:
                yield Update("stopped", elapsed, progress=latest, stats=latest.stats if latest else None,
                             threads=threads)
            else:
                yield Update("failed", elapsed, progress=latest, error=item.error,
                             stats=latest.stats if latest else None, threads=threads)
            return
    finally:
        if worker.is_alive():  # the consumer went away (page closed): stop the worker too
            stop.set()
            while not events.empty():  # release a frame the worker may be waiting on
                item = events.get_nowait()
                if isinstance(item, _Frame):
                    item.shown.set()
            worker.join(timeout=30)
        free_memory()


def tokens_identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.equal(a.cpu(), b.cpu()))


def run_summary(stats: Optional[sp.RunStats], status: str, elapsed: float,
                extra: Optional[dict] = None) -> dict:
    """The numbers the page shows, as plain JSON (the API's and the tests' view of a run)."""
    summary: dict = {"status": status, "elapsed": round(elapsed, 4)}
    if stats is not None:
        summary.update(
            method=stats.method,
            tokens_committed=stats.tokens_committed,
            num_tokens=stats.num_tokens,
            forward_passes=stats.forward_passes,
            step_compression=stats.step_compression,
            tokens_per_second=stats.tokens_per_second,
            wall_time=stats.wall_time,
            accept_lengths=stats.accept_lengths,
            histogram={str(k): v for k, v in stats.histogram().items()},
        )
    if extra:
        summary.update(extra)
    return summary


# --- the picture to keep -----------------------------------------------------------------------

KEEP_MIN_SIDE = 512  # the demo's 64x64 is saved at 512x512 (nearest: every token's patch stays sharp)


def upscale_to_keep(image: Image.Image, min_side: int = KEEP_MIN_SIDE) -> Image.Image:
    """Enlarge small images by a whole factor (nearest) until the long side is >= min_side."""
    factor = max(1, -(-min_side // max(image.size)))
    return image if factor == 1 else image.resize((image.width * factor, image.height * factor), Image.NEAREST)


def image_file_name(prompt: str, seed: int, method: str) -> str:
    """e.g. "a-red-circle-on-a-blue-background_seed-42_sjd_pac.png" (safe on every file system)."""
    slug = re.sub(r"[^a-z0-9]+", "-", prompt.lower()).strip("-")[:60].rstrip("-") or "unconditional"
    return f"{slug}_seed-{seed}_{method}.png"


def png_text(record: dict) -> Dict[str, str]:
    """The PNG text chunks of a picture the app hands out (its download and the images on the page,
    which Gradio's own download button saves with their text chunks): "sjd_pac", the run record as
    JSON, and "parameters", the line other image tools read."""
    return {
        RECORD_PNG_KEY: json.dumps(record, sort_keys=True),
        "parameters": f"{record.get('prompt', '')}\nSeed: {record.get('seed')}, "
                      f"Sampler: {record.get('method')} ({record.get('verify')})",
    }


def save_image(image: Image.Image, record: dict, folder: Union[str, Path]) -> Kept:
    """Write the upscaled picture as a PNG whose text chunk "sjd_pac" holds the run record
    (prompt, seed and every knob) as JSON, named after prompt and seed; whole or not at all, and
    in the temp dir when `folder` cannot take it (Kept.note says so; FileSaveError if neither can)."""
    keep_image = upscale_to_keep(image)
    info = PngImagePlugin.PngInfo()
    for key, value in png_text(record).items():
        info.add_text(key, value)
    path = Path(folder) / image_file_name(str(record.get("prompt", "")), int(record.get("seed", 0)),
                                          str(record.get("method", "image")))
    buffer = io.BytesIO()
    keep_image.save(buffer, format="PNG", pnginfo=info)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass  # keep() then writes it to the temp dir and says so
    return keep(path, buffer.getvalue())
