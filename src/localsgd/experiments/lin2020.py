"""Lin, Stich, Patel, Jaggi (2020), "Don't Use Large Mini-Batches, Use Local SGD" (§4, App. C,
D, F): configurations of its grids, its tables' models and the claim checks beside them.

Grids run through `localsgd.experiments.grid.run_grid` (cached); time axes, speed-ups and
verdicts are `localsgd.experiments.grid`'s. Here: Figure 7's scaling table, App. D's momentum
schemes, Table 1's grid, Table 2's fitted cost model (and why barrier waits cannot explain its
rise), Table 4's parameter and flop counts, Table 5's step costs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy.optimize import nnls
from torch import nn

from localsgd.experiments.grid import time_to_accuracy
from localsgd.models import build_model, count_flops, count_params
from localsgd.results import repo_root
from localsgd.timing.cluster import Cluster
from localsgd.timing.comm import sync_rounds
from localsgd.timing.simulate import Scheme, run_clocks
from localsgd.train import TrainConfig

__all__ = [
    "FLOPS",
    "MACS",
    "TABLE02_SETTING",
    "TABLE4",
    "Table02Fit",
    "barrier_time_per_update",
    "fit_step_costs",
    "momentum_config",
    "printed_rel_tol",
    "reported_table4",
    "resnet20_param_bytes",
    "resnet50_v1_strides",
    "scaling_table",
    "step_costs_from_running_times",
    "table01_configs",
    "table02_fit",
    "table02_reported",
    "table04",
    "update_and_sync_counts",
]


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


# ----------------------------------------------------------------------------------------------
# Table 2 (§4.3): training time over H on the 8×2-GPU cluster, and a fitted cost model
# ----------------------------------------------------------------------------------------------

# Table 2's setting (§4.3 and its caption): ResNet-20, all of CIFAR-10, K = 16 (8 nodes × 2 GPUs),
# B_loc = 128, H^b = 1, "the equivalent of 300 epochs"
TABLE02_SETTING = {"epochs": 300, "n_train": 50_000, "workers": 16, "gpus_per_node": 2,
                   "batch": 128, "inter_gbps": 10.0}


def table02_reported(papers_dir: str | None = None) -> pd.DataFrame:
    """Table 2 as transcribed in ``papers/lin2020_local_sgd/reported.csv``: columns H, minutes."""
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
    count (`localsgd.timing.comm.sync_rounds`) with H^b = 1 (Table 2: 7,324 updates, 7,325 … 8
    rounds).
    """
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
        """`localsgd.experiments.grid.with_time` arguments that price a run with the fitted
        costs (every sync at sync_s)."""
        return {"compute_seconds_per_step": self.compute_s, "sync_seconds": self.sync_s}

    def cluster(self, *, gpus_per_node: int = 2, inter_gbps: float = 10.0,
                intra_gbps: float = 100.0, world_size: int = 16) -> Cluster:
        """A `Cluster` whose world all-reduce of ResNet-20's bytes costs ``sync_s``.

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
    ends when the slowest worker finishes its H updates, then costs ``sync_s``: the per-worker
    clocks of the wall-clock simulator (`localsgd.timing.simulate.run_clocks`) on local SGD's
    plan, with a barrier after the last, possibly partial, round too.

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
    plans = []
    for h in hs:
        plan = {k: v.copy() for k, v in Scheme.local(int(h)).plan(workers, 1, updates).items()}
        plan["avg"][-1] = workers  # the last round ends at a barrier even when it is partial
        plans.append(plan)
    avg_cost = np.zeros((len(plans), workers + 1))
    avg_cost[:, workers] = sync_s  # a world average costs sync_s; there are no other groups
    res = run_clocks(plans, x.T, np.zeros_like(avg_cost), avg_cost, 0.0, 0.0, updates)
    return pd.DataFrame({"H": [int(h) for h in hs],
                         "seconds_per_update": res["clock"].max(axis=1) / updates,
                         "wait_per_update": res["wait"].mean(axis=1) / updates})


# ----------------------------------------------------------------------------------------------
# Table 4 (App. F.1): parameters and flops per image of the paper's models
# ----------------------------------------------------------------------------------------------

# model → (Table 4's name, [(dataset, classes, input shape)])
TABLE4 = {
    "resnet20": ("ResNet-20", [("CIFAR-10", 10, (3, 32, 32)), ("CIFAR-100", 100, (3, 32, 32))]),
    "resnet50": ("ResNet-50", [("ImageNet-1k", 1000, (3, 224, 224))]),
    "densenet40_12": ("DenseNet-40-12",
                      [("CIFAR-10", 10, (3, 32, 32)), ("CIFAR-100", 100, (3, 32, 32))]),
    "wrn28_10": ("WideResNet-28-10",
                 [("CIFAR-10", 10, (3, 32, 32)), ("CIFAR-100", 100, (3, 32, 32))]),
}
MACS = "multiply-adds (MACs)"
FLOPS = "FLOPs (2 per multiply-add)"


def resnet50_v1_strides(model: nn.Module) -> nn.Module:
    """Move torchvision ResNet-50's downsampling stride from each bottleneck's 3×3 conv to its
    first 1×1 conv, as in He et al. (2016a)'s original ("v1"); parameters are unchanged. Used
    only to explain Table 4's ResNet-50 flop count."""
    for layer in (model.layer2, model.layer3, model.layer4):
        first = layer[0]
        first.conv1.stride, first.conv2.stride = first.conv2.stride, (1, 1)
    return model


