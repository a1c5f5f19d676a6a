"""`python -m harness pr-diff`: a pull request's CI tier against its base commit's.

    python -m harness pr-diff --base-ref REF [--head-run DIR] [--out DIR] [--select SUBSTRING ...]

1. Before anything runs (else exit 2, one line): the working directory is inside a git
   repository, REF names a commit of it, --head-run (when given) holds a stored run,
   --out is not a file, and the selection is not empty.
2. Head: this checkout's CI tier run into OUT/head-run, or the files of --head-run copied
   there (so that OUT, which may lie inside --head-run as in CI, is never inside a run read).
   The runs an earlier pr-diff stored in OUT/head-run and OUT/base-run are removed first (a
   base's harness may predate `run --replace`).
3. Base: REF checked out in a temporary `git worktree`, where that commit's own harness runs
   its CI tier (`python -m harness run --tier ci`, cwd and PYTHONPATH = the worktree, this
   interpreter) into OUT/base-run; the run must record REF's commit, so the base's code is
   what ran. The worktree is removed afterwards, also on failure or SIGTERM.
4. `python -m harness diff OUT/base-run OUT/head-run --out OUT` (the same rules)
   writes diff.html and diff.md; diff.md is appended to $GITHUB_STEP_SUMMARY when set.

Exit status: the diff's (0 no regression, 1 regression, 2 runs not comparable), or 2 for a
usage error or a base run that stored no run of the base's code.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from harness.running.selection import select
from reports import load_run
from reports.run_folder import RUN_FILES

PROG = "python -m harness pr-diff"
TIER = "ci"


class PrDiffError(Exception):
    """A usage error or a base run that cannot be compared: one line, exit status 2."""


HELP = "run the CI tier of a base commit (in a git worktree) and of this checkout, and diff them"


def arguments(p: argparse.ArgumentParser) -> None:
    """Declare pr-diff's options on its subparser."""
    p.add_argument("--base-ref", required=True, metavar="REF", help="git ref of the base, e.g. origin/main")
    p.add_argument("--head-run", type=Path, metavar="DIR", help="a stored run of this checkout (else run it)")
    p.add_argument("--out", default=Path("pr-diff-out"), type=Path,
                   help="directory for diff.html, diff.md and the two runs (default: pr-diff-out)")
    p.add_argument("--select", action="append", default=[], metavar="SUBSTRING",
                   help="keep cases whose id contains SUBSTRING (repeatable), in both runs")


def command(args: argparse.Namespace) -> int:
    """The `pr-diff` subcommand: exit status as in the module docstring."""
    try:
        with _sigterm_unwinds():
            return pr_diff(args.base_ref, args.head_run, args.out, args.select)
    except PrDiffError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


def pr_diff(base_ref: str, head_run: Path | None, out: Path, patterns: list[str]) -> int:
    """Steps 1-4 of the module docstring, from the repository holding the working directory.
    Raises PrDiffError on a usage error or an unusable base run."""
    top = Path(_git(["rev-parse", "--show-toplevel"], Path.cwd(), "not inside a git repository"))
    base_sha = _git(["rev-parse", "--verify", "--quiet", f"{base_ref}^{{commit}}"], top,
                    f"--base-ref {base_ref!r} names no commit of {top}")
    if head_run is not None:
        try:
            load_run(head_run)
        except ValueError as exc:
            raise PrDiffError(f"--head-run: {exc}") from None
    if out.exists() and not out.is_dir():
        raise PrDiffError(f"--out {out}: exists and is not a directory")
    if not select(TIER, patterns):
        raise PrDiffError(f"--select {patterns}: no case of tier {TIER!r} matches")
    out = out.resolve()
    selection = [arg for p in patterns for arg in ("--select", p)]
    head, base_run = out / "head-run", out / "base-run"
    for earlier in (head, base_run):
        _remove_stored_run(earlier)
    if head_run is None:
        _harness_run(top, head, selection, "head")
    else:
        _copy_files(head_run, head)
    with _worktree(top, base_sha) as tree:
        _harness_run(tree, base_run, selection, f"base {base_ref} ({base_sha[:12]})")
    ran = load_run(base_run)[1].get("commit", "")
    if ran and not base_sha.startswith(ran):
        raise PrDiffError(f"the base run records commit {ran}, not {base_ref} ({base_sha[:12]}): "
                          f"another checkout's harness ran")
    # the `diff` subcommand itself, so its rules are the ones applied
    status = subprocess.run([sys.executable, "-m", "harness", "diff", str(base_run), str(head), "--out", str(out)]
                            ).returncode
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary and (out / "diff.md").is_file():
        with open(summary, "a") as handle:
            handle.write((out / "diff.md").read_text() + "\n")
    return status


def _git(args: list[str], cwd: Path, failure: str) -> str:
    """stdout of `git ARGS` in `cwd`; PrDiffError(`failure`) if git is missing or fails."""
    try:
        result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise PrDiffError(f"{failure} (git: {exc})") from None
    if result.returncode != 0:
        raise PrDiffError(failure)
    return result.stdout.strip()


def _harness_run(checkout: Path, out: Path, selection: list[str], which: str) -> None:
    """`python -m harness run --tier ci` of `checkout`'s own code into `out`; exit 0 or 1 (checks
    failed) is a run, anything else is PrDiffError."""
    command = [sys.executable, "-m", "harness", "run", "--tier", TIER, "--out", str(out), *selection]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")]))
    print(f"pr-diff: {which}: {' '.join(command[1:])} (in {checkout})", file=sys.stderr, flush=True)
    status = subprocess.run(command, cwd=checkout, env=env).returncode
    if status not in (0, 1):
        raise PrDiffError(f"the {which} run exited with status {status}, so there is nothing to compare")
    try:
        load_run(out)
    except ValueError as exc:
        raise PrDiffError(f"the {which} run stored no run: {exc}") from None


def _remove_stored_run(folder: Path) -> None:
    """Remove `folder` when it holds a stored run and nothing else (an earlier pr-diff's)."""
    if folder.is_dir() and all(p.name in RUN_FILES and p.is_file() for p in folder.iterdir()):
        shutil.rmtree(folder)


def _copy_files(run: Path, to: Path) -> None:
    """The files of stored run `run` (not its subdirectories, where OUT may lie) into `to`."""
    if run.resolve() == to:
        return
    to.mkdir(parents=True, exist_ok=True)
    for path in run.iterdir():
        if path.is_file():
            shutil.copy2(path, to / path.name)


@contextlib.contextmanager
def _worktree(top: Path, sha: str) -> Iterator[Path]:
    """A detached worktree of `sha` in a temporary directory; on exit removed, its directory deleted
    and git's record pruned. SIGINT and SIGTERM wait while git creates it: a `git worktree add`
    killed halfway leaves a locked, half-made worktree that git would neither remove nor prune."""
    tmp = Path(tempfile.mkdtemp(prefix="pr-diff-base-"))
    tree = tmp / "base"
    try:
        deferred = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            _git(["worktree", "add", "--detach", str(tree), sha], top, f"cannot create a worktree of {sha} in {tree}")
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, deferred)
        yield tree
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", "--force", str(tree)], cwd=top, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=top, capture_output=True)


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """SIGTERM (a cancelled CI job) raises SystemExit, so that the running child is killed and the
    worktree removed on the way out; the previous handler comes back afterwards."""
    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
