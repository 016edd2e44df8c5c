"""The verdict rule (one-sided 95 % t bounds), the regime check and claim rows (localsgd.paper.experiments.claims) on hand-made values."""

import math
import statistics

import pandas as pd
import pytest

from localsgd.paper.experiments import claims as c

O = c.ours("a test's threshold")


def test_one_seed_is_inconclusive_whatever_its_value():
    for value in (-5.0, 0.0, 5.0):
        v = c.verdict([value], -1.0, what="H=8 minus H=1", unit=" points", origin=O)
        assert v.outcome == c.INCONCLUSIVE and v.seeds == 1
        assert "one seed" in v.reason and math.isnan(v.low)


def test_the_rule_is_the_one_sided_95_percent_t_bound():
    # n = 3: the bound is t(0.95, 2) = 2.920 standard errors from the mean
    vals = [1.5, 1.6, 1.7]
    v = c.verdict(vals, 1.0, origin=O)
    se = statistics.stdev(vals) / math.sqrt(3)
    assert v.low == pytest.approx(1.6 - 2.919986 * se, rel=1e-6)
    assert v.high == pytest.approx(1.6 + 2.919986 * se, rel=1e-6)
    assert v.outcome == c.HELD and "one-sided 95 % bound" in v.reason
    # the lower bound alone decides "held": just above the threshold holds, just below does not
    assert c.verdict(vals, v.low - 1e-9, origin=O).outcome == c.HELD
    assert c.verdict(vals, v.low + 1e-9, origin=O).outcome == c.INCONCLUSIVE
    # and the upper bound alone decides "did not hold"
    assert c.verdict(vals, v.high + 1e-9, origin=O).outcome == c.NOT_HELD
    assert c.verdict(vals, v.high - 1e-9, origin=O).outcome == c.INCONCLUSIVE
    # "<=" claims mirror it
    assert c.verdict(vals, v.high + 1e-9, higher_is_better=False, origin=O).outcome == c.HELD
    assert c.verdict(vals, v.low - 1e-9, higher_is_better=False, origin=O).outcome == c.NOT_HELD
    assert c.verdict(vals, 1.6, higher_is_better=False, origin=O).outcome == c.INCONCLUSIVE


def test_two_seeds_need_a_wide_margin():
    # n = 2: t(0.95, 1) = 6.314; seeds 2.0 and 2.2 (se 0.1) put the bound 0.63 below the mean
    assert c.verdict([2.0, 2.2], 1.0, origin=O).outcome == c.HELD
    assert c.verdict([2.0, 2.2], 1.5, origin=O).outcome == c.INCONCLUSIVE  # 1.47 < 1.5
    # the old rule (same side, mean >= 1 sd away) held [1.2, 1.6] against 1.0: no longer
    assert c.verdict([1.2, 1.6], 1.0, origin=O).outcome == c.INCONCLUSIVE
    assert c.verdict([0.1, 0.3], 1.5, origin=O).outcome == c.NOT_HELD
    v = c.verdict([2.0, 2.2], 1.0, origin=O)
    assert v.mean == pytest.approx(2.1) and v.sd == pytest.approx(math.sqrt(0.02)) and v.seeds == 2


def test_zero_variance_decides_unless_on_the_threshold():
    assert c.verdict([1.0, 1.0, 1.0], 0.5, origin=O).outcome == c.HELD
    assert c.verdict([1.0, 1.0, 1.0], 1.5, origin=O).outcome == c.NOT_HELD
    assert c.verdict([1.0, 1.0, 1.0], 1.0, origin=O).outcome == c.INCONCLUSIVE


def test_straddling_seeds_are_inconclusive():
    v = c.verdict([1.4, 1.5, 0.9], 1.0, origin=O)
    assert v.mean > 1.0 and v.outcome == c.INCONCLUSIVE and v.seeds == 3
    assert "the threshold lies within them" in v.reason
    # all three on one side is not enough when the bound reaches across
    assert c.verdict([1.02, 1.05, 1.9], 1.0, origin=O).outcome == c.INCONCLUSIVE


