"""Tests marked `slow` leave CI for the night, and nowhere else: CI's command deselects them, the nightly
workflow runs them (docs/contributing.md, "The CI job")."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DESELECT = 'python -m pytest -n auto -m "not slow"'


def test_ci_deselects_the_slow_tests_and_the_nightly_runs_them():
    yaml = pytest.importorskip("yaml")
    assert DESELECT in (ROOT / ".ci" / "run").read_text().splitlines()
    assert DESELECT in (ROOT / "docs" / "contributing.md").read_text().splitlines()
    ci = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())
    assert DESELECT in [s.get("run") for s in ci["jobs"]["conformance"]["steps"]]
    nightly = yaml.safe_load((ROOT / ".github" / "workflows" / "nightly.yml").read_text())
    jobs = [job for job in nightly["jobs"].values()
            if "python -m pytest -n auto -m slow" in [s.get("run") for s in job["steps"]]]
    assert len(jobs) == 1
    installs = " ".join(s.get("run", "") for s in jobs[0]["steps"])
    assert "'.[test,mutation]'" in installs  # the slow mutation run needs the extra
    assert next(s for s in jobs[0]["steps"] if "checkout" in str(s.get("uses")))["with"]["fetch-depth"] == 0

