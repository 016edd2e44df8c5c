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
    "Table02Fit",
    "barrier_time_per_update",
    "breakeven_benchmark",
    "claim_verdict",
    "dataset_available",
    "fit_step_costs",
    "momentum_config",
    "pool_compute",
    "run_grid",
    "scaling_table",
    "slowmo_configs",
    "slowmo_summary",
    "speedup_table",
    "step_costs_from_running_times",
    "table01_configs",
    "table02_fit",
    "table02_reported",
    "time_to_accuracy",
    "update_and_sync_counts",
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


# the config fields that set a worker's work per update (not H, K or the schedule)
WORK_KEYS = ("dataset", "model", "width", "local_batch", "image_size", "augment", "device",
             "dtype")


def pool_compute(records: pd.DataFrame, by: Sequence[str] = WORK_KEYS) -> pd.DataFrame:
    """``records`` with ``compute_seconds`` = updates × the median per-update compute over the
    runs (``run``) doing the same work per update (same ``by`` fields); the measured values
    move to ``compute_seconds_measured``.

    Local SGD changes how often workers communicate, not what one update computes, so every run
    of a grid should pay the same compute per update; measured per run on a shared CPU it
    drifts by several per cent between runs minutes apart, which would otherwise enter the
    time-axis speed-ups (Figure 6's moved 0.65× → 0.75× between two idle-machine runs)."""
    if "run" not in records.columns:
        raise ValueError("pool_compute needs a 'run' column (experiments.run_grid adds it)")
    out = records.copy()
    keys = [k for k in by if k in out.columns]
    last = out.sort_values("step").groupby("run").last()
    per_run = last["compute_seconds"] / last["step"]
    group = last[keys].astype(str).agg("|".join, axis=1) if keys else pd.Series("", last.index)
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


# ----------------------------------------------------------------------------------------------
# Table 2 (§4.3): training time over H on the 8×2-GPU cluster, and a fitted cost model
# ----------------------------------------------------------------------------------------------

# Table 2's setting (§4.3 and its caption): ResNet-20, all of CIFAR-10, K = 16 (8 nodes × 2 GPUs),
# B_loc = 128, H^b = 1, "the equivalent of 300 epochs"
TABLE02_SETTING = {"epochs": 300, "n_train": 50_000, "workers": 16, "gpus_per_node": 2,
                   "batch": 128, "inter_gbps": 10.0}


def table02_reported(papers_dir: str | None = None) -> pd.DataFrame:
    """Table 2 as transcribed in ``papers/lin2020_local_sgd/reported.csv``: columns H, minutes."""
    from pathlib import Path

    from localsgd.results import repo_root

    papers = Path(papers_dir) if papers_dir is not None else repo_root() / "papers"
    raw = pd.read_csv(papers / "lin2020_local_sgd" / "reported.csv", dtype={"setting": str})
    raw = raw[raw.artifact == "Table 2"]
    if raw.empty:
        raise ValueError(f"no 'Table 2' rows in {papers}/lin2020_local_sgd/reported.csv")
    hs = raw.setting.str.extract(r"H=(\d+)")[0].astype(int)
    return (pd.DataFrame({"H": hs.to_numpy(), "minutes": raw.value.astype(float).to_numpy()})
            .sort_values("H", ignore_index=True))


def update_and_sync_counts(hs: Sequence[int], *, epochs: float = 300, n_train: int = 50_000,
                           workers: int = 16, batch: int = 128) -> pd.DataFrame:
    """Updates U per worker and global averaging rounds per H for flat local SGD.

    U = ⌊epochs·N/(K·B)⌋ as `localsgd.train` counts it; rounds = ⌈epochs·N/(K·B·H)⌉, eq. (6)'s
    count (`timing.sync_rounds`) with H^b = 1 (Table 2: 7,324 updates, 7,325 … 8 rounds).
    """
    from localsgd.timing import sync_rounds

    updates = math.floor(epochs * n_train / (workers * batch))
    rows = [{"H": int(h), "updates": updates,
             "syncs": sync_rounds(round(epochs * n_train), workers, batch, int(h), 1)[1]}
            for h in hs]
    return pd.DataFrame(rows)


