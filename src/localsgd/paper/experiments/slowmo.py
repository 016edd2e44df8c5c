"""SlowMo (fairscale's SlowMoDistributedDataParallel documentation page): the quality grid over
local SGD and SGP, its summary and the page's three claims as compare rows (`slowmo_claims`); the
page's break-even rule is measured by `localsgd.paper.bench.breakeven`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import pandas as pd

from localsgd.paper.experiments import claims
from localsgd.paper.experiments.grid import base_config
from localsgd.training.config import TrainConfig

__all__ = ["APPROX_CLAIM", "base", "breakeven_table", "cluster_approx_rows",
           "cluster_approx_table", "configs", "final_records", "slowmo_claims",
           "slowmo_configs", "slowmo_summary", "variant_order"]

SYNC_VARIANT = "H = 1 (average every update)"
LOCAL_ALONE = "local SGD alone"
# the break-even table's columns the notebook shows
BREAKEVEN_COLUMNS = ["spec", "param_bytes", "fwd_s", "bwd_s", "allreduce_s", "rule_lhs_s",
                     "ddp_rule_model_s", "ddp_step_s", "local_rule_model_s", "local_step_s",
                     "speedup_local", "rule_predicts_pays", "local_pays", "rule_right"]
SGP_ALONE = "SGP alone"


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



def base(P) -> TrainConfig:
    """The grid's base run: the notebook's parameters as a `TrainConfig` (`grid.base_config`)
    with its lr ``P.lr``."""
    return base_config(P, lr=P.lr)


def configs(P, seeds: Sequence[int]) -> tuple[list[TrainConfig], list[dict]]:
    """The notebook's grid from its parameters ``P``: `slowmo_configs` over `base` with the
    page's frequencies and ``P``'s momenta and slow lrs, with the H = 1 reference;
    (configs, labels)."""
    return slowmo_configs(
        base(P), localsgd_frequency=P.localsgd_frequency, slowmo_frequency=P.slowmo_frequency,
        momenta=P.slowmo_momenta, slow_lrs=P.slow_lrs, sgp_momenta=P.sgp_momenta, seeds=seeds,
        slow_lr_momentum=P.slow_lr_momentum, sync_reference=True)

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


def final_records(records: pd.DataFrame) -> pd.DataFrame:
    """Each run's last record (one row per grid point and seed) with how far its test accuracy
    moved over its last tenth (`claims.final_rows`)."""
    return claims.final_rows(records)


def variant_order(summary: pd.DataFrame) -> list[str]:
    """Variants in plotting order: H = 1, local SGD, SGP; alone before SlowMo; by α, β."""
    rank = {"H = 1": 0, "local SGD": 1, "SGP": 2}
    return list(summary.assign(_r=summary.base.map(rank), _s=summary.slowmo.astype(int))
                .sort_values(["_r", "_s", "slowmo_lr", "slowmo_momentum"]).variant)


def breakeven_table(be: pd.DataFrame) -> pd.DataFrame:
    """`localsgd.paper.bench.breakeven.breakeven_benchmark`'s rows with a ``spec`` label and
    ``overlap_saved_s`` (fwd + bwd + all-reduce minus the measured DDP step: what DDP's overlap
    of the gradient all-reduce with backward saved)."""
    if not len(be):
        return be
    return be.assign(spec=[f"{r.model} w{r.width:g} B{r.batch}" for r in be.itertuples()],
                     overlap_saved_s=be.fwd_s + be.bwd_s + be.allreduce_s - be.ddp_step_s)


def _paired(final: pd.DataFrame, a: str, b: str) -> list[float]:
    """Per-seed test-accuracy differences ``a`` minus ``b`` (same seed: same data order and
    initialisation), over the seeds both variants ran."""
    acc = final.pivot_table(index="seed", columns="variant", values="test_acc")
    if a not in acc or b not in acc:
        return []
    return list((acc[a] - acc[b]).dropna())


def _best(final: pd.DataFrame, mask: pd.Series) -> str | None:
    """The variant with the highest mean test accuracy among ``mask`` (None if none ran)."""
    means = final[mask].groupby("variant").test_acc.mean().dropna()
    return None if means.empty else str(means.idxmax())


def _parts(outcome_parts: list[tuple[str, claims.Verdict]], extra: str = "") -> str:
    """A multi-part claim's verdict: the combined outcome, then each part's own verdict."""
    text = "; ".join(f"{name}: {v}" for name, v in outcome_parts)
    return f"{claims.combine([v for _, v in outcome_parts])}: {text}{extra}"


SLOWMO_ORIGIN = "the page's: 'reduce model quality' / 'alleviates', any difference"


def _regime(final: pd.DataFrame, a: str, b: str) -> claims.Verdict | None:
    """`claims.regime` of variants ``a`` and ``b`` (their final records over seeds)."""
    return claims.regime({a: final[final.variant == a], b: final[final.variant == b]})


def quality_verdict(final: pd.DataFrame) -> str:
    """Overview: "the base algorithms alone reduce model quality; SlowMo alleviates it". Per
    base algorithm that ran alone, two parts, each a per-seed paired test-accuracy difference
    against the threshold 0: H = 1 minus the base alone (> 0: the base loses quality) and the
    best SlowMo variant over that base minus the base alone (> 0: SlowMo restores some; best by
    mean over seeds, selection not corrected).

    The second part rests on the first: where the base's loss is not established (its part is
    inconclusive or did not hold), there is nothing shown to restore, so the restoration part is
    *not testable* (its measured difference is kept in the reason) and cannot decide the claim."""
    parts: list[tuple[str, claims.Verdict]] = []
    for base, alone in (("local SGD", LOCAL_ALONE), ("SGP", SGP_ALONE)):
        if alone not in set(final.variant):
            continue
        premise = None
        if SYNC_VARIANT in set(final.variant):
            premise = _regime(final, SYNC_VARIANT, alone) or claims.verdict(
                _paired(final, SYNC_VARIANT, alone), 0.0, unit=" points",
                what=f"H = 1 minus {alone}", origin=SLOWMO_ORIGIN)
            parts.append((f"{alone} loses quality", premise))
        mask = (final.base == base) & final.slowmo
        best = _best(final, mask)
        if best is None:
            continue
        n = final[mask].variant.nunique()
        restored = _regime(final, best, alone) or claims.verdict(
            _paired(final, best, alone), 0.0, unit=" points", what=f"best SlowMo minus {alone}",
            origin=SLOWMO_ORIGIN)
        if premise is not None and premise.outcome in (claims.INCONCLUSIVE, claims.NOT_HELD,
                                                       claims.NOT_IN_REGIME):
            restored = claims.not_testable(
                f"{alone} is not shown to lose quality ({premise.outcome}), so nothing is "
                f"shown to restore; measured {restored.reason}", what=f"best SlowMo minus {alone}")
        parts.append((f"SlowMo restores {base} (best of {n}: {best})", restored))
    if not parts:
        return str(claims.verdict([], 0.0, what="paired test-accuracy difference",
                                  origin=SLOWMO_ORIGIN))
    return _parts(parts, " (test top-1, paired by seed; the best SlowMo setting is selected, "
                         "not corrected for the selection)")


def grid_verdict(final: pd.DataFrame, K: int) -> tuple[float, str]:
    """Best practices: (best β on the local-SGD grid at α = 1 by mean test accuracy, verdict).
    The claim "{0.0, 0.1, 0.2, 0.4, 0.6} is enough (larger β with more nodes)" needs values
    outside the grid and a sweep over the number of nodes; one K cannot decide it, so the
    outcome is inconclusive at this scale, with the per-seed best β as evidence."""
    grid = final[(final.base == "local SGD") & (final.slowmo_lr == 1.0)]
    if not len(grid):
        return math.nan, str(claims.verdict([], 0.0, what="test accuracy on the β grid",
                                            origin=claims.ours("none: no run")))
    mean = grid.groupby("slowmo_momentum").test_acc.mean().dropna()
    if mean.empty:
        return math.nan, str(claims.verdict([], 0.0, what="test accuracy on the β grid",
                                            origin=claims.ours("none: no run")))
    best_beta = float(mean.idxmax())
    per_seed = grid.dropna(subset=["test_acc"])
    per_seed = per_seed.loc[per_seed.groupby("seed").test_acc.idxmax()].slowmo_momentum
    reason = (f"best β on the grid at K = {K}: {best_beta:g} (mean test top-1 by β: "
              + ", ".join(f"{b:g}: {a:.1f}" for b, a in mean.items())
              + f"; best β per seed: {', '.join(f'{b:g}' for b in per_seed)}); the page's "
              "'larger β with more nodes' needs a sweep over K (not run)")
    v = claims.Verdict(claims.INCONCLUSIVE, best_beta, math.nan, int(grid.seed.nunique()), reason)
    return best_beta, str(v)


def breakeven_verdict(be: pd.DataFrame, procs: int, cores: int | None = None) -> str:
    """Best practices: "SlowMo pays when t_allreduce (1 - 1/f) > t_backward". Per timed model
    the rule predicts pays / does not pay; the claim for it is measured DDP step / local-SGD step
    >= 1 (resp. <= 1). Each step time is the median over the benchmark's repeats, a measurement
    taken as stable (``deterministic=True``; the benchmark keeps no per-repeat times). The rule
    weighs the all-reduce against the backward it overlaps, so with ``procs`` filling the
    machine's ``cores`` it is not testable at this scale (`claims.overlap_premise`)."""
    if not len(be):
        return str(claims.Verdict(claims.NOT_MEASURABLE, math.nan, math.nan, 0,
                                  "not measured in this mode (breakeven = False)"))
    premise = claims.overlap_premise(procs, cores, what="DDP step / local-SGD step")
    parts = [(f"{r.spec} (rule: {'pays' if r.rule_predicts_pays else 'does not pay'})",
              premise or claims.verdict(r.speedup_local, 1.0, higher_is_better=bool(r.rule_predicts_pays),
                             deterministic=True, unit="x", what="DDP step / local-SGD step",
                             origin="the page's: its rule says SlowMo pays past 1"))
             for r in be.itertuples()]
    extra = (f"; rule right in {int(be.rule_right.sum())} of {len(be)} settings; {procs} gloo "
             "processes on a shared CPU: the measured DDP step is "
             + ", ".join(f"{r.ddp_step_s / r.ddp_rule_model_s:.1f}x" for r in be.itertuples())
             + " the rule's fwd + max(bwd, all-reduce), i.e. DDP's overlap saved "
             + ", ".join(f"{s * 1e3:.0f} ms" for s in be.overlap_saved_s))
    return _parts(parts, extra)


