"""The labelled set of real failures (tests/data/real_failures/): failing cases of real implementations
whose causes are known, stored as what their checks judged, and the diagnosis's accuracy over them.

An entry holds the case id, the target it failed on (an alias or MODULE:CALLABLE spec) and the conventions
that target declared, the device class, its records (check, status, ratio, rel_err, message), the
trajectory its checks judged and the runs they made (`trajectories.npz`, in the parameter dtype's bits),
and its true labels: the harness.judging.diagnosis labels of the causes it has (a case with two bugs has
two), with the cause in words. A catalog entry whose defect cannot be singled out on its case carries the
catalog's stated reason instead (harness.apps.selftest_catalog.Defect.ambiguous). Reading the set needs
neither the peers nor a run: the diagnosis is made from the stored evidence alone.

  python tests/real_failures.py           accuracy per source and overall, each wrong label listed
  python tests/real_failures.py record [SOURCE ...]
                                          rerun the selected cases of each source (default all) on their
                                          targets and rewrite its files (needs the peers: dion at 0a059a4,
                                          deepspeed 0.19.8 installed with DS_BUILD_OPS=0)
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from cases import Case, schema
from harness.judging import diagnosis
from harness.judging.judged import Judged
from harness.judging.structure import Declared
from oracles import Conventions, Orthogonalizer
from oracles.spectral import Normaliser
from reports import Record

DATA = Path(__file__).with_name("data") / "real_failures"
"""One pair of files per source: <source>.json (the entries) and <source>.npz (their trajectories)."""

RECORD_FIELDS = ("check", "status", "rel_err", "ratio", "tolerance", "message")
"""The fields of a record the set keeps (the diagnosis reads these)."""
MESSAGE_CHARS = 600
"""A record's message is kept to its first MESSAGE_CHARS characters (a traceback's head names the error)."""


@dataclass(frozen=True)
class Entry:
    """One failing case with known causes (see the module docstring)."""

    source: str
    target: str
    case_id: str
    labels: tuple[str, ...]
    cause: str
    reason: str
    conventions: Conventions
    device: str
    records: tuple[Record, ...]
    judged: Judged

    @property
    def case(self) -> Case:
        return Case.from_id(self.case_id)

    def diagnose(self) -> str:
        """The diagnosis of the stored evidence under the stored conventions."""
        declared = Declared(self.target, lambda case: self.conventions)
        return diagnosis.diagnose(self.case, declared, list(self.records), self.judged)


# --- storage -----------------------------------------------------------------------------------------------

def conventions_json(conv: Conventions) -> dict:
    return dataclasses.asdict(conv)


def conventions_from(data: dict) -> Conventions:
    o = data["orthogonalizer"]
    orth = Orthogonalizer(o["kind"], tuple(tuple(step) for step in o["schedule"]), Normaliser(**o["normaliser"]),
                          o["rcond_factor"], o["iteration"])
    return Conventions(**{**data, "orthogonalizer": orth})


def _bits(traj: list[list[torch.Tensor]]) -> np.ndarray:
    """traj[k][i] stacked [steps, members, *shape] as stored: bf16 and fp16 by their 16 bits."""
    stacked = torch.stack([torch.stack([t.detach().cpu() for t in step]) for step in traj])
    return (stacked.view(torch.int16) if stacked.dtype in (torch.bfloat16, torch.float16) else stacked).numpy()


def _trajectory(bits: np.ndarray, param_dtype: str) -> list[list[torch.Tensor]]:
    t = torch.from_numpy(bits)
    if param_dtype in ("bf16", "fp16"):
        t = t.view(torch.bfloat16 if param_dtype == "bf16" else torch.float16)
    return [list(step.unbind(0)) for step in t.unbind(0)]


def _record(case: Case, target: str, fields: dict) -> Record:
    return Record(case_id=case.id, target=target, backend="stored", **schema.column_values(case),
                  **{k: fields[k] for k in RECORD_FIELDS})


def save(source: str, entries: list[Entry]) -> None:
    """Write the entries of `source` to its pair of files."""
    DATA.mkdir(parents=True, exist_ok=True)
    index, arrays = [], {}
    for n, e in enumerate(entries):
        key = f"e{n:03d}"
        runs = {"trajectory": e.judged.trajectory, **e.judged.runs} if e.judged.trajectory is not None else {}
        arrays.update({f"{key}.{name}": _bits(traj) for name, traj in runs.items()})
        index.append({"key": key, "target": e.target, "case": e.case_id, "labels": list(e.labels),
                      "cause": e.cause, "reason": e.reason, "device": e.device,
                      "conventions": conventions_json(e.conventions), "runs": sorted(runs),
                      "records": [{k: getattr(r, k) if k != "message" else r.message[:MESSAGE_CHARS]
                                   for k in RECORD_FIELDS} for r in e.records]})
    (DATA / f"{source}.json").write_text(json.dumps({"source": source, "entries": index}, indent=1) + "\n")
    np.savez_compressed(DATA / f"{source}.npz", **arrays)


def load() -> list[Entry]:
    """The stored set, every source."""
    out = []
    for path in sorted(DATA.glob("*.json")):
        source, index = path.stem, json.loads(path.read_text())["entries"]
        with np.load(path.with_suffix(".npz")) as arrays:
            stored = {name: arrays[name] for name in arrays.files}
        for item in index:
            case = Case.from_id(item["case"])
            runs = {name: _trajectory(stored[f"{item['key']}.{name}"], case.param_dtype) for name in item["runs"]}
            judged = Judged(runs.pop("trajectory", None), runs, item["device"])
            out.append(Entry(source, item["target"], item["case"], tuple(item["labels"]), item["cause"],
                             item["reason"], conventions_from(item["conventions"]), item["device"],
                             tuple(_record(case, item["target"], r) for r in item["records"]), judged))
    return out


# --- accuracy ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scored:
    entry: Entry
    got: str

    @property
    def right(self) -> bool:
        return diagnosis.label(self.got) in self.entry.labels

    @property
    def explained(self) -> bool:
        """Right, or a catalog defect the catalog states no diagnosis can single out on its case."""
        return self.right or bool(self.entry.reason)


def score(entries: list[Entry]) -> list[Scored]:
    return [Scored(e, e.diagnose()) for e in entries]


def accuracy(scored: list[Scored]) -> tuple[int, int]:
    """(right, judged): the entries whose diagnosis names one of their causes, of those where one can
    (a catalog defect with a stated reason on its case is left out)."""
    judged = [s for s in scored if not s.entry.reason]
    return sum(s.right for s in judged), len(judged)


CATALOG_SOURCES = ("catalog", "layouts")
"""The sources whose entries are the selftest catalog's defects (their labels are the catalog's expected ones);
the others are the real implementations' failures."""


