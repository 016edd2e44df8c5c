"""A cluster model for the deep-learning time axes: compute is measured, communication modelled.

`Cluster` prices one all-reduce (latency + ring bytes over the intra- or inter-node link);
`modelled_time` adds a training run's modelled communication to its measured compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

__all__ = ["Cluster", "modelled_time"]


@dataclass(frozen=True)
class Cluster:
    """Communication side of a GPU cluster: ``gpus_per_node`` workers share a node.

    One all-reduce of ``nbytes`` among ``g`` workers costs
    ``latency · ⌈log2 g⌉ + 2 (g − 1)/g · nbytes / bandwidth`` (ring all-reduce bytes, recursive
    doubling latency, as App. B counts steps in log2 p). The bandwidth is the intra-node one when
    a group fits inside a node (contiguous ranks), else the inter-node one: a group that spans
    nodes is bound by its slowest link. ``extra_global_seconds`` adds a fixed delay to every
    global (whole-world) round, the knob of Figure 9 (b, c).
    """

    gpus_per_node: int = 1
    intra_gbps: float = 100.0  # e.g. PCIe / NVLink inside a server
    inter_gbps: float = 10.0  # the paper's 10 Gbps cluster (Fig. 7)
    latency_s: float = 50e-6
    extra_global_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node={self.gpus_per_node!r}: must be an integer >= 1")
        for name in ("intra_gbps", "inter_gbps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be > 0 (Gbit/s)")
        for name in ("latency_s", "extra_global_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be >= 0 seconds")

    def allreduce_seconds(self, group_size: int, nbytes: float, world_size: int) -> float:
        """Modelled seconds of one all-reduce of ``nbytes`` inside groups of ``group_size``."""
        if group_size < 1 or world_size < group_size:
            raise ValueError(f"group_size={group_size} must be in [1, world_size={world_size}]")
        if group_size == 1:
            return 0.0
        gbps = self.intra_gbps if group_size <= self.gpus_per_node else self.inter_gbps
        seconds = (self.latency_s * math.ceil(math.log2(group_size))
                   + 2 * (group_size - 1) / group_size * nbytes * 8 / (gbps * 1e9))
        if group_size == world_size:
            seconds += self.extra_global_seconds
        return seconds


def modelled_time(records: pd.DataFrame, cluster: Cluster) -> pd.Series:
    """Time axis of a training run: measured compute + modelled communication, in seconds.

    ``records`` are `localsgd.training.loop` records: cumulative ``compute_seconds`` (median worker
    per step, as if the K workers ran in parallel), ``param_bytes``, ``world_size`` and, per level
    ``i``, its group size ``group_l{i}``, model-averaging rounds ``sync_l{i}`` and
    gradient all-reduce rounds ``gradsync_l{i}`` (cumulative). Cluster parameters do not enter
    the training, so one run can be priced on many clusters.
    """
    comm = pd.Series(0.0, index=records.index)
    levels = sorted(int(c[len("group_l"):]) for c in records.columns if c.startswith("group_l"))
    for i in levels:
        # runs with fewer levels (flat beside hierarchical) have NaN here: no such level
        cost = [0.0 if pd.isna(g) else cluster.allreduce_seconds(int(g), float(b), int(k))
                for g, b, k in zip(records[f"group_l{i}"], records["param_bytes"],
                                   records["world_size"], strict=True)]
        rounds = records[f"sync_l{i}"].fillna(0) + records[f"gradsync_l{i}"].fillna(0)
        comm += rounds * pd.Series(cost, index=records.index)
    return records["compute_seconds"] + comm
