"""Runs cases against a target and turns every check into a `Record`.

Single-process cases run here (cpu or cuda backend); distributed cases run on a pool of
ranks (gloo or nccl, harness/pool.py), or on the ranks of torchrun, and are judged here
from the pieces the ranks send back (harness/distributed_checks.py).
"""

from __future__ import annotations

import shlex
import sys
import time
import traceback
from typing import Callable, Iterable, TextIO

import torch

from cases import Case
from harness import backends, diagnosis, distributed_checks
from harness.backends import Backend
from harness.checks import CHECKS, Outcome, applicable
from harness.inputs import make_inputs
from harness.pool import TorchrunRanks, pools
from harness.targets.base import Target
from reports import Record

BACKENDS = tuple(backends.BACKENDS)


def repro_command(case: Case, target_spec: str, backend: str) -> str:
    """The command that reruns exactly this case."""
    return (f"python -m harness run --target {shlex.quote(target_spec)} --backend {backend} "
            f"--select {shlex.quote(case.id)}")


def _record(case: Case, target: Target, check: str, status: str, backend: str, repro: str,
            seconds: float, **fields: object) -> Record:
    return Record(case_id=case.id, check=check, target=target.name, backend=backend, world_size=case.world_size,
                  layout=case.layout_detail, optimizer=case.optimizer, layer=case.kind, shape=case.shape_text,
                  megabatch=case.megabatch, flatten=case.flatten, param_dtype=case.param_dtype,
                  compute_dtype=case.compute_dtype, orthogonalizer=case.orthogonalizer, status=status,
                  repro=repro, seconds=seconds, **fields)


def _judge(case: Case, target: Target, backend: str, repro: str,
           checks: dict[str, Callable[[], Outcome]]) -> list[Record]:
    """Run each check; a check that raises is an error record with its traceback."""
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
    return records


def _run_distributed(case: Case, target: Target, target_spec: str, backend: Backend, repro: str,
                     names: list[str], ranks: TorchrunRanks | None) -> list[Record]:
    """Run `case` on its ranks (a spawned pool, or torchrun's), then judge the pieces they sent back.
    Under torchrun only rank 0 gets records."""
    start = time.perf_counter()
    args = (distributed_checks.rank_trajectory, case.id, target_spec)
    result = pools().run(backend.name, case.world_size, *args) if ranks is None else ranks.run(case.world_size, *args)
    if result is None:
        return []
    if not result.ok:
        message = (f"{len(result.failures)} of {case.world_size} {backend.name} ranks failed; every rank's "
                   f"traceback:\n{result.describe()}")
        return [_record(case, target, n, "error", backend.name, repro, time.perf_counter() - start, message=message)
                for n in names]
    inputs, pieces = make_inputs(case), result.values
    return _judge(case, target, backend.name, repro,
                  {n: (lambda n=n: distributed_checks.CHECKS[n](case, target, inputs, pieces)) for n in names})


def run_case(case: Case, target: Target, target_spec: str, backend: str | None = None,
             ranks: TorchrunRanks | None = None) -> list[Record]:
    """Every applicable check of `case` on `target`: pass/fail, or unsupported, skipped (with the
    reason), or error. `backend` defaults to the case's own: cpu, or gloo for a distributed case.
    Under torchrun (`ranks`) every rank calls this in the same order; only rank 0 gets records."""
    chosen = backends.get(backend) if backend is not None else backends.natural(case)
    repro = repro_command(case, target_spec, chosen.name)
    distributed = case.layout != "single"
    names = distributed_checks.applicable(case) if distributed else applicable(case)
    driver = ranks is None or ranks.is_driver

    def every(status: str, message: str) -> list[Record]:
        return [_record(case, target, n, status, chosen.name, repro, 0.0, message=message) for n in names] if driver else []

    if not chosen.accepts(case):
        kind = "distributed" if chosen.distributed else "single-process"
        return every("skipped", f"backend {chosen.name} runs {kind} cases; this case is {case.layout_detail}")
    reason = distributed_checks.unsupported(target, case) if distributed else target.unsupported(case)
    if reason is not None:
        return every("unsupported", reason)
    why = chosen.unavailable(case, ranks.world_size if ranks is not None else None)
    if why is not None:
        return every("skipped", why)
    target = backends.judged_as(target, chosen)
    if distributed:
        return _run_distributed(case, target, target_spec, chosen, repro, names, ranks)
    if not driver:
        return []
    start = time.perf_counter()
    try:
        inputs = backends.on_device(make_inputs(case), chosen.device())
        trajectory = target.run(inputs.params, inputs.grads, case)
    except Exception:
        message = "target raised: " + traceback.format_exc(limit=4)
        return [_record(case, target, n, "error", chosen.name, repro, time.perf_counter() - start, message=message)
                for n in names]
    return _judge(case, target, chosen.name, repro,
                  {n: (lambda n=n: CHECKS[n](case, target, inputs, trajectory)) for n in names})


def run(cases: Iterable[Case], target: Target, target_spec: str, backend: str = "cpu",
        progress: TextIO | None = sys.stderr, ranks: TorchrunRanks | None = None) -> list[Record]:
    """Run the `cases` that `backend` accepts (single-process or distributed); prints one line per
    failing case and a progress line every ~5%. Under torchrun only rank 0 prints and gets records."""
    chosen = backends.get(backend)
    cases = [c for c in cases if chosen.accepts(c)]
    if ranks is not None and not ranks.is_driver:
        progress = None
    torch.set_num_threads(1)  # deterministic kernels; parallelism comes from processes
    records: list[Record] = []
    every = max(1, len(cases) // 20)
    start = time.perf_counter()
    for n, case in enumerate(cases, 1):
        got = diagnosis.annotate(case, target, run_case(case, target, target_spec, backend, ranks))
        records.extend(got)
        if progress is None:
            continue
        bad = [r for r in got if r.failing]
        for r in bad:
            print(f"  {r.status.upper():5} {r.check:9} {case.id}  ratio {r.ratio:.3g}", file=progress)
        if bad and bad[0].diagnosis:
            print(f"        diagnosis: {bad[0].diagnosis}", file=progress)
        if n % every == 0 or n == len(cases):
            failing = sum(r.failing for r in records)
            print(f"[{n:>5}/{len(cases)}] {time.perf_counter() - start:6.1f}s  "
                  f"{len(records)} checks, {failing} failing", file=progress, flush=True)
    return records
