"""Worker processes that run single-process cases one at a time each, so that a target that crashes,
exits or hangs costs its own case and nothing else (`run --jobs N`, `--isolate`, `--timeout`).

A task is `fn(clock, *args)`, `fn` a module-level function (pickled by reference) run in a worker;
`Workers.map` yields each task's outcome as it ends, `Done(value)` or `Failed(why)`:

  - it returned: Done with its value; it raised (SystemExit included): Failed with the traceback;
  - its worker died (os._exit, a fatal signal such as SIGSEGV, the OOM killer): Failed with the exit
    code or signal and what the worker wrote during the task (faulthandler's stacks of a fatal
    signal among it); the worker is replaced and the other tasks go on;
  - the target's code ran past the timeout: the worker writes every thread's stack (faulthandler, on
    SIGUSR1) and is killed; Failed with those stacks; the worker is replaced.

The timeout clocks the target's code only, not the harness's judging (its FP64 oracles take what a
large case needs): the task says when the target's code starts and stops through its `Clock`
(`clocked` wraps a target's methods in it), and the deadline runs only meanwhile.

Workers are helper processes (harness/running/processes.py): they die with the harness and leave
SIGINT and SIGTERM to it; leaving `Workers` (also by an exception such as the CLI's Stop) kills
every worker and removes their logs. Each starts with the BLAS/OpenMP thread variables set to its
share of the cores (`threads_per_job`) and torch at one thread.
"""

from __future__ import annotations

import copy
import multiprocessing
import multiprocessing.connection
import os
import shutil
import tempfile
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from harness.running.processes import become_helper, how_it_ended, log_size, log_tail, recv, send, stacks
from harness.targets.base import Target

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
"""The thread counts of the BLAS/LAPACK libraries NumPy and SciPy may use (the FP64 oracles' time is
theirs), set in each worker before it imports them: workers x threads stays within the cores."""
CLOSE_SECONDS = 2.0
"""How long idle workers get to exit when told to, before they are killed."""


