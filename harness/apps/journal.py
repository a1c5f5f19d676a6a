"""The last resort of a `python -m harness run` whose own process dies before it writes its run: a
target's os._exit or fatal signal in a case judged in this process (no --isolate), a second SIGTERM,
kill -9, the OOM killer.

While the run goes, `Journal` appends to a file the records of every case as it finishes, and before
a case judged in this process the records that case gets should the process die inside it (an
`error` on each of its checks, naming it). A watcher process (this module's `main`, started in a
session of its own, so the signals of the run's process group do not reach it) waits for the run's
process to end: when it ends without closing the journal, the watcher writes the finished cases
and the case it died in as the stored run, marked incomplete, and says so on stderr; the run's
process then has already exited with its own status (e.g. 3, or 139 for SIGSEGV). A run that ends
otherwise (done, or stopped by SIGINT/SIGTERM: it writes its run itself) closes the journal, which
kills the watcher and removes the file.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from reports import Record, RunInfo

PROG = "python -m harness run"


class Journal:
    """The journal of one run into `out` (see module doc); use as a context manager."""

    def __init__(self, out: Path, info: RunInfo) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="harness-journal-"))
        self.path = self._dir / "journal.pickle"
        self._file: BinaryIO = open(self.path, "wb")
        self._write(("info", dataclasses.asdict(info) | {"clock": time.time()}))
        self._watcher = subprocess.Popen([sys.executable, "-m", __name__, str(self.path), str(out)],
                                         stdin=subprocess.PIPE, start_new_session=True,
                                         env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, sys.path))})

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, entry: tuple) -> None:
        pickle.dump(entry, self._file)
        self._file.flush()

    def starting(self, dying: list[Record]) -> None:
        """A case is about to be judged in this process: `dying` are its records should the process die."""
        self._write(("starting", dying))

    def finished(self, records: list[Record]) -> None:
        """A case ended with `records`."""
        self._write(("finished", records))

    @property
    def watcher_pid(self) -> int:
        return self._watcher.pid

    def close(self) -> None:
        """The run's process writes its run itself: stop the watcher and remove the journal."""
        self._watcher.kill()
        self._watcher.wait()
        if self._watcher.stdin is not None:
            self._watcher.stdin.close()
        self._file.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def _read(path: Path) -> tuple[dict, list[Record], list[Record]]:
    """The run's info, the records of its finished cases, and those of the case it died in (if any)."""
    info: dict = {}
    finished: list[Record] = []
    dying: list[Record] = []
    with open(path, "rb") as journal:
        while True:
            try:
                kind, value = pickle.load(journal)
            except (EOFError, pickle.UnpicklingError):  # the end, or a write the death cut short
                break
            if kind == "info":
                info = value
            elif kind == "starting":
                dying = value
            else:
                finished += value
                dying = []
    return info, finished, dying


def main(argv: list[str]) -> int:
    """The watcher: wait until the run's process ends (stdin closes), then store what its journal holds."""
    path, out = Path(argv[0]), Path(argv[1])
    sys.stdin.buffer.read()
    if not path.exists():
        return 0
    from harness.apps.outputs import write_run
    from harness.judging.details import Pictures
    from reports import RunInfo

    fields, finished, dying = _read(path)
    died_at = time.time()
    clock = fields.pop("clock")
    where = f"while judging {dying[0].case_id}" if dying else "between cases"
    done = len({r.case_id for r in finished})
    reason = (f"the harness process died {where} (a target's crash in this process, or a kill), after {done} "
              f"finished cases; --isolate judges each case in a worker process, whose death is that case's error")
    info = RunInfo(**{**fields, "selection": tuple(fields["selection"]), "seconds": died_at - clock,
                      "interrupted": reason})
    write_run(finished + dying, info, out, Pictures())
    shutil.rmtree(path.parent, ignore_errors=True)
    print(f"{PROG}: {reason}; stored in {out}/, marked incomplete", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
