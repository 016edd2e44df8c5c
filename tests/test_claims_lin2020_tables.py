"""Claims of Lin et al. (2020) Tables 1, 5 and 6-7 (localsgd.paper.experiments.lin2020) on hand-made
per-seed records: each claim's outcomes, pairing by seed, and keys that join reported.csv."""

import math
from pathlib import Path

import pandas as pd
import pytest

from localsgd.paper.experiments import claims as c
from localsgd.paper.experiments import lin2020

REPORTED = Path(__file__).resolve().parents[1] / "papers" / "lin2020_local_sgd" / "reported.csv"


def reported_keys() -> set[tuple[str, str, str]]:
    df = pd.read_csv(REPORTED, dtype=str, keep_default_na=False)
    return set(zip(df.artifact, df.setting, df.metric, strict=True))


def claimed(rows: list[dict]) -> dict:
    """The one row that carries the claim."""
    with_claim = [r for r in rows if "verdict" in r]
    assert len(with_claim) == 1, with_claim
    return with_claim[0]


def outcome(rows: list[dict]) -> str:
    return claimed(rows)["verdict"].split(":", 1)[0]


# ------------------------------------------------------------------------------------ Table 1
def t1_final(gap_wo: list[float], gap_w: list[float], base: list[float] | None = None,
             b_globs=(128, 1024)) -> pd.DataFrame:
    """Final records: mini-batch SGD at ``base`` per seed, local SGD ``gap`` points above it at
    the largest B_glob (one gap per seed)."""
    base = base or [80.0] * len(gap_wo)
    rows = []
    for tricks, gaps in (("w/o tricks", gap_wo), ("w/ tricks", gap_w)):
        for b in b_globs:
            for seed, (acc, gap) in enumerate(zip(base, gaps, strict=True)):
                top = b == max(b_globs)
                rows += [{"tricks": tricks, "method": "mini-batch SGD", "B_glob": b, "seed": seed,
                          "test_acc": acc},
                         {"tricks": tricks, "method": "local SGD", "B_glob": b, "seed": seed,
                          "test_acc": acc + (gap if top else 0.0)}]
    return pd.DataFrame(rows)


def t1(final: pd.DataFrame) -> list[dict]:
    return lin2020.table01_claims(final, mode="smoke", B_loc=128, width=0.25, n_train=512,
                                  epochs=1.0)


def test_table01_rows_and_claim_anchor():
    rows = t1(t1_final([5.0, 6.0], [4.0, 5.0]))
    assert len(rows) == 8  # 2 tricks x 2 methods x 2 B_glob
    row = claimed(rows)
    assert row["setting"] == "local SGD; w/o tricks; B_glob=1024"
    assert row["value"] == pytest.approx(85.5) and row["unit"] == "%"
    assert row["claim"] == lin2020.TABLE01_CLAIM
    assert row["verdict"].startswith("held: at B_glob = 1024")
    assert "w/o tricks: held, +5.50 points" in row["verdict"]
    notes = {r["setting"]: r["note"] for r in rows}
    assert notes["mini-batch SGD; w/ tricks; B_glob=128"].startswith("smoke: std=0.00 over 2 ")
    assert "512 images, 1 epochs" in notes["mini-batch SGD; w/ tricks; B_glob=128"]


def test_table01_outcomes():
    assert outcome(t1(t1_final([5.0, 6.0], [-3.0, -4.0]))) == c.NOT_HELD  # tricks part fails
    one = claimed(t1(t1_final([5.0], [5.0])))["verdict"]
    assert one.startswith(c.INCONCLUSIVE) and "one seed" in one
    straddle = claimed(t1(t1_final([-1.0, 2.0], [5.0, 6.0])))["verdict"]
    assert straddle.startswith(c.INCONCLUSIVE) and "within the seed spread" in straddle


def test_table01_pairs_by_seed():
    # seeds differ by 20 points, but within each seed local SGD is 1 point ahead: paired
    # differences (1, 1) decide the claim; comparing the unpaired spreads could not
    assert outcome(t1(t1_final([1.0, 1.0], [1.0, 1.0], base=[89.0, 69.0]))) == c.HELD


