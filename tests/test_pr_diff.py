"""`python -m harness pr-diff` on a local git repository: this project's tracked files committed as
the base, then a head that plants a real bug (exit 1, the new failures named) or a harmless one
(exit 0); usage errors exit 2 before anything runs; and the CI workflow that calls it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from argparse import Namespace
from dataclasses import replace
from pathlib import Path

import pytest

from harness.apps import pr_diff
from reports import COLUMNS, RunInfo, load_run, save_run

ROOT = Path(__file__).resolve().parents[1]

RMS = "muon/linear-12x20/mb1/noflat/fp32@fp32/pe/rms_norm/nesterov/wd0/steps1/gaussian/seed0"
SPECTRAL = "muon/linear-12x20/mb1/noflat/fp32@fp32/ns/spectral_norm/plain/wd0/steps1/gaussian/seed0"
SELECTION = ["--select", RMS, "--select", SPECTRAL]

LR_SCALE = "optimizers/matrix_view.py"
RMS_LINE = "return 0.2 * math.sqrt(max(fan_out, fan_in))"
"""The rms_norm lr scale: the head under test changes its coefficient 0.2 to 0.21."""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """A git repository holding this project's tracked files, committed and tagged `base`."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path_factory.mktemp("repo")
    for name in git(ROOT, "ls-files", "-z").split("\0"):
        source = ROOT / name
        if name and source.is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    git(root, "init", "-q")
    git(root, "config", "user.email", "ci@example.invalid")
    git(root, "config", "user.name", "pr-diff test")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")
    git(root, "tag", "base")
    return root


def head_commit(repo: Path, branch: str, path: str, old: str, new: str) -> None:
    """Branch `branch` off `base` with `old` replaced by `new` (exactly once) in `path`, committed."""
    git(repo, "checkout", "-q", "-B", branch, "base")
    text = (repo / path).read_text()
    assert text.count(old) == 1, f"{path} no longer holds {old!r} exactly once; update this test"
    (repo / path).write_text(text.replace(old, new))
    git(repo, "commit", "-q", "-am", branch)


