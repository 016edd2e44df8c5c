"""The blog's 'stragglers inflate all-reduce' judged from emulated-cluster rows (hand-made
here, so each outcome is seen to be reachable)."""

from __future__ import annotations

import pandas as pd
import pytest

from localsgd.paper.experiments import hsgd_blog
from localsgd.paper.experiments.claims import HELD, INCONCLUSIVE, NOT_HELD


def _rows(others_with: list[float], others_without: float = 0.14) -> pd.DataFrame:
    rows = []
    for r, t in enumerate(others_with):
        for run, wait in (("clean", 0.01), ("straggler", t - 0.13)):
            for rank in range(4):
                straggler = run == "straggler" and rank == 3
                w = 0.0 if straggler else (wait if run == "straggler" else others_without - 0.13)
                rows.append({"run": run, "repeat": r, "rank": rank, "straggler": straggler,
                             "wait_s": w, "comm_s": 0.13, "allreduce_s": w + 0.13,
                             "link_mbit": 97.1})
    return pd.DataFrame(rows)


def _verdict(df):
    return hsgd_blog.cluster_straggler_rows(df, stall_s=0.2)[0]["verdict"]


def test_waiting_out_a_stall_is_much_longer():
    row = hsgd_blog.cluster_straggler_rows(_rows([0.334, 0.336, 0.337]), stall_s=0.2)[0]
    assert row["verdict"].startswith(HELD) and row["value"] == pytest.approx(2.39, abs=0.01)
    assert "the straggler itself waits 0 s" in row["note"]


def test_short_waits_do_not_hold_and_noise_is_inconclusive():
    assert _verdict(_rows([0.15, 0.16, 0.155])).startswith(NOT_HELD)
    assert _verdict(_rows([0.2, 0.5, 0.28])).startswith(INCONCLUSIVE)


def test_missing_columns_are_one_line():
    with pytest.raises(ValueError, match=r"lack columns \['wait_s'\].*--figure stragglers"):
        hsgd_blog.cluster_straggler_table(_rows([0.3]).drop(columns="wait_s"))
