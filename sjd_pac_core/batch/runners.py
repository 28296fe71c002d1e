"""Where jobs run. A runner loads the model (`start`, -> ModelInfo for the job list), then turns
jobs into Outcomes (`run`), in any order; the driver writes them. The in-process runner is here;
the Ray runner (an optional extra) is in ray_runner.py and schedules the same job function.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Sequence

from .jobs import BatchInputError, Job, ModelInfo
from .resources import machine_cores, threads_problem
from .work import JobOutput, ModelSpec

Say = Callable[[str], None]  # prints one line above the progress bar


@dataclass
class Outcome:
    job: Job
    output: Optional[JobOutput] = None
    error: Optional[str] = None  # why the job failed (then output is None)


class LocalRunner:
    """This process, one device, one model load."""

    workers = 1

    def __init__(self, spec: ModelSpec, say: Say = print) -> None:
        self.spec = spec
        self.say = say
        self.model = None
        self.retried = 0  # jobs re-run after a worker died: never here
        self.lost_workers: List[str] = []
        self._stack = ExitStack()

    def start(self) -> ModelInfo:
        from ..threads import torch_threads
        from .work import cpu_threads, load_for_jobs

        problem = threads_problem(self.spec.threads, machine_cores())
        if problem:  # torch crashes far past the cores there are
            raise BatchInputError(problem)
        self.model, info = load_for_jobs(self.spec)
        threads = self._stack.enter_context(torch_threads(cpu_threads(self.model, self.spec)))
        self.description = f"in this process on {self.model.device}" + (
            f" ({threads} torch thread{'s' if threads != 1 else ''})" if self.model.device.type == "cpu" else "")
        return info

    def run(self, jobs: Sequence[Job]) -> Iterator[Outcome]:
        from .work import run_job

        for job in jobs:
            try:
                yield Outcome(job, run_job(self.model, job))
            except Exception as exc:  # one bad job (a prompt, out of memory) must not end the batch
                yield Outcome(job, error=f"{type(exc).__name__}: {exc}")

    def close(self) -> None:
        self._stack.close()
