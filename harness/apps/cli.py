"""The command line: `python -m harness list | run | diff | trend | pr-diff | selftest`.

  list   print the ids of a tier's cases (narrowed by --select), one per line, then their count
  run    judge a target over a tier of cases; write results.parquet (canonical), results.csv,
         run.json, report.html, summary.md (and diff.html, diff.md with --baseline)
  diff   compare two stored runs (a PR against its base, tonight against last night)
  trend  error/tolerance ratio per check over several stored runs
  pr-diff  the CI tier of a base commit (run in a git worktree) diffed against this checkout's
  selftest  the harness's detection power: a catalog of wrong optimizers, kill rate per defect,
         false alarms on the correct targets (exit 1 on a surviving defect or a false alarm)

Every subcommand is one `Command` in `COMMANDS`: its help, the function that declares its
arguments and the function that runs it; a new subcommand is a new entry.

Exit status: 0 success; 1 a check failed or errored, nothing at all was checked, or
(diff, --baseline) the head regressed; 2 bad usage, reported in one line before any case
runs (unknown option, target or backend, a target that fails to import, empty selection,
an --out that cannot be written, lies inside a run being read, holds a stored run without
--replace, holds files but no run, is being written by another run, or lacks the free space
a run needs; a directory that holds no run, a stored run that is unreadable or whose files
disagree, or one without digests without --allow-undigested; runs that are not comparable,
or trend runs of different tiers, without --force; one run named twice to trend), or a run
that could not be stored (one line; the folder is as it was); 128+N a run stopped by
signal N (130 SIGINT, 143 SIGTERM), after writing the cases it finished, marked incomplete.

A run survives its target's faults: judged in worker processes (--jobs, --isolate, --timeout), a
case whose target crashes, exits or hangs is that case's error and the run goes on; judged in this
process, a target that kills it ends the run with that process's status (e.g. 3, or 139 for
SIGSEGV), and a watcher stores the finished cases and the one it died in, marked incomplete
(harness/apps/journal.py).
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import importlib
import io
import math
import os
import shlex
import signal
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from cases import TIERS, Case
from harness.apps import pr_diff
from harness.apps.journal import Journal
from harness.apps.outputs import write_run
from harness.judging import diagnosis
from harness.judging.details import Pictures
from harness.judging.scope import MIN_JUDGED, judgement
from harness.runner import BACKENDS, Interrupted, Stop, run
from harness.running.backends import get as get_backend
from harness.running.pool import DEFAULT_TIMEOUT, TORCHRUN_TIMEOUT, TorchrunRanks, pools, under_torchrun
from cases import tier as tier_cases
from harness.running.selection import TargetTier, narrow, nearest, target_tier
from harness.targets import DEFAULT, TargetError, load_target, target_module
from harness.targets.base import Target
from harness.targets.identity import module_identity
from reports import (CodeIdentity, Record, RunInfo, diff_runs, load_run, render_diff_html, render_diff_markdown,
                     render_trend_html, status_counts, worst_first)
from reports.diff import COMPARABLE_BY, DEFAULT_GROWTH, incomparable
from reports.diff_html import same_code_note
from reports.run_folder import RunFolder, StoreError, check, claim, estimated_bytes, write_file
from reports.store import project_commit
from reports.trend import repeated

Run = tuple[list, dict[str, Any]]
"""(records, context) of a stored run, as `load_run` returns it."""


class UsageError(Exception):
    """Bad command-line input: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with every usage error on one line (no usage block), exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _number(minimum: float, inclusive: bool) -> Callable[[str], float]:
    """An argparse type: a finite float above (or at) `minimum`."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive):
            bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
            raise argparse.ArgumentTypeError(f"expected a finite number {bound}, got {text!r}")
        return value
    return parse


def _list_arguments(p: argparse.ArgumentParser) -> None:
    _selection_arguments(p)
    p.add_argument("--target", help="list the cases this target's own tier holds, then why the global tier's "
                                    "others are unsupported (alias or MODULE:CALLABLE)")
    p.add_argument("--coverage", action="store_true",
                   help="also print the coverage summary of the listed cases (cases/coverage.py)")


def _selection_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tier", default="ci", choices=TIERS, help="case tier (default: ci)")
    p.add_argument("--select", action="append", default=[], metavar="SUBSTRING",
                   help="keep cases whose id contains SUBSTRING (repeatable); a full case id runs that case")


def _run_arguments(p: argparse.ArgumentParser) -> None:
    _selection_arguments(p)
    p.add_argument("--backend", default="cpu", help=f"comma-separated backends, each once, of {', '.join(BACKENDS)}")
    p.add_argument("--target", default=DEFAULT, help="alias or MODULE:CALLABLE returning a Target (default: ours)")
    p.add_argument("--timeout", type=_number(0.0, inclusive=False), metavar="SECONDS",
                   help=f"seconds a target's code may run at a stretch before its case is an error with its "
                        f"stacks: a distributed case's ranks, a single-process case's worker process (giving "
                        f"--timeout runs single-process cases in workers, as --isolate); default "
                        f"{DEFAULT_TIMEOUT:g}, and none for single-process cases run in this process; under "
                        f"torchrun it is the process group's timeout, default {TORCHRUN_TIMEOUT:g}")
    p.add_argument("--out", default="out", type=Path,
                   help="directory for results.parquet/.csv, run.json, reports: absent, empty, or a stored run "
                        "with --replace; written beside it and renamed into place when complete")
    p.add_argument("--replace", action="store_true",
                   help="replace the stored run at --out (the old one stays until the new one is in place)")
    p.add_argument("--baseline", type=Path, metavar="DIR", help="a stored run to diff this run against")
    p.add_argument("--growth", default=DEFAULT_GROWTH, type=_number(1.0, inclusive=True),
                   help=f"with --baseline: error growth factor that counts (default {DEFAULT_GROWTH:g})")
    p.add_argument("--force", action="store_true",
                   help="with --baseline: compare even if the runs are not comparable (tier, target, backends)")
    _undigested_argument(p)
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--allow-thin", action="store_true",
                   help=f"exit 0 on a run that judged too little to mean anything (fewer than {MIN_JUDGED} cases, or "
                        f"an axis value the target supports judged on no case); it still says so")
    p.add_argument("--jobs", type=_jobs, default=1, metavar="N",
                   help="judge N single-process cases at once in spawned worker processes, each with "
                        "cores/N BLAS threads, as --isolate does (default 1: in this process; ignored under "
                        "torchrun)")
    p.add_argument("--isolate", action="store_true",
                   help="judge single-process cases in a worker process: a case whose target crashes, exits or "
                        "runs past --timeout is an error with the exit status, signal or stacks and its output, "
                        "and the run goes on (without it, a target that kills this process ends the run; the cases it "
                        "finished are stored)")
    p.add_argument("--threads", type=_jobs, metavar="T",
                   help="with --jobs: BLAS threads per worker (default: cores / N; name it when several runs "
                        "share the machine, so that their workers' threads add up to its cores)")


def _undigested_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-undigested", action="store_true",
                   help="read stored runs without digests (no run.json, or one of schema version 1), which "
                        "cannot be checked against what their run wrote")


def _jobs(text: str) -> int:
    """An argparse type: a whole number of jobs, at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def _diff_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("base", type=Path, help="directory of the base run")
    p.add_argument("head", type=Path, help="directory of the head run")
    p.add_argument("--out", default="diff-out", type=Path,
                   help="directory for diff.html and diff.md, never inside BASE or HEAD (default: diff-out)")
    p.add_argument("--growth", default=DEFAULT_GROWTH, type=_number(1.0, inclusive=True),
                   help=f"error growth factor that counts (default {DEFAULT_GROWTH:g})")
    p.add_argument("--force", action="store_true",
                   help="compare runs of different tiers, targets, backends, selections or completeness")
    _undigested_argument(p)


