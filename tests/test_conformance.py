"""The CI tier of the conformance sweep against our Muon: one test per case id.

A failure message lists every failing check with its ratio, tolerance and source.
"""

import pytest

from cases import ci_cases
from harness.runner import run_case
from harness.targets import load_target

TARGET = load_target("ours")
CASES = ci_cases()


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.conformance
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case(case):
    records = run_case(case, TARGET, "ours")
    assert records, "a case must produce at least one check"
    bad = [r for r in records if r.failing]
    assert not bad, "\n".join(f"{r.check}: {r.status} ratio {r.ratio:.3g} ({r.message}; {r.tolerance_source})"
                              for r in bad)
    assert {r.status for r in records} <= {"pass", "skipped"}, "our Muon must support every case"
    if all(r.status == "skipped" for r in records):
        pytest.skip("; ".join(r.message for r in records))
