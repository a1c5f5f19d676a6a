"""The HTML report: counts, worst-first table, data-derived filters, details, escaping, offline."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from reports.html import FILTER_COLUMNS, TABLE_COLUMNS, WORST_PASSING_DETAILS, grid_cell, render_html
from reports.records import STATUSES, Record, RunInfo, status_counts, worst_first

NAN = math.nan
PAYLOAD = "<script>alert('x')</script>"

INFO = RunInfo(
    target="muon.reference",
    tier="ci",
    backends="cpu,cuda",
    command="python -m harness run --tier ci --target 'muon.reference'",
    started="2025-01-02T03:04:05Z",
    seconds=12.5,
    torch_version="2.13.0+cpu",
    commit="abc1234",
)


def rec(case_id: str, check: str, status: str, ratio: float = NAN, **overrides: object) -> Record:
    """A record with plausible defaults; `overrides` replace any field."""
    fields = dict(
        target="muon.reference", backend="cpu", world_size=1, layout="replicated", optimizer="muon",
        layer="linear", shape="64x32", megabatch=1, flatten=False, param_dtype="float32",
        compute_dtype="float32", orthogonalizer="newton_schulz",
    )
    fields.update(overrides)
    return Record(case_id=case_id, check=check, status=status, ratio=ratio, **fields)  # type: ignore[arg-type]


RECORDS = [
    rec("muon/linear/64x32/f32/s0", "update", "pass", 0.25, rel_err=2.5e-7, tolerance=1e-6),
    rec("muon/linear/64x32/bf16/s0", "update", "fail", 3.14159, param_dtype="bfloat16",
        compute_dtype="bfloat16", rel_err=0.0314159, max_abs=0.5, max_ulp=7.0, tolerance=0.01,
        tolerance_source="bf16: 4 ulp of the FP64 oracle", message=f"diverged {PAYLOAD}",
        repro="python -m harness repro 'muon/linear/64x32/bf16/s0' --check update"),
    rec("muon/conv/3x3x16x16/bf16/s1", "update", "fail", 12.0, layer="conv", shape="16x16x3x3",
        param_dtype="bfloat16", flatten=True, rel_err=0.12, tolerance=0.01),
    rec("muon/linear/64x32/f32/s1", "orthogonality", "error", message="RuntimeError: shape mismatch"),
    rec("muon/linear/64x32/fp8/s0", "update", "unsupported", param_dtype="float8_e4m3fn",
        message="fp8 parameters are not supported"),
    rec("muon/linear/64x32/f32/s2", "update", "skipped", backend="cuda", world_size=4, layout="sharded",
        message="no GPU on this machine"),
    rec("muon/linear/64x32/f32/s3", "relation", "pass"),
    rec("muon/embedding/128x64/f32/s0", "update", "pass", 0.99, layer="embedding",
        orthogonalizer="polar_express", megabatch=8),
] + [
    rec(f"muon/linear/32x32/f32/p{i:02d}", "update", "pass", i / 100, rel_err=i * 1e-8, tolerance=1e-6)
    for i in range(25)
]


class ReportParser(HTMLParser):
    """Collects the parts of the report that the tests inspect."""

    def __init__(self) -> None:
        super().__init__()
        self.table: str | None = None
        self.in_tbody = False
        self.rows: list[dict[str, str]] = []
        self.row_links: list[str | None] = []
        self.row_cells: list[list[str]] = []
        self.summary: dict[str, str] = {}
        self.breakdown: dict[str, dict[str, dict[str, str]]] = {}
        self.options: dict[str, list[str]] = {}
        self.select: str | None = None
        self.details: dict[str, str] = {}
        self.scripts = 0
        self.external: list[tuple[str, str]] = []
        self._cell: tuple[str, str] | None = None
        self._row_value: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.external += [(k, v) for k, v in a.items() if k in ("src", "href") and not v.startswith("#")]
        if tag == "table":
            self.table = a.get("id")
        elif tag == "tbody":
            self.in_tbody = True
        elif tag == "tr" and self.in_tbody:
            self._on_row(a)
        elif tag == "td" and "data-status" in a:
            self._cell = (a["data-status"], "")
        elif tag == "td" and self.table == "results" and self.in_tbody:
            self._cell = ("row", "")
        elif tag == "a" and self.table == "results":
            self.row_links[-1] = a["href"]
        elif tag == "select":
            self.select = a["data-filter"]
            self.options[self.select] = []
        elif tag == "option" and self.select is not None:
            self.options[self.select].append(a["value"])
        elif tag == "details":
            self.details[a["id"]] = a["data-status"]
        elif tag == "script":
            self.scripts += 1

    def _on_row(self, a: dict[str, str]) -> None:
        if self.table == "results":
            self.rows.append(a)
            self.row_links.append(None)
            self.row_cells.append([])
        elif self.table and self.table.startswith("by-"):
            self._row_value = a["data-value"]
            self.breakdown.setdefault(self.table, {})[self._row_value] = {}

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell = (self._cell[0], self._cell[1] + data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self.table = None
        elif tag == "tbody":
            self.in_tbody = False
        elif tag == "select":
            self.select = None
        elif tag == "td" and self._cell is not None:
            self._store_cell(*self._cell)
            self._cell = None

    def _store_cell(self, key: str, text: str) -> None:
        if self.table == "results":
            self.row_cells[-1].append(text)
        elif self.table == "summary":
            self.summary[key] = text
        elif self.table and self.table.startswith("by-") and self._row_value is not None:
            self.breakdown[self.table][self._row_value][key] = text


def parse(doc: str) -> ReportParser:
    parser = ReportParser()
    parser.feed(doc)
    parser.close()
    return parser


@pytest.fixture(scope="module")
def doc() -> str:
    return render_html(RECORDS, INFO)


@pytest.fixture(scope="module")
def report(doc: str) -> ReportParser:
    return parse(doc)


def test_summary_counts_every_status_and_total(report: ReportParser) -> None:
    expected = {s: str(n) for s, n in status_counts(RECORDS).items()}
    assert report.summary == {**expected, "total": str(len(RECORDS))}
    assert report.summary["fail"] == "2" and report.summary["pass"] == "28"


def test_breakdowns_per_check_and_dtype(report: ReportParser) -> None:
    by_dtype = report.breakdown["by-param_dtype"]
    assert set(by_dtype) == {"bfloat16", "float32", "float8_e4m3fn"}
    assert by_dtype["bfloat16"] == {"fail": "2", "error": "0", "pass": "0", "unsupported": "0",
                                    "skipped": "0", "worst": "12"}
    assert by_dtype["float32"]["worst"] == "0.99"
    assert by_dtype["float8_e4m3fn"]["worst"] == ""
    by_check = report.breakdown["by-check"]
    assert by_check["orthogonality"]["error"] == "1"
    assert by_check["relation"]["pass"] == "1"
    assert by_check["update"]["pass"] == "27"


def test_table_rows_are_worst_first(report: ReportParser) -> None:
    expected = [(r.case_id, r.check) for r in worst_first(RECORDS)]
    assert [(row["data-case_id"], row["data-check"]) for row in report.rows] == expected
    assert report.rows[0]["data-ratio"] == "12.0" and report.rows[1]["data-ratio"] == "3.14159"
    severities = [int(row["data-severity"]) for row in report.rows]
    assert severities == sorted(severities, reverse=True) and severities[0] > severities[-1]
    passing = [row["data-ratio"] for row in report.rows if row["data-status"] == "pass"]
    assert passing[-1] == ""  # the NaN-ratio pass comes after every measured one
    assert [float(r) for r in passing[:-1]] == sorted((float(r) for r in passing[:-1]), reverse=True)


def test_rows_carry_raw_values_as_data_attributes(report: ReportParser) -> None:
    row = next(r for r in report.rows if r["data-case_id"] == "muon/linear/64x32/bf16/s0")
    assert {f"data-{c}" for c in TABLE_COLUMNS} <= set(row)
    assert row["data-rel_err"] == "0.0314159"
    assert row["data-max_ulp"] == "7.0"
    assert (row["data-layer"], row["data-param_dtype"]) == ("linear", "bfloat16")  # filters, not columns
    skipped = next(r for r in report.rows if r["data-status"] == "skipped")
    assert (skipped["data-ratio"], skipped["data-backend"], skipped["data-layout"]) == ("", "cuda", "sharded")


def test_cells_show_three_significant_digits_and_blank_nan(report: ReportParser) -> None:
    cells = {row["data-case_id"]: dict(zip(TABLE_COLUMNS, texts)) for row, texts in zip(report.rows, report.row_cells)}
    failing = cells["muon/linear/64x32/bf16/s0"]
    assert (failing["status"], failing["ratio"], failing["rel_err"], failing["allowed"], failing["rtol"]) == (
        "fail", "3.14", "0.0314", "0.01", "0.01")
    assert (failing["check"], failing["backend"], failing["max_ulp"]) == ("update", "cpu", "7")
    assert not {"layer", "shape", "megabatch", "flatten", "param_dtype", "layout"} & set(TABLE_COLUMNS)  # in the id
    error = cells["muon/linear/64x32/f32/s1"]
    assert (error["ratio"], error["rel_err"], error["allowed"], error["max_ulp"]) == ("", "", "", "")


def test_allowed_is_the_whole_allowance_next_to_rtol() -> None:
    """A passing bf16 row whose rel_err exceeds rtol (the storage-rounding term dominates) shows the
    allowance it was judged against: rel_err <= allowed exactly when it passes."""
    row = rec("muon/linear/12x20/bf16@fp32", "reference", "pass", 0.8, param_dtype="bf16", compute_dtype="fp32",
              rel_err=0.064, tolerance=0.002)
    bad = rec("muon/linear/12x20/bf16@fp32/b", "reference", "fail", 1.6, param_dtype="bf16", compute_dtype="fp32",
              rel_err=0.064, tolerance=0.002)
    report = parse(render_html([row, bad], INFO))
    cells = {r["data-case_id"]: dict(zip(TABLE_COLUMNS, texts)) for r, texts in zip(report.rows, report.row_cells)}
    assert (cells[row.case_id]["rel_err"], cells[row.case_id]["allowed"], cells[row.case_id]["rtol"]) == (
        "0.064", "0.08", "0.002")
    assert cells[bad.case_id]["allowed"] == "0.04"
    for r in report.rows:
        assert (float(r["data-rel_err"]) <= float(r["data-allowed"])) == (r["data-status"] == "pass")


def test_select_options_come_from_the_data(report: ReportParser) -> None:
    assert set(report.options) == set(FILTER_COLUMNS)
    for column in FILTER_COLUMNS:
        assert report.options[column][0] == "", column  # the "all" option
    assert report.options["status"][1:] == list(STATUSES)
    assert report.options["layer"][1:] == ["conv", "embedding", "linear"]
    assert report.options["param_dtype"][1:] == ["bfloat16", "float32", "float8_e4m3fn"]
    assert report.options["orthogonalizer"][1:] == ["newton_schulz", "polar_express"]
    assert report.options["backend"][1:] == ["cpu", "cuda"]
    assert report.options["layout"][1:] == ["replicated", "sharded"]
    assert report.options["cell"][1:] == sorted({grid_cell(r) for r in RECORDS})


def test_status_options_list_only_present_statuses() -> None:
    options = parse(render_html([r for r in RECORDS if r.status in ("pass", "skipped")], INFO)).options
    assert options["status"][1:] == ["pass", "skipped"]


def test_details_for_every_non_passing_record_and_worst_passing(report: ReportParser) -> None:
    statuses = list(report.details.values())
    non_passing = [r for r in RECORDS if r.status != "pass"]
    assert len(statuses) == len(non_passing) + WORST_PASSING_DETAILS
    assert statuses.count("pass") == WORST_PASSING_DETAILS
    linked = {row["data-case_id"]: link for row, link in zip(report.rows, report.row_links)}
    for r in non_passing:
        assert linked[r.case_id] is not None and linked[r.case_id][1:] in report.details, r.case_id
    assert linked["muon/embedding/128x64/f32/s0"] is not None  # worst passing: has details
    assert linked["muon/linear/32x32/f32/p00"] is None  # among the best passing: no details
    assert len(report.details) == len(set(report.details))


def test_details_show_every_field_with_repro_in_code(doc: str) -> None:
    start = doc.index("<details", doc.index('id="details"'))
    block = doc[start: doc.index("</details>", start)]
    assert "muon/conv/3x3x16x16/bf16/s1" in block  # the worst record comes first
    failing = doc[doc.index('<details id="case-muon_linear_64x32_bf16_s0--update"'):]
    failing = failing[: failing.index("</details>")]
    for label, value in (("tolerance source", "bf16: 4 ulp of the FP64 oracle"), ("max ulp", "7"),
                         ("optimizer", "muon"), ("seconds", "0"), ("ratio", "3.14"), ("rel err", "0.0314"),
                         ("max abs", "0.5"), ("allowed (rel_err / ratio)", "0.01"), ("tolerance", "0.01")):
        assert f"<th>{label}</th><td>{value}</td>" in failing
    assert "<code class=\"repro\">python -m harness repro &#x27;muon/linear/64x32/bf16/s0&#x27; --check update</code>" in failing
    assert "diverged &lt;script&gt;" in failing


def test_duplicate_case_and_check_get_distinct_anchors() -> None:
    twins = [rec("a/b", "update", "fail", 2.0), rec("a/b", "update", "fail", 3.0, backend="cuda"),
             rec("a_b", "update", "fail", 4.0)]
    details = parse(render_html(twins, INFO)).details
    assert len(details) == 3


def test_message_text_is_escaped(doc: str, report: ReportParser) -> None:
    assert PAYLOAD not in doc
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in doc
    assert report.scripts == 1  # only the report's own inline script


def test_self_contained_without_network(doc: str, report: ReportParser) -> None:
    assert "http://" not in doc and "https://" not in doc
    assert report.external == []
    assert "<link" not in doc and "@import" not in doc and "url(" not in doc


def test_header_shows_run_context(doc: str) -> None:
    header = doc[doc.index("<h1>"): doc.index("</dl>")]
    for value in ("muon.reference", "ci", "cpu,cuda", "2025-01-02T03:04:05Z", "12.5 s", "2.13.0+cpu",
                  "commit abc1234",  # the harness's, as a RunInfo without identities (stored before schema 5) has it
                  "unknown",  # the judged code, which such a RunInfo does not name
                  "<code>python -m harness run --tier ci --target &#x27;muon.reference&#x27;</code>"):
        assert f"<dd>{value}</dd>" in header, value


def test_legend_explains_ratio_and_pass_rule(doc: str) -> None:
    assert "<b>ratio</b> = error / tolerance" in doc
    assert "<b>allowed</b> = rel_err / ratio" in doc and "storage-rounding" in doc
    assert "passes iff ratio &le; 1" in doc
    assert "never counted as pass" in doc


def test_empty_run_renders_zero_counts() -> None:
    report = parse(render_html([], INFO))
    assert report.summary == {**{s: "0" for s in STATUSES}, "total": "0"}
    assert report.rows == [] and report.details == {}


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_inline_script_is_valid_javascript(doc: str, tmp_path) -> None:
    script = doc[doc.index("<script>") + len("<script>"): doc.index("</script>")]
    path = tmp_path / "report.js"
    path.write_text(script)
    subprocess.run(["node", "--check", str(path)], check=True, capture_output=True)


def test_title_reads_verdict_target_and_tier(doc: str) -> None:
    assert "<title>FAILED: Muon conformance of muon.reference, ci tier</title>" in doc
    assert doc[doc.index("<h1>"):doc.index("</h1>")].endswith("FAILED</span> Muon conformance of muon.reference, ci tier")
    passing = render_html([r for r in RECORDS if r.status == "pass"], INFO)
    assert "<title>PASSED: Muon conformance" in passing
    skipped = render_html([r for r in RECORDS if r.status in ("skipped", "unsupported")], INFO)
    assert "<title>NOTHING CHECKED: Muon conformance" in skipped


class GridParser(HTMLParser):
    """The coverage grid's cells: data-cell -> (class, text, link)."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = False
        self.cells: dict[str, list[str]] = {}
        self.current: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "table":
            self.inside = a.get("class") == "grid"
        elif self.inside and tag == "td" and "data-cell" in a:
            self.current = a["data-cell"]
            self.cells[self.current] = [a["class"], "", ""]
        elif self.inside and tag == "a" and self.current:
            self.cells[self.current][2] = a["href"]

    def handle_data(self, data: str) -> None:
        if self.current:
            self.cells[self.current][1] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self.current = None
        elif tag == "table":
            self.inside = False


