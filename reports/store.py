"""The stored-run format: the files of a run, written into a folder and read back, checked.

A stored run is a directory holding

  results.parquet  the canonical records: one row per `Record`, columns `COLUMNS` with their types,
                   the schema version in the file's metadata
  results.csv      the same records as CSV, for people and spreadsheets (never read when the
                   Parquet file is there, but checked against it)
  run.json         the `RunInfo` fields plus where and when the run happened, the schema version,
                   whether the run completed, the record count, the status counts, the targets and
                   world sizes present, and the SHA-256 and size of both results files

beside the reports written with it (reports.run_folder.REPORT_FILES). `save_run` writes the three
files (`write_files`) into a folder claimed and published whole by reports/run_folder.py; `load_run`
reads a stored run back.

`load_run` refuses, with one `StoreError` naming the file and what is wrong, every store it cannot
vouch for: unreadable bytes, a results file whose digest or size differs from run.json's (checked
before either is parsed), a missing Parquet file, a run.json with a missing, extra or mistyped key or
values that disagree with the records (count, statuses, targets, world sizes, completeness, schema
version), columns of the wrong type, a CSV that does not hold the Parquet file's records, a key that
appears twice. A store without digests (no run.json, as a bare Parquet or CSV file; or run.json of
schema version 1) cannot be checked against what its run wrote: it is refused unless the caller
passes `undigested=True`, and is then checked as far as it can be (record by record against the CSV,
the record count).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import platform
import re
import subprocess
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from reports.records import (COLUMNS, SCHEMA_VERSION, STATUSES, CodeIdentity, Record, RunInfo, check_columns,
                             from_row, read_csv, status_counts, write_csv)
from reports.run_folder import CONTEXT, CSV, PARQUET, RunFolder, StoreError, claim, estimated_bytes, left_aside

_VERSION_KEY = b"schema_version"
_DIGESTS_SINCE = 2
"""The schema version that added the digests to run.json (with schema_version, complete, selection,
interrupted and targets): from it on, every key of `CONTEXT_KEYS` is required."""

_ARROW_TYPES = {"str": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_()}
_KINDS: dict[str, Callable[[pa.DataType], bool]] = {
    "str": lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
    "int": pa.types.is_integer,
    "float": pa.types.is_floating,
    "bool": pa.types.is_boolean,
}
"""The Arrow types a column of each `Record` field type may have (other writers use other widths)."""
_TYPES = {f.name: f.type for f in dataclasses.fields(Record)}
_SCHEMA = pa.schema([(f.name, _ARROW_TYPES[f.type]) for f in dataclasses.fields(Record)],
                    metadata={_VERSION_KEY: str(SCHEMA_VERSION).encode()})


def write_files(records: list[Record], info: RunInfo, folder: Path) -> None:
    """Write `folder/results.parquet`, `folder/results.csv` and, last, `folder/run.json` into the
    existing `folder` (`save_run` publishes such a folder).

    run.json holds every `RunInfo` field plus: schema_version, complete (no `info.interrupted`),
    commit (the project's git commit when `info.commit` is empty), python_version, platform,
    device, world_sizes and targets (present in the records), date (`info.started`), records
    (their count), statuses (counts) and files (name -> sha256 and bytes of each results file).
    """
    columns = {name: [getattr(r, name) for r in records] for name in COLUMNS}
    pq.write_table(pa.table(columns, schema=_SCHEMA), folder / PARQUET)
    write_csv(records, folder / CSV)
    context = {
        **dataclasses.asdict(info),
        "schema_version": SCHEMA_VERSION,
        "complete": not info.interrupted,
        "commit": info.commit or project_commit(),
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "device": _device(),
        "date": info.started,
        **_record_context(records),
        "files": {name: _fingerprint(folder / name) for name in (PARQUET, CSV)},
    }
    (folder / CONTEXT).write_text(json.dumps(context, indent=2, sort_keys=True) + "\n")


def save_run(records: list[Record], info: RunInfo, out_dir: Path, *, replace: bool = False,
             also: Callable[[Path], None] | None = None) -> None:
    """Store a run in `out_dir` (`write_files`), claimed (reports.run_folder.claim) and published whole;
    `also(folder)` writes more files into the staged folder before it is published (the reports)."""
    with claim(out_dir, replace=replace, expected_bytes=estimated_bytes(len(records))) as folder:
        store_into(folder, records, info, also)


def store_into(folder: RunFolder, records: list[Record], info: RunInfo,
               also: Callable[[Path], None] | None = None) -> None:
    """Store a run in a folder claimed before (`claim`): its files, then `also(staging)`'s, published
    in one rename."""
    with folder.staged() as staging:
        write_files(records, info, staging)
        if also is not None:
            also(staging)


def load_run(run_dir: Path, *, undigested: bool = False) -> tuple[list[Record], dict[str, Any]]:
    """Records and context of a stored run; `StoreError` (a ValueError) if `run_dir` holds no run, or
    one this function cannot vouch for (see the module doc; `undigested` admits a store without digests).

    Records come from results.parquet, else results.csv. The context is run.json's, else (no
    run.json) one derived from the records with the date of the results file. It always has `path`
    (the directory), `date`, `world_sizes`, `targets`, `records`, `statuses` and `schema_version`
    (1 for runs stored before versioning).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise StoreError(f"{run_dir}: not a directory, so no stored run{_aside_hint(run_dir)}")
    try:
        return _load(run_dir, undigested)
    except OSError as exc:
        raise StoreError(f"{exc.filename or run_dir}: cannot be read ({exc.strerror or exc})") from None


