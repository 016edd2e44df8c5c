"""Claim rows of the timing-model notebooks, from hand-made tables (no simulation, no training):
blog_hsgd_stragglers (`hsgd_blog.blog_claims`) and table02_time_vs_H (`lin2020.table02_claims`).

The blog's claims are judged on seeds (each seed a new draw of the stalls); Table 2's on
deterministic model predictions. Every claim is checked to hold, not hold and (where seeds
decide) be inconclusive, and the rows' keys to join papers/*/reported.csv."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from localsgd.paper.experiments import hsgd_blog as hb
from localsgd.paper.experiments import lin2020
from localsgd.paper.experiments.claims import (
    HELD,
    INCONCLUSIVE,
    MODEL_DISAGREES,
    NOT_HELD,
    NOT_MEASURABLE,
)
from localsgd.paper.results import repo_root

PAPERS = repo_root() / "papers"


def outcome(row: dict) -> str:
    return row["verdict"].split(":", 1)[0]


def blog_rows(w: int, per_seed: list[dict[str, float]], *, case: str = hb.BLOG_SETTING,
              variant: str = hb.AS_SET, **extra) -> list[dict]:
    """One simulated row per (seed, scheme) with the given speed-ups (sync is 1.0)."""
    rows = []
    for seed, speedups in enumerate(per_seed):
        for scheme, s in {"sync": 1.0, **speedups}.items():
            kind = scheme.split(":")[0].replace("hsgd", "hier")
            rows.append({"scheme": scheme, "kind": kind, "workers": w, "seed": seed,
                         "speedup": s, "steps": 1000, "straggler_rate": 0.01, "case": case,
                         "variant": variant, **extra})
    return rows


def speedups(w: int, lo: float, hi: float, local2: float = 1.5, local8: float = 3.5) -> dict:
    """local SGD 2/4/8 and the blog's HSGD configurations of ``w`` GPUs spread from lo to hi."""
    hsgd = hb.BLOG_HSGD[w]
    vals = np.linspace(lo, hi, len(hsgd))
    return {"local:2": local2, "local:4": (local2 + local8) / 2, "local:8": local8,
            **dict(zip(hsgd, map(float, vals)))}


def claims(rows: list[dict], **kw) -> list[dict]:
    data = pd.DataFrame(rows)
    return hb.blog_claims(data, mode="quick", straggler_s=1.0,
                          small_stalls_s=kw.pop("small_stalls_s", [0.005, 1.0]), **kw)


def by_metric(rows: list[dict]) -> dict[str, dict]:
    return {r["metric"]: r for r in rows}


# ------------------------------------------------------------------ blog: the HSGD speed-up ranges

@pytest.mark.parametrize("lows, highs, expected", [
    ([2.20, 2.21, 2.19], [2.30, 2.32, 2.31], HELD),  # inside 2.08-2.45x on every seed
    # outside the blog's range on every seed: the model disagrees with the blog (a model, not
    # a re-run of the blog's measurement, so never "did not hold")
    ([1.80, 1.82, 1.79], [2.20, 2.25, 2.22], MODEL_DISAGREES),  # low end below 2.08x
    ([2.20, 2.21, 2.19], [2.60, 2.62, 2.61], MODEL_DISAGREES),  # the high end above 2.45x
    ([2.20], [2.30], INCONCLUSIVE),  # one seed: no spread
    ([2.00, 2.20], [2.30, 2.31], INCONCLUSIVE),  # two seeds straddle the blog's low end
])
def test_blog_speedup_range(lows, highs, expected):
    rows = [r for lo, hi in zip(lows, highs) for r in blog_rows(64, [speedups(64, lo, hi)])]
    for i, r in enumerate(rows):  # blog_rows numbers seeds from 0 per call: renumber
        r["seed"] = i // (1 + 3 + 2)
    out = by_metric(claims(rows))
    lo_row, hi_row = out["speed-up min"], out["speed-up max"]
    assert outcome(lo_row) == outcome(hi_row) == expected, lo_row["verdict"]
    # the value is the range of the configurations' means over seeds
    assert lo_row["value"] == pytest.approx(round(float(np.mean(lows)), 3))
    assert hi_row["value"] == pytest.approx(round(float(np.mean(highs)), 3))
    assert lo_row["unit"] == "x" and f"{len(lows)} seed(s)" in lo_row["note"]
    assert lo_row["claim"] == "HSGD speed-ups 2.08-2.45x on 64 GPUs (stalls 1 s)"


def test_blog_range_rows_only_for_the_blogs_gpu_counts():
    rows = blog_rows(32, [{"local:2": 1.2, "local:4": 1.4, "local:8": 1.6}])
    assert claims(rows, small_stalls_s=[]) == []


# ----------------------------------------------------------------- blog: local SGD bounds on HSGD

