"""Runs name the code they judged: the target module's installed distribution (only when it holds the very
file imported), its git commit and dirty flag (harness/targets/identity.py); `CodeIdentity.same_code`; the
default `Target.version()`; run.json, report.html, summary.md and the diff show them, and the diff says when
base and head judged the same code."""

from __future__ import annotations

import dataclasses
import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.targets.base import Target
from harness.targets.identity import module_identity
from reports import RunInfo, load_run, render_html, render_markdown, save_run
from reports.diff import diff_runs
from reports.diff_html import render_diff_html, render_diff_markdown, same_code_note
from reports.records import CodeIdentity

ADAPTER = '''
from harness.targets.base import Target


class Plain(Target):
    name = "plain"

    def conventions(self, case):
        raise NotImplementedError

    def run(self, params, grads, case):
        raise NotImplementedError
'''


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def fresh_modules():
    """Modules imported by a test are forgotten afterwards (each test writes its own under one name)."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


def package(root: Path, name: str, body: str = "") -> Path:
    """root/name/__init__.py holding `body`; returns the file."""
    (root / name).mkdir(parents=True)
    path = root / name / "__init__.py"
    path.write_text(body)
    return path


def importable(monkeypatch, root: Path) -> None:
    monkeypatch.syspath_prepend(str(root))


@pytest.fixture
def repo(tmp_path, monkeypatch, fresh_modules) -> Path:
    """A git repository holding package `idpkg` (the adapter above), committed, on the path."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "repo"
    package(root, "idpkg", ADAPTER)
    (root / ".gitignore").write_text("venv/\n")
    git(root, "init", "-q")
    git(root, "config", "user.email", "t@example.invalid")
    git(root, "config", "user.name", "t")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "one")
    importable(monkeypatch, root)
    return root


def test_a_module_in_a_clean_checkout_has_its_commit(repo):
    found = module_identity("idpkg")
    assert found == CodeIdentity(module="idpkg", file=str((repo / "idpkg" / "__init__.py").resolve()),
                                 commit=git(repo, "rev-parse", "HEAD"), dirty=False)
    assert found.describe() == f"commit {found.commit[:12]}"


def test_a_changed_tracked_file_or_an_untracked_module_is_dirty_other_untracked_files_are_not(repo):
    (repo / "notes.txt").write_text("an untracked file elsewhere")
    assert not module_identity("idpkg").dirty
    (repo / "idpkg" / "extra.py").write_text("X = 1\n")  # the module imported is not committed yet
    importlib.invalidate_caches()
    assert module_identity("idpkg.extra").dirty
    (repo / "idpkg" / "__init__.py").write_text(ADAPTER + "\n# edited\n")
    assert module_identity("idpkg").dirty and module_identity("idpkg").describe().endswith("(dirty)")


def test_a_file_the_checkout_ignores_is_not_its_code(repo, monkeypatch):
    """A virtual environment inside the repository: its packages do not get the repository's commit."""
    package(repo / "venv" / "site", "vendored")
    importable(monkeypatch, repo / "venv" / "site")
    assert module_identity("vendored") == CodeIdentity(
        module="vendored", file=str((repo / "venv" / "site" / "vendored" / "__init__.py").resolve()))
    assert module_identity("vendored").describe() == "unversioned"


