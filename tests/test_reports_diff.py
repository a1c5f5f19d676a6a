"""Diff of two runs (each category exactly when it should, the regression rule, renderings) and the trend."""

from __future__ import annotations

import dataclasses
import math
import re
from html.parser import HTMLParser

import pytest

from reports.diff import CATEGORIES, Diff, diff_runs, growth_factor, incomparable
from reports.diff_html import render_diff_html, render_diff_markdown
from reports.records import Record
from reports.trend import render_trend_html

NAN = math.nan
BASE_CTX = {"commit": "abc1234", "date": "2025-01-01T00:00:00+00:00", "target": "ours", "device": "cpu"}
HEAD_CTX = {"commit": "def5678", "date": "2025-01-02T00:00:00+00:00", "target": "ours", "device": "cpu"}


def rec(case_id: str, status: str, ratio: float = NAN, **overrides: object) -> Record:
    """A record with plausible defaults; `overrides` replace any field."""
    fields = dict(check="update", target="ours", backend="cpu", world_size=1, layout="single", optimizer="muon",
                  layer="linear", shape="64x32", megabatch=1, flatten=False, param_dtype="float32",
                  compute_dtype="float32", orthogonalizer="newton_schulz", tolerance=1e-3, tolerance_source="f32")
    fields.update(overrides)
    return Record(case_id=case_id, status=status, ratio=ratio, **fields)  # type: ignore[arg-type]


# A steady background present in every run, so each test isolates one change.
STEADY = [rec(f"steady/{i}", "pass", 0.1 + i / 100) for i in range(5)] + [
    rec("steady/fail", "fail", 3.0), rec("steady/error", "error"), rec("steady/unsupported", "unsupported"),
    rec("steady/skipped", "skipped"), rec("steady/relation", "pass"),
]


def diff_of(base: list[Record], head: list[Record], **kwargs: float) -> Diff:
    return diff_runs(STEADY + base, STEADY + head, **kwargs)


def only(diff: Diff, *names: str) -> dict[str, list[tuple[str | None, str | None]]]:
    """Assert that exactly `names` are non-empty; their (base status, head status) pairs by category."""
    non_empty = {name for name, pairs in diff.categories().items() if pairs}
    assert non_empty == set(names), {n: len(p) for n, p in diff.categories().items()}
    return {n: [(b.status if b else None, h.status if h else None) for b, h in diff.categories()[n]] for n in names}


def test_identical_runs_give_an_empty_diff() -> None:
    diff = diff_runs(STEADY, [dataclasses.replace(r) for r in STEADY])
    only(diff)
    assert diff.regressed is False and diff.regressions() == [] and diff.compared == len(STEADY)


def test_new_failures_when_head_fails_and_base_did_not() -> None:
    base = [rec("a", "pass", 0.5), rec("b", "unsupported"), rec("c", "skipped")]
    head = [rec("a", "fail", 1.5), rec("b", "error"), rec("c", "fail", 2.0), rec("d", "error")]
    diff = diff_of(base, head)
    assert only(diff, "new_failures")["new_failures"] == [
        ("skipped", "fail"), ("pass", "fail"), ("unsupported", "error"), (None, "error")]
    assert diff.regressed


def test_failing_to_failing_is_no_new_failure() -> None:
    diff = diff_of([rec("a", "fail", 2.0), rec("b", "error")], [rec("a", "error"), rec("b", "fail", 2.0)])
    assert only(diff, "status_changed")["status_changed"] == [("fail", "error"), ("error", "fail")]
    assert not diff.regressed


def test_fixed_when_base_fails_and_head_passes() -> None:
    diff = diff_of([rec("a", "fail", 2.0), rec("b", "error")], [rec("a", "pass", 0.5), rec("b", "pass", 0.1)])
    assert only(diff, "fixed")["fixed"] == [("fail", "pass"), ("error", "pass")]
    assert not diff.regressed


def test_error_grew_beyond_growth_and_floor() -> None:
    base = [rec("a", "pass", 0.1), rec("b", "fail", 2.0), rec("c", "pass", 0.0), rec("d", "pass", 0.2)]
    head = [rec("a", "pass", 0.25), rec("b", "fail", 9.0), rec("c", "pass", 0.01), rec("d", "pass", 0.9)]
    diff = diff_of(base, head)
    grew = diff.error_grew
    assert [b.case_id for b, _ in grew] == ["c", "b", "d", "a"]  # largest growth first; 0 -> 0.01 is infinite
    assert [growth_factor(p) for p in grew] == [math.inf, 4.5, pytest.approx(4.5), 2.5]
    only(diff, "error_grew")
    assert diff.regressed


