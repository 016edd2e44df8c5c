"""The seed-spread verdict rule and claim rows (localsgd.paper.experiments.claims) on hand-made values."""

import math

import pytest

from localsgd.paper.experiments import claims as c


def test_one_seed_is_inconclusive_whatever_its_value():
    for value in (-5.0, 0.0, 5.0):
        v = c.verdict([value], -1.0, what="H=8 minus H=1", unit=" points")
        assert v.outcome == c.INCONCLUSIVE and v.seeds == 1
        assert "one seed" in v.reason


def test_two_seeds_decide_only_outside_the_spread():
    # both seeds above the threshold and the mean 3 sd away: held
    assert c.verdict([2.0, 2.2], 1.0).outcome == c.HELD
    # both below: did not hold
    assert c.verdict([0.1, 0.3], 1.0).outcome == c.NOT_HELD
    # the seeds straddle the threshold: inconclusive
    v = c.verdict([0.5, 1.5], 1.0)
    assert v.outcome == c.INCONCLUSIVE and "within the seed spread" in v.reason
    # same side, but the mean is closer to the threshold than one sd: inconclusive
    assert c.verdict([1.05, 1.6], 1.0).outcome == c.INCONCLUSIVE
    # lower is better
    assert c.verdict([0.02, 0.03], 0.1, higher_is_better=False).outcome == c.HELD
    assert c.verdict([0.2, 0.3], 0.1, higher_is_better=False).outcome == c.NOT_HELD
    v = c.verdict([2.0, 2.2], 1.0)
    assert v.mean == pytest.approx(2.1) and v.sd == pytest.approx(math.sqrt(0.02)) and v.seeds == 2


def test_deterministic_quantities_are_decided_by_the_value():
    assert c.verdict(1.04, 1.0, deterministic=True).outcome == c.HELD
    assert c.verdict(0.96, 1.0, deterministic=True).outcome == c.NOT_HELD
    assert c.verdict(0.036, 0.1, higher_is_better=False, deterministic=True).outcome == c.HELD


def test_unavailable_and_not_measurable():
    assert c.verdict([1.0], 0.0, data_available=False).outcome == c.UNAVAILABLE
    v = c.verdict([math.nan, None], 1.0)
    assert v.outcome == c.NOT_MEASURABLE and "nan" not in str(v).lower()
    # a seed that never reached the target is dropped, the others decide
    assert c.verdict([2.0, math.nan, 2.1], 1.0).seeds == 2


def test_combine_parts():
    held, no, inc = (c.verdict([2.0, 2.1], 1.0), c.verdict([0.0, 0.1], 1.0),
                     c.verdict([1.0], 0.0))
    unav = c.verdict([1.0], 0.0, data_available=False)
    assert c.combine([held, held]) == c.HELD
    assert c.combine([held, no]) == c.NOT_HELD
    assert c.combine([held, inc]) == c.INCONCLUSIVE
    assert c.combine([held, unav]) == c.INCONCLUSIVE  # a part could not be judged
    assert c.combine([unav, unav]) == c.UNAVAILABLE
    assert c.combine([]) == c.UNAVAILABLE


def test_claim_row_columns_and_no_nan():
    v = c.verdict([2.0, 2.2], 1.0, what="speed-up", unit="x")
    row = c.claim_row("Figure 6", "H=8", "speed-up", 2.1, unit="x", claim="local SGD is faster",
                      verdict=v)
    assert row["verdict"].startswith("held: ") and row["claim"] == "local SGD is faster"
    assert row["value"] == 2.1 and row["unit"] == "x"
    assert c.claim_row("Table 5", "s", "m", math.nan)["value"] is None
    assert "claim" not in c.claim_row("Table 5", "s", "m", 1.0)
    with pytest.raises(ValueError, match="needs a verdict"):
        c.claim_row("A", "s", "m", 1.0, claim="x")
    with pytest.raises(ValueError, match="does not start with"):
        c.claim_row("A", "s", "m", 1.0, claim="x", verdict="probably fine")
    with pytest.raises(ValueError, match="contains nan"):
        c.claim_row("A", "s", "m", 1.0, claim="x", verdict="held: nan ± 0.1")


def test_a_deterministic_value_within_its_resolution_is_inconclusive():
    from localsgd.paper.experiments.claims import INCONCLUSIVE, NOT_HELD, verdict

    assert verdict(1.99, 2.0, deterministic=True).outcome == NOT_HELD
    near = verdict(1.99, 2.0, deterministic=True, resolution=0.2, unit="x")
    assert near.outcome == INCONCLUSIVE and "resolution" in near.reason
    assert verdict(1.7, 2.0, deterministic=True, resolution=0.2).outcome == NOT_HELD
    assert verdict(2.3, 2.0, deterministic=True, resolution=0.2).outcome == "held"


def test_three_seeds_straddling_the_threshold_stay_inconclusive():
    # the mean on the held side, one seed across: the spread decides nothing
    v = c.verdict([1.4, 1.5, 0.9], 1.0)
    assert v.mean > 1.0 and v.outcome == c.INCONCLUSIVE and v.seeds == 3
    # all three on one side but the mean within one sd of the threshold: still inconclusive
    assert c.verdict([1.02, 1.05, 1.9], 1.0).outcome == c.INCONCLUSIVE
    assert c.verdict([1.5, 1.6, 1.7], 1.0).outcome == c.HELD


def test_not_testable_and_model_disagrees_say_what_they_rest_on():
    v = c.not_testable("no 300-epoch tail: the runs stop at 2 epochs", what="final gap")
    assert v.outcome == c.NOT_TESTABLE and "300-epoch" in str(v)
    assert c.model_disagrees(2.2, 2.0, 2.5) is None  # inside the source's range
    m = c.model_disagrees(1.7, 2.0, 2.5, what="speed-up", unit="x")
    assert m.outcome == c.MODEL_DISAGREES and "below the source's 2-2.5x" in str(m)
    held = c.verdict([2.0, 2.1], 1.0)
    assert c.combine([held, m]) == c.MODEL_DISAGREES
    assert c.combine([v, v]) == c.NOT_TESTABLE
    assert c.combine([held, v]) == c.INCONCLUSIVE
    assert set(c.MEANING) == set(c.OUTCOMES)
    row = c.claim_row("Figure 6", "x", "y", 1.0, claim="claim", verdict=v)
    assert row["verdict"].startswith(c.NOT_TESTABLE + ":")
