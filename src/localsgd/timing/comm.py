"""Appendix B's communication arithmetic (Lin et al., 2020).

Appendix B prices one all-reduce among ``p`` devices at ``C·log2(p)`` (recursive halving and
doubling), with ``C = C1`` inside a server and ``C = C2`` across servers (``C1 ≪ C2``). Eq. (6)
then gives the total communication cost of hierarchical local SGD.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from localsgd.schedule import SyncSchedule
from localsgd.topology import Topology

__all__ = ["ClusterShape", "comm_cost_eq6", "comm_cost_table", "schedule_sync_counts",
           "sync_rounds"]


@dataclass(frozen=True)
class ClusterShape:
    """``servers × gpus_per_server`` devices, the paper's "a×b-GPU" notation (e.g. 8×2)."""

    servers: int
    gpus_per_server: int

    def __post_init__(self) -> None:
        for name in ("servers", "gpus_per_server"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: must be a positive integer")

    @property
    def world_size(self) -> int:
        return self.servers * self.gpus_per_server

    @classmethod
    def parse(cls, text: str) -> ClusterShape:
        """Parse ``"8x2"`` (or ``"8×2"``) into 8 servers with 2 GPUs each."""
        parts = text.lower().replace("×", "x").split("x")
        try:
            servers, gpus = (int(p) for p in parts)
        except ValueError:
            raise ValueError(f"cluster shape {text!r}: expected 'SERVERSxGPUS', e.g. '8x2'") from None
        return cls(servers, gpus)

    def __str__(self) -> str:
        return f"{self.servers}x{self.gpus_per_server}"


def sync_rounds(n_samples: int, workers: int, batch: int, local_steps: int,
                block_steps: int) -> tuple[int, int]:
    """(block-only rounds, global rounds) over training, as counted in eq. (6).

    ``⌈N/(K·B·H)⌉`` synchronizations happen in total, ``⌈N/(K·B·H·H^b)⌉`` of them global; the
    rest stay inside a server.
    """
    for name, v in (("n_samples", n_samples), ("workers", workers), ("batch", batch),
                    ("local_steps", local_steps), ("block_steps", block_steps)):
        if v < 1:
            raise ValueError(f"{name}={v}: must be >= 1")
    total = math.ceil(n_samples / (workers * batch * local_steps))
    global_ = math.ceil(n_samples / (workers * batch * local_steps * block_steps))
    return total - global_, global_


def comm_cost_eq6(n_samples: int, shape: ClusterShape, batch: int, local_steps: int,
                  block_steps: int, c_intra: float, c_inter: float) -> float:
    """Total communication cost of hierarchical local SGD, Lin et al. (2020) eq. (6).

    ``(⌈N/KBH⌉ − ⌈N/KBHH^b⌉)·C1·K'·log2(K/K') + ⌈N/KBHH^b⌉·C2·log2 K`` with K devices on K'
    servers. The intra-server term is multiplied by K' exactly as printed (the servers' rounds are
    summed, not overlapped); it is zero for one GPU per server. Units are those of C1 and C2.
    """
    k, servers = shape.world_size, shape.servers
    block_rounds, global_rounds = sync_rounds(n_samples, k, batch, local_steps, block_steps)
    intra = block_rounds * c_intra * servers * math.log2(k / servers)
    inter = global_rounds * c_inter * math.log2(k)
    return intra + inter


def schedule_sync_counts(shape: ClusterShape, local_steps: int, block_steps: int,
                         steps: int) -> dict[str, int]:
    """Count intra-server and global averaging rounds of the first ``steps`` local updates.

    Runs the real :class:`~localsgd.schedule.SyncSchedule` of hierarchical local SGD (blocks are
    the servers), so it checks the schedule against Table 3's "# of sync." rows and eq. (6).
    """
    topo = Topology.from_paper(shape.world_size, local_steps, block_size=shape.gpus_per_server,
                               block_steps=block_steps)
    schedule = SyncSchedule(topo)
    counts = {"within_server": 0, "global": 0}
    for t in range(1, steps + 1):
        level = schedule.action(t).level
        if level is None:
            continue
        counts["global" if level == topo.top else "within_server"] += 1  # blocks = servers
    return counts


def comm_cost_table(topologies: list[str], n_samples: int, batch: int, local_steps: list[int],
                    block_steps: list[int], c_intra: float, c_inter: float) -> pd.DataFrame:
    """Eq. (6) over a grid of (cluster shape, H, H^b): one tidy row per combination.

    Also counts the rounds by running the schedule over ``N/(K·B)`` updates, so every row
    carries eq. (6)'s round counts beside the schedule's.
    """
    rows = []
    for text in topologies:
        shape = ClusterShape.parse(text)
        k = shape.world_size
        for h in local_steps:
            for hb in block_steps:
                block_rounds, global_rounds = sync_rounds(n_samples, k, batch, h, hb)
                rows.append({
                    "topology": str(shape), "K": k, "servers": shape.servers, "H": h, "Hb": hb,
                    "H*Hb": h * hb, "block_rounds": block_rounds, "global_rounds": global_rounds,
                    "cost": comm_cost_eq6(n_samples, shape, batch, h, hb, c_intra, c_inter),
                    "cost_intra_only": block_rounds * c_intra * shape.servers
                    * math.log2(k / shape.servers),
                })
    df = pd.DataFrame(rows)
    if 1 in local_steps and 1 in block_steps:  # mini-batch SGD (H = H^b = 1) as the yardstick
        baseline = df[(df.H == 1) & (df.Hb == 1)].set_index("topology")["cost"]
        df["cost_vs_minibatch"] = df["cost"] / df["topology"].map(baseline)
    return df
