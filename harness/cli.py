"""The command line: `python -m harness run | diff | trend`.

  run    judge a target over a tier of cases; write results.csv, results.parquet,
         run.json, report.html, summary.md (and diff.html, diff.md with --baseline)
  diff   compare two stored runs (a PR against its base, tonight against last night)
  trend  error/tolerance ratio per check over several stored runs
  pr-diff  the CI tier of a base commit (run in a git worktree) against this checkout's

Exit status: 0 success; 1 a check failed or errored, nothing at all was checked, or
(diff, --baseline) the head regressed; 2 bad usage (unknown option, target or backend,
empty selection, a directory that holds no run), reported in one line.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
import time
from pathlib import Path

import torch

from cases import TIERS
from harness import pr_diff
from harness.backends import get as get_backend
from harness.pool import TorchrunRanks, under_torchrun
from harness.runner import BACKENDS, run
from harness.details import worst_details
from harness.selection import select
from harness.targets import DEFAULT, TargetError, load_target
from reports import (RunInfo, diff_runs, load_run, render_diff_html, render_diff_markdown, render_html,
                     render_markdown, render_trend_html, save_run, status_counts, write_csv)
from reports.pictures import case_pictures
from reports.store import project_commit


class UsageError(Exception):
    """Bad command-line input: reported in one line, exit status 2."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness", description="Muon-family conformance harness")
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="judge a target over a tier of cases")
    r.add_argument("--tier", default="ci", choices=TIERS, help="case tier (default: ci)")
    r.add_argument("--backend", default="cpu", help=f"comma-separated backends, of {', '.join(BACKENDS)}")
    r.add_argument("--target", default=DEFAULT, help="alias or MODULE:CALLABLE returning a Target (default: ours)")
    r.add_argument("--select", action="append", default=[], metavar="SUBSTRING",
                   help="keep cases whose id contains SUBSTRING (repeatable); a full case id runs that case")
    r.add_argument("--out", default="out", type=Path, help="directory for results.csv, report.html, summary.md")
    r.add_argument("--baseline", type=Path, metavar="DIR", help="a stored run to diff this run against")
    r.add_argument("--quiet", action="store_true", help="no progress output")
    d = sub.add_parser("diff", help="compare two stored runs")
    d.add_argument("base", type=Path, help="directory of the base run")
    d.add_argument("head", type=Path, help="directory of the head run")
    d.add_argument("--out", default="out/diff", type=Path, help="directory for diff.html and diff.md")
    d.add_argument("--growth", default=2.0, type=float, help="error growth factor that counts (default 2)")
    t = sub.add_parser("trend", help="ratio per check over several stored runs")
    t.add_argument("runs", nargs="+", type=Path, help="directories of stored runs")
    t.add_argument("--out", default="out/trend", type=Path, help="directory for trend.html")
    pr_diff.arguments(sub.add_parser("pr-diff", help=pr_diff.HELP))
    return parser


def _load(run_dir: Path) -> tuple[list, dict]:
    try:
        return load_run(run_dir)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _write_diff(base_dir: Path, head: tuple[list, dict], out: Path, growth: float) -> bool:
    """Write out/diff.html and out/diff.md; True if the head regressed."""
    base_records, base_ctx = _load(base_dir)
    head_records, head_ctx = head
    if growth < 1.0:
        raise UsageError(f"--growth must be >= 1, got {growth}")
    diff = diff_runs(base_records, head_records, growth=growth)
    out.mkdir(parents=True, exist_ok=True)
    (out / "diff.html").write_text(render_diff_html(diff, base_ctx, head_ctx))
    (out / "diff.md").write_text(render_diff_markdown(diff, base_ctx, head_ctx))
    verdict = "REGRESSED" if diff.regressed else "no regression"
    print(f"diff against {base_dir}: {verdict} ({', '.join(f'{len(v)} {k}' for k, v in diff.categories().items() if v)}); "
          f"{out}/diff.html", file=sys.stderr)
    return diff.regressed