def _load(run_dir: Path, undigested: bool) -> tuple[list[Record], dict[str, Any]]:
    stored = _read_context(run_dir)
    version = stored.get("schema_version", 1)
    if stored and (not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= SCHEMA_VERSION):
        raise StoreError(f"{run_dir / CONTEXT}: schema version {version!r}; this harness reads 1 to "
                         f"{SCHEMA_VERSION} (a newer harness wrote it, or it was edited)")
    source = next((run_dir / n for n in (PARQUET, CSV) if (run_dir / n).is_file()), None)
    if source is None:
        raise StoreError(f"{run_dir}: holds no run (neither {PARQUET} nor {CSV})")
    if version < _DIGESTS_SINCE and not undigested:
        held = f"its {CONTEXT} is of schema version 1" if stored else f"it has no {CONTEXT}"
        raise StoreError(f"{run_dir}: {held}, so no digests vouch for {source.name}; refusing a run that cannot "
                         f"be checked against what its run wrote (--allow-undigested reads it anyway)")
    _check_context(stored, run_dir / CONTEXT, version)
    if version >= _DIGESTS_SINCE:
        if source.name != PARQUET:
            raise StoreError(f"{run_dir}: {PARQUET}, the canonical file, is missing; refusing an incomplete run")
        _check_digests(run_dir, stored["files"])
    records, stored_as = _read_parquet(source) if source.name == PARQUET else (_read_csv(source), None)
    if version >= _DIGESTS_SINCE:
        _check_agreement(records, stored, run_dir / CONTEXT, stored_as)
    elif "records" in stored and stored["records"] != len(records):
        raise StoreError(f"{source}: holds {len(records)} records, {CONTEXT} says {stored['records']}; "
                         f"refusing a truncated or extended run")
    if source.name == PARQUET and version < _DIGESTS_SINCE and (run_dir / CSV).is_file():
        if not _same_records(_read_csv(run_dir / CSV), records):
            raise StoreError(f"{run_dir}: {CSV} disagrees with {PARQUET} (edited or truncated?); {PARQUET} is "
                             f"canonical, so restore {CSV} or delete it")
    _check_unique(records, source)
    context = {"date": _file_date(source), **stored, **_record_context(records), "schema_version": version}
    context["path"] = str(run_dir)
    return records, context


def _aside_hint(run_dir: Path) -> str:
    """Where a write interrupted between its two renames left the previous run (reports.run_folder)."""
    aside = left_aside(run_dir)
    if aside is not None:
        return (f"; a write interrupted while it replaced the run left the previous one in {aside} "
                f"(the next run into {run_dir} puts it back first, or rename it yourself)")
    return ""


