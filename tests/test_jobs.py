"""`run --jobs N` (issue 13): single-process cases judged in N spawned workers give the records one
process gives, and the workers' BLAS threads share the cores out instead of oversubscribing them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import harness.apps.cli as cli
from harness import runner
from harness.judging.details import Detail, Pictures
from harness.running import workers
from harness.running.selection import select
from harness.targets import load_target
from reports import load_run

SELECT = "linear-12x20/mb2/noflat/fp32@bf16/pe"


def test_threads_per_job_share_the_cores_out():
    assert workers.threads_per_job(6, cores=16) == 2
    assert workers.threads_per_job(1, cores=16) == 16
    assert workers.threads_per_job(32, cores=16) == 1
    assert workers.threads_per_job(3, cores=2) == 1


def test_the_workers_get_their_share_of_threads(monkeypatch):
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "99")
    monkeypatch.setattr(workers, "threads_per_job", lambda jobs, cores=None: 3)
    with workers.Workers(2, timeout=60) as pool:
        seen = [outcome.value for _, outcome in pool.map(_thread_variables, [(0,), (1,)])]
    assert seen == [{name: "3" for name in workers.THREAD_VARIABLES}] * 2
    import os
    assert os.environ["OPENBLAS_NUM_THREADS"] == "99", "the parent's own setting is restored"
    with workers.Workers(1, timeout=60, threads=5) as pool:
        assert [o.value for _, o in pool.map(_thread_variables, [(0,)])] == [{name: "5" for name in
                                                                             workers.THREAD_VARIABLES}]


def _thread_variables(clock, _: int) -> dict[str, str | None]:
    import os
    return {name: os.environ.get(name) for name in workers.THREAD_VARIABLES}


def test_jobs_give_the_records_and_pictures_of_one_process():
    cases = select("ci", [SELECT])
    assert len(cases) >= 2
    target = load_target("ours")
    one_pictures, many_pictures = Pictures(), Pictures()
    one = runner.run(cases, target, "ours", progress=None, pictures=one_pictures)
    many = runner.run(cases, target, "ours", progress=None, pictures=many_pictures, jobs=2)
    strip = lambda records: [dataclasses.replace(r, seconds=0.0) for r in records]
    assert repr(strip(many)) == repr(strip(one))  # repr: NaN fields compare equal
    assert [r.key for r, _ in many_pictures.kept()] == [r.key for r, _ in one_pictures.kept()]
    # the workers made the pictures' data (a gpu-tier update's singular values are seconds each): the same data
    assert all(isinstance(d, Detail) for _, d in many_pictures.kept())
    for a, b in zip(many_pictures.details(), one_pictures.details()):
        assert a.key == b.key and a.where == b.where
        assert all(np.array_equal(x, y) for x, y in ((a.error, b.error), (a.sv_judged, b.sv_judged),
                                                     (a.sv_reference, b.sv_reference)))


def test_run_jobs_option(tmp_path, capsys):
    assert cli.main(["run", "--select", SELECT, "--jobs", "2", "--threads", "1", "--quiet", "--out",
                     str(tmp_path)]) == 0
    records, _ = load_run(tmp_path)
    assert {r.case_id for r in records} == {c.id for c in select("ci", [SELECT]) if c.world_size == 1}
    with pytest.raises(SystemExit) as exit:
        cli.main(["run", "--select", SELECT, "--jobs", "0", "--out", str(tmp_path)])
    assert exit.value.code == 2
    assert "--jobs" in capsys.readouterr().err


def test_a_large_error_is_pooled_for_its_picture_and_a_small_one_is_not(monkeypatch):
    """The gpu tier's 2048 x 4608 error drawn element by element was a 1 GB report.html: it is pooled into
    blocks (each the largest |err| of its block, so the worst element still shows), and `where` says so;
    a CI or nightly sized error is kept element by element."""
    import numpy as np

    from harness.judging import details, outcome
    rng = np.random.default_rng(0)
    small = rng.standard_normal((384, 96))
    assert details.pooled(small)[0] is small
    big = rng.standard_normal((2048, 4608)) * 1e-6
    big[1234, 4321] = 5.0
    cells, block = details.pooled(big)
    assert block > 1 and cells.size <= details.HEATMAP_CELLS
    assert cells.max() == 5.0 and cells[1234 // block, 4321 // block] == 5.0
    monkeypatch.setattr(details, "POOL_ABOVE", 1000)  # the keeper's path on a matrix of test size
    monkeypatch.setattr(details, "HEATMAP_CELLS", 64)
    mid = rng.standard_normal((40, 60))
    cells, block = details.pooled(mid)
    keeper = details.Pictures()
    record = runner._record(select("gpu", ["conv2d_gpu"])[0], load_target("ours"), "reference", "pass", "cuda",
                            "", 0.0, ratio=0.5)
    keeper.offer(record, outcome.Evidence("member 0 step 1", mid, np.zeros_like(mid)))
    (detail,) = keeper.details()
    assert detail.error.shape == cells.shape and cells.size <= 64 and f"{block} x {block} block" in detail.where


def test_jobs_and_threads_reach_the_runner(tmp_path, monkeypatch):
    seen = []

    def fake_run(cases, target, spec, backend, progress, ranks, *, timeout, pictures, journal, **parallel):
        seen.append(parallel)
        return []

    monkeypatch.setattr(cli, "run", fake_run)
    cli.main(["run", "--select", SELECT, "--quiet", "--out", str(tmp_path / "a")])
    cli.main(["run", "--select", SELECT, "--quiet", "--jobs", "3", "--threads", "2", "--out", str(tmp_path / "b")])
    cli.main(["run", "--select", SELECT, "--quiet", "--isolate", "--out", str(tmp_path / "c")])
    assert seen == [{}, {"jobs": 3, "threads": 2}, {"isolate": True}]
