"""Tables 6 and 7 (App. D, F.3): momentum schemes at H = 1 (Table 6) and H = 8 (Table 7) — App.
D's local, global (block) and hybrid momentum as configs (`momentum_config`), the grid
(`table06_07_configs`; from the notebook's parameters: `configs`), the paper's cells
(`table06_07_reported`) and App. D.1.4's claims (`table06_07_claims`), each through per-seed
differences of final test top-1 (paired by seed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from localsgd.paper.experiments import claims
from localsgd.paper.experiments.grid import base_config
from localsgd.paper.experiments.lin2020.common import (
    acc_by_seed,
    gaps_by_seed,
    part_text,
    reported_cells,
    with_claim,
)
from localsgd.train import TrainConfig

__all__ = ["TABLE06_CLAIM", "base", "configs", "momentum_config", "table06_07_claims",
           "table06_07_configs", "table06_07_reported"]


TABLE06_CLAIM = ("local momentum beats none; some global momentum (<= 0.5) may help a little; "
                 "global momentum >= 0.7 diverges (App. D)")


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
    mean final test top-1 over seeds, and App. D.1.4's claims on Table 6 (H = 1).

    ``final`` holds each run's last record (columns table, H, local_momentum,
    global_momentum, seed, test_acc). Three parts, each from per-seed differences and decided by
    the seed-spread rule, joined by `claims.combine` (a part whose cells the grid lacks is
    left out):

    1. local momentum 0.9 minus no momentum >= 0 points;
    2. "some global momentum may help a little": the best global momentum in (0, 0.5] (best by
       its mean over seeds) minus none (both with local 0.9) >= -1 point, i.e. it must not hurt;
    3. "large global momentum diverges": every global momentum >= 0.7 minus none <= -10 points
       (one part per momentum, each of them must drop).

    The claim sits on the row "local momentum=0.9; global momentum=0.0; H=1" (no claim without
    that run). Table 7 (H = 8) gets compare rows only: the paper draws no claim from it.
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

    def gaps(glob: float) -> list[float]:  # local 0.9 with global momentum ``glob`` minus none
        return gaps_by_seed(t6, cell(0.9, glob), cell(0.9, 0.0))

    verdicts, texts = [], []
    if (0.0, 0.0) in cells:
        v = claims.verdict(gaps_by_seed(t6, cell(0.9, 0.0), cell(0.0, 0.0)), 0.0,
                           what="local 0.9 minus none", unit=" points")
        verdicts.append(v)
        texts.append(part_text("local 0.9 minus none >= 0", v.outcome, v))
    small = sorted(g for loc, g in cells if loc == 0.9 and 0 < g <= 0.5)
    if small:
        means = {g: acc_by_seed(t6, cell(0.9, g)).mean() for g in small}
        best = max(small, key=lambda g: means[g] if np.isfinite(means[g]) else -np.inf)
        v = claims.verdict(gaps(best), -1.0, what=f"global {best:g} minus none",
                           unit=" points")
        verdicts.append(v)
        texts.append(part_text(f"best global <= 0.5 ({best:g}) minus none >= -1", v.outcome, v))
    large = sorted(g for loc, g in cells if loc == 0.9 and g >= 0.7)
    if large:
        drops = [claims.verdict(gaps(g), -10.0, higher_is_better=False,
                                what=f"global {g:g} minus none", unit=" points")
                 for g in large]
        verdicts += drops
        texts += [part_text(f"global {g:g} minus none <= -10", v.outcome, v)
                  for g, v in zip(large, drops, strict=True)]
    if verdicts:
        verdict = f"{claims.combine(verdicts)}: at H = 1, " + "; ".join(texts)
    else:
        verdict = (f"{claims.NOT_MEASURABLE}: Table 6's grid has none of the cells the claim "
                   "compares with local 0.9, global 0.0")
    return with_claim(rows, "Table 6", "local momentum=0.9; global momentum=0.0; H=1",
                      TABLE06_CLAIM, verdict)
