"""Recover kept runs (runs/) from a converged figure's CSV that holds every record of its runs.

Run once on 2026-11-28 (figures/converged/RUNS.md, "Runs recovered from figure CSVs"):

    .venv/bin/python figures/converged/provenance/recover_runs.py fig06_cifar10_local_sgd \
        fig09_hierarchical slowmo

For each configuration the notebook's converged parameter file builds
(`localsgd.paper.gpu_plan.paper_configs`), the figure CSV's rows of that run (matched on every
field of the run's results key) are written as a kept run: the records' own columns only, with
the measured ``compute_seconds`` put back where the notebook had pooled it. The CSV carries 10
significant digits (`results.FIGURE_FLOAT_FORMAT`), so these records are the trained ones
rounded there; the ``.json`` says so. A run the CSV does not hold whole is not written.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pandas as pd

from localsgd.paper import gpu_plan, results
from localsgd.paper.experiments import grid
from localsgd.results_key import NOT_IN_KEY, RESULTS_VERSION, UNUSED_WHEN
from localsgd.train_config import TrainConfig

HERE = Path(__file__).resolve().parents[1]  # figures/converged
# fields the loop resolves for the machine before it records them ('auto' -> what ran)
RESOLVED = ("batched", "packed", "precision", "memory_format")
# the columns `train` returns besides the config's fields
RECORD_COLUMNS = ("epoch", "step", "lr_last", "train_loss", "train_acc", "test_loss", "test_acc",
                  "compute_seconds", "data_seconds", "param_bytes", "train_images",
                  "test_images", "group_l0", "sync_l0", "gradsync_l0", "group_l1", "sync_l1",
                  "gradsync_l1", "gossip_rounds", "outer_steps", "wall_seconds")


def _matches(rows: pd.DataFrame, cfg: TrainConfig) -> pd.Series:
    keep = pd.Series(True, index=rows.index)
    for field in dataclasses.fields(TrainConfig):
        name = field.name
        if name in NOT_IN_KEY or name in RESOLVED or (
                name in UNUSED_WHEN and UNUSED_WHEN[name][0](cfg)):
            continue
        value = getattr(cfg, name)
        col = rows[name]
        if value is None:
            keep &= col.isna()
        elif isinstance(value, tuple):
            keep &= col.astype(str) == str(value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            keep &= (pd.to_numeric(col) - value).abs() < 1e-12  # ints read as floats by NaN
        else:
            keep &= col.astype(str) == str(value)
    return keep


def recover(nb_id: str) -> list[Path]:
    figure = pd.read_csv(HERE / f"{nb_id}.csv")
    side = json.loads((HERE / f"{nb_id}.json").read_text())
    folder = HERE / "runs"
    written = []
    for cfg in gpu_plan.paper_configs(HERE.parents[1] / "notebooks", [nb_id], "converged")[nb_id]:
        rows = figure[_matches(figure, cfg)]
        if rows["run"].nunique() != 1:
            print(f"{nb_id}: {len(rows)} rows ({rows['run'].nunique()} runs) match seed "
                  f"{cfg.seed}, H={cfg.local_steps}: skipped")
            continue
        # a figure may repeat a run's records per plotted variant (Figure 9: per added delay)
        rows = rows.drop_duplicates("step").sort_values("step")
        records = rows[[c for c in rows.columns if c in RECORD_COLUMNS
                        or c in {f.name for f in dataclasses.fields(TrainConfig)}]].copy()
        if "compute_seconds_measured" in rows:  # the notebook pooled compute: the run's own back
            records["compute_seconds"] = rows["compute_seconds_measured"]
        steps_per_epoch = records["step"].iloc[0] / records["epoch"].iloc[0]
        if abs(records["epoch"].iloc[-1] - cfg.epochs) > 1 / steps_per_epoch:
            print(f"{nb_id}: run of seed {cfg.seed} ends at epoch {records['epoch'].iloc[-1]}: "
                  "not whole, skipped")
            continue
        entry = folder / grid._entry(cfg).name
        if entry.exists():
            print(f"{entry.name} is kept already: left as it is")
            continue
        results.write_csv(records, entry, results.FIGURE_FLOAT_FORMAT)
        results.write_json({
            "name": "train", "params": cfg.to_dict(), "results_version": RESULTS_VERSION,
            "library_hash": side.get("library_hash"), "git": side["git"],
            "recovered_from": f"figures/converged/{nb_id}.csv (10 significant digits; "
                              "figures/converged/provenance/recover_runs.py)"},
            entry.with_suffix(".json"))
        written.append(entry)
    print(f"{nb_id}: {len(written)} runs recovered")
    return written


if __name__ == "__main__":
    for name in sys.argv[1:]:
        recover(name)
