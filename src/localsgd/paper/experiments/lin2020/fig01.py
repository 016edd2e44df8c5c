"""Figure 1 (§1) of Lin et al. (2020): the time of one all-reduce of 100 MB grows as cores are
added. The paper times MPI on a Kubernetes cluster (10 Gbps, 48 cores per machine); here gloo is
timed on the emulated cluster (`localsgd.netcluster`: namespaces as nodes, tbf-shaped links,
``localsgd bench cluster``), so the scale is ``cluster``: a real network stack and real
processes, with a slower link and fewer processes than the paper's.

`table` adds the timing model's seconds (`localsgd.timing.cluster.Cluster`: a ring all-reduce
over the measured link, 50 µs a step) to the measured rows; `rows` are the compare rows: the
message size, and the claim judged on the ratio of the all-reduce's time on the most nodes to
its time on two (one process a node, so only the node count changes)."""

from __future__ import annotations

import math

import pandas as pd

from localsgd.paper.experiments.claims import (
    check_measured,
    claim_row,
    link_key,
    paper,
    verdict,
)
from localsgd.timing.cluster import Cluster

CLAIM = ("the time of an all-reduce of 100 MB grows as cores are added, so communication "
         "efficiency drops with scale")
COLUMNS = ["nodes", "procs_per_node", "processes", "repeat", "seconds", "asked_rate_mbit",
           "measured_rate_mbit", "mb"]
# inside a node the processes talk over an unshaped loopback: priced as a fast link (its
# measured 1 x 2 all-reduce of 100 MB takes about 0.1 s, some 16 Gbit/s)
LOOPBACK_GBPS = 16.0


def check(measured: pd.DataFrame) -> pd.DataFrame:
    """``measured`` (``localsgd bench cluster``'s CSV) with its columns checked: one line
    naming what is missing."""
    check_measured(measured, COLUMNS, "Figure 1's measurements")
    if not len(measured):
        raise ValueError("Figure 1's measurements are empty: re-run `localsgd bench cluster`")
    return measured


def table(measured: pd.DataFrame) -> pd.DataFrame:
    """One row per layout: processes, nodes, median and spread of the measured seconds, and the
    model's seconds on the measured link."""
    measured = check(measured)
    out = []
    for (nodes, per), g in measured.groupby(["nodes", "procs_per_node"], sort=True):
        rate = g["measured_rate_mbit"].iloc[0]
        inter = (rate if math.isfinite(rate) else g["asked_rate_mbit"].iloc[0]) / 1000
        model = Cluster(gpus_per_node=int(per), intra_gbps=LOOPBACK_GBPS, inter_gbps=inter)
        world = int(nodes * per)
        modelled = model.allreduce_seconds(world, g["mb"].iloc[0] * 2**20, world)
        out.append({"nodes": int(nodes), "procs_per_node": int(per), "processes": world,
                    "median_s": g["seconds"].median(), "min_s": g["seconds"].min(),
                    "max_s": g["seconds"].max(), "repeats": len(g), "model_s": modelled,
                    "model_error": g["seconds"].median() / modelled - 1 if modelled else math.nan,
                    "link_mbit": rate})
    return pd.DataFrame(out).sort_values(["processes", "nodes"], ignore_index=True)


def rows(measured: pd.DataFrame) -> list[dict]:
    """Compare rows: the message size (the paper's 100 MB), and the claim on the ratio
    t(most nodes) / t(2 nodes), one process a node, per repeat (repeat i with repeat i)."""
    measured = check(measured)
    one = measured[measured["procs_per_node"] == 1]
    nodes = sorted(one["nodes"].unique())
    out = [claim_row("Figure 1", "panel=a", "message size", float(measured["mb"].iloc[0]),
                     unit="MB", note="gloo on the emulated cluster (MPI in the paper)")]
    if 2 not in nodes or nodes[-1] == 2:
        return out
    big = one[one["nodes"] == nodes[-1]].sort_values("repeat")["seconds"].to_numpy()
    two = one[one["nodes"] == 2].sort_values("repeat")["seconds"].to_numpy()
    n = min(len(big), len(two))
    ratios = [float(big[i] / two[i]) for i in range(n)]
    rate = float(one["measured_rate_mbit"].iloc[0])
    v = verdict(ratios, 1.0, origin=paper("the time grows as cores are added"), unit="x",
                what=f"all-reduce time on {nodes[-1]} nodes / on 2", over="repeats")
    out.append(claim_row(
        "Figure 1", f"{nodes[-1]} vs 2 nodes x 1 process, {link_key(rate)} links",
        "all-reduce time ratio", sum(ratios) / n, unit="x", claim=CLAIM, verdict=v,
        note=f"emulated cluster: gloo, {measured['mb'].iloc[0]:g} MB, a ring model predicts "
             f"{2 * (nodes[-1] - 1) / nodes[-1] / 1.0:.2f} x; no delay emulated"))
    return out
