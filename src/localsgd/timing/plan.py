"""The schedule planner (``localsgd plan``): rank schedules for a cluster by predicted time per
step (`localsgd.timing.simulate.simulate`); speed only, not convergence."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from localsgd.timing.cluster import Cluster
from localsgd.timing.scheme import Scheme
from localsgd.timing.simulate import check_int_arg, simulate
from localsgd.timing.stragglers import Stragglers

__all__ = ["candidate_schemes", "format_plan", "plan_schedules"]


def candidate_schemes(workers: int, gpus_per_node: int, max_period: int = 8) -> list[Scheme]:
    """Schedules worth ranking for one cluster (`localsgd plan`): synchronous SGD, local SGD
    with H = 2, 4, ... ≤ ``max_period``, and hierarchies in the blog's style — a period-p group
    of one node or a few nodes, optionally a middle level, the world every ``P`` steps."""
    check_int_arg("workers", workers, 1)
    check_int_arg("gpus_per_node", gpus_per_node, 1)
    check_int_arg("max_period", max_period, 2)
    out = [Scheme.sync()]
    periods = [2 ** k for k in range(1, max_period.bit_length()) if 2 ** k <= max_period]
    out += [Scheme.local(h) for h in periods]
    groups = [g for g in (gpus_per_node * 2 ** k for k in range(12))
              if 1 < g < workers and workers % g == 0]
    seen = set()
    for top in periods[1:]:
        for p1 in [p for p in (1, *periods) if p < top]:
            for g1 in groups[:3]:  # the node and 2 or 4 nodes: the cheap, frequent level
                levels = [(p1, g1), (top, workers)]
                mids = [g for g in groups if g > g1 and g % g1 == 0]
                options = [levels]
                if p1 * 2 < top and mids:
                    options.append([(p1, g1), (p1 * 2, mids[len(mids) // 2]), (top, workers)])
                for lv in options:
                    key = tuple(lv)
                    if key not in seen:
                        seen.add(key)
                        out.append(Scheme.hierarchical(lv, name="hsgd:" + ",".join(
                            f"{p}-{g}" for p, g in lv)))
    return out


def plan_schedules(*, workers: int, gpus_per_node: int = 1, model_mb: float = 45.0,
                   step_ms: float = 55.0, straggler_rate: float = 0.0, straggler_s: float = 0.0,
                   persistent: Sequence[int] = (), inter_gbps: float = 32.0,
                   intra_gbps: float = 100.0, latency_s: float = 50e-6, steps: int = 1000,
                   max_period: int = 8, schemes: Sequence[str] | None = None,
                   jitter: float = 0.0, seed: int = 0, **model_options) -> pd.DataFrame:
    """Rank schedules for a cluster by predicted time per step (`simulate`), fastest first; the
    synchronous baseline wins ties (it converges best per step). ``model_options`` go to
    `simulate` (grad_overlap, backward_fraction, intra_host_grad_allreduce, queued_fraction)."""
    if workers % gpus_per_node and workers > gpus_per_node:
        raise ValueError(f"--workers {workers} is not a multiple of --gpus-per-node "
                         f"{gpus_per_node}: workers fill whole nodes")
    cluster = Cluster(gpus_per_node=gpus_per_node, intra_gbps=intra_gbps,
                      inter_gbps=inter_gbps, latency_s=latency_s)
    stragglers = Stragglers(seconds=straggler_s, rate=straggler_rate,
                            persistent=tuple(persistent), seed=seed)
    cands = ([Scheme.parse(s) for s in schemes] if schemes
             else candidate_schemes(workers, gpus_per_node, max_period))
    if not any(s.kind == "sync" for s in cands):
        cands.insert(0, Scheme.sync())
    df = simulate(cands, workers=workers, steps=steps, cluster=cluster, compute_ms=step_ms,
                  jitter=jitter, stragglers=stragglers, model_mb=model_mb, seed=seed,
                  **model_options)
    df["order"] = np.arange(len(df))  # candidates' order breaks ties: sync, then simplest
    # equal to 1e-9 relative counts as a tie (float sums of the same step times)
    df["key"] = np.round(df["step_ms"] / df["step_ms"].min(), 9)
    df = df.sort_values(["key", "order"], kind="stable").drop(columns=["key", "order"])
    df.insert(0, "rank", np.arange(1, len(df) + 1))
    return df.reset_index(drop=True)


def format_plan(df: pd.DataFrame, top: int | None = 15) -> str:
    """The ranking as a plain-text table (`localsgd plan`)."""
    shown = df if top is None else df.head(top)
    lines = [(f"{'rank':>4}  {'scheme':28s} {'ms/step':>9} {'steps/s':>8} {'speed-up':>8} "
             f"{'wait':>6} {'comm':>6}")]
    for r in shown.itertuples():
        lines.append(f"{r.rank:>4}  {r.scheme:28s} {r.step_ms:9.1f} {r.steps_per_s:8.2f} "
                     f"{r.speedup:7.2f}x {100 * r.wait_share:5.1f}% {100 * r.comm_share:5.1f}%")
    if top is not None and len(df) > top:
        lines.append(f"      ... {len(df) - top} more (--top 0 shows all)")
    return "\n".join(lines)