def grid(doc: str) -> dict[str, list[str]]:
    parser = GridParser()
    parser.feed(doc)
    return parser.cells


def test_coverage_grid_says_where_anything_is_wrong(doc: str, report: ReportParser) -> None:
    """One cell per (layer, param@compute, layout) present; coloured by the worst status and ratio of
    its records; its link filters the results to exactly its rows. Comes before the results table."""
    cells = grid(doc)
    assert set(cells) == {grid_cell(r) for r in RECORDS}
    assert doc.index('id="coverage"') < doc.index('id="results"')
    assert cells["linear|bfloat16@bfloat16|replicated"][:2] == ["g-fail", "3.14"]
    assert cells["conv|bfloat16@float32|replicated"][:2] == ["g-fail", "12"]
    assert cells["linear|float32@float32|replicated"][0] == "g-error"  # an error outranks the passes beside it
    assert cells["linear|float8_e4m3fn@float32|replicated"][:2] == ["g-none", "\u2013"]
    assert cells["linear|float32@float32|sharded"][0] == "g-none"  # skipped only
    assert cells["embedding|float32@float32|replicated"][:2] == ["g-pass", "0.99"]
    for key, (_, _, href) in cells.items():
        assert href == "#cell=" + key, href
        rows = [r for r in report.rows if r["data-cell"] == key]
        assert rows and key in report.options["cell"]


