"""Release hygiene: every change to the tolerance policy or the record columns is in CHANGELOG.md.

A digest of each is recorded in the changelog entry that last changed it. When the policy (every constant
of the modules of harness/policy, the calibrators aside, and every entry of its measured tables) or the
columns of reports.records.Record change, the digest changes and this test fails until a changelog entry
says why and records the new digest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import json
import math
import pkgutil
import re
import types
from collections.abc import Mapping
from pathlib import Path

import harness.policy
from harness.policy import tables
from reports.records import Record

ROOT = Path(__file__).resolve().parent.parent
CHANGELOG = ROOT / "CHANGELOG.md"


def canonical(value: object) -> object:
    """`value` as plain JSON data, independent of memory addresses and dict order: dataclasses by
    type and fields, functions by qualified name, floats by repr."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"type": type(value).__name__,
                **{f.name: canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, Mapping):  # a dict or a read-only mapping: the same data
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
    """The module's constants: public names that are not modules, classes, functions, paths or type aliases."""
    return {name: value for name, value in vars(module).items()
            if not name.startswith("_") and not inspect.ismodule(value) and not inspect.isclass(value)
            and not inspect.isfunction(value) and getattr(value, "__module__", None) != "typing"
            and not isinstance(value, (types.GenericAlias, Path)) and name != "annotations"}


def policy_modules() -> list[types.ModuleType]:
    """The modules of harness/policy whose constants decide an allowance (the calibrators measure, they do not
    decide)."""
    return [importlib.import_module(f"harness.policy.{m.name}") for m in pkgutil.iter_modules(harness.policy.__path__)
            if not m.ispkg]


def policy_values() -> dict[str, object]:
    """What decides an allowance: the constants of every policy module (by module.NAME) and every measured
    table's entries (harness/policy/data/*.json; entries only: re-measuring the same worsts is no change)."""
    constants = {f"{m.__name__}.{k}": v for m in policy_modules() for k, v in policy_constants(m).items()}
    measured = {path.name: json.loads(path.read_text())["entries"] for path in sorted(tables.DATA_DIR.glob("*.json"))}
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
    safety = "harness.policy.allowance.SAFETY"
    assert "harness.policy.bounds.STORAGE_ULPS" in values and safety in values and values["measured"]
    assert set(values["measured"]) == {"bf16_drift_noise.json", "bf16_noise.json", "tolerance_cpu.json",
                                       "tolerance_cuda.json"}
    doubled = {**values[safety], "noise": dataclasses.replace(values[safety]["noise"], factor=6.0)}
    assert digest({**values, safety: doubled}) != digest(values)
    name, entries = next(iter(values["measured"].items()))
    key = next(iter(entries))
    stat = next(iter(entries[key]["worst"]))
    worse = {**entries, key: {**entries[key], "worst": {stat: 2 * entries[key]["worst"][stat] + 1.0}}}
    assert digest({**values, "measured": {**values["measured"], name: worse}}) != digest(values)
    reordered = {**values, "measured": {name: dict(reversed(list(entries.items())))}}
    assert digest(reordered) == digest({**values, "measured": {name: entries}})
    columns = [f.name for f in dataclasses.fields(Record)]
    assert digest(columns + ["diagnosis"]) != digest(columns)


def test_changelog_records_the_current_tolerance_policy():
    text = CHANGELOG.read_text()
    wanted = f"tolerance policy `{policy_digest()}`"
    assert wanted in text, (
        f"the policy (harness/policy) changed: add a CHANGELOG.md entry under Unreleased that says which "
        f"allowance changed and why, ending with: Digest: {wanted}.")


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
