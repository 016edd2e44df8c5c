"""What several of Lin et al. (2020)'s artifacts share: a claim that compares two settings is
judged on per-seed differences (or ratios) paired by seed (`seed_values`, `paired_by_seed`,
`acc_by_seed`, `gaps_by_seed`), a multi-part verdict names each part (`part_text`) and sits on one
compare row (`with_claim`); the run note of the CIFAR figures (`cifar_run_note`); the paper's
printed cells (`reported_cells`); time-to-accuracy speed-ups (`scaling_table`: Figures 7 and 9);
the step costs behind two running times (`step_costs_from_running_times`; Table 5's are
`table5_step_costs`, used by Figures 6 and 7 and Table 2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from localsgd.paper.experiments import claims
from localsgd.paper.experiments.grid import time_to_accuracy
from localsgd.paper.results import repo_root

__all__ = [
    "acc_by_seed",
    "cifar_run_note",
    "gaps_by_seed",
    "or_unmeasured",
    "paired_by_seed",
    "part_text",
    "reported_cells",
    "rows_where",
    "scaling_table",
    "seed_values",
    "step_costs_from_running_times",
    "table5_step_costs",
    "with_claim",
]


def scaling_table(records: pd.DataFrame, *, target: float, baseline: dict,
                  time_col: str = "time_s", acc_col: str = "test_acc",
                  keys: Sequence[str] = ("world_size", "local_steps")) -> pd.DataFrame:
    """Time (and updates) to ``target`` accuracy per run and its speed-up over the ``baseline`` run
    of the same seed (Figure 7: speed-up over the 1×2-GPU mini-batch run), with the final
    accuracy."""
    rows = []
    for (seed, *key), run in records.groupby(["seed", *keys]):
        run = run.sort_values("step")
        rows.append({"seed": seed, **dict(zip(keys, key, strict=True)),
                     "time_to_target": time_to_accuracy(run[time_col], run[acc_col], target),
                     "steps_to_target": time_to_accuracy(run["step"], run[acc_col], target),
                     "final_test_acc": float(run[acc_col].iloc[-1]),
                     "best_test_acc": float(run[acc_col].max()), "target_acc": target})
    out = pd.DataFrame(rows)
    base = out
    for k, v in baseline.items():
        base = base[base[k] == v]
    if base.empty:
        raise ValueError(f"no run matches the baseline {baseline}")
    ref = base.set_index("seed").time_to_target
    out["speedup"] = out.seed.map(ref) / out.time_to_target
    return out


def step_costs_from_running_times(hours_h1: float, hours_h: float, h: int,
                                  steps: int) -> tuple[float, float]:
    """(compute seconds per update, seconds per sync) that explain two measured running times.

    Solves ``T_1 = steps·(c + s)`` and ``T_H = steps·(c + s/H)`` — e.g. Table 5's ResNet-20 on
    2×1 GPUs, 2.42 h at H = 1 and 1.55 h at H = 8 over 300 epochs of 50,000 images.
    """
    if not (hours_h1 > hours_h > 0 and h > 1 and steps > 0):
        raise ValueError(f"need hours_h1 > hours_h > 0, H > 1, steps > 0; got {hours_h1}, "
                         f"{hours_h}, {h}, {steps}")
    t1, th = hours_h1 * 3600 / steps, hours_h * 3600 / steps
    sync = (t1 - th) / (1 - 1 / h)
    return t1 - sync, sync


# Table 5 (App. F.2.1): ResNet-20 on CIFAR-10, 2x1 GPUs, B_loc = 128, 300 epochs of 50,000 images
TABLE5_RESNET20_HOURS = {1: 2.42, 8: 1.55}
TABLE5_UPDATES = 300 * 50_000 // (2 * 128)  # 58,593


def table5_step_costs() -> tuple[float, float]:
    """(compute seconds per update, seconds per sync) of the paper's own 2×1-GPU ResNet-20 runs:
    `step_costs_from_running_times` on Table 5's running times at H = 1 and H = 8 (about 87.6 ms
    and 61.1 ms)."""
    return step_costs_from_running_times(TABLE5_RESNET20_HOURS[1], TABLE5_RESNET20_HOURS[8], 8,
                                         TABLE5_UPDATES)


def reported_cells(artifacts: Sequence[str], papers_dir: str | Path | None) -> pd.DataFrame:
    """The cells of ``artifacts`` in ``papers/lin2020_local_sgd/reported.csv`` (no setup rows),
    with ``test_acc`` = the value as a float."""
    papers = Path(papers_dir) if papers_dir is not None else repo_root() / "papers"
    raw = pd.read_csv(papers / "lin2020_local_sgd" / "reported.csv", dtype={"setting": str})
    raw = raw[raw.artifact.isin(list(artifacts)) & (raw.setting != "setup")].copy()
    if raw.empty:
        raise ValueError(f"no {', '.join(artifacts)} rows in {papers}/lin2020_local_sgd/"
                         "reported.csv")
    return raw.assign(test_acc=raw.value.astype(float))


def cifar_run_note(P, *lead: str) -> str:
    """The reduced-run description every compare row of Figures 6, 7, 9 and Table 3 carries:
    ``"<mode>: <lead>, width w, N images, E epochs, seeds=n"`` from the notebook's parameters."""
    parts = [*lead, f"width {P.width}", f"{P.n_train or 50000} images", f"{P.epochs:g} epochs",
             f"seeds={getattr(P, 'n_seeds', 1)}"]
    return f"{P.mode}: " + ", ".join(parts)