def _trend_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", type=Path, help="directories of stored runs, each run once")
    p.add_argument("--out", default="trend-out", type=Path,
                   help="directory for trend.html, never inside a run read (default: trend-out)")
    p.add_argument("--force", action="store_true", help="follow runs of different tiers")
    _undigested_argument(p)


def _selftest_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases-per-defect", type=int, metavar="N",
                   help="CI cases per defect, where it can show (default: harness.apps.selftest.CASES_PER_DEFECT)")


def cmd_selftest(args: argparse.Namespace) -> int:
    from harness.apps import selftest  # imports the defect catalog only when asked for
    limit = selftest.CASES_PER_DEFECT if args.cases_per_defect is None else args.cases_per_defect
    if limit < 1:
        raise UsageError(f"--cases-per-defect must be >= 1, got {limit}")
    return selftest.main(limit)


def _cases(tier: str, patterns: list[str], own: TargetTier | None = None) -> list[Case]:
    """The selected cases of the global tier, or of a target's own tier; a usage error naming the nearest
    ids when none matches."""
    every = tier_cases(tier) if own is None else list(own.cases)
    cases = narrow(every, patterns)
    if not cases:
        near = [n for p in patterns for n in nearest(p, [c.id for c in every])]
        hint = f"; nearest: {', '.join(near)}" if near else ""
        whose = f"tier {tier!r}" if own is None else f"the target's {tier} tier"
        raise UsageError(f"no case of {whose} matches --select {' '.join(patterns)}{hint}")
    return cases


