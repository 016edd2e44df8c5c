"""Table 5 (App. F.2.1): mini-batch SGD (H = 1) against local SGD (H = 8) for ResNet-20,
DenseNet-40-12 and WideResNet-28-10 on CIFAR-10 and CIFAR-100 — which data sets are on this
machine (`table05_status`), its grid (`table05_configs`; from the notebook's parameters:
`configs`), its tables and the claim (`table05_claims`), which compares H = 8 with H = 1 through
per-seed differences of final test top-1 (paired by seed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from localsgd.paper.experiments import claims
from localsgd.paper.experiments.grid import base_config, dataset_available, final_table
from localsgd.paper.experiments.lin2020.common import (
    gaps_by_seed,
    part_text,
    reported_cells,
    rows_where,
    with_claim,
)
from localsgd.training.config import TrainConfig

__all__ = [
    "TABLE05_BY",
    "TABLE05_CLAIM",
    "TABLE05_DATASETS",
    "TABLE05_MODELS",
    "configs",
    "table05_claims",
    "table05_configs",
    "table05_data",
    "table05_final",
    "table05_status",
]


TABLE05_CLAIM = ("local SGD (H = 8) matches mini-batch SGD (H = 1) in test accuracy on every "
                 "model")

# Table 5's labels for our model and data set names (its settings join on them)
TABLE05_MODELS = {"resnet20": "ResNet-20", "densenet40_12": "DenseNet-40-12",
                  "wrn28_10": "WideResNet-28-10"}
TABLE05_DATASETS = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100"}


def table05_status(datasets: Sequence[str], *, download: bool = False) -> dict[str, str]:
    """Per data set of Table 5 (App. F.2.1): "available" or "data unavailable", printed with the
    loader's reason; a missing CIFAR-100 is reported, never replaced by another data set."""

    status = {}
    for name in datasets:
        ok, where = dataset_available(name, download=download)
        status[name] = "available" if ok else "data unavailable"
        print(f"{name}: {status[name]}" + ("" if ok else f" -- {where.splitlines()[0]}"))
    return status


def table05_configs(base: TrainConfig, status: dict[str, str], models: Sequence[str],
                    widths: Sequence[float], hs: Sequence[int], seeds: Sequence[int], *,
                    tricks: bool, warmup_epochs: float) -> tuple[list[TrainConfig], list[dict]]:
    """Table 5's grid (App. F.2.1): every available data set × model (at its width) × H × seed,
    with App. C's tricks (lr scaled by K, warm-up over ``warmup_epochs``) when ``tricks``."""
    if len(widths) != len(models):
        raise ValueError(f"widths {list(widths)} must give one width per model {list(models)}")
    trick = {"scale_lr": tricks, "warmup_epochs": warmup_epochs if tricks else 0.0}
    configs, labels = [], []
    for name in [d for d, s in status.items() if s == "available"]:
        for model, width in zip(models, widths, strict=True):
            for h in hs:
                for s in seeds:
                    configs.append(dataclasses.replace(base, dataset=name, model=model,
                                                       width=width, local_steps=h, seed=s,
                                                       **trick))
                    labels.append({"model_name": model})
    return configs, labels




def configs(P, seeds: Sequence[int], status: dict[str, str] | None = None
            ) -> tuple[list[TrainConfig], list[dict]]:
    """Table 5's grid from the notebook's parameters ``P``: `table05_configs` over the notebook's
    base run (`grid.base_config`); (configs, labels). ``status`` (`table05_status`) leaves out
    the data sets that are not on this machine; None counts every data set of ``P.datasets`` as
    available (the GPU plan's assumption)."""
    if status is None:
        status = dict.fromkeys(P.datasets, "available")
    return table05_configs(base_config(P), status, P.models, P.widths, P.Hs, seeds,
                           tricks=P.tricks, warmup_epochs=P.warmup_epochs)


TABLE05_BY = ["dataset", "model_name", "width", "local_steps"]


