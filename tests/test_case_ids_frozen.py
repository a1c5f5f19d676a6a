"""Case ids are frozen: stored runs, baselines and the CHANGELOG refer to them.

tests/data/{ci,nightly}_ids.txt.gz hold `python -m harness list --tier ci|nightly` (ids only, in
tier order) as generated at commit 433d387, before the case axes were declared in one table
(cases/schema.py). A change to how an id is written or to which cases a tier holds shows here.
A tier may gain cases (their ids are new); an existing id must never change. Regenerate a file only
for a deliberate change of a tier, and say so in the CHANGELOG:

    python -m harness list --tier ci | head -n -1 | gzip -n -9 > tests/data/ci_ids.txt.gz
    python -m harness list --tier nightly | head -n -1 | gzip -n -9 > tests/data/nightly_ids.txt.gz
"""

import gzip
from pathlib import Path

import pytest

from cases import Case, tier

DATA = Path(__file__).parent / "data"


def frozen_ids(name: str) -> list[str]:
    return gzip.decompress((DATA / f"{name}_ids.txt.gz").read_bytes()).decode().splitlines()


@pytest.mark.parametrize("name", ["ci", "nightly"])
def test_every_frozen_id_is_still_in_its_tier_byte_for_byte(name):
    """A changed id shows as a frozen id gone from the tier; cases added since are new ids, allowed."""
    ids = [case.id for case in tier(name)]
    present = set(ids)
    gone = [case_id for case_id in frozen_ids(name) if case_id not in present]
    assert not gone, f"{len(gone)} ids of the frozen {name} list are no longer in the tier, first: {gone[:3]}"
    assert len(set(ids)) == len(ids)


def test_every_frozen_id_round_trips_through_the_parser():
    for case_id in frozen_ids("nightly"):
        case = Case.from_id(case_id)
        assert case.id == case_id
        assert Case.from_id(case.id) == case


def test_the_frozen_check_fails_on_a_changed_id():
    """Negative control: an id written one character differently is not in the frozen list."""
    frozen = set(frozen_ids("nightly"))
    case = tier("ci")[0]
    assert case.id in frozen
    assert case.id.replace("/seed0", "/seed00") not in frozen
    with pytest.raises(ValueError, match="case id"):
        Case.from_id(case.id.replace("/seed0", "/seed00"))