def _own_tier(tier: str, target: Target) -> TargetTier:
    """`target`'s own tier, or a usage error where its adapter raises while saying what it supports."""
    try:
        return target_tier(tier, target)
    except Exception as exc:  # an adapter's unsupported() that raises is bad input, whatever it raises
        raise UsageError(f"target {target.name}: asking what it supports raised {type(exc).__name__}: {exc}") from None


def _load(run_dir: Path, undigested: bool) -> Run:
    try:
        return load_run(run_dir, undigested=undigested)
    except StoreError as exc:
        raise UsageError(str(exc)) from None


def _outside(out: Path, reading: list[Path]) -> None:
    """A usage error when `out` is or lies inside a run being read."""
    resolved = out.resolve()
    for run_dir in reading:
        if resolved == run_dir.resolve() or run_dir.resolve() in resolved.parents:
            raise UsageError(f"--out {out} is inside {run_dir}, a run this command reads; choose another directory")


def _run_folder(out: Path, reading: list[Path], replace: bool, cases: int) -> RunFolder | None:
    """`out` checked for a run of `cases` cases (reports.run_folder.check) and claimed (locked) by the
    process that will write it; on the other torchrun ranks checked alike, and None."""
    _outside(out, reading)
    try:
        if under_torchrun() and os.environ["RANK"] != "0":
            check(out, replace=replace, expected_bytes=estimated_bytes(cases))
            return None
        return claim(out, replace=replace, expected_bytes=estimated_bytes(cases))
    except StoreError as exc:
        raise UsageError(f"--out {exc}") from None


def _output_dir(out: Path, reading: list[Path]) -> Path:
    """`out`, created and proven writable; refused when it is a file, is or lies inside a run being
    read, or cannot be created or written. Call it last among the checks: it creates `out`."""
    _outside(out, reading)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None
    return out


def _comparable(base: dict[str, Any], head: dict[str, Any], names: tuple[Path, Path], force: bool,
                keys: tuple[str, ...] = COMPARABLE_BY) -> None:
    """A usage error naming how the runs differ in `keys`, unless they do not or `force`."""
    reasons = incomparable(base, head, keys)
    if reasons and not force:
        raise UsageError(f"{names[0]} and {names[1]} are not comparable ({'; '.join(reasons)}); "
                         f"--force compares them anyway")


def _across_backends(base: dict[str, Any], head: dict[str, Any]) -> bool:
    """Whether two runs judged different backends (gloo vs nccl, cpu vs cuda): their diff then pairs
    each case across the backends (reports.diff)."""
    names = [sorted(b for b in str(ctx.get("backends", "")).split(",") if b) for ctx in (base, head)]
    return all(names) and names[0] != names[1]


def _write_diff(base: Run, head: Run, base_dir: Path, out: Path, growth: float, across: bool = False) -> bool:
    """Write out/diff.html and out/diff.md (pairing cases across backends if `across`); True if the
    head regressed."""
    (base_records, base_ctx), (head_records, head_ctx) = base, head
    try:
        diff = diff_runs(base_records, head_records, growth=growth, across_backends=across)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    write_file(out / "diff.html", render_diff_html(diff, base_ctx, head_ctx))
    write_file(out / "diff.md", render_diff_markdown(diff, base_ctx, head_ctx))
    verdict = "REGRESSED" if diff.regressed else "no regression"
    paired = (f" paired across backends {base_ctx.get('backends')} -> {head_ctx.get('backends')};"
              if across else "")
    print(f"diff against {base_dir}:{paired} {verdict} ({', '.join(f'{len(v)} {k}' for k, v in diff.categories().items() if v)}); "
          f"{out}/diff.html", file=sys.stderr)
    if same := same_code_note(base_ctx, head_ctx):
        print(same, file=sys.stderr)
    return diff.regressed