def render(scored: list[Scored]) -> str:
    """Accuracy per source, over the real failures and over the catalog's defects, then each wrong label."""
    lines = []

    def line(name: str, part: list[Scored]) -> None:
        right, total = accuracy(part)
        lines.append(f"{name:22} {right}/{total} right" + (f" ({len(part) - total} with a stated reason)"
                                                          if len(part) > total else ""))

    for source in dict.fromkeys(s.entry.source for s in scored):
        line(source, [s for s in scored if s.entry.source == source])
    line("real failures", [s for s in scored if s.entry.source not in CATALOG_SOURCES])
    line("catalog defects", [s for s in scored if s.entry.source in CATALOG_SOURCES])
    for s in scored:
        if not s.explained:
            lines.append(f"WRONG {s.entry.source} {s.entry.target} {s.entry.case_id}: want "
                         f"{'|'.join(s.entry.labels)}, got {s.got}")
    return "\n".join(lines)


# --- recording (needs the peers) ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Wanted:
    """A case to record on a target, with its true labels and cause."""

    source: str
    target: str
    case_id: str
    labels: tuple[str, ...]
    cause: str
    reason: str = ""


RANKS_WAIT = 3600.0
"""Seconds the recorder's rank pools may take to start, and a distributed case to run: a recording shares a
loaded machine, where the runner's defaults can read a slow rank as a hung one."""


