"""The app's logic without gradio: model picking, settings -> SamplerConfig, and a generation
run in a worker thread that streams its progress and can be stopped between forward passes.

Kept free of gradio so it can be tested (and reused) on its own; app.py only renders.
"""

from __future__ import annotations

import gc
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple, Union

import torch

import sjd_pac_core as sp
from sjd_pac_core.config import ConfigError, SamplerConfig
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
    ) -> None:
        self.models_dir = Path(models_dir).expanduser() if models_dir else None
        self.device, self.dtype = device, dtype
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
            model = self._loader(key, dtype=self.dtype, device=self.device)
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


def device_label(device: Optional[torch.device] = None) -> str:
    """A short human description of the device a model runs on (or would run on)."""
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
    threads = torch.get_num_threads()
    return f"CPU ({threads} thread{'s' if threads != 1 else ''}; no GPU in use)"


# --- settings ----------------------------------------------------------------------------------

def _whole(value: object, name: str, example: str) -> int:
    """UI numbers arrive as float or None; the sampler wants ints."""
    if value is None or value == "":
        raise ConfigError(f"{name} is empty; enter a whole number such as {example}.")
    number = float(value)
    if not number.is_integer():
        raise ConfigError(f"{name} must be a whole number, got {value}; try {example}.")
    return int(number)


def build_config(
    method: str = "sjd_pac",
    verify: str = "rejection",
    cfg_scale: float = 1.0,
    temperature: float = 1.0,
    top_k: Optional[float] = 0,
    top_p: Optional[float] = 1.0,
    window: float = 64,
    tree_depth: float = 3,
    tree_width: float = 4,
) -> SamplerConfig:
    """The UI's values -> a validated SamplerConfig (ConfigError names the fix).

    top_k 0 and top_p 1 mean "off" in the UI (None in the config).
    """
    k = _whole(top_k, "top-k", "0 (off)") if top_k not in (None, "") else 0
    p = None if top_p in (None, "") or float(top_p) >= 1.0 else float(top_p)
    return SamplerConfig(
        method=method,
        verify=verify,
        cfg_scale=float(cfg_scale) if cfg_scale is not None else None,
        temperature=float(temperature) if temperature is not None else None,
        top_k=None if k == 0 else k,
        top_p=p,
        window=_whole(window, "L (window)", "32"),
        tree_depth=_whole(tree_depth, "D (tree depth)", "3"),
        tree_width=_whole(tree_width, "K (tree width)", "4"),
    )


def check_seed(seed: object) -> int:
    value = _whole(seed, "seed", "0")
    if value < 0:
        raise ConfigError(f"seed must be >= 0, got {value}; use 0 or any positive whole number.")
    return value


def friendly_error(exc: BaseException) -> str:
    """One readable sentence for the page; the library's own errors already name the fix."""
    if isinstance(exc, (ConfigError, sp.ModelLoadError)):
        return str(exc)
    if isinstance(exc, torch.cuda.OutOfMemoryError) or isinstance(exc, MemoryError) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
    ):
        return (
            "Out of memory while generating; lower L or K (or the resolution), close other programs "
            "using the GPU, and try again."
        )
    return f"Generation failed ({type(exc).__name__}: {exc}); check the settings and try again."


# --- stopping ----------------------------------------------------------------------------------

class JobRegistry:
    """One stop flag per browser session, so Stop ends that session's run and no other."""

    def __init__(self) -> None:
        self._events: Dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def begin(self, key: str) -> threading.Event:
        with self._lock:
            old = self._events.get(key)
            if old is not None:
                old.set()  # one run per session: a new one ends the old one
            event = threading.Event()
            self._events[key] = event
            return event

    def stop(self, key: str) -> bool:
        """Ask the session's run to stop after the current forward pass; False if none runs."""
        with self._lock:
            event = self._events.get(key)
            if event is None or event.is_set():
                return False
            event.set()
            return True

    def end(self, key: str, event: threading.Event) -> None:
        with self._lock:
            if self._events.get(key) is event:
                del self._events[key]

    def running(self, key: str) -> bool:
        with self._lock:
            return key in self._events


