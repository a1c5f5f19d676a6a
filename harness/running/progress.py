"""Progress of a run on a stream: a line per failing check as it is judged, and a status line at
least every `interval` seconds, also while one long case runs (from a daemon thread).

A status line reads

    [ done/total] elapsed  N checks, F failing  R cases/s, C checks/s, ~T left

the estimate T of the time left being the cases still to run over the mean rate R so far.
"""

from __future__ import annotations

import threading
import time
from typing import TextIO

from reports import Record

PROGRESS_SECONDS = 10.0
"""Longest silence between two status lines."""


def duration(seconds: float) -> str:
    """`seconds` as 42s, 3m05s or 1h02m."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """Counts finished cases and checks of `total` cases; use as a context manager (the thread).
    With no stream it only counts."""

    def __init__(self, stream: TextIO | None, total: int, interval: float = PROGRESS_SECONDS) -> None:
        self.stream, self.total, self.interval = stream, total, interval
        self.cases = self.checks = self.failing = 0
        self._start = self._last = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, name="progress", daemon=True)

    def __enter__(self) -> Progress:
        if self.stream is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def case_done(self, case_id: str, records: list[Record]) -> None:
        """Count one finished case; print its failing checks, and a status line when one is due or
        this was the last case."""
        with self._lock:
            self.cases += 1
            self.checks += len(records)
            self.failing += sum(r.failing for r in records)
            if self.stream is None:
                return
            for r in records:
                if r.failing:
                    print(f"  {r.status.upper():5} {r.check:9} {case_id}  ratio {r.ratio:.3g}", file=self.stream)
            diagnosed = [r.diagnosis for r in records if r.failing and r.diagnosis]
            if diagnosed:
                print(f"        diagnosis: {diagnosed[0]}", file=self.stream)
            if self.cases == self.total or time.monotonic() - self._last >= self.interval:
                self._line()

    def _tick(self) -> None:
        while True:
            with self._lock:
                due = self._last + self.interval - time.monotonic()
                if due <= 0:
                    self._line()
                    due = self.interval
            if self._stop.wait(due):
                return

    def _line(self) -> None:
        """Print the status line (caller holds the lock)."""
        now = time.monotonic()
        elapsed = max(now - self._start, 1e-9)
        rate = self.cases / elapsed
        left = f"~{duration((self.total - self.cases) / rate)} left" if self.cases else "time left unknown yet"
        print(f"[{self.cases:>5}/{self.total:>5}] {elapsed:6.1f}s  {self.checks} checks, {self.failing} failing  "
              f"{rate:.2f} cases/s, {self.checks / elapsed:.2f} checks/s, {left}", file=self.stream, flush=True)
        self._last = now
