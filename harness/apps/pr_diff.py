"""`python -m harness pr-diff`: the CI tier of a pull request's code against its base commit's.

    python -m harness pr-diff --base-ref REF [--target SPEC] [--pythonpath DIR] [--head-run DIR]
                              [--out DIR] [--select SUBSTRING ...]

SPEC names the code judged (default: this project's own optimizer), as `run --target` does; an
optimizer author's repository names its adapter, `--target my_pkg.targets:target`.

1. Before anything runs (else exit 2, one line): the working directory is inside a git
   repository, REF names a commit of it, SPEC is an alias or MODULE:CALLABLE, DIR (default: the
   repository's root) is a directory inside the repository, --head-run (when given) holds a stored
   run, --out is not a file, and the selection is not empty.
2. Head: `python -m harness run --tier ci [--target SPEC]` with the checkout's DIR first on
   PYTHONPATH and the checkout as working directory, into OUT/head-run; or the files of --head-run
   copied there (so that OUT, which may lie inside --head-run as in CI, is never inside a run read).
   A run of the pytest plugin (--muon-out) is such a stored run too. The runs an earlier pr-diff
   stored in OUT/head-run and OUT/base-run are removed first (a base's harness may predate
   `run --replace`).
3. Base: REF checked out in a temporary `git worktree`, where the same command runs with the
   worktree's DIR first on PYTHONPATH and the worktree as working directory, into OUT/base-run. A
   repository holding the harness itself (this project) runs REF's own harness there; any other
   runs the installed harness, the same one as the head's. The worktree is removed afterwards, also
   on failure or SIGTERM.
4. Each run must have judged its own checkout's code: the judged module's commit (run.json's
   `judged`) is HEAD for the head and REF's for the base, and for a run made here its file lies in
   that checkout. A run that imported the target from elsewhere (an installed copy, the other
   checkout, the harness's own optimizer for lack of --target) would compare something else, so it
   is an error. A run stored before schema version 6 names only the harness's commit, which must then
   be the checkout's.
5. `python -m harness diff OUT/base-run OUT/head-run --out OUT` (the same rules) writes diff.html
   and diff.md; diff.md is appended to $GITHUB_STEP_SUMMARY when set.

Exit status: the diff's (0 no regression, 1 regression, 2 runs not comparable), or 2 for a usage
error, a run that failed to run or stored nothing, or a run that judged other code (step 4).
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
from harness.targets import TargetError, target_module
from reports import CodeIdentity, load_run
from reports.run_folder import RUN_FILES

PROG = "python -m harness pr-diff"
TIER = "ci"


class PrDiffError(Exception):
    """A usage error, or a run that cannot be compared: one line, exit status 2."""


HELP = "run the CI tier of a base commit (in a git worktree) and of this checkout, and diff them"


def arguments(p: argparse.ArgumentParser) -> None:
    """Declare pr-diff's options on its subparser."""
    p.add_argument("--base-ref", required=True, metavar="REF", help="git ref of the base, e.g. origin/main")
    p.add_argument("--target", metavar="SPEC",
                   help="the code judged, alias or MODULE:CALLABLE returning a Target (default: ours)")
    p.add_argument("--pythonpath", default=Path("."), type=Path, metavar="DIR",
                   help="the repository's directory that holds the target's module, put first on PYTHONPATH "
                        "in each checkout (default: the repository's root; e.g. src)")
    p.add_argument("--head-run", type=Path, metavar="DIR",
                   help="a stored run of this checkout, by `run` or the pytest plugin (else run it)")
    p.add_argument("--out", default=Path("pr-diff-out"), type=Path,
                   help="directory for diff.html, diff.md and the two runs (default: pr-diff-out)")
    p.add_argument("--select", action="append", default=[], metavar="SUBSTRING",
                   help="keep cases whose id contains SUBSTRING (repeatable), in both runs")


def command(args: argparse.Namespace) -> int:
    """The `pr-diff` subcommand: exit status as in the module docstring."""
    try:
        with _sigterm_unwinds():
            return pr_diff(args.base_ref, args.head_run, args.out, args.select, args.target, args.pythonpath)
    except PrDiffError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


