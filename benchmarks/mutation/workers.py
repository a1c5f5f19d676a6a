"""Where mutants run: scratch copies of the project and forked judge processes.

The worktree is never mutated. Each worker owns a scratch copy of the project's files (those git
tracks or would track); a mutant is written into that copy, judged in a child forked from the
driver (which has imported torch and the other third-party libraries once, and none of the
project's modules), and the original file is put back. The child puts the copy first on its path
and in PYTHONPATH, so the gloo ranks and test subprocesses it starts import the mutant too.
A child runs in a process group of its own: past its deadline the whole group is killed.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

PRELOADED = ("torch", "numpy", "scipy.linalg", "pandas", "pyarrow", "pytest", "hypothesis", "coverage")
"""Third-party modules the driver imports once, so that each forked judge starts without their cost."""


ONE_THREAD = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""The BLAS and OpenMP thread pools held to one thread in every judge, as `torch.set_num_threads(1)` holds
torch's: with --jobs 2 on two cores, each forked judge kept an OpenBLAS worker besides its own thread, and
Gram-path tests that take 3 s alone took 30 to 50 s."""


def one_thread() -> None:
    """Set ONE_THREAD (where the caller has not set them) for this process and the judges it forks. The pools
    are sized when numpy and torch load: RuntimeError if either is imported already."""
    if "numpy" in sys.modules or "torch" in sys.modules:
        raise RuntimeError("one_thread() must run before numpy or torch is imported: their thread pools are sized then")
    for var in ONE_THREAD:
        os.environ.setdefault(var, "1")


def preload() -> None:
    for name in PRELOADED:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def project_files(root: Path) -> list[str]:
    """The files git tracks in `root`, and the untracked ones it does not ignore."""
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "-co", "--exclude-standard"],
                         check=True, capture_output=True).stdout.decode()
    return [f for f in out.split("\0") if f and (root / f).is_file()]


class Scratch:
    """A copy of the project at `path` into which one mutant at a time is written."""

    def __init__(self, root: Path, path: Path) -> None:
        self.root, self.path = root, path
        if path.exists():
            shutil.rmtree(path)
        for f in project_files(root):
            (path / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / f, path / f)

    def write(self, module: str, source: str) -> None:
        """Put `source` in place of `module`, with a modification time that names its content: a
        compiled copy of another source of the same size is never taken for it."""
        target = self.path / module
        target.write_text(source)
        stamp = 1_000_000_000 + int(hashlib.sha256(source.encode()).hexdigest()[:7], 16)
        os.utime(target, (stamp, stamp))

    def restore(self, module: str) -> None:
        shutil.copy2(self.root / module, self.path / module)


@dataclass
class Child:
    """A forked judge: its pid, when it must be done by, and what it was started for."""

    pid: int
    started: float
    deadline: float
    tag: object


def fork(scratch: Path, log: Path, timeout: float, body: Callable[[], int], tag: object) -> Child:
    """Run `body` in a child forked from this process, with `scratch` first on its path, its output
    in `log`; it must finish within `timeout` seconds (see `reap`)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 3
        try:
            os.setpgid(0, 0)
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.chdir(scratch)
            sys.path.insert(0, str(scratch))
            os.environ["PYTHONPATH"] = os.pathsep.join([str(scratch), os.environ.get("PYTHONPATH", "")])
            importlib.invalidate_caches()
            code = body()
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    try:
        os.setpgid(pid, pid)  # also here: the group exists before any kill, whichever runs first
    except (PermissionError, ProcessLookupError):
        pass  # the child has set it already (and may have exec'd or ended)
    now = time.monotonic()
    return Child(pid, now, now + timeout, tag)


def reap(children: list[Child], poll: float = 0.2) -> tuple[Child, str]:
    """Wait for one of `children` to end; kill (with its process group) one past its deadline.
    Returns it with "exit N", "signal N" or "timeout"."""
    while True:
        for child in children:
            pid, status = os.waitpid(child.pid, os.WNOHANG)
            if pid:
                _kill_group(child.pid)  # what it left running (ranks, subprocesses)
                how = f"exit {os.WEXITSTATUS(status)}" if os.WIFEXITED(status) else f"signal {os.WTERMSIG(status)}"
                return child, how
            if time.monotonic() > child.deadline:
                _kill_group(child.pid)
                os.waitpid(child.pid, 0)
                return child, "timeout"
        time.sleep(poll)


def kill(child: Child) -> None:
    """End `child` and its process group now."""
    _kill_group(child.pid)
    try:
        os.waitpid(child.pid, 0)
    except ChildProcessError:
        pass


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