def _backends(text: str) -> list[str]:
    names = [b.strip() for b in text.split(",") if b.strip()]
    unknown = [b for b in names if b not in BACKENDS]
    if not names or unknown:
        raise UsageError(f"unknown backend(s) {unknown or text!r}; available: {', '.join(BACKENDS)}")
    return names


def _torchrun_ranks(names: list[str]) -> TorchrunRanks | None:
    """Under torchrun: this world's ranks, for the one distributed backend named; None otherwise."""
    if not under_torchrun():
        return None
    distributed = [n for n in names if get_backend(n).distributed]
    if len(distributed) != 1:
        raise UsageError(f"under torchrun name exactly one distributed backend (gloo or nccl); got {','.join(names)}")
    return TorchrunRanks(distributed[0])


def cmd_run(args: argparse.Namespace) -> int:
    backends = _backends(args.backend)
    try:
        target = load_target(args.target)
    except TargetError as exc:
        raise UsageError(str(exc)) from None
    cases = select(args.tier, args.select)
    if not cases:
        raise UsageError(f"no case of tier {args.tier!r} matches --select {args.select}")
    ranks = _torchrun_ranks(backends)
    driver = ranks is None or ranks.is_driver
    if driver:
        args.out.mkdir(parents=True, exist_ok=True)
    progress = None if args.quiet or not driver else sys.stderr
    started = datetime.datetime.now(datetime.timezone.utc)
    t0 = time.perf_counter()
    if progress:
        print(f"judging {target.name} ({target.version()}) on {len(cases)} {args.tier} cases, "
              f"backends {','.join(backends)}", file=progress)
    records = []
    for backend in backends:
        if progress:
            print(f"backend {backend}:", file=progress)
        records += run(cases, target, args.target, backend, progress, ranks)
    if ranks is not None:
        ranks.close()
        if not driver:
            return 0
    info = RunInfo(target=f"{target.name} [{args.target}] {target.version()}", tier=args.tier,
                   backends=",".join(backends), command=shlex.join(["python", "-m", "harness", *sys.argv[1:]]),
                   started=started.isoformat(timespec="seconds"), seconds=time.perf_counter() - t0,
                   torch_version=torch.__version__, commit=project_commit())
    write_csv(records, args.out / "results.csv")
    save_run(records, info, args.out)
    pictures = {(d.case_id, d.check): case_pictures(d.where, d.error, d.sv_judged, d.sv_reference)
                for d in worst_details(records, target)}
    (args.out / "report.html").write_text(render_html(records, info, pictures))
    (args.out / "summary.md").write_text(render_markdown(records, info))
    counts = status_counts(records)
    checked = counts["pass"] + counts["fail"] + counts["error"]
    print(f"{len(records)} checks: " + ", ".join(f"{counts[s]} {s}" for s in counts)
          + f" ({time.perf_counter() - t0:.1f}s); reports in {args.out}/", file=sys.stderr)
    regressed = args.baseline is not None and _write_diff(args.baseline, load_run(args.out), args.out, 2.0)
    if checked == 0:
        print("nothing was checked: every case is unsupported or skipped", file=sys.stderr)
        return 1
    return 1 if counts["fail"] or counts["error"] or regressed else 0


def cmd_diff(args: argparse.Namespace) -> int:
    return 1 if _write_diff(args.base, _load(args.head), args.out, args.growth) else 0


def cmd_trend(args: argparse.Namespace) -> int:
    runs = [_load(d) for d in args.runs]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "trend.html").write_text(render_trend_html([(ctx, records) for records, ctx in runs]))
    print(f"trend over {len(runs)} runs: {args.out}/trend.html", file=sys.stderr)
    return 0


COMMANDS = {"run": cmd_run, "diff": cmd_diff, "trend": cmd_trend, "pr-diff": pr_diff.command}


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UsageError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
