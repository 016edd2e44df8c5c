"""The communication-vs-quality notebook's logic (`localsgd.paper.experiments.comm_quality`) on
hand-made records: its grid, the bytes each worker sends, the modelled time to a target and each
"matches within half a point" claim, where it must fire and where it must not. No training."""

from __future__ import annotations

import math
import types

import pandas as pd
import pytest

from localsgd.compression import wire_bytes
from localsgd.paper.experiments import comm_quality as cq

P = types.SimpleNamespace(
    dataset="synthetic", model="resnet20", width=0.25, n_train=None, n_test=None, K=4,
    B_loc=16, epochs=2.0, lr=0.1, warmup_epochs=0.0, batched=False, device="cpu", H=8,
    outer_lr=0.7, outer_momentum=0.9, fragments=4, overlap=2, formats=["int8", "int4"])
STREAM = "streaming DiLoCo (P = 4, τ = 2)"


def test_the_grid_pairs_every_variant_by_seed():
    configs, labels = cq.configs(P, [0, 1])
    names = [lab["variant"] for lab in labels]
    assert names == [n for n in (cq.LOCAL, "int8 averages", "int4 averages", cq.DILOCO, STREAM)
                     for _ in (0, 1)]
    assert [c.seed for c in configs] == [0, 1] * 5
    by = dict(zip(names, configs, strict=True))
    assert by[cq.LOCAL].momentum_scheme == "local" and by[cq.LOCAL].local_steps == 8
    assert (by[cq.DILOCO].momentum_scheme, by[cq.DILOCO].global_nesterov,
            by[cq.DILOCO].global_lr, by[cq.DILOCO].global_momentum) == ("hybrid", True, 0.7, 0.9)
    assert (by[STREAM].fragments, by[STREAM].overlap_steps, by[STREAM].global_nesterov) == (
        4, 2, True)
    assert by["int4 averages"].average_compression == "int4"


def _final(diffs: dict[str, list[float]], *, base: float = 80.0, move: float = 0.1,
           train: float = 95.0) -> pd.DataFrame:
    """Final records: local SGD at ``base`` per seed, each other variant at base + its diff."""
    rows = []
    seeds = range(len(next(iter(diffs.values()))))
    for seed in seeds:
        rows.append({"variant": cq.LOCAL, "seed": seed, "test_acc": base + seed,
                     "train_acc": train, "tail_move": move, "step": 64, "param_bytes": 4000,
                     "format": "fp32"})
        for name, d in diffs.items():
            rows.append({"variant": name, "seed": seed, "test_acc": base + seed + d[seed],
                         "train_acc": train, "tail_move": move, "step": 64,
                         "param_bytes": 4000, "format": name.split()[0]
                         if name.endswith("averages") else "fp32"})
    return pd.DataFrame(rows)


def _outcomes(final: pd.DataFrame) -> dict[str, str]:
    rows = cq.comm_claims(final, mode="quick", names=list(dict.fromkeys(final.variant)))
    return {r["setting"]: r["verdict"].split(":", 1)[0] for r in rows}


def test_a_match_holds_fails_or_stays_open_by_the_rule():
    final = _final({"int8 averages": [0.1, -0.05, 0.0, 0.05],  # within half a point: held
                    "int4 averages": [-2.0, -2.2, -1.9, -2.1],  # two points lower: did not hold
                    cq.DILOCO: [0.5, -1.5, 1.0, -1.2]})  # straddles -0.5: inconclusive
    got = _outcomes(final)
    assert got == {"int8 averages vs local SGD": "held",
                   "int4 averages vs local SGD": "did not hold",
                   "DiLoCo vs local SGD": "inconclusive at this scale"}


def test_a_much_better_variant_does_not_match_either():
    # "matches within half a point" is two-sided: three points better is no match
    final = _final({"int8 averages": [3.0, 3.1, 2.9]})
    row = cq.comm_claims(final, mode="quick", names=[cq.LOCAL, "int8 averages"])[0]
    assert row["verdict"].startswith("did not hold") and "<= 0.5" in row["verdict"]
    held = cq.comm_claims(_final({"int8 averages": [0.1, -0.05, 0.0, 0.05]}), mode="quick",
                          names=[cq.LOCAL, "int8 averages"])[0]["verdict"]
    assert held.startswith("held") and "both inside ±0.5 points" in held


def test_streaming_is_judged_against_diloco_not_local_sgd():
    # streaming loses 2 points to local SGD but ties DiLoCo, which loses 2 too
    final = _final({cq.DILOCO: [-2.0, -2.1, -2.0], STREAM: [-2.0, -2.05, -1.95]})
    got = _outcomes(final)
    assert got[f"{STREAM} vs DiLoCo"] == "held"
    assert got["DiLoCo vs local SGD"] == "did not hold"


def test_the_regime_check_comes_first():
    still_moving = _final({"int8 averages": [0.0, 0.0, 0.0]}, move=2.0)
    assert _outcomes(still_moving) == {"int8 averages vs local SGD": "not testable at this budget"}
    underfit = _final({"int8 averages": [0.0, 0.0, 0.0]}, train=50.0)
    assert _outcomes(underfit) == {"int8 averages vs local SGD": "not testable at this budget"}
    # the tested quantity stays in the row even where the regime check decides
    row = cq.comm_claims(still_moving, mode="quick", names=[cq.LOCAL, "int8 averages"])[0]
    assert row["value"] == pytest.approx(0.0)


def test_bytes_sent_are_the_codes_of_every_average():
    final = _final({"int8 averages": [0.0, 0.0]})
    table = cq.summary(final, H=8, K=4).set_index("variant")
    n = 1000  # 4,000 bytes of float32
    averages = 64 // 8
    assert table.loc[cq.LOCAL, "sent_mb"] == pytest.approx(
        averages * 2 * 3 / 4 * wire_bytes(n, "fp32", 4) / 1e6)
    assert table.loc["int8 averages", "sent_mb"] == pytest.approx(
        averages * 2 * 3 / 4 * wire_bytes(n, "int8", 4) / 1e6)
    assert table.loc["int8 averages", "sent_mb"] < 0.3 * table.loc[cq.LOCAL, "sent_mb"]
    assert table.loc["int8 averages", "d_acc"] == pytest.approx(0.0)


def test_time_to_target_is_the_share_of_the_modelled_run_spent_before_it():
    configs, labels = cq.configs(P, [0])
    configs, labels = configs[:1], labels[:1]  # local SGD
    # 4 records of 16 updates, 10 ms each; 60 % reached at the third record
    runs = pd.DataFrame({"run": 0, "step": [16, 32, 48, 64], "epoch": [0.5, 1.0, 1.5, 2.0],
                         "test_acc": [20.0, 40.0, 60.0, 70.0],
                         "compute_seconds": [0.16, 0.32, 0.48, 0.64], "param_bytes": 4_000_000})
    out = cq.time_to_target(runs, configs, labels, [1.0, 10.0], target=60.0)
    assert list(out.gbps) == [1.0, 10.0]
    for row in out.itertuples():
        assert row.seconds_to_target == pytest.approx(48 / 64 * row.run_seconds)
        assert row.run_seconds > 0.64  # compute plus 8 averages of 4 MB
    slow, fast = out.run_seconds
    assert slow > fast  # the 1 Gbit/s link costs more
    never = cq.time_to_target(runs, configs, labels, [1.0], target=99.0)
    assert math.isnan(never.seconds_to_target.iloc[0])