def fit_step_costs(updates: Sequence[float], syncs: Sequence[float], seconds: Sequence[float],
                   extra: dict[str, Sequence[float]] | None = None) -> dict[str, float]:
    """Non-negative least squares for ``T = U·c + R·s (+ Σ X_j·d_j)`` (seconds).

    ``c`` is the compute time of one update, ``s`` the cost of one averaging round, and each
    ``extra`` column X_j (e.g. U·log2 H) gets its own coefficient d_j. Returns the coefficients by
    name (``compute_s``, ``sync_s``, the extra names). Non-negative: a cost cannot be negative.
    """
    from scipy.optimize import nnls

    cols = {"compute_s": np.asarray(updates, float), "sync_s": np.asarray(syncs, float)}
    for name, col in (extra or {}).items():
        cols[name] = np.asarray(col, float)
    a = np.column_stack(list(cols.values()))
    y = np.asarray(seconds, float)
    if a.shape[0] < a.shape[1]:
        raise ValueError(f"{a.shape[0]} rows cannot determine {a.shape[1]} costs "
                         f"({', '.join(cols)}); fit on more rows")
    coef, _ = nnls(a, y)
    return dict(zip(cols, map(float, coef), strict=True))


@dataclasses.dataclass(frozen=True)
class Table02Fit:
    """Per-update compute ``compute_s`` and per-round cost ``sync_s`` fitted to Table 2.

    ``table`` has one row per H: updates, syncs, the paper's minutes, the model's minutes, the
    residual (model − paper, minutes and %), whether the row was fitted (``used``) and
    ``loo_minutes``: for a fitted row, the prediction of a fit on the other fitted rows
    (leave-one-out); for the others, the model's minutes.
    """

    compute_s: float
    sync_s: float
    fit_hs: tuple[int, ...]
    table: pd.DataFrame
    param_bytes: int

    @property
    def rms_residual_min(self) -> float:
        """Root-mean-square residual (minutes) over the fitted rows."""
        used = self.table[self.table.used]
        return float(np.sqrt((used.residual_min ** 2).mean()))

    def time_kwargs(self) -> dict[str, float]:
        """`with_time` arguments that price a run with the fitted costs (every sync at sync_s)."""
        return {"compute_seconds_per_step": self.compute_s, "sync_seconds": self.sync_s}

    def cluster(self, *, gpus_per_node: int = 2, inter_gbps: float = 10.0,
                intra_gbps: float = 100.0, world_size: int = 16) -> Cluster:
        """A `timing.Cluster` whose world all-reduce of ResNet-20's bytes costs ``sync_s``.

        The 10 Gbit/s bandwidth term (2(K−1)/K·bytes/bandwidth, ~1.6 ms for 1.08 MB) leaves most
        of ``sync_s`` as per-step latency: ``latency_s = (sync_s − bandwidth term)/⌈log2 K⌉``.
        Smaller groups then cost fewer latency steps (log2 g, App. B's counting).
        """
        probe = Cluster(gpus_per_node=gpus_per_node, intra_gbps=intra_gbps,
                        inter_gbps=inter_gbps, latency_s=0.0)
        bandwidth = probe.allreduce_seconds(world_size, self.param_bytes, world_size)
        if bandwidth >= self.sync_s:
            raise ValueError(f"the bandwidth term alone ({bandwidth * 1e3:.2f} ms) exceeds the "
                             f"fitted sync cost ({self.sync_s * 1e3:.2f} ms); lower inter_gbps")
        latency = (self.sync_s - bandwidth) / math.ceil(math.log2(world_size))
        return dataclasses.replace(probe, latency_s=latency)


def resnet20_param_bytes(num_classes: int = 10) -> int:
    """float32 bytes of the paper's ResNet-20 (269,722 parameters on CIFAR-10)."""
    from localsgd.models import build_model, count_params

    return 4 * count_params(build_model("resnet20", num_classes=num_classes))