def _read_parquet(path: Path) -> tuple[list[Record], int]:
    """Records of a results Parquet file, its columns checked against `Record`'s types, and the schema
    version in its metadata."""
    try:
        table = pq.read_table(path)
        rows = table.to_pylist()
    except (pa.ArrowException, OSError, ValueError) as exc:  # ValueError: undecodable text, too
        raise StoreError(f"{path}: not a readable parquet file ({_first_line(exc)})") from None
    version = _parquet_version(path, table.schema)
    if version > SCHEMA_VERSION:
        raise StoreError(f"{path}: schema version {version}; this harness reads up to {SCHEMA_VERSION}")
    names = [n for n in table.column_names if n != "__index_level_0__"]
    try:
        check_columns(names, path)
    except ValueError as exc:
        raise StoreError(str(exc)) from None
    wrong = [f"{n} is {table.schema.field(n).type}, expected {_SCHEMA.field(n).type}" for n in names
             if not (pa.types.is_null(table.schema.field(n).type) or _KINDS[_TYPES[n]](table.schema.field(n).type))]
    if wrong:
        more = "; ..." if len(wrong) > 3 else ""
        raise StoreError(f"{path}: columns of the wrong type ({'; '.join(wrong[:3])}{more})")
    for line, row in enumerate(rows):
        row.pop("__index_level_0__", None)
        for name in names:
            if row[name] is None:
                if _TYPES[name] != "float":  # a null float (NaN written by another tool) is NaN, as in the CSV
                    raise StoreError(f"{path}: row {line} has no {name} (null)")
                row[name] = math.nan
    return [_record(row, path, line) for line, row in enumerate(rows)], version


def _parquet_version(path: Path, schema: pa.Schema) -> int:
    """The schema version in a results file's metadata (1 where it has none)."""
    metadata = schema.metadata or {}
    version = metadata.get(_VERSION_KEY, b"1")
    if not version.isdigit():
        raise StoreError(f"{path}: schema version {version.decode(errors='replace')!r} in its metadata")
    return int(version)


def _read_csv(path: Path) -> list[Record]:
    try:
        return read_csv(path)
    except UnicodeDecodeError as exc:
        raise StoreError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except ValueError as exc:
        message = str(exc)
        raise StoreError(message if message.startswith(str(path)) else f"{path}: {message}") from None


