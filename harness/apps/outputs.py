"""The files of a finished run, written by `python -m harness run` and by the pytest plugin alike:
the stored run (results.parquet, results.csv, run.json), report.html (with pictures of the worst
reference checks, taken from the judged run: harness/judging/details.py) and summary.md."""

from __future__ import annotations

from pathlib import Path

from harness.judging.details import Pictures
from reports import Record, RunInfo, render_html, render_markdown, save_run
from reports.pictures import case_pictures


def write_run(records: list[Record], info: RunInfo, out: Path, pictures: Pictures) -> None:
    """Write every output of a run into `out` (created if needed), with the pictures `pictures` kept
    while the run was judged."""
    out = Path(out)
    save_run(records, info, out)
    drawn = {d.key: case_pictures(d.where, d.error, d.sv_judged, d.sv_reference) for d in pictures.details()}
    (out / "report.html").write_text(render_html(records, info, drawn))
    (out / "summary.md").write_text(render_markdown(records, info))