def table02_fit(fit_max_h: int = 32, *, papers_dir: str | None = None) -> Table02Fit:
    """Fit ``T(H) = U·c + R(H)·s`` to Table 2's rows with H ≤ ``fit_max_h`` (least squares).

    Lin et al. (2020) §4.3, Table 2: local SGD on 8×2 GPUs, ResNet-20, B_loc = 128, 300 epochs
    (U = 7,324 updates per worker, R(H) = ⌈U/H⌉-ish rounds by eq. (6)'s count). The model is
    non-increasing in H, so by default it is fitted where the times fall (H ≤ 32) and the
    rows beyond are predictions whose residuals show what it cannot explain.
    """
    rep = table02_reported(papers_dir)
    st = TABLE02_SETTING
    tab = update_and_sync_counts(rep.H, epochs=st["epochs"], n_train=st["n_train"],
                                 workers=st["workers"], batch=st["batch"]).merge(rep, on="H")
    tab["used"] = tab.H <= fit_max_h
    if tab.used.sum() < 2:
        raise ValueError(f"fit_max_h={fit_max_h}: fewer than 2 rows of Table 2 have H <= it")
    used = tab[tab.used]
    coef = fit_step_costs(used.updates, used.syncs, used.minutes * 60)
    tab["model_minutes"] = (tab.updates * coef["compute_s"] + tab.syncs * coef["sync_s"]) / 60
    tab["residual_min"] = tab.model_minutes - tab.minutes
    tab["residual_pct"] = 100 * tab.residual_min / tab.minutes
    # out-of-sample check of the fitted rows: each predicted from a fit on the others
    loo = tab.model_minutes.copy()
    if len(used) > 2:
        for i in used.index:
            rest = used.drop(index=i)
            c = fit_step_costs(rest.updates, rest.syncs, rest.minutes * 60)
            loo[i] = (tab.updates[i] * c["compute_s"] + tab.syncs[i] * c["sync_s"]) / 60
    tab["loo_minutes"] = loo
    return Table02Fit(coef["compute_s"], coef["sync_s"], tuple(int(h) for h in used.H), tab,
                      resnet20_param_bytes())


def barrier_time_per_update(hs: Sequence[int], *, workers: int, updates: int, compute_s: float,
                            sync_s: float, jitter_cv: float = 0.0, stall_rate: float = 0.0,
                            stall_s: float = 0.0, slow_factor: float = 1.0,
                            slow_rate: float = 0.0, slow_len: float = 1.0,
                            seed: int = 0) -> pd.DataFrame:
    """Seconds per update of local SGD with a barrier at every average, under stragglers.

    Monte Carlo (numpy, workers × updates step times shared by every H): each worker's update
    takes ``compute_s`` × lognormal jitter (coefficient of variation ``jitter_cv``), plus a
    ``stall_s`` stall with probability ``stall_rate`` (the blog's stragglers), and runs
    ``slow_factor`` × slower while in a slow phase (entered with probability ``slow_rate`` per
    update, mean length ``slow_len`` updates: time-correlated stragglers). A round of H updates
    ends when the slowest worker finishes its H updates, then costs ``sync_s``.

    Why it cannot produce Table 2's rise: a round of 2H is no longer than two rounds of H
    (max_k (a_k + b_k) ≤ max_k a_k + max_k b_k) and saves a sync, so with step times that do not
    depend on H the time per update never grows from H to 2H.
    """
    rng = np.random.default_rng(seed)
    x = np.full((workers, updates), float(compute_s))
    if jitter_cv > 0:
        sigma = math.sqrt(math.log1p(jitter_cv ** 2))
        x *= rng.lognormal(-sigma ** 2 / 2, sigma, size=x.shape)  # mean 1
    if stall_rate > 0 and stall_s > 0:
        x += stall_s * (rng.random(x.shape) < stall_rate)
    if slow_rate > 0 and slow_factor != 1.0:
        # two-state Markov chain per worker: enter a slow phase w.p. slow_rate, leave w.p. 1/len
        slow = np.zeros(x.shape, bool)
        enter = rng.random(x.shape) < slow_rate
        leave = rng.random(x.shape) < 1.0 / max(slow_len, 1.0)
        state = np.zeros(workers, bool)
        for t in range(updates):  # O(U) numpy steps over workers
            state = np.where(state, ~leave[:, t], enter[:, t])
            slow[:, t] = state
        x = np.where(slow, x * slow_factor, x)
    cum = np.concatenate([np.zeros((workers, 1)), x.cumsum(axis=1)], axis=1)
    rows = []
    for h in hs:
        ends = np.r_[np.arange(h, updates, h), updates]
        starts = np.r_[0, ends[:-1]]
        round_compute = (cum[:, ends] - cum[:, starts]).max(axis=0)  # slowest worker per round
        total = round_compute.sum() + len(ends) * sync_s
        rows.append({"H": int(h), "seconds_per_update": total / updates,
                     "wait_per_update": (round_compute.sum() - cum[:, -1].mean()) / updates})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------
