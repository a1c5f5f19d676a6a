"""The Markdown CI summary: verdict, counts, per-dtype worst ratio, worst rows, bounded size."""

from __future__ import annotations

import math
import re

from reports.markdown import render_markdown
from reports.records import Record, RunInfo

NAN = math.nan
INFO = RunInfo(target="muon.reference", tier="ci", backends="cpu", command="python -m harness run",
               started="2025-01-02T03:04:05Z", seconds=7.31, torch_version="2.13.0+cpu", commit="abc1234")


def rec(case_id: str, status: str, ratio: float = NAN, **overrides: object) -> Record:
    """A record with plausible defaults; `overrides` replace any field."""
    fields = dict(
        check="update", target="muon.reference", backend="cpu", world_size=1, layout="replicated",
        optimizer="muon", layer="linear", shape="64x32", megabatch=1, flatten=False, param_dtype="float32",
        compute_dtype="float32", orthogonalizer="newton_schulz", rel_err=ratio * 1e-3, tolerance=1e-3,
    )
    fields.update(overrides)
    return Record(case_id=case_id, status=status, ratio=ratio, **fields)  # type: ignore[arg-type]


PASSING = [rec(f"muon/linear/f32/p{i:02d}", "pass", i / 40) for i in range(30)] + [
    rec("muon/linear/f32/relation", "pass", check="relation"),
    rec("muon/linear/fp8/s0", "unsupported", param_dtype="float8_e4m3fn", message="<b>no fp8</b>"),
    rec("muon/linear/f32/cuda", "skipped", backend="cuda", message="no GPU"),
]
LR_SCALE = "lr-scale: the step is 1.1 x the reference's (a constant factor explains 99% of the error) | " + "x" * 200
FAILING = [
    rec("muon/linear/bf16/s0", "fail", 3.14159, param_dtype="bfloat16", diagnosis=LR_SCALE),
    rec("muon/conv/bf16/s1", "fail", 12.0, param_dtype="bfloat16", check="orthogonality"),
    rec("muon/linear/f32/s9", "error", message="RuntimeError: <boom>"),
]


