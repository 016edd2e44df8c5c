"""Shared helpers of the deep-learning experiments: grids of `TrainConfig` runs, time axes,
time-to-accuracy and speed-ups (verdicts: `localsgd.paper.experiments.claims`) (one module per
source builds on these: `localsgd.paper.experiments.lin2020`, `.slowmo`, `.hsgd_blog`).

Notebooks stay thin: they pick parameters, call these functions and plot. Runs go through the
results cache (`run_cached`), so two artifacts that need the same run (Figure 6's
H = 1…16 curves are Table 1's "local SGD w/o tricks" column) train it once.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from localsgd import data, paths
from localsgd.paper import dry_run, profile, results, run_progress
from localsgd.paper.experiments import claims
from localsgd.timing.cluster import Cluster, modelled_time
from localsgd.training.config import TrainConfig
from localsgd.training.loop import train
from localsgd.training.results_key import RESULTS_VERSION, results_key, same_run

__all__ = [
    "WORK_KEYS",
    "app_c_tricks",
    "base_config",
    "checkpoint_path",
    "dataset_available",
    "final_table",
    "find_kept",
    "is_cached",
    "keep_run",
    "pool_compute",
    "run_cached",
    "run_grid",
    "run_provenance",
    "runs_dir",
    "speedup_table",
    "time_to_accuracy",
    "with_time",
]

# Set by `localsgd reproduce --mode converged` to <out-dir>/converged/runs (figures/converged/runs/
# by default): finished runs are kept there too, so that the hours they took travel with the
# repository to a machine whose results cache is empty.
RUNS_ENV = "LOCALSGD_RUNS"


def runs_dir() -> Path | None:
    """The folder of kept finished runs (`RUNS_ENV`), or None outside a converged reproduction."""
    value = os.environ.get(RUNS_ENV)
    return Path(value) if value else None


def _entry(cfg: TrainConfig) -> Path:
    """``cfg``'s results-cache entry, named by its meaning (`localsgd.training.results_key`)."""
    return results.keyed_entry("train", results_key(cfg))


def run_provenance(cfg: TrainConfig) -> dict:
    """What a cached or kept run's ``.json`` holds: the whole configuration, the results
    version it was computed under and the code that computed it (`results.library_code_hash`,
    the commit): `same_run` and `RESULTS_VERSION` decide whether it serves a run; the code
    only warns (`_whole`)."""
    return {"name": "train", "params": cfg.to_dict(), "results_version": RESULTS_VERSION,
            "library_hash": results.library_code_hash(), "git": results.git_state()}


def is_cached(cfg: TrainConfig) -> bool:
    """Whether `run_cached` would serve ``cfg`` without training: from the results cache, or
    from a usable kept run of `runs_dir` (same key, and its stored parameters are ``cfg``'s)."""
    return _whole(_entry(cfg), cfg, quiet=True) or _kept(cfg, quiet=True) is not None


def _kept(cfg: TrainConfig, *, quiet: bool = False) -> Path | None:
    """``cfg``'s kept run in `runs_dir` if it is whole and ``cfg``'s (`_whole`)."""
    folder = runs_dir()
    return None if folder is None else find_kept(cfg, folder, quiet=quiet)


def find_kept(cfg: TrainConfig, folder: Path, *, quiet: bool = True) -> Path | None:
    """The ``.csv`` of ``cfg``'s kept run in ``folder`` if it is whole and ``cfg``'s: its
    ``.json`` is of this results version and names ``cfg``'s parameters, its records read."""
    csv = Path(folder) / _entry(cfg).name
    return csv if _whole(csv, cfg, quiet=quiet) else None