def record(wanted: list[Wanted]) -> list[Entry]:
    """Run each wanted case on its target through the runner; keep those that fail."""
    from harness.runner import run_case
    from harness.targets import load_target

    entries = []
    for w in wanted:
        case, target = Case.from_id(w.case_id), load_target(w.target)
        judged = Judged()
        records = run_case(case, target, w.target, kept=judged)
        if not any(r.failing for r in records):
            print(f"not failing, left out: {w.target} {w.case_id}", file=sys.stderr)
            continue
        entries.append(Entry(w.source, w.target, w.case_id, w.labels, w.cause, w.reason, target.conventions(case),
                             judged.device, tuple(records), judged))
        print(f"recorded {w.source} {w.target} {w.case_id}", file=sys.stderr)
    return entries


DION_CI_FAILURES = (
    "muon/conv2d-8x4x3x3/mb2/flat/bf16@bf16/pe/rms_norm/plain/wd0/steps1/lowrank/seed0",
    "muon/conv2d-8x4x3x3/mb3/flat/fp32@bf16/pe/rms_norm/plain/wd0/steps1/rankdef/seed0",
    "muon/conv2d-8x4x3x3/mb5/flat/fp32@bf16/pe/none/plain/wd0/steps3/rankdef/seed0",
    "muon/conv2d_k1-8x4x1x1/mb2/flat/fp32@bf16/ns/rms_norm/nesterov/wd0/steps1/rankdef/seed0",
    "muon/conv2d_k1-8x4x1x1/mb3/flat/fp32@bf16/ns/spectral_norm/nesterov/wd0/steps3/lowrank/seed0",
    "muon/conv2d_k1-8x4x1x1/mb5/flat/bf16@bf16/pe/none/plain/wd0/steps1/lowrank/seed0",
    "muon/conv2d_tall-40x2x2x2/mb3/flat/fp32@bf16/ns/rms_norm/plain/wd0/steps1/tiny/seed0",
    "muon/conv2d_tall-40x2x2x2/mb5/flat/bf16@bf16/pe/spectral_norm/nesterov/wd0.1/steps1/huge/seed0",
    "muon/conv3d-6x3x2x3x3/mb3/flat/bf16@bf16/pe/rms_norm/plain/wd0/steps1/lowrank/seed0",
    "muon/conv3d-6x3x2x3x3/mb5/flat/bf16@bf16/ns/rms_norm/plain/wd0/steps3/huge/seed0",
    "muon/conv3d-6x3x2x3x3/mb5/flat/fp32@bf16/ns/rms_norm/plain/wd0/steps1/rankdef/seed0",
    "normuon/conv1d-8x4x5/mb2/flat/fp32@bf16/ns/spectral_norm/plain/wd0.1/steps1/gaussian/seed0",
    "normuon/conv1d-8x4x5/mb3/flat/fp32@bf16/pe/rms_norm/plain/wd0/steps1/tiny/seed0",
    "normuon/conv1d-8x4x5/mb5/flat/bf16@bf16/ns/rms_norm/nesterov/wd0.1/steps1/huge/seed0",
    "normuon/conv2d-8x4x3x3/mb2/flat/bf16@bf16/pe/spectral_norm/nesterov/wd0.1/steps3/gaussian/seed0",
    "normuon/conv2d-8x4x3x3/mb3/flat/bf16@bf16/pe/rms_norm/plain/wd0/steps1/tiny/seed0",
    "normuon/conv2d_k1-8x4x1x1/mb1/flat/fp32@bf16/pe/rms_norm/nesterov/wd0.1/steps3/gaussian/seed0",
    "normuon/conv2d_k1-8x4x1x1/mb2/flat/fp32@bf16/pe/rms_norm/plain/wd0/steps1/huge/seed0",
    "normuon/conv2d_k1-8x4x1x1/mb3/flat/bf16@bf16/ns/none/nesterov/wd0.1/steps3/rankdef/seed0",
    "normuon/conv2d_tall-40x2x2x2/mb3/flat/fp32@bf16/pe/rms_norm/nesterov/wd0/steps1/rankdef/seed0",
    "normuon/conv3d-6x3x2x3x3/mb2/flat/fp32@bf16/ns/rms_norm/nesterov/wd0.1/steps3/tiny/seed0",
    "normuon/conv3d-6x3x2x3x3/mb3/flat/bf16@bf16/pe/spectral_norm/plain/wd0.1/steps1/tiny/seed0",
)
"""dion 0a059a4's failing single-process cases of the global CI tier as it stood before per-target tiers
(`python -m harness run --target dion` at d605659); their ids are stable, so they stay the set's dion cases."""

