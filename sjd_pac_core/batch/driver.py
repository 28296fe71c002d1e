"""run_batch: INPUT -> jobs -> a runner -> the output folder, resumable.

    from sjd_pac_core.batch import BatchOptions, read_input, run_batch
    report = run_batch(BatchOptions(lines=read_input("prompts.txt"), out=Path("runs/batch"),
                                    methods=parse_methods("ar,sjd-pac@64"), seeds=[0, 1]))

Order of work: the output folder is locked and its results read (a damaged results.jsonl is
refused here); the jobs are checked against the model's settings read from its folder's small
files (a setting no job can run with is refused before the model loads); a rerun of the same
command whose jobs are all finished stops here, having loaded nothing; then the model is loaded
(one worker at least), the job list is built and checked again with the loaded model, finished
jobs are skipped, and only then does a job run.

A finished image the output folder has no room for (a full disk) is kept in the temp dir, the
batch stops, and the report says where (`BatchReport.stopped`); a rerun once there is room again
finishes the batch.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence, Tuple

from ..bench.methods import MethodSpec
from ..files import FileSaveError
from .jobs import InputLine, Job, ModelInfo, plan_jobs
from .runners import LocalRunner, Outcome
from .store import FolderLock, ResultStore
from .work import ModelSpec

if TYPE_CHECKING:
    from ..models.image_model import FamilyDefaults

NOTHING_RUN = "no job (every one had finished before, so no model was loaded)"


class BatchStopped(FileSaveError):
    """The output folder cannot be written (a full disk) before any job ran; the message says why
    and what to do."""


@dataclass
class BatchOptions:
    lines: Sequence[InputLine]
    out: Path
    model: ModelSpec = field(default_factory=ModelSpec)
    seeds: Optional[List[int]] = None  # None: each line's own seed, else 0
    methods: Optional[List[MethodSpec]] = None  # None: each line's own settings
    workers: int = 0  # 0: in this process; N >= 1: N Ray workers
    ray_address: Optional[str] = None  # join this Ray cluster ("auto": the one this machine belongs to)
    progress: bool = True
    source: str = "INPUT"  # INPUT's name in messages

    @property
    def on_ray(self) -> bool:
        return bool(self.workers or self.ray_address)


@dataclass
class BatchReport:
    jobs: List[Job]
    skipped: int  # finished before this run
    done: int = 0  # finished in this run
    failed: List[Tuple[Job, str]] = field(default_factory=list)
    retried: int = 0  # jobs run again after their worker died
    lost_workers: List[str] = field(default_factory=list)  # one sentence per worker that could not serve
    where: str = ""
    summary: Optional[Path] = None
    stopped: Optional[str] = None  # why the batch stopped before its last job (a full disk), one sentence
    notes: List[str] = field(default_factory=list)  # files written elsewhere than asked, one sentence each

    @property
    def complete(self) -> bool:
        return self.skipped + self.done == len(self.jobs)


def make_runner(options: BatchOptions, say: Callable[[str], None]):
    if options.on_ray:
        from .ray_runner import RayRunner  # the optional extra

        return RayRunner(options.model, workers=options.workers or 1, address=options.ray_address, say=say)
    return LocalRunner(options.model, say=say)


def defaults_from_folder(options: BatchOptions) -> Optional["FamilyDefaults"]:
    """The model's settings from its folder's small files (no weight is read), or None where this
    machine cannot read them (a folder only the Ray cluster's machines hold)."""
    from ..models.loader import DEMO_NAME, family_defaults

    path = options.model.path
    if options.on_ray and path != DEMO_NAME and not Path(path).exists():
        return None
    return family_defaults(path)


def model_request(options: BatchOptions, defaults: Optional["FamilyDefaults"]) -> dict:
    """How the model is asked for, as the output folder records it: the same request gives the same
    ModelInfo, so a rerun plans its jobs without loading the model."""
    from ..models.loader import resolve_device

    spec = options.model
    where = "ray" if options.on_ray else str(resolve_device(spec.device))
    return {"path": spec.path, "dtype": spec.dtype, "device": spec.device, "quantize": spec.quantize,
            "runs_on": where, "defaults": None if defaults is None else {
                "resolutions": list(defaults.resolutions), "sampler": dict(defaults.sampler)}}


def _stored(store: ResultStore, job: Job, output, left: int) -> Optional[str]:
    """Write one finished job into the folder: None, or where the folder has no room (a full disk)
    the sentence that stops the batch, saying where the image is kept."""
    rerun = (f"free some disk space and rerun the same command to finish the batch ({left} job"
             f"{'s' if left != 1 else ''} left)")
    try:
        kept = store.add(output.line, output.png)
    except FileSaveError as exc:  # neither the folder nor the temp dir has room
        return f"{exc} (the batch stopped: {rerun}, this image made again)."
    except OSError as exc:  # the PNG is in place, its line is not: the job runs again
        reason = (exc.strerror or type(exc).__name__).lower()
        return (f"could not add job {job.id} to {store.results} ({reason}), so the batch stopped; {rerun}, "
                "this image made again.")
    if kept.moved:
        return f"{kept.note.rstrip('.')}, and the batch stopped; {rerun}."
    return None


def _summary(store: ResultStore, report: BatchReport, model: ModelInfo) -> None:
    """summary.md, or where the folder has no room for it a copy elsewhere and a note (a rerun
    writes it again): a failed summary never hides why the batch ended."""
    from .summary import summary_markdown

    text = summary_markdown(report.jobs, store.lines, model, report.where, report.failed)
    try:
        kept = store.write_summary(text)
    except FileSaveError as exc:
        report.notes.append(f"{exc}; a rerun of the same command writes summary.md again.")
        return
    report.summary = kept.path
    if kept.moved:
        report.notes.append(kept.note)


def run_batch(options: BatchOptions, on_result: Optional[Callable[[Outcome], None]] = None,
              runner=None) -> BatchReport:
    """Run every job of `options` not yet in options.out; rerunning continues where this stopped.

    on_result: called after each finished (written) or failed job, e.g. to stop early by raising.
    """
    out = Path(options.out)
    store = ResultStore(out)
    with ExitStack() as stack:
        try:
            out.mkdir(parents=True, exist_ok=True)
            stack.enter_context(FolderLock(out))
            store.load()
        except OSError as exc:  # the folder itself cannot be written (a full disk): nothing ran
            reason = (exc.strerror or type(exc).__name__).lower()
            raise BatchStopped(f"cannot write into {out} ({reason}); free some disk space there (or choose "
                               "another --out) and rerun the same command") from None
        return _run_locked(options, store, on_result, runner)


def _run_locked(options: BatchOptions, store: ResultStore, on_result, runner) -> BatchReport:
    from tqdm import tqdm

    out = store.folder
    defaults = defaults_from_folder(options)
    if defaults is not None:  # every setting that needs no loaded model, checked before loading it (ids unused)
        unloaded = ModelInfo(name="", family="", dtype="", defaults=defaults)
        plan_jobs(options.lines, unloaded, options.seeds, options.methods, options.source)
    request = model_request(options, defaults)
    recorded = store.recorded_model(request)
    if recorded is not None:
        jobs = plan_jobs(options.lines, recorded, options.seeds, options.methods, options.source)
        if all(job.id in store.lines for job in jobs):
            report = BatchReport(jobs=jobs, skipped=len(jobs), where=NOTHING_RUN)
            _summary(store, report, recorded)
            return report
    bar = None

    def say(text: str) -> None:
        (bar.write if bar is not None else print)(text)

    runner = runner or make_runner(options, say)
    report: Optional[BatchReport] = None
    model = None
    try:
        model = runner.start()
        store.record_model(request, model)
        jobs = plan_jobs(options.lines, model, options.seeds, options.methods, options.source)
        todo = [job for job in jobs if job.id not in store.lines]
        report = BatchReport(jobs=jobs, skipped=len(jobs) - len(todo), where=runner.description)
        bar = tqdm(total=len(jobs), initial=report.skipped, unit="image", desc="batch",
                   disable=not options.progress, dynamic_ncols=True)
        if report.skipped and options.progress:
            say(f"{report.skipped} of {len(jobs)} jobs already finished in {out}; running the other {len(todo)}")
        for outcome in runner.run(todo):
            if outcome.output is not None:
                report.stopped = _stored(store, outcome.job, outcome.output, len(todo) - report.done)
                if report.stopped is not None:
                    break
                report.done += 1
                bar.update(1)
            else:
                report.failed.append((outcome.job, outcome.error or "failed"))
                say(f"job {outcome.job.id} ({outcome.job.describe()}) failed: {outcome.error}")
            if on_result is not None:
                on_result(outcome)
    finally:
        if bar is not None:
            bar.close()
        runner.close()
        if report is not None:
            report.retried, report.lost_workers = runner.retried, list(runner.lost_workers)
            _summary(store, report, model)
    return report
