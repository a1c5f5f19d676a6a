"""report.html, diff.html and trend.html in headless Chromium, used as a person would.

Each page must render without a JavaScript error; clicking a numeric header sorts
the rows (read back from the page); typing in the filter box or choosing a select
option hides the rows that do not match. On a laptop's 1,400 px and a desktop's
1,920 px, pages of a realistic run (the CI tier's own ids, messages and diagnoses
as the harness words them) must not scroll sideways, a results or diff row must
take at most two lines, and a zero fail or error count must not be shaded. A
screenshot of each page goes to $REPORT_SCREENSHOTS (default: the test's tmp_path).
Driven with Selenium and Debian's chromedriver; skipped only where
/usr/bin/chromium is absent.
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

from cases import Case, schema
from harness.running.selection import select
from reports import render_html
from reports.html import grid_cell
from reports.diff import diff_runs
from reports.diff_html import render_diff_html
from reports.records import Record, RunInfo
from reports.trend import render_trend_html

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is absent (CI installs Debian's chromium)")

INFO = RunInfo(target="ours", tier="ci", backends="cpu", command="python -m harness run",
               started="2025-01-02T03:04:05+00:00", seconds=3.0, torch_version="2.13.0+cpu", commit="abc1234")


def rec(case_id: str, status: str, ratio: float = math.nan, **overrides: object) -> Record:
    """A record with plausible defaults; `overrides` replace any field."""
    fields = dict(check="update", target="ours", backend="cpu", world_size=1, layout="single", optimizer="muon",
                  layer="linear", shape="64x32", megabatch=1, flatten=False, param_dtype="float32",
                  compute_dtype="float32", orthogonalizer="newton_schulz", tolerance=1e-3, tolerance_source="f32")
    fields.update(overrides)
    return Record(case_id=case_id, status=status, ratio=ratio, **fields)  # type: ignore[arg-type]


RUN = [rec(f"muon/linear/f32/s{i:02d}", "pass", (i * 37 % 23) / 25) for i in range(20)] + [
    rec("muon/linear/bf16/s0", "fail", 3.5, param_dtype="bfloat16"),
    rec("muon/linear/bf16/s1", "fail", 1.7, param_dtype="bfloat16"),
    rec("muon/linear/f32/err", "error", message="RuntimeError: boom"),
    rec("muon/linear/fp8/s0", "unsupported", param_dtype="float8_e4m3fn"),
]
BASE = [rec(f"muon/linear/f32/s{i:02d}", "pass", 0.01 * (i + 1)) for i in range(12)] + [
    rec("muon/linear/bf16/s0", "fail", 4.0), rec("muon/linear/gone", "pass", 0.2)]
HEAD = (
    [rec(f"muon/linear/f32/s{i:02d}", "pass", 0.01 * (i + 1) * (1 + i % 4 * 2)) for i in range(10)]
    + [rec("muon/linear/f32/s10", "fail", 1.5), rec("muon/linear/f32/s11", "skipped", message="no GPU"),
       rec("muon/linear/bf16/s0", "pass", 0.5), rec("muon/linear/new", "pass", 0.3)]
)


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory):
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}", "--window-size=1400,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=str(CHROMEDRIVER)))
    yield browser
    browser.quit()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("REPORT_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def open_page(driver, doc: str, path: Path) -> None:
    """Load `doc` from a file and fail on any console error it raised while loading."""
    path.write_text(doc)
    driver.get_log("browser")  # drop what earlier pages logged
    driver.get(path.as_uri())
    assert driver.title, "page has no title"
    assert_no_console_errors(driver)


def assert_no_console_errors(driver) -> None:
    """No error logged to the console (a JavaScript exception included) since the last look."""
    errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == [], errors


def screenshot(driver, path: Path, width: int = 1400) -> None:
    """The whole page as a PNG at `width`: the window grows to the page's height (capped), then shrinks back."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(width, min(height + 140, 4000))
    assert driver.save_screenshot(str(path)), path
    driver.set_window_size(1400, 1000)
    assert path.stat().st_size > 10_000


def rows(driver, table_id: str) -> list:
    return driver.find_elements(By.CSS_SELECTOR, f"#{table_id} tbody tr")


def header(driver, table_id: str, key: str):
    return driver.find_element(By.CSS_SELECTOR, f'#{table_id} th[data-key="{key}"]')


def numbers(values: list[str]) -> list[float]:
    """Data attribute values as numbers; blank (NaN) must come last, so it is dropped after checking."""
    blanks = [i for i, v in enumerate(values) if v == ""]
    assert blanks == list(range(len(values) - len(blanks), len(values))), values
    return [float(v) for v in values if v != ""]