def table05_final(runs: pd.DataFrame | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(each run's last record, mean/std/count of test top-1 per data set, model, width and H);
    both empty, with their columns, when no data set was available (``runs`` is None)."""

    if runs is None or runs.empty:
        final = pd.DataFrame(columns=[*TABLE05_BY, "seed", "test_acc"])
        return final, pd.DataFrame(columns=[*TABLE05_BY, "mean", "std", "count"])
    return final_table(runs, TABLE05_BY)


def table05_data(final: pd.DataFrame, status: dict[str, str]) -> pd.DataFrame:
    """The figure's data: each run's last record (status "ok") plus one row per data set that
    is not on this machine (status "data unavailable")."""
    missing = [{"dataset": d, "status": s} for d, s in status.items() if s != "available"]
    return pd.concat([final.assign(status="ok"), pd.DataFrame(missing)], ignore_index=True)


def source_cells(papers_dir: str | Path | None = None) -> pd.DataFrame:
    """Table 5's test top-1 cells as the source prints them (300 epochs, full-width models), in
    the notebook's columns: dataset, model_name, local_steps, test_acc."""
    cells = reported_cells(["Table 5"], papers_dir)
    cells = cells[cells.metric == "test top-1"]
    parts = cells.setting.str.extract(r"model=(?P<model>[^;]+); dataset=(?P<data>[^;]+); "
                                      r"K=\d+; H=(?P<H>\d+)$")
    names = {v: k for k, v in TABLE05_MODELS.items()}
    sets = {v: k for k, v in TABLE05_DATASETS.items()}
    return pd.DataFrame({"dataset": parts.data.map(sets), "model_name": parts.model.map(names),
                         "local_steps": parts.H.astype(int),
                         "test_acc": cells.test_acc}).reset_index(drop=True)


# "on par" in numbers: our tolerance
TABLE05_ORIGIN = ("our tolerance: the paper says H = 8 performs on par with H = 1 and prints "
                  "differences under 1 point (Table 5), so 1 point stands for 'on par'")


def table05_claims(final: pd.DataFrame, *, status: dict[str, str], models: Sequence[str],
                   K: int, hs: Sequence[int], mode: str, n_train: int | None, epochs: float,
                   tolerance: float = 1.0) -> list[dict]:
    """Table 5 (App. F.2.1): one compare row per (data set, model, H) with the mean final test
    top-1 over seeds, and the claim that local SGD (H = 8) matches mini-batch SGD (H = 1).

    ``final`` holds each run's last record (columns dataset, model_name, width, local_steps,
    seed, test_acc); ``status`` says per data set whether it is on this machine. "Matches" is
    |H=8 minus H=1| <= ``tolerance`` (1 point) for every model, from the per-seed differences.
    Each one-sided rule decides one edge, so the band is two claims on the same differences,
    gap >= -1 and gap <= +1 (`claims.verdict` each, two one-sided tests), joined by
    `claims.combine`: held only when both 95 % bounds lie inside the band; did not hold when
    one lies beyond an edge; otherwise inconclusive. Before them `claims.regime`: both H
    converged, neither underfit against the other. A data set that is not on this machine is a "data
    unavailable" part, so the claim cannot be held while its cells are untested. Needs H = 1 and 8
    in ``hs``; each model and data set with both gets a row of the tested quantity, the mean
    paired change "H=8 vs H=1" (the source's beside it: reported.csv derives it from Table 5's
    two cells), and the claim sits on the first (ResNet-20 on CIFAR-10 in every mode).
    """

    table = final.groupby(TABLE05_BY)["test_acc"].agg(["mean", "std", "count"]).reset_index()

    def setting(dataset: str, model: str, h: int | str) -> str:
        return (f"model={TABLE05_MODELS[model]}; dataset={TABLE05_DATASETS[dataset]}; K={K}; "
                f"H={h}")

    rows = [claims.claim_row(
        "Table 5", setting(r["dataset"], r["model_name"], r["local_steps"]), "test top-1",
        r["mean"], unit="%",
        note=f"{mode}: width {r['width']}, std={r['std']:.2f} over {r['count']} seed(s), "
             f"{n_train or 50000} images, {epochs:g} epochs")
        for r in table.to_dict("records")]
    if not (1 in hs and 8 in hs):
        return rows
    verdicts, texts, anchors, judged = [], [], [], []
    for dataset, state in status.items():
        if state != "available":
            v = claims.verdict([], 0.0, data_available=False, origin=TABLE05_ORIGIN)
            verdicts.append(v)
            texts.append(part_text(TABLE05_DATASETS[dataset], v.outcome, v))
            continue
        for model in models:
            cell = {"dataset": dataset, "model_name": model}
            gaps = gaps_by_seed(final, {**cell, "local_steps": 8}, {**cell, "local_steps": 1})
            if gaps:  # the tested quantity, beside the source's (papers/.../reported.csv)
                width = final.loc[(final.dataset == dataset) & (final.model_name == model),
                                  "width"].iloc[0]
                rows.append(claims.claim_row(
                    "Table 5", setting(dataset, model, "8 vs H=1"), "test top-1 change",
                    float(np.mean(gaps)), unit="points",
                    note=f"{mode}: width {width}, paired by seed, sd="
                         f"{np.std(gaps, ddof=1) if len(gaps) > 1 else 0.0:.2f} over "
                         f"{len(gaps)} seed(s), {n_train or 50000} images, {epochs:g} epochs"))
            what = "H=8 minus H=1"
            regime = claims.regime({
                f"{TABLE05_MODELS[model]} H = {h}": rows_where(final, {**cell, "local_steps": h})
                for h in (8, 1)})
            band = [regime] if regime else [
                claims.verdict(gaps, -tolerance, what=what, unit=" points",
                               origin=TABLE05_ORIGIN),
                claims.verdict(gaps, tolerance, higher_is_better=False, what=what,
                               unit=" points", origin=TABLE05_ORIGIN)]
            verdicts += band
            judged.append(rows_where(final, {**cell, "local_steps": 8}))
            judged.append(rows_where(final, {**cell, "local_steps": 1}))
            undecided = [v for v in band if v.outcome not in (claims.HELD, claims.NOT_HELD)]
            texts.append(part_text(f"{TABLE05_MODELS[model]}/{TABLE05_DATASETS[dataset]}",
                                   claims.combine(band), (undecided or band)[0]))
            anchors.append(setting(dataset, model, "8 vs H=1"))
    have = {r["setting"] for r in rows}
    anchor = next((a for a in anchors if a in have),
                  setting(next(iter(status)), models[0], "8 vs H=1"))
    absent = [TABLE05_MODELS[m] for m in TABLE05_MODELS if m not in models]
    scope = (f"; judged on {', '.join(TABLE05_MODELS[m] for m in models)} only: "
             f"{', '.join(absent)} not run in this mode" if absent else "")
    verdict = (f"{claims.combine(verdicts)}: |H=8 minus H=1| <= {tolerance:g} point per model, "
               f"paired by seed ({TABLE05_ORIGIN}); " + "; ".join(texts) + scope)
    return with_claim(rows, "Table 5", anchor, TABLE05_CLAIM, verdict,
                      metric="test top-1 change", unit="points",
                      runs=claims.runs_digest(*judged))