def slowmo_claims(records: pd.DataFrame, be: pd.DataFrame, *, mode: str, K: int,
                  slowmo_frequency: int, breakeven_procs: int,
                  cores: int | None = None) -> list[dict]:
    """The page's claims as compare rows (keys of ``papers/fairscale_slowmo/reported.csv``):
    "Overview" (base algorithms lose quality, SlowMo restores it: `quality_verdict`), "Best
    practices" β grid (`grid_verdict`) and the break-even rule (`breakeven_verdict`).
    ``records``: the grid's training records (per seed, `slowmo_configs` labels); ``be``:
    `breakeven_table` (empty when not timed)."""
    final = final_records(records)
    best_beta, grid_text = grid_verdict(final, K)
    return [
        claims.claim_row(
            "Overview", "slow momentum step", "slowmo_frequency (typical)", slowmo_frequency,
            unit="iterations",
            claim="local SGD / SGP alone lose model quality; a slow momentum step restores it",
            verdict=quality_verdict(final), note=f"{mode}: ours uses slowmo_frequency "
            f"{slowmo_frequency}"),
        claims.claim_row(
            "Best practices", "slowmo_momentum grid; i=1", "slowmo_momentum", best_beta,
            claim="a grid search over {0.0, 0.1, 0.2, 0.4, 0.6} is enough", verdict=grid_text,
            note=f"{mode}: value = the best beta on our grid"),
        claims.claim_row(
            "Best practices", "when SlowMo pays", "all-reduce time coefficient", None,
            claim="SlowMo pays when t_allreduce (1 - 1/localsgd_frequency) > t_backward",
            verdict=breakeven_verdict(be, breakeven_procs, cores),
            note=f"{mode}: CPU gloo timings, not a GPU cluster"),
    ]


