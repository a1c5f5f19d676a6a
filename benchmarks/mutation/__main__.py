"""`python -m benchmarks.mutation`: mutation testing of the optimizers and the oracles, with the
harness as the oracle (see benchmarks/mutation/__init__.py).

  python -m benchmarks.mutation --session DIR [--modules PATH ...] [--changed-since REV]
         [--budget-minutes N] [--jobs N] [--max-cases N] [--max-gloo N] [--max-tests N]
         [--timeout-base S] [--map-tests FILE ...] [--map-select SUBSTRING ...]
         [--survivors-against FILE ...] [--report-only]

Judges every mutant of the modules (default: MODULES, in that order) that the session has no verdict
for, until the budget is spent, then prints the table per module and the survivors not on the
reviewed list of equivalent mutants; the table is also written to DIR/table.md. Run it again with
the same --session to go on where it stopped. Exit status 0, 2 for bad usage (before any work).

With --survivors-against, the session's survivors not on the reviewed list are judged again, each
against the whole of the given test files (no map): on a GPU machine, the CUDA test files judge the
lines that only CUDA runs (docs/performance.md, section 20, has the runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MODULES = (
    "optimizers/norms.py", "optimizers/algorithms/adamw.py", "optimizers/algorithms/normuon.py",
    "optimizers/algorithms/muon.py", "optimizers/algorithms/base.py", "optimizers/algorithms/dion2.py",
    "optimizers/algorithms/stages.py", "optimizers/coefficients.py", "optimizers/matrix_view.py",
    "optimizers/orthogonalize.py", "optimizers/gram_newton_schulz.py", "optimizers/symmetric.py",
    "optimizers/plan.py", "optimizers/distributed.py",
    "oracles/coefficients.py", "oracles/conventions.py", "oracles/rounding.py", "oracles/normuon_reference.py",
    "oracles/muon_reference.py", "oracles/tensor_parallel.py", "oracles/dion2_reference.py",
    "oracles/adamw_reference.py", "oracles/spectral.py",
)
"""The modules judged by default, in order (each by its own judges; the oracles' judges include the
negative controls' tests, so a mutated oracle that lets a control pass is killed): every module of
optimizers/algorithms/ and oracles/ (a test holds that), the orthogonalizers, the matrix views, the plan and
the distributed layouts."""

NOT_MAPPED = ("tests/test_conformance.py",)
"""Test files the coverage map leaves out by default: the CI tier run through pytest, whose cases the
map already holds as the harness's own judges."""


AGAIN_TIMEOUT = 600.0
"""Seconds a survivor judged again may take by default: the whole of its test files (on a GPU, the CUDA
ones, with Triton compiling each kernel the mutant changes)."""


class Usage(Exception):
    pass


def default_map_tests() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                  if str(p.relative_to(ROOT)) not in NOT_MAPPED)


