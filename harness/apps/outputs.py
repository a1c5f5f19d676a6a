"""The files of a finished run, written by `python -m harness run` and by the pytest plugin alike:
the stored run (results.parquet, results.csv, run.json), report.html (with pictures of the worst
reference checks, taken from the judged run: harness/judging/details.py) and summary.md, published together
in one rename (reports/run_folder.py)."""

from __future__ import annotations

from pathlib import Path

from harness.judging.details import Pictures
from reports import Record, RunInfo, render_html, render_markdown
from reports.pictures import case_pictures
from reports.run_folder import RunFolder
from reports.store import save_run, store_into


def write_run(records: list[Record], info: RunInfo, out: RunFolder | Path, pictures: Pictures) -> None:
    """Store the run and its reports, with the pictures `pictures` kept while the run was judged, in
    `out`: a folder claimed before the run (reports.run_folder.claim), or a path, claimed now and
    replacing a stored run there (the pytest plugin's --muon-out, rewritten by every session).
    StoreError (one line) if it cannot be written; the folder is then as it was."""
    drawn = {d.key: case_pictures(d.where, d.error, d.sv_judged, d.sv_reference) for d in pictures.details()}

    def reports(folder: Path) -> None:
        (folder / "report.html").write_text(render_html(records, info, drawn))
        (folder / "summary.md").write_text(render_markdown(records, info))

    if isinstance(out, RunFolder):
        store_into(out, records, info, reports)
    else:
        save_run(records, info, Path(out), replace=True, also=reports)
