"""Reports of a conformance run: machine-readable records, HTML and Markdown; stored runs, diffs, trends."""

from reports.diff import Diff, diff_runs
from reports.diff_html import render_diff_html, render_diff_markdown
from reports.html import render_html
from reports.markdown import render_markdown
from reports.records import (COLUMNS, STATUSES, CodeIdentity, Record, RunInfo, read_csv, status_counts, worst_first,
                             write_csv)
from reports.run_folder import StoreError
from reports.store import load_run, save_run
from reports.trend import render_trend_html

__all__ = [
    "COLUMNS",
    "CodeIdentity",
    "STATUSES",
    "Diff",
    "Record",
    "StoreError",
    "RunInfo",
    "diff_runs",
    "load_run",
    "read_csv",
    "render_diff_html",
    "render_diff_markdown",
    "render_html",
    "render_markdown",
    "render_trend_html",
    "save_run",
    "status_counts",
    "worst_first",
    "write_csv",
]
