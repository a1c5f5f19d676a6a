"""Reports of a conformance run: machine-readable records, HTML and Markdown."""

from reports.records import COLUMNS, STATUSES, Record, RunInfo, read_csv, status_counts, worst_first, write_csv

__all__ = ["COLUMNS", "STATUSES", "Record", "RunInfo", "read_csv", "status_counts", "worst_first", "write_csv"]
