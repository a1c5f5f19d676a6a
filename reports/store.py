"""Runs stored with their context, so that later runs can be compared with them.

A stored run is a directory holding

  results.parquet  the canonical records: one row per `Record`, columns `COLUMNS`, the
                   schema version in the file's metadata
  results.csv      the same records as CSV, for people and spreadsheets (never read when
                   the Parquet file is there, but checked against it)
  run.json         the `RunInfo` fields plus where and when the run happened, the schema
                   version, whether the run completed, the record count and the SHA-256 and
                   size of both results files

`load_run` refuses a store whose files disagree: a results file edited, truncated or
replaced after the run (its digest or the record count differs from run.json's), or a CSV
that does not hold the Parquet file's records. A missing CSV is fine (it is a copy), a missing
Parquet file is not. Runs stored before schema version 2 have no
digests: their CSV is compared record by record, and their record count is checked. A
directory with only `results.csv` (runs stored before Parquet existed) still loads.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import platform
import subprocess
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from reports.records import (COLUMNS, SCHEMA_VERSION, Record, RunInfo, check_columns, from_row, read_csv,
                             status_counts, write_csv)

PARQUET = "results.parquet"
"""The canonical results file."""
CSV = "results.csv"
CONTEXT = "run.json"
_VERSION_KEY = b"schema_version"

_ARROW_TYPES = {"str": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_()}
_SCHEMA = pa.schema([(f.name, _ARROW_TYPES[f.type]) for f in dataclasses.fields(Record)],
                    metadata={_VERSION_KEY: str(SCHEMA_VERSION).encode()})


def save_run(records: list[Record], info: RunInfo, out_dir: Path) -> None:
    """Write `out_dir/results.parquet`, `out_dir/results.csv` and, last, `out_dir/run.json`
    (creating `out_dir`).

    run.json holds every `RunInfo` field plus: schema_version, complete (no `info.interrupted`),
    commit (the project's git commit when `info.commit` is empty), python_version, platform,
    device, world_sizes and targets (present in the records), date (`info.started`), records
    (their count), statuses (counts) and files (name -> sha256 and bytes of each results file).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    columns = {name: [getattr(r, name) for r in records] for name in COLUMNS}
    pq.write_table(pa.table(columns, schema=_SCHEMA), out_dir / PARQUET)
    write_csv(records, out_dir / CSV)
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
        "files": {name: _fingerprint(out_dir / name) for name in (PARQUET, CSV)},
    }
    (out_dir / CONTEXT).write_text(json.dumps(context, indent=2, sort_keys=True) + "\n")


def load_run(run_dir: Path) -> tuple[list[Record], dict[str, Any]]:
    """Records and context of a stored run; ValueError if `run_dir` holds no run, or one whose
    files disagree (see the module doc).

    Records come from results.parquet, else results.csv. The context is run.json's,
    else (no run.json) one derived from the records with the date of the results file.
    It always has `path` (the directory), `date`, `world_sizes`, `targets`, `records`,
    `statuses` and `schema_version` (1 for runs stored before versioning).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"{run_dir}: not a directory, so no stored run")
    stored = _read_context(run_dir)
    version = stored.get("schema_version", 1)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise ValueError(f"{run_dir / CONTEXT}: schema version {version!r}; this harness reads up to "
                         f"{SCHEMA_VERSION} (a newer harness wrote it)")
    files = stored.get("files", {})
    if (run_dir / PARQUET).is_file():
        source = run_dir / PARQUET
        records = _read_parquet(source)
    elif (run_dir / CSV).is_file():
        source = run_dir / CSV
        records = read_csv(source)
    else:
        raise ValueError(f"{run_dir}: holds no run (neither {PARQUET} nor {CSV})")
    if PARQUET in files and source.name != PARQUET:
        raise ValueError(f"{run_dir}: {PARQUET}, the canonical file, is missing; refusing an incomplete run")
    for name in files:
        if (run_dir / name).is_file() and _fingerprint(run_dir / name) != files[name]:
            fix = f"restore it or delete it ({PARQUET} is canonical)" if name == CSV else "rerun, or restore it"
            raise ValueError(f"{run_dir}: {name} is not the file this run wrote (edited, truncated or replaced: "
                             f"its SHA-256 or size differs from {CONTEXT}'s); {fix}")
    if "records" in stored and stored["records"] != len(records):
        raise ValueError(f"{source}: holds {len(records)} records, {CONTEXT} says {stored['records']}; "
                         f"refusing a truncated or extended run")
    if source.name == PARQUET and CSV not in files and (run_dir / CSV).is_file():
        if not _same_records(read_csv(run_dir / CSV), records):
            raise ValueError(f"{run_dir}: {CSV} disagrees with {PARQUET} (edited or truncated?); {PARQUET} is "
                             f"canonical, so restore {CSV} or delete it")
    _check_unique(records, source)
    context = {"date": _file_date(source), **stored, **_record_context(records), "schema_version": version}
    context["path"] = str(run_dir)
    return records, context


def _read_parquet(path: Path) -> list[Record]:
    try:
        table = pq.read_table(path)
    except pa.ArrowException as exc:
        raise ValueError(f"{path}: not a readable parquet file ({exc})") from None
    version = (table.schema.metadata or {}).get(_VERSION_KEY, b"1")
    if not version.isdigit() or int(version) > SCHEMA_VERSION:
        raise ValueError(f"{path}: schema version {version.decode(errors='replace')!r}; this harness reads up "
                         f"to {SCHEMA_VERSION}")
    names = [n for n in table.column_names if n != "__index_level_0__"]
    check_columns(names, path)
    floats = [f.name for f in dataclasses.fields(Record) if f.type == "float"]
    rows = table.select(names).to_pylist()
    for row in rows:  # a null float (e.g. NaN written by another tool) is NaN, as in the CSV
        for name in floats:
            if row.get(name, 0.0) is None:
                row[name] = math.nan
    return [from_row(row) for row in rows]


def _fingerprint(path: Path) -> dict[str, Any]:
    """SHA-256 and size of a file."""
    data = path.read_bytes()
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def _same_records(a: list[Record], b: list[Record]) -> bool:
    """Field-by-field equality where NaN equals NaN."""
    def norm(r: Record) -> tuple:
        return tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in dataclasses.astuple(r))

    return len(a) == len(b) and all(norm(x) == norm(y) for x, y in zip(a, b))


def _check_unique(records: list[Record], source: Path) -> None:
    """ValueError when two records share a `Record.key` (a run holds one record per key)."""
    seen: set[tuple] = set()
    for r in records:
        if r.key in seen:
            raise ValueError(f"{source}: the key {r.key} appears twice; a run holds one record per "
                             f"(case, check, target, backend, world size)")
        seen.add(r.key)


def _read_context(run_dir: Path) -> dict[str, Any]:
    path = run_dir / CONTEXT
    if not path.is_file():
        return {}
    try:
        context = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(context, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(context).__name__}")
    return context


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
