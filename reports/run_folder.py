"""The folder a run is stored in: checked and locked before the run, written whole beside it, and put
in place by one rename.

A run is written into a staging folder beside its target, `.NAME.new`, then renamed onto the target.
A stored run already there is first renamed aside, `.NAME.old`, and removed only once the new one is
in place. A kill -9, a full disk or a failed write at any moment thus leaves the old run whole: at the
target, or (killed between the two renames) aside, where the next claim of the folder puts it back.
While a process holds the claim, an exclusive `flock` on `.NAME.lock` beside the target refuses every
other writer; the kernel drops the lock with the process, however it ends.

`check` refuses, before anything is written, what can be known in advance: the filesystem root or a
mount point, a path that is a file or lies under one, a folder that cannot be written, a non-empty
folder that holds no stored run, a stored run unless `replace` (and then one holding files that no
run writes, or files that cannot be written), less free space or a smaller file-size limit
(`ulimit -f`) than the run's conservative size estimate. `claim` checks, takes the lock, puts back
or removes what an interrupted write left, and checks again under the lock. A failed write is one
`StoreError` line, and the target is as it was.
"""

from __future__ import annotations

import fcntl
import os
import resource
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PARQUET = "results.parquet"
"""The canonical results file of a stored run (reports/store.py holds the format)."""
CSV = "results.csv"
CONTEXT = "run.json"
REPORT_FILES = ("report.html", "summary.md", "diff.html", "diff.md")
"""The reports written beside a stored run (harness/apps/outputs.py; diff.* by `run --baseline`)."""
RUN_FILES = frozenset({PARQUET, CSV, CONTEXT, *REPORT_FILES})
"""Every file a run's folder may hold."""


class StoreError(ValueError):
    """A stored run that cannot be read or vouched for, or a run folder that cannot be claimed or
    written: the message is one line naming the path and what is wrong."""


BYTES_PER_CASE = 64 * 1024
"""A conservative size of one judged case (on one backend) in a stored run with its reports: measured,
7.1 KB a case (`python -m harness run --out DIR` over the 532 cases of the CI tier: 3,782,201 bytes
in all, du -sb) and 7.7 KB with 154 failing checks and their pictures (--target
harness.apps.selftest_catalog:lr_rms_min: 4,114,697 bytes); this allows some 8 times that."""
MIN_BYTES = 4 * 1024 * 1024
"""The least free space and file-size limit a run is given, however few its cases (a CI-tier run's
largest file, report.html, is 2.5 MB)."""


def estimated_bytes(cases: int) -> int:
    """A conservative size of a stored run of `cases` cases with its reports: `BYTES_PER_CASE` each,
    at least `MIN_BYTES`."""
    return max(MIN_BYTES, cases * BYTES_PER_CASE)


def _sibling(path: Path, suffix: str) -> Path:
    return path.parent / f".{path.name}.{suffix}"


def left_aside(path: Path) -> Path | None:
    """The previous run that a write killed between its two renames left beside `path`, if any."""
    aside = _sibling(Path(path), "old")
    return aside if Path(path).name and aside.is_dir() else None


class RunFolder:
    """A run folder claimed by this process (see the module doc): `path`, the resolved target,
    locked until `release`; `staged` writes a run and publishes it."""

    def __init__(self, path: Path, replace: bool, lock: int) -> None:
        self.path, self.replace, self._lock = path, replace, lock

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        """Drop the lock (its file is removed first, while still held)."""
        if self._lock < 0:
            return
        try:
            os.unlink(_sibling(self.path, "lock"))
        except OSError:
            pass
        os.close(self._lock)
        self._lock = -1

    @contextmanager
    def staged(self) -> Iterator[Path]:
        """A fresh folder beside the target to write the run into. On a normal exit its files are
        synced and it takes the target's place (an old run there moved aside first, removed after);
        on an exception it is removed and the target is untouched. An OSError, in the writes or the
        renames, becomes a `StoreError`."""
        if self._lock < 0:
            raise RuntimeError(f"{self.path}: the claim was released; claim the folder again")
        staging = _sibling(self.path, "new")
        try:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            yield staging
            _sync(staging)
            self._publish(staging)
        except OSError as exc:
            raise StoreError(f"{self.path}: the run could not be stored ({_why(exc)}); the folder is as it "
                             f"was") from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _publish(self, staging: Path) -> None:
        target, aside = self.path, _sibling(self.path, "old")
        if target.is_dir() and any(target.iterdir()):
            if not self.replace:
                raise StoreError(f"{target}: a stored run appeared there during the run; the new run is not "
                                 f"stored (--replace replaces it)")
            os.rename(target, aside)
            try:
                os.rename(staging, target)
            except OSError:
                os.rename(aside, target)
                raise
            _sync_dir(target.parent)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.rename(staging, target)  # onto an empty folder, too: rename(2) replaces it
            _sync_dir(target.parent)