def test_every_verdict_names_its_threshold_and_where_it_comes_from():
    v = c.verdict([2.0, 2.2, 2.1], 1.0, what="speed-up", unit="x",
                  origin=c.paper("§4.2.1, 'at least 1x'"))
    assert "claim speed-up >= 1x (the paper's: §4.2.1, 'at least 1x')" in v.reason
    d = c.verdict(1.04, 1.0, deterministic=True, origin=c.ours("why"))
    assert "(our tolerance: why)" in d.reason
    with pytest.raises(TypeError):
        c.verdict([1.0, 2.0], 0.0)  # no origin: refused


def test_every_verdict_call_in_the_package_states_its_origin():
    import ast
    from pathlib import Path

    import localsgd

    for path in Path(localsgd.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr",
                                                      getattr(node.func, "id", "")) == "verdict":
                assert any(k.arg == "origin" for k in node.keywords), f"{path}:{node.lineno}"


def test_deterministic_quantities_are_decided_by_the_value():
    assert c.verdict(1.04, 1.0, deterministic=True, origin=O).outcome == c.HELD
    assert c.verdict(0.96, 1.0, deterministic=True, origin=O).outcome == c.NOT_HELD
    assert c.verdict(0.036, 0.1, higher_is_better=False, deterministic=True,
                     origin=O).outcome == c.HELD


def test_unavailable_and_not_measurable():
    assert c.verdict([1.0], 0.0, data_available=False, origin=O).outcome == c.UNAVAILABLE
    v = c.verdict([math.nan, None], 1.0, origin=O)
    assert v.outcome == c.NOT_MEASURABLE and "nan" not in str(v).lower()
    # a seed that never reached the target is dropped, the others decide
    assert c.verdict([2.0, math.nan, 2.1], 1.0, origin=O).seeds == 2


def test_combine_parts():
    held, no, inc = (c.verdict([2.0, 2.1], 1.0, origin=O), c.verdict([0.0, 0.1], 1.0, origin=O),
                     c.verdict([1.0], 0.0, origin=O))
    unav = c.verdict([1.0], 0.0, data_available=False, origin=O)
    assert c.combine([held, held]) == c.HELD
    assert c.combine([held, no]) == c.NOT_HELD
    assert c.combine([held, inc]) == c.INCONCLUSIVE
    assert c.combine([held, unav]) == c.INCONCLUSIVE  # a part could not be judged
    assert c.combine([unav, unav]) == c.UNAVAILABLE
    assert c.combine([]) == c.UNAVAILABLE


def test_claim_row_columns_and_no_nan():
    v = c.verdict([2.0, 2.2], 1.0, what="speed-up", unit="x", origin=O)
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

    assert verdict(1.99, 2.0, deterministic=True, origin=O).outcome == NOT_HELD
    near = verdict(1.99, 2.0, deterministic=True, resolution=0.2, unit="x", origin=O)
    assert near.outcome == INCONCLUSIVE and "resolution" in near.reason
    assert verdict(1.7, 2.0, deterministic=True, resolution=0.2, origin=O).outcome == NOT_HELD
    assert verdict(2.3, 2.0, deterministic=True, resolution=0.2, origin=O).outcome == "held"


# --------------------------------------------------------------------------- the regime check
def _run(final_test: float, final_train: float, tail: list[float], seed: int = 0,
         epochs: int = 20) -> pd.DataFrame:
    """One run's records: test top-1 climbing to the tail's first value, then ``tail`` over
    the last epochs; train top-1 ``final_train`` at the end."""
    n = epochs - len(tail) + 1
    test = [final_test * (e + 1) / n for e in range(n - 1)] + tail
    test[-1] = final_test
    return pd.DataFrame({"epoch": range(1, epochs + 1), "step": range(10, 10 * epochs + 1, 10),
                         "test_acc": test, "train_acc": [final_train] * epochs, "seed": seed})


def test_tail_move_reads_the_last_tenth():
    run = _run(80.0, 90.0, [79.0, 79.6, 80.0])  # epochs 18-20 of 20: the last tenth
    assert c.tail_move(run) == pytest.approx(1.0)
    assert math.isnan(c.tail_move(run.tail(1)))  # one record: no movement to see
    assert math.isnan(c.tail_move(pd.DataFrame({"epoch": [1.0], "test_acc": [5.0]})))


def _side(test: float, train: float, tail: list[float], seeds: int = 3) -> pd.DataFrame:
    runs = pd.concat([_run(test, train, tail, seed=s).assign(run=s) for s in range(seeds)])
    return c.final_rows(runs)