def figure_data(records: pd.DataFrame, be: pd.DataFrame) -> pd.DataFrame:
    """The figure's data file: training records (``kind`` "train") and break-even rows."""
    data = records.assign(kind="train")
    return pd.concat([data, be.assign(kind="breakeven")], ignore_index=True) if len(be) else data


def plot_breakeven(ax, be: pd.DataFrame, *, procs: int, frequency: int) -> None:
    """The break-even panel: the rule's ratio (> 1: SlowMo pays) against the measured one."""
    from matplotlib.ticker import NullFormatter  # deferred: only the plots need matplotlib

    x = be.rule_lhs_s / be.bwd_s
    ax.scatter(x, be.speedup_local, s=60)
    for xi, yi, name in zip(x, be.speedup_local, be.spec, strict=True):
        ax.annotate(name, (xi, yi), fontsize=8, xytext=(4, 4), textcoords="offset points")
    ax.axvline(1, color="grey", ls=":")
    ax.axhline(1, color="grey", ls=":")
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())  # log axis: label decades only
    ax.set(xlabel="rule: t_allreduce·(1 − 1/f) / t_backward  (> 1: SlowMo pays)",
           ylabel="measured DDP step / local-SGD step  (> 1: pays)",
           title=f"break-even rule, {procs} gloo processes, f = {frequency}")


