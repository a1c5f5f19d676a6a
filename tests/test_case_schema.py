"""The case axes declared once (cases/schema.py): the id, its parser, the record columns, the property
tests' draws and the report's filters all come from that table."""

from __future__ import annotations

import dataclasses

import pytest

from cases import Case, schema, strategies, tier
from reports.html import FILTER_COLUMNS, render_html
from reports.records import COLUMNS, REQUIRED, SCHEMA_VERSION, Record

IDS = ("dion2-f0.25/linear-12x20/mb1/noflat/fp32@fp32/ns/spectral_norm/plain/wd0/steps3/gaussian/seed0",
           "muon/linear-12x20/mb3/noflat/fp64@fp64/svd/none/nesterov/wd0.1/steps3/tiny/seed0")


def test_every_case_field_is_spelled_by_exactly_one_token_and_has_a_domain():
    spelled = [name for token in schema.TOKENS for name in token.fields]
    fields = [f.name for f in dataclasses.fields(Case)]
    assert sorted(spelled) == sorted(fields)
    assert set(strategies.AXES) == set(fields)


def test_the_parser_takes_the_required_tokens_up_to_all_of_them():
    single = tier("ci")[0]
    distributed = next(c for c in tier("ci") if c.world_size > 1)
    assert len(single.id.split("/")) == schema.REQUIRED_TOKENS
    assert len(distributed.id.split("/")) == len(schema.TOKENS)
    assert Case.from_id(distributed.id) == distributed
    for bad in ("/".join(distributed.id.split("/")[:-1]),      # a layout without its world size
                distributed.id + "/ws2",                        # one token too many
                single.id.replace("/seed0", "")):               # one required token missing
        with pytest.raises(ValueError, match="case id"):
            Case.from_id(bad)


def test_records_carry_every_schema_column_with_its_case_value():
    """The runner's records take their case columns from the table: each value is the column's."""
    from harness.runner import run_case
    from harness.targets import load_target

    case = Case.from_id(IDS[0])
    records = run_case(case, load_target("ours"), "ours")
    assert records and {r.status for r in records} == {"pass"}
    for record in records:
        for column in schema.COLUMNS:
            value = getattr(record, column.name)
            assert isinstance(value, column.kind) and value == column.value(case), column.name
    first = records[0]
    assert (first.fraction, first.steps, first.grad, first.nesterov) == ("0.25", 3, "gaussian", "plain")
    v1 = [c.name for c in schema.COLUMNS if c.since == 1]
    assert list(REQUIRED) == ["case_id", "check", "target", "backend", *v1, "status"]
    assert [c.name for c in schema.COLUMNS if c.since > 1] == list(COLUMNS[-len(schema.COLUMNS) + len(v1):])
    assert max(c.since for c in schema.COLUMNS) <= SCHEMA_VERSION


def test_the_report_filters_by_the_schema_filter_columns_and_rows_carry_them():
    case = Case.from_id(IDS[0])
    record = Record(case_id=case.id, check="reference", target="ours", backend="cpu", status="pass",
                    **schema.column_values(case))
    assert set(schema.FILTERS) <= set(FILTER_COLUMNS)
    from reports.records import RunInfo
    html = render_html([record], RunInfo(target="ours", tier="ci", backends="cpu", command="c", started="s",
                                         seconds=0.0, torch_version="t"))
    for column in schema.FILTERS:
        assert f'data-filter="{column}"' in html and f'data-{column}="{getattr(record, column)}"' in html, column


def test_the_property_tests_draw_each_axis_from_its_schema_domain(monkeypatch):
    """Narrow two domains in the table and every drawn case follows (the strategies read the table)."""
    from hypothesis import HealthCheck, given, settings

    from cases.strategies import cases

    monkeypatch.setitem(strategies.AXES, "megabatch", dataclasses.replace(strategies.AXES["megabatch"], values=(5,)))
    monkeypatch.setitem(strategies.AXES, "adjust_lr", dataclasses.replace(strategies.AXES["adjust_lr"], values=("rms_norm",)))
    drawn = []

    # timing is not under test here, and this 2-core machine is shared: no deadline, no too_slow check
    @settings(max_examples=20, database=None, derandomize=True, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(cases())
    def draw(case):
        drawn.append(case)

    draw()
    assert drawn and {(c.megabatch, c.adjust_lr) for c in drawn} == {(5, "rms_norm")}
