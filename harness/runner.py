"""Runs cases against a target and turns every check into a `Record`.

One path for every layout: the target steps a case over its layout and every check judges the
pieces that came back (harness/judging/distributed_checks.py). A single-process case (world size 1) steps
here (cpu or cuda backend); a distributed one on a pool of ranks (gloo or nccl, harness/running/pool.py),
or on the ranks of torchrun.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool
import os
import shlex
import signal
import sys
import time
import traceback
from typing import Callable, Iterable, TextIO

import torch

from cases import Case, schema
from harness.judging import diagnosis, registry
from harness.judging.checks import Outcome
from harness.judging.checks import device_class
from harness.judging.details import Pictures
from harness.judging.distributed_checks import Pieces, gather
from harness.judging.judged import Judged
from harness.running import backends
from harness.running.backends import Backend
from harness.running.inputs import Inputs, make_inputs
from harness.running.pool import TorchrunRanks, pools
from harness.running.progress import PROGRESS_SECONDS, Progress
from harness.running.ranks import rank_trajectory
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


def repro_command(case: Case, target_spec: str, backend: str) -> str:
    """The command that reruns exactly this case."""
    return (f"python -m harness run --target {shlex.quote(target_spec)} --backend {backend} "
            f"--select {shlex.quote(case.id)}")


def _record(case: Case, target: Target, check: str, status: str, backend: str, repro: str,
            seconds: float, **fields: object) -> Record:
    return Record(case_id=case.id, check=check, target=target.name, backend=backend, status=status, repro=repro,
                  seconds=seconds, **schema.column_values(case), **fields)


def _judge(case: Case, target: Target, backend: str, repro: str,
           checks: dict[str, Callable[[], Outcome]], pictures: Pictures | None = None,
           judged: Judged | None = None) -> list[Record]:
    """Run each check; a check that raises is an error record with its traceback. Each record and its
    evidence are offered to `pictures`, each outcome to `judged`."""
    records = []
    for name, check in checks.items():
        t0 = time.perf_counter()
        try:
            out = check()
        except Exception:
            records.append(_record(case, target, name, "error", backend, repro, time.perf_counter() - t0,
                                   message="check raised: " + traceback.format_exc(limit=4)))
            continue
        tol = out.tolerance
        records.append(_record(
            case, target, name, out.status, backend, repro, time.perf_counter() - t0,
            max_abs=out.metrics.max_abs, rel_err=out.metrics.rel_err, max_ulp=out.metrics.max_ulp,
            tolerance=tol.rtol if tol else float("nan"),
            tolerance_source=tol.source if tol else "",
            ratio=out.metrics.ratio, message=out.message))
        if pictures is not None:
            pictures.offer(records[-1], out.evidence)
        if judged is not None:
            judged.offer(name, out)
    return records


def _pieces(case: Case, target: Target, target_spec: str, backend: Backend, inputs: Inputs | None,
            ranks: TorchrunRanks | None, timeout: float | None) -> Pieces | str | None:
    """Every rank's piece of every member after every step of `case` over its layout: one process
    (world size 1) is `target.run` on `inputs` here; a distributed layout runs on its ranks (a spawned
    pool, or torchrun's), each rebuilding the inputs. A string says why the target or its ranks
    failed; None: a rank of torchrun other than rank 0."""
    if case.world_size == 1:
        assert inputs is not None, "one process is its own driver"
        try:
            return [target.run(inputs.params, inputs.grads, case)]
        except Exception:
            return "target raised: " + traceback.format_exc(limit=4)
    args = (rank_trajectory, case.id, target_spec)
    result = (pools().run(backend.name, case.world_size, *args, timeout=timeout) if ranks is None
              else ranks.run(case.world_size, *args))
    if result is None:
        return None
    if not result.ok:
        return (f"{len(result.failures)} of {case.world_size} {backend.name} ranks failed; every rank's "
                f"traceback:\n{result.describe()}")
    return result.values


def run_case(case: Case, target: Target, target_spec: str, backend: str | None = None,
             ranks: TorchrunRanks | None = None, timeout: float | None = None,
             pictures: Pictures | None = None, judged: Judged | None = None) -> list[Record]:
    """Every applicable check of `case` on `target`: pass/fail, or unsupported, skipped (with the
    reason), or error. One path for every layout: the target steps the case over its layout (one
    process being world size 1), then each check judges the pieces it returned. `backend` defaults
    to the case's own: cpu, or gloo for a distributed case. A distributed case whose ranks run past
    `timeout` seconds (default: the pool's DEFAULT_TIMEOUT) is an error. Under torchrun (`ranks`)
    every rank calls this in the same order; only rank 0 gets records (there the process group's
    timeout applies). `pictures` keeps the evidence of the worst reference checks for the report; `judged`
    the judged trajectory and the checks' runs for the diagnosis."""
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
    # Judged on the backend's device: the policy's device class and the single-process run of `layout` are
    # those of the ranks (cuda for nccl), not of the host the records are gathered on.
    inputs = backends.on_device(make_inputs(case), chosen.device()) if driver else None
    pieces = _pieces(case, target, target_spec, chosen, inputs, ranks, timeout)
    if pieces is None:
        return []
    if isinstance(pieces, str):
        return every("error", pieces, time.perf_counter() - start)
    assert inputs is not None, "only the driver gets pieces"
    if judged is not None:
        judged.trajectory, judged.device = gather(case, pieces), device_class(inputs)
    return _judge(case, target, chosen.name, repro,
                  {n: (lambda n=n: registry.judge(n)(case, target, inputs, pieces)) for n in names},
                  pictures, judged)


def judged_case(case: Case, target: Target, target_spec: str, backend: str | None = None,
                ranks: TorchrunRanks | None = None, timeout: float | None = None,
                pictures: Pictures | None = None) -> list[Record]:
    """`run_case`'s records of `case`, each with its diagnosis (harness/judging/diagnosis.py), made from
    what the checks judged."""
    judged = Judged()
    records = run_case(case, target, target_spec, backend, ranks, timeout, pictures, judged)
    return diagnosis.annotate(case, target, records, judged)


THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
"""The thread counts of the BLAS/LAPACK libraries NumPy and SciPy may use (the FP64 oracles' time is
theirs), set in each `--jobs` worker before it imports them: jobs x threads stays within the cores."""


def threads_per_job(jobs: int, cores: int | None = None) -> int:
    """The BLAS threads each of `jobs` worker processes gets: the cores shared out, at least one."""
    cores = cores if cores is not None else len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)
    return max(1, cores // max(1, jobs))


_WORKER_TARGETS: dict[str, Target] = {}


def _worker_start() -> None:
    torch.set_num_threads(1)  # as `run`: deterministic kernels, parallelism from processes


def _worker_case(case_id: str, target_spec: str, backend: str, timeout: float | None,
                 keep: int) -> tuple[list[Record], list]:
    """One single-process case judged in a `--jobs` worker: its records (with their diagnosis, made here,
    where the case's oracle decompositions are memoised and cases run side by side), and the pictures' data
    of the reference evidence its own Pictures keeper kept, made here too (offered again to the parent's)."""
    from harness.targets import load_target
    if target_spec not in _WORKER_TARGETS:
        _WORKER_TARGETS[target_spec] = load_target(target_spec)
    pictures, case, target = Pictures(keep), Case.from_id(case_id), _WORKER_TARGETS[target_spec]
    records = judged_case(case, target, target_spec, backend, None, timeout, pictures)
    return records, pictures.kept_details()


def _pool(jobs: int, threads: int | None = None) -> multiprocessing.pool.Pool:
    """`jobs` spawned worker processes (CUDA-safe), each with `threads` BLAS threads (default
    threads_per_job(jobs)): the variables are set in this process's environment while the workers start
    (they inherit it), then restored."""
    threads = str(threads or threads_per_job(jobs))
    saved = {v: os.environ.get(v) for v in THREAD_VARIABLES}
    os.environ.update({v: threads for v in THREAD_VARIABLES})
    try:
        return multiprocessing.get_context("spawn").Pool(jobs, initializer=_worker_start)
    finally:
        for v, value in saved.items():
            if value is None:
                os.environ.pop(v, None)
            else:
                os.environ[v] = value


def run(cases: Iterable[Case], target: Target, target_spec: str, backend: str = "cpu",
        progress: TextIO | None = sys.stderr, ranks: TorchrunRanks | None = None, *,
        timeout: float | None = None, interval: float = PROGRESS_SECONDS,
        pictures: Pictures | None = None, jobs: int = 1, threads: int | None = None) -> list[Record]:
    """Run the `cases` that `backend` accepts (single-process or distributed), each distributed one
    within `timeout` seconds (see `run_case`); prints each failing check and a progress line at
    least every `interval` seconds (harness/running/progress.py). Under torchrun only rank 0 prints and
    gets records. `Stop` or KeyboardInterrupt ends the run with `Interrupted`, which carries the
    records of the cases finished before it (the case it interrupted is dropped).

    `jobs` > 1 (not under torchrun): the single-process cases are judged in that many spawned worker
    processes at once, each with `threads` BLAS threads (default threads_per_job(jobs): the cores shared
    out; name it when several runs share the machine; the FP64 oracles' LAPACK work is most of a large
    case's time), the distributed ones here meanwhile; records come back in case order,
    the same records as one process gives (every check is deterministic; `seconds` differ)."""
    chosen = backends.get(backend)
    cases = [c for c in cases if chosen.accepts(c)]
    if ranks is not None and not ranks.is_driver:
        progress = None
    torch.set_num_threads(1)  # deterministic kernels; parallelism comes from processes
    if jobs > 1 and ranks is None and sum(c.world_size == 1 for c in cases) > 1:
        return _run_parallel(cases, target, target_spec, backend, progress, timeout, interval, pictures, jobs,
                             threads)
    records: list[Record] = []
    done = 0
    try:
        with Progress(progress, len(cases), interval) as shown:
            for case in cases:
                got = judged_case(case, target, target_spec, backend, ranks, timeout, pictures)
                records.extend(got)
                done += 1
                shown.case_done(case.id, got)
    except Stop as exc:
        raise Interrupted(records, done, len(cases), exc.signum) from None
    except KeyboardInterrupt:
        raise Interrupted(records, done, len(cases), signal.SIGINT) from None
    return records


def _run_parallel(cases: list[Case], target: Target, target_spec: str, backend: str, progress: TextIO | None,
                  timeout: float | None, interval: float, pictures: Pictures | None, jobs: int,
                  threads: int | None = None) -> list[Record]:
    """`run` with the single-process cases on a pool of `jobs` workers (see `run`)."""
    single = [i for i, c in enumerate(cases) if c.world_size == 1]
    got: dict[int, list[Record]] = {}
    keep = pictures.limit if pictures is not None else 0
    pool = _pool(min(jobs, len(single)), threads)
    try:
        with Progress(progress, len(cases), interval) as shown:
            pending = {i: pool.apply_async(_worker_case, (cases[i].id, target_spec, backend, timeout, keep))
                       for i in single}
            for i, case in enumerate(cases):
                if i not in pending:
                    got[i] = judged_case(case, target, target_spec, backend, None, timeout, pictures)
                    shown.case_done(case.id, got[i])
            while pending:
                for i in [i for i, result in pending.items() if result.ready()]:
                    got[i], kept = pending.pop(i).get()
                    if pictures is not None:
                        for record, detail in kept:
                            pictures.offer(record, detail)
                    shown.case_done(cases[i].id, got[i])
                if pending:
                    next(iter(pending.values())).wait(0.2)
    except (Stop, KeyboardInterrupt) as exc:
        pool.terminate()
        finished = [r for i in sorted(got) for r in got[i]]
        signum = exc.signum if isinstance(exc, Stop) else signal.SIGINT
        raise Interrupted(finished, len(got), len(cases), signum) from None
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.close()
        pool.join()
    return [r for i in sorted(got) for r in got[i]]