@pytest.mark.parametrize("local2s, local8s, expected", [
    ([1.50, 1.52, 1.49], [3.00, 3.02, 2.98], HELD),
    ([1.50, 1.52, 1.49], [2.10, 2.12, 2.11], NOT_HELD),  # local SGD every 8 below HSGD's best
    ([1.50], [3.00], INCONCLUSIVE),
    ([1.50, 1.50], [2.25, 2.40], INCONCLUSIVE),  # per seed margin -0.05 and +0.10
])
def test_blog_local_sgd_bounds(local2s, local8s, expected):
    rows = []
    for seed, (l2, l8) in enumerate(zip(local2s, local8s)):
        for r in blog_rows(64, [speedups(64, 2.1, 2.3, l2, l8)]):
            rows.append({**r, "seed": seed})
    row = by_metric(claims(rows))["local SGD bounds on HSGD"]
    assert outcome(row) == expected, row["verdict"]
    assert row["value"] is None and row["setting"] == "all GPU counts"


def test_blog_bounds_need_every_gpu_count():
    rows = []
    for seed in range(3):
        rows += [{**r, "seed": seed} for r in blog_rows(64, [speedups(64, 2.1, 2.3)])]
        rows += [{**r, "seed": seed} for r in blog_rows(128, [speedups(128, 2.6, 2.65,
                                                                        local8=2.0 + seed / 100)])]
    row = by_metric(claims(rows))["local SGD bounds on HSGD"]
    assert outcome(row) == NOT_HELD and "1 of 2 GPU counts" in row["verdict"]


# -------------------------------------------------------------- blog: limitation 3 (mild stalls)

def sweep_rows(best_mild: list[float], *, mild_slowdown: float = 0.05) -> list[dict]:
    """A 64-GPU sweep: a short stall (synchronous SGD slowed by ``mild_slowdown``) where the best
    HSGD speed-up per seed is ``best_mild``, and a 1 s stall (40 % slowdown) where HSGD wins."""
    rows = []
    for seed, best in enumerate(best_mild):
        for s, slow, top in ((0.005, mild_slowdown, best), (1.0, 0.4, 2.0)):
            sp = {"local:2": top - 0.2, "local:4": top - 0.1, "local:8": top,
                  "hsgd:2-8,4-32,8-64": top - 0.1, "hsgd:4-32,8-64": top}
            rows += [{**r, "seed": seed} for r in blog_rows(
                64, [sp], case=f"stall {s:g} s", stall_sweep_s=s, sync_slowdown=slow)]
    return rows


@pytest.mark.parametrize("best, expected", [
    ([0.95, 0.96, 0.95], HELD),  # below 1.1x on every seed
    ([1.50, 1.52, 1.49], NOT_HELD),
    ([0.95], INCONCLUSIVE),
    ([1.05, 1.20], INCONCLUSIVE),  # straddles 1.1x
])
def test_blog_mild_stragglers(best, expected):
    row = by_metric(claims(sweep_rows(best)))["slowdown threshold"]
    assert outcome(row) == expected, row["verdict"]
    assert row["unit"] == "%" and "[0.005, 1.0]" in row["note"]
    # the README shows what the verdict tested (the best HSGD speed-up), not the break-even
    assert row["tested"] == f"best HSGD {round(sum(best) / len(best), 2):.3g}x under 10 %"
    if max(best) < 1:  # crosses 1.0x between the 5 % and the 40 % slowdown
        assert 5 < row["value"] < 40 and "break-even (1.0x)" in row["verdict"]
    else:
        assert row["value"] is None and "no break-even" in row["verdict"]


def test_blog_mild_stragglers_not_measurable_without_a_mild_stall():
    row = by_metric(claims(sweep_rows([0.9, 0.9], mild_slowdown=0.2)))["slowdown threshold"]
    assert outcome(row) == NOT_MEASURABLE
    assert "no stall length below a 10 % slowdown" in row["verdict"]


def test_break_even_interpolates_on_a_log_axis():
    sweep = pd.DataFrame({"scheme": ["hsgd:a"] * 2, "stall_sweep_s": [0.01, 1.0],
                          "speedup": [0.5, 1.5], "slowdown": [0.01, 1.0]})
    assert hb.break_even_pct(sweep) == pytest.approx(10.0)  # midway between 1 % and 100 %
    assert math.isnan(hb.break_even_pct(sweep.assign(speedup=[1.2, 1.5])))


def test_blog_rows_join_the_blogs_reported_numbers():
    rows = []
    for seed in range(2):
        for w in (64, 128, 256):
            rows += [{**r, "seed": seed} for r in blog_rows(w, [speedups(w, 2.0, 2.5)])]
    rows += sweep_rows([0.9, 0.95])
    out = pd.DataFrame(claims(rows))
    rep = pd.read_csv(PAPERS / "cruise_meta_hsgd_blog" / "reported.csv", dtype={"setting": str})
    keys = ["artifact", "setting", "metric"]
    joined = out[keys].merge(rep[keys], on=keys, how="left", indicator=True)
    assert (joined["_merge"] == "both").all(), joined[joined["_merge"] != "both"]
    assert len(out) == 3 * 2 + 1 + 1


