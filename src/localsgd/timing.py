"""Communication-time models.

Appendix B of Lin et al. (2020) prices one all-reduce among ``p`` devices at ``C·log2(p)``
(recursive halving and doubling), with ``C = C1`` inside a server and ``C = C2`` across servers
(``C1 ≪ C2``). Eq. (6) then gives the total communication cost of hierarchical local SGD.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd


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
    from localsgd.schedule import SyncSchedule, Topology

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


# ----------------------------------------------------------------------------------------------
# A cluster model for the deep-learning time axes (compute is measured, communication modelled)
# ----------------------------------------------------------------------------------------------


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

    ``records`` are `localsgd.train` records: cumulative ``compute_seconds`` (median worker per
    step, as if the K workers ran in parallel), ``param_bytes``, ``world_size`` and, per level
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


# ----------------------------------------------------------------------------------------------
# Stragglers and the measured compute / waiting / communication split (torchrun runner)
# ----------------------------------------------------------------------------------------------

_STRAGGLER_SALT = 0x57A6  # keeps the stall draws apart from every other stream seeded by `seed`


@dataclass(frozen=True)
class Stragglers:
    """Emulated stragglers, as in the PyTorch hierarchical-SGD blog ("Experimental Setup": every
    step, each worker stalls for 1 s with probability 1-2 %).

    At local update ``t`` worker ``rank`` stalls for ``seconds`` with probability ``rate``,
    independently per worker and step: the draw is a pure function of (seed, rank, t), so a
    resumed run stalls exactly where the uninterrupted one did. Ranks in ``persistent`` stall at
    every step (the blog's "persistent stragglers", which hierarchy cannot mitigate).
    """

    seconds: float = 0.0
    rate: float = 0.0
    persistent: tuple[int, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.seconds >= 0:
            raise ValueError(f"straggler seconds={self.seconds!r}: must be >= 0")
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"straggler rate={self.rate!r}: must be a probability in [0, 1]")
        ranks = tuple(self.persistent)
        if any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in ranks):
            raise ValueError(f"persistent straggler ranks {ranks!r}: must be integers >= 0")
        object.__setattr__(self, "persistent", ranks)

    @property
    def active(self) -> bool:
        return self.seconds > 0 and (self.rate > 0 or bool(self.persistent))

    def stall(self, rank: int, t: int) -> float:
        """Seconds worker ``rank`` stalls at local update ``t`` (0.0 or ``seconds``)."""
        if not self.active:
            return 0.0
        if rank in self.persistent:
            return float(self.seconds)
        if self.rate <= 0:
            return 0.0
        import numpy as np

        u = np.random.default_rng([self.seed, _STRAGGLER_SALT, rank, t]).random()
        return float(self.seconds) if u < self.rate else 0.0


SYNC_KINDS = ("grad", "avg")  # gradient all-reduce (before the update), model average (after)


def split_waiting(timeline: pd.DataFrame, group_sizes: list[int]) -> pd.DataFrame:
    """Split every synchronisation of a runner timeline into waiting and communication.

    ``timeline`` has one row per (step, rank) with wall-clock timestamps (seconds, a clock shared
    by the workers: ``time.time()``, i.e. exact on one machine and NTP-accurate across machines)
    and, per sync kind k in ``SYNC_KINDS``, ``{k}_level`` (None: no sync of that kind),
    ``{k}_arrive`` (this rank is ready to communicate) and ``{k}_end`` (its collective returned).

    A collective cannot finish before the last member of the group arrives, so for rank r in
    group G: ``wait = max_{j in G} arrive_j - arrive_r`` (blocked because another rank is late)
    and ``comm = end_r - max_{j in G} arrive_j`` (moving the bytes). Adds ``wait_s`` and
    ``comm_s`` (summed over both kinds) and ``wait_{k}_s`` / ``comm_{k}_s``.
    """
    df = timeline.copy()
    df["wait_s"] = 0.0
    df["comm_s"] = 0.0
    for kind in SYNC_KINDS:
        level, arrive, end = df[f"{kind}_level"], df[f"{kind}_arrive"], df[f"{kind}_end"]
        has = level.notna()
        wait = pd.Series(0.0, index=df.index)
        comm = pd.Series(0.0, index=df.index)
        if has.any():
            sub = df.loc[has, ["step", "rank"]].copy()
            sizes = level[has].astype(int).map(lambda lv: group_sizes[lv])
            sub["group"] = sub["rank"] // sizes
            sub["level"] = level[has].astype(int)
            release = arrive[has].groupby([sub["step"], sub["level"], sub["group"]]).transform("max")
            wait[has] = (release - arrive[has]).clip(lower=0.0)
            comm[has] = (end[has] - release).clip(lower=0.0)
        df[f"wait_{kind}_s"], df[f"comm_{kind}_s"] = wait, comm
        df["wait_s"] += wait
        df["comm_s"] += comm
    return df


def timing_summary(df: pd.DataFrame, group_sizes: list[int]) -> dict:
    """Closing summary of a `split_waiting` table: steps/s, shares of worker time spent
    computing / waiting / communicating, and bytes each level moved (sum over workers of the
    buffers they all-reduced; a ring all-reduce puts 2(g-1)/g of that on the wire)."""
    steps = int(df["step"].nunique())
    span = float(df["end"].max() - df["start"].min())
    wall = float(df["wall_s"].sum())
    out = {
        "steps": steps, "workers": int(df["rank"].nunique()), "seconds": span,
        "steps_per_s": steps / span if span > 0 else float("nan"),
        # median over steps of the slowest worker's step: the compiled-vs-eager comparison
        # (the first, compiling, steps do not move it)
        "median_step_s": float(df.groupby("step")["wall_s"].max().median()),
        "compute_share": float(df["compute_s"].sum()) / wall,
        "wait_share": float(df["wait_s"].sum()) / wall,
        "comm_share": float(df["comm_s"].sum()) / wall,
        "stall_seconds": float(df["stall_s"].sum()),
        "stalls": int((df["stall_s"] > 0).sum()),
    }
    for level, g in enumerate(group_sizes):
        moved = 0
        for kind in SYNC_KINDS:
            mask = df[f"{kind}_level"] == level
            moved += int(df.loc[mask, f"{kind}_bytes"].sum())
        out[f"bytes_l{level}"] = moved
        out[f"group_l{level}"] = g
    return out
