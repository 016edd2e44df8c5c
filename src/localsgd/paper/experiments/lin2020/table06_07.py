"""Tables 6 and 7 (App. D, F.3): momentum schemes at H = 1 (Table 6) and H = 8 (Table 7) — App.
D's local, global (block) and hybrid momentum as configs (`momentum_config`), the grid
(`table06_07_configs`; from the notebook's parameters: `configs`), the paper's cells
(`table06_07_reported`) and App. D.1.4's claims (`table06_07_claims`), each through per-seed
differences of final test top-1 (paired by seed).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from localsgd.paper.experiments import claims
from localsgd.paper.experiments.grid import base_config
from localsgd.paper.experiments.lin2020.common import (
    gaps_by_seed,
    part_text,
    reported_cells,
    rows_where,
    with_claim,
)
from localsgd.training.config import TrainConfig

__all__ = ["TABLE06_CLAIMS", "base", "claim_differences", "configs", "momentum_config",
           "table06_07_claims", "table06_07_configs", "table06_07_reported"]


# App. D.1.4's three statements on Table 6 (H = 1), each judged on its own row
TABLE06_CLAIMS = {
    "local": "local momentum (0.9) beats no momentum at all",
    "small": "some global momentum (<= 0.5) on top of local momentum slightly improves the test "
             "accuracy",
    "large": "large global momentum (>= 0.7) on top of local momentum fails to train",
}


def momentum_config(base: TrainConfig, local: float, global_: float) -> TrainConfig:
    """App. D's momentum schemes as a config: local momentum ``local`` inside each worker's SGD,
    global (block) momentum ``global_`` on the averaged model's delta; both → hybrid (D.1.3)."""
    if local < 0 or global_ < 0:
        raise ValueError(f"momenta must be >= 0, got local={local}, global={global_}")
    scheme = {(False, False): "none", (True, False): "local", (False, True): "global",
              (True, True): "hybrid"}[(local > 0, global_ > 0)]
    return dataclasses.replace(base, momentum_scheme=scheme, momentum=local,
                               global_momentum=global_)


def table06_07_configs(base: TrainConfig, table6_momenta: Sequence[Sequence[float]],
                       table7_momenta: Sequence[Sequence[float]],
                       seeds: Sequence[int]) -> tuple[list[TrainConfig], list[dict]]:
    """Tables 6 (H = 1) and 7 (H = 8) of App. F.3: one run per (local, global) momentum pair and
    seed (`momentum_config`), labelled with the table, H and both momenta."""
    configs, labels = [], []
    for table, h, grid in (("Table 6", 1, table6_momenta), ("Table 7", 8, table7_momenta)):
        for local, glob in grid:
            for s in seeds:
                base_h = dataclasses.replace(base, local_steps=h, seed=s)
                configs.append(momentum_config(base_h, local, glob))
                labels.append({"table": table, "H": h, "local_momentum": local,
                               "global_momentum": glob})
    return configs, labels




def base(P) -> TrainConfig:
    """Tables 6-7's base run: the notebook's parameters as a `TrainConfig` (`grid.base_config`)
    with the lr scaled, lr = 0.1 · K · B_loc / base_batch (App. C)."""
    return base_config(P, scale_lr=True)


def configs(P, seeds: Sequence[int]) -> tuple[list[TrainConfig], list[dict]]:
    """Tables 6-7's grid from the notebook's parameters ``P``: `table06_07_configs` over `base`
    with ``P.table6_momenta`` and ``P.table7_momenta``; (configs, labels)."""
    return table06_07_configs(base(P), P.table6_momenta, P.table7_momenta, seeds)


def table06_07_reported(papers_dir: str | Path | None = None) -> pd.DataFrame:
    """Tables 6 and 7's cells (App. F.3) with columns table, local_momentum, global_momentum,
    test_acc."""
    paper = reported_cells(["Table 6", "Table 7"], papers_dir)
    parts = paper.setting.str.split("; ", expand=True)
    return paper.assign(
        table=paper.artifact,
        local_momentum=parts[0].str.removeprefix("local momentum=").astype(float),
        global_momentum=parts[1].str.removeprefix("global momentum=").astype(float))


def _momentum_label(v: float) -> str:
    """A momentum as the paper prints it: 0.0, 0.9, 0.95."""
    return f"{v:.1f}" if round(v, 1) == v else f"{v:g}"


