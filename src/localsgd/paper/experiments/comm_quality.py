"""Communication against quality (beyond the sources): local SGD, DiLoCo (a Nesterov outer step,
Douillard et al. 2023), streaming DiLoCo (fragments averaged in turn, each merged τ updates after
its launch, Douillard et al. 2025) and model averages sent as compressed codes with error
feedback (`localsgd.compression`), on one CIFAR-10 task and the same seeds. Per variant: the
final test top-1, the bytes each worker sends, and the time to a target accuracy the timing model
gives at each link bandwidth; the verdict rule (`claims`) for "each variant matches its exact
counterpart within half a point"."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pandas as pd

from localsgd.compression import wire_bytes
from localsgd.paper.experiments import claims
from localsgd.paper.experiments.grid import base_config
from localsgd.timing.cluster import Cluster
from localsgd.timing.scheme import Scheme
from localsgd.timing.simulate import simulate
from localsgd.training.config import TrainConfig

__all__ = ["ARTIFACT", "DILOCO", "LOCAL", "MATCH_POINTS", "comm_claims", "configs", "paired",
           "summary", "time_to_target", "variants"]

ARTIFACT = "Communication vs quality"
LOCAL, DILOCO = "local SGD", "DiLoCo"
# our tolerance for "matches": a difference a reader of a CIFAR-10 table would call a match
MATCH_POINTS = 0.5
MATCH_ORIGIN = claims.ours("half a point of test top-1, about the seed-to-seed sd of the "
                           "converged proxy's final accuracies: a smaller gap could not be told "
                           "from seed noise with a few seeds")


def variants(P) -> dict[str, dict]:
    """Each variant's `TrainConfig` fields over the base run (local SGD with H = ``P.H`` and
    the recipe's local momentum): DiLoCo adds a Nesterov outer step on the world average
    (``P.outer_lr``, ``P.outer_momentum``), streaming DiLoCo averages it in ``P.fragments``
    fragments merged ``P.overlap`` updates after their launch, and each format of
    ``P.formats`` sends local SGD's averages as codes with error feedback."""
    diloco = {"momentum_scheme": "hybrid", "global_momentum": P.outer_momentum,
              "global_lr": P.outer_lr, "global_nesterov": True}
    # local SGD and its codes first: a converged grid cut short keeps their pairs whole
    out = {LOCAL: {}, **{f"{fmt} averages": {"average_compression": fmt} for fmt in P.formats},
           DILOCO: diloco, f"streaming DiLoCo (P = {P.fragments}, τ = {P.overlap})": {
               **diloco, "fragments": P.fragments, "overlap_steps": P.overlap}}
    return out


def configs(P, seeds: Sequence[int]) -> tuple[list[TrainConfig], list[dict]]:
    """The grid: every variant of `variants` for every seed (paired: the same seed is the same
    data order and initial model); (configs, labels)."""
    base = base_config(P, lr=P.lr, local_steps=P.H)
    out, labels = [], []
    for name, fields in variants(P).items():
        for seed in seeds:
            cfg = dataclasses.replace(base, seed=seed, **fields)
            out.append(cfg)
            labels.append({"variant": name, "format": cfg.average_compression,
                           "fragments": cfg.fragments})
    return out, labels


def _sent_mb(row: pd.Series, updates: int, H: int, K: int) -> float:
    """MB one worker sends in a run: a global average every H updates (each fragment once
    in H updates: the same bytes in all), each as `compressed_average` or a ring all-reduce
    moves them: 2 (K - 1) / K of the (encoded) model."""
    n = int(row.param_bytes) // 4  # float32 parameters
    per_average = 2 * (K - 1) / K * wire_bytes(n, row.format, K) if K > 1 else 0.0
    return updates // H * per_average / 1e6


def summary(final: pd.DataFrame, H: int, K: int) -> pd.DataFrame:
    """Per variant: final test top-1 (mean, sd, seeds), its paired difference to local SGD
    (mean over seeds), and the MB each worker sent."""
    final = final.assign(sent_mb=[_sent_mb(r, int(r.step), H, K) for _, r in final.iterrows()])
    ref = final[final.variant == LOCAL].set_index("seed").test_acc
    final = final.assign(d_acc=final.test_acc - final.seed.map(ref))
    return final.groupby("variant", sort=False).agg(
        test_acc=("test_acc", "mean"), test_acc_sd=("test_acc", "std"),
        d_acc=("d_acc", "mean"), seeds=("seed", "nunique"), sent_mb=("sent_mb", "mean"),
        tail_move=("tail_move", "max")).reset_index()


