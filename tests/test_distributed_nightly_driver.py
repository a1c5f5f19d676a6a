"""benchmarks/nightly_multi_gpu.py without GPUs: the launches it plans, the budget it keeps (a launch
cut by SIGTERM, the ones after it never started), the files it stores and the ONE tarball under $OUT.
The launches themselves are replaced by stored runs here (their commands are `harness run`, tested
elsewhere); `execute` is run for real on a command that outlives the budget."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import tarfile
from pathlib import Path

import pytest

from reports import Record, RunInfo, load_run, save_run

WS2 = "muon/linear-12x20/mb1/noflat/fp64@fp64/ns/spectral_norm/plain/wd0/steps1/gaussian/seed0/replicated/ws2"
WS3 = "muon/linear-12x20/mb1/noflat/fp32@bf16/pe/spectral_norm/nesterov/wd0.1/steps1/zero/seed0/shard0/ws3"


def _driver():
    path = Path(__file__).parents[1] / "benchmarks" / "nightly_multi_gpu.py"
    spec = importlib.util.spec_from_file_location("nightly_multi_gpu", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


DRIVER = _driver()


def test_plan_runs_each_world_size_under_torchrun_on_nccl_then_on_gloo(tmp_path):
    launches = DRIVER.plan("nightly", [2, 3], [], tmp_path, cpu_jobs=1)
    assert [(x.backend, x.world_size) for x in launches] == [("nccl", 2), ("gloo", 2), ("nccl", 3), ("gloo", 3)]
    nccl, gloo = launches[0].parts[0].command, launches[1].parts[0].command
    assert nccl[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    assert nccl[6:] [:6] == ["-m", "harness", "run", "--backend", "nccl", "--tier"]
    assert nccl[nccl.index("--select") + 1] == "/ws2" and gloo[gloo.index("--select") + 1] == "/ws2"
    assert gloo[1:5] == ["-m", "harness", "run", "--backend"] and "torch.distributed.run" not in gloo
    assert launches[0].out == tmp_path / "runs" / "nccl-ws2"


def test_plan_spells_a_narrowed_selection_out_as_ids_of_that_world_size(tmp_path):
    launches = DRIVER.plan("nightly", [2, 3], ["muon/linear-12x20/mb1/"], tmp_path, cpu_jobs=1)
    for launch in launches:
        command = launch.parts[0].command
        chosen = [command[i + 1] for i, a in enumerate(command) if a == "--select"]
        assert chosen == launch.selection and all(c.endswith(f"/ws{launch.world_size}") for c in chosen), chosen
    single = DRIVER.plan("nightly", [1], ["muon/linear-12x20/mb1/"], tmp_path, cpu_jobs=1)
    assert [x.backend for x in single] == ["cuda", "cpu"]


def test_execute_stops_a_launch_at_the_deadline(tmp_path):
    sleeper = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]
    parts = [DRIVER.Part(sleeper, tmp_path / f"run{j}", tmp_path / "logs" / f"x{j}.log") for j in range(2)]
    launch = DRIVER.Launch(2, "gloo", tmp_path / "run", parts, [])
    DRIVER.execute(launch, DRIVER.clock() + 1.0)
    assert launch.cut and launch.started and launch.returncode == -15 and launch.seconds < 10
    assert all("up" in p.log.read_text() for p in parts)


def _records(case: str, backend: str, w: int, checks=("reference", "layout")) -> list[Record]:
    return [Record(case_id=case, check=check, target="ours", backend=backend, world_size=w, layout="replicated",
                   optimizer="muon", layer="linear", shape="12x20", megabatch=1, flatten=False, param_dtype="fp64",
                   compute_dtype="fp64", orthogonalizer="ns",
                   status="fail" if (backend, check) == ("nccl", "layout") else "pass", ratio=0.5)
            for check in checks]


def test_a_split_cpu_twin_covers_its_cases_once_and_merges_into_one_run_of_the_whole_selection(tmp_path):
    (nccl, gloo), = [DRIVER.plan("nightly", [2], [], tmp_path, cpu_jobs=3)]
    assert len(nccl.parts) == 1 and len(gloo.parts) == 3
    ids = [c[i + 1] for p in gloo.parts for i, c in [(i, p.command) for i in range(len(p.command))]
           if c[i] == "--select"]
    assert sorted(ids) == sorted(c.id for c in DRIVER.selection("nightly", 2, [])[0]) and len(set(ids)) == len(ids)
    info = RunInfo(target="ours", tier="nightly", backends="gloo", command="x", started="", seconds=1.0,
                   torch_version="t")
    for j, part in enumerate(gloo.parts[:2]):  # the third part stored nothing (killed before writing)
        save_run(_records(ids[j], "gloo", 2), dataclasses.replace(info, selection=(ids[j],)), part.out)
    assert DRIVER.collect(gloo) and gloo.checks == 4
    records, ctx = load_run(gloo.out)
    assert {r.case_id for r in records} == set(ids[:2]) and ctx["selection"] == ["/ws2"]
    assert ctx["complete"] is False and "part2" in ctx["interrupted"]


def _fake_execute(clock: list[float], seconds: float):
    """Each launch takes `seconds` on the fake clock (cut at the deadline) and stores two records."""
    def execute(launch, deadline):
        launch.started = True
        end = clock[0] + seconds
        launch.cut = end > deadline
        clock[0] = min(end, deadline)
        launch.seconds = seconds if not launch.cut else deadline - (end - seconds)
        for part in launch.parts:
            part.returncode = 1
            part.log.parent.mkdir(parents=True, exist_ok=True)
            part.log.write_text("log\n")
        case = WS2 if launch.world_size == 2 else WS3
        save_run(_records(case, launch.backend, launch.world_size),
                 RunInfo(target="ours", tier="nightly", backends=launch.backend, command="x", started="",
                         seconds=seconds, torch_version="t", selection=(case,),
                         interrupted="SIGTERM" if launch.cut else ""), launch.out)
    return execute


def test_main_keeps_the_budget_stores_everything_and_packs_one_tarball(tmp_path, monkeypatch, capsys):
    clock = [0.0]
    monkeypatch.setattr(DRIVER, "clock", lambda: clock[0])
    monkeypatch.setattr(DRIVER, "execute", _fake_execute(clock, 50.0))
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    budget = 90.0 + DRIVER.RESERVE  # 50 s launches: nccl-ws2 whole, gloo-ws2 cut at 90 s, no ws3
    code = DRIVER.main(["--budget", str(budget), "--gpus", "3", "--results", str(tmp_path / "results"),
                        "--select", WS2, "--select", WS3, "--cpu-jobs", "1"])
    assert code == 0
    (folder,) = (tmp_path / "results").iterdir()
    assert folder.name.endswith("-torch" + DRIVER.torch.__version__.split("+")[0] + "-ws3")
    timings = __import__("json").loads((folder / "timings.json").read_text())
    state = {r["name"]: (r["started"], r["cut"]) for r in timings["launches"]}
    assert state == {"nccl-ws2": (True, False), "gloo-ws2": (True, True), "nccl-ws3": (False, True),
                     "gloo-ws3": (False, True)}
    records, _ = load_run(folder / "all")
    assert {r.backend for r in records} == {"nccl", "gloo"}
    summary = (folder / "summary.md").read_text()
    assert "not started (budget)" in summary and "CUT by the budget" in summary and "checks per GPU-hour" in summary
    assert "diff ws2 (gloo -> nccl):" in summary and "paired across backends" in summary
    assert (folder / "diffs" / "ws2" / "diff.md").exists()
    out = capsys.readouterr().out
    assert "| nccl-ws2 |" in out and "tarball:" in out
    (tarball,) = (tmp_path / "out").iterdir()
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
    for inside in ("summary.md", "all/results.parquet", "timings.json", "runs/nccl-ws2/results.parquet",
                   "logs/gloo-ws2.log", "diffs/ws2/diff.md"):
        assert f"{folder.name}/{inside}" in names


def test_stored_results_are_never_overwritten(tmp_path):
    folder = tmp_path / "2026-11-29-nvidia-h200-torch2.11.0-ws2"
    assert DRIVER.free_name(folder) == folder
    folder.mkdir()
    (tmp_path / f"{folder.name}-2").mkdir()
    assert DRIVER.free_name(folder) == tmp_path / f"{folder.name}-3"
