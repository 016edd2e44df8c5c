"""The deep-learning experiments of §4 as grids of `TrainConfig` runs, and their claim checks.

Notebooks stay thin: they pick parameters, call these functions and plot. Runs go through the
results cache (`localsgd.train.run_cached`), so two artifacts that need the same run (Figure 6's
H = 1…16 curves are Table 1's "local SGD w/o tricks" column) train it once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from localsgd.timing import Cluster, modelled_time
from localsgd.train import TrainConfig, run_cached

__all__ = [
    "claim_verdict",
    "dataset_available",
    "momentum_config",
    "run_grid",
    "scaling_table",
    "speedup_table",
    "step_costs_from_running_times",
    "table01_configs",
    "time_to_accuracy",
    "with_time",
]


def dataset_available(name: str, *, download: bool = False) -> tuple[bool, str]:
    """(True, where) if image data set ``name`` loads here, else (False, the loader's message).

    Notebooks use it to report "data unavailable" in their status instead of substituting
    another data set (e.g. CIFAR-100 on machines without a copy).
    """
    from localsgd import data

    kwargs = {"download": download} if name in data.CIFAR_DATASETS else {}
    try:
        ds = data.load_image_dataset(name, **kwargs)
    except FileNotFoundError as err:
        return False, str(err)
    return True, getattr(ds, "source", name)


def run_grid(configs: Sequence[TrainConfig], *, refresh: bool = False, progress: bool = True,
             labels: Sequence[dict] | None = None) -> pd.DataFrame:
    """Train every config (cached) and concatenate their records, one ``run`` id per config.

    ``labels`` (one dict per config) adds columns such as method or B_glob to each run's rows.
    """
    from tqdm.auto import tqdm

    if labels is not None and len(labels) != len(configs):
        raise ValueError(f"got {len(labels)} labels for {len(configs)} configs")
    frames = []
    for i, cfg in enumerate(tqdm(configs, desc="runs", disable=not progress)):
        df = run_cached(cfg, refresh=refresh, progress=progress).assign(run=i)
        if labels is not None:
            df = df.assign(**labels[i])
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def with_time(records: pd.DataFrame, cluster: Cluster, *,
              compute_seconds_per_step: float | None = None,
              sync_seconds: float | None = None, column: str = "time_s") -> pd.DataFrame:
    """Add a time column: measured compute + modelled communication on ``cluster``.

    ``compute_seconds_per_step`` replaces the measured compute by a fixed time per update and
    ``sync_seconds`` prices every averaging/all-reduce round at a fixed cost (e.g. the values
    `step_costs_from_running_times` derives from the paper's own running times).
    """
    out = records.copy()
    if compute_seconds_per_step is None and sync_seconds is None:
        out[column] = modelled_time(out, cluster)
        return out
    compute = (out["compute_seconds"] if compute_seconds_per_step is None
               else out["step"] * compute_seconds_per_step)
    if sync_seconds is None:
        comm = modelled_time(out, cluster) - out["compute_seconds"]
    else:
        rounds = sum(out[c].fillna(0) for c in out.columns
                     if c.startswith(("sync_l", "gradsync_l")))
        comm = rounds * sync_seconds
    out[column] = compute + comm
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


def time_to_accuracy(x: Iterable[float], acc: Iterable[float], target: float) -> float:
    """First x at which ``acc`` reaches ``target``, interpolated linearly between records
    (from (0, 0) before the first record); NaN if it never does."""
    xs = np.concatenate([[0.0], np.asarray(list(x), dtype=float)])
    ys = np.concatenate([[0.0], np.asarray(list(acc), dtype=float)])
    hit = np.nonzero(ys >= target)[0]
    if not len(hit):
        return math.nan
    i = int(hit[0])
    if i == 0 or ys[i] == ys[i - 1]:
        return float(xs[i])
    return float(xs[i - 1] + (target - ys[i - 1]) * (xs[i] - xs[i - 1]) / (ys[i] - ys[i - 1]))


def speedup_table(records: pd.DataFrame, *, time_col: str = "time_s", acc_col: str = "train_acc",
                  by: str = "local_steps", baseline: object = 1,
                  target: float | None = None) -> pd.DataFrame:
    """Time to a common accuracy target per (seed, ``by``) and the speed-up over ``baseline``.

    The target defaults, per seed, to the lowest final accuracy among the compared runs, so every
    run reaches it ("reaches the same training accuracy", Figure 6).
    """
    rows = []
    for seed, part in records.groupby("seed"):
        groups = {key: g.sort_values("step") for key, g in part.groupby(by)}
        tgt = target if target is not None else min(g[acc_col].iloc[-1] for g in groups.values())
        times = {key: time_to_accuracy(g[time_col], g[acc_col], tgt) for key, g in groups.items()}
        if baseline not in times:
            raise ValueError(f"no run with {by} = {baseline!r} to compare against "
                             f"(have {sorted(times)})")
        for key, t in times.items():
            rows.append({"seed": seed, by: key, "target_acc": tgt, "time_to_target": t,
                         "speedup": times[baseline] / t if t > 0 else math.nan})
    return pd.DataFrame(rows)


def scaling_table(records: pd.DataFrame, *, target: float, baseline: dict,
                  time_col: str = "time_s", acc_col: str = "test_acc",
                  keys: Sequence[str] = ("world_size", "local_steps")) -> pd.DataFrame:
    """Time to ``target`` accuracy per run and its speed-up over the ``baseline`` run of the same
    seed (Figure 7: speed-up over the 1×2-GPU mini-batch run), with the final accuracy."""
    rows = []
    for (seed, *key), run in records.groupby(["seed", *keys]):
        run = run.sort_values("step")
        rows.append({"seed": seed, **dict(zip(keys, key, strict=True)),
                     "time_to_target": time_to_accuracy(run[time_col], run[acc_col], target),
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


def claim_verdict(values: Sequence[float], threshold: float, *, higher_is_better: bool = True,
                  unit: str = "") -> tuple[str, float, float]:
    """("held" / "did not hold" + mean ± std over seeds, mean, std) for a claim "value ≥ thr"."""
    arr = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if not len(arr):
        return "not measurable (no run reached the target)", math.nan, math.nan
    mean = float(arr.mean())
    std = float(arr.std(ddof=1)) if len(arr) > 1 else 0.0
    ok = mean >= threshold if higher_is_better else mean <= threshold
    spread = f"{mean:.2f}{unit} ± {std:.2f} over {len(arr)} seed(s)" if len(arr) > 1 else \
        f"{mean:.2f}{unit} (1 seed, no spread)"
    return ("held" if ok else "did not hold") + f": {spread}", mean, std


def momentum_config(base: TrainConfig, local: float, global_: float) -> TrainConfig:
    """App. D's momentum schemes as a config: local momentum ``local`` inside each worker's SGD,
    global (block) momentum ``global_`` on the averaged model's delta; both → hybrid (D.1.3)."""
    if local < 0 or global_ < 0:
        raise ValueError(f"momenta must be >= 0, got local={local}, global={global_}")
    scheme = {(False, False): "none", (True, False): "local", (False, True): "global",
              (True, True): "hybrid"}[(local > 0, global_ > 0)]
    return dataclasses.replace(base, momentum_scheme=scheme, momentum=local,
                               global_momentum=global_)


def table01_configs(base: TrainConfig, b_globs: Sequence[int], seeds: Sequence[int], *,
                    warmup_epochs: float) -> tuple[list[TrainConfig], list[dict]]:
    """Table 1's grid: local SGD (B_loc fixed, H = B_glob / B_loc) vs mini-batch SGD
    (H = 1, B_loc = B_glob), each without and with the large-batch tricks (App. C: lr scaled by
    K·B_loc / base_batch, gradual warm-up over ``warmup_epochs``), K = ``base.world_size``.

    B_glob counts the samples one worker accesses per synchronisation. Identical configurations
    (B_glob = B_loc, where local SGD *is* mini-batch SGD) are trained once through the cache.
    """
    configs, labels = [], []
    for tricks in (False, True):
        for method in ("local SGD", "mini-batch SGD"):
            for b_glob in b_globs:
                if method == "local SGD":
                    if b_glob % base.local_batch:
                        raise ValueError(f"B_glob={b_glob} is not a multiple of B_loc="
                                         f"{base.local_batch}")
                    shape = {"local_batch": base.local_batch,
                             "local_steps": b_glob // base.local_batch}
                else:
                    shape = {"local_batch": b_glob, "local_steps": 1}
                trick = ({"scale_lr": True, "base_batch": base.local_batch,
                          "warmup_epochs": warmup_epochs} if tricks else
                         {"scale_lr": False, "warmup_epochs": 0.0})
                for seed in seeds:
                    configs.append(dataclasses.replace(base, seed=seed, **shape, **trick))
                    labels.append({"method": method, "tricks": "w/ tricks" if tricks
                                   else "w/o tricks", "B_glob": b_glob})
    return configs, labels
