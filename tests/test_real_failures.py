"""The diagnosis validated on the labelled set of real failures (tests/real_failures.py): made from the stored
evidence alone (no peer installed, no target run), it names a true cause of each failure at least as often
as when the set was measured, per source."""

import dataclasses
import functools

import pytest
import torch

import real_failures
from harness.apps.selftest_catalog import CATALOG, spec
from harness.judging import diagnosis
from harness.targets import load_target

MEASURED = {"dion": (36, 36), "deepspeed": (15, 15), "torch": (26, 26), "catalog": (61, 61), "layouts": (28, 29)}
"""Per source (right, judged) as measured (`python tests/real_failures.py`): entries whose diagnosis names one of
their causes, of those a diagnosis can single out (a catalog defect with the catalog's stated reason on its case
is left out: 5 of the catalog's 66 entries, 1 of the layouts' 30)."""


@functools.cache
def scored() -> tuple[real_failures.Scored, ...]:
    return tuple(real_failures.score(real_failures.load()))


def shortfalls(scored: list[real_failures.Scored]) -> list[str]:
    """The sources whose accuracy is below MEASURED, or whose judged entries changed in number."""
    out = []
    for source, (right, judged) in MEASURED.items():
        got = real_failures.accuracy([s for s in scored if s.entry.source == source])
        if got[1] != judged or got[0] < right:
            out.append(f"{source}: {got[0]}/{got[1]} right, measured {right}/{judged}")
    return out


def test_every_source_is_stored_with_true_labels_and_a_failing_record():
    entries = [s.entry for s in scored()]
    assert {e.source for e in entries} == set(MEASURED)
    for e in entries:
        assert e.labels and set(e.labels) <= set(diagnosis.LABELS), (e.case_id, e.labels)
        assert any(r.failing for r in e.records), e.case_id
        assert e.judged.trajectory is not None or all(r.status == "error" for r in e.records if r.failing)


def test_catalog_entries_carry_the_catalog_labels_and_reasons():
    """The catalog's defects are labelled by the catalog itself: a stored entry whose label or stated reason
    differs from the catalog's today is stale."""
    by_spec = {spec(d): d for d in CATALOG}
    for s in scored():
        if s.entry.source in real_failures.CATALOG_SOURCES:
            d = by_spec[s.entry.target]
            assert s.entry.labels == (d.expected,), s.entry.case_id
            assert s.entry.reason == (d.ambiguous(s.entry.case) or ""), s.entry.case_id


def test_every_entry_is_stored_under_the_conventions_its_target_declares_today():
    """An entry is diagnosed under its stored conventions: where its target (ours with a catalog defect, or a peer's
    adapter, loadable without the peer) declares others today, e.g. a changed default of the orthogonalizer an SVD
    case takes, the stored diagnosis is of conventions nobody declares any more."""
    stale = [(e.target, e.case_id) for e in (s.entry for s in scored())
             if load_target(e.target).conventions(e.case) != e.conventions]
    assert not stale


def test_accuracy_stays_at_what_was_measured():
    assert not shortfalls(list(scored())), real_failures.render(list(scored()))


def test_a_wrong_label_is_a_shortfall():
    """Negative control: the same set with one right entry's labels replaced by another cause."""
    got = list(scored())
    n = next(i for i, s in enumerate(got) if s.right and not s.entry.reason)
    wrong = next(label for label in diagnosis.LABELS if label not in got[n].entry.labels)
    got[n] = dataclasses.replace(got[n], entry=dataclasses.replace(got[n].entry, labels=(wrong,)))
    right, judged = MEASURED[got[n].entry.source]
    assert shortfalls(got) == [f"{got[n].entry.source}: {right - 1}/{judged} right, measured {right}/{judged}"]


def test_no_diagnosis_needed_a_run():
    """Every stored entry is diagnosed from its evidence: a diagnosis that ran its target (a `Declared`, whose
    run raises) would read "undiagnosed"."""
    assert not [s.entry.case_id for s in scored() if diagnosis.label(s.got) == "undiagnosed"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_trajectories_are_stored_bit_for_bit(dtype):
    traj = [[torch.randn(3, 4).to(dtype) for _ in range(2)] for _ in range(3)]
    name = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64"}[dtype]
    back = real_failures._trajectory(real_failures._bits(traj), name)
    assert all(torch.equal(a, b) and b.dtype == dtype for sa, sb in zip(traj, back) for a, b in zip(sa, sb))


def test_conventions_are_stored_exactly():
    for s in scored():
        conv = s.entry.conventions
        assert real_failures.conventions_from(real_failures.conventions_json(conv)) == conv
