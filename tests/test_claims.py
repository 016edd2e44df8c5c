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
    assert ("mini-batch SGD underfits: its train top-1 over its last epoch 51.0 % < local SGD's "
            "test top-1 78.0 %") in v.reason
    assert "local SGD underfits" not in v.reason
    # a claim that a run fails to train compares no fit: pairs=[] checks convergence only
    assert c.regime({"local SGD": local, "mini-batch SGD": mini}, pairs=[]) is None


def _epochs(train_last: float, train_before: float, *, seed: int, test: float = 79.0,
            steps_per_epoch: int = 100, tail_steps: int = 6, lr_phase=None,
            test_phase=None) -> pd.DataFrame:
    """One run of 20 records at K = 2, B_loc = 128: 19 epochs of ``steps_per_epoch`` updates
    (train top-1 ``train_before``), then a last record after only ``tail_steps`` more updates
    (train top-1 ``train_last``): the partial epoch a record schedule leaves at the end."""
    steps = [steps_per_epoch * (e + 1) for e in range(19)] + [19 * steps_per_epoch + tail_steps]
    epoch = [s / steps_per_epoch for s in steps]
    n = len(steps)
    return pd.DataFrame({
        "epoch": epoch, "step": steps, "seed": seed, "world_size": 2, "local_batch": 128,
        "train_acc": [train_before] * (n - 1) + [train_last],
        "test_acc": test_phase if test_phase is not None else [test] * n,
        "lr_last": lr_phase if lr_phase is not None else [0.1] * n,
        "test_images": 10000})


def test_the_underfit_test_reads_a_full_epoch_not_the_last_partial_one():
    # the planted case of issue 62 (Table 6, global 0.3): a last record of 6 updates (1,536
    # images) whose train top-1 dips below the other side's test top-1, the epoch before it
    # well above it
    noisy = pd.concat([_epochs(78.6, 82.0, seed=s, test=78.0).assign(run=s) for s in range(3)])
    other = pd.concat([_epochs(82.0, 82.0, seed=s, test=79.0).assign(run=10 + s)
                       for s in range(3)])
    a, b = c.final_rows(noisy), c.final_rows(other)
    assert a.train_acc.tolist() == pytest.approx([78.6] * 3)  # the partial epoch's
    # back from the last record until the intervals span an epoch: the last 6 updates and the
    # 100 of the record before, weighted by their updates
    assert a.train_acc_epoch.iloc[0] == pytest.approx((82.0 * 100 + 78.6 * 6) / 106)
    assert a.train_images_epoch.iloc[0] == 106 * 2 * 128
    assert c.regime({"global 0.3": a, "local 0.9": b}) is None
    # judged as before, on the partial epoch with no margin, the same runs were excluded
    legacy = a.drop(columns=["train_acc_epoch", "train_images_epoch", "test_images"])
    v = c.regime({"global 0.3": legacy, "local 0.9": b.drop(columns="test_images")})
    assert v.outcome == c.NOT_IN_REGIME and "global 0.3 underfits" in v.reason


def test_the_underfit_margin_comes_from_the_measured_noise():
    seeds = [80.0, 80.4, 79.6]
    a = pd.DataFrame({"train_acc_epoch": seeds, "train_images_epoch": 25600.0,
                      "test_acc": 78.0, "tail_move": 0.1})
    b = pd.DataFrame({"test_acc": [80.5, 80.5, 80.5], "test_images": 10000,
                      "train_acc_epoch": 90.0, "tail_move": 0.1})
    margin = c.underfit_margin(a, b)
    se_a = max(0.4 / math.sqrt(3), 100 * math.sqrt(0.8 * 0.2 / 25600) / math.sqrt(3))
    se_b = 100 * math.sqrt(0.805 * 0.195 / 10000) / math.sqrt(3)
    assert margin == pytest.approx(1.645 * math.hypot(se_a, se_b))
    assert c.regime({"A": a, "B": b}, pairs=[("A", "B")]) is None  # 0.5 below: within it
    far = a.assign(train_acc_epoch=[78.0, 78.4, 77.6])
    v = c.regime({"A": far, "B": b}, pairs=[("A", "B")])
    assert v.outcome == c.NOT_IN_REGIME and f"{margin:.2f}-point margin" in v.reason


def test_a_run_still_rising_before_its_last_decay_fails_the_plateau_test():
    lr = [0.1] * 10 + [0.01] * 5 + [0.001] * 5  # decays at 50 % and 75 %
    flat_tail = [78.0] * 5
    rising = [50.0 + 2 * i for i in range(10)] + [70.0, 71.5, 73.0, 74.5, 76.0] + flat_tail
    settled = [50.0 + 2 * i for i in range(10)] + [76.0, 76.2, 76.3, 76.5, 76.6] + flat_tail
    a = c.final_rows(pd.concat([_epochs(90.0, 90.0, seed=s, lr_phase=lr, test_phase=rising)
                                .assign(run=s) for s in range(3)]))
    b = c.final_rows(pd.concat([_epochs(90.0, 90.0, seed=s, lr_phase=lr, test_phase=settled)
                                .assign(run=s) for s in range(3)]))
    # the last tenth passes both: the tiny final lr moves nothing
    assert a.tail_move.max() == 0 and b.tail_move.max() == 0
    # 1.5 points per epoch over the 5 pre-decay records; a tenth of training is 1.906 epochs
    assert a.phase_slope.iloc[0] == pytest.approx(1.5 * 1.906)
    v = c.regime({"rising": a, "settled": b}, pairs=[])
    assert v.outcome == c.NOT_IN_REGIME
    assert "rising's test top-1 still rises 2.86 points per tenth" in v.reason
    assert "settled" not in v.reason
    # no decay in the records (a constant lr): no phase to judge, the last tenth still does
    assert math.isnan(c.phase_slope(_epochs(90.0, 90.0, seed=0)))


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
