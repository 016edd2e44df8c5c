"""SlowMo's 'approximate averaging cuts communication and synchronisation time', judged from
hand-made emulated-cluster rows."""

from __future__ import annotations

import pandas as pd
import pytest

from localsgd.paper.experiments import slowmo
from localsgd.paper.experiments.claims import HELD, NOT_HELD


def _rows(ddp_sync: list[float], slowmo_sync: list[float]) -> pd.DataFrame:
    rows = []
    for r, (a, b) in enumerate(zip(ddp_sync, slowmo_sync, strict=True)):
        for run, s in (("ddp", a), ("slowmo", b)):
            rows += [{"run": run, "repeat": r, "rank": k, "wait_s": s / 2, "comm_s": s / 2,
                      "step_s": 0.05 + s, "link_mbit": 97.0} for k in range(4)]
    return pd.DataFrame(rows)


def test_a_cut_holds_and_none_does_not():
    row = slowmo.cluster_approx_rows(_rows([0.2, 0.21, 0.19], [0.07, 0.071, 0.069]))[0]
    assert row["claim"] == slowmo.APPROX_CLAIM and row["verdict"].startswith(HELD)
    assert row["value"] == pytest.approx((0.2 / 0.07 + 0.21 / 0.071 + 0.19 / 0.069) / 3)
    worse = slowmo.cluster_approx_rows(_rows([0.07, 0.071, 0.069], [0.2, 0.21, 0.19]))[0]
    assert worse["verdict"].startswith(NOT_HELD)


def test_missing_columns_are_one_line():
    with pytest.raises(ValueError, match=r"lack columns \['wait_s'\].*--figure approx"):
        slowmo.cluster_approx_table(_rows([0.2], [0.1]).drop(columns="wait_s"))
