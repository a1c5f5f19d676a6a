"""Case ids are frozen: stored runs, baselines and the CHANGELOG refer to them.

tests/data/{ci,nightly}_ids.txt.gz hold `python -m harness list --tier ci|nightly` (ids only, in
tier order) as generated at commit 433d387, before the case axes were declared in one table
(cases/schema.py). A change to how an id is written or to which cases a tier holds shows here.
Regenerate a file only for a deliberate change of a tier (cases added or removed; an existing id
must never change), and say so in the CHANGELOG:

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
def test_tier_ids_are_byte_identical_to_the_frozen_list(name):
    ids = [case.id for case in tier(name)]
    frozen = frozen_ids(name)
    changed = [(i, old, new) for i, (old, new) in enumerate(zip(frozen, ids)) if old != new]
    assert not changed[:5], f"{len(changed)} ids differ from the frozen {name} list, first: {changed[:5]}"
    assert len(ids) == len(frozen)


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