def test_table01_not_measurable_without_finite_accuracy():
    final = t1_final([5.0, 6.0], [4.0, 5.0])
    final.loc[(final.method == "mini-batch SGD") & (final.B_glob == 1024), "test_acc"] = math.nan
    rows = t1(final)
    assert outcome(rows) == c.NOT_MEASURABLE
    assert not any("nan" in r["verdict"].lower() for r in rows if "verdict" in r)


def test_table01_says_when_mini_batch_underfits():
    # mini-batch SGD fits its training set no better than it tests: local SGD's lead is then an
    # optimisation gap, and the verdict says so; with a train top-1 above the rival's test
    # top-1 (or no train_acc column) it says nothing more
    final = t1_final([20.0, 21.0], [25.0, 26.0], base=[50.0, 52.0])
    final["train_acc"] = final.test_acc + 1.0
    text = claimed(t1(final))["verdict"]
    assert text.startswith("held: ")
    assert "mini-batch SGD underfits (w/o tricks: train top-1 52.0 % < local SGD's test top-1 " \
        "71.5 %; w/ tricks: train top-1 52.0 % < local SGD's test top-1 76.5 %)" in text
    final["train_acc"] = 99.0
    assert "underfits" not in claimed(t1(final))["verdict"]
    assert "underfits" not in claimed(t1(t1_final([20.0, 21.0], [25.0, 26.0])))["verdict"]


def test_table01_keys_join_reported():
    keys = reported_keys()
    for row in t1(t1_final([1.0, 2.0], [1.0, 2.0])):
        assert (row["artifact"], row["setting"], row["metric"]) in keys, row["setting"]


def test_table01_reported_cells():
    paper = lin2020.table01_reported()
    assert len(paper) == 24
    cell = paper[(paper.method == "mini-batch SGD") & (paper.tricks == "w/ tricks")
                 & (paper.B_glob == 4096)]
    assert cell.test_acc.tolist() == [13.90]


# ------------------------------------------------------------------------------------ Table 5
def t5_final(gaps: dict[str, list[float]], dataset: str = "cifar10") -> pd.DataFrame:
    """H = 1 at 70 % per seed and H = 8 ``gaps[model]`` points from it."""
    rows = []
    for model, gs in gaps.items():
        for seed, gap in enumerate(gs):
            for h, acc in ((1, 70.0 + seed), (8, 70.0 + seed + gap)):
                rows.append({"dataset": dataset, "model_name": model, "width": 0.25,
                             "local_steps": h, "seed": seed, "test_acc": acc})
    return pd.DataFrame(rows)


def t5(final: pd.DataFrame, status: dict | None = None, models=("resnet20", "wrn28_10"),
       hs=(1, 8)) -> list[dict]:
    status = status or {"cifar10": "available"}
    return lin2020.table05_claims(final, status=status, models=list(models), K=2, hs=list(hs),
                                  mode="smoke", n_train=256, epochs=1.0)


def test_table05_held_on_every_model_within_the_band():
    rows = t5(t5_final({"resnet20": [0.1, -0.1], "wrn28_10": [0.3, 0.2]}))
    assert len(rows) == 6  # 4 cells and 2 paired changes
    row = claimed(rows)
    assert row["setting"] == "model=ResNet-20; dataset=CIFAR-10; K=2; H=8 vs H=1"
    assert row["metric"] == "test top-1 change" and row["value"] == pytest.approx(0.0)
    wrn = next(r for r in rows if r["setting"].startswith("model=WideResNet-28-10")
               and r["metric"] == "test top-1 change")
    assert wrn["value"] == pytest.approx(0.25) and wrn["unit"] == "points"
    assert "paired by seed, sd=0.07 over 2 seed(s)" in wrn["note"]
    assert row["verdict"].startswith("held: |H=8 minus H=1| <= 1 point")
    assert "WideResNet-28-10/CIFAR-10: held, +0.25 points" in row["verdict"]