def harness(repo: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m harness ARGS` run from `repo` (so the repository's own code is imported)."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GITHUB_STEP_SUMMARY")}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=repo, env={**clean, **(env or {})},
                          capture_output=True, text=True, timeout=600)


def worktrees(repo: Path) -> list[str]:
    return [line for line in git(repo, "worktree", "list", "--porcelain").splitlines() if line.startswith("worktree ")]


def test_a_planted_bug_regresses(repo, tmp_path):
    head_commit(repo, "wrong-rms-scale", LR_SCALE, RMS_LINE, RMS_LINE.replace("0.2 *", "0.21 *"))
    summary = tmp_path / "step-summary.md"
    summary.write_text("earlier step\n")
    out = tmp_path / "diff"
    result = harness(repo, "pr-diff", "--base-ref", "base", "--out", str(out), *SELECTION,
                     env={"GITHUB_STEP_SUMMARY": str(summary)})
    log = result.stdout + result.stderr
    assert result.returncode == 1, log

    markdown = (out / "diff.md").read_text()
    assert markdown.startswith("# REGRESSED"), markdown
    sections = {part.split(" (")[0]: part for part in markdown.split("\n## ")[1:]}
    assert f"`{RMS}`" in sections["new failures"] and SPECTRAL not in sections["new failures"], markdown
    assert (out / "diff.html").stat().st_size > 0
    assert summary.read_text() == "earlier step\n" + markdown + "\n"

    base, base_ctx = load_run(out / "base-run")
    head, head_ctx = load_run(out / "head-run")
    assert {r.status for r in base} == {"pass"}, "the base's code must have run in the base run"
    assert {r.status for r in head if r.case_id == RMS} >= {"fail"}
    assert git(repo, "rev-parse", "--short", "base").startswith(base_ctx["commit"])
    assert git(repo, "rev-parse", "--short", "HEAD").startswith(head_ctx["commit"])
    assert len(worktrees(repo)) == 1, "the base's worktree must be removed"


@pytest.mark.slow
def test_a_harmless_head_passes_reusing_its_run_as_ci_does(repo, tmp_path):
    """CI's layout: the head's run in out/, the diff into out/diff/ (inside that run's directory)."""
    head_commit(repo, "harmless", LR_SCALE, RMS_LINE, RMS_LINE + "  # the rms_norm convention's 0.2")
    head_run = tmp_path / "out"
    assert harness(repo, "run", "--out", str(head_run), *SELECTION).returncode == 0
    out = head_run / "diff"
    result = harness(repo, "pr-diff", "--base-ref", "base", "--head-run", str(head_run), "--out", str(out),
                     *SELECTION)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (out / "diff.md").read_text().startswith("# OK"), (out / "diff.md").read_text()
    assert "pr-diff: head" not in result.stderr, "--head-run is reused, not run again"
    assert load_run(out / "head-run")[0] == load_run(head_run)[0]
    assert len(worktrees(repo)) == 1


def usage(tmp_path: Path, **overrides: object) -> Namespace:
    return Namespace(**{"base_ref": "base", "head_run": None, "out": tmp_path / "out", "select": [RMS],
                        "target": None, "pythonpath": Path("."), **overrides})


@pytest.mark.parametrize("overrides, where, message", [
    ({"base_ref": "no-such-ref"}, "repo", "--base-ref 'no-such-ref' names no commit of"),
    ({}, "outside", "not inside a git repository"),
    ({"head_run": Path("empty")}, "repo", "--head-run: "),
    ({"out": Path("a-file")}, "repo", "exists and is not a directory"),
    ({"select": ["no-such-case"]}, "repo", "--select ['no-such-case']: no case of tier 'ci' matches"),
    ({"target": "tourch"}, "repo", "--target: target 'tourch' is neither an alias nor MODULE:CALLABLE; did you mean"),
    ({"pythonpath": Path("no-such-dir")}, "repo", "--pythonpath no-such-dir: not a directory of the repository"),
    ({"pythonpath": Path("..")}, "repo", "--pythonpath ..: not a directory of the repository"),
])
def test_usage_errors_exit_2_before_anything_runs(repo, tmp_path, monkeypatch, capsys, overrides, where, message):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-file").write_text("")
    args = usage(tmp_path, **{k: tmp_path / v if k in ("head_run", "out") else v for k, v in overrides.items()})
    monkeypatch.chdir(repo if where == "repo" else outside)
    ran = []
    monkeypatch.setattr(pr_diff, "_harness_run", lambda *a: ran.append(a))
    assert pr_diff.command(args) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 1 and errors[0].startswith("python -m harness pr-diff: error: ") and message in errors[0], \
        errors
    assert ran == [] and not (tmp_path / "out").exists() and len(worktrees(repo)) == 1


def test_a_base_run_that_stores_nothing_is_an_error_and_removes_the_worktree(repo, tmp_path, monkeypatch, capsys):
    """A base whose harness cannot run gives exit 2, never a verdict, and leaves no worktree."""
    git(repo, "checkout", "-q", "base")
    monkeypatch.chdir(repo)
    head = tmp_path / "head"
    save_run([], RunInfo(target="ours", tier="ci", backends="cpu", command="", started="", seconds=0.0,
                         torch_version="", commit=sha(repo)), head)  # a stored run of no records, of HEAD
    trees = []

    def base_fails(checkout: Path, pythonpath: Path, out: Path, options: list[str], which: str) -> None:
        trees.append(checkout)
        assert (checkout / "harness" / "apps" / "cli.py").is_file(), "a checkout of the base"
        raise pr_diff.PrDiffError(f"the {which} run exited with status 2, so there is nothing to compare")

    monkeypatch.setattr(pr_diff, "_harness_run", base_fails)
    assert pr_diff.command(usage(tmp_path, head_run=head)) == 2
    assert "error: the base base (" in capsys.readouterr().err
    assert len(trees) == 1 and not trees[0].exists() and len(worktrees(repo)) == 1
    assert not (tmp_path / "out" / "diff.md").exists()


def sha(repo: Path) -> str:
    """The commit checked out in `repo` (what a --head-run of it must record)."""
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_base_run_of_another_commit_is_refused(repo, tmp_path, monkeypatch, capsys):
    """The base run must record the base's commit: a run made by another checkout's harness (say, the
    head's, picked up through an installed package) would compare the head with itself."""
    git(repo, "checkout", "-q", "base")
    monkeypatch.chdir(repo)
    head = tmp_path / "head"
    info = RunInfo(target="ours", tier="ci", backends="cpu", command="", started="", seconds=0.0, torch_version="",
                   commit="0000000")
    save_run([], replace(info, commit=sha(repo)), head)
    monkeypatch.setattr(pr_diff, "_harness_run", lambda checkout, pythonpath, out, options, which:
                        save_run([], info, out))
    assert pr_diff.command(usage(tmp_path, head_run=head)) == 2
    error = capsys.readouterr().err
    assert "error: the base base (" in error and ") run records commit 0000000, not " in error, error
    assert not (tmp_path / "out" / "diff.md").exists() and len(worktrees(repo)) == 1


def test_workflow_runs_pr_diff_on_pull_requests():
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())
    steps = workflow["jobs"]["conformance"]["steps"]
    checkout = next(s for s in steps if str(s.get("uses", "")).startswith("actions/checkout"))
    assert checkout["with"]["fetch-depth"] == 0
    diff = next(s for s in steps if "harness pr-diff" in s.get("run", ""))
    assert "github.event_name == 'pull_request'" in diff["if"]
    assert diff["env"]["BASE_REF"] == "${{ github.base_ref }}"
    assert '--base-ref "origin/$BASE_REF" --head-run out --out out/diff' in diff["run"]
    uploads = [s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert any("out/diff/diff.html" in s["with"]["path"] for s in uploads)


def test_sigterm_during_the_base_run_removes_the_worktree(repo, tmp_path):
    """A cancelled CI job: pr-diff is terminated while the base runs; the worktree goes with it."""
    git(repo, "checkout", "-q", "base")
    head = tmp_path / "head"
    save_run([], RunInfo(target="ours", tier="ci", backends="cpu", command="", started="", seconds=0.0,
                         torch_version="", commit=sha(repo)), head)
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GITHUB_STEP_SUMMARY")}
    process = subprocess.Popen([sys.executable, "-m", "harness", "pr-diff", "--base-ref", "base", "--head-run",
                                str(head), "--out", str(tmp_path / "out"), *SELECTION], cwd=repo, env=clean,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(worktrees(repo)) == 1 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(worktrees(repo)) == 2, "the base's worktree never appeared"
        tree = Path(worktrees(repo)[1].removeprefix("worktree "))
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 128 + signal.SIGTERM, process.stderr.read()
    finally:
        process.kill()
        process.wait()
    assert len(worktrees(repo)) == 1 and not tree.exists() and not tree.parent.exists()
