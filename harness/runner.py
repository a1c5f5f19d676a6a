"""Runs cases against a target and turns every check into a `Record`."""

from __future__ import annotations

import shlex
import sys
import time
import traceback
from typing import Iterable, TextIO

import torch

from cases import Case
from harness.checks import CHECKS, applicable
from harness.inputs import make_inputs
from harness.targets.base import Target
from reports import Record

BACKENDS = ("cpu",)


def repro_command(case: Case, target_spec: str, backend: str) -> str:
    """The command that reruns exactly this case."""
    return (f"python -m harness run --target {shlex.quote(target_spec)} --backend {backend} "
            f"--select {shlex.quote(case.id)}")


def _record(case: Case, target: Target, check: str, status: str, backend: str, repro: str,
            seconds: float, **fields: object) -> Record:
    return Record(case_id=case.id, check=check, target=target.name, backend=backend, world_size=1,
                  layout="single", optimizer=case.optimizer, layer=case.kind, shape=case.shape_text,
                  megabatch=case.megabatch, flatten=case.flatten, param_dtype=case.param_dtype,
                  compute_dtype=case.compute_dtype, orthogonalizer=case.orthogonalizer, status=status,
                  repro=repro, seconds=seconds, **fields)


def run_case(case: Case, target: Target, target_spec: str, backend: str = "cpu") -> list[Record]:
    """Every applicable check of `case` on `target`: pass/fail, or unsupported, or error."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; available: {BACKENDS}")
    repro = repro_command(case, target_spec, backend)
    names = applicable(case)
    reason = target.unsupported(case)
    if reason is not None:
        return [_record(case, target, n, "unsupported", backend, repro, 0.0, message=reason) for n in names]
    start = time.perf_counter()
    try:
        inputs = make_inputs(case)
        trajectory = target.run(inputs.params, inputs.grads, case)
    except Exception:
        message = "target raised: " + traceback.format_exc(limit=4)
        return [_record(case, target, n, "error", backend, repro, time.perf_counter() - start, message=message)
                for n in names]
    records = []
    for name in names:
        t0 = time.perf_counter()
        try:
            out = CHECKS[name](case, target, inputs, trajectory)
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


def run(cases: Iterable[Case], target: Target, target_spec: str, backend: str = "cpu",
        progress: TextIO | None = sys.stderr) -> list[Record]:
    """Run all `cases`; prints one line per failing case and a progress line every ~5%."""
    cases = list(cases)
    torch.set_num_threads(1)  # deterministic kernels; parallelism comes from processes
    records: list[Record] = []
    every = max(1, len(cases) // 20)
    start = time.perf_counter()
    for n, case in enumerate(cases, 1):
        got = run_case(case, target, target_spec, backend)
        records.extend(got)
        if progress is None:
            continue
        bad = [r for r in got if r.failing]
        for r in bad:
            print(f"  {r.status.upper():5} {r.check:9} {case.id}  ratio {r.ratio:.3g}", file=progress)
        if n % every == 0 or n == len(cases):
            failing = sum(r.failing for r in records)
            print(f"[{n:>5}/{len(cases)}] {time.perf_counter() - start:6.1f}s  "
                  f"{len(records)} checks, {failing} failing", file=progress, flush=True)
    return records