# SlowMo (fairscale's SlowMoDistributedDataParallel page, shared/seeds/001): quality grid and the
# page's break-even rule
# ----------------------------------------------------------------------------------------------


def slowmo_configs(base: TrainConfig, *, localsgd_frequency: int, slowmo_frequency: int,
                   momenta: Sequence[float], slow_lrs: Sequence[float],
                   sgp_momenta: Sequence[float], seeds: Sequence[int],
                   slow_lr_momentum: float = 0.0,
                   sync_reference: bool = False) -> tuple[list[TrainConfig], list[dict]]:
    """The SlowMo grid: local SGD alone, SlowMo over local SGD (each slow momentum β in
    ``momenta`` at slow lr α = 1, each α in ``slow_lrs`` at β = ``slow_lr_momentum``), and SGP
    with an exact average every ``slowmo_frequency`` updates, alone (β = 0) and with SlowMo.

    β = 0, α = 1 *is* the base algorithm (the outer step returns the average; tests/test_train.py
    checks it), so that point is the base run without SlowMo and is trained once.
    ``sync_reference`` adds H = 1 (every update averaged: the exact-averaging quality the page
    says the base algorithms lose). fairscale's
    docstring asks for ``slowmo_frequency`` to be a multiple of ``localsgd_frequency`` (defaults
    48 and 3), so the slow step's exact average falls on a local-SGD average.
    """
    if slowmo_frequency % localsgd_frequency:
        raise ValueError(f"slowmo_frequency={slowmo_frequency} must be a multiple of "
                         f"localsgd_frequency={localsgd_frequency} (fairscale's coupling: the "
                         "slow step's exact average replaces a local-SGD average)")
    points: list[tuple[str, float, float]] = [("H = 1", 0.0, 1.0)] if sync_reference else []
    points += [("local SGD", 0.0, 1.0)]
    points += [("local SGD", float(b), 1.0) for b in momenta]
    points += [("local SGD", float(slow_lr_momentum), float(a)) for a in slow_lrs]
    points += [("SGP", float(b), 1.0) for b in sgp_momenta]
    points = list(dict.fromkeys(points))  # drop repeats (e.g. beta 0 in momenta), keep order
    configs, labels = [], []
    for base_alg, beta, alpha in points:
        plain = beta == 0.0 and alpha == 1.0
        if base_alg == "H = 1":
            shape = {"local_steps": 1, "gossip": False}
        elif base_alg == "local SGD":
            shape = {"local_steps": localsgd_frequency, "gossip": False}
        else:  # SGP: gossip after every update the exact average does not cover
            shape = {"local_steps": slowmo_frequency, "gossip": True}
        slow = ({"slowmo_frequency": None} if plain else
                {"slowmo_frequency": slowmo_frequency, "slowmo_momentum": beta,
                 "slowmo_lr": alpha})
        for seed in seeds:
            configs.append(dataclasses.replace(base, seed=seed, **shape, **slow))
            labels.append({"base": base_alg, "slowmo": not plain, "slowmo_momentum": beta,
                           "slowmo_lr": alpha,
                           "variant": ("H = 1 (average every update)" if base_alg == "H = 1"
                                       else f"{base_alg} alone" if plain else
                                       f"{base_alg} + SlowMo β={beta:g}, α={alpha:g}")})
    return configs, labels


