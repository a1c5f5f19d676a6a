"""report.html, diff.html and trend.html in headless Chromium, used as a person would.

Each page must render without a JavaScript error; clicking a numeric header sorts
the rows (read back from the page); typing in the filter box or choosing a select
option hides the rows that do not match. A screenshot of each page goes to
$REPORT_SCREENSHOTS (default: the test's tmp_path). Driven with Selenium and
Debian's chromedriver; skipped only where /usr/bin/chromium is absent.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

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


def screenshot(driver, path: Path) -> None:
    """The whole page as a PNG: the window grows to the page's height (capped), then shrinks back."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, min(height + 140, 4000))
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
