"""Rank processes kept alive and fed many tasks: spawned pools, or the ranks of `torchrun`.

A task is `fn(ctx, *args)` run on every rank at once, `fn` a module-level function (it is
pickled by reference) and `ctx` the rank's `RankContext`. Each rank returns a picklable
value or raises; the parent gets a `TaskResult` with every rank's value, or with every
rank's traceback when any rank failed, and does the comparing and asserting itself.

Spawned pools (`RankPool`, one per (backend, world size), via `pools()`):
  - processes are spawned, never forked; rendezvous is a `FileStore` in a fresh temporary
    directory, so concurrent pools (pytest -n auto) never share a port or a file;
  - parent and rank talk through one pipe per rank (plain pickles: no shared memory);
  - a rank that raises, dies, or does not answer within the task's timeout fails the task:
    ranks still running get SIGUSR1, on which faulthandler writes every thread's stack to
    the rank's log, read back as its traceback; then the pool is shut down, and the next
    task on that (backend, world size) starts a fresh one. Every rank's failure says what
    happened: it raised (its traceback), died (its exit code or signal, e.g. SIGSEGV, and the
    end of its log), hung past the timeout, or was still waiting GRACE s after another rank
    failed (its stacks);
  - a rank is a helper process (harness/running/processes.py): its stdout and stderr go to its
    log, where faulthandler writes the Python stacks of a fatal signal (SIGSEGV, SIGABRT, ...),
    so a crashed rank leaves its last output; it dies with the harness (parent-death signal and
    watchdog) and ignores SIGINT and SIGTERM sent to the process group, which are the harness's;
    a task interrupted in the parent (SIGINT, SIGTERM turned into an exception by the CLI)
    closes its pool, which kills the ranks and removes the temporary directory.

Under `torchrun` (`TorchrunRanks`) nothing is spawned: every process runs the same driver
loop, a task of world size w runs on ranks 0..w-1 (a subgroup made once per w), and the
values reach rank 0 through `gather_object` on a gloo group. A rank that raises is reported
with its traceback; a hang ends in the process group's timeout, since a torchrun world
cannot be rebuilt from inside.
"""

from __future__ import annotations

import atexit
import datetime
import multiprocessing
import multiprocessing.connection
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from harness.running.processes import become_helper, how_it_ended, log_tail, recv, send, stacks

DEFAULT_TIMEOUT = 120.0
"""Seconds a task may run on a pool before it counts as hung (`run --timeout` overrides it)."""
TORCHRUN_TIMEOUT = 600.0
"""Seconds of the process group's timeout under torchrun, where it is what ends a hang."""
STARTUP_TIMEOUT = 180.0
"""Seconds a new pool's ranks may take to import torch and rendezvous (2 cores, 4 ranks: ~10)."""
GRACE = 3.0
"""Seconds the other ranks get to finish once one rank has failed."""


@dataclass
class RankContext:
    """What a task sees on its rank: its rank in the task's group, the group and its 1-D mesh."""

    rank: int
    world_size: int
    device: torch.device
    group: dist.ProcessGroup
    mesh: DeviceMesh
    cache: dict[str, Any] = field(default_factory=dict)
    """Per-rank memo kept across tasks (e.g. loaded targets)."""


@dataclass(frozen=True)
class TaskResult:
    """values[r]: rank r's return value (None where it failed); failures[r]: rank r's traceback."""

    values: list[Any]
    failures: dict[int, str]

    @property
    def ok(self) -> bool:
        return not self.failures

    def describe(self) -> str:
        """Every failed rank's traceback, rank by rank."""
        return "\n".join(f"--- rank {r} ---\n{text.rstrip()}" for r, text in sorted(self.failures.items()))


class PoolError(RuntimeError):
    """A pool that could not start; the message holds every rank's log."""


def _device(backend: str, rank: int) -> torch.device:
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _rank_main(rank: int, world_size: int, backend: str, store_path: str, log_path: str,
               conn: multiprocessing.connection.Connection, timeout: float, parent: int) -> None:
    """A pooled rank (a helper: harness.running.processes): rendezvous, then run tasks until told to
    stop (None) or the pipe closes."""
    become_helper(parent, log_path)
    torch.set_num_threads(1)
    try:
        device = _device(backend, rank)
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout))
        ctx = RankContext(rank, world_size, device, dist.group.WORLD,
                          DeviceMesh.from_group(dist.group.WORLD, device.type))
        send(conn, ("ok", None))
    except BaseException:
        send(conn, ("error", traceback.format_exc()))
        return
    while True:
        try:
            task = recv(conn)
        except EOFError:
            break
        if task is None:
            break
        fn, args = task
        try:
            reply = ("ok", fn(ctx, *args))
        except BaseException:
            reply = ("error", traceback.format_exc())
        send(conn, reply)
    dist.destroy_process_group()


