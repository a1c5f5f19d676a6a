"""The optimizer author's loop: a repository of their own (a tiny Muon and its adapter, no harness in it),
pushed to an origin, with the workflow template docs/ci/muon-conformance.yml copied in. A pull request's
branch is judged by running that workflow's pr-diff step itself: a planted regression fails it (exit 1), a
harmless change passes (exit 0), each run names the commit it judged. The harness is installed once (here:
this checkout on PYTHONPATH, as `pip install` would put it on the path), outside the user's repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reports import CodeIdentity, load_run

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "docs" / "ci" / "muon-conformance.yml"
TARGET = "tiny_muon.conformance:target"
OUT = "muon-conformance"
CASE = "muon/linear_row-1x16/mb2/noflat/fp32@fp32/ns/spectral_norm/nesterov/wd0/steps3/lowrank/seed0"
"""The CI tier's case that the tiny Muon below supports (every other is unsupported by its adapter)."""

OPTIMIZER = '''
"""A tiny Muon for 2-D weights: sum momentum, Nesterov, Newton-Schulz (5 quintic steps) in fp32."""
import torch


def orthogonalize(update, steps=5, eps=1e-7):
    a, b, c = 3.4445, -4.7750, 2.0315
    x = update.float() / (update.float().norm() + eps)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x


class TinyMuon(torch.optim.Optimizer):
    def __init__(self, params, lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                buf = self.state[p].setdefault("momentum", torch.zeros_like(p, dtype=torch.float32))
                buf.mul_(mu).add_(p.grad)
                update = p.grad + mu * buf if group["nesterov"] else buf
                scale = max(1.0, p.shape[0] / p.shape[1]) ** 0.5
                p.mul_(1 - lr * wd)
                p.add_(orthogonalize(update).to(p.dtype), alpha=-lr * scale)
'''

ADAPTER = '''
"""The harness's view of TinyMuon."""
from harness.targets import OptimizerTarget
from oracles import Conventions, Orthogonalizer

from tiny_muon.optimizer import TinyMuon


class TinyMuonTarget(OptimizerTarget):
    name = "tiny-muon"

    def unsupported(self, case):
        if case.optimizer != "muon" or len(case.shape) != 2 or case.orthogonalizer != "newton_schulz":
            return "TinyMuon is Muon with Newton-Schulz for 2-D weights only"
        if case.compute_dtype != "fp32" or case.adjust_lr != "spectral_norm":
            return "TinyMuon computes in fp32 with one lr scale, sqrt(max(1, fan_out/fan_in))"
        return None

    def conventions(self, case):
        return Conventions(orthogonalizer=Orthogonalizer.named("newton_schulz", eps=1e-7, normaliser_form="plus"),
                           momentum="sum", nesterov="sum", weight_decay_order="before", weight_decay_lr="base",
                           lr_scale="spectral_norm_clamped", lr_dims="first_two", compute_dtype="fp32")

    def make(self, params, case):
        return TinyMuon(params, lr=case.lr, momentum=case.momentum, nesterov=case.nesterov,
                        weight_decay=case.weight_decay)


def target():
    return TinyMuonTarget()
'''

NESTEROV = 'update = p.grad + mu * buf if group["nesterov"] else buf'
REGRESSION = (NESTEROV, 'update = p.grad + buf if group["nesterov"] else buf')
"""The planted bug: Nesterov's look-ahead without the momentum coefficient."""
HARMLESS = ("x = update.float() / (update.float().norm() + eps)",
            "norm = update.float().norm()\n    x = update.float() / (norm + eps)")
