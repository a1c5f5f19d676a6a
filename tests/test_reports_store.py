"""Stored runs: parquet + run.json round trip, CSV fallback, NaN kept, clear errors."""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import re
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reports.records import COLUMNS, SCHEMA_VERSION, Record, RunInfo, write_csv
from reports.store import StoreError, load_run, save_run

NAN = math.nan
INFO = RunInfo(target="ours [ours] 0.1.0", tier="nightly", backends="cpu,nccl", command="python -m harness run",
               started="2025-01-02T03:04:05+00:00", seconds=12.5, torch_version="2.13.0+cpu", commit="abc1234")


def rec(case_id: str, status: str, ratio: float = NAN, **overrides: object) -> Record:
    """A record with plausible defaults; `overrides` replace any field."""
    fields = dict(check="update", target="ours", backend="cpu", world_size=1, layout="single", optimizer="muon",
                  layer="linear", shape="64x32", megabatch=1, flatten=False, param_dtype="float32",
                  compute_dtype="float32", orthogonalizer="newton_schulz")
    fields.update(overrides)
    return Record(case_id=case_id, status=status, ratio=ratio, **fields)  # type: ignore[arg-type]


RECORDS = [
    rec("muon/linear/f32/s0", "pass", 0.25, rel_err=2.5e-7, max_abs=1e-8, max_ulp=3.0, tolerance=1e-6,
        tolerance_source="f32: 8 ulp", seconds=0.125),
    rec("muon/conv/bf16/s1", "fail", 12.0, flatten=True, megabatch=8, rel_err=0.12, tolerance=0.01,
        message="diverged: ‖Δ‖ > tol, \"quoted\", a,b\nsecond line", repro="python -m harness repro 'x'"),
    rec("muon/linear/f32/s1", "error", message="RuntimeError: shape mismatch"),
    rec("muon/linear/fp8/s0", "unsupported", param_dtype="float8_e4m3fn", message="no fp8"),
    rec("muon/linear/f32/s2", "skipped", backend="nccl", world_size=4, layout="sharded", message="no GPU"),
    rec("muon/linear/f32/inf", "fail", math.inf, tolerance=0.0, rel_err=math.inf),
]


def same(a: list[Record], b: list[Record]) -> bool:
    """Field-by-field equality where NaN equals NaN."""
    def norm(r: Record) -> tuple:
        return tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in dataclasses.astuple(r))

    return [norm(r) for r in a] == [norm(r) for r in b]


def test_parquet_round_trip_keeps_every_field_and_nan(tmp_path: Path) -> None:
    save_run(RECORDS, INFO, tmp_path / "run")
    loaded, _ = load_run(tmp_path / "run")
    assert same(loaded, RECORDS)
    assert math.isnan(loaded[2].ratio) and loaded[0].ratio == 0.25
    assert loaded[5].ratio == math.inf
    assert type(loaded[1].megabatch) is int and loaded[1].flatten is True and type(loaded[0].ratio) is float


def test_parquet_has_one_row_per_record_and_typed_columns(tmp_path: Path) -> None:
    save_run(RECORDS, INFO, tmp_path)
    frame = pd.read_parquet(tmp_path / "results.parquet")
    assert tuple(frame.columns) == COLUMNS and len(frame) == len(RECORDS)
    assert frame["world_size"].dtype == "int64" and frame["flatten"].dtype == bool
    assert frame["ratio"].dtype == "float64" and frame["ratio"].isna().sum() == 3


def test_run_json_holds_run_info_and_environment(tmp_path: Path) -> None:
    save_run(RECORDS, INFO, tmp_path)
    stored = json.loads((tmp_path / "run.json").read_text())
    info = json.loads(json.dumps(dataclasses.asdict(INFO)))  # tuples as JSON lists
    assert {k: stored[k] for k in info} == info
    assert stored["schema_version"] == SCHEMA_VERSION and stored["complete"] is True
    assert stored["python_version"] == platform.python_version()
    assert stored["platform"] == platform.platform() and stored["device"]
    assert stored["world_sizes"] == [1, 4]
    assert stored["date"] == INFO.started
    assert stored["records"] == 6 and stored["statuses"]["fail"] == 2