def clear(box) -> None:
    """Empty a text box by backspacing, as a person would (this fires input events)."""
    box.send_keys(Keys.BACKSPACE * len(box.get_attribute("value")))


def visible(elements: list) -> list:
    return [e for e in elements if e.is_displayed()]


def test_report_sorts_filters_and_renders(driver, tmp_path: Path, shots: Path) -> None:
    open_page(driver, render_html(RUN, INFO), tmp_path / "report.html")
    shown = driver.find_element(By.ID, "shown")
    assert shown.text == f"{len(RUN)} of {len(RUN)} rows shown"

    header(driver, "results", "ratio").click()
    ratios = numbers([r.get_attribute("data-ratio") for r in rows(driver, "results")])
    assert ratios == sorted(ratios, reverse=True) and ratios[0] == 3.5
    header(driver, "results", "ratio").click()
    ratios = numbers([r.get_attribute("data-ratio") for r in rows(driver, "results")])
    assert ratios == sorted(ratios) and ratios[-1] == 3.5

    driver.find_element(By.ID, "filter-text").send_keys("bf16")
    shown_rows = visible(rows(driver, "results"))
    assert sorted(r.get_attribute("data-case_id") for r in shown_rows) == ["muon/linear/bf16/s0", "muon/linear/bf16/s1"]
    assert shown.text == f"2 of {len(RUN)} rows shown"
    clear(driver.find_element(By.ID, "filter-text"))
    assert shown.text == f"{len(RUN)} of {len(RUN)} rows shown"

    Select(driver.find_element(By.ID, "filter-status")).select_by_value("fail")
    assert sorted(r.get_attribute("data-case_id") for r in visible(rows(driver, "results"))) == [
        "muon/linear/bf16/s0", "muon/linear/bf16/s1"]
    Select(driver.find_element(By.ID, "filter-status")).select_by_value("")
    assert len(visible(rows(driver, "results"))) == len(RUN)
    assert_no_console_errors(driver)
    screenshot(driver, shots / "report.png")


def test_report_grid_cells_filter_the_results(driver, tmp_path: Path, shots: Path) -> None:
    """Clicking a coverage grid cell shows exactly that cell's rows; a `#cell=` link does the same on
    load; choosing "all" in the cell filter shows every row again."""
    open_page(driver, render_html(RUN, INFO), tmp_path / "report.html")
    cell = driver.find_element(By.CSS_SELECTOR, '#coverage td.g-fail a')
    key = cell.get_attribute("data-cell")
    assert key == "linear|bfloat16@float32|single" and cell.text == "3.5"
    cell.click()
    wanted = sorted(r.case_id for r in RUN if grid_cell(r) == key)
    assert sorted(r.get_attribute("data-case_id") for r in visible(rows(driver, "results"))) == wanted
    assert driver.find_element(By.ID, "shown").text == f"{len(wanted)} of {len(RUN)} rows shown"
    screenshot(driver, shots / "report-cell.png")
    Select(driver.find_element(By.ID, "filter-cell")).select_by_value("")
    assert len(visible(rows(driver, "results"))) == len(RUN)
    driver.get("about:blank")
    driver.get((tmp_path / "report.html").as_uri() + "#cell=" + key)
    assert sorted(r.get_attribute("data-case_id") for r in visible(rows(driver, "results"))) == wanted
    assert_no_console_errors(driver)


def test_diff_sorts_filters_and_renders(driver, tmp_path: Path, shots: Path) -> None:
    diff = diff_runs(BASE, HEAD)
    assert diff.error_grew and diff.new_failures and diff.fixed and diff.vanished and diff.appeared
    base_ctx = {"commit": "abc1234", "date": "2025-01-01T00:00:00+00:00", "target": "ours"}
    head_ctx = {"commit": "def5678", "date": "2025-01-02T00:00:00+00:00", "target": "ours"}
    open_page(driver, render_diff_html(diff, base_ctx, head_ctx), tmp_path / "diff.html")
    assert driver.find_element(By.TAG_NAME, "h1").text.startswith("REGRESSED")
    total = sum(len(pairs) for pairs in diff.categories().values())
    assert driver.find_element(By.ID, "shown").text == f"{total} of {total} rows shown"

    growth = header(driver, "table-error_grew", "growth")
    growth.click()
    growths = numbers([r.get_attribute("data-growth") for r in rows(driver, "table-error_grew")])
    assert growths == sorted(growths, reverse=True) and len(growths) == len(diff.error_grew)
    growth.click()
    growths = numbers([r.get_attribute("data-growth") for r in rows(driver, "table-error_grew")])
    assert growths == sorted(growths)

    driver.find_element(By.ID, "filter-text").send_keys("s03")
    shown = visible(driver.find_elements(By.CSS_SELECTOR, "table.filterable tbody tr"))
    assert [r.get_attribute("data-case_id") for r in shown] == ["muon/linear/f32/s03"]
    clear(driver.find_element(By.ID, "filter-text"))

    Select(driver.find_element(By.ID, "filter-regression")).select_by_value("yes")
    shown = visible(driver.find_elements(By.CSS_SELECTOR, "table.filterable tbody tr"))
    assert len(shown) == len(diff.regressions())
    assert all("regression" in r.get_attribute("class").split() for r in shown)
    assert visible(rows(driver, "table-fixed")) == []
    Select(driver.find_element(By.ID, "filter-regression")).select_by_value("")
    assert_no_console_errors(driver)
    screenshot(driver, shots / "diff.png")


