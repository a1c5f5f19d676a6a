"""The global tiers, generated once per version of their generator and then read back.

Building the CI tier's covering arrays takes about 3 s, the nightly tier's about 6 s (2 CPU cores), and
every process that judges pays it: each `python -m harness` command, each pytest-xdist worker, each
process of a CI job. A tier is a pure function of this package's source (seeded draws, no clock, no
torch), so its case ids are stored under the user's cache folder, named by a digest of every source file
of `cases` and of the Python and NumPy versions, and a process with the same source reads them (about
0.1 s). Any edit of the generator changes the digest: a stored tier is never read for other code.

The folder is $MUON_CONFORMANCE_CACHE, else $XDG_CACHE_HOME/muon-conformance, else
~/.cache/muon-conformance; MUON_CONFORMANCE_CACHE=off generates every time. A folder that cannot be
written, or a stored file that cannot be read back into the same cases, only costs the generation.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from cases.case import Case

PACKAGE = Path(__file__).resolve().parent
OFF = "off"


@functools.cache
def source_digest() -> str:
    """sha256 of every source file of the `cases` package (path and bytes), the Python and NumPy versions."""
    digest = hashlib.sha256(f"python {sys.version_info[:2]} numpy {np.__version__}\n".encode())
    for path in sorted(PACKAGE.rglob("*.py")):
        digest.update(f"{path.relative_to(PACKAGE).as_posix()}\n".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def folder() -> Path | None:
    """Where the tiers are stored (module docstring); None when storing is off."""
    chosen = os.environ.get("MUON_CONFORMANCE_CACHE")
    if chosen == OFF:
        return None
    if chosen:
        return Path(chosen)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "muon-conformance"


def tier_file(name: str) -> Path | None:
    where = folder()
    return None if where is None else where / f"tier-{name}-{source_digest()}.txt"


def stored_or_generated(name: str, generate: Callable[[], tuple[Case, ...]]) -> tuple[Case, ...]:
    """Tier `name` as stored for this source, else `generate()`d and stored (when its ids read back as the
    same cases, and the folder can be written: atomically, so a reader never sees half a file)."""
    path = tier_file(name)
    if path is not None:
        try:
            return tuple(Case.from_id(i) for i in path.read_text().splitlines())
        except (OSError, ValueError):
            pass
    cases = generate()
    if path is not None and all(Case.from_id(c.id) == c for c in cases):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as out:
                out.write("".join(f"{c.id}\n" for c in cases))
            os.replace(out.name, path)
        except OSError:
            pass
    return cases