def reported_table4(papers_dir: str | Path | None = None) -> pd.DataFrame:
    """Table 4 as transcribed in ``papers/lin2020_local_sgd/reported.csv``, one row per setting.

    Columns are the three metrics (floats) and, per metric, ``<metric> decimals``: the digits
    the paper prints, so a count can be checked "to the printed precision".
    """
    papers = Path(papers_dir) if papers_dir is not None else repo_root() / "papers"
    raw = pd.read_csv(papers / "lin2020_local_sgd" / "reported.csv", dtype=str,
                      keep_default_na=False)
    raw = raw[raw.artifact == "Table 4"]
    values = raw.pivot(index="setting", columns="metric", values="value")
    out = values.astype(float)
    for metric in values.columns:
        out[f"{metric} decimals"] = values[metric].map(
            lambda v: len(v.split(".")[1]) if "." in v else 0)
    return out


def printed_rel_tol(value: float, decimals: int) -> float:
    """Relative tolerance of "equal to the printed precision": half a unit in the last digit."""
    return 0.5 * 10.0 ** -decimals / abs(value)


def table04(models: Sequence[str] | None = None,
            papers_dir: str | Path | None = None) -> pd.DataFrame:
    """Our counts beside App. F.1 Table 4: one row per model and dataset.

    Columns: ``params``, ``flops`` (FlopCounterMode, one image, 2 per multiply-add), ``macs``
    (= flops / 2), the paper's three numbers, ``convention`` (MACs or FLOPs: whichever is closer
    to the paper's "flops per image"), ``flops_per_image_billion`` (ours in that convention),
    ``ratio`` (flops per image / parameters in billion / million, Table 4's last column), and
    ``params_rel_tol``/``flops_rel_tol``: half a unit of the paper's last printed digit, relative.
    Models are built on the meta device, so even WRN-28-10 and ResNet-50 count in a second.
    """
    paper = reported_table4(papers_dir)
    rows = []
    for name in models if models is not None else list(TABLE4):
        if name not in TABLE4:
            raise ValueError(f"unknown model {name!r}; Table 4 has {', '.join(TABLE4)}")
        label, datasets = TABLE4[name]
        for dataset, classes, shape in datasets:
            with torch.device("meta"):  # shapes only: no weights allocated, no compute
                model = build_model(name, num_classes=classes)
            params, flops = count_params(model), count_flops(model, shape)
            macs = flops // 2
            setting = f"model={label}; dataset={dataset}"
            p = paper.loc[setting]
            p_flops = p["flops per image"]
            # the convention whose count is closer (relatively) to the printed number
            err_macs, err_flops = abs(macs / 1e9 / p_flops - 1), abs(flops / 1e9 / p_flops - 1)
            convention, ours = (MACS, macs) if err_macs <= err_flops else (FLOPS, flops)
            note = ""
            if name == "resnet50":
                v1 = count_flops(resnet50_v1_strides(model), shape)
                note = (f"torchvision is ResNet-50 v1.5 (stride on the 3x3 conv); with the "
                        f"original v1 strides: {v1 / 1e9:.3f} B FLOPs = {v1 / 2e9:.3f} B MACs")
            rows.append({
                "model": label, "dataset": dataset, "setting": setting, "name": name,
                "num_classes": classes, "input_shape": "x".join(map(str, shape)),
                "params": params, "flops": flops, "macs": macs,
                "paper_params_million": p["parameters"], "paper_flops_billion": p_flops,
                "paper_ratio": p["computation/communication scaling ratio"],
                "params_million": params / 1e6, "convention": convention,
                "flops_per_image_billion": ours / 1e9,
                "ratio": (ours / 1e9) / (params / 1e6) * 1000,  # billion / million, as printed
                "params_rel_tol": printed_rel_tol(p["parameters"], p["parameters decimals"]),
                "flops_rel_tol": printed_rel_tol(p_flops, p["flops per image decimals"]),
                "note": note,
            })
    df = pd.DataFrame(rows)
    df["params_match"] = ((df.params_million / df.paper_params_million - 1).abs()
                          <= df.params_rel_tol)
    df["flops_match"] = ((df.flops_per_image_billion / df.paper_flops_billion - 1).abs()
                         <= df.flops_rel_tol)
    return df


# --------------------------------------------------------------------------------------- claims
# One function per artifact turns its measured table into compare rows (`claims.claim_row`) with
# a verdict by the one seed-spread rule (`claims.verdict`); tests/test_claims_lin2020*.py feed
# them hand-made records.

# --- claims: Tables 1, 5, 6-7 ---

# --- claims: Figures 6, 7, 9 and Table 3 ---

# --- claims: Table 2 and Table 4 ---