DION_CAUSES = {
    "members-mixed": "dion 0a059a4: Muon(flatten=True) orthogonalizes a megabatch as one [N, prod(shape)] matrix "
                     "(X.flatten(start_dim=1) on the stack; docs/findings/dion-megabatch-flatten-mixes-layers.py)",
    "flattened-geometry": "dion 0a059a4: NorMuon(flatten=True) normalises the rows of each trailing kernel slice "
                          "(variance p[..., 0:1]), not the output channels of the flattened matrix "
                          "(docs/findings/dion-normuon-flatten-kernel-rows.py)",
    "normaliser-eps": "dion 0a059a4: near fp32's range the normaliser's fp32 sum of squares overflows, X0 = 0 and the "
                      "update vanishes (docs/findings/dion-normaliser-overflow-vanishes.py)",
}


def _dion_labels(case: Case) -> tuple[str, ...]:
    """The dion findings a case has: the megabatch flatten mixing (Muon's and NorMuon's), the NorMuon kernel-slice
    rows, the normaliser's overflow near the format's range."""
    return tuple(label for label, has in (
        ("flattened-geometry", case.optimizer == "normuon" and case.flatten and len(case.shape) > 2),
        ("members-mixed", case.flatten and case.megabatch > 1),
        ("normaliser-eps", case.grad == "extreme")) if has)


def _dion() -> Iterator[Wanted]:
    linear = [f"muon/{layer}/mb{mb}/flat/{dtypes}/{orth}/spectral_norm/nesterov/wd0/steps3/gaussian/seed0"
              for layer, mb, dtypes, orth in (("linear-12x20", 2, "fp32@bf16", "ns"), ("linear-12x20", 2, "fp32@bf16", "pe"),
                                              ("linear-12x20", 3, "bf16@bf16", "ns"), ("linear_tall-24x6", 2, "fp32@bf16", "pe"),
                                              ("linear_tall-24x6", 5, "bf16@bf16", "ns"))]
    kernels = [f"normuon/{layer}/mb1/flat/{dtypes}/{orth}/{lr}/{nesterov}/wd0/steps{steps}/{grad}/seed0"
               for layer, dtypes, orth, lr, nesterov, steps, grad in (
                   ("conv1d-8x4x5", "fp32@bf16", "ns", "spectral_norm", "plain", 1, "gaussian"),
                   ("conv1d-8x4x5", "bf16@bf16", "pe", "rms_norm", "nesterov", 3, "lowrank"),
                   ("conv2d-8x4x3x3", "fp32@bf16", "pe", "spectral_norm", "nesterov", 3, "gaussian"),
                   ("conv2d-8x4x3x3", "bf16@bf16", "ns", "rms_norm", "plain", 1, "huge"),
                   ("conv2d_tall-40x2x2x2", "fp32@bf16", "ns", "rms_norm", "plain", 3, "gaussian"),
                   ("conv3d-6x3x2x3x3", "fp32@bf16", "pe", "none", "nesterov", 1, "tiny"))]
    own = ("muon/linear-12x20/mb2/noflat/fp32@bf16/ns/spectral_norm/nesterov/wd0.1/steps2/extreme/seed0",
           "normuon/linear-12x20/mb2/noflat/fp32@bf16/ns/spectral_norm/nesterov/wd0.1/steps2/extreme/seed0",
           "normuon-b0.99/linear_tall-24x6/mb2/flat/fp32@bf16/pe/none/plain_mu0.9/wd0.0001/steps1/tiny/seed0",
           "normuon-b0.99/linear_row-1x16/mb5/flat/bf16@bf16/ns/none/plain/wd0.0001_lr0.05/steps1/huge/seed0",
           "normuon/linear_row-1x16/mb3/flat/fp32@bf16/pe/rms_norm/plain/wd0.0001_lr0.05/steps3/lowrank/seed0")
    """Failures of dion's own CI tier under the panel's policy (2026-12-02) that the rows above lack."""
    for case_id in (*DION_CI_FAILURES, *linear, *kernels, *own):
        labels = _dion_labels(Case.from_id(case_id))
        yield Wanted("dion", "dion", case_id, labels, "; ".join(DION_CAUSES[label] for label in labels))