class RankPool:
    """`world_size` spawned ranks of `backend` ("gloo" or "nccl") that run tasks until closed."""

    def __init__(self, backend: str, world_size: int, pg_timeout: float = 300.0) -> None:
        self.backend, self.world_size = backend, world_size
        self.sys_path = tuple(sys.path)  # what the spawned ranks import targets from
        self._dir = Path(tempfile.mkdtemp(prefix=f"rankpool-{backend}{world_size}-"))
        self._conns: list[multiprocessing.connection.Connection] = []
        self._procs: list[Any] = []
        try:
            context = multiprocessing.get_context("spawn")
            for rank in range(world_size):
                parent, child = context.Pipe()
                proc = context.Process(target=_rank_main, daemon=True, name=f"rank{rank}-{backend}{world_size}",
                                       args=(rank, world_size, backend, str(self._dir / "store"),
                                             str(self._log(rank)), child, pg_timeout, os.getpid()))
                self._conns.append(parent)
                proc.start()
                child.close()
                self._procs.append(proc)
            started = self._collect(STARTUP_TIMEOUT)
        except BaseException:
            self.close()
            raise
        if not started.ok:
            self.close()
            raise PoolError(f"{backend} pool of {world_size} ranks did not start:\n{started.describe()}")

    def _log(self, rank: int) -> Path:
        return self._dir / f"rank{rank}.log"

    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    @property
    def pids(self) -> list[int]:
        """Process ids of the ranks, rank order."""
        return [p.pid for p in self._procs]

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = DEFAULT_TIMEOUT) -> TaskResult:
        """Run fn(ctx, *args) on every rank. On any failure, and when the wait is interrupted (an
        exception such as KeyboardInterrupt, re-raised), the pool is closed (see module doc)."""
        try:
            for conn in self._conns:
                send(conn, (fn, args))
            result = self._collect(timeout)
        except BaseException:
            self.close()
            raise
        if not result.ok:
            self.close()
        return result

    def _collect(self, timeout: float) -> TaskResult:
        values: list[Any] = [None] * self.world_size
        failures: dict[int, str] = {}
        first_failure: tuple[int, float] | None = None  # (rank, when)
        pending = set(range(self.world_size))
        deadline = time.monotonic() + timeout
        while pending:
            waiting = {self._conns[r]: r for r in pending} | {self._procs[r].sentinel: r for r in pending}
            ready = multiprocessing.connection.wait(list(waiting), max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for handle in ready:
                rank = waiting[handle]
                if rank not in pending:
                    continue
                conn, proc = self._conns[rank], self._procs[rank]
                try:
                    kind, value = recv(conn) if conn.poll() else ("silent", None)
                except EOFError:
                    kind, value = "closed", None
                if kind == "ok":
                    pending.discard(rank)
                    values[rank] = value
                    continue
                if kind == "error":
                    pending.discard(rank)
                    failures[rank] = f"rank {rank} raised:\n{value}"
                else:
                    proc.join(timeout=1.0 if kind == "closed" else 0.0)
                    if proc.is_alive():
                        continue
                    pending.discard(rank)
                    failures[rank] = self._death(rank, proc.exitcode)
                if first_failure is None:
                    first_failure = (rank, time.monotonic())
                    deadline = min(deadline, first_failure[1] + GRACE)
        for rank in sorted(pending):
            if first_failure is None:
                why = f"hung: no answer within the timeout of {timeout:g}s"
            else:
                failed, when = first_failure
                why = (f"still busy {time.monotonic() - when:.1f}s after rank {failed} failed (most likely "
                       f"waiting for it); stopped waiting")
            failures[rank] = f"rank {rank} {why}; its stacks:\n{self._stacks(rank)}"
        return TaskResult(values, failures)

    def _death(self, rank: int, exitcode: int | None) -> str:
        """What a rank that exited without a reply left: its exit code or signal and its last output."""
        return f"rank {rank} died {how_it_ended(exitcode)} without a reply; its last output:\n{log_tail(self._log(rank))}"

    def _stacks(self, rank: int) -> str:
        """The tail of what a rank that did not answer wrote, then its stacks."""
        return stacks(self._procs[rank], self._log(rank))

    def close(self) -> None:
        """Stop every rank (politely, then by force, 2 s in all) and remove the rendezvous directory."""
        for conn in self._conns:
            try:
                send(conn, None)
            except OSError:
                pass
        deadline = time.monotonic() + 2.0
        for proc in self._procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
            proc.join()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
        shutil.rmtree(self._dir, ignore_errors=True)


class SpawnedPools:
    """One live `RankPool` per (backend, world size), rebuilt when a task broke it or when this process's
    sys.path changed since it spawned (its ranks could not import a target from the new path)."""

    def __init__(self) -> None:
        self._pools: dict[tuple[str, int], RankPool] = {}

    def run(self, backend: str, world_size: int, fn: Callable[..., Any], *args: Any,
            timeout: float | None = None) -> TaskResult:
        """fn(ctx, *args) on every rank of the (backend, world size) pool, within `timeout` seconds
        (default: DEFAULT_TIMEOUT, read at call time); a pool that cannot start is a failed task
        whose message holds every rank's log."""
        pool = self._pools.get((backend, world_size))
        if pool is not None and pool.sys_path != tuple(sys.path):
            pool.close()
        if pool is None or not pool.alive:
            try:
                pool = self._pools[(backend, world_size)] = RankPool(backend, world_size)
            except PoolError as exc:
                return TaskResult([None] * world_size, {0: str(exc)})
        return pool.run(fn, *args, timeout=DEFAULT_TIMEOUT if timeout is None else timeout)

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()


_POOLS: SpawnedPools | None = None


def pools() -> SpawnedPools:
    """This process's pools (closed at exit)."""
    global _POOLS
    if _POOLS is None:
        _POOLS = SpawnedPools()
        atexit.register(_POOLS.close)
    return _POOLS


def under_torchrun() -> bool:
    """True in a process that torchrun (torch.distributed.run) started."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ


class TorchrunRanks:
    """The ranks of a torchrun world, as a task runner (see module doc). Call on every rank."""

    def __init__(self, backend: str, pg_timeout: float = TORCHRUN_TIMEOUT) -> None:
        self.backend = backend
        if not dist.is_initialized():
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=pg_timeout))
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device = _device(backend, int(os.environ.get("LOCAL_RANK", self.rank)))
        self._objects = dist.new_group(backend="gloo")
        self._contexts: dict[int, RankContext | None] = {}
        self._cache: dict[str, Any] = {}
        torch.set_num_threads(1)

    def _context(self, world_size: int) -> RankContext | None:
        if world_size not in self._contexts:
            ranks = list(range(world_size))
            group = dist.new_group(ranks) if world_size < self.world_size else dist.group.WORLD
            self._contexts[world_size] = (
                RankContext(self.rank, world_size, self.device, group, DeviceMesh.from_group(group, self.device.type),
                            self._cache) if self.rank < world_size else None)
        return self._contexts[world_size]

    def run(self, world_size: int, fn: Callable[..., Any], *args: Any) -> TaskResult | None:
        """fn(ctx, *args) on ranks 0..world_size-1; the TaskResult on rank 0, None elsewhere."""
        ctx = self._context(world_size)
        reply: tuple[str, Any] = ("idle", None)
        if ctx is not None:
            try:
                reply = ("ok", fn(ctx, *args))
            except Exception:
                reply = ("error", traceback.format_exc())
        gathered: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(reply, gathered, dst=0, group=self._objects)
        if gathered is None:
            return None
        replies = gathered[:world_size]
        return TaskResult([v if k == "ok" else None for k, v in replies],
                          {r: v for r, (k, v) in enumerate(replies) if k == "error"})

    @property
    def is_driver(self) -> bool:
        """True on rank 0, which compares, reports and writes files."""
        return self.rank == 0

    def close(self) -> None:
        dist.destroy_process_group()


__all__ = ["DEFAULT_TIMEOUT", "TORCHRUN_TIMEOUT", "PoolError", "RankContext", "RankPool", "SpawnedPools", "TaskResult", "TorchrunRanks",
           "pools", "under_torchrun"]
