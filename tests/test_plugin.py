"""The pytest plugin (harness/pytest_plugin.py) used the way a peer team would: a throwaway package
outside this repository, its own pytest session in a subprocess, our cases as its tests."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from cases import Case
from harness.pytest_plugin import USAGE_EXIT
from reports import load_run

ROOT = Path(__file__).resolve().parents[1]

LINEAR = "muon/linear-12x20/mb1/noflat/fp32@fp32/ns/spectral_norm/plain/wd0/steps1/gaussian/seed0"
CONV = "muon/conv1d-8x4x5/mb1/flat/fp32@fp32/pe/spectral_norm/nesterov/wd0.1/steps3/lowrank/seed0"
NORMUON = "normuon/linear-12x20/mb3/noflat/fp32@fp32/ns/rms_norm/plain/wd0/steps3/gaussian/seed0"
SELECTED = (LINEAR, CONV, NORMUON)

PEER_TARGETS = '''
"""A peer's adapters: their Muon (here: ours, fp32 compute only), and a copy with a planted bug."""
import torch

import optimizers
from harness.targets import OptimizerTarget
from oracles import Conventions, Orthogonalizer


class PeerMuon(OptimizerTarget):
    name = "peer-muon"
    exact_relations = True

    def unsupported(self, case):
        if case.optimizer != "muon":
            return "peer-muon implements Muon only"
        if case.compute_dtype != "fp32":
            return "peer-muon computes in fp32 only"
        return None

    def conventions(self, case):
        return Conventions(orthogonalizer=Orthogonalizer.named(case.orthogonalizer, compute_dtype="fp32"),
                           lr_scale=case.adjust_lr, lr_dims="flattened" if case.flatten else "last_two",
                           compute_dtype="fp32")

    def lr(self, case):
        return case.lr

    def make(self, params, case):
        return optimizers.Muon(params, lr=self.lr(case), momentum=case.momentum, nesterov=case.nesterov,
                               weight_decay=case.weight_decay, flatten=case.flatten,
                               adjust_lr=None if case.adjust_lr == "none" else case.adjust_lr,
                               orthogonalizer=case.orthogonalizer, compute_dtype=torch.float32)


class BrokenOnConv(PeerMuon):
    name = "peer-muon-broken"

    def lr(self, case):  # the planted bug: 25% too large a step for convolution kernels
        return case.lr * (1.25 if len(case.shape) > 2 else 1.0)


class CrashesOnConv(PeerMuon):
    name = "peer-muon-crashes"

    def run(self, params, grads, case):
        if len(case.shape) > 2:  # the planted crash: the process dies on convolution kernels
            import os
            os._exit(3)
        return super().run(params, grads, case)


def good():
    return PeerMuon()


def crashes():
    return CrashesOnConv()


def broken():
    return BrokenOnConv()
'''

PEER_TEST = '''
def test_their_own():
    assert 1 + 1 == 2