def pr_diff(base_ref: str, head_run: Path | None, out: Path, patterns: list[str], target: str | None = None,
            pythonpath: Path = Path(".")) -> int:
    """Steps 1-5 of the module docstring, from the repository holding the working directory.
    Raises PrDiffError on a usage error, a failed run or a run of other code."""
    top = Path(_git(["rev-parse", "--show-toplevel"], Path.cwd(), "not inside a git repository"))
    base_sha = _git(["rev-parse", "--verify", "--quiet", f"{base_ref}^{{commit}}"], top,
                    f"--base-ref {base_ref!r} names no commit of {top}")
    head_sha = _git(["rev-parse", "--verify", "--quiet", "HEAD^{commit}"], top, f"{top} has no commit checked out")
    if target is not None:
        try:
            target_module(target)
        except TargetError as exc:
            raise PrDiffError(f"--target: {exc}") from None
    if pythonpath.is_absolute() or ".." in pythonpath.parts or not (top / pythonpath).is_dir():
        raise PrDiffError(f"--pythonpath {pythonpath}: not a directory of the repository, relative to its root")
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
    options = [*(["--target", target] if target is not None else []), *(a for p in patterns for a in ("--select", p))]
    head, base_run = out / "head-run", out / "base-run"
    for earlier in (head, base_run):
        _remove_stored_run(earlier)
    if head_run is None:
        _harness_run(top, pythonpath, head, options, "head")
        _judged_here(head, "head", head_sha, top)
    else:
        _copy_files(head_run, head)
        _judged_here(head, "--head-run", head_sha, None)
    with _worktree(top, base_sha) as tree:
        which = f"base {base_ref} ({base_sha[:12]})"
        _harness_run(tree, pythonpath, base_run, options, which)
        _judged_here(base_run, which, base_sha, tree)
    # the `diff` subcommand itself, so its rules are the ones applied
    status = subprocess.run([sys.executable, "-m", "harness", "diff", str(base_run), str(head), "--out", str(out)]
                            ).returncode
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary and (out / "diff.md").is_file():
        with open(summary, "a") as handle:
            handle.write((out / "diff.md").read_text() + "\n")
    return status


def _judged_here(run: Path, which: str, sha: str, checkout: Path | None) -> None:
    """PrDiffError unless the stored run `run` judged code at commit `sha` (and, given `checkout`, from a
    file inside it); a run stored before schema version 6 is held to its harness's commit instead."""
    context = load_run(run)[1]
    judged = CodeIdentity.from_context(context.get("judged"))
    if not judged.module:
        ran = context.get("commit", "")
        if ran and not sha.startswith(ran):
            raise PrDiffError(f"the {which} run records commit {ran}, not {sha[:12]}: another checkout's harness ran")
        return
    inside = checkout is None or Path(checkout).resolve() in Path(judged.file).resolve().parents
    if judged.commit != sha or not inside:
        raise PrDiffError(f"the {which} run judged {judged.module} from {judged.file} ({judged.describe()}), not "
                          f"the code of commit {sha[:12]}; name your adapter with --target MODULE:CALLABLE, and "
                          f"--pythonpath the directory holding its package")


def _git(args: list[str], cwd: Path, failure: str) -> str:
    """stdout of `git ARGS` in `cwd`; PrDiffError(`failure`) if git is missing or fails."""
    try:
        result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise PrDiffError(f"{failure} (git: {exc})") from None
    if result.returncode != 0:
        raise PrDiffError(failure)
    return result.stdout.strip()


def _harness_run(checkout: Path, pythonpath: Path, out: Path, options: list[str], which: str) -> None:
    """`python -m harness run --tier ci OPTIONS` in `checkout`, with its `pythonpath` first on PYTHONPATH,
    into `out`; exit 0 or 1 (checks failed) is a run, anything else is PrDiffError."""
    command = [sys.executable, "-m", "harness", "run", "--tier", TIER, "--out", str(out), *options]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(checkout / pythonpath), os.environ.get("PYTHONPATH")]))
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
