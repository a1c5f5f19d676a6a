"""The TP-dependence table in the reports: what a tensor-parallel setting does to Muon's update.

The table and the seed figures are computed by `python -m harness.tp_dependence --out
reports/tp_dependence.json` (minutes of FP64 work, so reports read the stored file and never
recompute it); a report shows them when its run holds a tensor-parallel record (layout
`tp<d>-...` or `dp<D>tp<d>-...`, cases/layouts.py). Per matrix kind of a transformer block, TP
degree and mode: the relative difference ||P - W|| / ||W|| and the cosine between the update the
TP ranks apply (P) and the unsharded update (W), and whether the mode is exact.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from reports.records import Record

STORED = Path(__file__).with_name("tp_dependence.json")
_TP_LAYOUT = re.compile(r"(dp\d+)?tp[01]-")


def has_tp(records: list[Record]) -> bool:
    """True when a record of the run is of a tensor-parallel layout."""
    return any(_TP_LAYOUT.match(r.layout) for r in records)


def load(path: Path | None = None) -> dict[str, Any] | None:
    """The stored table, None when it has not been computed."""
    path = STORED if path is None else path
    return json.loads(path.read_text()) if path.exists() else None


def _split(dim: int) -> str:
    return "dim 0 (column-parallel)" if dim == 0 else "dim 1 (row-parallel)"


def rows(data: dict[str, Any]) -> list[list[str]]:
    """The table's cells: matrix, shape, split, tp, mode, rel. difference, cosine, exact."""
    return [[r["matrix"], "x".join(map(str, r["shape"])), _split(r["dim"]), str(r["tp"]), r["mode"],
             f"{r['rel_diff']:.3g}", f"{r['cosine']:.4f}", "yes" if r["rel_diff"] == 0.0 else "no"]
            for r in data["rows"]]


def seed_rows(data: dict[str, Any]) -> list[list[str]]:
    """The seed figures: setting, published value, ours (per rank for the square case)."""
    out = []
    for f in data["seed_figures"]:
        shape = "x".join(map(str, f["shape"]))
        ours = ", ".join(f"{x:.2f}" for x in f["per_rank"]) + " per rank" if shape == "256x256" \
            else f"{f['rel_diff']:.2f}"
        out.append([shape, _split(f["dim"]), str(f["tp"]), f"{f['published']:.2f}", ours, f"{f['cosine']:.3f}"])
    return out


TABLE_HEAD = ["matrix", "shape", "split", "tp", "mode", "rel. difference", "cosine", "exact"]
SEED_HEAD = ["setting", "split", "tp", "published", "ours (rel. difference)", "ours (cosine)"]


def _settings(data: dict[str, Any]) -> str:
    s = data["settings"]
    return (f"hidden {s['hidden']}, {s['heads']} heads, ffn {s['ffn']}; {s['orthogonalizer']} ({s['steps']} steps) on "
            f"one {s['gradient']} gradient per matrix, FP64; computed {data['date']} by `{data['command']}`")


def markdown(data: dict[str, Any]) -> str:
    """The section for summary.md."""
    def table(head: list[str], body: list[list[str]]) -> str:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in body])
    return "\n\n".join([
        "## TP dependence of the update",
        f"What each TP mode does to Muon's update, per matrix of a transformer block ({_settings(data)}). "
        "`gather` is the unsharded update; `per_shard` orthogonalizes each shard alone (DeepSpeed AutoTP); "
        "`per_shard+heads` each shard's whole heads, exact against per-head orthogonalization.",
        table(TABLE_HEAD, rows(data)),
        "Seed figures (per-shard, Keller Jordan's quintic, 5 steps, Gaussian gradients):",
        table(SEED_HEAD, seed_rows(data)),
    ])


def html_section(data: dict[str, Any]) -> str:
    """The section for report.html."""
    def table(ident: str, head: list[str], body: list[list[str]]) -> str:
        th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
        trs = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in body)
        return f'<table id="{ident}"><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>'
    return "\n".join([
        '<h2 id="tp-dependence">TP dependence of the update</h2>',
        f"<p>{html.escape(_settings(data))}. <code>gather</code> is the unsharded update; <code>per_shard</code> "
        "orthogonalizes each TP shard alone (DeepSpeed AutoTP); <code>per_shard+heads</code> each shard's whole "
        "heads, exact against per-head orthogonalization.</p>",
        table("tp-table", TABLE_HEAD, rows(data)),
        "<p>Seed figures (per-shard, Keller Jordan's quintic, 5 steps, Gaussian gradients):</p>",
        table("tp-seed", SEED_HEAD, seed_rows(data)),
    ])