def threads_per_job(jobs: int, cores: int | None = None) -> int:
    """The BLAS threads each of `jobs` worker processes gets: the cores shared out, at least one."""
    cores = cores if cores is not None else len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)
    return max(1, cores // max(1, jobs))


@dataclass(frozen=True)
class Done:
    """A task that returned `value`."""

    value: Any


@dataclass(frozen=True)
class Failed:
    """A task that raised, whose worker died, or whose target ran past the timeout: `why`, in words,
    with the traceback, exit status or stacks and the worker's output during the task."""

    why: str


class Clock:
    """Worker side: tells the parent when the target's code starts and stops (the timeout runs only
    meanwhile). Nested uses count once."""

    def __init__(self, conn: multiprocessing.connection.Connection) -> None:
        self._conn, self._depth = conn, 0

    @contextmanager
    def running(self) -> Iterator[None]:
        self._depth += 1
        if self._depth == 1:
            send(self._conn, ("clock", True))
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                send(self._conn, ("clock", False))


CLOCKED_METHODS = ("run", "conventions", "unsupported", "version")
"""The methods of a target whose calls run on the clock (`clocked`)."""


def clocked(target: Target, clock: Clock) -> Target:
    """A copy of `target` whose CLOCKED_METHODS run on `clock`: of a subclass of its class that adds
    nothing but that (so copies of it, as backends.judged_as makes, stay clocked)."""
    cls = type(target)

    def on_clock(name: str) -> Callable[..., Any]:
        method = getattr(cls, name)

        def call(self: Target, *args: Any, **kwargs: Any) -> Any:
            with clock.running():
                return method(self, *args, **kwargs)
        return call

    watched = copy.copy(target)
    watched.__class__ = type(cls)(cls.__name__, (cls,), {"__slots__": (), "__module__": cls.__module__,
                                                         **{name: on_clock(name) for name in CLOCKED_METHODS}})
    return watched


def _worker_main(conn: multiprocessing.connection.Connection, log_path: str, parent: int) -> None:
    """A worker: run tasks (fn, args) until told to stop (None) or the pipe closes; reply to each."""
    become_helper(parent, log_path)
    torch.set_num_threads(1)  # as the harness runs: deterministic kernels, parallelism from processes
    clock = Clock(conn)
    while True:
        try:
            task = recv(conn)
        except EOFError:
            break
        if task is None:
            break
        fn, args = task
        try:
            reply = ("done", fn(clock, *args))
        except BaseException:  # SystemExit too: a target's sys.exit() costs its case, not the worker
            reply = ("raised", traceback.format_exc())
        send(conn, reply)


@dataclass(eq=False)
class _Worker:
    """Parent side of one worker: its process, pipe and log, and the task it runs (index, the log's
    size when it began, when the target's code started running or None)."""

    proc: multiprocessing.process.BaseProcess
    conn: multiprocessing.connection.Connection
    log: Path
    task: int | None = None
    log_start: int = 0
    clock_since: float | None = None


class Workers:
    """Up to `jobs` workers (started as tasks need them), each with `threads` BLAS threads (default
    threads_per_job(jobs)), in which the target's code may run `timeout` seconds at a stretch. Use as a
    context manager: leaving it stops every worker."""

    def __init__(self, jobs: int, timeout: float, threads: int | None = None) -> None:
        self.jobs, self.timeout = jobs, timeout
        self.threads = threads or threads_per_job(jobs)
        self._dir = Path(tempfile.mkdtemp(prefix="caseworkers-"))
        self._workers: list[_Worker] = []
        self._started = 0

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        self.close(kill=kind is not None)

    @property
    def pids(self) -> list[int]:
        """Process ids of the live workers."""
        return [w.proc.pid for w in self._workers if w.proc.pid is not None]

    def _start(self) -> _Worker:
        """A new worker, spawned with the thread variables set in this process's environment while it
        starts (it inherits them), then restored."""
        self._started += 1
        log = self._dir / f"worker{self._started}.log"
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        proc = context.Process(target=_worker_main, args=(child, str(log), os.getpid()), daemon=True,
                               name=f"case-worker{self._started}")
        saved = {v: os.environ.get(v) for v in THREAD_VARIABLES}
        os.environ.update({v: str(self.threads) for v in THREAD_VARIABLES})
        try:
            proc.start()
        except BaseException:  # e.g. Stop while it started: no worker is left untracked
            if proc.pid is not None:
                proc.kill()
                proc.join()
            raise
        finally:
            for v, value in saved.items():
                if value is None:
                    os.environ.pop(v, None)
                else:
                    os.environ[v] = value
            child.close()
        worker = _Worker(proc, parent, log)
        self._workers.append(worker)
        return worker

    def map(self, fn: Callable[..., Any], tasks: list[tuple[Any, ...]]) -> Iterator[tuple[int, Done | Failed]]:
        """(i, outcome) of each task `fn(clock, *tasks[i])`, in the order they end (see module doc)."""
        queue = deque(range(len(tasks)))
        while queue or any(w.task is not None for w in self._workers):
            for worker in self._idle(len(queue)):
                worker.task, worker.log_start, worker.clock_since = queue.popleft(), log_size(worker.log), None
                try:
                    send(worker.conn, (fn, tasks[worker.task]))
                except OSError:
                    pass  # it died just now: its sentinel says so below, and the task fails with how it ended
            busy = [w for w in self._workers if w.task is not None]
            handles = {h: w for w in busy for h in (w.conn, w.proc.sentinel)}
            deadlines = [w.clock_since + self.timeout for w in busy if w.clock_since is not None]
            wait = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            ready = multiprocessing.connection.wait(list(handles), wait)
            for worker in dict.fromkeys(handles[h] for h in ready):
                yield from self._heard(worker)
            now = time.monotonic()
            for worker in [w for w in busy if w.clock_since is not None and now - w.clock_since >= self.timeout]:
                if worker.task is not None and worker in self._workers:
                    yield self._hung(worker)

    def _idle(self, wanted: int) -> list[_Worker]:
        """Idle workers for up to `wanted` tasks, starting new ones while fewer than `jobs` live."""
        for worker in [w for w in self._workers if w.task is None and not w.proc.is_alive()]:
            self._remove(worker)  # died between tasks (a thread the target left behind)
        idle = [w for w in self._workers if w.task is None][:wanted]
        while len(idle) < wanted and len(self._workers) < self.jobs:
            idle.append(self._start())
        return idle

    def _heard(self, worker: _Worker) -> Iterator[tuple[int, Done | Failed]]:
        """Read what `worker` sent; a task that ended yields its outcome; a worker that died (or closed
        its end of the pipe) is removed, failing its task."""
        closed = False
        try:
            while worker.task is not None and worker.conn.poll():
                kind, value = recv(worker.conn)
                if kind == "clock":
                    worker.clock_since = time.monotonic() if value else None
                    continue
                task, worker.task = worker.task, None
                yield task, (Done(value) if kind == "done" else
                             Failed(f"the worker process judging this case raised:\n{value}"))
        except (EOFError, OSError):
            closed = True
        worker.proc.join(timeout=1.0 if closed else 0.0)
        if worker.proc.is_alive() and not closed:
            return
        task, end = worker.task, how_it_ended(worker.proc.exitcode) if not worker.proc.is_alive() else \
            "(it closed its pipe to the harness)"
        self._remove(worker)
        if task is not None:
            where = "the target's code ran" if worker.clock_since is not None else "the harness judged it"
            yield task, Failed(f"the worker process judging this case died {end} while {where}, without a reply; "
                               f"what it wrote during this case:\n{log_tail(worker.log, worker.log_start)}")

    def _hung(self, worker: _Worker) -> tuple[int, Failed]:
        """The outcome of a task whose target ran past the timeout: its stacks; the worker is killed."""
        task = worker.task
        assert task is not None
        text = stacks(worker.proc, worker.log, worker.log_start)
        self._remove(worker)
        return task, Failed(f"the target's code ran past the timeout of {self.timeout:g}s (--timeout); the worker "
                            f"process judging this case was killed; what it wrote during this case, then its "
                            f"stacks:\n{text}")

    def _remove(self, worker: _Worker) -> None:
        """Kill `worker` (if it still lives) and forget it."""
        if worker.proc.is_alive():
            worker.proc.kill()
        worker.proc.join()
        worker.conn.close()
        self._workers.remove(worker)

    def close(self, kill: bool = False) -> None:
        """Stop every worker (idle ones are asked first, CLOSE_SECONDS in all, unless `kill`), and remove
        their logs."""
        if not kill:
            for worker in self._workers:
                try:
                    send(worker.conn, None)
                except OSError:
                    pass
            deadline = time.monotonic() + CLOSE_SECONDS
            for worker in self._workers:
                worker.proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for worker in list(self._workers):
            self._remove(worker)
        shutil.rmtree(self._dir, ignore_errors=True)
