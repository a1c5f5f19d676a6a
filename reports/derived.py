"""Values every report derives from records the same way: the run's verdict, and the allowance.

  verdict   FAILED if any record is fail or error; NOTHING CHECKED if none passed either
            (every record unsupported or skipped); THIN if the run judged too little (RunInfo.thin);
            else PASSED; "INCOMPLETE (why), ... so far" for an interrupted run
  title     "<verdict>: Muon conformance of <target>, <tier> tier (<how much was judged>)", the first
            line of every report
  allowed   the whole allowance of a check in rel_err's units, rel_err / ratio =
            (rtol ||delta_ref|| + storage_ulps ||ulp(x_ref)||) / ||delta_ref||  (harness.judging.metrics);
            a check passes iff rel_err <= allowed. The `tolerance` column holds rtol alone.
  diagnosis_label  the kind of bug a diagnosis names: its text up to the first ": "
            (harness/judging/diagnosis.py writes "<label>: <evidence>")
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from reports.records import Record, RunInfo


def verdict(records: Iterable[Record], interrupted: str = "", thin: str = "") -> str:
    """FAILED, PASSED or NOTHING CHECKED, "THIN" where nothing failed but the run judged too little (`thin`:
    why); for a run `interrupted` (by what) INCOMPLETE first."""
    statuses = {r.status for r in records}
    outcome = ("FAILED" if statuses & {"fail", "error"} else "NOTHING CHECKED" if "pass" not in statuses
               else "THIN" if thin else "PASSED")
    return f"INCOMPLETE ({interrupted}), {outcome} so far" if interrupted else outcome


def title(records: list[Record], info: RunInfo) -> str:
    """The report's title: verdict, target (name and version), tier, and how much was judged."""
    scope = f" ({info.scope})" if info.scope else ""
    return f"{verdict(records, info.interrupted, info.thin)}: Muon conformance of {info.target}, {info.tier} tier{scope}"


def allowed(record: Record) -> float:
    """rel_err / ratio: the allowance relative to the reference update; NaN where it cannot be
    recovered (no metrics, or a zero or non-finite ratio)."""
    if not (math.isfinite(record.rel_err) and math.isfinite(record.ratio)) or record.ratio <= 0.0:
        return math.nan
    return record.rel_err / record.ratio


def diagnosis_label(record: Record) -> str:
    """The label of the record's diagnosis ("lr-scale" of "lr-scale: the step is ..."), "" if none."""
    label, sep, _ = record.diagnosis.partition(": ")
    return label if sep else record.diagnosis