def _record(row: dict[str, Any], path: Path, line: int) -> Record:
    try:
        return from_row(row)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{path}: row {line}: {exc}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _fingerprint(path: Path) -> dict[str, Any]:
    """SHA-256 and size of a file."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return {"sha256": digest.hexdigest(), "bytes": size}


def _check_digests(run_dir: Path, files: dict[str, dict[str, Any]]) -> None:
    """Each results file present is the one its run wrote (a missing CSV is fine: it is a copy)."""
    for name, expected in files.items():
        path = run_dir / name
        if path.exists() and _fingerprint(path) != expected:
            fix = f"restore it or delete it ({PARQUET} is canonical)" if name == CSV else "rerun, or restore it"
            raise StoreError(f"{run_dir}: {name} is not the file this run wrote (edited, truncated or replaced: "
                             f"its SHA-256 or size differs from {CONTEXT}'s); {fix}")


def _same_records(a: list[Record], b: list[Record]) -> bool:
    """Field-by-field equality where NaN equals NaN."""
    def norm(r: Record) -> tuple:
        return tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in dataclasses.astuple(r))

    return len(a) == len(b) and all(norm(x) == norm(y) for x, y in zip(a, b))


def _check_unique(records: list[Record], source: Path) -> None:
    """StoreError when two records share a `Record.key` (a run holds one record per key)."""
    seen: set[tuple] = set()
    for r in records:
        if r.key in seen:
            raise StoreError(f"{source}: the key {r.key} appears twice; a run holds one record per "
                             f"(case, check, target, backend, world size)")
        seen.add(r.key)


def _read_context(run_dir: Path) -> dict[str, Any]:
    path = run_dir / CONTEXT
    if not path.exists():
        return {}
    try:
        context = json.loads(path.read_bytes().decode())
    except UnicodeDecodeError as exc:
        raise StoreError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise StoreError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(context, dict):
        raise StoreError(f"{path}: expected a JSON object, got {type(context).__name__}")
    return context


Check = Callable[[Any], bool]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_list(item: Check) -> Check:
    return lambda value: isinstance(value, list) and all(item(v) for v in value)


def _is_digest(value: Any) -> bool:
    return (isinstance(value, dict) and set(value) == {"sha256", "bytes"} and _is_int(value["bytes"])
            and isinstance(value["sha256"], str) and re.fullmatch(r"[0-9a-f]{64}", value["sha256"]) is not None)


_is_str: Check = lambda value: isinstance(value, str)  # noqa: E731
_INFO_TYPES: dict[str, Check] = {
    "str": _is_str,
    "float": lambda value: isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
    "tuple[str, ...]": _is_list(_is_str),
    "CodeIdentity": lambda value: (isinstance(value, dict)
                                   and set(value) <= {f.name for f in dataclasses.fields(CodeIdentity)}
                                   and all(isinstance(v, bool) if k == "dirty" else _is_str(v)
                                           for k, v in value.items())),
}
"""A check per `RunInfo` field type, as JSON holds it (a new field type needs its check here)."""
_STORE_KEYS: dict[str, Check] = {
    "schema_version": _is_int,
    "complete": lambda value: isinstance(value, bool),
    "python_version": _is_str,
    "platform": _is_str,
    "device": _is_str,
    "date": _is_str,
    "world_sizes": _is_list(_is_int),
    "targets": _is_list(_is_str),
    "records": _is_int,
    "statuses": lambda value: (isinstance(value, dict) and set(value) == set(STATUSES)
                               and all(_is_int(v) for v in value.values())),
    "files": lambda value: (isinstance(value, dict) and set(value) == {PARQUET, CSV}
                            and all(_is_digest(v) for v in value.values())),
}
"""The keys `write_files` adds to the `RunInfo` fields, each with its check."""
CONTEXT_KEYS: dict[str, Check] = {**{f.name: _INFO_TYPES[f.type] for f in dataclasses.fields(RunInfo)}, **_STORE_KEYS}
"""Every key run.json may hold, with the check its value must pass."""
_KEYS_SINCE: dict[str, int] = {"scope": 5, "thin": 5, "judged": 6, "harness": 6}
"""The schema version that added each key of run.json written after version 2 (reports/records.py)."""


def _required(version: int) -> frozenset[str]:
    """Keys every run.json of schema `version` holds: from version 2 on, every key of `CONTEXT_KEYS` that
    version writes (a key added later comes with a new schema version and `_KEYS_SINCE`)."""
    if version < _DIGESTS_SINCE:
        return frozenset()
    return frozenset(k for k in CONTEXT_KEYS if _KEYS_SINCE.get(k, _DIGESTS_SINCE) <= version)


def _check_context(stored: dict[str, Any], path: Path, version: int) -> None:
    """Every key known and of its type; for version >= 2 every key present."""
    unknown = sorted(set(stored) - set(CONTEXT_KEYS))
    if unknown:
        raise StoreError(f"{path}: unknown keys {unknown} (written by a newer harness, or edited)")
    missing = sorted(_required(version) - set(stored))
    if missing:
        raise StoreError(f"{path}: missing keys {missing}; refusing an incomplete or edited {CONTEXT}")
    wrong = [f"{key}={_clip(repr(stored[key]))}" for key in sorted(stored) if not CONTEXT_KEYS[key](stored[key])]
    if wrong:
        raise StoreError(f"{path}: values of the wrong type or range: {', '.join(wrong)}")


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _check_agreement(records: list[Record], stored: dict[str, Any], path: Path, parquet_version: int | None) -> None:
    """run.json (version >= 2) agrees with the records it describes and with itself."""
    derived = _record_context(records)
    differ = [f"{key} {stored[key]!r}, the records {derived[key]!r}" for key in derived if stored[key] != derived[key]]
    if stored["complete"] != (stored["interrupted"] == ""):
        differ.append(f"complete {stored['complete']!r} with interrupted {stored['interrupted']!r}")
    if stored["schema_version"] != parquet_version:
        differ.append(f"schema_version {stored['schema_version']}, {PARQUET}'s {parquet_version}")
    if differ:
        raise StoreError(f"{path}: disagrees with the run it describes ({'; '.join(differ)})")


def _record_context(records: list[Record]) -> dict[str, Any]:
    """What the records themselves say about the run."""
    return {
        "world_sizes": sorted({r.world_size for r in records}),
        "targets": sorted({r.target for r in records}),
        "records": len(records),
        "statuses": status_counts(records),
    }


def _file_date(path: Path) -> str:
    stamp = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc)
    return stamp.isoformat(timespec="seconds")


def project_commit() -> str:
    """Short git commit of this checkout, or "" outside git."""
    try:
        result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return result.stdout.strip() if result.returncode == 0 else ""


def _device() -> str:
    """This machine's accelerators when torch sees any, else its CPU."""
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return platform.processor() or platform.machine()
