"""The optimizer's and the oracle's coefficient tables are separate copies; they must agree,
and both must carry the published numbers."""

import pytest

import oracles.coefficients as ora
import optimizers.coefficients as opt


def test_keller_jordan_quintic_published_values():
    assert ora.KELLER_JORDAN_QUINTIC == (3.4445, -4.7750, 2.0315)
    assert opt.NEWTON_SCHULZ_QUINTIC == ora.KELLER_JORDAN_QUINTIC


def test_polar_express_tables_agree_entry_by_entry():
    assert len(opt.POLAR_EXPRESS) == len(ora.POLAR_EXPRESS_RAW) == 8
    for i, (a, b) in enumerate(zip(opt.POLAR_EXPRESS, ora.POLAR_EXPRESS_RAW)):
        assert a == b, f"Polar Express step {i}: optimizers {a} != oracles {b}"
    assert opt.POLAR_EXPRESS_SAFETY == ora.POLAR_EXPRESS_SAFETY == 1.01


def test_polar_express_published_first_and_last_steps():
    # arXiv:2505.16932, Algorithm 1.
    assert ora.POLAR_EXPRESS_RAW[0] == (8.28721201814563, -23.595886519098837, 17.300387312530933)
    assert ora.POLAR_EXPRESS_RAW[-1] == (1.875, -1.25, 0.375)


@pytest.mark.parametrize("steps", [1, 5, 7, 8, 12])
def test_schedules_agree(steps):
    assert opt.schedule("polar_express", steps) == ora.polar_express_schedule(steps)
    assert opt.schedule("newton_schulz", steps) == ora.newton_schulz_schedule(steps)


def test_safety_factor_spares_only_the_last_polynomial():
    sched = ora.polar_express_schedule(10)
    a, b, c = ora.POLAR_EXPRESS_RAW[0]
    assert sched[0] == pytest.approx((a / 1.01, b / 1.01**3, c / 1.01**5), rel=1e-15)
    assert sched[7:] == [(1.875, -1.25, 0.375)] * 3


def test_a_typo_in_one_copy_shows(monkeypatch):
    """Negative control: the agreement test above must fail when one copy is wrong."""
    broken = list(opt.POLAR_EXPRESS)
    broken[3] = (3.3184196573706015, -2.488488024314874, 0.5100489401237)  # dropped digit
    monkeypatch.setattr(opt, "POLAR_EXPRESS", tuple(broken))
    assert opt.schedule("polar_express", 5) != ora.polar_express_schedule(5)


def test_a_schedule_name_built_at_run_time_selects_its_table():
    """An option read from a config is an equal string, not the same object: `name is "newton_schulz"` (a mutant
    that survived every case, whose names are interned literals) would give it Polar Express."""
    built = "".join(["newton_", "schulz"])
    assert opt.schedule(built, 3) == [opt.NEWTON_SCHULZ_QUINTIC] * 3
    assert opt.normaliser_scale("".join(["polar_", "express"])) == opt.POLAR_EXPRESS_SAFETY


@pytest.mark.parametrize("name", ["KELLER_JORDAN_QUINTIC", "POLAR_EXPRESS_RAW", "YOU_QUINTICS",
                                  "POLAR_EXPRESS_SAFETY_102", "POLAR_EXPRESS_4DP"])
def test_every_published_step_has_the_quintic_sign_pattern(name):
    """Every published step p(x) = a x + b x^3 + c x^5 raises small singular values (a > 1), bends down (b < 0) and
    back (c > 0): a sign lost in copying a table (the peers' schedules have no second copy to disagree with) shows."""
    table = getattr(ora, name)
    steps = (table,) if name == "KELLER_JORDAN_QUINTIC" else table  # the one quintic, used for every step
    for a, b, c in steps:
        assert a > 1.0 and b < 0.0 < c, f"{name}: ({a}, {b}, {c})"
