"""A run stored before a column existed still loads and diffs (reports/records.py SCHEMA_VERSION).

tests/data/run_schema3 is a run stored by schema version 3 (commit e227f4f, before the case columns
adjust_lr .. scope of version 4): `python -m harness run --select ID --select ID --out DIR` with the two
ids of OLD_IDS, its results.parquet, results.csv and run.json as written."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from cases import Case, schema
from harness.apps.cli import main
from reports import diff_runs
from reports.records import SCHEMA_VERSION, Record, from_row, read_csv
from reports.store import load_run

OLD_RUN = Path(__file__).parent / "data" / "run_schema3"
OLD_IDS = ("dion2-f0.25/linear-12x20/mb1/noflat/fp32@fp32/ns/spectral_norm/plain/wd0/steps3/gaussian/seed0",
           "muon/linear-12x20/mb3/noflat/fp64@fp64/svd/none/nesterov/wd0.1/steps3/tiny/seed0")


def plain(record: Record) -> tuple:
    """A record's values with NaN as None, so that two loads of one row compare equal."""
    return tuple(None if isinstance(v, float) and math.isnan(v) else v for v in dataclasses.astuple(record))


def test_a_run_stored_before_the_new_columns_loads_with_them_from_its_ids():
    records, context = load_run(OLD_RUN)
    assert context["schema_version"] == 3 < SCHEMA_VERSION
    assert {r.case_id for r in records} == set(OLD_IDS) and len(records) == 5
    for record in records:
        case = Case.from_id(record.case_id)
        assert {c.name: getattr(record, c.name) for c in schema.COLUMNS} == schema.column_values(case)
    assert [plain(r) for r in read_csv(OLD_RUN / "results.csv")] == [plain(r) for r in records]
    assert "adjust_lr" not in (OLD_RUN / "results.csv").read_text().splitlines()[0]  # truly the old schema


def test_a_row_whose_id_does_not_parse_gets_the_column_defaults():
    """Negative control of the fill: nothing is invented for a row the ids cannot explain."""
    record = from_row({"case_id": "not/an/id", "check": "reference", "target": "t", "backend": "cpu",
                       "world_size": 1, "layout": "single", "optimizer": "muon", "layer": "linear", "shape": "2x2",
                       "megabatch": 1, "flatten": False, "param_dtype": "fp32", "compute_dtype": "fp32",
                       "orthogonalizer": "svd", "status": "pass"})
    assert (record.adjust_lr, record.steps, record.seed, record.fraction) == ("", 0, -1, "")
    assert math.isnan(record.weight_decay)


def test_a_run_stored_before_the_new_columns_diffs_against_a_run_of_now(tmp_path, capsys):
    head = tmp_path / "head"
    argv = ["run", *(arg for case_id in OLD_IDS for arg in ("--select", case_id)), "--out", str(head), "--quiet"]
    assert main(argv) == 0
    base, _ = load_run(OLD_RUN)
    now, context = load_run(head)
    assert context["schema_version"] == SCHEMA_VERSION
    diff = diff_runs(base, now)
    assert diff.compared == len(base) == len(now)
    assert not any(pairs for name, pairs in diff.categories().items() if name != "tolerance_changed"), diff
    assert main(["diff", str(OLD_RUN), str(head), "--out", str(tmp_path / "diff")]) == 0