def dist_info(site: Path, name: str, version: str, files: list[str], editable_dir: Path | None = None) -> None:
    """An installed distribution's metadata in `site`: its RECORD lists `files` (relative to site)."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"  # as installers name it
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text("distpkg\n")
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files))
    if editable_dir is not None:
        (info / "direct_url.json").write_text(json.dumps({"url": editable_dir.resolve().as_uri(),
                                                          "dir_info": {"editable": True}}))


@pytest.mark.parametrize("layout, expected", [
    ("installed", ("dist-pkg", "1.2.3")),           # RECORD lists the file imported
    ("editable", ("dist-pkg", "1.2.3")),            # an editable install of the directory holding it
    ("shadowed", ("", "")),                         # installed elsewhere; the file imported is another copy
    ("editable-elsewhere", ("", "")),               # an editable install of another directory
])
def test_the_distribution_named_is_the_one_holding_the_file_imported(tmp_path, monkeypatch, fresh_modules, layout,
                                                                     expected):
    site, project, elsewhere = tmp_path / "site", tmp_path / "project", tmp_path / "elsewhere"
    if layout == "installed":
        package(site, "distpkg")
        dist_info(site, "dist-pkg", "1.2.3", ["distpkg/__init__.py"])
        importable(monkeypatch, site)
    elif layout == "shadowed":
        package(site, "distpkg")
        dist_info(site, "dist-pkg", "1.2.3", ["distpkg/__init__.py"])
        package(project, "distpkg")
        importable(monkeypatch, site)
        importable(monkeypatch, project)  # first on the path: the copy imported
    else:
        package(project, "distpkg")
        dist_info(site, "dist-pkg", "1.2.3", [], editable_dir=project if layout == "editable" else elsewhere)
        importable(monkeypatch, site)
        importable(monkeypatch, project)
    found = module_identity("distpkg")
    assert (found.distribution, found.version) == expected
    assert found.describe() == ("dist-pkg 1.2.3" if expected[0] else "unversioned")


def same(**changes: object) -> bool | None:
    base = CodeIdentity(module="m", file="/a/m.py", commit="1" * 40)
    return base.same_code(dataclasses.replace(base, **changes))


def test_same_code_is_told_only_when_it_can_be():
    assert same() is True
    assert same(file="/elsewhere/m.py") is True       # another checkout of the same commit
    assert same(commit="2" * 40) is False
    assert same(module="other") is False
    assert same(dirty=True) is None                   # a dirty side can hold anything
    assert same(commit="", distribution="m", version="1") is None
    installed = CodeIdentity(module="m", distribution="m", version="1.0")
    assert installed.same_code(installed) is True
    assert installed.same_code(dataclasses.replace(installed, version="1.1")) is False
    assert CodeIdentity(module="m").same_code(CodeIdentity(module="m")) is None
    assert CodeIdentity().same_code(CodeIdentity()) is None


def test_the_default_version_is_what_the_adapter_module_knows_not_torchs(repo):
    import torch

    from idpkg import Plain

    version = Plain().version()
    assert version == f"commit {git(repo, 'rev-parse', 'HEAD')[:12]}" and torch.__version__ not in version
    assert isinstance(Plain(), Target)


INFO = RunInfo(target="tiny: commit 111111111111", tier="ci", backends="cpu", command="c", started="s",
               seconds=1.0, torch_version="2.13.0+cpu", commit="2222222",
               judged=CodeIdentity(module="tiny_muon.adapter", file="/r/tiny_muon/adapter.py", distribution="tiny-muon",
                                   version="0.3.0", commit="1" * 40, dirty=True),
               harness=CodeIdentity(module="harness", file="/h/harness/__init__.py", distribution="muon-conformance",
                                    version="0.1.0", commit="2" * 40))


def test_run_json_and_the_reports_name_the_judged_code_and_the_harness(tmp_path):
    save_run([], INFO, tmp_path)
    context = load_run(tmp_path)[1]
    assert CodeIdentity.from_context(context["judged"]) == INFO.judged
    assert CodeIdentity.from_context(context["harness"]) == INFO.harness
    judged = "tiny_muon.adapter (tiny-muon 0.3.0, commit 111111111111 (dirty))"
    harness = "muon-conformance 0.1.0, commit 222222222222"
    page, summary = render_html([], INFO), render_markdown([], INFO)
    assert f"<dt>judged code</dt><dd>{judged}</dd>" in page and f"<dt>harness</dt><dd>{harness}</dd>" in page
    assert f"judged code {judged} · harness {harness}" in summary


def contexts(base: CodeIdentity, head: CodeIdentity) -> tuple[dict, dict]:
    return ({"commit": "2222222", "judged": dataclasses.asdict(base)},
            {"commit": "2222222", "judged": dataclasses.asdict(head)})


def test_the_diff_says_when_base_and_head_judged_the_same_code():
    clean = dataclasses.replace(INFO.judged, dirty=False)
    base_ctx, head_ctx = contexts(clean, clean)
    diff = diff_runs([], [])
    note = ("Base and head judged the same code, tiny_muon.adapter (tiny-muon 0.3.0, commit 111111111111): what "
            "differs between them comes from the harness, torch or the machine, not from the judged code.")
    assert same_code_note(base_ctx, head_ctx) == note
    assert note in render_diff_markdown(diff, base_ctx, head_ctx)
    assert f'<p id="same-code">{note}</p>' in render_diff_html(diff, base_ctx, head_ctx)
    markdown = render_diff_markdown(diff, *contexts(clean, dataclasses.replace(clean, commit="3" * 40)))
    assert markdown.splitlines()[0] == "# OK: conformance diff, head 333333333333 against base 111111111111"


@pytest.mark.parametrize("head", [
    dataclasses.replace(INFO.judged, dirty=False, commit="3" * 40),   # another commit
    INFO.judged,                                                      # dirty: cannot be told
])
def test_the_diff_says_nothing_of_the_kind_when_the_code_differs_or_cannot_be_told(head):
    base_ctx, head_ctx = contexts(dataclasses.replace(INFO.judged, dirty=False), head)
    assert same_code_note(base_ctx, head_ctx) == ""
    assert "judged the same code" not in render_diff_html(diff_runs([], []), base_ctx, head_ctx)
    assert same_code_note({"commit": "2222222"}, {"commit": "2222222"}) == ""  # runs stored before schema 5


def test_the_diff_command_says_it_too(tmp_path, capsys):
    import harness.apps.cli as cli

    clean = dataclasses.replace(INFO, judged=dataclasses.replace(INFO.judged, dirty=False))
    save_run([], clean, tmp_path / "base")
    save_run([], clean, tmp_path / "head")
    save_run([], dataclasses.replace(clean, judged=dataclasses.replace(clean.judged, commit="3" * 40)),
             tmp_path / "other")
    assert cli.main(["diff", str(tmp_path / "base"), str(tmp_path / "head"), "--out", str(tmp_path / "d1")]) == 0
    assert "Base and head judged the same code, tiny_muon.adapter (" in capsys.readouterr().err
    assert cli.main(["diff", str(tmp_path / "base"), str(tmp_path / "other"), "--out", str(tmp_path / "d2")]) == 0
    assert "judged the same code" not in capsys.readouterr().err
