"""The one format and loader of every measured table (harness/policy/data/*.json), written by the
calibrators (harness/policy/calibrate/).

A table is a JSON object:

  kind        what its worsts are, and so which safety rule turns them into allowances
              (harness/policy/allowance.py): "coefficient" (the rounding coefficient c a step needed),
              "noise" (|a bf16-robust statistic| of a correct run), "drift" (|growth of the accumulated
              error| of a correct long run)
  about       one sentence
  provenance  how it was measured: "commands" (every command whose runs it holds, in order), "date",
              "torch", "device", and the calibrator's own counts
  conditions  what a lookup must match to use it (noise: the "layers" measured; drift: the "factor")
  panel       the implementations whose runs set the worsts (harness/policy/calibrate/panel.py)
  entries     by key (harness/policy/keys.py), each an Entry

An entry: "n" runs measured, per statistic its "worst", optionally the "median" and the "worst_case"
(the run that set the worst), and "by": per implementation and statistic a summary ("worst", "n", and
where recorded "mean", "sd"), implementations outside the panel included for the record.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from harness.algorithms import algorithm
from harness.policy.keys import Key

DATA_DIR = Path(__file__).with_name("data")
KINDS = ("coefficient", "noise", "drift")

Summary = dict[str, float]
"""One implementation's statistic over its runs: "worst" (largest |value|), "n", optionally "mean", "sd"."""


@dataclass(frozen=True)
class Entry:
    n: int
    worst: dict[str, float]
    median: dict[str, float] = field(default_factory=dict)
    worst_case: dict[str, str] = field(default_factory=dict)
    by: dict[str, dict[str, Summary]] = field(default_factory=dict)

    def to_json(self) -> dict:
        out: dict = {"n": self.n, "worst": dict(sorted(self.worst.items()))}
        for name in ("median", "worst_case", "by"):
            value = getattr(self, name)
            if value:
                out[name] = {k: value[k] for k in sorted(value)}
        return out


@dataclass(frozen=True)
class Table:
    kind: str
    about: str
    provenance: dict
    entries: dict[Key, Entry]
    conditions: dict = field(default_factory=dict)
    panel: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Table.kind={self.kind!r}; expected one of {KINDS}")
        for key, entry in self.entries.items():
            if entry.n < 1 or not entry.worst or any(not math.isfinite(v) or v < 0 for v in entry.worst.values()):
                raise ValueError(f"table entry {key}: needs n >= 1 and finite worsts >= 0, got {entry}")

    def to_json(self) -> dict:
        return {"kind": self.kind, "about": self.about, "provenance": self.provenance,
                "conditions": self.conditions, "panel": list(self.panel),
                "entries": {str(k): self.entries[k].to_json() for k in sorted(self.entries, key=str)}}


def from_json(data: dict) -> Table:
    """The table a JSON object holds; ValueError names a missing field or a malformed key."""
    missing = [f for f in ("kind", "about", "provenance", "entries") if f not in data]
    if missing:
        raise ValueError(f"a measured table needs the fields {missing}")
    entries = {Key.parse(k): Entry(**v) for k, v in data["entries"].items()}
    return Table(data["kind"], data["about"], data["provenance"], entries, data.get("conditions", {}),
                 tuple(data.get("panel", ())))


def read(path: Path) -> Table:
    return from_json(json.loads(path.read_text()))


def write(table: Table, path: Path) -> None:
    """`table` as JSON at `path`, one line per entry (a re-measurement diffs key by key)."""
    data = table.to_json()
    entries = data.pop("entries")
    head = json.dumps(data, indent=1)[:-2]
    lines = [f" {json.dumps(k)}: {json.dumps(v)}" for k, v in entries.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + ',\n "entries": {\n' + ",\n".join(lines) + "\n }\n}\n")


@functools.cache
def load(name: str) -> Table | None:
    """The committed table `name` (a file name under DATA_DIR), or None where there is none."""
    path = DATA_DIR / name
    return read(path) if path.exists() else None


def _pooled(a: Summary, b: Summary) -> Summary:
    """Two summaries of one statistic as one: worst of both, counts summed, mean and sd pooled (population sd)
    where both have them."""
    n = a["n"] + b["n"]
    out = {"worst": max(a["worst"], b["worst"]), "n": n}
    if {"mean", "sd"} <= a.keys() & b.keys():
        mean = (a["n"] * a["mean"] + b["n"] * b["mean"]) / n
        square = (a["n"] * (a["sd"] ** 2 + a["mean"] ** 2) + b["n"] * (b["sd"] ** 2 + b["mean"] ** 2)) / n
        out.update(mean=mean, sd=math.sqrt(max(0.0, square - mean ** 2)))
    return out


def merge(entries: Iterable[Entry]) -> Entry:
    """Measurements of one key as one: per statistic the worst of all (and its worst case), runs summed, the
    median of the entry with the most runs, the implementations' summaries pooled."""
    entries = list(entries)
    worst: dict[str, float] = {}
    worst_case: dict[str, str] = {}
    by: dict[str, dict[str, Summary]] = {}
    for e in entries:
        for stat, value in e.worst.items():
            if stat not in worst or value > worst[stat]:
                worst[stat] = value
                if stat in e.worst_case:
                    worst_case[stat] = e.worst_case[stat]
                else:
                    worst_case.pop(stat, None)
        for impl, stats in e.by.items():
            mine = by.setdefault(impl, {})
            for stat, summary in stats.items():
                mine[stat] = _pooled(mine[stat], summary) if stat in mine else dict(summary)
    largest = max(entries, key=lambda e: e.n)
    return Entry(sum(e.n for e in entries), worst, dict(largest.median), worst_case, by)


def lookup(table: Table, key: Key) -> tuple[Entry, str] | None:
    """The entry of `key` (None if the table has none), or, where its algorithm takes every step of another
    (harness/algorithms `includes`: Dion2 with fraction 1 is Muon) and that algorithm's same key measured
    worse on some statistic, the two merged (the worse of each, the runs of both), with a note saying so: a
    correct Dion2 step can be a Muon step."""
    own = table.entries.get(key)
    if own is None:
        return None
    inner = algorithm(key.optimizer).includes
    other = table.entries.get(dataclasses.replace(key, optimizer=inner)) if inner else None
    if other is None or all(other.worst.get(s, 0.0) <= v for s, v in own.worst.items()):
        return own, ""
    both = merge([own, other])
    both = dataclasses.replace(both, worst={s: both.worst[s] for s in own.worst}, median=dict(own.median),
                               worst_case={s: c for s, c in both.worst_case.items() if s in own.worst})
    return both, f"; with {inner}'s same key, whose steps {key.optimizer} takes at fraction 1"


def merged(tables: Iterable[Table]) -> dict[Key, Entry]:
    """The entries of several tables of one kind, merged key by key."""
    found: dict[Key, list[Entry]] = {}
    for table in tables:
        for key, entry in table.entries.items():
            found.setdefault(key, []).append(entry)
    return {k: merge(v) if len(v) > 1 else v[0] for k, v in found.items()}