def time_to_target(runs: pd.DataFrame, configs_: Sequence[TrainConfig], labels: Sequence[dict],
                   gbps: Sequence[float], target: float) -> pd.DataFrame:
    """Modelled seconds to reach ``target`` % test top-1, per variant, seed and bandwidth: the
    timing model (`localsgd.timing.simulate`, one worker per node on links of each ``gbps``, no
    stragglers) prices each run's schedule (`Scheme.from_train_config`) with its measured compute
    per update and its model's bytes in its format; the first record at or above the target
    gives the share of the run's updates spent. NaN where a run never reaches it."""
    rows = []
    for i, (cfg, label) in enumerate(zip(configs_, labels, strict=True)):
        rec = runs[runs.run == i].sort_values("step")
        updates = int(rec.step.max())
        reached = rec[rec.test_acc >= target]
        steps_per_epoch = max(1, round(updates / float(rec.epoch.max())))
        step_ms = 1e3 * float(rec.compute_seconds.max()) / updates
        for g in gbps:
            seconds = float(simulate(
                [Scheme.from_train_config(cfg, steps_per_epoch, updates=updates)], workers=cfg.world_size,
                steps=updates, cluster=Cluster(gpus_per_node=1, inter_gbps=g),
                compute_ms=step_ms, model_mb=float(rec.param_bytes.iloc[0]) / 1e6,
                average_compression=cfg.average_compression,
                compression_density=cfg.compression_density, baseline=False).seconds.iloc[0])
            at = float(reached.step.iloc[0]) / updates * seconds if len(reached) else float("nan")
            rows.append({"variant": label["variant"], "seed": cfg.seed, "gbps": g,
                         "run_seconds": seconds, "seconds_to_target": at})
    return pd.DataFrame(rows)


def paired(final: pd.DataFrame, a: str, b: str) -> list[float]:
    """Per-seed final test top-1 differences ``a`` minus ``b`` (seeds both ran)."""
    acc = final.pivot_table(index="seed", columns="variant", values="test_acc")
    if a not in acc or b not in acc:
        return []
    return list((acc[a] - acc[b]).dropna())


def match_verdict(final: pd.DataFrame, a: str, b: str) -> claims.Verdict:
    """"``a`` matches ``b`` within `MATCH_POINTS`": the regime check of both, then the paired
    (by seed) difference of final test top-1, a minus b, on both sides: it holds when the
    one-sided 95 % bounds lie inside ±`MATCH_POINTS`, fails when either lies outside on its
    own side, and is inconclusive otherwise."""
    stop = claims.regime({a: final[final.variant == a], b: final[final.variant == b]})
    if stop is not None:
        return stop
    what = f"{a} minus {b} (test top-1)"
    diffs = paired(final, a, b)
    sides = [claims.verdict(diffs, -MATCH_POINTS, unit=" points", what=what,
                            origin=MATCH_ORIGIN),
             claims.verdict(diffs, MATCH_POINTS, unit=" points", what=what,
                            origin=MATCH_ORIGIN, higher_is_better=False)]
    for outcome in (claims.NOT_HELD, claims.NOT_MEASURABLE, claims.INCONCLUSIVE):
        for side in sides:
            if side.outcome == outcome:
                return side
    v = sides[0]
    return dataclasses.replace(v, reason=(
        f"{what} {v.mean:+.3g} points ± {v.sd:.2g} points sd over {v.seeds} seeds, one-sided 95 % "
        f"bounds {v.low:+.3g} and {v.high:+.3g} points (t), both inside ±{MATCH_POINTS:g} points "
        f"({MATCH_ORIGIN})"))


def comm_claims(final: pd.DataFrame, *, mode: str, names: Sequence[str]) -> list[dict]:
    """This project's claims as compare rows: each compressed format's averages match local
    SGD's exact ones, DiLoCo matches local SGD, and streaming DiLoCo matches DiLoCo, each
    within `MATCH_POINTS` of test top-1."""
    rows = []
    pairs = [(name, LOCAL) for name in names if name.endswith(" averages")]
    pairs += [(DILOCO, LOCAL)] + [(name, DILOCO) for name in names
                                  if name.startswith("streaming")]
    pairs = [(a, b) for a, b in pairs if a in names and b in names]
    for a, b in pairs:
        v = match_verdict(final, a, b)
        diffs = paired(final, a, b)  # the tested quantity, also where the regime check decides
        mean = sum(diffs) / len(diffs) if diffs else None
        claim = (f"local SGD with {a.removesuffix(' averages')} averages (error feedback) "
                 f"matches exact averages within {MATCH_POINTS:g} points"
                 if a.endswith(" averages") else
                 f"{a} matches {b} within {MATCH_POINTS:g} points")
        rows.append(claims.claim_row(
            ARTIFACT, f"{a} vs {b}", "test top-1 difference", mean, unit="points",
            claim=claim, verdict=v, note=f"{mode}: paired by seed, final records",
            tested=claims.tested_text([] if mean is None else [mean], " points")))
    return rows