def _backends(text: str) -> list[str]:
    """The --backend list; a usage error for an unknown backend or one named twice."""
    names = [b.strip() for b in text.split(",") if b.strip()]
    unknown = [b for b in names if b not in BACKENDS]
    if not names or unknown:
        raise UsageError(f"unknown backend(s) {unknown or text!r}; available: {', '.join(BACKENDS)}")
    twice = sorted({b for b in names if names.count(b) > 1})
    if twice:
        raise UsageError(f"--backend names {', '.join(twice)} more than once; name each backend once")
    return names


def _target(spec: str) -> Target:
    """The target, or a usage error: a bad spec, or a module or factory that raises."""
    try:
        return load_target(spec)
    except TargetError as exc:
        raise UsageError(str(exc)) from None
    except Exception as exc:  # a target module that fails to import is bad input, whatever it raises
        text = str(exc).splitlines()[0] if str(exc) else ""
        raise UsageError(f"target {spec!r} could not be loaded: {type(exc).__name__}: {text}") from None


def _torchrun_ranks(names: list[str], timeout: float | None) -> TorchrunRanks | None:
    """Under torchrun: this world's ranks, for the one distributed backend named; None otherwise, and
    None where that backend cannot run here (nccl without NCCL or a GPU per rank): rank 0 then records
    every case as skipped with the reason, and the other ranks stop."""
    if not under_torchrun():
        return None
    distributed = [n for n in names if get_backend(n).distributed]
    if len(distributed) != 1:
        raise UsageError(f"under torchrun name exactly one distributed backend (gloo or nccl); got {','.join(names)}")
    gpus_needed = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # one GPU per rank of this node
    if distributed[0] == "nccl" and not (dist.is_nccl_available() and torch.cuda.device_count() >= gpus_needed):
        return None
    return TorchrunRanks(distributed[0], TORCHRUN_TIMEOUT if timeout is None else timeout)