@pytest.mark.parametrize("before, after", [
    (0.1, 0.2),  # exactly the growth factor: not beyond it
    (1e-5, 5e-4),  # 50x, but still below the floor: noise at zero
    (NAN, 0.5),  # no ratio before
    (0.1, math.inf),  # not finite
])
def test_no_error_growth_without_finite_ratios_beyond_growth_and_floor(before: float, after: float) -> None:
    only(diff_of([rec("a", "pass", before)], [rec("a", "pass", after)]))


def test_growth_threshold_is_a_parameter() -> None:
    base, head = [rec("a", "pass", 0.01)], [rec("a", "pass", 0.05)]
    assert only(diff_of(base, head), "error_grew")
    only(diff_of(base, head, growth=10.0))
    only(diff_of(base, head, floor=0.1))
    with pytest.raises(ValueError, match="growth"):
        diff_runs(base, head, growth=0.5)


def test_error_shrank_is_the_mirror_image() -> None:
    base = [rec("a", "pass", 0.5), rec("b", "fail", 9.0), rec("c", "pass", 5e-4)]
    head = [rec("a", "pass", 0.1), rec("b", "fail", 2.0), rec("c", "pass", 1e-6)]
    diff = diff_of(base, head)
    assert only(diff, "error_shrank")["error_shrank"] == [("pass", "pass"), ("fail", "fail")]  # c: below floor
    assert [b.case_id for b, _ in diff.error_shrank] == ["a", "b"]  # most shrunk first
    assert not diff.regressed


def test_appeared_when_a_key_is_new_and_not_failing() -> None:
    diff = diff_of([], [rec("a", "pass", 0.2), rec("b", "skipped"), rec("a", "pass", 0.2, backend="cuda")])
    assert sorted(only(diff, "appeared")["appeared"]) == [(None, "pass"), (None, "pass"), (None, "skipped")]
    assert not diff.regressed


def test_vanished_when_a_key_is_gone() -> None:
    diff = diff_of([rec("a", "fail", 2.0), rec("b", "unsupported")], [])
    assert only(diff, "vanished")["vanished"] == [("fail", None), ("unsupported", None)]
    assert not diff.regressed  # nothing that passed stopped running
    diff = diff_of([rec("a", "fail", 2.0), rec("c", "pass", 0.1)], [])
    assert only(diff, "vanished")["vanished"] == [("pass", None), ("fail", None)]  # the lost pass first
    assert diff.regressed and [p[0].case_id for _, p in diff.regressions()] == ["c"]


def test_key_includes_backend_and_world_size() -> None:
    diff = diff_of([rec("a", "pass", 0.1, world_size=2)], [rec("a", "pass", 0.1, world_size=4)])
    assert only(diff, "appeared", "vanished")
    assert diff.regressed


@pytest.mark.parametrize("before, after, regressed", [
    ("pass", "unsupported", True),
    ("pass", "skipped", True),
    ("unsupported", "pass", False),
    ("skipped", "unsupported", False),
    ("fail", "skipped", False),
    ("error", "unsupported", False),
])
def test_status_changed_is_visible_and_regresses_only_when_a_pass_stops(before: str, after: str,
                                                                          regressed: bool) -> None:
    diff = diff_of([rec("a", before, 0.5 if before == "pass" else NAN)],
                   [rec("a", after, 0.5 if after == "pass" else NAN)])
    assert only(diff, "status_changed")["status_changed"] == [(before, after)]
    assert diff.regressed is regressed


def test_tolerance_changed_alongside_other_categories() -> None:
    base = [rec("a", "pass", 0.5), rec("b", "pass", 0.2), rec("c", "pass", 0.2, tolerance=NAN),
            rec("d", "fail", 2.0)]
    head = [rec("a", "pass", 0.1, tolerance=5e-3), rec("b", "pass", 0.2, tolerance_source="bf16 rule"),
            rec("c", "pass", 0.2, tolerance=NAN), rec("d", "pass", 0.2, tolerance=1e-2)]
    diff = diff_of(base, head)
    only(diff, "tolerance_changed", "error_shrank", "fixed")
    assert [b.case_id for b, _ in diff.tolerance_changed] == ["d", "a", "b"]  # 10x, then 5x, then source only
    assert not diff.regressed


def test_regressions_list_the_pairs_that_regress() -> None:
    base = [rec("a", "pass", 0.1), rec("b", "pass", 0.1), rec("c", "pass", 0.1), rec("d", "fail", 2.0)]
    head = [rec("a", "fail", 1.5), rec("b", "pass", 0.5), rec("c", "skipped"), rec("d", "pass", 0.5)]
    diff = diff_of(base, head)
    assert [(name, p[0].case_id) for name, p in diff.regressions()] == [
        ("new_failures", "a"), ("error_grew", "b"), ("status_changed", "c")]


def test_repeated_key_is_an_error() -> None:
    with pytest.raises(ValueError, match="twice"):
        diff_runs([rec("a", "pass", 0.1), rec("a", "pass", 0.2)], [])


