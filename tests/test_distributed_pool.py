"""The rank pool: results come back per rank; an exception, a dead rank or a hang becomes a failed
task carrying every rank's traceback, and the next task gets a fresh pool. The rank-side
functions live here (spawned ranks import this module by name)."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist

from cases import Case
from harness import pool as pool_module
from harness.pool import RankPool, SpawnedPools
from harness.runner import run_case
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
    if ctx.rank == 0:
        time.sleep(600)
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


@pytest.mark.parametrize("task, failing, text", [
    (raise_on_rank_one, 1, "planted failure on rank 1"),
    (die_on_rank_zero, 0, "died (exit code 7)"),
])
def test_a_failing_rank_fails_the_task_with_every_rank_traceback_and_the_pool_is_rebuilt(pools, task, failing, text):
    before = pools.run("gloo", 2, rank_sum, 0)
    assert before.ok
    live = pools._pools[("gloo", 2)]
    result = pools.run("gloo", 2, task, timeout=60)
    assert not result.ok and set(result.failures) == {0, 1}
    assert text in result.failures[failing]
    other = 1 - failing
    assert "rank_sum" in result.failures[other] or "all_reduce" in result.failures[other], result.describe()
    assert not live.alive
    after = pools.run("gloo", 2, rank_sum, 0)
    assert after.ok and after.values == [1, 1] and pools._pools[("gloo", 2)] is not live


def test_a_hang_becomes_a_failure_with_the_stacks_of_every_rank(pools):
    result = pools.run("gloo", 2, sleep_on_rank_zero, timeout=4)
    assert set(result.failures) == {0, 1}
    assert "did not answer within 4s" in result.failures[0] and "sleep_on_rank_zero" in result.failures[0]
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
        time.sleep(600)
    return distributed.exchange(pieces, layout, update)


def hanging() -> Control:
    return with_exchange("hanging", _hanging_exchange)


SHARD0 = "muon/conv2d-8x4x3x3/mb3/flat/fp32@fp32/pe/spectral_norm/nesterov/wd0.1/steps2/gaussian/seed0/shard0/ws2"


def test_a_hung_case_is_an_error_record_with_every_rank_traceback_then_the_next_case_runs(monkeypatch):
    case = Case.from_id(SHARD0)
    spec = "test_distributed_pool:hanging"
    with monkeypatch.context() as patch:
        patch.setattr(pool_module, "DEFAULT_TIMEOUT", 6.0)
        records = run_case(case, load_target(spec), spec)
    assert records and all(r.status == "error" for r in records)
    message = records[0].message
    assert "--- rank 0 ---" in message and "--- rank 1 ---" in message
    assert "in _hanging_exchange" in message and "test_distributed_pool.py" in message
    assert all(r.status == "pass" for r in run_case(case, load_target("ours"), "ours"))
