"""The reviewed list of equivalent mutants (equivalent.toml beside this module).

A survivor is equivalent when no input can tell it from the original: each entry names it by its
signature (module, the original lines, the mutated lines: mutants.Mutant.signature) and says why in
one line. An entry whose mutant a judge kills is wrong, and the report says so.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

LIST = Path(__file__).with_name("equivalent.toml")
FIELDS = ("module", "before", "after", "reason")


@dataclass(frozen=True)
class Equivalent:
    module: str
    before: str
    after: str
    reason: str

    @property
    def signature(self) -> tuple[str, str, str]:
        return (self.module, self.before, self.after)


def load(path: Path = LIST) -> dict[tuple[str, str, str], Equivalent]:
    """The entries by signature. ValueError, naming the entry, for a missing or empty field, an unknown
    field, or a signature listed twice."""
    raw = tomllib.loads(path.read_text()) if path.exists() else {}
    unknown_tables = set(raw) - {"equivalent"}
    if unknown_tables:
        raise ValueError(f"{path}: unknown tables {sorted(unknown_tables)}; expected only [[equivalent]]")
    out: dict[tuple[str, str, str], Equivalent] = {}
    for i, entry in enumerate(raw.get("equivalent", [])):
        where = f"{path}: equivalent entry {i + 1}"
        extra = set(entry) - set(FIELDS)
        if extra:
            raise ValueError(f"{where}: unknown fields {sorted(extra)}; expected {FIELDS}")
        for name in FIELDS:
            value = entry.get(name)
            if not isinstance(value, str) or (not value.strip() and name != "after"):
                raise ValueError(f"{where}: field {name!r} must be a non-empty string, got {value!r}")
        e = Equivalent(*(entry[name].strip() if name == "reason" else entry[name] for name in FIELDS))
        if e.signature in out:
            raise ValueError(f"{where}: {e.module} mutant {e.before!r} -> {e.after!r} is listed twice")
        out[e.signature] = e
    return out
