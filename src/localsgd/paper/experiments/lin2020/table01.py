"""Table 1 (§4.2.1, App. C): local SGD against mini-batch SGD over B_glob, without and with the
large-batch tricks — its grid (`table01_configs`; from the notebook's parameters: `configs`), the
paper's cells (`table01_reported`) and the claim (`table01_claims`), which compares the two
methods through per-seed differences of final test top-1 (paired by seed).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from localsgd.paper.experiments import claims
from localsgd.paper.experiments.grid import base_config, scaled_batch
from localsgd.paper.experiments.lin2020.common import (
    gaps_by_seed,
    part_text,
    reported_cells,
    rows_where,
    with_claim,
)
from localsgd.training.config import TrainConfig

__all__ = ["TABLE01_CLAIM", "base", "configs", "table01_claims", "table01_configs",
           "table01_reported"]


TABLE01_CLAIM = "at large B_glob local SGD generalises better than mini-batch SGD"


def table01_configs(base: TrainConfig, b_globs: Sequence[int], seeds: Sequence[int], *,
                    warmup_epochs: float, batch_scale: float = 1.0
                    ) -> tuple[list[TrainConfig], list[dict]]:
    """Table 1's grid: local SGD (B_loc fixed, H = B_glob / B_loc) vs mini-batch SGD
    (H = 1, B_loc = B_glob), each without and with the large-batch tricks (App. C: lr scaled by
    K·B_loc / base_batch, gradual warm-up over ``warmup_epochs``), K = ``base.world_size``.

    B_glob counts the samples one worker accesses per synchronisation. Identical configurations
    (B_glob = B_loc, where local SGD *is* mini-batch SGD) are trained once through the cache.
    ``batch_scale`` (long mode: the subset's fraction of CIFAR-10): each run's B_glob is the
    label's times it (``base.local_batch`` is scaled already, `grid.base_config`), so H and the
    update counts are the label's; the labels keep the paper's B_glob.
    """
    configs, labels = [], []
    for tricks in (False, True):
        for method in ("local SGD", "mini-batch SGD"):
            for b_glob in b_globs:
                run_b = scaled_batch(b_glob, batch_scale)
                if method == "local SGD":
                    if run_b % base.local_batch:
                        raise ValueError(f"B_glob={run_b} is not a multiple of B_loc="
                                         f"{base.local_batch}")
                    shape = {"local_batch": base.local_batch,
                             "local_steps": run_b // base.local_batch}
                else:
                    shape = {"local_batch": run_b, "local_steps": 1}
                trick = ({"scale_lr": True, "base_batch": base.local_batch,
                          "warmup_epochs": warmup_epochs} if tricks else
                         {"scale_lr": False, "warmup_epochs": 0.0})
                for seed in seeds:
                    configs.append(dataclasses.replace(base, seed=seed, **shape, **trick))
                    labels.append({"method": method, "tricks": "w/ tricks" if tricks
                                   else "w/o tricks", "B_glob": b_glob})
    return configs, labels




def base(P) -> TrainConfig:
    """Table 1's base run: the notebook's parameters as a `TrainConfig` (`grid.base_config`);
    `table01_configs` sets the lr scaling and warm-up per column."""
    return base_config(P)


def configs(P, seeds: Sequence[int]) -> tuple[list[TrainConfig], list[dict]]:
    """Table 1's grid from the notebook's parameters ``P``: `table01_configs` over `base` with
    ``P.B_globs`` and ``P.warmup_epochs``; (configs, labels)."""
    return table01_configs(base(P), P.B_globs, seeds, warmup_epochs=P.warmup_epochs,
                           batch_scale=getattr(P, "batch_scale", 1.0))


def table01_reported(papers_dir: str | Path | None = None) -> pd.DataFrame:
    """Table 1's 24 cells (§4.2.1) with columns method, tricks, B_glob, test_acc."""
    paper = reported_cells(["Table 1"], papers_dir)
    parts = paper.setting.str.split("; ", expand=True)
    return paper.assign(method=parts[0], tricks=parts[1],
                        B_glob=parts[2].str.removeprefix("B_glob=").astype(int))


def table01_claims(final: pd.DataFrame, *, mode: str, B_loc: int, width: float,
                   n_train: int | None, epochs: float, batch_scale: float = 1.0,
                   resolution: int | None = None) -> list[dict]:
    """Table 1 (§4.2.1, App. C): one compare row per (tricks, method, B_glob) with the mean
    final test top-1 over seeds, and the claim that at large B_glob local SGD generalises
    better than mini-batch SGD.

    ``final`` holds each run's last record (columns tricks, method, B_glob, seed, test_acc).
    At the largest B_glob, local minus mini-batch test top-1, paired by seed, must be >= 0 points
    (its one-sided 95 % t bound above 0) both without and with the large-batch tricks (the tricks do
    not rescue mini-batch SGD); each part is decided by `claims.verdict` after `claims.regime` (both
    methods converged, neither underfit against the other: otherwise the gap is what each fits in
    the epoch budget, not generalisation) and the two by `claims.combine`. The claim sits on the row
    "local SGD; w/o tricks; B_glob=<largest>", with the paper's two gaps at that B_glob
    (``source_value``) for the claims table to put beside ours. ``batch_scale`` and
    ``resolution`` (long mode) go into each row's note: B_loc and B_glob are the paper's labels,
    each run's batches those times ``batch_scale``.
    """
    scaled = (f"; every batch x {batch_scale:g}" if batch_scale != 1 else "") + (
        f"; {resolution}x{resolution} images" if resolution else "")

    table = final.groupby(["tricks", "method", "B_glob"])["test_acc"].agg(
        ["mean", "std", "count"]).reset_index()
    rows = [claims.claim_row(
        "Table 1", f"{r['method']}; {r['tricks']}; B_glob={r['B_glob']}", "test top-1",
        r["mean"], unit="%",
        note=f"{mode}: std={r['std']:.2f} over {r['count']} seed(s); local SGD B_loc={B_loc}, "
             f"H=B_glob/B_loc; width {width}, {n_train or 50000} images, {epochs:g} epochs"
             f"{scaled}")
        for r in table.to_dict("records")]
    if final.empty:
        return rows
    big = int(final.B_glob.max())
    parts, means = {}, []
    origin = claims.paper("§4.2.1: local SGD generalises better, any positive gap")
    for tricks in ("w/o tricks", "w/ tricks"):
        cell = {"B_glob": big, "tricks": tricks}
        local, mini = {**cell, "method": "local SGD"}, {**cell, "method": "mini-batch SGD"}
        gaps = gaps_by_seed(final, local, mini)
        means.append(float(np.mean(gaps)) if len(gaps) else math.nan)
        parts[tricks] = claims.regime({
            f"local SGD (B_loc {B_loc}, H = {big // B_loc})": rows_where(final, local),
            f"mini-batch SGD (B_loc {big})": rows_where(final, mini)}) or claims.verdict(
            gaps, 0.0, what="local minus mini-batch test top-1", unit=" points", origin=origin)
    outcome = claims.combine(list(parts.values()))
    paper = table01_reported().set_index(["method", "tricks", "B_glob"]).test_acc
    source = [paper.get(("local SGD", t, big), math.nan) - paper.get(("mini-batch SGD", t, big),
                                                                      math.nan)
              for t in ("w/o tricks", "w/ tricks")]
    verdict = (f"{outcome}: at B_glob = {big}, local minus mini-batch test top-1 (paired by "
               f"seed) >= 0 points ({origin}); "
               + "; ".join(part_text(t, v.outcome, v) for t, v in parts.items()))
    # the paper's gap at the B_glob we tested beside ours (its ledger value is at 4096)
    beside = (f"{claims.tested_text(source, ' points')} at B_glob = {big}"
              if all(math.isfinite(s) for s in source) else "")
    return with_claim(rows, "Table 1", f"local SGD; w/o tricks; B_glob={big}", TABLE01_CLAIM,
                      verdict, tested=claims.tested_text(means, " points"),
                      source_value=beside)
