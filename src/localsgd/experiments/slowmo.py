"""SlowMo (fairscale's SlowMoDistributedDataParallel page, shared/seeds/001): the quality grid
over local SGD and SGP and its summary; the page's break-even rule is measured by
`localsgd.bench.breakeven`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pandas as pd

from localsgd.train import TrainConfig

__all__ = ["slowmo_configs", "slowmo_summary"]


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
