"""The Ray runner (extra `sjd-pac[ray]`): one actor per worker, each loading the model once and
calling the same job function as the in-process runner. Ray only schedules.

- Jobs go to whichever worker is free (submit-as-free with ray.wait), so a slow prompt holds up
  only its own worker.
- A worker that dies (its process killed, out of memory, a lost machine) fails the job it was
  running; that job goes back to the front of the queue for the next free worker, at most
  MAX_ATTEMPTS times. Ray restarts the worker (MAX_RESTARTS times), which loads the model again
  and rejoins. Its finished jobs were written by the driver already, so nothing is lost.
- A worker whose model does not load is named, with the reason, and the others carry on.
- Workers return the line and the PNG bytes; only the driver writes files.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import Counter, deque
from dataclasses import dataclass, replace
from typing import Deque, Dict, Iterator, List, Optional, Sequence, Tuple

import ray
from ray.exceptions import ActorUnavailableError, RayError, RayTaskError

from .jobs import Job, ModelInfo
from .resources import machine_cores, ray_address_problem, threads_problem, workers_problem
from .runners import Outcome, Say
from .work import JobOutput, ModelSpec

MAX_ATTEMPTS = 3  # a job whose worker died this often is reported, not retried (it may be what kills them)
MAX_RESTARTS = 2  # Ray restarts a dead worker this often (each restart loads the model again)
WAIT_NOTICE_S = 60  # say what the cluster lacks when no worker has started after this long
MAX_UNAVAILABLE, UNAVAILABLE_WAIT_S = 40, 0.5  # a dead worker has 20 s to be marked restarting


class WorkersUnavailable(ValueError):
    """No worker could load the model; the message names each worker and why."""


@dataclass(frozen=True)
class WorkerState:
    index: int
    host: str
    pid: int
    device: str = ""
    threads: int = 0
    info: Optional[ModelInfo] = None
    error: Optional[str] = None  # why the model did not load

    @property
    def name(self) -> str:
        if not self.pid:  # it never answered
            return f"worker {self.index}"
        return f"worker {self.index} ({self.host}, pid {self.pid}{', ' + self.device if self.device else ''})"


class BatchWorker:
    """One Ray actor: the model, loaded once in __init__ (again after a restart)."""

    def __init__(self, index: int, spec: ModelSpec, cpus: int) -> None:
        import torch

        from .work import cpu_threads, load_for_jobs

        self.model = None
        self.state = WorkerState(index, socket.gethostname(), os.getpid())
        try:
            self.model, info = load_for_jobs(spec)
            threads = cpu_threads(self.model, spec, cores=cpus)
            if threads:
                torch.set_num_threads(threads)
            self.state = replace(self.state, device=str(self.model.device), threads=torch.get_num_threads(),
                                 info=info)
        except Exception as exc:  # said by the driver with this worker's name; the others carry on
            self.state = replace(self.state, error=str(exc) or type(exc).__name__)

    def describe(self) -> WorkerState:
        return self.state

    def run(self, job: Job) -> JobOutput:
        from .work import run_job

        return run_job(self.model, job, worker=self.state.name)


def _cause(error: RayTaskError) -> str:
    cause = getattr(error, "cause", None)
    return f"{type(cause).__name__}: {cause}" if cause is not None else str(error).splitlines()[0]


class RayRunner:
    """N Ray workers on a local Ray (started and stopped here) or a running cluster (--ray-address)."""

    def __init__(self, spec: ModelSpec, workers: int, address: Optional[str] = None, say: Say = print) -> None:
        self.spec = spec
        self.workers = workers
        self.address = address
        self.say = say
        self.retried = 0
        self.lost_workers: List[str] = []
        self.states: Dict[int, WorkerState] = {}  # workers that loaded the model, by index
        self.actors: list = []
        self.description = ""
        self._started_ray = False
        self._probes: Dict[object, int] = {}  # describe() calls of workers not yet serving
        self._last: Dict[int, WorkerState] = {}  # each worker's last known state, for messages
        self._unavailable: Counter = Counter()  # describe() calls refused while Ray restarts a worker
        self._ask_again: Dict[int, float] = {}  # such workers: when to call describe() again
        self._dead: set = set()  # workers that died during the batch
        self._load_errors: List[Tuple[str, str]] = []  # (worker, why its model did not load)

    # --- start -----------------------------------------------------------------------------------
    def _init_ray(self) -> None:
        if ray.is_initialized():  # e.g. a caller (or a test) that started Ray itself
            return
        if self.address:
            problem = ray_address_problem(self.address)  # Ray retries a dead address for minutes
            if problem:
                raise WorkersUnavailable(problem)
            try:
                ray.init(address=self.address, logging_level=logging.WARNING, log_to_driver=False)
            except ConnectionError as exc:  # "auto" with no cluster on this machine
                raise WorkersUnavailable(f"--ray-address {self.address}: {str(exc).split('. ')[0].rstrip('.')}; "
                                         "start a cluster with `ray start --head`, or leave --ray-address out.") from None
        else:  # a local Ray with this machine's cores (and GPUs, which Ray finds itself)
            ray.init(num_cpus=machine_cores(), include_dashboard=False, logging_level=logging.WARNING,
                     log_to_driver=False)
        self._started_ray = True

    def _actor_options(self) -> Tuple[dict, ModelSpec, int]:
        """Each worker's Ray resources, model spec and cores; WorkersUnavailable (one sentence, before
        any worker starts) for more workers or threads than the cluster has."""
        resources = ray.cluster_resources()
        gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 1))
        where = f"the Ray cluster at {self.address}" if self.address else "this machine's Ray"
        if self.spec.device == "cuda" and gpus < 1:
            raise WorkersUnavailable("--device cuda: the Ray cluster has no GPU; use --device auto or cpu.")
        on_gpu = gpus >= 1 and self.spec.device in ("auto", "cuda")
        largest_node = max((int(node["Resources"].get("CPU", 0)) for node in ray.nodes() if node.get("Alive")),
                           default=cpus)
        problem = (workers_problem(self.workers, cpus, gpus, on_gpu, where)
                   or threads_problem(self.spec.threads, largest_node, f"the largest machine of {where}"))
        if problem:
            raise WorkersUnavailable(problem)
        common = dict(max_restarts=MAX_RESTARTS, max_task_retries=0)
        if on_gpu:
            return dict(num_gpus=1, num_cpus=1, **common), replace(self.spec, device="cuda"), 1
        per_worker = max(1, cpus // self.workers)
        return dict(num_cpus=per_worker, **common), replace(self.spec, device="cpu"), per_worker

    def start(self) -> ModelInfo:
        self._init_ray()
        options, spec, cpus = self._actor_options()
        remote = ray.remote(BatchWorker)
        self.actors = [remote.options(**options).remote(i, spec, cpus) for i in range(self.workers)]
        self._last = {i: WorkerState(i, "", 0) for i in range(self.workers)}
        for index in range(self.workers):
            self._probe(index)
        started = notice = time.monotonic()
        while not self.states:
            if not self._probes and not self._ask_again:
                raise WorkersUnavailable(self._none_loaded())
            ref = self._next_ready([], timeout=WAIT_NOTICE_S)
            if ref is not None:
                self._take_probe(ref)
            elif time.monotonic() - notice >= WAIT_NOTICE_S:
                notice = time.monotonic()
                self.say(f"no worker has started after {notice - started:.0f} s; Ray has "
                         f"{ray.available_resources()} free")
        first = next(iter(self.states.values()))
        threads = f"{first.threads} torch thread{'s' if first.threads != 1 else ''} each"
        kind = "GPU" if first.device.startswith("cuda") else f"CPU ({threads})"
        where = f"the Ray cluster at {self.address}" if self.address else "a local Ray"
        self.description = f"on {self.workers} {kind} worker{'s' if self.workers != 1 else ''} of {where}"
        return first.info

    def _none_loaded(self) -> str:
        """One sentence for a run where no worker loaded the model: the workers, grouped by reason."""
        reasons: Dict[str, List[str]] = {}
        for name, reason in self._load_errors:
            reasons.setdefault(reason, []).append(name)
        return "no worker could load the model: " + "; ".join(
            f"{', '.join(names)}: {reason}" for reason, names in reasons.items()) + "."

    def _probe(self, index: int) -> None:
        self._probes[self.actors[index].describe.remote()] = index

    def _next_ready(self, refs: list, timeout: Optional[float] = None):
        """The first of `refs` and the workers' describe() calls to finish, or None after `timeout` s
        or when a worker is due to be asked again (see _take_probe)."""
        now = time.monotonic()
        for index, due in list(self._ask_again.items()):
            if due <= now:
                del self._ask_again[index]
                self._probe(index)
        if self._ask_again:
            soonest = max(0.0, min(self._ask_again.values()) - now)
            timeout = soonest if timeout is None else min(timeout, soonest)
        waiting = list(refs) + list(self._probes)
        if not waiting:
            time.sleep(timeout or 0.0)
            return None
        ready, _ = ray.wait(waiting, num_returns=1, timeout=timeout)
        return ready[0] if ready else None

    def _take_probe(self, ref) -> Optional[int]:
        """A worker's describe() answered: its index if it serves, else None (lost and said, or asked again)."""
        index = self._probes.pop(ref)
        try:
            state = ray.get(ref)
        except ActorUnavailableError:  # between its death and Ray's restart: ask again shortly
            self._unavailable[index] += 1
            if self._unavailable[index] <= MAX_UNAVAILABLE:
                self._ask_again[index] = time.monotonic() + UNAVAILABLE_WAIT_S
                return None
            state = replace(self._last[index], error="its process died and Ray did not restart it")
        except RayError as exc:
            reason = _cause(exc) if isinstance(exc, RayTaskError) else f"its process died ({type(exc).__name__})"
            state = replace(self._last[index], error=reason)
        self._last[index] = state
        if state.error is not None:
            self._load_errors.append((state.name, state.error.rstrip(".")))
            self.lost_workers.append(f"{state.name} could not load the model: {state.error.rstrip('.')}.")
            self.say(self.lost_workers[-1])
            return None
        self._unavailable[index] = 0
        self.states[index] = state
        return index

    # --- run ---------------------------------------------------------------------------------------
    def run(self, jobs: Sequence[Job]) -> Iterator[Outcome]:
        pending: Deque[Job] = deque(jobs)
        free: Deque[int] = deque(self.states)
        inflight: Dict[object, Tuple[int, Job]] = {}
        attempts: Counter = Counter()

        def hand_out() -> None:
            while free and pending:
                index, job = free.popleft(), pending.popleft()
                inflight[self.actors[index].run.remote(job)] = (index, job)

        while pending or inflight:
            hand_out()
            if not inflight and not self._probes and not self._ask_again:  # every worker is gone
                for job in pending:
                    yield Outcome(job, error="no worker left to run it (see the lost workers above)")
                break
            ref = self._next_ready(list(inflight))
            if ref is None:
                continue
            if ref in self._probes:
                index = self._take_probe(ref)
                if index is not None:
                    free.append(index)
                continue
            index, job = inflight.pop(ref)
            try:
                outcome = Outcome(job, ray.get(ref))
            except RayTaskError as exc:  # the job itself failed; its worker is fine
                outcome = Outcome(job, error=_cause(exc))
            except RayError as exc:  # the worker died under the job
                attempts[job.id] += 1
                name = self._last[index].name
                self.states.pop(index, None)
                self._dead.add(index)
                self._probe(index)  # answers once Ray has restarted it (and it has loaded the model)
                if attempts[job.id] >= MAX_ATTEMPTS:
                    yield Outcome(job, error=f"{attempts[job.id]} workers died running it (last {name}: "
                                             f"{type(exc).__name__})")
                else:
                    self.retried += 1
                    pending.appendleft(job)
                    self.say(f"{name} died running job {job.id} ({job.describe()}); it goes to another worker")
                continue
            free.append(index)
            hand_out()  # the next job starts before the driver writes this one
            yield outcome
        self._settle_probes()

    def _settle_probes(self) -> None:
        """At the end: say what became of workers that died and were still coming back."""
        if self._probes:
            ready, _ = ray.wait(list(self._probes), num_returns=len(self._probes), timeout=0)
            for ref in ready:
                self._take_probe(ref)
        for index in sorted(set(self._probes.values()) | set(self._ask_again)):
            if index in self._dead:
                self.lost_workers.append(f"{self._last[index].name} died during the batch and was still "
                                         "restarting when the last job finished.")

    def close(self) -> None:
        for actor in self.actors:
            try:
                ray.kill(actor)
            except Exception:  # already gone
                pass
        self.actors = []
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False
