"""Runs stored with their context, so that later runs can be compared with them.

A stored run is a directory holding `results.parquet` (one row per `Record`,
columns `COLUMNS`) and `run.json` (the `RunInfo` fields plus where and when the
run happened). `load_run` also accepts a directory with only `results.csv`, as
written by `write_csv`, so runs stored before parquet existed still load.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import platform
import subprocess
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from reports.records import COLUMNS, Record, RunInfo, read_csv, status_counts

PARQUET = "results.parquet"
CSV = "results.csv"
CONTEXT = "run.json"

_ARROW_TYPES = {"str": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_()}
_SCHEMA = pa.schema([(f.name, _ARROW_TYPES[f.type]) for f in dataclasses.fields(Record)])


def save_run(records: list[Record], info: RunInfo, out_dir: Path) -> None:
    """Write `out_dir/results.parquet` and `out_dir/run.json` (creating `out_dir`).

    run.json holds every `RunInfo` field plus: commit (the project's git commit when
    `info.commit` is empty), python_version, platform, device, world_sizes (present in
    the records), date (`info.started`), records (their count) and statuses (counts).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    columns = {name: [getattr(r, name) for r in records] for name in COLUMNS}
    pq.write_table(pa.table(columns, schema=_SCHEMA), out_dir / PARQUET)
    context = {
        **dataclasses.asdict(info),
        "commit": info.commit or project_commit(),
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "device": _device(),
        "date": info.started,
        **_record_context(records),
    }
    (out_dir / CONTEXT).write_text(json.dumps(context, indent=2, sort_keys=True) + "\n")


def load_run(run_dir: Path) -> tuple[list[Record], dict[str, Any]]:
    """Records and context of a stored run; ValueError if `run_dir` holds no run.

    Records come from results.parquet, else results.csv. The context is run.json's,
    else (no run.json) one derived from the records with the date of the results file.
    It always has `path` (the directory), `date`, `world_sizes`, `records` and `statuses`.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"{run_dir}: not a directory, so no stored run")
    if (run_dir / PARQUET).is_file():
        source = run_dir / PARQUET
        records = _read_parquet(source)
    elif (run_dir / CSV).is_file():
        source = run_dir / CSV
        records = read_csv(source)
    else:
        raise ValueError(f"{run_dir}: holds no run (neither {PARQUET} nor {CSV})")
    context = {"date": _file_date(source), **_read_context(run_dir), **_record_context(records)}
    context["path"] = str(run_dir)
    return records, context


def _read_parquet(path: Path) -> list[Record]:
    try:
        table = pq.read_table(path)
    except pa.ArrowException as exc:
        raise ValueError(f"{path}: not a readable parquet file ({exc})") from None
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: not a results file (missing columns {missing})")
    floats = [f.name for f in dataclasses.fields(Record) if f.type == "float"]
    rows = table.select(list(COLUMNS)).to_pylist()
    for row in rows:  # a null float (e.g. NaN written by another tool) is NaN, as in the CSV
        for name in floats:
            if row[name] is None:
                row[name] = math.nan
    return [Record(**row) for row in rows]


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
