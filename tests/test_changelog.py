"""Release hygiene: every change to the tolerance policy or the record columns is in CHANGELOG.md.

A digest of each is recorded in the changelog entry that last changed it. When the policy table
(every constant of harness/policy/tolerance.py) or the columns of reports.records.Record change, the
digest changes and this test fails until a changelog entry says why and records the new digest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
import re
import types
from pathlib import Path

from harness.policy import tolerance
from reports.records import Record

ROOT = Path(__file__).resolve().parent.parent
CHANGELOG = ROOT / "CHANGELOG.md"


def canonical(value: object) -> object:
    """`value` as plain JSON data, independent of memory addresses and dict order: dataclasses by
    type and fields, functions by qualified name, floats by repr."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"type": type(value).__name__,
                **{f.name: canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, dict):
        return [[canonical(k), canonical(v)] for k, v in sorted(value.items(), key=lambda kv: repr(kv[0]))]
    if isinstance(value, (list, tuple, frozenset, set)):
        items = [canonical(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, float):
        return "nan" if math.isnan(value) else repr(value)
    if callable(value):
        return f"{value.__module__}.{value.__qualname__}"
    if value is None or isinstance(value, (bool, int, str)):
        return value
    raise TypeError(f"no canonical form for {type(value).__name__}: {value!r}")


def digest(value: object) -> str:
    return hashlib.sha256(json.dumps(canonical(value), sort_keys=True).encode()).hexdigest()[:12]


def policy_constants(module: types.ModuleType) -> dict[str, object]:
    """The module's constants: public names that are not modules, classes or functions, or typing aliases."""
    return {name: value for name, value in vars(module).items()
            if not name.startswith("_") and not inspect.ismodule(value) and not inspect.isclass(value)
            and not inspect.isfunction(value) and getattr(value, "__module__", None) != "typing"
            and name != "annotations"}


def policy_values() -> dict[str, object]:
    """What decides a tolerance: harness/policy/tolerance.py's constants and the measured worst errors it
    reads (harness/tolerance_measured/*.json, entries only: re-measuring the same worsts is no change)."""
    constants = {k: v for k, v in policy_constants(tolerance).items() if k != "MEASURED_DIR"}
    measured = {path.name: json.loads(path.read_text())["entries"]
                for path in sorted(tolerance.MEASURED_DIR.glob("*.json"))}
    return {**constants, "measured": measured}


def policy_digest() -> str:
    return digest(policy_values())


def columns_digest() -> str:
    return digest([[f.name, str(f.type), canonical(f.default) if f.default is not dataclasses.MISSING else None]
                   for f in dataclasses.fields(Record)])


def test_digests_follow_what_they_cover():
    """Negative controls: the digest moves when a constant, a measured worst or a column changes, and
    not when only dict order does."""
    values = policy_values()
    assert "STORAGE_ULPS" in values and "COEFFICIENT_SAFETY" in values and values["measured"]
    assert digest({**values, "COEFFICIENT_SAFETY": 3.0}) != digest(values)
    name, entries = next(iter(values["measured"].items()))
    key = next(iter(entries))
    worse = {**entries, key: {**entries[key], "worst": 2 * entries[key]["worst"] + 1.0}}
    assert digest({**values, "measured": {**values["measured"], name: worse}}) != digest(values)
    reordered = {**values, "measured": {name: dict(reversed(list(entries.items())))}}
    assert digest(reordered) == digest({**values, "measured": {name: entries}})
    columns = [f.name for f in dataclasses.fields(Record)]
    assert digest(columns + ["diagnosis"]) != digest(columns)


def test_changelog_records_the_current_tolerance_policy():
    text = CHANGELOG.read_text()
    wanted = f"tolerance policy `{policy_digest()}`"
    assert wanted in text, (
        f"harness/policy/tolerance.py changed: add a CHANGELOG.md entry under Unreleased that says which "
        f"tolerance changed and why, ending with: Digest: {wanted}.")


def test_changelog_records_the_current_record_columns():
    text = CHANGELOG.read_text()
    wanted = f"record columns `{columns_digest()}`"
    assert wanted in text, (
        f"reports.records.Record's columns changed: add a CHANGELOG.md entry under Unreleased that "
        f"says which column changed and why, ending with: Digest: {wanted}.")


def test_changelog_has_the_keep_a_changelog_shape():
    """An Unreleased section first, then versions newest first, each with Added/Changed/Fixed
    subsections only; the header states the rule."""
    text = CHANGELOG.read_text()
    assert "every change to a tolerance, a default or a record column" in text.lower()
    sections = re.findall(r"^## \[([^\]]+)\]", text, flags=re.M)
    assert sections[0] == "Unreleased" and len(sections) >= 2
    versions = [tuple(int(p) for p in s.split(".")) for s in sections[1:]]
    assert versions == sorted(versions, reverse=True)
    assert set(re.findall(r"^### (\w+)", text, flags=re.M)) <= {"Added", "Changed", "Fixed", "Removed"}