def test_trend_renders_charts(driver, tmp_path: Path, shots: Path) -> None:
    runs = [({"date": f"2025-01-{day:02d}T00:00:00+00:00", "commit": f"c{day}", "target": "ours"},
             [rec(f"muon/linear/f32/s{i:02d}", "pass", 0.01 * (i + 1) * day, check=check)
              for i in range(10) for check in ("update", "orthogonality")])
            for day in (3, 1, 2, 5, 4)]
    open_page(driver, render_trend_html(runs), tmp_path / "trend.html")
    charts = driver.find_elements(By.CSS_SELECTOR, "figure svg")
    assert len(charts) == 2 and all(c.size["height"] > 100 for c in charts)
    header(driver, "series-worst", "last").click()
    last = numbers([r.get_attribute("data-last") for r in rows(driver, "series-worst")])
    assert last == sorted(last, reverse=True) and last[0] == pytest.approx(0.5)
    assert_no_console_errors(driver)
    screenshot(driver, shots / "trend.png")


WIDTHS = (1400, 1920)
"""A laptop's and a desktop's window width, in CSS pixels."""
LR_SCALE = "lr-scale: the step is 0.25 x the reference's (a constant factor explains 100% of the error)"
MESSAGE = ("worst at member 0 step 1: ||err|| = 4.58e+14 x allowed (BEYOND tolerance); rel_err 0.75 vs allowed "
           "1.64e-15 (rtol 8.88178e-16 + storage rounding), max_abs 0.00902, max_ulp 8.47e+15")
ILL_POSED = ("ill-posed: derived muon bf16@bf16/poly-mild/ill: rtol 1.51 = c 0.24 x u(bf16) 0.00391 x amplification "
             "1.61e+03 of the orthogonalized direction (condition 4.13e+03); c is 2x the worst 0.117 measured over 15 "
             "cases (measured on cpu, 2026-11-29) exceeds 0.25, where rounding alone moves the update as far as a "
             "wrong update would")
"""A diagnosis, a message and a skip reason as `python -m harness run --target
harness.apps.selftest_catalog:lr_rms_min` worded them on the CI tier."""


@functools.lru_cache(maxsize=None)
def realistic(failing_every: int = 0, errors: bool = False) -> tuple[Record, ...]:
    """A check of every case of the CI tier (reference, megabatch or finite in turn), with the case's own
    columns; every `failing_every`-th case fails (ratios up to 1.34e+14, with the message and diagnosis
    above), every 13th is skipped as ill-posed, and with `errors` every 47th raises."""
    records = []
    for i, case in enumerate(select("ci", [])):
        columns = schema.column_values(Case.from_id(case.id))
        for check in (("reference", "megabatch", "finite")[i % 3],):
            fails = failing_every and i % failing_every == 0
            status = ("error" if errors and i % 47 == 5 else "fail" if fails
                      else "skipped" if i % 13 == 7 else "pass")
            ratio = 1.3420941511887047 * 10.0 ** (i % 15) if fails else (i * 37 % 97) / 100
            records.append(Record(
                case_id=case.id, check=check, target="ours", backend="cpu", status=status,
                ratio=math.nan if status in ("error", "skipped") else ratio, rel_err=ratio * 1.6e-15,
                max_abs=ratio * 2e-17, max_ulp=ratio * 18.4, tolerance=8.88178e-16, tolerance_source="fp64: measured",
                message={"fail": MESSAGE, "skipped": ILL_POSED, "error": "RuntimeError: boom"}.get(status, ""),
                diagnosis=LR_SCALE if status == "fail" else "", **columns))
    return tuple(records)


