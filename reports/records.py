"""The machine-readable result of a run: one `Record` per (case, check).

This module is the single source of truth for the result schema. The harness
produces records, every report (CSV, HTML, Markdown) consumes them.

Statuses:
  pass         the check ran and the error is within tolerance (ratio <= 1)
  fail         the check ran and the error is beyond tolerance (ratio > 1),
               or a relation that must hold did not
  error        the target raised while running a case it claimed to support
  unsupported  the target declared it cannot run this case (never a pass)
  skipped      the harness could not run it here (e.g. no GPU), with the reason

The schema is versioned (`SCHEMA_VERSION`, stored in run.json and in the Parquet file's
metadata). A column is added as a `Record` field with a default (a case column: in cases/schema.py),
together with a new version and a line in its history; runs stored before it load with the field's
default, or a case column with the value the row's case id gives (`from_row`).
"""

from __future__ import annotations

import csv
import dataclasses
import math
from dataclasses import MISSING, dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import Any, Iterable

from cases import Case, schema

STATUSES = ("fail", "error", "pass", "unsupported", "skipped")
"""All statuses, worst first."""

FAILING = frozenset({"fail", "error"})

SCHEMA_VERSION = 6
"""Version of the stored-run schema (`Record` columns, run.json keys). History:

  1  the columns case_id .. seconds; run.json unversioned (runs stored before versioning)
  2  schema_version in run.json and in results.parquet's metadata; run.json also holds
     complete, selection, interrupted and the SHA-256 and size of results.parquet and results.csv
  3  the column diagnosis: the likely kind of bug behind a failing case (harness/judging/diagnosis.py)
  4  a column for every case axis the id names and no column held: adjust_lr, nesterov, weight_decay,
     steps, grad, seed, fraction, scope (cases/schema.py); a run stored before gets them from its ids
  5  the hyper-parameter columns lr, momentum, beta2, ef_decay (ids name them where they are not their
     defaults); a run stored before gets them from its ids
  6  run.json holds judged and harness, the `CodeIdentity` of the code judged (the target's module) and of
     the harness that judged it; a run stored before has neither (its commit is the harness checkout's)
"""


class _RecordMethods:
    """What a `Record` does beyond holding its columns (declared for type checkers; make_dataclass
    below makes them fields)."""

    case_id: str
    check: str
    target: str
    backend: str
    world_size: int
    status: str

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}; expected one of {STATUSES}")

    @property
    def key(self) -> tuple[str, str, str, str, int]:
        """Identity of a row across runs: (case, check, target, backend, world size)."""
        return (self.case_id, self.check, self.target, self.backend, self.world_size)

    @property
    def failing(self) -> bool:
        return self.status in FAILING


def _case_columns(since_first: bool) -> list[tuple[str, str, Any]]:
    """The case's columns (cases/schema.py COLUMNS) as dataclass fields: those of schema version 1
    without a default, the later ones with theirs."""
    return [(c.name, c.kind.__name__) if since_first else (c.name, c.kind.__name__, field(default=c.default))
            for c in schema.COLUMNS if (c.since == 1) == since_first]


Record = make_dataclass("Record", [
    ("case_id", "str"), ("check", "str"), ("target", "str"), ("backend", "str"),
    *_case_columns(since_first=True),
    ("status", "str"),
    ("max_abs", "float", field(default=math.nan)),
    ("rel_err", "float", field(default=math.nan)),
    ("max_ulp", "float", field(default=math.nan)),
    ("tolerance", "float", field(default=math.nan)),
    ("tolerance_source", "str", field(default="")),
    ("ratio", "float", field(default=math.nan)),
    ("message", "str", field(default="")),
    ("repro", "str", field(default="")),
    ("seconds", "float", field(default=0.0)),
    ("diagnosis", "str", field(default="")),
    *_case_columns(since_first=False),
], bases=(_RecordMethods,), frozen=True)
Record.__module__ = __name__  # where pickle finds it
Record.__doc__ = """One check of one case against one target: the run's columns (case_id, check, target, backend,
status, the metrics and tolerance, message, repro, seconds, diagnosis) and the case's own (cases/schema.py
COLUMNS: world size, layout, layer, dtypes, ...)."""


def from_row(values: dict[str, Any]) -> Record:
    """A record from a stored row (already typed). A row stored before a case column existed gets the
    value its case id gives (the id names every axis), or the column's default if the id does not parse."""
    missing = [c for c in schema.COLUMNS if c.name not in values]
    if missing:
        try:
            known = schema.column_values(Case.from_id(values["case_id"]))
        except (KeyError, ValueError):
            known = {c.name: c.default for c in missing}
        values = {**values, **{c.name: known[c.name] for c in missing}}
    return Record(**values)


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Record))
REQUIRED: tuple[str, ...] = tuple(f.name for f in fields(Record) if f.default is MISSING)
"""Columns without a default: every stored run has them."""
_TYPES = {f.name: f.type for f in fields(Record)}


def check_columns(names: Iterable[str], source: object) -> None:
    """ValueError naming `source` unless `names` are known columns including every `REQUIRED` one.
    A column missing from an older run is fine when its field has a default."""
    names = list(names)
    missing = [n for n in REQUIRED if n not in names]
    if missing:
        raise ValueError(f"{source}: not a results file (missing columns {missing})")
    unknown = [n for n in names if n not in _TYPES]
    if unknown:
        raise ValueError(f"{source}: not a results file of schema version {SCHEMA_VERSION} "
                         f"(unknown columns {unknown}; written by a newer harness?)")


def _parse(name: str, text: str) -> object:
    kind = _TYPES[name]
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text) if text != "" else math.nan
    if kind == "bool":
        if text not in ("True", "False"):
            raise ValueError(f"column {name}: expected True/False, got {text!r}")
        return text == "True"
    return text


