"""Runs cases against a target and turns every check into a `Record`.

One path for every layout: the target steps a case over its layout and every check judges the
pieces that came back (harness/judging/distributed_checks.py). A single-process case (world size 1) steps
here or in a worker process (cpu or cuda backend; harness/running/workers.py); a distributed one on a pool
of ranks (gloo or nccl, harness/running/pool.py), or on the ranks of torchrun. What a target may not carry
out of its case (torch's settings, altered inputs) is kept in by harness/running/guard.py.
"""

from __future__ import annotations

import dataclasses
import shlex
import signal
import sys
import time
import traceback
from typing import Callable, Iterable, Protocol, TextIO

import torch

from cases import Case, schema
from harness.judging import diagnosis, registry
from harness.judging.checks import device_class
from harness.judging.details import Detail, Pictures
from harness.judging.distributed_checks import Pieces, gather
from harness.judging.judged import Judged
from harness.judging.outcome import Evidence, Outcome
from harness.running import backends, guard
from harness.running.backends import Backend
from harness.running.inputs import Inputs, make_inputs
from harness.running.pool import DEFAULT_TIMEOUT, TorchrunRanks, pools
from harness.running.progress import PROGRESS_SECONDS, Progress
from harness.running.ranks import rank_case
from harness.running.workers import Clock, Done, Workers, clocked
from harness.targets.base import Target, why_unsupported
from reports import Record

BACKENDS = tuple(backends.BACKENDS)


