"""The rank pool: results come back per rank; an exception, a dead rank or a hang becomes a failed
task carrying every rank's traceback, and the next task gets a fresh pool. The rank-side
functions live here (spawned ranks import this module by name)."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from cases import Case
from harness.runner import run_case
from harness.running.pool import RankPool, SpawnedPools
from harness.targets import load_target
from harness.targets.controls import Control
from harness.targets.distributed_controls import with_exchange
from optimizers import distributed


def rank_sum(ctx, offset: int) -> int:
    t = torch.tensor([ctx.rank + offset])
    dist.all_reduce(t, group=ctx.group)
    return int(t.item())


def raise_on_rank_one(ctx) -> int:
    if ctx.rank == 1:
        raise RuntimeError("planted failure on rank 1")
    return rank_sum(ctx, 0)


def die_on_rank_zero(ctx) -> int:
    if ctx.rank == 0:
        os._exit(7)
    return rank_sum(ctx, 0)


def sleep_on_rank_zero(ctx) -> int:
    print(f"rank {ctx.rank} printed this", flush=True)
    if ctx.rank == 0:
        time.sleep(600)
    return rank_sum(ctx, 0)


def value_of_module(ctx, name: str) -> int:
    return importlib.import_module(name).VALUE


def segfault_on_rank_one(ctx) -> int:
    if ctx.rank == 1:
        print("last words of rank 1", flush=True)
        os.kill(os.getpid(), signal.SIGSEGV)
    return rank_sum(ctx, 0)



@pytest.fixture(scope="module")
def pools():
    own = SpawnedPools()
    yield own
    own.close()


def test_values_come_back_per_rank_and_the_pool_is_reused(pools):
    first = pools.run("gloo", 3, rank_sum, 10)
    assert first.ok and first.values == [33, 33, 33]
    live = pools._pools[("gloo", 3)]
    assert pools.run("gloo", 3, rank_sum, 0).values == [3, 3, 3]
    assert pools._pools[("gloo", 3)] is live


def test_a_pool_spawned_before_sys_path_changed_is_rebuilt_so_its_ranks_import_from_the_new_path(
        pools, tmp_path, monkeypatch):
    """A user adds their targets' folder to sys.path after a first run: the ranks must see it too
    (before: a pool spawned earlier kept the old path, and its ranks could not import the target)."""
    assert pools.run("gloo", 2, rank_sum, 0).ok
    stale = pools._pools[("gloo", 2)]
    (tmp_path / "added_late_module.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = pools.run("gloo", 2, value_of_module, "added_late_module")
    assert result.ok and result.values == [42, 42], result.describe()
    assert pools._pools[("gloo", 2)] is not stale and not stale.alive


@pytest.mark.parametrize("task, failing, text", [
    (raise_on_rank_one, 1, "rank 1 raised:\nTraceback"),
    (die_on_rank_zero, 0, "rank 0 died (exit code 7) without a reply"),
    (segfault_on_rank_one, 1, "rank 1 died with signal SIGSEGV (exit code -11) without a reply"),
])
def test_a_failing_rank_fails_the_task_with_every_rank_traceback_and_the_pool_is_rebuilt(pools, task, failing, text):
    before = pools.run("gloo", 2, rank_sum, 0)
    assert before.ok
    live = pools._pools[("gloo", 2)]
    result = pools.run("gloo", 2, task, timeout=60)
    assert not result.ok and set(result.failures) == {0, 1}
    assert text in result.failures[failing], result.describe()
    other = 1 - failing
    # the other rank either fails in its collective too, or is still waiting for the failed one
    assert (result.failures[other].startswith(f"rank {other} raised:")
            or f"rank {other} still busy" in result.failures[other] and f"after rank {failing} failed"
            in result.failures[other]), result.describe()
    assert "within the timeout" not in result.describe()  # it waited a grace period, not the timeout
    if task is segfault_on_rank_one:  # its last output and faulthandler's stack of the crash
        crash = result.failures[1]
        assert "last words of rank 1" in crash and "Segmentation fault" in crash and "segfault_on_rank_one" in crash
    assert "rank_sum" in result.failures[other] or "all_reduce" in result.failures[other], result.describe()
    assert not live.alive
    after = pools.run("gloo", 2, rank_sum, 0)
    assert after.ok and after.values == [1, 1] and pools._pools[("gloo", 2)] is not live


def test_a_hang_becomes_a_failure_with_the_stacks_of_every_rank(pools):
    # Ranks that have run a task hold this module: the 4 s then time the hang alone, not the ranks' imports (on
    # a loaded CI machine those alone passed 4 s, and the stack showed an import instead of the sleep).
    assert pools.run("gloo", 2, rank_sum, 0).ok
    result = pools.run("gloo", 2, sleep_on_rank_zero, timeout=4)
    assert set(result.failures) == {0, 1}
    assert "rank 0 hung: no answer within the timeout of 4s" in result.failures[0]
    assert "sleep_on_rank_zero" in result.failures[0]
    assert "rank 1 hung: no answer within the timeout of 4s" in result.failures[1]
    assert all(f"rank {r} printed this" in result.failures[r] for r in (0, 1))  # stdout goes to the log
    assert "all_reduce" in result.failures[1] or "rank_sum" in result.failures[1], result.describe()
    assert pools.run("gloo", 2, rank_sum, 0).ok


def test_concurrent_pools_do_not_share_a_rendezvous():
    a, b = RankPool("gloo", 2), RankPool("gloo", 2)
    try:
        assert a.run(rank_sum, 1).values == [3, 3] and b.run(rank_sum, 2).values == [5, 5]
    finally:
        a.close()
        b.close()


def _hanging_exchange(pieces: torch.Tensor, layout: Any, update: Any) -> torch.Tensor:
    """Rank 1 never joins the all-to-all."""
    if layout.rank == 1:
        print("rank 1 hangs now", flush=True)
        time.sleep(600)
    return distributed.exchange(pieces, layout, update)


def hanging() -> Control:
    return with_exchange("hanging", _hanging_exchange)


SHARD0 = "muon/conv2d-8x4x3x3/mb3/flat/fp32@fp32/pe/spectral_norm/nesterov/wd0.1/steps2/gaussian/seed0/shard0/ws2"


def test_a_hung_case_is_an_error_record_with_every_rank_traceback_then_the_next_case_runs():
    case = Case.from_id(SHARD0)
    spec = "test_distributed_pool:hanging"
    assert all(r.status == "pass" for r in run_case(case, load_target("ours"), "ours"))  # ranks past their imports
    records = run_case(case, load_target(spec), spec, timeout=10.0)
    assert records and all(r.status == "error" for r in records)
    message = records[0].message
    assert "hung: no answer within the timeout of 10s" in message
    assert "--- rank 0 ---" in message and "--- rank 1 ---" in message
    assert "in _hanging_exchange" in message and "test_distributed_pool.py" in message
    assert all(r.status == "pass" for r in run_case(case, load_target("ours"), "ours"))


def _children(pid: int) -> list[int]:
    """Pids of the processes whose parent is `pid` (Linux /proc)."""
    kids = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        if stat and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            kids.append(int(entry.name))
    return kids


def _wait(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds:g}s for {what}"
        time.sleep(0.1)


def _hung_run(tmp_path: Path) -> tuple[subprocess.Popen, list[int]]:
    """`python -m harness run` of a case whose rank 1 hangs, once rank 1 hangs: (process, rank pids)."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONPATH": str(Path(__file__).parent)}
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run", "--backend", "gloo", "--select", SHARD0,
                             "--target", "test_distributed_pool:hanging", "--out", str(tmp_path / "out"), "--quiet"],
                            env=env, cwd=Path(__file__).parent.parent, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    hanging = lambda: any("rank 1 hangs now" in log.read_text() for log in tmpdir.glob("rankpool-*/rank1.log"))
    _wait(lambda: hanging() or proc.poll() is not None, 240, "rank 1 to hang")
    assert proc.poll() is None, proc.communicate()
    return proc, _children(proc.pid)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_while_a_rank_hangs_kills_the_ranks_removes_the_pool_and_writes_an_incomplete_run(tmp_path):
    proc, ranks = _hung_run(tmp_path)
    assert len(ranks) >= 2
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "interrupted by SIGTERM after 0 of 1 cases" in stderr and "Traceback" not in stderr, stderr
    _wait(lambda: not any(Path(f"/proc/{pid}").exists() for pid in ranks), 10, "the ranks to exit")
    assert not list((tmp_path / "tmp").glob("rankpool-*"))
    stored = json.loads((tmp_path / "out" / "run.json").read_text())
    assert stored["complete"] is False and stored["records"] == 0
    assert "INCOMPLETE" in (tmp_path / "out" / "summary.md").read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ranks_die_with_a_parent_killed_outright(tmp_path):
    proc, ranks = _hung_run(tmp_path)
    proc.kill()  # no handler, no atexit: only the ranks' parent-death signal and watchdog can end them
    proc.communicate(timeout=60)
    _wait(lambda: not any(Path(f"/proc/{pid}").exists() for pid in ranks), 10, "the ranks to exit")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_watchdog_alone_ends_a_process_whose_parent_dies(tmp_path):
    """Without the parent-death signal (other platforms), the watchdog thread still ends the rank."""
    grandchild = ("import os, time\nfrom harness.running.processes import watch_parent\nwatch_parent(os.getppid())\n"
                  "print('watching', flush=True)\ntime.sleep(600)\n")
    middle = (f"import subprocess, sys, time\np = subprocess.Popen([sys.executable, '-c', {grandchild!r}])\n"
              f"print(p.pid, flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", middle], cwd=Path(__file__).parent.parent,
                            stdout=subprocess.PIPE, text=True)
    pid = int(proc.stdout.readline())
    assert proc.stdout.readline().strip() == "watching"
    proc.kill()
    proc.wait(timeout=30)
    _wait(lambda: not Path(f"/proc/{pid}").exists(), 10, "the watched process to exit")