def slowmo_summary(records: pd.DataFrame) -> pd.DataFrame:
    """Final test accuracy and training loss per grid point (mean, std, seeds), and the paired
    (same seed) difference to local SGD alone."""
    keys = ["base", "slowmo", "slowmo_momentum", "slowmo_lr", "variant"]
    last = records.sort_values("step").groupby("run").tail(1)
    ref = last[(last.base == "local SGD") & ~last.slowmo].set_index("seed")
    last = last.assign(d_acc=last.test_acc - last.seed.map(ref.test_acc),
                       d_loss=last.train_loss - last.seed.map(ref.train_loss))
    out = last.groupby(keys, sort=False).agg(
        test_acc=("test_acc", "mean"), test_acc_sd=("test_acc", "std"),
        train_loss=("train_loss", "mean"), train_loss_sd=("train_loss", "std"),
        d_acc=("d_acc", "mean"), d_acc_sd=("d_acc", "std"), d_loss=("d_loss", "mean"),
        seeds=("seed", "nunique"), outer_steps=("outer_steps", "max"),
        syncs=("sync_l0", "max"), gossip_rounds=("gossip_rounds", "max")).reset_index()
    return out


BENCH_MODELS = ("resnet20", "mlp", "embedding")


def _mlp(width: int):
    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, width), nn.ReLU(),
                         nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))


class _BagOfTokens:
    """A byte-heavy, compute-light model (an embedding table, as in the NLP models the SlowMo page
    targets): 64 token ids per image from its pixels, mean of their embeddings, a linear head."""

    def __new__(cls, rows: int, dim: int = 256):
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(rows, dim)
                self.head = nn.Linear(dim, 10)

            def forward(self, x):
                ids = (x.flatten(1)[:, :64].abs() * 997).long() % rows
                return self.head(self.emb(ids).mean(1))

        torch.manual_seed(0)
        return Net()


def _bench_model(spec: dict):
    from localsgd.models import build_model

    if spec["model"] == "mlp":
        return _mlp(int(spec["width"]))
    if spec["model"] == "embedding":
        return _BagOfTokens(int(spec["width"]))
    return build_model(spec["model"], width=float(spec.get("width", 1.0)))


