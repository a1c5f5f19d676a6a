"""The calibrators: each measures one kind of table of harness/policy/data over the calibration panel
(harness/policy/calibrate/panel.py) and writes it in the one format (harness/policy/tables.py).

  python -m harness.policy.calibrate.coefficients   the rounding coefficients c (tolerance_<device>.json)
  python -m harness.policy.calibrate.noise          the bf16 noise of the robust statistics (bf16_noise.json)
  python -m harness.policy.calibrate.drift          the drift of long bf16 runs (bf16_drift_noise.json)

Each takes --merge FILE ... (earlier tables of its kind folded in: `folded`) and --drop REGEX (their keys
left out), and records in the table's provenance every command whose runs it holds.
"""

from __future__ import annotations

import datetime
import re
import shlex
import sys
from pathlib import Path

import torch

from harness.policy import tables

TOTALS = ("cases", "runs", "ill_posed_not_counted", "seconds")
"""Provenance counts that folding tables sums."""


def command(module: str) -> str:
    """The command line that ran calibrator `module` (this process's arguments)."""
    return f"python -m harness.policy.calibrate.{module} " + shlex.join(sys.argv[1:])


def provenance(made_by: str, device: str, **counts: float) -> dict:
    """A new table's provenance: its command, today's date, this torch, the device, the counts."""
    return {"commands": [made_by], "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "torch": torch.__version__, "device": device, **counts}


def folded(table: tables.Table, files: list[Path], drop: str | None, runs_made: bool = True) -> tables.Table:
    """`table` with the tables in `files` folded in (tables.merged), their keys matching `drop` left out: the
    commands of all, each once (this run's only if it made runs: a pure merge adds no evidence), TOTALS
    summed, the panels joined. ValueError where a file is of another kind or measured under other
    conditions."""
    others = [tables.read(path) for path in files]
    for path, other in zip(files, others):
        if other.kind != table.kind or (other.conditions and table.conditions and other.conditions != table.conditions):
            raise ValueError(f"--merge {path}: a {other.kind} table with conditions {other.conditions}, not a "
                             f"{table.kind} table with {table.conditions}")
    kept = [tables.Table(o.kind, o.about, o.provenance, {k: e for k, e in o.entries.items()
                                                         if not (drop and re.search(drop, str(k)))},
                         o.conditions, o.panel) for o in others]
    commands = list(table.provenance["commands"]) if runs_made else []
    for other in others:
        commands += [c for c in other.provenance["commands"] if c not in commands]
    provenance = {**table.provenance, "commands": commands}
    for name in TOTALS:
        if name in provenance or any(name in o.provenance for o in others):
            provenance[name] = provenance.get(name, 0) + sum(o.provenance.get(name, 0) for o in others)
    if not runs_made and others:  # the measuring machine's, not this one's
        provenance.update(device=others[0].provenance["device"], torch=others[0].provenance["torch"])
    panel = tuple(dict.fromkeys([*table.panel, *(m for o in others for m in o.panel)]))
    conditions = table.conditions or next((o.conditions for o in others if o.conditions), {})
    return tables.Table(table.kind, table.about, provenance, tables.merged([table, *kept]), conditions, panel)