def table06_07_claims(final: pd.DataFrame, *, mode: str, width: float, n_train: int | None,
                      epochs: float) -> list[dict]:
    """Tables 6 and 7 (App. F.3): one compare row per (table, local, global momentum) with the
    mean final test top-1 over seeds, and App. D.1.4's three claims on Table 6 (H = 1), each on
    its own row (`TABLE06_CLAIMS`), from per-seed differences (`claims.verdict` after
    `claims.regime`; a claim whose cells the grid lacks is left out):

    1. "local": local momentum 0.9 (global 0) minus no momentum at all (local 0, global 0)
       >= 0 points, on the row of local 0.9, global 0;
    2. "small": App. D.1.4's "some factors of global momentum could further slightly improve",
       its sign kept: each global momentum in (0, 0.5] on top of local 0.9 minus local 0.9
       alone >= 0 points, on the row of the largest such momentum; held when some factor's gain
       holds, did not hold when every factor's loss is decided (`claims.combine_some`; the best
       of several is not corrected for the selection);
    3. "large": each global momentum >= 0.7 on top of local 0.9 minus local 0.9 alone
       <= -10 points (App. D: such runs stay near chance, 10 %), on the row of the largest.

    Table 7 (H = 8) gets compare rows only: the paper draws no claim from it.
    """

    table = final.groupby(["table", "H", "local_momentum", "global_momentum"])["test_acc"].agg(
        ["mean", "std", "count"]).reset_index()
    rows = [claims.claim_row(
        r["table"], f"local momentum={_momentum_label(r['local_momentum'])}; global momentum="
                    f"{_momentum_label(r['global_momentum'])}; H={r['H']}", "test top-1",
        r["mean"], unit="%",
        note=f"{mode}: std={r['std']:.2f} over {r['count']} seed(s); width {width}, "
             f"{n_train or 50000} images, {epochs:g} epochs")
        for r in table.to_dict("records")]
    t6 = final[final.table == "Table 6"]
    cells = set(zip(t6.local_momentum, t6.global_momentum, strict=True))
    if (0.9, 0.0) not in cells:
        return rows

    def cell(local: float, glob: float) -> dict:
        return {"local_momentum": local, "global_momentum": glob}

    def name(local: float, glob: float) -> str:
        return ("no momentum" if local == glob == 0 else f"local {local:g} alone" if glob == 0
                else f"local {local:g} + global {glob:g}")

    def mean_gap(a: tuple, b: tuple) -> float:  # the tested quantity, judged or not
        gaps = gaps_by_seed(t6, cell(*a), cell(*b))
        return float(np.mean(gaps)) if gaps else math.nan

    def judge(a: tuple, b: tuple, threshold: float, origin: str, *, reference_only: bool = False,
              **kw):
        sides = {name(*b): rows_where(t6, cell(*b))}
        if not reference_only:
            sides[name(*a)] = rows_where(t6, cell(*a))
        return claims.regime(sides) or claims.verdict(
            gaps_by_seed(t6, cell(*a), cell(*b)), threshold, what=f"{name(*a)} minus "
            f"{name(*b)}", unit=" points", origin=origin, **kw)

    def row(glob: float) -> str:
        return f"local momentum=0.9; global momentum={_momentum_label(glob)}; H=1"

    if (0.0, 0.0) in cells:
        v = judge((0.9, 0.0), (0.0, 0.0), 0.0,
                  claims.paper("App. D.1.4: local momentum improves on none, any gain"))
        rows = with_claim(rows, "Table 6", row(0.0), TABLE06_CLAIMS["local"], str(v),
                          tested=claims.tested_text([mean_gap((0.9, 0.0), (0.0, 0.0))],
                                                    " points"))
    small = sorted(g for loc, g in cells if loc == 0.9 and 0 < g <= 0.5)
    if small:
        origin = claims.paper("App. D.1.4: some factors 'could further slightly improve' the "
                              "test accuracy, any gain; the sign kept, no tolerance")
        parts = [judge((0.9, g), (0.9, 0.0), 0.0, origin) for g in small]
        text = (f"{claims.combine_some(parts)}: " + "; ".join(
            part_text(f"global {g:g}", v.outcome, v) for g, v in zip(small, parts, strict=True))
            + f" (some factor minus local 0.9 alone >= 0 points; {origin}"
            + (f"; the best of {len(small)} not corrected for the selection)" if len(small) > 1
               else ")"))
        rows = with_claim(rows, "Table 6", row(small[-1]), TABLE06_CLAIMS["small"], text,
                          tested=claims.tested_text(
                              [mean_gap((0.9, g), (0.9, 0.0)) for g in small], " points"))
    large = sorted(g for loc, g in cells if loc == 0.9 and g >= 0.7)
    if large:
        # the claim is that these runs fail to train: only the reference (local 0.9 alone) must
        # be in the regime, neither converged nor a fit is asked of the failing run
        origin = claims.paper("App. D.1.4: large global momentum does not converge (the "
                              "printed runs end near 10 %), read as a drop of 10 points or more")
        parts = [judge((0.9, g), (0.9, 0.0), -10.0, origin, higher_is_better=False,
                       reference_only=True)
                 for g in large]
        text = (f"{claims.combine(parts)}: " + "; ".join(
            part_text(f"global {g:g}", v.outcome, v) for g, v in zip(large, parts, strict=True))
            + f" (each minus local 0.9 alone <= -10 points; {origin})")
        rows = with_claim(rows, "Table 6", row(large[-1]), TABLE06_CLAIMS["large"], text,
                          tested=claims.tested_text(
                              [mean_gap((0.9, g), (0.9, 0.0)) for g in large], " points"))
    return rows


def claim_differences(final: pd.DataFrame, paper: pd.DataFrame) -> list[tuple]:
    """What `table06_07_claims` judges on Table 6, for `localsgd.paper.notebook.
    paired_differences`: per compared pair (label, our per-seed differences in test top-1, the
    paper's difference or None): local 0.9 minus no momentum, then each global momentum on top
    of local 0.9 minus local 0.9 alone, for the cells our grid ran."""
    ours, ref = final[final.table == "Table 6"], paper[paper.table == "Table 6"]
    ran = set(zip(ours.local_momentum, ours.global_momentum, strict=True))

    def cell(local: float, glob: float) -> dict:
        return {"local_momentum": local, "global_momentum": glob}

    def paper_gap(a: tuple, b: tuple) -> float | None:
        x, y = rows_where(ref, cell(*a)).test_acc, rows_where(ref, cell(*b)).test_acc
        return float(x.iloc[0] - y.iloc[0]) if len(x) and len(y) else None

    pairs = [("local 0.9\n− none", (0.9, 0.0), (0.0, 0.0))] if (0.0, 0.0) in ran else []
    pairs += [(f"+ global {g:g}\n− local 0.9", (0.9, g), (0.9, 0.0))
              for g in sorted(g for loc, g in ran if loc == 0.9 and g > 0)]
    return [(label, gaps_by_seed(ours, cell(*a), cell(*b)), paper_gap(a, b))
            for label, a, b in pairs if (0.9, 0.0) in ran]
