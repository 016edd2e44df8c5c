"""Figure 7 (§4.2.1): how local SGD and mini-batch SGD scale over K = 2 … 16 workers on the
8×2-GPU cluster — its grid (`configs`) and its two claims (`fig07_claims`) on the per-seed rows
of `common.scaling_table`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pandas as pd

from localsgd.paper.experiments import claims
from localsgd.paper.experiments.grid import base_config
from localsgd.paper.experiments.lin2020.common import paired_by_seed, seed_values
from localsgd.train import TrainConfig

__all__ = ["configs", "fig07_claims"]


def configs(P, seeds: Sequence[int]) -> list[TrainConfig]:
    """Figure 7's grid (§4.2.1): the notebook's base run (`grid.base_config`) at every K of
    ``P.Ks``, H of ``P.Hs`` and seed."""
    base = base_config(P)
    return [dataclasses.replace(base, world_size=k, local_steps=h, seed=s)
            for k in P.Ks for h in P.Hs for s in seeds]


def fig07_claims(tta: pd.DataFrame, *, Ks: Sequence[int], Hs: Sequence[int],
                 note: str = "") -> list[dict]:
    """Figure 7 (§4.2.1) from `scaling_table`'s per-seed rows: (1) "local SGD scales 2× better
    than mini-batch SGD in time": per seed, the speed-up at the largest K of H = 8 (else the
    largest H) over that of H = 1, ≥ 2; (2) "H = 8 on 8 GPUs reaches the target in half the
    time of mini-batch SGD on 16": per seed, time(K=16, H=1) / time(K=8, H=8) ≥ 2 (a seed that
    never reached the target drops out; none left is "not measurable")."""

    rows = []
    k_max, h_local = max(Ks), (8 if 8 in Hs else max(Hs))
    if 1 in Hs and h_local != 1:
        adv = paired_by_seed(
            seed_values(tta, "speedup", world_size=k_max, local_steps=h_local),
            seed_values(tta, "speedup", world_size=k_max, local_steps=1), "/")
        v = claims.verdict(adv, 2.0, unit="x", what=f"speed-up ratio H = {h_local} / H = 1")
        rows.append(claims.claim_row(
            "Figure 7", "local SGD vs mini-batch SGD", "scaling advantage", v.mean, unit="x",
            note=note, claim="local SGD scales 2x better than mini-batch SGD in time",
            verdict=f"{v} (speed-up at K = {k_max}: H = {h_local} over H = 1)"))
    if 8 in Ks and 16 in Ks and 8 in Hs and 1 in Hs:
        ratio = paired_by_seed(
            seed_values(tta, "time_to_target", world_size=16, local_steps=1),
            seed_values(tta, "time_to_target", world_size=8, local_steps=8), "/")
        v = claims.verdict(ratio, 2.0, unit="x", what="time K=16, H=1 / time K=8, H=8")
        rows.append(claims.claim_row(
            "Figure 7", "K=8; H=8 vs K=16; H=1", "time-to-accuracy ratio", v.mean, unit="x",
            note=note, verdict=v,
            claim="H = 8 on 8 GPUs reaches the target in half the time of mini-batch SGD on 16"))
    return rows