def check(path: Path, *, replace: bool, expected_bytes: int = MIN_BYTES) -> Path:
    """The resolved target, after every check that needs no write (see the module doc); StoreError
    naming what is wrong otherwise. Writes nothing."""
    given, target = Path(path), Path(os.path.abspath(path)).resolve()
    if target.parent == target:
        raise StoreError(f"{given}: the filesystem root cannot hold a run; name a folder for it")
    if target.exists() and not target.is_dir():
        raise StoreError(f"{given}: exists and is not a directory")
    if target.is_dir() and os.path.ismount(target):
        raise StoreError(f"{given}: a mount point cannot be replaced by a rename; name a folder inside it")
    ancestor = target.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise StoreError(f"{given}: cannot write there ({ancestor} is not a directory)")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise StoreError(f"{given}: cannot write there ({ancestor} is read-only)")
    current = target if target.is_dir() else _sibling(target, "old") if _sibling(target, "old").is_dir() else None
    if current is not None:
        _check_contents(given, current, replace)
    _check_space(given, ancestor, expected_bytes)
    return target


def _check_contents(given: Path, folder: Path, replace: bool) -> None:
    """What an existing target (or the old run an interrupted write left aside) allows."""
    if not os.access(folder, os.W_OK | os.X_OK):
        raise StoreError(f"{given}: cannot write there ({folder} is read-only)")
    entries = sorted(folder.iterdir())
    if not entries:
        return
    names = {e.name for e in entries}
    if not names & {PARQUET, CSV, CONTEXT}:
        raise StoreError(f"{given}: holds {len(entries)} entries and no stored run; choose an empty or new "
                         f"folder (a run never writes into one that holds other files)")
    if not replace:
        raise StoreError(f"{given}: holds a stored run; --replace replaces it (the new run is written beside "
                         f"it and takes its place only when complete), or choose another folder")
    foreign = [e.name for e in entries if e.name not in RUN_FILES or e.is_symlink() or not e.is_file()]
    if foreign:
        raise StoreError(f"{given}: the stored run there sits with entries no run writes ({_names(foreign)}); "
                         f"move them away before replacing it")
    locked = [e.name for e in entries if not os.access(e, os.W_OK)]
    if locked:
        raise StoreError(f"{given}: cannot write there ({_names(locked)} read-only); make them writable before "
                         f"replacing the run")


def _names(names: list[str]) -> str:
    return ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")


def _check_space(given: Path, ancestor: Path, expected: int) -> None:
    free = shutil.disk_usage(ancestor).free
    if free < expected:
        raise StoreError(f"{given}: {_mib(free)} free on its filesystem, and a run of this size may need "
                         f"{_mib(expected)}; free some space or choose another folder")
    limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if limit != resource.RLIM_INFINITY and limit < expected:
        raise StoreError(f"{given}: files are limited to {_mib(limit)} (ulimit -f), and a run of this size may "
                         f"need {_mib(expected)}; raise the limit")


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def claim(path: Path, *, replace: bool, expected_bytes: int = MIN_BYTES) -> RunFolder:
    """`path` checked (`check`), locked, what an interrupted write left put back or removed, and checked
    again under the lock; StoreError if any of it fails, or another process holds the folder."""
    given = Path(path)
    target = check(given, replace=replace, expected_bytes=expected_bytes)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = _lock(target, given)
        try:
            _recover(target)
            check(given, replace=replace, expected_bytes=expected_bytes)
        except BaseException:
            RunFolder(target, replace, lock).release()
            raise
    except OSError as exc:
        raise StoreError(f"{given}: cannot write there ({_why(exc)})") from None
    return RunFolder(target, replace, lock)


def _lock(target: Path, given: Path) -> int:
    """An exclusive flock on the lock file beside `target`, holding this process's id; StoreError
    naming the holder when another process has it."""
    path = _sibling(target, "lock")
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreError(f"{given}: another run (process {holder}) is writing there; wait for it to "
                             f"finish or choose another folder") from None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:  # its holder removed it on release, after we opened it
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)


def _recover(target: Path) -> None:
    """Under the lock: remove a staging folder a killed writer left; put back the old run a writer
    killed between its two renames left aside, or remove it if the new run took its place."""
    shutil.rmtree(_sibling(target, "new"), ignore_errors=True)
    aside = _sibling(target, "old")
    if aside.is_dir():
        if target.exists():
            shutil.rmtree(aside)
        else:
            os.rename(aside, target)


def _sync(folder: Path) -> None:
    """Flush every file of `folder`, then the folder, to the disk (a rename publishes only what is there)."""
    for entry in folder.iterdir():
        fd = os.open(entry, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    _sync_dir(folder)


def _sync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _why(exc: OSError) -> str:
    where = f": {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


def write_file(path: Path, text: str) -> None:
    """Write `path` whole or not at all: into a temporary file beside it, synced, then renamed onto it."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.new")
    try:
        with open(temporary, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise StoreError(f"{path}: could not be written ({_why(exc)}); any earlier file there is as it was") from None