@contextmanager
def _stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise `Stop`, so that the run writes what it finished and pools close;
    a second one of the same signal acts at once (its default). Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        signal.signal(signum, signal.SIG_DFL)
        raise Stop(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def cmd_list(args: argparse.Namespace) -> int:
    own = _own_tier(args.tier, _target(args.target)) if args.target else None
    cases = _cases(args.tier, args.select, own)
    summary = _coverage(cases) if args.coverage else None
    for case in cases:
        print(case.id)
    print(f"{len(cases)} cases" + (f" of the {len(own.cases)} in {args.target}'s {args.tier} tier" if own else ""))
    if own is not None:
        print(f"{own.unsupported} of the {len(tier_cases(args.tier))} cases of the global {args.tier} tier are "
              f"unsupported; why, with how many of them each reason was given for:")
        for why, count in own.reasons.most_common():
            print(f"  {count:6d}  {why}")
    if summary:
        print(summary.rstrip("\n"))
    return 0


def _coverage(cases: list[Case]) -> str:
    """`cases.coverage.summary(cases)`, the coverage of the listed cases, where that module exists."""
    try:
        module = importlib.import_module("cases.coverage")
    except ModuleNotFoundError as exc:
        if exc.name != "cases.coverage":
            raise
        raise UsageError("--coverage needs cases/coverage.py, which this checkout does not have") from None
    return module.summary(cases)


def cmd_run(args: argparse.Namespace) -> int:
    backends = _backends(args.backend)
    target = _target(args.target)
    code = module_identity(target_module(args.target))  # before any case runs: the code as imported
    own = _own_tier(args.tier, target)
    cases = _cases(args.tier, args.select, own)
    base = None
    if args.baseline is not None:
        base = _load(args.baseline, args.allow_undigested)
        head = {"tier": args.tier, "targets": [target.name], "backends": ",".join(backends)}
        _comparable(base[1], head, (args.baseline, Path("this run")), args.force, ("tier", "targets", "backends"))
    folder = _run_folder(args.out, [args.baseline] if args.baseline is not None else [], args.replace,
                         len(cases) * len(backends))  # every torchrun rank refuses alike
    try:
        ranks = _torchrun_ranks(backends, args.timeout)
        if ranks is None and under_torchrun() and os.environ["RANK"] != "0":
            return 0
        try:
            with _stop_on_signals():
                return _run(args, target, code, backends, cases, base, ranks, own, folder)
        finally:
            pools().close()
    finally:
        if folder is not None:
            folder.release()


def _run(args: argparse.Namespace, target: Target, code: CodeIdentity, backends: list[str], cases: list[Case],
         base: Run | None, ranks: TorchrunRanks | None, own: TargetTier, folder: RunFolder | None) -> int:
    """Run, then (on the driver) write the stored run and the reports, naming `code` as the code judged;
    see `cmd_run`. Outside torchrun a journal (harness/apps/journal.py) stores the finished cases should
    this process die first."""
    driver = ranks is None or ranks.is_driver
    progress = None if args.quiet or not driver else sys.stderr
    try:  # a fatal signal in a target judged here prints the Python stacks before the process ends
        faulthandler.enable()
    except (AttributeError, ValueError, io.UnsupportedOperation):  # a stderr that is no file (captured in-process)
        pass
    started = datetime.datetime.now(datetime.timezone.utc)
    t0 = time.perf_counter()
    if progress:
        print(f"judging {target.name} ({target.version()}) on {len(cases)} cases of its {args.tier} tier "
              f"({len(own.cases)} cases; {own.unsupported} of the global tier's unsupported), backends "
              f"{','.join(backends)}", file=progress)
    spec = "" if args.target == target.name else f" (--target {args.target})"
    info = RunInfo(target=f"{target.name}: {target.version()}{spec}", tier=args.tier,
                   backends=",".join(backends), command=shlex.join(["python", "-m", "harness", *sys.argv[1:]]),
                   started=started.isoformat(timespec="seconds"), seconds=0.0, torch_version=torch.__version__,
                   commit=project_commit() if driver else "", selection=tuple(args.select), judged=code,
                   harness=module_identity("harness"))
    records, stopped, pictures = [], None, Pictures()
    parallel = {"jobs": args.jobs, "threads": args.threads} if args.jobs > 1 else {}  # run's defaults: one process
    if args.isolate:
        parallel["isolate"] = True
    with Journal(args.out, info) if ranks is None else nullcontext() as journal:
        try:
            for backend in backends:
                if progress:
                    print(f"backend {backend}:", file=progress)
                records += run(cases, target, args.target, backend, progress, ranks, timeout=args.timeout,
                               pictures=pictures, journal=journal, **parallel)
        except Interrupted as exc:
            records += exc.records
            stopped = exc
            print(f"{exc}; writing the checks of the cases it finished", file=sys.stderr)
        if ranks is not None:
            ranks.close()
            if not driver:
                return 0 if stopped is None else 128 + stopped.signum
        judged = judgement(own, cases, records, backends, bool(args.select))
        info = replace(info, seconds=time.perf_counter() - t0, interrupted=stopped.reason if stopped else "",
                       scope=judged.scope, thin=judged.thin)
        write_run(records, info, folder, pictures)
    counts = status_counts(records)
    checked = counts["pass"] + counts["fail"] + counts["error"]
    print(f"{len(records)} checks: " + ", ".join(f"{counts[s]} {s}" for s in counts)
          + f" ({time.perf_counter() - t0:.1f}s); reports in {args.out}/", file=sys.stderr)
    for line in failing_summary(records):
        print(line, file=sys.stderr)
    if stopped is not None:
        print(f"INCOMPLETE: {info.interrupted}; run.json says complete: false", file=sys.stderr)
        return 128 + stopped.signum
    regressed = False
    if base is not None:
        ids = {c.id for c in cases}
        selected = [r for r in base[0] if r.case_id in ids] if args.select else base[0]
        regressed = _write_diff((selected, base[1]), load_run(args.out), args.baseline, args.out, args.growth)
    print(judged.scope, file=sys.stderr)
    if checked == 0:
        print("nothing was checked: every case is unsupported or skipped", file=sys.stderr)
        return 1
    if judged.thin:
        print(f"THIN: {judged.thin}" + ("" if args.allow_thin else " (exit 1; --allow-thin accepts it)"),
              file=sys.stderr)
    return 1 if counts["fail"] or counts["error"] or regressed or (judged.thin and not args.allow_thin) else 0


SUMMARY_CASES = 8
"""Failing cases the console summary of a run names, worst first (every one is in summary.md and report.html)."""


def failing_summary(records: list[Record], limit: int = SUMMARY_CASES) -> list[str]:
    """The console summary of a run's failing cases: how many per diagnosis label, then the worst `limit`
    cases (by their worst check), each with its diagnosis label."""
    worst: dict[tuple[str, str], Record] = {}
    for r in worst_first(r for r in records if r.failing):
        worst.setdefault((r.case_id, r.backend), r)
    if not worst:
        return []
    labels = [diagnosis.label(r.diagnosis) or "undiagnosed" for r in worst.values()]
    counts = ", ".join(f"{label} {labels.count(label)}" for label in sorted(set(labels), key=labels.index))
    lines = [f"{len(worst)} failing cases, by diagnosis: {counts}"]
    for label, r in list(zip(labels, worst.values()))[:limit]:
        ratio = "" if math.isnan(r.ratio) else f", ratio {r.ratio:.3g}"
        lines.append(f"  {label:18} {r.case_id}  ({r.check} {r.status}{ratio})")
    if len(worst) > limit:
        lines.append(f"  ... {len(worst) - limit} more, with their diagnosis lines, in summary.md and report.html")
    return lines


def cmd_diff(args: argparse.Namespace) -> int:
    """Two runs of the same backends pair record by record; runs of different backends (gloo and
    nccl, cpu and cuda) pair each case across them, and must agree on everything else."""
    base, head = _load(args.base, args.allow_undigested), _load(args.head, args.allow_undigested)
    across = _across_backends(base[1], head[1])
    keys = tuple(k for k in COMPARABLE_BY if k != "backends") if across else COMPARABLE_BY
    _comparable(base[1], head[1], (args.base, args.head), args.force, keys)
    out = _output_dir(args.out, [args.base, args.head])
    return 1 if _write_diff(base, head, args.base, out, args.growth, across) else 0


def cmd_trend(args: argparse.Namespace) -> int:
    """Runs of one tier (others with --force), each once."""
    runs = [_load(d, args.allow_undigested) for d in args.runs]
    twice = repeated([ctx for _, ctx in runs])
    if twice:
        first, second = twice[0]
        raise UsageError(f"{args.runs[first]} and {args.runs[second]} are the same run; name each run once")
    for run_dir, (_, ctx) in zip(args.runs[1:], runs[1:]):
        _comparable(runs[0][1], ctx, (args.runs[0], run_dir), args.force, ("tier",))
    out = _output_dir(args.out, args.runs)
    write_file(out / "trend.html", render_trend_html([(ctx, records) for records, ctx in runs]))
    print(f"trend over {len(runs)} runs: {out}/trend.html", file=sys.stderr)
    return 0


@dataclass(frozen=True)
class Command:
    """A subcommand: its one-line help, what declares its arguments, what runs it (-> exit status)."""

    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: Mapping[str, Command] = types.MappingProxyType({
    "list": Command("print the ids of the selected cases and their count", _list_arguments, cmd_list),
    "run": Command("judge a target over a tier of cases", _run_arguments, cmd_run),
    "diff": Command("compare two stored runs", _diff_arguments, cmd_diff),
    "trend": Command("ratio per check over several stored runs", _trend_arguments, cmd_trend),
    "pr-diff": Command(pr_diff.HELP, pr_diff.arguments, pr_diff.command),
    "selftest": Command("run the built-in wrong optimizers: kill rate per defect, false alarms", _selftest_arguments,
                        cmd_selftest),
})


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m harness", description="Muon-family conformance harness")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        command.arguments(sub.add_parser(name, help=command.help, description=command.help))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command].run(args)
    except (UsageError, StoreError) as exc:  # StoreError: a stored run or report that could not be written
        print(f"{parser.prog} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except Stop as exc:
        print(f"{parser.prog} {args.command}: interrupted by {exc}", file=sys.stderr)
        return 128 + exc.signum
    except BrokenPipeError:  # the reader of stdout went away (`list | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
