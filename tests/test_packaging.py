"""The project builds as pip builds it without setuptools' "Package ... is absent from the `packages`
configuration" warning (about 30 lines in every `pip install`), and its wheel holds the data files the
harness reads (harness/policy/data/, reports/tp_dependence.json). The negative control: a package-data
folder under an explicit package list, the configuration that used to warn, warns in the same build."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("optimizers", "oracles", "cases", "harness", "reports")
WARNING = "is absent from the `packages` configuration"


def build_wheel(project: Path) -> tuple[str, list[str]]:
    """Build `project`'s wheel with setuptools' PEP 517 backend, every warning shown; (its output, the
    wheel's file names)."""
    pytest.importorskip("setuptools")
    done = subprocess.run([sys.executable, "-W", "always", "-c",
                           "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))",
                           str(project / "dist")], cwd=project, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    wheel = project / "dist" / done.stdout.strip().splitlines()[-1]
    return done.stdout + done.stderr, zipfile.ZipFile(wheel).namelist()


def test_the_project_builds_without_the_package_data_warning_and_ships_its_data(tmp_path):
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    output, files = build_wheel(tmp_path)
    assert WARNING not in output, output
    data = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "harness" / "policy" / "data").glob("*.json"))
    assert data and set(data) | {"reports/tp_dependence.json"} <= set(files), files


def test_a_data_folder_under_an_explicit_package_list_warns(tmp_path):
    (tmp_path / "pkg" / "data").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "data" / "table.json").write_text("{}")
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "explicit"
        version = "0"

        [tool.setuptools]
        packages = ["pkg"]

        [tool.setuptools.package-data]
        pkg = ["data/*.json"]
        """))
    output, _ = build_wheel(tmp_path)
    assert f"Package 'pkg.data' {WARNING}" in output, output