"""A refactoring that computes the same numbers."""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def user_repo(tmp_path) -> Path:
    """The user's clone of their repository: main (the tiny Muon, its adapter and the workflow template)
    pushed to a bare origin, as a pull request's checkout sees it."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    origin, work = tmp_path / "origin.git", tmp_path / "work"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))
    git(tmp_path, "clone", "-q", str(origin), str(work))
    git(work, "config", "user.email", "author@example.invalid")
    git(work, "config", "user.name", "optimizer author")
    (work / "tiny_muon").mkdir()
    (work / "tiny_muon" / "__init__.py").write_text("")
    (work / "tiny_muon" / "optimizer.py").write_text(textwrap.dedent(OPTIMIZER).lstrip())
    (work / "tiny_muon" / "conformance.py").write_text(textwrap.dedent(ADAPTER).lstrip())
    (work / ".github" / "workflows").mkdir(parents=True)
    shutil.copy(TEMPLATE, work / ".github" / "workflows" / "muon-conformance.yml")
    git(work, "checkout", "-q", "-b", "main")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "tiny Muon and its conformance workflow")
    git(work, "push", "-q", "origin", "main")
    return work


def pull_request(repo: Path, branch: str, change: tuple[str, str]) -> str:
    """Branch `branch` off origin/main with `change` (old, new) made once in the optimizer; its commit."""
    git(repo, "checkout", "-q", "-B", branch, "origin/main")
    path = repo / "tiny_muon" / "optimizer.py"
    text = path.read_text()
    assert text.count(change[0]) == 1, change
    path.write_text(text.replace(change[0], change[1]))
    git(repo, "commit", "-q", "-am", branch)
    return git(repo, "rev-parse", "HEAD")


def installed_harness_env(summary: Path) -> dict[str, str]:
    """The environment of a job where the harness is installed (this checkout on the path) and `python` is
    this interpreter, GitHub's step summary file at `summary`."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH", "GITHUB_STEP_SUMMARY")}
    return {**env, "PYTHONPATH": str(ROOT), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
            "GITHUB_STEP_SUMMARY": str(summary)}


def workflow() -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(TEMPLATE.read_text())


def steps() -> list[dict]:
    (job,) = workflow()["jobs"].values()
    return job["steps"]


def pr_diff_step() -> dict:
    (step,) = [s for s in steps() if "harness pr-diff" in s.get("run", "")]
    return step


def run_the_workflow_step(repo: Path, summary: Path) -> subprocess.CompletedProcess:
    """The template's pr-diff step, its script as written, run by bash -e as GitHub runs it, on a pull
    request into main, with MUON_TARGET set to the tiny Muon's adapter (the value a user edits)."""
    step = pr_diff_step()
    env = {**workflow()["env"], **step["env"]}
    assert env["BASE_REF"] == "${{ github.base_ref }}"
    env.update(BASE_REF="main", MUON_TARGET=TARGET)
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=repo,
                          env={**installed_harness_env(summary), **env}, capture_output=True, text=True,
                          timeout=900)


def check_runs_judged(out: Path, base: str, head: str) -> None:
    """Each stored run judged the user's adapter at its own commit, from its own checkout."""
    for run, commit in (("base-run", base), ("head-run", head)):
        judged = CodeIdentity.from_context(load_run(out / run)[1]["judged"])
        assert (judged.module, judged.commit, judged.dirty) == ("tiny_muon.conformance", commit, False), judged
        assert judged.file.endswith("tiny_muon/conformance.py")


def test_the_workflow_fails_a_pull_request_that_plants_a_regression(user_repo, tmp_path):
    head = pull_request(user_repo, "forgets-mu", REGRESSION)
    summary = tmp_path / "summary.md"
    result = run_the_workflow_step(user_repo, summary)
    log = result.stdout + result.stderr
    assert result.returncode == 1, log
    out = user_repo / OUT
    markdown = (out / "diff.md").read_text()
    assert markdown.startswith(f"# REGRESSED: conformance diff, head {head[:12]} against base "
                               f"{git(user_repo, 'rev-parse', 'origin/main')[:12]}"), markdown
    assert f"`{CASE}`" in markdown.split("\n## new failures")[1], markdown
    assert summary.read_text() == markdown + "\n"
    assert sorted(p.name for p in out.iterdir()) == ["base-run", "diff.html", "diff.md", "head-run"]
    check_runs_judged(out, git(user_repo, "rev-parse", "origin/main"), head)
    assert "another checkout" not in log and len(git(user_repo, "worktree", "list").splitlines()) == 1