def seed_values(table: pd.DataFrame, value: str, **where: object) -> pd.Series:
    """``value`` per seed of the rows matching ``where`` (column == value), indexed by seed."""
    part = table
    for col, v in where.items():
        part = part[part[col] == v]
    return part.groupby("seed")[value].mean()


def paired_by_seed(a: pd.Series, b: pd.Series, op: str = "-") -> list[float]:
    """``a − b`` (or ``a / b``) for the seeds both have: a claim comparing two settings is
    judged on per-seed differences (ratios), paired by seed."""
    a, b = a.align(b, join="inner")
    return (a - b if op == "-" else a / b).tolist()


def acc_by_seed(final: pd.DataFrame, where: dict) -> pd.Series:
    """Final test top-1 per seed of the runs whose columns equal ``where``."""
    part = final
    for col, value in where.items():
        part = part[part[col] == value]
    return part.groupby("seed")["test_acc"].mean()


def gaps_by_seed(final: pd.DataFrame, a: dict, b: dict) -> list[float]:
    """Per-seed differences (setting ``a`` minus setting ``b``) over the seeds both ran."""
    x, y = acc_by_seed(final, a), acc_by_seed(final, b)
    return [float(x[s] - y[s]) for s in x.index.intersection(y.index)]


def or_unmeasured(value: float, fmt: str = ".2f", unit: str = "") -> str:
    """``value`` formatted with ``fmt`` and ``unit``, or "not measurable" when it is not finite."""
    return f"{value:{fmt}}{unit}" if math.isfinite(value) else "not measurable"


def part_text(label: str, outcome: str, v) -> str:
    """One part of a multi-part verdict: its outcome, the per-seed mean (± sd, the one-sided 95 %
    bounds) and, if it could not be decided, why."""

    text = f"{label}: {outcome}"
    if v.seeds:
        text += f", {v.mean:+.2f} points" + (f" ± {v.sd:.2f} sd over {v.seeds} seeds"
                                              if v.seeds > 1 else "")
        if math.isfinite(v.low):
            text += f", 95 % bounds {v.low:+.2f} and {v.high:+.2f}"
    why = {claims.UNAVAILABLE: "not on this machine, not substituted",
           claims.NOT_MEASURABLE: "no finite test accuracy",
           claims.NOT_IN_REGIME: v.reason,
           claims.INCONCLUSIVE: v.reason.rsplit(": ", 1)[-1]}.get(outcome)
    notes = (["1 seed"] if v.seeds == 1 else []) + ([why] if why else [])
    return text + (f" ({', '.join(notes)})" if notes else "")


def rows_where(final: pd.DataFrame, where: dict) -> pd.DataFrame:
    """The rows of ``final`` whose columns equal ``where`` (a configuration over its seeds)."""
    part = final
    for col, value in where.items():
        part = part[part[col] == value]
    return part


def with_claim(rows: list[dict], artifact: str, setting: str, claim: str,
               verdict: str, metric: str = "test top-1", unit: str = "%",
               tested: str = "", **extra: object) -> list[dict]:
    """``rows`` with ``claim``/``verdict`` (and the ``tested`` quantity,
    `claims.tested_text`, and ``extra`` columns such as ``runs``) on the row of ``setting``; a
    row without a value (``metric`` in ``unit``) is added when no run of that setting exists."""

    for i, row in enumerate(rows):
        if row["artifact"] == artifact and row["setting"] == setting:
            keep = {k: row[k] for k in ("unit", "note")}
            rows[i] = claims.claim_row(artifact, setting, row["metric"], row["value"], **keep,
                                       claim=claim, verdict=verdict, tested=tested, **extra)
            return rows
    return [*rows, claims.claim_row(artifact, setting, metric, None, unit=unit,
                                    note="no run of this setting", claim=claim,
                                    verdict=verdict, tested=tested, **extra)]