'''


@pytest.fixture(scope="module")
def peer(tmp_path_factory) -> Path:
    """A peer's project: package peer_muon (targets.py) and one test of their own."""
    root = tmp_path_factory.mktemp("peer")
    (root / "peer_muon").mkdir()
    (root / "peer_muon" / "__init__.py").write_text("")
    (root / "peer_muon" / "targets.py").write_text(textwrap.dedent(PEER_TARGETS))
    (root / "tests").mkdir()
    (root / "tests" / "test_theirs.py").write_text(PEER_TEST)
    return root


def pytest_in(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m pytest -p harness.pytest_plugin ARGS` in `cwd`, with this project importable."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "harness.pytest_plugin", "-p", "no:cacheprovider",
                           *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def selection(*ids: str) -> list[str]:
    return [f"--muon-select={case_id}" for case_id in ids]


XDIST_VERDICT = re.compile(r"^\[gw\d+\] \[\s*\d+%\] (PASSED|FAILED|SKIPPED) (\S+)")
PLAIN_VERDICT = re.compile(r"^(\S+::\S+) (PASSED|FAILED|SKIPPED)")


def outcomes(output: str) -> dict[str, str]:
    """node id -> PASSED/FAILED/SKIPPED, from the lines of a -v session (with or without xdist)."""
    found = {}
    for line in output.splitlines():
        if m := XDIST_VERDICT.match(line):
            found[m.group(2)] = m.group(1)
        elif m := PLAIN_VERDICT.match(line):
            found[m.group(1)] = m.group(2)
    return found


def test_broken_target_fails_its_conv_case_under_xdist(peer, tmp_path):
    out = tmp_path / "run"
    result = pytest_in(peer, "-n", "2", "-v", "-rs", "--muon-target=peer_muon.targets:broken", *selection(*SELECTED),
                       f"--muon-out={out}")
    log = result.stdout + result.stderr
    assert result.returncode == 1, log
    assert outcomes(log) == {"tests/test_theirs.py::test_their_own": "PASSED", f"muon-cpu::{LINEAR}": "PASSED",
                             f"muon-cpu::{CONV}": "FAILED", f"muon-cpu::{NORMUON}": "SKIPPED"}, log
    assert re.search(r"1 failed, 2 passed, 1 skipped", log), log
    # the failure names the failing check with its ratio and gives the command that reruns the case alone
    assert re.search(r"FAIL reference \(ratio \d", log), log
    assert f"repro: python -m harness run --target peer_muon.targets:broken --backend cpu --select {CONV}" in log, log
    assert ("repro in pytest: pytest -p harness.pytest_plugin --muon-target=peer_muon.targets:broken "
            f"--muon-backend=cpu --muon-select={CONV}") in log, log
    assert "peer-muon implements Muon only" in log, log  # the skip's reason

    records, context = load_run(out)
    assert {r.case_id for r in records} == set(SELECTED)
    assert {r.target for r in records} == {"peer-muon-broken"}
    by_case = {c: {r.status for r in records if r.case_id == c} for c in SELECTED}
    assert by_case == {LINEAR: {"pass"}, CONV: {"fail", "pass"}, NORMUON: {"unsupported"}}, by_case
    assert context["tier"] == "ci" and "peer_muon.targets:broken" in context["target"]
    assert context["complete"] and context["selection"] == list(SELECTED)
    for name in ("results.csv", "report.html", "summary.md"):
        assert (out / name).stat().st_size > 0, name
    assert CONV in (out / "report.html").read_text()


def test_correct_target_passes_without_xdist(peer, tmp_path):
    out = tmp_path / "run"
    result = pytest_in(peer, "-v", "--muon-target=peer_muon.targets:good", *selection(*SELECTED),
                       f"--muon-out={out}")
    log = result.stdout + result.stderr
    assert result.returncode == 0, log
    assert outcomes(log) == {"tests/test_theirs.py::test_their_own": "PASSED", f"muon-cpu::{LINEAR}": "PASSED",
                             f"muon-cpu::{CONV}": "PASSED", f"muon-cpu::{NORMUON}": "SKIPPED"}, log
    records, context = load_run(out)
    assert {r.status for r in records if r.case_id != NORMUON} == {"pass"}
    assert context["complete"], context


def test_a_session_stopped_early_stores_an_incomplete_run(peer, tmp_path):
    """-x stops after the conv case fails: the NorMuon case never runs, and the run says so."""
    out = tmp_path / "run"
    result = pytest_in(peer, "-x", "--muon-target=peer_muon.targets:broken", *selection(CONV, NORMUON),
                       f"--muon-out={out}", "tests/test_theirs.py")
    log = result.stdout + result.stderr
    assert result.returncode == 1, log
    assert "muon conformance INCOMPLETE: 1 of 2 cases did not run (stopping after 1 failures)" in log, log
    records, context = load_run(out)
    assert {r.case_id for r in records} == {CONV}
    assert not context["complete"] and context["interrupted"] == "1 of 2 cases did not run (stopping after 1 failures)"


@pytest.mark.slow
def test_a_case_whose_xdist_worker_crashed_is_an_error_in_the_stored_run(peer, tmp_path):
    """The target's os._exit(3) kills the xdist worker judging the conv case: xdist replaces it and the run
    stored holds an error on each of that case's checks, saying so, and is complete (issue 30 item 7; before:
    no record of the case, and "1 of 2 cases did not run (the session ended first)")."""
    out = tmp_path / "run"
    result = pytest_in(peer, "-n", "2", "--muon-target=peer_muon.targets:crashes", *selection(LINEAR, CONV),
                       f"--muon-out={out}", "tests/test_theirs.py")
    log = result.stdout + result.stderr
    assert result.returncode == 1 and "crashed while running" in log, log
    records, context = load_run(out)
    assert context["complete"], context
    assert {r.status for r in records if r.case_id == LINEAR} == {"pass"}
    crashed = [r for r in records if r.case_id == CONV]
    assert crashed and {r.status for r in crashed} == {"error"}
    assert all(f"crashed while running 'muon-cpu::{CONV}'" in r.message and "worker process judging this case died"
               in r.message for r in crashed), crashed[0].message
    assert crashed[0].repro.endswith(f"--target peer_muon.targets:crashes --backend cpu --select {CONV}")


def test_inert_without_target(peer):
    """Loaded but not asked: the peer's own test and nothing else, and no harness module imported."""
    probe = peer / "tests" / "test_probe.py"
    probe.write_text("import sys\n\ndef test_probe():\n    assert 'harness.runner' not in sys.modules\n"
                     "    assert 'torch' not in sys.modules\n")
    try:
        result = pytest_in(peer, "-v")
    finally:
        probe.unlink()
    log = result.stdout + result.stderr
    assert result.returncode == 0, log
    assert outcomes(log) == {"tests/test_theirs.py::test_their_own": "PASSED",
                             "tests/test_probe.py::test_probe": "PASSED"}, log
    shown = [line for line in result.stdout.lower().splitlines() if not line.startswith("plugins:")]
    assert not any("muon" in line for line in shown), result.stdout  # pytest's header names installed plugins


def test_bad_target_is_a_one_line_usage_error(peer, tmp_path):
    out = tmp_path / "never"
    result = pytest_in(peer, "--muon-target=peer_muon.targets:nope", f"--muon-out={out}")
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == USAGE_EXIT == 4, result.stdout + result.stderr  # as the help and docstring say
    assert errors == ["ERROR: --muon-target: target 'peer_muon.targets:nope': peer_muon.targets has no callable 'nope'"], \
        result.stderr
    assert not out.exists(), "a usage error must write nothing"


def test_help_and_docstring_say_a_bad_option_exits_4(peer):
    """The status the test above observes is the one a user reads in `pytest --help` and the docstring."""
    import harness.pytest_plugin as plugin

    result = pytest_in(peer, "--help")
    assert result.returncode == 0, result.stderr
    assert "A bad --muon-* option exits with status 4 (pytest's usage error) before any test runs" in \
        " ".join(result.stdout.split())
    assert "4 (pytest's\nusage error, `USAGE_EXIT`) a bad --muon-* option" in plugin.__doc__


OPTIONS = {"muon_target": "ours", "muon_tier": "ci", "muon_select": [LINEAR], "muon_backend": "cpu",
           "muon_out": None}


@pytest.mark.parametrize("options, message", [
    ({"muon_target": "no_such_module:target"}, "--muon-target: target 'no_such_module:target': cannot import"),
    ({"muon_target": "harness.targets:TargetError"},
     "the callable must return a harness Target; TargetError() returned TargetError"),
    ({"muon_target": "raises_on_import:target"}, "'raises_on_import:target': loading it raised RuntimeError: boom"),
    ({"muon_select": ["no-such-case"]}, "--muon-select ['no-such-case']: no case of the target's 'ci' tier matches"),
    ({"muon_backend": "cpu,tpu"}, "--muon-backend 'cpu,tpu': name distinct backends of"),
    ({"muon_backend": "cpu,cpu"}, "--muon-backend 'cpu,cpu': name distinct backends of"),
    ({"muon_tier": "weekly"}, "--muon-tier 'weekly': expected one of ci, nightly"),
    ({"muon_out": "FILE"}, "exists and is not a directory"),
])
def test_each_bad_option_is_a_usage_error_before_anything_is_written(tmp_path, monkeypatch, options, message):
    """The validation in-process (the subprocess test above shows how pytest prints it)."""
    from harness.pytest_plugin import ConformanceSession

    (tmp_path / "raises_on_import.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "FILE").write_text("not a directory")
    out = tmp_path / "out"
    chosen = {**OPTIONS, "muon_out": out, **options}
    if chosen["muon_out"] == "FILE":
        chosen["muon_out"] = tmp_path / "FILE"
    with pytest.raises(pytest.UsageError) as raised:
        ConformanceSession(SimpleNamespace(getoption=chosen.__getitem__))
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)
    assert not out.exists() and (tmp_path / "FILE").read_text() == "not a directory"


def test_the_out_dir_is_checked_on_the_controller_only_and_written_at_the_end(tmp_path):
    from harness.pytest_plugin import ConformanceSession

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("not a run")
    worker = ConformanceSession(SimpleNamespace(getoption={**OPTIONS, "muon_out": busy}.__getitem__,
                                                workerinput={"workerid": "gw0"}))
    assert not worker.is_controller
    with pytest.raises(pytest.UsageError, match="--muon-out .*busy: holds 1 entries and no stored run"):
        ConformanceSession(SimpleNamespace(getoption={**OPTIONS, "muon_out": busy}.__getitem__))
    controller = ConformanceSession(SimpleNamespace(getoption={**OPTIONS, "muon_out": tmp_path / "c"}.__getitem__))
    assert controller.is_controller and not (tmp_path / "c").exists()  # the session's end writes it whole
    assert [c.id for c in controller.cases] == [LINEAR]


def test_entry_point_is_declared():
    try:
        dist = importlib.metadata.distribution("muon-conformance")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the project is not installed (pip install -e .)")
    points = [ep for ep in dist.entry_points if ep.group == "pytest11"]
    assert [(ep.name, ep.value) for ep in points] == [("harness.pytest_plugin", "harness.pytest_plugin")]


def test_entry_point_in_pyproject():
    """The declaration itself, for runs where the project is not installed."""
    tomllib = pytest.importorskip("tomllib")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    assert declared == {"harness.pytest_plugin": "harness.pytest_plugin"}


def test_failure_text_names_checks_diagnosis_and_both_repros():
    """The message of a failing case, on records as the runner writes them (ratio NaN for an error)."""
    import dataclasses
    import math

    from harness.pytest_plugin import CaseFailed
    from harness.runner import repro_command
    from reports import Record

    repro = repro_command(Case.from_id(CONV), "ours", "cpu")
    common = dict(case_id=CONV, target="ours", backend="cpu", world_size=1, layout="single", optimizer="muon",
                  layer="conv1d", shape="8x4x5", megabatch=1, flatten=True, param_dtype="fp32", compute_dtype="fp32",
                  orthogonalizer="polar_express", repro=repro)
    records = [Record(check="reference", status="fail", ratio=12.5, tolerance=2e-5, tolerance_source="policy fp32",
                      message="worst at member 0 step 1", **common),
               Record(check="megabatch", status="error", message="target raised: boom", **common),
               Record(check="equiv2d", status="pass", ratio=0.5, **common)]
    has_diagnosis = "diagnosis" in {f.name for f in dataclasses.fields(records[0])}
    if has_diagnosis:
        records = [dataclasses.replace(r, diagnosis="lr scale off by a constant factor") if r.failing else r
                   for r in records]
    text = CaseFailed(records, "pytest --muon-select=X").describe().splitlines()
    assert text[:4] == ["FAIL reference (ratio 12.5, rtol 2e-05; policy fp32)", "    worst at member 0 step 1",
                        "ERROR megabatch", "    target raised: boom"]
    assert text[-3:] == ["other checks: equiv2d pass", f"repro: {repro}", "repro in pytest: pytest --muon-select=X"]
    assert ("diagnosis: lr scale off by a constant factor" in text) == has_diagnosis
    assert not any("nan" in line for line in text) and math.isnan(records[1].ratio)