@pytest.mark.slow
def test_the_workflow_passes_a_harmless_pull_request(user_repo, tmp_path):
    head = pull_request(user_repo, "refactor", HARMLESS)
    result = run_the_workflow_step(user_repo, tmp_path / "summary.md")
    assert result.returncode == 0, result.stdout + result.stderr
    out = user_repo / OUT
    assert (out / "diff.md").read_text().startswith("# OK: conformance diff, head "), (out / "diff.md").read_text()
    check_runs_judged(out, git(user_repo, "rev-parse", "origin/main"), head)
    title = (out / "head-run" / "report.html").read_text()
    assert f"Muon conformance of tiny-muon: commit {head[:12]} (--target {TARGET})" in title


def test_the_template_checks_out_history_installs_the_harness_and_uploads_the_report():
    """The steps around the one the tests above run: what they need from the job."""
    checkout, python, install, diff, upload = steps()
    assert checkout["uses"].startswith("actions/checkout@") and checkout["with"]["fetch-depth"] == 0
    assert python["uses"].startswith("actions/setup-python@")
    assert "download.pytorch.org/whl/cpu" in install["run"] and 'pip install "$MUON_CONFORMANCE"' in install["run"]
    assert workflow()["env"]["MUON_CONFORMANCE"].startswith("muon-conformance @ git+")
    assert diff["run"] == (f'python -m harness pr-diff --base-ref "origin/$BASE_REF" --target "$MUON_TARGET" '
                           f"--out {OUT}")
    assert upload["uses"].startswith("actions/upload-artifact@") and upload["with"]["path"] == f"{OUT}/"
    assert upload["if"] == "${{ !cancelled() }}"
    triggers = workflow().get("on", workflow().get(True))  # YAML 1.1 reads a bare `on` as true
    assert list(triggers) == ["pull_request"]


def harness(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=repo, env=installed_harness_env(repo / "summary.md"),
                          capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_a_plugin_run_serves_as_the_head_run(user_repo, tmp_path):
    """The pytest plugin user's PR diff: the session's --muon-out run is the head, pr-diff runs the base."""
    head = pull_request(user_repo, "forgets-mu", REGRESSION)
    session = harness(user_repo, "pytest", "-p", "no:cacheprovider", f"--muon-target={TARGET}",
                      f"--muon-select={CASE}", f"--muon-out={tmp_path / 'plugin-run'}", "-q")
    assert session.returncode == 1, session.stdout + session.stderr  # the case fails: the bug is caught
    result = harness(user_repo, "harness", "pr-diff", "--base-ref", "origin/main", "--target", TARGET,
                     "--head-run", str(tmp_path / "plugin-run"), "--select", CASE, "--out", str(tmp_path / "diff"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "pr-diff: head" not in result.stderr, "the plugin's run is reused, not run again"
    check_runs_judged(tmp_path / "diff", git(user_repo, "rev-parse", "origin/main"), head)


def test_without_target_the_harness_own_optimizer_is_refused_not_diffed(user_repo, tmp_path):
    """The report of issue 27: in a user's repository pr-diff judged our optimizer twice. That run judged
    code outside the user's checkout, so it is an error that says what to pass."""
    pull_request(user_repo, "refactor", HARMLESS)
    result = harness(user_repo, "harness", "pr-diff", "--base-ref", "origin/main", "--select", CASE,
                     "--out", str(tmp_path / "diff"))
    error = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2, result.stdout + result.stderr
    assert error.startswith("python -m harness pr-diff: error: the head run judged harness.targets.ours from "), error
    assert "name your adapter with --target MODULE:CALLABLE" in error
    assert not (tmp_path / "diff" / "diff.md").exists() and "pr-diff: base" not in result.stderr