def test_table05_two_sided_band():
    # below the band on one model
    assert outcome(t5(t5_final({"resnet20": [0.0, 0.1], "wrn28_10": [-3.0, -3.5]}))) == c.NOT_HELD
    # above the band counts as not matching too
    assert outcome(t5(t5_final({"resnet20": [3.0, 3.2], "wrn28_10": [0.0, 0.1]}))) == c.NOT_HELD
    # inside, but the mean lies closer to the edge than one sd: not decided
    assert outcome(t5(t5_final({"resnet20": [0.5, 0.99], "wrn28_10": [0.0, 0.1]}))) == \
        c.INCONCLUSIVE


def test_table05_inconclusive():
    one = claimed(t5(t5_final({"resnet20": [0.2], "wrn28_10": [0.1]})))["verdict"]
    assert one.startswith(c.INCONCLUSIVE) and "one seed" in one
    straddle = claimed(t5(t5_final({"resnet20": [-1.5, 0.5], "wrn28_10": [0.0, 0.1]})))
    assert straddle["verdict"].startswith(c.INCONCLUSIVE)
    assert "within the seed spread" in straddle["verdict"]


def test_table05_data_unavailable():
    final = t5_final({"resnet20": [0.1, -0.1], "wrn28_10": [0.0, 0.1]})
    status = {"cifar10": "available", "cifar100": "data unavailable"}
    row = claimed(t5(final, status))
    assert row["verdict"].startswith(c.INCONCLUSIVE)  # CIFAR-100's cells stay untested
    assert "CIFAR-100: data unavailable" in row["verdict"]
    assert "ResNet-20/CIFAR-10: held" in row["verdict"]
    # nothing available: one row without a value says so
    final, _ = lin2020.table05_final(None)
    rows = t5(final, {"cifar10": "data unavailable", "cifar100": "data unavailable"})
    assert len(rows) == 1 and rows[0]["value"] is None
    assert rows[0]["setting"] == "model=ResNet-20; dataset=CIFAR-10; K=2; H=8 vs H=1"
    assert rows[0]["metric"] == "test top-1 change"
    assert rows[0]["verdict"].startswith(c.UNAVAILABLE)


def test_table05_not_measurable_and_no_claim_without_both_h():
    final = t5_final({"resnet20": [0.1, -0.1], "wrn28_10": [0.0, 0.1]})
    final.loc[final.local_steps == 8, "test_acc"] = math.nan
    assert outcome(t5(final)) == c.NOT_MEASURABLE
    rows = t5(final[final.local_steps == 1], hs=(1,))
    assert not any("verdict" in r for r in rows)


def test_table05_keys_join_reported():
    keys = reported_keys()
    models = ("resnet20", "densenet40_12", "wrn28_10")
    final = pd.concat([t5_final({m: [0.0, 0.1] for m in models}, d)
                       for d in ("cifar10", "cifar100")])
    rows = t5(final, {"cifar10": "available", "cifar100": "available"}, models=models)
    assert len(rows) == 18  # 12 cells and 6 paired changes, each a reported row
    for row in rows:
        assert (row["artifact"], row["setting"], row["metric"]) in keys, row["setting"]


def test_table05_data_marks_unavailable_sets():
    final = t5_final({"resnet20": [0.0]})
    out = lin2020.table05_data(final, {"cifar10": "available", "cifar100": "data unavailable"})
    assert out.status.tolist() == ["ok", "ok", "data unavailable"]
    assert out.dataset.iloc[-1] == "cifar100"


# ---------------------------------------------------------------------------------- Tables 6-7
def t6_final(cells: dict[tuple[float, float], list[float]],
             table7: dict[tuple[float, float], list[float]] | None = None) -> pd.DataFrame:
    """Final records: test top-1 per seed of each (local, global) momentum cell."""
    table7 = {(0.9, 0.0): [88.0, 88.5]} if table7 is None else table7
    rows = []
    for table, h, grid in (("Table 6", 1, cells), ("Table 7", 8, table7)):
        for (loc, glob), accs in grid.items():
            for seed, acc in enumerate(accs):
                rows.append({"table": table, "H": h, "local_momentum": loc,
                             "global_momentum": glob, "seed": seed, "test_acc": acc})
    return pd.DataFrame(rows)


def t6(final: pd.DataFrame) -> list[dict]:
    return lin2020.table06_07_claims(final, mode="smoke", width=0.25, n_train=640, epochs=1.0)