def changed_modules(rev: str) -> list[str]:
    """The MODULES that differ between `rev` and the working tree."""
    got = subprocess.run(["git", "-C", str(ROOT), "diff", "--name-only", rev, "--"], capture_output=True, text=True)
    if got.returncode != 0:
        raise Usage(f"--changed-since {rev!r}: {got.stderr.strip() or 'not a revision'}")
    changed = set(got.stdout.split())
    return [m for m in MODULES if m in changed]


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.mutation", description=__doc__.split("\n\n")[0])
    p.add_argument("--session", type=Path, required=True, help="session directory (made if missing; resumed)")
    p.add_argument("--modules", nargs="+", metavar="PATH", help="modules to mutate, paths from the repository root")
    p.add_argument("--changed-since", metavar="REV", help="mutate the default modules that differ from REV")
    p.add_argument("--budget-minutes", type=float, default=60.0, help="stop starting mutants after this (default 60)")
    p.add_argument("--jobs", type=int, default=1, help="mutants judged at once (default 1)")
    p.add_argument("--max-cases", type=int, default=40, help="single-process cases per mutant (default 40)")
    p.add_argument("--max-gloo", type=int, default=4, help="gloo cases per mutant of distributed code (default 4)")
    p.add_argument("--max-tests", type=int, default=40, help="unit tests per mutant (default 40)")
    p.add_argument("--timeout-base", type=float, metavar="S",
                   help="a mutant's time limit: S seconds plus 3 times its judges' measured cost (default: "
                        "session.Limits.timeout_base; a module of loops that mutants make endless, such as "
                        "norms.py, judges faster with less, where no judge compiles Triton kernels)")
    p.add_argument("--map-tests", nargs="*", metavar="FILE",
                   help="test files the coverage map runs (default: tests/test_*.py but NOT_MAPPED)")
    p.add_argument("--map-select", nargs="*", default=[], metavar="SUBSTRING",
                   help="map (and so judge with) only the CI cases whose id contains one of these (default: all)")
    p.add_argument("--survivors-against", nargs="+", metavar="FILE",
                   help="judge the session's survivors (not on the reviewed list) again against these whole test "
                        "files, each within --timeout-base seconds (default 600)")
    p.add_argument("--report-only", action="store_true", help="print the session's table; judge nothing")
    args = p.parse_args(argv)
    if args.modules and args.changed_since:
        raise Usage("give --modules or --changed-since, not both")
    modules = args.modules or (changed_modules(args.changed_since) if args.changed_since else list(MODULES))
    for m in modules:
        if not (m.startswith(("optimizers/", "oracles/")) and m.endswith(".py") and (ROOT / m).is_file()):
            raise Usage(f"--modules: {m!r} is not a module file under optimizers/ or oracles/")
    args.modules = list(dict.fromkeys(modules))
    for name in ("jobs", "max_cases", "max_gloo", "max_tests"):
        if getattr(args, name) < (1 if name == "jobs" else 0):
            raise Usage(f"--{name.replace('_', '-')} must be >= {1 if name == 'jobs' else 0}")
    if not args.budget_minutes > 0:
        raise Usage("--budget-minutes must be > 0")
    if args.timeout_base is not None and not args.timeout_base > 0:
        raise Usage("--timeout-base must be > 0")
    args.map_tests = default_map_tests() if args.map_tests is None else args.map_tests
    for option in ("map_tests", "survivors_against"):
        for f in getattr(args, option) or []:
            if not (ROOT / f).is_file():
                raise Usage(f"--{option.replace('_', '-')}: no test file {f!r}")
    if args.survivors_against and args.report_only:
        raise Usage("give --survivors-against or --report-only, not both")
    if args.session.exists() and not args.session.is_dir():
        raise Usage(f"--session {args.session}: not a directory")
    return args


def _stop(signum, frame) -> None:  # noqa: ARG001 (a signal handler's signature)
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
    except Usage as exc:
        print(f"python -m benchmarks.mutation: error: {exc}", file=sys.stderr)
        return 2
    from benchmarks.mutation import equivalent, table, workers
    from benchmarks.mutation.session import Limits, Session

    equivalents = equivalent.load()
    session = Session(args.session, ROOT)
    if not args.modules:
        (args.session / "table.md").write_text("no module to mutate\n")
        print("no module to mutate")
        return 0
    if not args.report_only:
        workers.one_thread()
        workers.preload()
        limits = Limits(args.max_cases, args.max_gloo, args.max_tests)
        timeout_base = args.timeout_base or (AGAIN_TIMEOUT if args.survivors_against else None)
        if timeout_base is not None:
            limits = dataclasses.replace(limits, timeout_base=timeout_base)
        signal.signal(signal.SIGTERM, _stop)
        try:
            if args.survivors_against:
                finished = session.rejudge(args.modules, args.survivors_against, set(equivalents),
                                           args.budget_minutes * 60, args.jobs, limits, sys.stderr)
            else:
                finished = session.run(args.modules, args.map_tests, args.map_select, args.budget_minutes * 60,
                                       args.jobs, limits, sys.stderr)
        except (ValueError, RuntimeError) as exc:  # a module changed since its mutants were made; a broken judge
            print(f"python -m benchmarks.mutation: error: {exc}", file=sys.stderr)
            return 2
        if not finished:
            print("budget spent: run the same command again to go on", file=sys.stderr)
    verdicts = list(session.verdicts().values())
    counts = {m: len(session.mutants(m, stored=args.report_only)) for m in args.modules}
    text = table.render(table.rows(counts, verdicts, equivalents))
    alive = table.survivors([v for v in verdicts if v.module in counts], equivalents)
    text += "\n\nSurvivors not on the reviewed list (benchmarks/mutation/equivalent.toml):\n" + "\n".join(
        f"- {v.module}:{v.line} `{v.before}` -> `{v.after}` ({v.by})" for v in alive)
    wrong = table.wrongly_listed(verdicts, equivalents)
    if wrong:
        text += "\n\nListed as equivalent but killed (fix the list):\n" + "\n".join(
            f"- {v.module}:{v.line} `{v.before}` -> `{v.after}` ({v.by})" for v in wrong)
    (args.session / "table.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
