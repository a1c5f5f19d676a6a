"""--select: a complete case id selects exactly that case; other patterns select by substring."""

from harness.running.selection import select

DION2 = "dion2-f0.25-local/linear-12x20/mb1/noflat/fp32@fp32/pe/spectral_norm/plain/wd0.1/steps3/gaussian/seed0/replicated/ws2"


def test_a_complete_id_selects_that_case_not_the_ids_it_is_a_substring_of():
    assert [c.id for c in select("nightly", ["nor" + DION2])] == ["nor" + DION2]
    assert [c.id for c in select("nightly", [DION2])] == [DION2]  # not also nordion2's, which contains it


def test_a_piece_of_an_id_selects_every_id_containing_it():
    got = {c.id for c in select("nightly", ["f0.25-local/linear-12x20/mb1/"])}
    assert {DION2, "nor" + DION2} <= got
    assert all("f0.25-local/linear-12x20/mb1/" in i for i in got)
