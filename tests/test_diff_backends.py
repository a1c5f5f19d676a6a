"""`python -m harness diff` across backends: a gloo run against an nccl run (cpu against cuda) pairs
each check of a case with the same check of the same case, and says where they differ beyond
tolerance; runs of one backend still pair record by record."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness.apps import cli
from reports import Record, RunInfo, diff_runs, save_run

CASE = "muon/conv2d-8x4x3x3/mb3/flat/fp32@fp32/pe/rms_norm/plain/wd0.1/steps2/gaussian/seed0/shard0/ws3"
OTHER = "normuon/linear_tall-24x6/mb3/noflat/fp64@fp64/ns/spectral_norm/plain/wd0/steps1/tiny/seed0/replicated/ws2"
INFO = RunInfo(target="ours", tier="nightly", backends="gloo", command="python -m harness run",
               started="2026-11-29T00:00:00+00:00", seconds=1.0, torch_version="2.13.0", selection=("/ws",))


def rec(case_id: str, check: str, backend: str, status: str = "pass", ratio: float = 0.5,
        tolerance: float = 1e-6, message: str = "") -> Record:
    return Record(case_id=case_id, check=check, target="ours", backend=backend, world_size=int(case_id[-1]),
                  layout="shard0-uneven", optimizer="muon", layer="conv2d", shape="8x4x3x3", megabatch=3,
                  flatten=True, param_dtype="fp32", compute_dtype="fp32", orthogonalizer="pe", status=status,
                  ratio=ratio, tolerance=tolerance, message=message)


def run_of(backend: str, statuses: dict[tuple[str, str], tuple[str, float]]) -> list[Record]:
    return [rec(c, k, backend, s, r, 2e-6 if backend == "nccl" else 1e-6,
                f"{backend} {k}: rel_err vs allowed" if s != "pass" else "")
            for (c, k), (s, r) in statuses.items()]


GLOO = {(CASE, "reference"): ("pass", 0.4), (CASE, "local_shard"): ("pass", 0.5),
        (OTHER, "layout"): ("pass", 0.0), (OTHER, "replicas"): ("pass", 0.0)}
NCCL = {**GLOO, (OTHER, "layout"): ("fail", float("inf")), (CASE, "reference"): ("pass", 0.39)}


def test_a_diff_across_backends_pairs_each_case_and_reports_only_differences_beyond_tolerance():
    diff = diff_runs(run_of("gloo", GLOO), run_of("nccl", NCCL), across_backends=True)
    assert diff.across_backends and diff.compared == 4
    assert not diff.appeared and not diff.vanished
    assert [(b.backend, h.backend, h.case_id, h.check) for b, h in diff.new_failures] == [
        ("gloo", "nccl", OTHER, "layout")]
    assert diff.regressed and not diff.error_grew and not diff.fixed
    assert len(diff.tolerance_changed) == 4  # each device class has its own tolerance: shown, not a regression


def test_the_same_runs_keyed_by_backend_pair_nothing():
    """Without pairing across backends every key is new: what the nightly diff said before."""
    diff = diff_runs(run_of("gloo", GLOO), run_of("nccl", NCCL))
    assert diff.compared == 0 and len(diff.vanished) == 4 and len(diff.new_failures) == 1 and len(diff.appeared) == 3


def test_a_run_holding_a_case_on_two_backends_cannot_be_paired_across_backends():
    both = run_of("gloo", GLOO) + run_of("nccl", GLOO)
    with pytest.raises(ValueError, match="backends gloo and nccl"):
        diff_runs(both, run_of("nccl", NCCL), across_backends=True)


def _stored(path: Path, backend: str, statuses: dict, **info: object) -> Path:
    save_run(run_of(backend, statuses), dataclasses.replace(INFO, backends=backend, **info), path)
    return path


def test_cli_diff_of_gloo_against_nccl_pairs_cases_and_says_why(tmp_path, capsys):
    gloo, nccl = _stored(tmp_path / "gloo", "gloo", GLOO), _stored(tmp_path / "nccl", "nccl", NCCL)
    assert cli.main(["diff", str(gloo), str(nccl), "--out", str(tmp_path / "d")]) == 1  # no --force needed
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "paired across backends gloo -> nccl" in line and "1 new_failures" in line and "vanished" not in line
    md = (tmp_path / "d" / "diff.md").read_text()
    assert "Paired across backends" in md
    row = next(r for r in md.splitlines() if r.startswith("| `" + OTHER))
    assert "gloo \u2192 nccl" in row and "nccl layout: rel_err vs allowed" in row and "2e-06" in row
    assert 'id="pairing"' in (tmp_path / "d" / "diff.html").read_text()


def test_cli_diff_across_backends_still_refuses_other_selections(tmp_path, capsys):
    gloo = _stored(tmp_path / "gloo", "gloo", GLOO)
    nccl = _stored(tmp_path / "nccl", "nccl", NCCL, selection=("/ws2",))
    assert cli.main(["diff", str(gloo), str(nccl), "--out", str(tmp_path / "d")]) == 2
    assert "selection" in capsys.readouterr().err and not (tmp_path / "d").exists()


def test_cli_diff_of_one_backend_keeps_pairing_by_record(tmp_path, capsys):
    base, head = _stored(tmp_path / "a", "gloo", GLOO), _stored(tmp_path / "b", "gloo", NCCL)
    assert cli.main(["diff", str(base), str(head), "--out", str(tmp_path / "d")]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "paired across" not in line and "1 new_failures" in line
    assert "Paired across backends" not in (tmp_path / "d" / "diff.md").read_text()


def test_across_backends_only_a_new_failure_is_a_regression():
    """A relation bitwise on gloo (ratio 0) is within tolerance but not bitwise with cuda's kernels, or
    ill-posed there (skipped): listed, not charged. The same changes within one backend regress."""
    nccl = {**GLOO, (OTHER, "layout"): ("pass", 0.3), (OTHER, "replicas"): ("skipped", float("nan"))}
    across = diff_runs(run_of("gloo", GLOO), run_of("nccl", nccl), across_backends=True)
    assert [h.check for _, h in across.error_grew] == ["layout"] and len(across.status_changed) == 1
    assert not across.regressed
    same = diff_runs(run_of("nccl", GLOO), run_of("nccl", nccl))
    assert same.regressed and {n for n, _ in same.regressions()} == {"error_grew", "status_changed"}