def table_rows(text: str, header: str) -> list[list[str]]:
    """Cells of the data rows of the table whose header line starts with `header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:  # past the header and the alignment row
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def test_verdict_failed_on_fail_or_error() -> None:
    assert render_markdown(PASSING + FAILING, INFO).splitlines()[0].startswith("# FAILED: ")
    only_error = render_markdown(PASSING + [FAILING[2]], INFO)
    assert only_error.splitlines()[0] == "# FAILED: Muon conformance of muon.reference, ci tier"


def test_verdict_passed_when_nothing_fails() -> None:
    text = render_markdown(PASSING, INFO)
    assert text.splitlines()[0] == "# PASSED: Muon conformance of muon.reference, ci tier"
    assert "FAILED" not in text


def test_status_counts_and_worst_ratio_per_dtype() -> None:
    text = render_markdown(PASSING + FAILING, INFO)
    counts = dict(table_rows(text, "| status | count"))
    assert counts == {"fail": "2", "error": "1", "pass": "31", "unsupported": "1", "skipped": "1", "total": "36"}
    dtypes = {row[0]: row[1:] for row in table_rows(text, "| param dtype")}
    assert dtypes == {"bfloat16": ["12", "2", "2"], "float32": ["0.725", "1", "33"], "float8_e4m3fn": ["n/a", "0", "1"]}


def test_worst_failing_rows_only_and_in_order() -> None:
    text = render_markdown(PASSING + FAILING, INFO)
    assert "## Worst failing records (3 of 3)" in text
    rows = table_rows(text, "| status | case id")
    assert [row[:4] for row in rows] == [
        ["fail", "`muon/conv/bf16/s1`", "orthogonality", "12"],
        ["fail", "`muon/linear/bf16/s0`", "update", "3.14"],
        ["error", "`muon/linear/f32/s9`", "update", ""],
    ]
    assert rows[1][4:7] == ["0.00314", "0.001", "0.001"]
    assert rows[2][4:7] == ["", "", "0.001"]  # an error has no metrics, hence no allowance


def test_failing_rows_carry_their_diagnosis_clipped_and_a_passing_table_has_no_such_column() -> None:
    rows = table_rows(render_markdown(PASSING + FAILING, INFO), "| status | case id")
    diagnosis = rows[1][7]
    assert diagnosis.startswith("lr-scale: the step is 1.1 x the reference&#x27;s") or \
        diagnosis.startswith("lr-scale: the step is 1.1 x the reference's"), diagnosis
    assert "\\|" in diagnosis and diagnosis.endswith("\u2026") and len(diagnosis) < len(LR_SCALE)
    assert rows[0][7] == "" and len(rows[0]) == 8
    passing = render_markdown(PASSING, INFO)
    assert "diagnosis" not in passing and all(len(r) == 7 for r in table_rows(passing, "| status | case id"))


def test_max_rows_limits_failing_rows() -> None:
    many = [rec(f"muon/linear/bf16/f{i}", "fail", 2.0 + i) for i in range(50)]
    text = render_markdown(many, INFO, max_rows=5)
    rows = table_rows(text, "| status | case id")
    assert "(5 of 50)" in text
    assert [row[1] for row in rows] == [f"`muon/linear/bf16/f{i}`" for i in (49, 48, 47, 46, 45)]


def test_without_failures_lists_worst_by_ratio() -> None:
    text = render_markdown(PASSING, INFO, max_rows=4)
    assert "## Worst records by ratio (4 of 30, none failing)" in text
    rows = table_rows(text, "| status | case id")
    assert [(row[0], row[1], row[3]) for row in rows] == [
        ("pass", f"`muon/linear/f32/p{i}`", f"{i / 40:.3g}") for i in (29, 28, 27, 26)
    ]


def test_final_line_names_artifact_without_links() -> None:
    text = render_markdown(PASSING + FAILING, INFO, artifact="conformance-report.html")
    assert text.rstrip("\n").splitlines()[-1] == "Full report: `conformance-report.html` (HTML artifact of this job)."
    assert "http" not in text and "](" not in text


def test_context_line_and_escaping() -> None:
    odd = rec("muon/a|b/`tick`", "fail", 2.0, check="<script>x</script>")
    text = render_markdown([odd], RunInfo(**{**INFO.__dict__, "target": "t|<i>"}), max_rows=1)
    assert text.splitlines()[0] == "# FAILED: Muon conformance of t\\|&lt;i&gt;, ci tier"
    assert ("Backends: cpu · torch 2.13.0+cpu · judged code unknown · harness commit abc1234 · "
            "started 2025-01-02T03:04:05Z · 7.3 s") in text
    row = table_rows(text, "| status | case id")[0]
    assert row[1:3] == ["`` muon/a\\|b/`tick` ``", "&lt;script&gt;x&lt;/script&gt;"]
    assert "<script>" not in text


def test_summary_stays_small_for_100k_records() -> None:
    base = PASSING + FAILING + [rec("muon/" + "x" * 200 + f"/{i}", "fail", 100.0 + i) for i in range(40)]
    records = base * (100_000 // len(base) + 1)
    assert len(records) >= 100_000
    text = render_markdown(records, INFO)
    assert len(text.encode()) < 64 * 1024
    assert len(table_rows(text, "| status | case id")) == 20


def test_a_run_where_nothing_ran_is_not_reported_as_passed():
    from reports.records import Record, RunInfo
    from reports import render_markdown
    info = RunInfo(target="t", tier="ci", backends="nccl", command="c", started="s", seconds=1.0, torch_version="x")
    skipped = Record(case_id="muon/x", check="reference", target="t", backend="nccl", world_size=2, layout="shard0",
                     optimizer="muon", layer="linear", shape="4x4", megabatch=1, flatten=False, param_dtype="fp32",
                     compute_dtype="fp32", orthogonalizer="svd", status="skipped", message="no GPU")
    text = render_markdown([skipped], info)
    assert text.startswith("# NOTHING CHECKED") and "PASSED" not in text