def test_missing_commit_is_taken_from_the_project(tmp_path: Path) -> None:
    save_run(RECORDS, dataclasses.replace(INFO, commit=""), tmp_path)
    _, context = load_run(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{7,40}", context["commit"]), context["commit"]


def test_load_returns_stored_context_with_path(tmp_path: Path) -> None:
    save_run(RECORDS, INFO, tmp_path)
    _, context = load_run(tmp_path)
    assert context["path"] == str(tmp_path)
    assert context["tier"] == "nightly" and context["torch_version"] == "2.13.0+cpu"
    assert context["date"] == INFO.started


def test_empty_run_round_trips(tmp_path: Path) -> None:
    save_run([], INFO, tmp_path)
    records, context = load_run(tmp_path)
    assert records == [] and context["world_sizes"] == [] and context["records"] == 0


def test_csv_only_run_loads_with_derived_context_only_when_undigested_runs_are_allowed(tmp_path: Path) -> None:
    write_csv(RECORDS, tmp_path / "results.csv")
    with pytest.raises(StoreError, match="has no run.json, so no digests vouch for results.csv"):
        load_run(tmp_path)
    records, context = load_run(tmp_path, undigested=True)
    assert same(records, RECORDS)
    assert context["world_sizes"] == [1, 4] and context["records"] == 6
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", context["date"])
    assert "tier" not in context


def test_parquet_is_canonical_and_a_disagreeing_csv_is_refused_until_removed(tmp_path: Path) -> None:
    save_run(RECORDS[:2], INFO, tmp_path)
    write_csv(RECORDS, tmp_path / "results.csv")
    with pytest.raises(ValueError, match="results.csv is not the file this run wrote.*results.parquet is canonical"):
        load_run(tmp_path)
    (tmp_path / "results.csv").unlink()
    records, _ = load_run(tmp_path)
    assert same(records, RECORDS[:2])


def test_an_edited_or_truncated_results_file_is_refused(tmp_path: Path) -> None:
    save_run(RECORDS, INFO, tmp_path)
    csv_path, parquet = tmp_path / "results.csv", tmp_path / "results.parquet"
    data = csv_path.read_bytes()
    assert b",fail," in data
    csv_path.write_bytes(data.replace(b",fail,", b",pass,", 1))
    with pytest.raises(ValueError, match="results.csv is not the file this run wrote"):
        load_run(tmp_path)
    csv_path.write_bytes(b"".join(data.splitlines(keepends=True)[:-2]))  # truncated by two rows
    with pytest.raises(ValueError, match="results.csv is not the file"):
        load_run(tmp_path)
    csv_path.write_bytes(data)
    assert same(load_run(tmp_path)[0], RECORDS)
    save_run(RECORDS[:3], INFO, tmp_path / "short")
    parquet.write_bytes((tmp_path / "short" / "results.parquet").read_bytes())  # a valid but other Parquet file
    with pytest.raises(ValueError, match="results.parquet is not the file this run wrote"):
        load_run(tmp_path)
    parquet.unlink()
    with pytest.raises(ValueError, match="canonical file, is missing"):
        load_run(tmp_path)


def legacy(run_dir: Path, **keep: object) -> None:
    """Rewrite run.json as runs stored before schema version 2 had it (no version, no digests)."""
    path = run_dir / "run.json"
    context = json.loads(path.read_text())
    for key in ("schema_version", "files", "complete", "selection", "interrupted", "targets"):
        context.pop(key)
    path.write_text(json.dumps({**context, **keep}))


def test_a_legacy_run_is_refused_unless_allowed_then_checked_record_by_record_and_by_count(tmp_path: Path) -> None:
    save_run(RECORDS, INFO, tmp_path)
    legacy(tmp_path)
    with pytest.raises(StoreError, match="run.json is of schema version 1, so no digests vouch"):
        load_run(tmp_path)
    records, context = load_run(tmp_path, undigested=True)
    assert same(records, RECORDS) and context["schema_version"] == 1
    write_csv(RECORDS[:-1], tmp_path / "results.csv")
    with pytest.raises(ValueError, match="results.csv disagrees with results.parquet"):
        load_run(tmp_path, undigested=True)
    (tmp_path / "results.csv").unlink()
    legacy_count = json.loads((tmp_path / "run.json").read_text()) | {"records": 7}
    (tmp_path / "run.json").write_text(json.dumps(legacy_count))
    with pytest.raises(ValueError, match="holds 6 records, run.json says 7"):
        load_run(tmp_path, undigested=True)


def test_a_run_stored_without_a_column_loads_with_its_default(tmp_path: Path) -> None:
    save_run(RECORDS, INFO, tmp_path)
    legacy(tmp_path)
    older = [c for c in COLUMNS if c not in ("message", "seconds")]
    frame = pd.read_parquet(tmp_path / "results.parquet")[older]
    frame.to_parquet(tmp_path / "results.parquet", index=False)
    frame.to_csv(tmp_path / "results.csv", index=False)
    records, _ = load_run(tmp_path, undigested=True)
    expected = [dataclasses.replace(r, message="", seconds=0.0) for r in RECORDS]
    assert same(records, expected)
    (tmp_path / "results.parquet").unlink()
    assert same(load_run(tmp_path, undigested=True)[0], expected)  # the CSV alone, same defaults


def test_a_newer_schema_or_an_unknown_column_is_refused(tmp_path: Path) -> None:
    save_run(RECORDS, INFO, tmp_path)
    context = json.loads((tmp_path / "run.json").read_text())
    (tmp_path / "run.json").write_text(json.dumps({**context, "schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(ValueError, match="schema version"):
        load_run(tmp_path)
    newer = tmp_path / "newer"
    newer.mkdir()
    write_csv(RECORDS, newer / "results.csv")
    pd.read_csv(newer / "results.csv").assign(future="?").to_csv(newer / "results.csv", index=False)
    with pytest.raises(ValueError, match=r"unknown columns \['future'\]"):
        load_run(newer, undigested=True)


def test_a_run_with_a_repeated_key_is_refused(tmp_path: Path) -> None:
    save_run(RECORDS + RECORDS[:1], INFO, tmp_path)
    with pytest.raises(ValueError, match="appears twice"):
        load_run(tmp_path)


def test_parquet_metadata_holds_the_schema_version(tmp_path: Path) -> None:
    save_run(RECORDS, INFO, tmp_path)
    metadata = pq.read_schema(tmp_path / "results.parquet").metadata
    assert metadata[b"schema_version"] == str(SCHEMA_VERSION).encode()


def test_null_floats_from_other_writers_load_as_nan(tmp_path: Path) -> None:
    frame = pd.DataFrame([dataclasses.asdict(r) for r in RECORDS], columns=list(COLUMNS))
    frame.to_parquet(tmp_path / "results.parquet")  # pandas writes NaN as null
    records, _ = load_run(tmp_path, undigested=True)
    assert same(records, RECORDS)


@pytest.mark.parametrize("setup, message", [
    (lambda d: None, "holds no run"),
    (lambda d: (d / "results.parquet").write_text("not parquet"), "not a readable parquet file"),
    (lambda d: pd.DataFrame({"case_id": ["x"]}).to_parquet(d / "results.parquet"), "missing columns"),
    (lambda d: (d / "results.csv").write_text("a,b\n1,2\n"), "not a results file"),
])
def test_directory_without_a_run_is_a_clear_error(tmp_path: Path, setup, message: str) -> None:
    setup(tmp_path)
    with pytest.raises(StoreError, match=message):
        load_run(tmp_path, undigested=True)


def test_missing_directory_and_bad_run_json_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a directory"):
        load_run(tmp_path / "absent")
    save_run(RECORDS, INFO, tmp_path)
    (tmp_path / "run.json").write_text("{broken")
    with pytest.raises(ValueError, match="run.json: not valid JSON"):
        load_run(tmp_path)


def flipped(path: Path, offset: int, bit: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


def test_a_byte_flipped_in_the_parquet_file_is_refused_by_its_digest_before_it_is_parsed(tmp_path):
    """The reproduction: a flipped byte in a compressed page made pyarrow raise `OSError: Corrupt snappy
    compressed data` (a traceback, exit 1); the digest now refuses the file before it is parsed."""
    save_run(RECORDS * 1, INFO, tmp_path / "run")
    parquet = tmp_path / "run" / "results.parquet"
    pristine = parquet.read_bytes()
    def snappy_error(offset: int) -> bool:
        flipped(parquet, offset)
        try:
            pq.read_table(parquet).to_pylist()
        except OSError as exc:
            return "Corrupt snappy compressed data" in str(exc)
        except Exception:
            return False
        finally:
            parquet.write_bytes(pristine)
        return False

    offset = next((o for o in range(4, len(pristine) - 8) if snappy_error(o)), None)
    assert offset is not None, "no flipped byte upsets pyarrow; the reproduction needs another file"
    flipped(parquet, offset)
    with pytest.raises(StoreError, match="results.parquet is not the file this run wrote"):
        load_run(tmp_path / "run")


def test_a_parquet_file_without_its_run_json_is_refused_unless_allowed(tmp_path):
    """The reproduction: bytes flipped in the case ids of a bare Parquet file load as other ids (a diff
    then said "58 vanished, 58 appeared"); nothing vouches for such a file, so it is refused."""
    save_run(RECORDS, INFO, tmp_path / "run")
    (tmp_path / "run" / "run.json").unlink()
    (tmp_path / "run" / "results.csv").unlink()
    parquet = tmp_path / "run" / "results.parquet"
    data = parquet.read_bytes()
    offset = data.index(b"muon/linear/f32/s0")
    parquet.write_bytes(data[:offset] + b"muon/linear/f32/s9" + data[offset + 18:])
    assert "muon/linear/f32/s9" in {r.case_id for r in load_run(tmp_path / "run", undigested=True)[0]}
    with pytest.raises(StoreError, match="it has no run.json, so no digests vouch for results.parquet"):
        load_run(tmp_path / "run")


def edit_context(run_dir: Path, **changes: object) -> None:
    path = run_dir / "run.json"
    context = json.loads(path.read_text())
    for key, value in changes.items():
        if value is DROP:
            context.pop(key)
        else:
            context[key] = value
    path.write_text(json.dumps(context))


DROP = object()


@pytest.mark.parametrize("changes, message", [
    ({"files": None}, r"values of the wrong type or range: files=None"),
    ({"files": {"results.parquet": {"sha256": "0" * 64, "bytes": 1}}}, "files="),
    ({"records": "6"}, r"records='6'"),
    ({"seconds": "fast"}, "seconds='fast'"),
    ({"selection": "steps1"}, "selection='steps1'"),
    ({"complete": 1}, "complete=1"),
    ({"statuses": {"pass": 1}}, "statuses="),
    ({"world_sizes": [1, -4]}, r"world_sizes=\[1, -4\]"),
    ({"tier": DROP}, r"missing keys \['tier'\]"),
    ({"files": DROP, "complete": DROP}, r"missing keys \['complete', 'files'\]"),
    ({"reviewer": "me"}, r"unknown keys \['reviewer'\]"),
    ({"schema_version": "4"}, "schema version '4'"),
    ({"schema_version": True}, "schema version True"),
    ({"records": 5}, "disagrees with the run it describes .records 5, the records 6"),
    ({"statuses": {"fail": 0, "error": 1, "pass": 1, "unsupported": 1, "skipped": 3}}, "statuses"),
    ({"targets": ["torch"]}, r"targets \['torch'\], the records \['ours'\]"),
    ({"world_sizes": [1]}, r"world_sizes \[1\], the records \[1, 4\]"),
    ({"complete": False}, "complete False with interrupted ''"),
    ({"schema_version": 3}, f"schema_version 3, results.parquet's {SCHEMA_VERSION}"),
])
def test_an_inconsistent_run_json_is_a_one_line_refusal(tmp_path, changes, message):
    save_run(RECORDS, INFO, tmp_path)
    edit_context(tmp_path, **changes)
    with pytest.raises(StoreError, match=message) as caught:
        load_run(tmp_path)
    assert "\n" not in str(caught.value) and str(tmp_path) in str(caught.value)


def test_a_run_json_that_is_not_text_or_not_an_object_is_refused(tmp_path):
    save_run(RECORDS, INFO, tmp_path)
    (tmp_path / "run.json").write_bytes(b'{"tier": "\xff"}')
    with pytest.raises(StoreError, match="run.json: not UTF-8 text"):
        load_run(tmp_path)
    (tmp_path / "run.json").write_text("[1, 2]")
    with pytest.raises(StoreError, match="expected a JSON object, got list"):
        load_run(tmp_path)


def test_columns_of_the_wrong_type_or_null_are_refused(tmp_path):
    frame = pd.DataFrame([dataclasses.asdict(r) for r in RECORDS], columns=list(COLUMNS))
    frame.astype({"world_size": str}).to_parquet(tmp_path / "results.parquet")
    with pytest.raises(StoreError, match="columns of the wrong type .world_size is (large_)?string, expected int64"):
        load_run(tmp_path, undigested=True)
    frame.assign(check=[None] + ["update"] * (len(RECORDS) - 1)).to_parquet(tmp_path / "results.parquet")
    with pytest.raises(StoreError, match="row 0 has no check .null."):
        load_run(tmp_path, undigested=True)
    frame.to_parquet(tmp_path / "results.parquet")  # negative control: the same frame, typed right
    assert same(load_run(tmp_path, undigested=True)[0], RECORDS)


def test_a_csv_value_that_does_not_parse_names_the_file(tmp_path):
    write_csv(RECORDS, tmp_path / "results.csv")
    text = (tmp_path / "results.csv").read_text().replace(",64x32,1,", ",64x32,one,", 1)
    (tmp_path / "results.csv").write_text(text)
    with pytest.raises(StoreError, match=r"results.csv: invalid literal for int\(\)"):
        load_run(tmp_path, undigested=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["results.parquet", "results.csv", "run.json"]), where=st.floats(0, 1, exclude_max=True),
       bit=st.integers(0, 7))
def test_any_flipped_bit_is_refused_or_leaves_the_records_as_stored(tmp_path_factory, name, where, bit):
    """A flipped bit in a results file is always refused (its digest); one in run.json is refused, or
    (inside free text: command, platform, a date, which nothing vouches for) loads the same records."""
    folder = tmp_path_factory.mktemp("flip")
    save_run(RECORDS, INFO, folder)
    size = (folder / name).stat().st_size
    flipped(folder / name, int(where * size), bit)
    try:
        records, _ = load_run(folder)
    except StoreError as exc:
        assert "\n" not in str(exc)
        return
    assert name == "run.json" and same(records, RECORDS)