def keep_run(cfg: TrainConfig, records: pd.DataFrame, folder: Path, **provenance) -> Path:
    """Write ``records`` as ``cfg``'s kept run in ``folder`` (the ``.json`` first, then the
    ``.csv``, each atomically, as `results.cached` writes an entry), with `run_provenance`
    and ``provenance`` (e.g. the pack it was trained in) in the ``.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    csv = folder / _entry(cfg).name
    results.write_json({**run_provenance(cfg), **provenance}, csv.with_suffix(".json"))
    results.write_csv(records, csv)
    return csv


_WARNED: set[tuple[str, str]] = set()


def _whole(csv: Path, cfg: TrainConfig, *, quiet: bool = False) -> bool:
    """Whether ``csv`` and its ``.json`` are a whole entry of the run ``cfg`` describes: the
    ``.json`` is of this `RESULTS_VERSION` and its parameters are ``cfg``'s (`same_run`), the
    ``.csv`` reads as records (a merge conflict or an edit by hand is not trusted). A file of
    the right name that fails says why in one line (unless ``quiet``); one computed by other
    library code serves, with a one-line warning per code."""
    if not csv.is_file():
        return False
    try:
        meta = json.loads(csv.with_suffix(".json").read_text(encoding="utf-8"))
        records = pd.read_csv(csv)
        usable = len(records) > 0 and "test_acc" in records and \
            pd.api.types.is_numeric_dtype(records["test_acc"])
        version, params = meta.get("results_version"), meta["params"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, pd.errors.ParserError,
            pd.errors.EmptyDataError):
        usable, version, params = False, None, None
    why = ("its records or .json do not read as a run" if not usable
           else f"it is of results version {version}, this is {RESULTS_VERSION}"
           if version != RESULTS_VERSION
           else "its .json names other parameters" if not same_run(params, cfg) else None)
    if why is not None:
        if not quiet:
            print(f"{csv}: not used ({why}); training the run", flush=True)
        return False
    code = meta.get("library_hash")
    if code != results.library_code_hash() and (str(csv.parent), str(code)) not in _WARNED:
        _WARNED.add((str(csv.parent), str(code)))
        warnings.warn(f"runs in {csv.parent} were computed by "
                      f"{f'library code {code}' if code else 'a library that did not record its hash'}"
                      f", this is {results.library_code_hash()}: used, as results version "
                      f"{RESULTS_VERSION} says the numbers are the same (tests/golden/)",
                      stacklevel=3)
    return True


def _copy_entry(entry: Path, folder: Path) -> None:
    """Copy a cache entry's ``.json`` and ``.csv`` into ``folder``, each atomically (a partial
    copy is never mistaken for a run, two notebooks copying one run at once do not collide);
    the ``.csv`` last, as `results.cached` writes them."""
    for src in (entry.with_suffix(".json"), entry):
        with paths.atomic_path(folder / src.name) as tmp:
            shutil.copyfile(src, tmp)


def run_cached(cfg: TrainConfig, *, refresh: bool = False, progress: bool = True) -> pd.DataFrame:
    """`localsgd.training.loop.train` through the results cache: identical runs (also across
    notebooks) train once. The key is the run's meaning (`localsgd.training.results_key`: the fields
    that change its numbers and the results version), not the code's. A run being trained
    checkpoints after every epoch beside its cache entry (`checkpoint_path`), so one cut off mid-way
    (a closed laptop, a killed kernel) resumes from its last epoch, as `train` resumes (bitwise);
    the checkpoint is deleted once the entry is written. Inside a dry run
    (`localsgd.paper.dry_run`) the run is cut short, neither checkpointed nor cached; under
    ``localsgd reproduce --profile`` its phases are recorded."""
    limit = dry_run.limit()
    ckpt = None if limit is not None else checkpoint_path(cfg)
    entry, keep = _entry(cfg), (runs_dir() if limit is None else None)
    usable = not refresh and _whole(entry, cfg, quiet=not entry.is_file())
    kept = _kept(cfg) if keep is not None and not refresh else None
    if kept is not None and not usable:
        _copy_entry(kept, entry.parent)  # a run trained on another machine
        usable = True
    trained = []
    if ckpt is not None and refresh:
        ckpt.unlink(missing_ok=True)

    def compute() -> pd.DataFrame:
        def run() -> pd.DataFrame:
            return train(cfg, progress=progress, limit=limit, on_phases=profile.on_train_phases(),
                         checkpoint_path=ckpt, checkpoint_every=1 if ckpt else 0)
        resumed = ckpt is not None and ckpt.is_file()
        trained.append(True)
        try:
            return run()
        except Exception as err:
            if not resumed:
                raise
            if isinstance(err, ValueError) and str(ckpt) in str(err):
                # a checkpoint it cannot resume (garbled, written by the other engine)
                print(f"{err}: training from the start instead", flush=True)
                ckpt.unlink(missing_ok=True)
                return run()
            err.add_note(f"(the run resumed from {ckpt}; delete it to train from the start)")
            raise

    prov = run_provenance(cfg)
    out = results.cached("train", prov.pop("params"), compute, refresh=not usable,
                         entry=entry, meta={k: v for k, v in prov.items() if k != "name"})
    if ckpt is not None:
        ckpt.unlink(missing_ok=True)  # the entry holds the run now
    if keep is not None and (trained or kept is None):  # new, or not kept yet (or not whole)
        _copy_entry(entry, keep)
    return out


def checkpoint_path(cfg: TrainConfig) -> Path:
    """Where `run_cached` keeps ``cfg``'s checkpoint while training it: beside its cache entry,
    under the same key (so a checkpoint of another config or results version is never
    resumed; one of older code under the same version is, as its kept run would be served)."""
    return _entry(cfg).with_suffix(".ckpt.pt")


# notebook parameter name -> TrainConfig field, for the names the deep-learning notebooks share
_CONFIG_NAMES = {"dataset": "dataset", "model": "model", "width": "width", "n_train": "n_train",
                 "n_test": "n_test", "K": "world_size", "B_loc": "local_batch",
                 "epochs": "epochs", "warmup_epochs": "warmup_epochs",
                 "base_batch": "base_batch", "batched": "batched", "packed": "packed",
                 "device": "device", "records_per_epoch": "records_per_epoch",
                 "resolution": "resolution"}
# batch sizes a notebook's ``batch_scale`` multiplies (long mode: the subset's fraction of the
# training set, so that B_glob / n and every run's update count stay the paper's)
_SCALED = ("local_batch", "base_batch")


def scaled_batch(batch: int, scale: float) -> int:
    """``batch`` times ``scale`` (a notebook's ``batch_scale``), which must give a whole batch:
    one ValueError line otherwise."""
    out = batch * scale
    if out < 1 or abs(out - round(out)) > 1e-9:
        raise ValueError(f"batch_scale={scale} turns batch {batch} into {out:g}: it must give a "
                         "whole batch of at least 1")
    return round(out)


def base_config(P, **overrides) -> TrainConfig:
    """The `TrainConfig` a deep-learning notebook's parameters describe: every shared parameter
    it declares (``K`` -> ``world_size``, ``B_loc`` -> ``local_batch``, ``dataset``, ``model``,
    ``width``, ...) plus ``overrides``; the grid varies the rest with `dataclasses.replace`."""
    given = {field: getattr(P, name) for name, field in _CONFIG_NAMES.items() if hasattr(P, name)}
    scale = getattr(P, "batch_scale", 1.0)
    given.update({k: scaled_batch(given[k], scale) for k in _SCALED if k in given})
    return TrainConfig(**{**given, **overrides})


def app_c_tricks(P) -> dict:
    """App. C's large-batch tricks as `base_config` overrides when the notebook sets ``P.tricks``:
    lr scaled by K and a gradual warm-up over ``P.warmup_epochs``; none otherwise."""
    tricks = getattr(P, "tricks", False)
    return {"scale_lr": tricks,
            "warmup_epochs": getattr(P, "warmup_epochs", 0.0) if tricks else 0.0}


def final_table(runs: pd.DataFrame, by: Sequence[str], value: str = "test_acc"
                ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(each run's last record with how far its test accuracy moved over its last tenth,
    `claims.final_rows`; mean/std/count of ``value`` over seeds per ``by`` group)."""
    final = claims.final_rows(runs)
    table = final.groupby(list(by))[value].agg(["mean", "std", "count"]).reset_index()
    return final, table


def dataset_available(name: str, *, download: bool = False) -> tuple[bool, str]:
    """(True, where) if image data set ``name`` loads here, else (False, the loader's message).

    Notebooks use it to report "data unavailable" in their status instead of substituting
    another data set (e.g. CIFAR-100 on machines without a copy).
    """
    kwargs = {"download": download} if name in data.CIFAR_DATASETS else {}
    try:
        ds = data.load_image_dataset(name, **kwargs)
    except FileNotFoundError as err:
        return False, str(err)
    return True, getattr(ds, "source", name)


def run_grid(configs: Sequence[TrainConfig], *, refresh: bool = False, progress: bool = True,
             labels: Sequence[dict] | None = None) -> pd.DataFrame:
    """Train every config (cached) and concatenate their records, one ``run`` id per config
    and its ``run_key`` (the results-cache key: equal configurations, equal keys).

    ``labels`` (one dict per config) adds columns such as method or B_glob to each run's rows.
    """
    if labels is not None and len(labels) != len(configs):
        raise ValueError(f"got {len(labels)} labels for {len(configs)} configs")
    frames = []
    apart = run_progress.varying(configs)  # what the harness's console names each run by
    # a dry run never reads the cache (`results.cached`): none of its runs is "cached"
    cached = [not refresh and dry_run.updates() is None and is_cached(cfg) for cfg in configs]
    images = [_training_images(cfg) for cfg in configs]
    left = sum(n for n, c in zip(images, cached, strict=True) if not c)
    if progress and left:
        proxy = all(c or (cfg.model, cfg.width, cfg.device) == ("resnet20", 0.5, "cpu")
                    for cfg, c in zip(configs, cached, strict=True))
        seconds = sum(run_progress.proxy_seconds(n, cfg.local_batch)
                      for n, cfg, c in zip(images, configs, cached, strict=True) if not c)
        print(f"{len(configs) - sum(cached)} of {len(configs)} runs to train ({left:,} training "
              f"images)" + (f": {run_progress.proxy_time(seconds)}" if proxy else ""), flush=True)
    spent, done = 0.0, 0
    for i, cfg in enumerate(tqdm(configs, desc="runs", disable=not progress)):
        event = {"index": i + 1, "runs": len(configs), "cached": cached[i],
                 "what": run_progress.describe(cfg, apart)}
        run_progress.record("run", **event)
        # a run resumed from its checkpoint trains only its rest: left out of the pace
        resumed = (not cached[i] and not refresh and dry_run.updates() is None
                   and checkpoint_path(cfg).is_file())
        t0 = time.perf_counter()
        # run_key: the run by its meaning, so two claims judged on the same runs can be told
        df = run_cached(cfg, refresh=refresh, progress=progress).assign(
            run=i, run_key=_entry(cfg).stem.removeprefix("train-"))
        seconds = time.perf_counter() - t0
        run_progress.record("run_done", **event, seconds=seconds,
                            test_acc=float(df["test_acc"].iloc[-1]) if "test_acc" in df and len(df)
                            else None)
        if not cached[i]:
            left -= images[i]
            if not resumed:
                spent, done = spent + seconds, done + images[i]
            if progress and left:
                print(f"run {i + 1} of {len(configs)} trained in {seconds:.0f} s"
                      + (" (its rest, resumed)" if resumed else "")
                      + run_progress.remaining(spent, done, left), flush=True)
        if labels is not None:
            df = df.assign(**labels[i])
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def _training_images(cfg: TrainConfig) -> int:
    """Training images a run of ``cfg`` processes: its updates (`localsgd.training.loop`'s count,
    floor(epochs × N / (K × B_loc))) × K × B_loc; 0 where N is unknown (a folder data set)."""
    n = cfg.n_train or (data.CIFAR_COUNTS[0] if cfg.dataset in data.CIFAR_DATASETS else 0)
    per_update = cfg.world_size * cfg.local_batch
    return math.floor(cfg.epochs * n / per_update) * per_update


# the config fields that set a worker's work per update (not H, K or the schedule)
WORK_KEYS = ("dataset", "model", "width", "local_batch", "image_size", "resolution", "augment",
             "device", "dtype")


def pool_compute(records: pd.DataFrame, by: Sequence[str] = WORK_KEYS) -> pd.DataFrame:
    """``records`` with ``compute_seconds`` = updates × the median per-update compute over the
    runs (``run``) doing the same work per update (same ``by`` fields); the measured values
    move to ``compute_seconds_measured``.

    Local SGD changes how often workers communicate, not what one update computes, so every run
    of a grid should pay the same compute per update; measured per run on a shared CPU it
    drifts by several per cent between runs minutes apart, which would otherwise enter the
    time-axis speed-ups (Figure 6's moved 0.65× → 0.75× between two idle-machine runs)."""
    if "run" not in records.columns:
        raise ValueError("pool_compute needs a 'run' column (run_grid adds it)")
    out = records.copy()
    keys = [k for k in by if k in out.columns]
    last = out.sort_values("step").groupby("run").last()
    per_run = last["compute_seconds"] / last["step"]
    # str() of each value: astype(str) keeps a missing value (resolution None) as NaN
    group = (last[keys].apply(lambda col: col.map(str)).agg("|".join, axis=1) if keys
             else pd.Series("", last.index))
    pooled = per_run.groupby(group).transform("median")
    out["compute_seconds_measured"] = out["compute_seconds"]
    out["compute_seconds"] = out["step"] * out["run"].map(pooled)
    return out


def with_time(records: pd.DataFrame, cluster: Cluster, *,
              compute_seconds_per_step: float | None = None,
              sync_seconds: float | None = None, column: str = "time_s") -> pd.DataFrame:
    """Add a time column: measured compute + modelled communication on ``cluster``.

    ``compute_seconds_per_step`` replaces the measured compute by a fixed time per update and
    ``sync_seconds`` prices every averaging/all-reduce round at a fixed cost (e.g. the values
    `localsgd.paper.experiments.lin2020.step_costs_from_running_times` derives from the paper's
    own running times).
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
