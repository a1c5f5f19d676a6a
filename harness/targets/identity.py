"""The identity of code that runs: which module, imported from which file, of which installed
distribution and version, in which git checkout at which commit (`reports.records.CodeIdentity`).

  distribution, version  the installed distribution that holds the very file imported: the file is
                         listed in its RECORD, or it is an editable install whose project directory
                         contains the file. A distribution of the same name installed elsewhere says
                         nothing about the file imported, so it is not named.
  commit, dirty          HEAD of the git checkout holding the file, and whether its tracked files
                         differ from HEAD or the file itself is not tracked yet (other untracked files
                         do not count, as in `git describe --dirty`); none where the checkout ignores
                         the file (a virtual environment inside a repository is not its code).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote, urlparse

from reports.records import CodeIdentity

GIT_SECONDS = 30
"""How long one git query may take before the commit counts as unknown."""


def module_identity(name: str) -> CodeIdentity:
    """The identity of module `name` (imported if it is not yet); ImportError if it cannot be imported."""
    module = importlib.import_module(name)
    where = getattr(module, "__file__", None)
    if not where:
        return CodeIdentity(module=name)
    path = Path(where).resolve()
    distribution, version = _owning_distribution(name.partition(".")[0], path)
    commit, dirty = _git_state(path)
    return CodeIdentity(module=name, file=str(path), distribution=distribution, version=version, commit=commit,
                        dirty=dirty)


def _owning_distribution(top_level: str, path: Path) -> tuple[str, str]:
    """(name, version) of the installed distribution providing top-level package `top_level` whose files
    include `path`; ("", "") when none does."""
    for name in _providers(tuple(sys.path)).get(top_level, []):
        for dist in importlib.metadata.distributions(name=name):
            if _holds(dist, path):
                return dist.metadata["Name"], dist.version
    return "", ""


@functools.cache
def _providers(path: tuple[str, ...]) -> Mapping[str, list[str]]:
    """Top-level package -> the distributions providing it, on sys.path `path`: a scan of every installed
    distribution (~0.7 s in a venv of ~100), made once per path (a run names the judged code and the
    harness: two lookups)."""
    return importlib.metadata.packages_distributions()


def _holds(dist: importlib.metadata.Distribution, path: Path) -> bool:
    """Whether `path` is one of `dist`'s installed files, or lies in the project directory of an
    editable install of it."""
    if any(Path(dist.locate_file(f)).resolve() == path for f in dist.files or []):
        return True
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
    except json.JSONDecodeError:
        return False
    url = urlparse(direct.get("url", ""))
    if url.scheme != "file" or not direct.get("dir_info", {}).get("editable"):
        return False
    return Path(unquote(url.path)).resolve() in path.parents


def _git_state(path: Path) -> tuple[str, bool]:
    """(HEAD commit, dirty) of the git checkout holding file `path`; ("", False) outside one, or where
    the checkout ignores the file (a virtual environment inside a repository is not its code). A file
    the checkout does not track yet makes it dirty."""
    commit = _git(path.parent, "rev-parse", "--verify", "--quiet", "HEAD")
    if not commit or _git(path.parent, "check-ignore", "--quiet", "--", str(path)) is not None:
        return "", False
    changes = _git(path.parent, "status", "--porcelain", "--untracked-files=no")
    tracked = _git(path.parent, "ls-files", "--error-unmatch", "--", str(path)) is not None
    return commit, changes != "" or not tracked


def _git(directory: Path, *args: str) -> str | None:
    """stdout of `git ARGS` run in `directory`, stripped; None when git is missing or fails."""
    try:
        done = subprocess.run(["git", *args], cwd=directory, capture_output=True, text=True, timeout=GIT_SECONDS)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