def test_limitation_lines_and_implied_steps():
    rows = blog_rows(256, [speedups(256, 0.98, 1.0)], case="one persistent straggler (rank 5)")
    lines = hb.limitation_lines(pd.DataFrame(rows), ["one persistent straggler (rank 5)"])
    assert lines == [("one persistent straggler (rank 5): HSGD speed-ups 0.98-1.00x (blog: "
                      "nearly no mitigation)")]
    summary = pd.DataFrame({"workers": [64, 64, 64], "scheme": ["sync", *hb.BLOG_HSGD[64]],
                            "speedup": [1.0, 2.0, 2.2], "step_ms": [800.0, 400.0, 360.0]})
    impl = hb.implied_sync_steps(summary).iloc[0]
    assert impl["sync ms/step implied by the blog"] == f"{2.08 * 400:.0f}-{2.45 * 360:.0f}"


# --------------------------------------------------------------------------------------- Table 2

def table02(model_minutes: list[float], hs=(8, 16, 32, 64, 128), fit_max_h: int = 32):
    hs = list(hs)
    paper = [9.2, 8.57, 8.32, 9.22, 9.23][:len(hs)]
    tab = pd.DataFrame({"H": hs, "minutes": paper, "model_minutes": model_minutes})
    tab["used"] = tab.H <= fit_max_h
    tab["residual_min"] = tab.model_minutes - tab.minutes
    tab["residual_pct"] = 100 * tab.residual_min / tab.minutes
    tab["loo_minutes"] = tab.model_minutes + 0.01
    return tab


def mc_table(per_scenario: dict[str, list[float]], hs=(8, 16, 32, 64, 128)) -> pd.DataFrame:
    return pd.concat([pd.DataFrame({"H": list(hs), "scenario": name, "minutes": m})
                      for name, m in per_scenario.items()], ignore_index=True)


def table02_verdict(tab, mc) -> dict:
    rows = lin2020.table02_claims(tab, mc, fit_max_h=32, log2h_s=0.00375, mode="quick")
    [row] = [r for r in rows if "verdict" in r]
    return row


def test_table02_rise_not_reproduced_by_decreasing_models():
    tab = table02([9.3, 8.5, 8.0, 7.9, 7.8])
    mc = mc_table({"no stragglers": [9.3, 8.5, 8.0, 7.9, 7.8],
                   "stalls": [9.6, 8.8, 8.3, 8.2, 8.15]})
    row = table02_verdict(tab, mc)
    assert outcome(row) == MODEL_DISAGREES, row["verdict"]
    assert row["setting"] == "8x2; H=32" and row["claim"] == lin2020.TABLE02_CLAIM
    assert "never make time rise with H" in row["verdict"] and "3.75 ms" in row["verdict"]


def test_table02_rise_reproduced_by_one_scenario():
    tab = table02([9.3, 8.5, 8.0, 7.9, 7.8])
    mc = mc_table({"no stragglers": [9.3, 8.5, 8.0, 7.9, 7.8],
                   "slow phases": [9.6, 8.8, 8.3, 8.5, 9.0]})  # rises by 0.7 min beyond H = 32
    row = table02_verdict(tab, mc)
    assert outcome(row) == HELD, row["verdict"]
    assert "make time rise with H in some scenario" in row["verdict"]


def test_table02_a_rise_below_the_tables_precision_is_no_rise():
    tab = table02([9.3, 8.5, 8.0, 8.005, 8.004])
    assert outcome(table02_verdict(tab, None)) == MODEL_DISAGREES


def test_table02_one_seed_is_decided_a_model_prediction_is_deterministic():
    # the Monte Carlo runs one seed, but a model prediction is judged by its value
    tab = table02([9.3, 8.5, 8.0, 8.4, 8.6])
    assert outcome(table02_verdict(tab, None)) == HELD


def test_table02_not_measurable_without_rows_beyond_h32():
    tab = table02([9.3, 8.5, 8.0], hs=(8, 16, 32))
    row = table02_verdict(tab, mc_table({"no stragglers": [9.3, 8.5, 8.0]}, hs=(8, 16, 32)))
    assert outcome(row) == NOT_MEASURABLE, row["verdict"]


def test_table02_rows_join_the_papers_table_and_carry_leave_one_out_values():
    fit = lin2020.table02_fit(32)
    tab, _, logfit = lin2020.table02_model_variants(fit)
    rows = lin2020.table02_claims(tab, None, fit_max_h=32, log2h_s=logfit["log2H_s"],
                                  mode="smoke")
    out = pd.DataFrame(rows)
    rep = pd.read_csv(PAPERS / "lin2020_local_sgd" / "reported.csv", dtype={"setting": str})
    keys = ["artifact", "setting", "metric"]
    joined = out[keys].merge(rep[keys], on=keys, how="left", indicator=True)
    assert (joined["_merge"] == "both").all() and len(out) == 11
    assert out.value.tolist() == [round(v, 3) for v in tab.loo_minutes]
    assert out["verdict"].notna().sum() == 1 and outcome(rows[5]) == MODEL_DISAGREES
    assert out.note.str.contains("leave-one-out").sum() == int(tab.used.sum())
    # the descriptive log-term fit reproduces the rise the cost model misses
    assert tab.log_term_minutes.iloc[-1] > tab.log_term_minutes[tab.H == 32].iloc[0]