# --- streaming a run ---------------------------------------------------------------------------

@dataclass
class Update:
    """One step of a streamed run, as the UI sees it.

    kind: "progress" (running), "finished", "stopped" or "failed".
    stats: a consistent snapshot of the run so far (None before the first forward pass).
    """

    kind: str
    elapsed: float
    progress: Optional[sp.Progress] = None
    stats: Optional[sp.RunStats] = None
    result: Optional[sp.ImageResult] = None
    error: Optional[BaseException] = None

    @property
    def done(self) -> bool:
        return self.kind != "progress"


def snapshot_stats(progress: sp.Progress) -> sp.RunStats:
    """The worker keeps appending to progress.stats; copy the passes up to this one."""
    records = progress.stats.records[: progress.record.index + 1]
    return sp.RunStats(num_tokens=progress.stats.num_tokens, method=progress.stats.method, records=list(records))


class _Finished:
    def __init__(self, result: Optional[sp.ImageResult] = None, error: Optional[BaseException] = None,
                 cancelled: bool = False) -> None:
        self.result, self.error, self.cancelled = result, error, cancelled


def stream_generation(
    model: sp.ARImageModel,
    prompt: str,
    config: SamplerConfig,
    seed: int,
    stop: threading.Event,
    negative_prompt: str = "",
    resolution: Optional[str] = None,
    interval: float = 0.1,
) -> Iterator[Update]:
    """Run generate_image in a worker thread; yield an Update at most every `interval` seconds
    while it runs (less often if showing an update is slow; and whenever a pass is slower than
    that), then one final Update.

    Setting `stop` ends the run after the forward pass in flight (the callback raises
    GenerationCancelled; the sampler frees its cache on the way out).
    """
    events: "queue.Queue[Union[sp.Progress, _Finished]]" = queue.Queue()
    last: List[sp.Progress] = []  # the worker's latest pass, even if the UI skipped it

    def callback(progress: sp.Progress) -> None:
        if stop.is_set():
            raise sp.GenerationCancelled("stopped from the app")
        last[:] = [progress]
        events.put(progress)

    def work() -> None:
        try:
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
    pending: Optional[sp.Progress] = None
    last_yield = start
    wait = interval
    try:
        while True:
            timeout = max(0.0, wait - (time.perf_counter() - last_yield)) if pending else None
            try:
                item = events.get(timeout=timeout)
            except queue.Empty:  # a slow pass: show what we have
                item = None
            if isinstance(item, sp.Progress):
                pending = item
                if time.perf_counter() - last_yield < wait:
                    continue
            if isinstance(item, _Finished):
                worker.join()
                elapsed = time.perf_counter() - start
                if item.result is not None:
                    yield Update("finished", elapsed, stats=item.result.stats, result=item.result,
                                 progress=last[0] if last else None)
                elif item.cancelled:
                    latest = last[0] if last else None
                    yield Update("stopped", elapsed, progress=latest,
                                 stats=snapshot_stats(latest) if latest else None)
                else:
                    latest = last[0] if last else None
                    yield Update("failed", elapsed, progress=latest, error=item.error,
                                 stats=snapshot_stats(latest) if latest else None)
                return
            if pending is not None:
                last_yield = time.perf_counter()
                yield Update("progress", last_yield - start, progress=pending, stats=snapshot_stats(pending))
                pending = None
                # Rendering and sending an update holds the GIL the sampler needs; the time until
                # the consumer asks again is that cost. Keep it under ~1/4 of the run.
                wait = max(interval, 3.0 * (time.perf_counter() - last_yield))
    finally:
        if worker.is_alive():  # the consumer went away (page closed): stop the worker too
            stop.set()
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