class Stop(BaseException):
    """Raised by a signal handler (the CLI's, for SIGINT and SIGTERM) to stop a run between or inside
    cases; `signum` is the signal. A BaseException, so no `except Exception` of a target swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Interrupted(Exception):
    """A run stopped by `Stop` (or Ctrl-C): `records` of the cases it finished, `reason` ("SIGTERM
    after 12 of 40 cases") and `signum`."""

    def __init__(self, records: list[Record], done: int, total: int, signum: int) -> None:
        self.reason = f"{signal.Signals(signum).name} after {done} of {total} cases"
        super().__init__(f"interrupted by {self.reason}")
        self.records, self.signum = records, signum


class Journal(Protocol):
    """Where a run notes its progress as it goes, for whoever stores it should this process die
    (harness/apps/journal.py)."""

    def starting(self, dying: list[Record]) -> None:
        """A case is about to be judged in this process: `dying` are its records should the process die."""

    def finished(self, records: list[Record]) -> None:
        """A case ended with `records`."""


DIED_HERE = ("the harness process died while judging this case in it: the target's os._exit or a fatal signal "
             "(SIGSEGV, SIGABRT), or the process was killed; --isolate judges single-process cases in worker "
             "processes, where such a death is the case's error with its exit status and output")
"""The message of every check of a case the run's own process died in."""


def repro_command(case: Case, target_spec: str, backend: str) -> str:
    """The command that reruns exactly this case."""
    return (f"python -m harness run --target {shlex.quote(target_spec)} --backend {backend} "
            f"--select {shlex.quote(case.id)}")


def _record(case: Case, target: Target, check: str, status: str, backend: str, repro: str,
            seconds: float, **fields: object) -> Record:
    return Record(case_id=case.id, check=check, target=target.name, backend=backend, status=status, repro=repro,
                  seconds=seconds, **schema.column_values(case), **fields)


def _judge(case: Case, target: Target, backend: str, repro: str,
           checks: dict[str, Callable[[], Outcome]],
           kept: Judged | None = None) -> list[tuple[Record, Evidence | None]]:
    """Run each check: its record and evidence; a check that raises is an error record with its traceback.
    Each outcome is offered to `kept` (the runs the checks made, for the diagnosis)."""
    judged: list[tuple[Record, Evidence | None]] = []
    for name, check in checks.items():
        t0 = time.perf_counter()
        try:
            out = check()
        except (Exception, SystemExit):  # a target's sys.exit() in a check's rerun costs that check
            judged.append((_record(case, target, name, "error", backend, repro, time.perf_counter() - t0,
                                   message="check raised: " + traceback.format_exc(limit=4)), None))
            continue
        tol = out.tolerance
        judged.append((_record(
            case, target, name, out.status, backend, repro, time.perf_counter() - t0,
            max_abs=out.metrics.max_abs, rel_err=out.metrics.rel_err, max_ulp=out.metrics.max_ulp,
            tolerance=tol.rtol if tol else float("nan"),
            tolerance_source=tol.source if tol else "",
            ratio=out.metrics.ratio, message=out.message), out.evidence))
        if kept is not None:
            kept.offer(name, out)
    return judged


def _pieces(case: Case, target: Target, target_spec: str, backend: Backend, inputs: Inputs | None,
            ranks: TorchrunRanks | None, timeout: float | None) -> tuple[Pieces | str | None, list[str]]:
    """Every rank's piece of every member after every step of `case` over its layout: one process
    (world size 1) is `target.run` on `inputs` here; a distributed layout runs on its ranks (a spawned
    pool, or torchrun's), each rebuilding the inputs. A string says why the target or its ranks
    failed; None: a rank of torchrun other than rank 0. Second: the torch settings the target changed
    on the ranks (each rank restores them: harness/running/ranks.py)."""
    if case.world_size == 1:
        assert inputs is not None, "one process is its own driver"
        try:
            return [target.run(inputs.params, inputs.grads, case)], []
        except (Exception, SystemExit):  # sys.exit() in a target is its failure, not the run's end
            return "target raised: " + traceback.format_exc(limit=4), []
    args = (rank_case, case.id, target_spec)
    result = (pools().run(backend.name, case.world_size, *args, timeout=timeout) if ranks is None
              else ranks.run(case.world_size, *args))
    if result is None:
        return None, []
    if not result.ok:
        return (f"{len(result.failures)} of {case.world_size} {backend.name} ranks failed; every rank's "
                f"traceback:\n{result.describe()}"), []
    return [trajectory for trajectory, _ in result.values], [c for _, changed in result.values for c in changed]


def _noted(records: list[Record], changed: list[str]) -> list[Record]:
    """`records`, each message followed by the note that the target changed torch's settings `changed`."""
    if not changed:
        return records
    note = guard.changed_note(list(dict.fromkeys(changed)))
    return [dataclasses.replace(r, message=f"{r.message}\n{note}" if r.message else note) for r in records]


def run_case(case: Case, target: Target, target_spec: str, backend: str | None = None,
             ranks: TorchrunRanks | None = None, timeout: float | None = None,
             pictures: Pictures | None = None, kept: Judged | None = None) -> list[Record]:
    """Every applicable check of `case` on `target`: pass/fail, or unsupported, skipped (with the
    reason), or error. One path for every layout: the target steps the case over its layout (one
    process being world size 1), then each check judges the pieces it returned. `backend` defaults
    to the case's own: cpu, or gloo for a distributed case. A distributed case whose ranks run past
    `timeout` seconds (default: the pool's DEFAULT_TIMEOUT) is an error. Under torchrun (`ranks`)
    every rank calls this in the same order; only rank 0 gets records (there the process group's
    timeout applies). `pictures` keeps the evidence of the worst reference checks for the report; `kept`
    the trajectory the checks judged and the runs they made, for the diagnosis.

    The target may not carry anything out of the case (harness/running/guard.py): torch's global
    settings and RNG states are restored afterwards, here and on the ranks, and a setting it changed
    is named in every record's message; a target that modified its inputs (in its run, or in a
    check's rerun) is one error on every check, saying so, instead of verdicts on altered inputs. A
    target's SystemExit is its error like any exception."""
    chosen = backends.get(backend) if backend is not None else backends.natural(case)
    repro = repro_command(case, target_spec, chosen.name)
    names = registry.applicable(case)
    driver = ranks is None or ranks.is_driver

    def every(status: str, message: str, seconds: float = 0.0) -> list[Record]:
        return [_record(case, target, n, status, chosen.name, repro, seconds, message=message)
                for n in names] if driver else []

    if not chosen.accepts(case):
        kind = "distributed" if chosen.distributed else "single-process"
        return every("skipped", f"backend {chosen.name} runs {kind} cases; this case is {case.layout_detail}")
    reason = why_unsupported(target, case)
    if reason is not None:
        return every("unsupported", reason)
    why = chosen.unavailable(case, ranks.world_size if ranks is not None else None)
    if why is not None:
        return every("skipped", why)
    target = backends.judged_as(target, chosen)
    if case.world_size == 1 and not driver:
        return []
    start = time.perf_counter()
    with guard.kept_torch_state() as changed:
        # Judged on the backend's device: the policy's device class and the single-process run of `layout` are
        # those of the ranks (cuda for nccl), not of the host the records are gathered on.
        inputs = backends.on_device(make_inputs(case), chosen.device()) if driver else None
        before = guard.copy_of(inputs) if inputs is not None else []
        pieces, on_ranks = _pieces(case, target, target_spec, chosen, inputs, ranks, timeout)
        if pieces is None:
            return []
        assert inputs is not None, "only the driver gets pieces"
        stepped = not isinstance(pieces, str)
        mutated = guard.modified(inputs, before) if stepped else None
        judged = _judge(case, target, chosen.name, repro,
                        {n: (lambda n=n: registry.judge(n)(case, target, inputs, pieces)) for n in names}, kept) \
            if stepped and not mutated else []
        mutated = mutated or (guard.modified(inputs, before) if judged else None)
        if kept is not None and judged and not mutated:
            kept.trajectory, kept.device = gather(case, pieces), device_class(inputs)
    seconds = time.perf_counter() - start
    if isinstance(pieces, str):
        return _noted(every("error", pieces, seconds), on_ranks + changed)
    if mutated:
        return every("error", mutated, seconds)
    if pictures is not None:
        for record, evidence in judged:
            pictures.offer(record, evidence)
    return _noted([record for record, _ in judged], on_ranks + changed)


def failed_case(case: Case, target: Target, target_spec: str, backend: str | None, why: str) -> list[Record]:
    """An `error` record, saying `why`, on every applicable check of `case`: a case whose run never
    returned (its worker process died or ran past the timeout)."""
    chosen = backends.get(backend) if backend is not None else backends.natural(case)
    repro = repro_command(case, target_spec, chosen.name)
    return [_record(case, target, n, "error", chosen.name, repro, 0.0, message=why) for n in registry.applicable(case)]


def judged_case(case: Case, target: Target, target_spec: str, backend: str | None = None,
                ranks: TorchrunRanks | None = None, timeout: float | None = None,
                pictures: Pictures | None = None) -> list[Record]:
    """`run_case`'s records of `case`, each with its diagnosis (harness/judging/diagnosis.py), made from what
    the checks judged (no target runs for it)."""
    kept = Judged()
    records = run_case(case, target, target_spec, backend, ranks, timeout, pictures, kept)
    return diagnosis.annotate(case, target, records, kept)


_WORKER_TARGETS: dict[str, Target] = {}
"""A worker process's targets, loaded once each, clocked (harness/running/workers.py)."""


def _worker_case(clock: Clock, case_id: str, target_spec: str, backend: str,
                 keep: int) -> tuple[list[Record], list[tuple[Record, Detail]]]:
    """One single-process case judged in a worker process: its records (with their diagnosis, made here,
    where the case's oracle decompositions are memoised and cases run side by side), and the pictures' data
    of the reference evidence its own Pictures keeper kept, made here too (offered again to the parent's).
    The target's code runs on `clock` (its loading too), so that the worker's timeout applies to it alone."""
    from harness.targets import load_target
    if target_spec not in _WORKER_TARGETS:
        with clock.running():
            _WORKER_TARGETS[target_spec] = clocked(load_target(target_spec), clock)
    pictures, case = Pictures(keep), Case.from_id(case_id)
    records = judged_case(case, _WORKER_TARGETS[target_spec], target_spec, backend, None, None, pictures)
    return records, pictures.kept_details()


def run(cases: Iterable[Case], target: Target, target_spec: str, backend: str = "cpu",
        progress: TextIO | None = sys.stderr, ranks: TorchrunRanks | None = None, *,
        timeout: float | None = None, interval: float = PROGRESS_SECONDS,
        pictures: Pictures | None = None, jobs: int = 1, threads: int | None = None,
        isolate: bool = False, journal: Journal | None = None) -> list[Record]:
    """Run the `cases` that `backend` accepts (single-process or distributed); prints each failing check
    and a progress line at least every `interval` seconds (harness/running/progress.py). Under torchrun
    only rank 0 prints and gets records. `Stop` or KeyboardInterrupt ends the run with `Interrupted`,
    which carries the records of the cases finished before it (the cases it interrupted are dropped),
    once every process the run started is gone.

    Distributed cases run on rank pools, their ranks within `timeout` seconds (see `run_case`).

    Single-process cases run here, one after another; or, with `jobs` > 1, `isolate` or a `timeout` (not
    under torchrun), in worker processes (harness/running/workers.py), `jobs` of them at once, each
    with `threads` BLAS threads (default threads_per_job(jobs): the cores shared out; name it when several
    runs share the machine). A worker loads the target from `target_spec`. A case whose worker dies
    (os._exit, a fatal signal) or whose target's code runs past `timeout` seconds (default the pool's
    DEFAULT_TIMEOUT) is an error on each of its checks, saying how it ended, with the worker's output or
    stacks; the worker is replaced and the run goes on. Records come back in case order, the same
    records as one process gives (every check is deterministic, and every case starts from the same
    torch state; `seconds` differ). Here, a target that kills this process ends the run: `journal` (on
    the driver) has every finished case's records, and before each case judged here its records should
    the process die in it (an error on each check, DIED_HERE)."""
    chosen = backends.get(backend)
    cases = [c for c in cases if chosen.accepts(c)]
    if ranks is not None and not ranks.is_driver:
        progress = None
    torch.set_num_threads(1)  # deterministic kernels; parallelism comes from processes
    in_workers = ranks is None and not chosen.distributed and (jobs > 1 or isolate or timeout is not None)
    done: dict[int, list[Record]] = {}
    try:
        with Progress(progress, len(cases), interval) as shown:
            if in_workers:
                _run_in_workers(cases, target, target_spec, backend, timeout, pictures, jobs, threads, done, shown,
                                journal)
            else:
                for i, case in enumerate(cases):
                    if journal is not None:
                        journal.starting(failed_case(case, target, target_spec, backend, DIED_HERE))
                    done[i] = judged_case(case, target, target_spec, backend, ranks, timeout, pictures)
                    shown.case_done(case.id, done[i])
                    if journal is not None:
                        journal.finished(done[i])
    except (Stop, KeyboardInterrupt) as exc:
        signum = exc.signum if isinstance(exc, Stop) else signal.SIGINT
        raise Interrupted(_in_order(done), len(done), len(cases), signum) from None
    return _in_order(done)


def _in_order(done: dict[int, list[Record]]) -> list[Record]:
    return [r for i in sorted(done) for r in done[i]]


def _run_in_workers(cases: list[Case], target: Target, target_spec: str, backend: str, timeout: float | None,
                    pictures: Pictures | None, jobs: int, threads: int | None, done: dict[int, list[Record]],
                    shown: Progress, journal: Journal | None) -> None:
    """`run`'s single-process cases in worker processes: each case's records into `done` as it ends."""
    keep = pictures.limit if pictures is not None else 0
    tasks = [(case.id, target_spec, backend, keep) for case in cases]
    with Workers(min(jobs, len(cases)), DEFAULT_TIMEOUT if timeout is None else timeout, threads) as workers:
        for i, outcome in workers.map(_worker_case, tasks):
            if isinstance(outcome, Done):
                done[i], kept = outcome.value
                if pictures is not None:
                    for record, detail in kept:
                        pictures.offer(record, detail)
            else:
                done[i] = failed_case(cases[i], target, target_spec, backend, outcome.why)
            shown.case_done(cases[i].id, done[i])
            if journal is not None:
                journal.finished(done[i])
