"""What every spawned helper process of the harness shares (the rank pool's ranks, the case workers):
it dies with the harness, writes its output and its stacks to a log, leaves SIGINT and SIGTERM to
the harness, and talks to the parent over a pipe in plain pickles; and the parent's reading of that
log when the process died or hung.

Dying with the parent: Linux's parent-death signal (prctl PR_SET_PDEATHSIG, SIGKILL; it fires when
the *thread* that spawned the process ends, so helpers belong to long-lived threads, as the harness's
main thread) and, elsewhere too, a watchdog thread that exits once the process is re-parented.

Stop signals: SIGINT (Ctrl-C) and SIGTERM (`timeout`, a CI cancel) reach the whole process group;
a helper ignores them, so that only the harness decides: it writes what finished and kills its
helpers (harness.runner.Stop), instead of a helper dying mid-case and being recorded as a fault.
"""

from __future__ import annotations

import ctypes
import faulthandler
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

WATCHDOG_SECONDS = 0.5
"""How often a helper's watchdog thread checks that its parent is still there."""
LOG_TAIL_LINES = 60
"""Lines of a failed helper's log quoted in its failure (a hung one's stack dump comes whole)."""
STACKS_SECONDS = 0.5
"""How long a hung helper gets to write its stacks (faulthandler, on SIGUSR1) before they are read."""
_PR_SET_PDEATHSIG = 1
"""prctl option: the signal the kernel sends this process when its parent thread exits (<linux/prctl.h>)."""


def send(conn: multiprocessing.connection.Connection, obj: Any) -> None:
    conn.send_bytes(pickle.dumps(obj))


def recv(conn: multiprocessing.connection.Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


def become_helper(parent: int, log_path: str) -> None:
    """Set up a spawned helper of `parent`: it dies with its parent, ignores SIGINT and SIGTERM (the
    parent's to handle), and writes its stdout and stderr to `log_path` (see `log_to`)."""
    die_with_parent(parent)
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    log_to(log_path)


def die_with_parent(parent: int) -> None:
    """End this process when `parent` (the harness) goes: SIGKILL from the kernel on Linux, and a
    watchdog thread that exits once the process is re-parented (any platform, and the case where
    the parent died before prctl took effect)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    watch_parent(parent)


def watch_parent(parent: int) -> None:
    """Exit this process (status 1) from a daemon thread as soon as its parent is no longer `parent`."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCHDOG_SECONDS)
        os._exit(1)

    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def log_to(log_path: str) -> None:
    """Send this process's stdout and stderr (file descriptors 1 and 2) to `log_path`, line-buffered,
    with faulthandler writing there on a fatal signal and, on SIGUSR1, every thread's stack."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)


def log_tail(path: Path, start: int = 0) -> str:
    """The last LOG_TAIL_LINES lines a helper wrote to its log at `path` from byte `start` on."""
    if not path.exists():
        return "(no log: the process died before it started)"
    with open(path, "rb") as log:
        log.seek(start)
        lines = log.read().decode(errors="replace").splitlines()
    cut = f"(... {len(lines) - LOG_TAIL_LINES} earlier lines)\n" if len(lines) > LOG_TAIL_LINES else ""
    return cut + ("\n".join(lines[-LOG_TAIL_LINES:]) or "(no output)")


def how_it_ended(exitcode: int | None) -> str:
    """`exitcode` of a dead process in words: "with signal SIGSEGV (exit code -11)" or "(exit code 3)"."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"with signal {signal.Signals(-exitcode).name} (exit code {exitcode})"
        except ValueError:
            pass
    return f"(exit code {exitcode})"


def stacks(proc: multiprocessing.process.BaseProcess, path: Path, start: int = 0) -> str:
    """What a helper that does not answer wrote to its log at `path` since byte `start` (its tail),
    then the stacks of its threads: faulthandler's dump on SIGUSR1, given STACKS_SECONDS."""
    before = log_tail(path, start)
    end = path.stat().st_size if path.exists() else 0
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(STACKS_SECONDS)
    if not path.exists():
        return before
    with open(path, "rb") as log:
        log.seek(end)
        dump = log.read().decode(errors="replace")
    return f"{before}\n{dump.rstrip()}" if dump else before


def log_size(path: Path) -> int:
    """Bytes in the log at `path` so far (0 before the helper opened it)."""
    return path.stat().st_size if path.exists() else 0
