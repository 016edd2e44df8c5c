"""Figure 1 on the emulated cluster (`lin2020.fig01`): the table, the model beside it, and the
claim's verdict from hand-made measurements, so each outcome is seen to be reachable."""

from __future__ import annotations

import pandas as pd
import pytest

from localsgd.paper.experiments import lin2020
from localsgd.paper.experiments.claims import HELD, INCONCLUSIVE, NOT_HELD


def _measured(seconds: dict[tuple[int, int], list[float]], rate: float = 96.4) -> pd.DataFrame:
    return pd.DataFrame([{"nodes": n, "procs_per_node": p, "processes": n * p, "repeat": i,
                          "seconds": s, "asked_rate_mbit": 100.0,
                          "measured_rate_mbit": rate if n > 1 else float("nan"), "mb": 100.0}
                         for (n, p), times in seconds.items() for i, s in enumerate(times)])


def _claim(rows):
    return next(r for r in rows if "verdict" in r)


def test_time_growing_with_nodes_holds():
    m = _measured({(2, 1): [8.9, 9.0, 9.1], (4, 1): [13.2, 13.4, 13.3], (8, 1): [15.6, 15.7, 15.9]})
    row = _claim(lin2020.fig01.rows(m))
    assert row["verdict"].startswith(HELD) and row["claim"] == lin2020.fig01.CLAIM
    assert row["value"] == pytest.approx(15.733 / 9.0, rel=1e-3)
    assert "8 vs 2 nodes" in row["setting"] and row["unit"] == "x"


def test_flat_time_does_not_hold_and_noise_is_inconclusive():
    flat = _measured({(2, 1): [9.0, 9.1, 9.2], (8, 1): [8.0, 8.1, 8.05]})
    assert _claim(lin2020.fig01.rows(flat))["verdict"].startswith(NOT_HELD)
    noisy = _measured({(2, 1): [9.0, 9.0, 9.0], (8, 1): [5.0, 14.0, 9.5]})
    assert _claim(lin2020.fig01.rows(noisy))["verdict"].startswith(INCONCLUSIVE)


def test_table_puts_the_ring_model_beside_the_measurement():
    m = _measured({(1, 2): [0.1, 0.1], (2, 1): [9.0, 9.2], (8, 1): [15.7, 15.8]})
    tab = lin2020.fig01.table(m)
    two = tab[(tab.nodes == 2)].iloc[0]
    # ring: 2 (g - 1) / g x 100 MB over 96.4 Mbit/s, plus 50 us a step
    assert two.model_s == pytest.approx(100 * 2**20 * 8 / 96.4e6 + 50e-6, rel=1e-6)
    eight = tab[(tab.nodes == 8)].iloc[0]
    assert eight.model_s / two.model_s == pytest.approx(1.75, rel=1e-3)
    assert list(tab.processes) == [2, 2, 8]


def test_no_two_node_layout_gives_no_claim_and_bad_files_one_line():
    only = _measured({(4, 1): [13.0, 13.1]})
    assert all("verdict" not in r for r in lin2020.fig01.rows(only))
    with pytest.raises(ValueError, match=r"lack columns \['seconds'\].*localsgd bench cluster"):
        lin2020.fig01.table(only.drop(columns="seconds"))