# ----------------------------------------------------------------------------------------------
# The overview's "approximate averaging cuts communication and synchronisation", measured on
# the emulated cluster (slowmo_cluster; ``localsgd bench cluster --figure approx``)
# ----------------------------------------------------------------------------------------------
APPROX_CLAIM = ("replacing the exact gradient all-reduce with approximate parameter averaging "
                "cuts communication and synchronisation time")


def cluster_approx_table(measured: pd.DataFrame) -> pd.DataFrame:
    """Per repeat and run (``ddp``, ``slowmo``): the workers' mean seconds per update waiting,
    communicating, both, and in all."""
    claims.check_measured(measured, {"run", "repeat", "rank", "wait_s", "comm_s", "step_s"},
                          "the SlowMo measurements", "approx")
    tab = measured.groupby(["repeat", "run"], as_index=False)[["wait_s", "comm_s", "step_s"]].mean()
    return tab.assign(sync_s=tab.wait_s + tab.comm_s)


def cluster_approx_rows(measured: pd.DataFrame) -> list[dict]:
    """The claim's row: per repeat, DDP's waiting + communicating seconds per update over
    SlowMo's (over local SGD), held when the one-sided bound clears 1 (any cut)."""
    tab = cluster_approx_table(measured)
    wide = tab.pivot(index="repeat", columns="run", values="sync_s")
    if not {"ddp", "slowmo"} <= set(wide.columns):
        return []
    ratios = (wide["ddp"] / wide["slowmo"]).dropna().tolist()
    step = tab.pivot(index="repeat", columns="run", values="step_s")
    link = claims.measured_link(measured)
    v = claims.verdict(ratios, 1.0, unit="x", over="repeats",
                       what="DDP's waiting + communicating time per update / SlowMo's",
                       origin=claims.ours("'cuts': any cut, a ratio above 1"))
    return [claims.claim_row(
        "Overview", f"DDP vs SlowMo over local SGD, 2 nodes x 2, {claims.link_key(link)}",
        "sync time ratio", sum(ratios) / len(ratios) if ratios else None, unit="x",
        claim=APPROX_CLAIM, verdict=v,
        note=f"emulated cluster: localsgd_frequency 3, slow step every 48, random stalls; time "
             f"per update DDP / SlowMo {float((step['ddp'] / step['slowmo']).mean()):.3g}x; "
             "waiting and communicating split from each worker's stamps")]