def _deepspeed_flattened(ns_method: str):
    """DeepSpeed 0.19.8's SingleDeviceMuon judged on what Muon promises a flattened Conv1d weight: the
    [out, in * k] matrix. It flattens 4-D weights only and orthogonalizes a 3-D one as a batch of its trailing
    [in, k] slices; the built-in adapter, declaring that, runs no flattened 3-D case."""
    from harness.targets.peers.deepspeed import DeepSpeedMuon

    class Flattened(DeepSpeedMuon):
        def peer_unsupported(self, case: Case) -> str | None:
            return super().peer_unsupported(dataclasses.replace(case, flatten=False) if len(case.shape) == 3
                                            else case)
    return Flattened(ns_method)


def deepspeed_standard_flattened():
    return _deepspeed_flattened("standard")


def deepspeed_gram_flattened():
    return _deepspeed_flattened("gram")


def _deepspeed() -> Iterator[Wanted]:
    crash = ("DeepSpeed 0.19.8: SingleDeviceMuon raises on every 4-D parameter (its final torch.where broadcasts "
             "the flattened update against the 4-D gradient; docs/findings/deepspeed-conv-kernel-crash.py)")
    yield Wanted("deepspeed", "deepspeed-gram",
                 "muon/conv2d-8x4x3x3/mb1/flat/fp32@fp32/gns/spectral_norm/nesterov/wd0/steps1/huge/seed0",
                 ("error",), crash)
    yield Wanted("deepspeed", "deepspeed-standard",
                 "muon/conv2d-8x4x3x3/mb1/flat/fp32@bf16/ns/spectral_norm/nesterov/wd0/steps1/lowrank/seed0",
                 ("error",), crash)
    overflow = ("DeepSpeed 0.19.8: near fp32's range the normaliser's fp32 sum of squares overflows, X0 = 0 and the "
                "update vanishes (docs/findings/deepspeed-normaliser-overflow-vanishes.py)")
    for case_id in ("muon/linear-12x20/mb2/noflat/fp32@bf16/ns/spectral_norm/nesterov/wd0.1/steps2/extreme/seed0",
                    "muon/conv3d-6x3x2x3x3/mb2/noflat/fp32@bf16/ns/spectral_norm/nesterov/wd0.1/steps2/extreme/seed0",
                    "muon/linear_row-1x16/mb2/noflat/fp32@bf16/ns/spectral_norm/nesterov/wd0.1/steps2/extreme/seed0",
                    "muon/linear-12x20/mb2/noflat/bf16@bf16/ns/spectral_norm/nesterov/wd0.1/steps2/extreme/seed0"):
        yield Wanted("deepspeed", "deepspeed-standard", case_id, ("normaliser-eps",), overflow)
    slices = ("DeepSpeed 0.19.8: SingleDeviceMuon orthogonalizes a Conv1d weight [out, in, k] as a batch of its "
              "[in, k] slices where a flattened conv weight is promised (issue 26)")
    for method, dtypes, orth in (("standard", "fp32@bf16", "ns"), ("standard", "bf16@bf16", "ns"),
                                 ("gram", "fp32@fp32", "gns"), ("gram", "bf16@fp32", "gns")):
        for mb, wd, steps, grad in ((1, "wd0", 3, "gaussian"), (2, "wd0.1", 1, "lowrank"), (3, "wd0", 3, "huge")):
            yield Wanted("deepspeed", f"real_failures:deepspeed_{method}_flattened",
                         f"muon/conv1d-8x4x5/mb{mb}/flat/{dtypes}/{orth}/spectral_norm/nesterov/{wd}/steps{steps}/"
                         f"{grad}/seed0", ("flattened-geometry",), slices)