def measure(driver, rows: str) -> dict:
    """What a person sees at this width: the page's and the window's width, and the tallest of the
    `rows` (a CSS selector) against a row of one line of text in the same table."""
    return driver.execute_script("""
        const rows = Array.from(document.querySelectorAll(arguments[0]));
        const probe = rows[0].cloneNode(true);
        probe.querySelectorAll("td").forEach(td => { td.textContent = "x"; });
        rows[0].parentNode.appendChild(probe);
        const oneLine = probe.getBoundingClientRect().height;
        probe.remove();
        return {page: document.scrollingElement.scrollWidth, window: window.innerWidth, oneLine: oneLine,
                tallest: Math.max(...rows.map(r => r.getBoundingClientRect().height))};""", rows)


def fits(seen: dict) -> bool:
    """No sideways scrolling, and no row taller than two lines of text (two one-line rows' height)."""
    return seen["page"] <= seen["window"] and seen["tallest"] <= 2 * seen["oneLine"]


def background(driver, selector: str) -> str:
    return driver.execute_script("return getComputedStyle(document.querySelector(arguments[0])).backgroundColor",
                                 selector)


@pytest.mark.parametrize("width", WIDTHS)
def test_a_realistic_report_fits_the_window_in_rows_of_two_lines(driver, tmp_path: Path, shots: Path,
                                                                 width: int) -> None:
    run = realistic(failing_every=9, errors=True)
    driver.set_window_size(width, 1000)
    open_page(driver, render_html(list(run), INFO), tmp_path / "report.html")
    seen = measure(driver, "#results tbody tr")
    assert fits(seen), seen
    assert driver.find_element(By.CSS_SELECTOR, "#results tbody tr td:nth-child(5)").text == "lr-scale"  # diagnosis
    red = "rgb(251, 213, 213)"
    assert background(driver, '#summary td[data-status="fail"]') == red
    assert background(driver, '#summary td[data-status="error"]') == red
    assert background(driver, '#summary td[data-status="unsupported"]') == "rgba(0, 0, 0, 0)"
    screenshot(driver, shots / f"report-{width}.png", width)
    driver.set_window_size(width, 1000)
    open_page(driver, render_html(list(realistic()), INFO), tmp_path / "passing.html")
    for status in ("fail", "error"):  # zero: not shaded
        assert background(driver, f'#summary td[data-status="{status}"]') == "rgba(0, 0, 0, 0)", status
    assert background(driver, '#summary td[data-status="pass"]') == "rgb(215, 245, 215)"


@pytest.mark.parametrize("width", WIDTHS)
def test_a_realistic_diff_fits_the_window_in_rows_of_two_lines(driver, tmp_path: Path, shots: Path,
                                                               width: int) -> None:
    diff = diff_runs(list(realistic()), list(realistic(failing_every=7, errors=True)))
    assert diff.new_failures and diff.regressed
    context = {"commit": "abc1234", "date": "2026-12-01T00:00:00+00:00", "target": "ours", "tier": "ci"}
    driver.set_window_size(width, 1000)
    open_page(driver, render_diff_html(diff, context, {**context, "commit": "def5678"}), tmp_path / "diff.html")
    seen = measure(driver, "table.filterable tbody tr")
    assert fits(seen), seen
    note = driver.find_element(By.CSS_SELECTOR, "#table-new_failures tbody tr td:last-child")
    clipped = driver.execute_script("const d = arguments[0].querySelector('div.clip'); "
                                    "return d.scrollWidth > d.clientWidth", note)
    assert note.get_attribute("title") == MESSAGE and clipped  # one line, ending in an ellipsis; all on hover
    screenshot(driver, shots / f"diff-{width}.png", width)
    driver.set_window_size(width, 1000)
    driver.execute_script("document.querySelectorAll('div.clip').forEach(d => { d.style.whiteSpace = 'normal'; })")
    assert not fits(measure(driver, "table.filterable tbody tr")), "negative control: notes of several lines"


@pytest.mark.parametrize("width", WIDTHS)
def test_a_realistic_trend_fits_the_window(driver, tmp_path: Path, shots: Path, width: int) -> None:
    runs = [({"date": f"2026-11-{day:02d}T00:00:00+00:00", "commit": f"c{day}", "target": "ours"},
             list(realistic(failing_every=day + 5))) for day in range(1, 6)]
    driver.set_window_size(width, 1000)
    open_page(driver, render_trend_html(runs), tmp_path / "trend.html")
    seen = measure(driver, "#series-worst tbody tr")
    assert fits(seen), seen
    screenshot(driver, shots / f"trend-{width}.png", width)
    driver.set_window_size(width, 1000)
    driver.execute_script("document.body.insertAdjacentHTML('beforeend', '<pre>' + 'x'.repeat(400) + '</pre>')")
    assert not fits(measure(driver, "#series-worst tbody tr")), "negative control: a line wider than the window"