def write_csv(records: Iterable[Record], path: Path) -> None:
    """Write records to `path`, one row per record, header = `COLUMNS`."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for record in records:
            row = dataclasses.astuple(record)
            writer.writerow(["" if isinstance(v, float) and math.isnan(v) else v for v in row])


def read_csv(path: Path) -> list[Record]:
    """Read records written by `write_csv`, of this or an older schema (a missing column gets its
    field's default); ValueError on a foreign header or a row of the wrong length."""
    with open(path, newline="") as handle:
        reader = csv.reader(handle)
        header = tuple(next(reader, ()))
        check_columns(header, path)
        records = []
        for line, row in enumerate(reader, 2):
            if len(row) != len(header):
                raise ValueError(f"{path}: line {line} has {len(row)} fields, the header {len(header)}")
            records.append(from_row({n: _parse(n, v) for n, v in zip(header, row)}))
        return records


def worst_first(records: Iterable[Record]) -> list[Record]:
    """Sort by status severity, then by error/tolerance ratio descending (NaN last)."""
    order = {s: i for i, s in enumerate(STATUSES)}

    def key(r: Record) -> tuple[int, float]:
        ratio = -r.ratio if not math.isnan(r.ratio) else math.inf
        return (order[r.status], ratio)

    return sorted(records, key=key)


def status_counts(records: Iterable[Record]) -> dict[str, int]:
    """Count records per status, every status present (zeros included)."""
    counts = {s: 0 for s in STATUSES}
    for r in records:
        counts[r.status] += 1
    return counts


@dataclass(frozen=True)
class CodeIdentity:
    """Which code ran: a module, the file it was imported from, the installed distribution that holds
    that very file (name and version) and the git checkout holding it (its HEAD commit, and `dirty`:
    whether tracked files differ from that commit). Empty where unknown (harness/targets/identity.py
    finds them)."""

    module: str = ""
    file: str = ""
    distribution: str = ""
    version: str = ""
    commit: str = ""
    dirty: bool = False

    @classmethod
    def from_context(cls, value: object) -> CodeIdentity:
        """The identity run.json stores as a JSON object; empty for a run stored before schema version 6."""
        if not isinstance(value, dict):
            return cls()
        return cls(**{f.name: value[f.name] for f in fields(cls) if f.name in value})

    def describe(self) -> str:
        """"tiny-muon 0.3.0, commit 1a2b3c4d5e6f (dirty)": what is known of the version; "unversioned" for
        a module neither installed nor in git; "unknown" for an empty identity (a run stored before)."""
        known = [f"{self.distribution} {self.version}"] if self.distribution else []
        if self.commit:
            known.append(f"commit {self.commit[:12]}" + (" (dirty)" if self.dirty else ""))
        return ", ".join(known) or ("unversioned" if self.module else "unknown")

    def named(self) -> str:
        """"tiny_muon.adapter (tiny-muon 0.3.0, commit 1a2b3c4d5e6f)": the module and `describe()`."""
        return f"{self.module} ({self.describe()})" if self.module else "unknown"

    def same_code(self, other: CodeIdentity) -> bool | None:
        """True when both are the same module at the same clean commit or, outside git, of the same installed
        distribution version; False when they differ in module, commit or version; None when it cannot be
        told (a side unknown or dirty, or one side in git and the other not)."""
        if not (self.module and other.module):
            return None
        if self.module != other.module:
            return False
        if self.commit and other.commit:
            return None if self.dirty or other.dirty else self.commit == other.commit
        if self.commit or other.commit or not (self.distribution and other.distribution):
            return None
        return (self.distribution, self.version) == (other.distribution, other.version)


@dataclass(frozen=True)
class RunInfo:
    """Context of one run, shown at the top of every report."""

    target: str
    tier: str
    backends: str
    command: str
    started: str
    seconds: float
    torch_version: str
    commit: str = ""
    """The harness checkout's short commit (empty outside git)."""
    selection: tuple[str, ...] = ()
    """The --select patterns (empty: the whole tier)."""
    interrupted: str = ""
    """Why the run stopped before its last case (e.g. "SIGTERM after 12 of 40 cases"); empty if complete."""
    scope: str = ""
    """How much the run judged of what the target supports (harness/judging/scope.py)."""
    thin: str = ""
    """Why the run judged too little to mean anything; empty if it did not."""
    judged: CodeIdentity = CodeIdentity()
    """The code judged: the identity of the target's module."""
    harness: CodeIdentity = CodeIdentity()
    """The harness that judged it: the identity of the `harness` package."""


def harness_text(harness: CodeIdentity, commit: str) -> str:
    """The harness that judged a run, as reports show it: its identity, or for a run stored before schema
    version 6 the commit it recorded."""
    return harness.describe() if harness.module else f"commit {commit or 'unknown'}"


def group_by(records: Iterable[Record], field: str) -> dict[str, list[Record]]:
    """Records per value of `field` (as text), keys sorted, record order kept."""
    groups: dict[str, list[Record]] = {}
    for r in records:
        groups.setdefault(str(getattr(r, field)), []).append(r)
    return dict(sorted(groups.items()))


def worst_ratio(records: Iterable[Record]) -> float:
    """Largest error/tolerance ratio among `records`, ignoring NaN; NaN when none has one."""
    ratios = [r.ratio for r in records if not math.isnan(r.ratio)]
    return max(ratios) if ratios else math.nan


def format_metric(value: float) -> str:
    """A metric with 3 significant digits for reports; NaN is blank, as in the CSV."""
    return "" if math.isnan(value) else f"{value:.3g}"