GOOD = {(0.0, 0.0): [80.0, 81.0], (0.9, 0.0): [85.0, 86.0], (0.9, 0.3): [85.2, 86.1],
        (0.9, 0.9): [10.0, 10.5]}


def test_table06_held_and_anchor():
    rows = t6(t6_final(GOOD))
    assert len(rows) == 5
    row = claimed(rows)
    assert (row["artifact"], row["setting"]) == ("Table 6",
                                                "local momentum=0.9; global momentum=0.0; H=1")
    assert row["claim"] == lin2020.TABLE06_CLAIM
    assert row["verdict"].startswith("held: at H = 1, local 0.9 minus none >= 0: held")
    assert "best global <= 0.5 (0.3)" in row["verdict"]
    assert "global 0.9 minus none <= -10: held" in row["verdict"]


def test_table06_each_part_can_fail():
    no_gain = {**GOOD, (0.0, 0.0): [88.0, 89.5]}
    assert outcome(t6(t6_final(no_gain))) == c.NOT_HELD
    hurts = {**GOOD, (0.9, 0.3): [82.0, 82.5]}
    assert outcome(t6(t6_final(hurts))) == c.NOT_HELD
    no_divergence = {**GOOD, (0.9, 0.9): [84.0, 85.5]}
    assert outcome(t6(t6_final(no_divergence))) == c.NOT_HELD
    # every global momentum >= 0.7 must drop, not just the worst one
    one_diverges = {**GOOD, (0.9, 0.7): [10.0, 10.2], (0.9, 0.9): [84.0, 85.5]}
    assert outcome(t6(t6_final(one_diverges))) == c.NOT_HELD


def test_table06_best_small_global_momentum_is_chosen_by_its_mean():
    cells = {**GOOD, (0.9, 0.1): [80.0, 80.5]}  # 0.1 hurts, 0.3 does not: the best decides
    row = claimed(t6(t6_final(cells)))
    assert row["verdict"].startswith(c.HELD) and "(0.3)" in row["verdict"]


def test_table06_inconclusive():
    one = {k: v[:1] for k, v in GOOD.items()}
    verdict = claimed(t6(t6_final(one, {(0.9, 0.0): [88.0]})))["verdict"]
    assert verdict.startswith(c.INCONCLUSIVE) and "one seed" in verdict
    straddle = {**GOOD, (0.0, 0.0): [84.0, 87.5]}  # local 0.9 minus none: +1.0, -1.5
    verdict = claimed(t6(t6_final(straddle)))["verdict"]
    assert verdict.startswith(c.INCONCLUSIVE) and "within the seed spread" in verdict


def test_table06_not_measurable_and_no_claim_without_its_cell():
    cells = {**GOOD, (0.9, 0.0): [math.nan, math.nan]}
    assert outcome(t6(t6_final(cells))) == c.NOT_MEASURABLE
    only_base = t6(t6_final({(0.9, 0.0): [85.0, 86.0]}))
    assert outcome(only_base) == c.NOT_MEASURABLE
    no_base = t6(t6_final({k: v for k, v in GOOD.items() if k != (0.9, 0.0)}))
    assert not any("verdict" in r for r in no_base)


def test_table06_07_keys_join_reported():
    keys = reported_keys()
    cells = {(0.0, 0.0): [80.0], (0.9, 0.0): [85.0], (0.9, 0.3): [85.0], (0.9, 0.95): [10.0]}
    rows = t6(t6_final(cells, {(0.9, 0.0): [88.0], (0.9, 0.5): [88.0]}))
    assert {r["setting"] for r in rows} >= {"local momentum=0.9; global momentum=0.95; H=1",
                                            "local momentum=0.9; global momentum=0.5; H=8"}
    for row in rows:
        assert (row["artifact"], row["setting"], row["metric"]) in keys, row["setting"]
    assert not any("verdict" in r for r in rows if r["artifact"] == "Table 7")


def test_table06_07_reported_cells():
    paper = lin2020.table06_07_reported()
    assert len(paper[paper.table == "Table 6"]) == 12 and len(paper[paper.table == "Table 7"]) == 6
    cell = paper[(paper.table == "Table 6") & (paper.global_momentum == 0.95)]
    assert cell.test_acc.tolist() == [10.11]
