"""Figure 6 (§4.2.1): ResNet-20 on CIFAR-10 on 2×1 GPUs at H = 1 … 16 — its grid (`configs`)
and its two claims on H = 16 against H = 1 (`fig06_claims`): the training-time speed-up and
Fig. 6c's test accuracy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from localsgd.paper.experiments import claims
from localsgd.paper.experiments.grid import app_c_tricks, base_config, speedup_table
from localsgd.paper.experiments.lin2020.common import or_unmeasured, paired_by_seed, seed_values
from localsgd.train import TrainConfig

__all__ = ["FIG06_CLAIM", "FIG06_TEST_CLAIM", "configs", "fig06_claims"]


def configs(P, seeds: Sequence[int]) -> list[TrainConfig]:
    """Figure 6's grid (§4.2.1): the notebook's base run (`grid.base_config`) at every H of
    ``P.Hs`` and seed, with App. C's tricks (lr scaled by K, warm-up over ``P.warmup_epochs``)
    when ``P.tricks`` (converged mode: so that its runs are Table 5's)."""
    base = base_config(P, **app_c_tricks(P))
    return [dataclasses.replace(base, local_steps=h, seed=s) for h in P.Hs for s in seeds]


FIG06_CLAIM = "H = 16 reaches the same training accuracy at least 3x faster than H = 1"
FIG06_TEST_CLAIM = ("no difference or negligible difference in test accuracy between H = 16 and "
                    "H = 1 (Fig. 6c; negligible: within 1 point, as for Table 5)")


def _speedup_bound(runs: pd.DataFrame, time_col: str, compute: pd.Series | None) -> float:
    """The largest speed-up any H could give on the ``time_col`` axis: H = 1's time over its
    compute alone (no communication at all), the median over seeds; NaN without ``compute``."""
    if compute is None:
        return math.nan
    last = runs.assign(_compute=compute).sort_values("step")
    last = last[last.local_steps == 1].groupby("seed").last()
    return float((last[time_col] / last["_compute"]).median()) if len(last) else math.nan


def fig06_claims(runs: pd.DataFrame, *, Hs: Sequence[int], inter_gbps: float,
                 note: str = "", paper_compute_s: float | None = None,
                 tolerance: float = 1.0) -> list[dict]:
    """Figure 6 (§4.2.1), two claims on H = 16 against H = 1, each from per-seed values:

    1. "H = 16 reaches the same training accuracy at least 3× faster": each seed's speed-up
       (`grid.speedup_table` on ``time_s``: measured compute + modelled ``inter_gbps``
       communication; the row's value is their mean) by the seed-spread rule, unless
       communication is too small a share of H = 1's time for any H to give 3× (H = 1's time
       over its compute alone, `_speedup_bound`): then *not testable at this scale*, with the
       share named. The same speed-up with Table 5's per-update costs (``time_paper_s``; its
       compute per update ``paper_compute_s`` gives that axis's bound) is reported beside.
    2. Fig. 6c's "no or negligible difference in test accuracy": the paired final test top-1
       H = 16 minus H = 1 inside ±``tolerance`` points, decided as two one-sided claims joined by
       `claims.combine` (as Table 5's).

    No rows unless ``Hs`` has both 1 and 16 (the reported key is H=16 vs H=1).
    """

    if not (1 in Hs and 16 in Hs):
        return []

    def speedups(time_col: str) -> list[float]:
        tab = speedup_table(runs, time_col=time_col, acc_col="train_acc", by="local_steps")
        return tab[tab.local_steps == 16].set_index("seed").speedup.tolist()

    kw = {"unit": "x", "what": "speed-up of H = 16 over H = 1"}
    measured_values = speedups("time_s")
    bound = _speedup_bound(runs, "time_s", runs.get("compute_seconds"))
    if math.isfinite(bound) and bound < 3.0:
        measured = claims.not_testable(
            f"communication is {100 * (1 - 1 / bound):.2g} % of H = 1's time (measured compute "
            f"+ {inter_gbps:g} Gbit/s model), so saving it gives at most {bound:.4g}x; the "
            f"measured {or_unmeasured(float(np.mean(measured_values)), '.3g', 'x')} comes from "
            "the updates each H needs to reach the accuracy, not from communication",
            what=kw["what"])
    else:
        measured = claims.verdict(measured_values, 3.0, **kw)
    paper = claims.verdict(speedups("time_paper_s"), 3.0, **kw)
    paper_bound = _speedup_bound(runs, "time_paper_s", None if paper_compute_s is None
                                 else runs["step"] * paper_compute_s)
    bound_text = (f" (those costs bound any H's speed-up at {paper_bound:.3g}x)"
                  if math.isfinite(paper_bound) else "")
    speed_row = claims.claim_row(
        "Figure 6", "2x1; B_loc=128; H=16 vs H=1", "training time speed-up",
        float(np.mean(measured_values)) if measured_values else math.nan, unit="x", note=note,
        claim=FIG06_CLAIM,
        verdict=(f"{measured}" + ("" if measured.outcome == claims.NOT_TESTABLE else
                                  f" (measured compute + {inter_gbps:g} Gbit/s model)")
                 + f"; with Table 5's per-update costs: {paper}{bound_text}"))

    final = runs.sort_values("step").groupby(["local_steps", "seed"]).last().reset_index()
    gaps = paired_by_seed(seed_values(final, "test_acc", local_steps=16),
                          seed_values(final, "test_acc", local_steps=1))
    what = "test top-1 H=16 minus H=1"
    band = [claims.verdict(gaps, -tolerance, what=what, unit=" points"),
            claims.verdict(gaps, tolerance, higher_is_better=False, what=what, unit=" points")]
    undecided = [v for v in band if v.outcome not in (claims.HELD, claims.NOT_HELD)]
    test_row = claims.claim_row(
        "Figure 6", "2x1; B_loc=128; H=16 vs H=1", "test top-1 change",
        band[0].mean, unit="points", note=note, claim=FIG06_TEST_CLAIM,
        verdict=f"{claims.combine(band)}: |{what}| <= {tolerance:g} point, paired by seed; "
                f"{(undecided or band)[0].reason}")
    return [speed_row, test_row]