def test_coverage_grid_of_a_clean_run_has_no_red_and_empty_runs_say_so() -> None:
    clean = grid(render_html([r for r in RECORDS if r.status == "pass"], INFO))
    assert clean and {c[0] for c in clean.values()} == {"g-pass"}
    assert "no records" in render_html([], INFO)


def test_summary_shades_only_statuses_that_occur() -> None:
    """A zero fail or error count is plain, not red: only a count above zero takes its status colour."""
    doc = render_html([r for r in RECORDS if r.status in ("pass", "skipped")], INFO)
    summary = doc[doc.index('<table id="summary">'):]
    summary = summary[: summary.index("</table>")]
    assert '<td class="num" data-status="fail">0</td>' in summary
    assert '<td class="num" data-status="error">0</td>' in summary
    assert '<td class="num s-pass" data-status="pass">' in summary and "s-fail" not in summary
    assert '<td class="num s-fail" data-status="fail">2</td>' in render_html(RECORDS, INFO)  # negative control


def test_the_diagnosis_column_shows_the_label_and_the_whole_text_on_hover() -> None:
    text = "lr-scale: the step is 1.08 x the reference's (a constant factor explains 97% of the error)"
    failing = rec("muon/linear/64x32/f32/lr", "reference", "fail", 1342094.1511887047, rel_err=0.5, diagnosis=text)
    report = parse(render_html([failing, *RECORDS], INFO))
    cells = {r["data-case_id"]: dict(zip(TABLE_COLUMNS, t)) for r, t in zip(report.rows, report.row_cells)}
    assert cells[failing.case_id]["diagnosis"] == "lr-scale" and cells[failing.case_id]["ratio"] == "1.34e+06"
    assert cells["muon/linear/64x32/f32/s0"]["diagnosis"] == ""
    row = next(r for r in report.rows if r["data-case_id"] == failing.case_id)
    assert row["data-diagnosis"] == text and row["data-ratio"] == "1342094.1511887047"  # sorting: full precision
    doc = render_html([failing], INFO)
    assert f'<td title="{text.replace(chr(39), "&#x27;")}">lr-scale</td>' in doc


def test_no_float_is_shown_with_more_than_three_significant_digits() -> None:
    """The reproduction: details printed `ratio 1342094.1511887047`; shown text rounds, data attributes keep it."""
    failing = rec("muon/linear/64x32/f32/lr", "reference", "fail", 1342094.1511887047, rel_err=0.123456789,
                  max_abs=2.0 / 3.0, tolerance=1.0 / 3.0, seconds=0.123456)
    doc = render_html([failing], INFO)
    shown = re.sub(r'<[^>]*>', " ", re.sub(r'<script>.*</script>', "", doc, flags=re.S))
    assert "1342094" not in shown and "0.123456" not in shown and "0.6666" not in shown, shown
    assert "1.34e+06" in shown and "0.123" in shown and "0.667" in shown and "0.333" in shown
    assert 'data-ratio="1342094.1511887047"' in doc


def test_case_ids_may_break_after_each_slash() -> None:
    doc = render_html(RECORDS, INFO)
    assert "muon/<wbr>linear/<wbr>64x32/<wbr>bf16/<wbr>s0</a>" in doc
