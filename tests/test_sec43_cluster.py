"""§4.3's hierarchical gain over cluster size (`lin2020.sec43`) judged from hand-made rows."""

from __future__ import annotations

import pandas as pd
import pytest

from localsgd.paper.experiments import lin2020
from localsgd.paper.experiments.claims import HELD, NOT_HELD


def _measured(gains: dict[int, list[float]]) -> pd.DataFrame:
    rows = []
    for nodes, per_repeat in gains.items():
        for r, g in enumerate(per_repeat):
            rows += [{"nodes": nodes, "run": "hier", "repeat": r, "seconds_per_update": 0.1,
                      "link_mbit": 97.0},
                     {"nodes": nodes, "run": "flat", "repeat": r, "seconds_per_update": 0.1 * g,
                      "link_mbit": 97.0}]
    return pd.DataFrame(rows)


def test_a_growing_gain_holds_and_a_shrinking_one_does_not():
    rows = lin2020.sec43.rows(_measured({2: [1.5, 1.52, 1.49], 4: [1.7, 1.72, 1.7],
                                         8: [1.9, 1.88, 1.91]}))
    claim = rows[-1]
    assert claim["claim"] == lin2020.sec43.CLAIM and claim["verdict"].startswith(HELD)
    assert claim["value"] == pytest.approx((1.9 / 1.5 + 1.88 / 1.52 + 1.91 / 1.49) / 3)
    assert [r["value"] for r in rows[:-1]] == pytest.approx([1.5033, 1.7067, 1.8967], abs=1e-3)
    shrinks = lin2020.sec43.rows(_measured({2: [1.5, 1.52, 1.49], 8: [1.2, 1.21, 1.19]}))
    assert shrinks[-1]["verdict"].startswith(NOT_HELD)


def test_missing_runs_or_columns_are_one_line():
    with pytest.raises(ValueError, match=r"lack columns \['seconds_per_update'\]"):
        lin2020.sec43.table(_measured({2: [1.5]}).drop(columns="seconds_per_update"))
    only_flat = _measured({2: [1.5]}).query("run == 'flat'")
    with pytest.raises(ValueError, match="need both runs, flat and hier"):
        lin2020.sec43.table(only_flat)