def test_regime_passes_converged_comparable_runs():
    a = _side(80.0, 95.0, [79.9, 80.0, 80.0])
    b = _side(78.0, 93.0, [77.8, 78.1, 78.0])
    assert c.regime({"A": a, "B": b}) is None
    assert a.tail_move.tolist() == pytest.approx([0.1] * 3)


def test_regime_names_a_configuration_still_moving():
    a = _side(80.0, 95.0, [79.9, 80.0, 80.0])
    moving = _side(70.0, 93.0, [66.0, 68.0, 70.0])
    v = c.regime({"H = 16": a, "H = 1": moving})
    assert v.outcome == c.NOT_IN_REGIME
    assert "H = 1's test top-1 still moves 4.00 points over its last tenth (> 0.5" in v.reason
    assert "H = 16" not in v.reason.split(";")[0].split("'s")[0]
    # exactly at the bound still counts as converged
    edge = _side(70.0, 93.0, [69.5, 69.8, 70.0])
    assert c.regime({"A": a, "B": edge}) is None


def test_regime_names_an_underfit_configuration():
    local = _side(78.0, 80.0, [77.9, 78.0, 78.0])
    mini = _side(50.0, 51.0, [49.9, 50.0, 50.0])
    v = c.regime({"local SGD": local, "mini-batch SGD": mini})
    assert v.outcome == c.NOT_IN_REGIME
    assert "mini-batch SGD underfits: its train top-1 51.0 % < local SGD's test top-1 78.0 %" \
        in v.reason
    assert "local SGD underfits" not in v.reason
    # a claim that a run fails to train compares no fit: pairs=[] checks convergence only
    assert c.regime({"local SGD": local, "mini-batch SGD": mini}, pairs=[]) is None


def test_regime_leaves_a_side_without_accuracy_to_the_verdict():
    local = _side(78.0, 80.0, [77.9, 78.0, 78.0])
    empty = local.assign(test_acc=math.nan)
    assert c.regime({"A": local, "B": empty}, pairs=[("A", "B"), ("B", "A")]) is None


def test_regime_without_the_records_to_judge_is_not_testable():
    local = _side(78.0, 80.0, [77.9, 78.0, 78.0])
    short = local.assign(tail_move=math.nan)
    v = c.regime({"A": local, "B": short})
    assert v.outcome == c.NOT_IN_REGIME and "B has too few records" in v.reason
    assert c.regime({"A": local, "B": local.drop(columns="tail_move")}).outcome == \
        c.NOT_IN_REGIME


def test_not_testable_and_model_disagrees_say_what_they_rest_on():
    v = c.not_testable("no 300-epoch tail: the runs stop at 2 epochs", what="final gap")
    assert v.outcome == c.NOT_TESTABLE and "300-epoch" in str(v)
    assert c.model_disagrees(2.2, 2.0, 2.5) is None  # inside the source's range
    m = c.model_disagrees(1.7, 2.0, 2.5, what="speed-up", unit="x")
    assert m.outcome == c.MODEL_DISAGREES and "below the source's 2-2.5x" in str(m)
    held = c.verdict([2.0, 2.1], 1.0, origin=O)
    assert c.combine([held, m]) == c.MODEL_DISAGREES
    assert c.combine([v, v]) == c.NOT_TESTABLE
    assert c.combine([held, v]) == c.INCONCLUSIVE
    assert set(c.MEANING) == set(c.OUTCOMES)
    row = c.claim_row("Figure 6", "x", "y", 1.0, claim="claim", verdict=v)
    assert row["verdict"].startswith(c.NOT_TESTABLE + ":")


def test_the_tested_quantity_is_one_mean_or_the_range_of_the_parts_means():
    assert c.tested_text([0.4321], " points") == "+0.43 points"
    assert c.tested_text([2.0, -1.5, math.nan], " points") == "-1.5 to +2 points"
    assert c.tested_text([math.nan]) == ""
    row = c.claim_row("Table 1", "s", "test top-1", 77.5, unit="%", claim="c",
                      verdict="held: x", tested="+2 points")
    assert row["value"] == 77.5 and row["tested"] == "+2 points"
    assert "tested" not in c.claim_row("Table 1", "s", "test top-1", 77.5)
