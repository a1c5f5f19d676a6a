"""The files of a finished run, written by `python -m harness run` and by the pytest plugin alike:
the stored run (results.parquet, results.csv, run.json), report.html (with pictures of the worst
reference checks) and summary.md."""

from __future__ import annotations

from pathlib import Path

from harness.details import worst_details
from harness.targets.base import Target
from reports import Record, RunInfo, render_html, render_markdown, save_run
from reports.pictures import case_pictures


def write_run(records: list[Record], info: RunInfo, target: Target, out: Path) -> None:
    """Write every output of a run of `target` into `out` (created if needed). The pictures rerun
    the few worst reference checks on `target`, in this process."""
    out = Path(out)
    save_run(records, info, out)
    pictures = {(d.case_id, d.check): case_pictures(d.where, d.error, d.sv_judged, d.sv_reference)
                for d in worst_details(records, target)}
    (out / "report.html").write_text(render_html(records, info, pictures))
    (out / "summary.md").write_text(render_markdown(records, info))
