"""run_batch: INPUT -> jobs -> a runner -> the output folder, resumable.

    from sjd_pac_core.batch import BatchOptions, read_input, run_batch
    report = run_batch(BatchOptions(lines=read_input("prompts.txt"), out=Path("runs/batch"),
                                    methods=parse_methods("ar,sjd-pac@64"), seeds=[0, 1]))

Order of work: the output folder is locked and its results read (a damaged results.jsonl is
refused here), the model is loaded (one worker at least), the job list is built and checked
(settings, duplicates), finished jobs are skipped, and only then does a job run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from ..bench.methods import MethodSpec
from .jobs import InputLine, Job, plan_jobs
from .runners import LocalRunner, Outcome
from .store import FolderLock, ResultStore
from .work import ModelSpec


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

    @property
    def complete(self) -> bool:
        return self.skipped + self.done == len(self.jobs)


def make_runner(options: BatchOptions, say: Callable[[str], None]):
    if options.workers or options.ray_address:
        from .ray_runner import RayRunner  # the optional extra

        return RayRunner(options.model, workers=options.workers or 1, address=options.ray_address, say=say)
    return LocalRunner(options.model, say=say)


def run_batch(options: BatchOptions, on_result: Optional[Callable[[Outcome], None]] = None,
              runner=None) -> BatchReport:
    """Run every job of `options` not yet in options.out; rerunning continues where this stopped.

    on_result: called after each finished (written) or failed job, e.g. to stop early by raising.
    """
    from tqdm import tqdm

    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    store = ResultStore(out)
    with FolderLock(out):
        store.load()
        bar = None

        def say(text: str) -> None:
            (bar.write if bar is not None else print)(text)

        runner = runner or make_runner(options, say)
        report: Optional[BatchReport] = None
        model = None
        try:
            model = runner.start()
            jobs = plan_jobs(options.lines, model, options.seeds, options.methods, options.source)
            todo = [job for job in jobs if job.id not in store.lines]
            report = BatchReport(jobs=jobs, skipped=len(jobs) - len(todo), where=runner.description)
            bar = tqdm(total=len(jobs), initial=report.skipped, unit="image", desc="batch",
                       disable=not options.progress, dynamic_ncols=True)
            if report.skipped and options.progress:
                say(f"{report.skipped} of {len(jobs)} jobs already finished in {out}; running the other {len(todo)}")
            for outcome in runner.run(todo):
                if outcome.output is not None:
                    store.add(outcome.output.line, outcome.output.png)
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
                from .summary import summary_markdown

                report.retried, report.lost_workers = runner.retried, list(runner.lost_workers)
                report.summary = store.write_summary(
                    summary_markdown(report.jobs, store.lines, model, report.where, report.failed))
    return report