# ---- renderings ------------------------------------------------------------------------------------------

PAYLOAD = "<script>alert('x')</script>"
BASE = [rec(f"f32/s{i:02d}", "pass", 0.01 * (i + 1)) for i in range(30)] + [
    rec("bf16/s0", "fail", 4.0), rec("gone", "pass", 0.2)]
HEAD = [rec(f"f32/s{i:02d}", "pass", 0.01 * (i + 1) * 3) for i in range(20)] + [
    rec(f"f32/s{i:02d}", "fail", 1.5 + i, message=PAYLOAD) for i in range(20, 30)] + [
    rec("bf16/s0", "pass", 0.5), rec("new", "pass", 0.3)]


class Tables(HTMLParser):
    """Rows (their data attributes) per table id, and every external reference."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, list[dict[str, str]]] = {}
        self.external: list[str] = []
        self._table: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.external += [v for k, v in a.items() if k in ("src", "href") and not v.startswith("#")]
        if tag == "table":
            self._table = a.get("id", "")
            self.rows[self._table] = []
        elif tag == "tr" and self._table and "data-case_id" in a:
            self.rows[self._table].append(a)


@pytest.fixture(scope="module")
def diff() -> Diff:
    return diff_runs(BASE, HEAD)


@pytest.fixture(scope="module")
def page(diff: Diff) -> str:
    return render_diff_html(diff, BASE_CTX, HEAD_CTX)


def test_html_has_a_section_per_category_with_counts_worst_first(diff: Diff, page: str) -> None:
    tables = Tables()
    tables.feed(page)
    for name in CATEGORIES:
        pairs = diff.categories()[name]
        assert f'<section id="cat-{name}"><h2>{name.replace("_", " ")} ({len(pairs)})</h2>' in page
        assert len(tables.rows.get(f"table-{name}", [])) == len(pairs)
    grew = [float(r["data-growth"]) for r in tables.rows["table-error_grew"]]
    assert grew == sorted(grew, reverse=True) and len(grew) == 20
    failures = tables.rows["table-new_failures"]
    assert [r["data-head_ratio"] for r in failures[:2]] == ["30.5", "29.5"]
    assert {r["data-regression"] for r in failures} == {"yes"}
    assert tables.rows["table-vanished"][0]["data-head_status"] == "absent"
    assert tables.rows["table-fixed"][0]["data-regression"] == "no"


def test_html_verdict_context_and_escaping(diff: Diff, page: str) -> None:
    assert "<h1 class=\"regressed\">REGRESSED: " in page
    assert "<td>commit abc1234</td><td class=\"changed\">commit def5678</td>" in page  # runs stored before schema 5
    assert PAYLOAD not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    ok = render_diff_html(diff_runs(BASE, BASE), BASE_CTX, BASE_CTX)
    assert "<h1 class=\"ok\">OK: " in ok


def test_html_is_self_contained(page: str) -> None:
    tables = Tables()
    tables.feed(page)
    assert "http://" not in page and "https://" not in page
    assert tables.external == [] and "<link" not in page and "url(" not in page
    assert page.count("<script>") == 1


def test_markdown_verdict_counts_and_pointer(diff: Diff) -> None:
    text = render_diff_markdown(diff, BASE_CTX, HEAD_CTX)
    assert text.splitlines()[0] == "# REGRESSED: conformance diff, head def5678 against base abc1234"
    counts = dict(re.findall(r"^\| ([a-z ]+) \| (\d+) \| \d+ \|$", text, re.M))
    assert counts == {name.replace("_", " "): str(len(p)) for name, p in diff.categories().items()}
    assert "## new failures (10 of 10)" in text and "## error grew (15 of 20)" in text
    assert "+5 more in `diff.html`." in text
    assert text.rstrip("\n").splitlines()[-1] == "Full diff: `diff.html` (HTML artifact of this job)."
    assert "http" not in text and "](" not in text and "<script>" not in text


def test_markdown_rows_worst_first(diff: Diff) -> None:
    text = render_diff_markdown(diff, BASE_CTX, HEAD_CTX, artifact="nightly-diff.html")
    section = text[text.index("## new failures"):text.index("## error grew")]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| `")]
    assert [row[0] for row in rows[:3]] == ["| `f32/s29`", "| `f32/s28`", "| `f32/s27`"]
    assert rows[0][3:] == ["pass", "fail", "0.3", "30.5", "102 |"]
    assert text.rstrip("\n").endswith("`nightly-diff.html` (HTML artifact of this job).")


def test_markdown_ok_without_regression() -> None:
    diff = diff_runs(BASE, BASE)
    text = render_diff_markdown(diff, BASE_CTX, HEAD_CTX)
    assert text.startswith("# OK: ") and "## " not in text


def test_markdown_stays_under_1mb_for_50k_changed_records() -> None:
    n = 50_000
    long = "x" * 300
    base = [rec(f"muon/{long}/{i}", "pass" if i % 3 else "fail", 0.5 if i % 3 else 2.0) for i in range(n)]
    head = [rec(f"muon/{long}/{i}", "fail" if i % 3 else "pass", 1.5 if i % 3 else 0.2, tolerance=2e-3)
            for i in range(n)]
    diff = diff_runs(base, head)
    assert len(diff.new_failures) + len(diff.fixed) == n and len(diff.tolerance_changed) == n
    text = render_diff_markdown(diff, BASE_CTX, HEAD_CTX)
    assert len(text.encode()) < 1_000_000
    assert len(text.encode()) < 64 * 1024  # in fact far below
    assert f"+{len(diff.new_failures) - 15} more" in text


# ---- trend over many runs -----------------------------------------------------------------------------------

def trend_runs() -> list[tuple[dict[str, object], list[Record]]]:
    """Five runs given out of date order; 'drift' grows 10x, 'late' (its own check) misses the second run."""
    runs = []
    for day, scale in ((3, 3.0), (1, 1.0), (5, 10.0), (2, 2.0), (4, 5.0)):
        records = [rec("drift", "pass", 0.05 * scale), rec("flat", "pass", 0.2),
                   rec("flat", "pass", 0.3, check="orthogonality"), rec("zero", "pass", 0.0)]
        if day != 2:
            records.append(rec("late", "fail", 2.0 + day, check="commutation", message=PAYLOAD))
        runs.append(({"date": f"2025-01-0{day}T00:00:00+00:00", "commit": f"c{day}"}, records))
    return runs


def figure(page: str, check: str) -> str:
    start = page.index(f'<figure id="chart-{check}">')
    return page[start:page.index("</figure>", start)]


def test_trend_orders_runs_by_date_and_ranks_series() -> None:
    page = render_trend_html(trend_runs())
    tables = Tables()
    tables.feed(page)
    assert re.findall(r"<td>(c\d)</td>", page) == ["c1", "c2", "c3", "c4", "c5"]
    worst = tables.rows["series-worst"]
    assert [(r["data-case_id"], r["data-check"]) for r in worst] == [
        ("late", "commutation"), ("drift", "update"), ("flat", "orthogonality"), ("flat", "update"),
        ("zero", "update")]
    assert (worst[0]["data-first"], worst[0]["data-last"], worst[0]["data-runs"]) == ("3.0", "7.0", "4")
    changed = tables.rows["series-changed"]
    assert changed[0]["data-case_id"] == "drift" and float(changed[0]["data-change"]) == pytest.approx(10.0)
    assert float(changed[1]["data-change"]) == pytest.approx(7 / 3)


def test_trend_charts_per_check_with_gaps_and_no_network() -> None:
    page = render_trend_html(trend_runs())
    assert re.findall(r'<figure id="chart-([a-z]+)">', page) == ["commutation", "orthogonality", "update"]
    update = figure(page, "update")
    assert update.count("<circle") == 10  # max and median of each of five runs
    assert "<title>2025-01-05T00:00:00+00:00: max 0.5</title>" in update
    assert "<title>2025-01-05T00:00:00+00:00: median 0.2</title>" in update
    late = figure(page, "commutation")
    assert late.count("<circle") == 8  # no point for the run without it
    paths = re.findall(r'<path d="([^"]*)"[^>]*data-line="max"', late)
    assert len(paths) == 1 and paths[0].count("M") == 2  # the line breaks at the gap
    assert "http://" not in page and "https://" not in page and PAYLOAD not in page
    assert page.count("<script>") == 1


def test_trend_of_no_runs_renders() -> None:
    page = render_trend_html([])
    assert "trend over 0 runs" in page and "<figure" not in page


@pytest.mark.parametrize("growth", [math.nan, math.inf, 0.99])
def test_a_growth_that_would_switch_detection_off_is_refused(growth: float) -> None:
    with pytest.raises(ValueError, match="growth must be a finite number of at least 1"):
        diff_runs([], [], growth=growth)


def test_incomparable_names_each_difference_and_skips_what_a_run_did_not_record() -> None:
    base = {"tier": "ci", "targets": ["ours"], "backends": "cpu", "selection": [], "complete": True}
    assert incomparable(base, dict(base)) == []
    head = {**base, "tier": "nightly", "targets": ["torch"], "selection": ("linear",)}
    assert incomparable(base, head) == ["tier 'ci' vs 'nightly'", "targets 'ours' vs 'torch'",
                                        "selection '(all)' vs 'linear'"]
    legacy = {k: v for k, v in head.items() if k not in ("tier", "selection", "complete")}
    assert incomparable(base, legacy) == ["targets 'ours' vs 'torch'"]