def _torch() -> Iterator[Wanted]:
    cause = ("torch 2.13: torch.optim.Muon normalises a bf16 parameter's momentum buffer in place without Nesterov "
             "(grad.bfloat16() is the buffer itself), so from step 2 the momentum is wrong (README, Findings)")
    for layer in ("linear-12x20", "linear_tall-24x6", "linear_row-1x16"):
        for mb, lr, wd, steps, grad in ((2, "rms_norm", "wd0", 3, "gaussian"), (1, "spectral_norm", "wd0.1", 3, "lowrank"),
                                        (3, "spectral_norm", "wd0", 2, "huge")):
            yield Wanted("torch", "torch", f"muon/{layer}/mb{mb}/noflat/bf16@bf16/ns/{lr}/plain/{wd}/steps{steps}/"
                                           f"{grad}/seed0", ("momentum",), cause)
    from cases import axes
    from harness.running.selection import target_tier
    from harness.targets import load_target

    extreme = ("torch 2.13: torch.optim.Muon's normaliser squares the entries before it scales them, so at "
               "gradients near the dtype's range the norm overflows and the update vanishes (issue 30 item 9)")
    for case in target_tier("ci", load_target("torch")).cases:
        if case.grad == axes.EXTREME_GRADIENT:
            yield Wanted("torch", "torch", case.id, ("normaliser-eps",), extreme)


def _catalog() -> Iterator[Wanted]:
    """The selftest's quick tier: each defect on its first case with bf16 compute and its first without
    (harness.apps.selftest.candidates, as tests/test_selftest_catalog.py judges it)."""
    from harness.apps import selftest
    from harness.apps.selftest_catalog import CATALOG, spec
    from harness.targets import load_target

    ours, tier = load_target("ours"), selftest.selftest_tier()
    for d in CATALOG:
        for bf16 in (True, False):
            for case in selftest.candidates(d, d.make(), ours, tier, bf16, 1):
                yield Wanted("catalog", spec(d), case.id, (d.expected,), d.source, d.ambiguous(case) or "")


LAYOUT_DEFECTS = ("wd-missing", "wd-after-update", "lr-rms-min", "ns-coefficient-typo", "dion2-submatrix-lr",
                  "dion2-ef-unselected")
"""Catalog defects of the single-process step judged on sharded layouts too (`_layouts`)."""


def _layouts() -> Iterator[Wanted]:
    """Defects of the single-process step on the CI tier's sharded NorDion2 cases, whose layout invariance is
    not judged (each rank restores its own rows' norm): local_shard fails with the reference, as it does for
    any wrong step, and says nothing of the sharding."""
    from cases import ci_cases
    from harness.apps.selftest_catalog import BY_NAME, spec

    for case in ci_cases():
        if case.optimizer == "nordion2" and case.layout.startswith("shard"):
            for name in LAYOUT_DEFECTS:
                d = BY_NAME[name]
                if d.shows(case):
                    yield Wanted("layouts", spec(d), case.id, (d.expected,), d.source, d.ambiguous(case) or "")


SOURCES = {"dion": _dion, "deepspeed": _deepspeed, "torch": _torch, "catalog": _catalog, "layouts": _layouts}
"""Each source of the set and what it records."""


def main(argv: list[str]) -> int:
    if argv[:1] == ["record"]:
        from harness.running import pool
        pool.STARTUP_TIMEOUT = pool.DEFAULT_TIMEOUT = RANKS_WAIT
        for source in argv[1:] or SOURCES:
            save(source, record(list(SOURCES[source]())))
    print(render(score(load())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