def _breakeven_worker(rank: int, world: int, port: int, specs: list[dict], frequency: int,
                      repeats: int, out_path: str) -> None:
    """One gloo process of `breakeven_benchmark`: times every phase with barriers around it."""
    import json
    import statistics
    import time

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    rows = []
    for spec in specs:
        torch.manual_seed(0)
        model = _bench_model(spec)
        local = _bench_model(spec)
        local.load_state_dict(model.state_dict())
        ddp = DDP(model)
        opt_ddp = torch.optim.SGD(ddp.parameters(), lr=0.01)
        opt_loc = torch.optim.SGD(local.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(rank)
        x = torch.randn(int(spec["batch"]), 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (int(spec["batch"]),), generator=g)
        loss_fn = nn.CrossEntropyLoss()
        params = [p for p in local.parameters()]
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        t = {k: [] for k in ("fwd", "bwd", "allreduce", "ddp_step", "local_step")}
        for rep in range(repeats + 1):  # the first repeat warms up (allocations, DDP buckets)
            dist.barrier()
            t0 = time.perf_counter()
            loss = loss_fn(local(x), y)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            opt_loc.zero_grad(set_to_none=True)
            dist.barrier()
            t3 = time.perf_counter()
            dist.all_reduce(flat)  # the model's bytes, one flat buffer
            t4 = time.perf_counter()
            dist.barrier()
            t5 = time.perf_counter()  # synchronous SGD: DDP overlaps bucketed all-reduce + bwd
            loss_fn(ddp(x), y).backward()
            opt_ddp.step()
            opt_ddp.zero_grad(set_to_none=True)
            t6 = time.perf_counter()
            dist.barrier()
            t7 = time.perf_counter()  # local SGD: f local updates, then average the parameters
            for _ in range(frequency):
                loss_fn(local(x), y).backward()
                opt_loc.step()
                opt_loc.zero_grad(set_to_none=True)
            with torch.no_grad():
                vec = torch.cat([p.reshape(-1) for p in params])
                dist.all_reduce(vec)
                vec /= world
                torch.nn.utils.vector_to_parameters(vec, params)
            t8 = time.perf_counter()
            if rep:
                for k, v in (("fwd", t1 - t0), ("bwd", t2 - t1), ("allreduce", t4 - t3),
                             ("ddp_step", t6 - t5), ("local_step", (t8 - t7) / frequency)):
                    t[k].append(v)
        med = {f"{k}_s": statistics.median(v) for k, v in t.items()}
        # the slowest rank decides a synchronous step: take the max of the medians over ranks
        vals = torch.tensor([med[k] for k in sorted(med)], dtype=torch.float64)
        dist.all_reduce(vals, op=dist.ReduceOp.MAX)
        med = dict(zip(sorted(med), vals.tolist(), strict=True))
        rows.append({**spec, "param_bytes": int(flat.numel() * flat.element_size()), **med})
    if rank == 0:
        with open(out_path, "w") as fh:
            json.dump(rows, fh)
    dist.barrier()
    dist.destroy_process_group()


def breakeven_benchmark(specs: Sequence[dict], *, world_size: int = 2, frequency: int = 3,
                        repeats: int = 8) -> pd.DataFrame:
    """Check the SlowMo page's break-even rule against steps measured here (gloo, CPU).

    The page (shared/seeds/001, "Best practices"): SlowMo over local SGD pays when
    ``t_allreduce · (1 − 1/localsgd_frequency) > t_backward``, from DDP's step being bound by
    max(t_backward, t_allreduce) (overlapped) and local SGD's by t_backward + t_allreduce/f
    (not overlapped). ``specs`` are dicts ``{"model": "resnet20"|"mlp"|"embedding", "width", "batch"}``
    (the MLP moves many bytes for moderate compute; "embedding" — a bag-of-tokens embedding
    table of ``width`` rows × 256 — many bytes for almost no compute). ``world_size`` processes
    each time, with barriers around every phase and medians over ``repeats``: a backward pass,
    an all-reduce of the model's bytes, a DDP step (gradient all-reduce overlapped with
    backward) and a local SGD step (f updates + one parameter all-reduce, per update). Returns
    one row per spec with the rule's prediction and the measured answer (``local_pays``: local
    step < DDP step), and the rule's own step models (``ddp_rule_model_s`` = fwd + max(bwd,
    all-reduce), ``local_rule_model_s`` = fwd + bwd + all-reduce/f) to set beside the measured
    steps.
    """
    import json
    import socket
    import tempfile

    import torch.multiprocessing as mp

    if world_size < 2:
        raise ValueError(f"world_size={world_size}: the rule needs >= 2 processes to all-reduce")
    for spec in specs:
        if spec.get("model") not in BENCH_MODELS or int(spec.get("batch", 0)) < 1:
            raise ValueError(f"spec {spec}: need model in {BENCH_MODELS}, width and batch >= 1")
    with socket.socket() as sock:  # a free port for the rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/rows.json"
        mp.start_processes(_breakeven_worker, args=(world_size, port, list(specs), frequency,
                                                    repeats, out),
                           nprocs=world_size, join=True,
                           # fork skips re-importing torch in every child (seconds on a loaded
                           # machine); spawn where fork does not exist
                           start_method="fork" if "fork" in mp.get_all_start_methods()
                           else "spawn")
        with open(out) as fh:
            df = pd.DataFrame(json.load(fh))
    df["world_size"], df["frequency"] = world_size, frequency
    df["rule_lhs_s"] = df.allreduce_s * (1 - 1 / frequency)
    df["rule_predicts_pays"] = df.rule_lhs_s > df.bwd_s
    df["local_pays"] = df.local_step_s < df.ddp_step_s
    df["rule_right"] = df.rule_predicts_pays == df.local_pays
    df["speedup_local"] = df.ddp_step_s / df.local_step_s
    # the rule's own step models (optimizer step left out, as the page does): how far off here
    df["ddp_rule_model_s"] = df.fwd_s + np.maximum(df.bwd_s, df.allreduce_s)
    df["local_rule_model_s"] = df.fwd_s + df.bwd_s + df.allreduce_s / frequency
    return df
