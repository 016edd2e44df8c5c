"""Stragglers and the measured compute / waiting / communication split (torchrun runner).

`Stragglers` draws the emulated stalls (the PyTorch hierarchical-SGD blog's experiment) for the
runner (`Stragglers.stall`, per rank and step) and for the wall-clock simulator (`stall_draws`,
all at once); `split_waiting` and `timing_summary` turn a runner's per-step timeline into
compute, waiting and communication.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["STRAGGLER_SALT", "SYNC_KINDS", "Stragglers", "split_waiting", "stall_draws",
           "timing_summary"]

STRAGGLER_SALT = 0x57A6  # keeps the stall draws apart from every other stream seeded by `seed`


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
        u = np.random.default_rng([self.seed, STRAGGLER_SALT, rank, t]).random()
        return float(self.seconds) if u < self.rate else 0.0


def stall_draws(stragglers: Stragglers, workers: int, steps: int, rng: np.random.Generator,
                 runner_stalls: bool) -> np.ndarray:
    """[steps, workers] stall seconds with `Stragglers` semantics (rate per worker and step,
    persistent ranks every step); ``runner_stalls`` reproduces `Stragglers.stall` draw by draw."""
    bad = [r for r in stragglers.persistent if r >= workers]
    if bad:
        raise ValueError(f"persistent straggler ranks {bad} do not exist among {workers} workers "
                         f"(ranks 0..{workers - 1})")
    if not stragglers.active:
        return np.zeros((steps, workers))
    if runner_stalls:
        return np.array([[stragglers.stall(r, t) for r in range(workers)]
                         for t in range(1, steps + 1)])
    stall = (rng.random((steps, workers)) < stragglers.rate) * float(stragglers.seconds)
    if stragglers.persistent:
        stall[:, list(stragglers.persistent)] = stragglers.seconds
    return stall


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
    ``comm_s`` (summed over both kinds and the streamed time) and ``wait_{k}_s`` /
    ``comm_{k}_s``; a streamed step's ``stream_s`` (launch, merge, mixing) is communication,
    ``comm_stream_s``.

    Rows whose ``clock`` is ``"events"`` (CUDA: host timestamps see only kernel launches) carry
    durations ``{k}_dur_s`` from CUDA events instead, and the same rule is applied to them: the
    group finishes together, so the last to arrive spends the least, ``comm = min_{j in G}
    dur_j`` and ``wait = dur_r - comm``. Such a row with a level and no duration (the gradient
    all-reduce, inside backward on the compute stream) is compute: wait = comm = 0.
    """
    import pandas as pd  # here, not above: the engines import Stragglers on the base install

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
            keys = [sub["step"], sub["level"], sub["group"]]
            events = (df["clock"] == "events") if "clock" in df else pd.Series(False, df.index)
            host = has & ~events
            if host.any():
                release = arrive[host].groupby([k[host[has]] for k in keys]).transform("max")
                wait[host] = (release - arrive[host]).clip(lower=0.0)
                comm[host] = (end[host] - release).clip(lower=0.0)
            timed = has & events
            if timed.any():
                d = pd.to_numeric(df.loc[timed, f"{kind}_dur_s"], errors="coerce")
                fastest = d.groupby([k[timed[has]] for k in keys]).transform("min")
                comm[timed] = fastest.fillna(0.0)
                wait[timed] = (d - fastest).clip(lower=0.0).fillna(0.0)
        df[f"wait_{kind}_s"], df[f"comm_{kind}_s"] = wait, comm
        df["wait_s"] += wait
        df["comm_s"] += comm
    # a streamed fragment's average travels while the workers compute: what the host spent on
    # its launch, merge and mixing is the communication left exposed (its straggler wait is
    # inside the merge's wait and not separable from the bytes' time)
    stream = (pd.to_numeric(df["stream_s"], errors="coerce").fillna(0.0) if "stream_s" in df
              else pd.Series(0.0, index=df.index))
    df["comm_stream_s"] = stream
    df["comm_s"] += stream
    return df


def timing_summary(df: pd.DataFrame, group_sizes: list[int]) -> dict:
    """Closing summary of a `split_waiting` table: steps/s, shares of worker time spent
    computing / waiting / communicating, and bytes each level moved (sum over workers of the
    buffers they all-reduced, streamed fragments' at the world's level; a ring all-reduce puts
    2(g-1)/g of that on the wire)."""
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
        if level == len(group_sizes) - 1 and "fragment_bytes" in df:  # fragments: world-wide
            moved += int(df["fragment_bytes"].sum())
        out[f"bytes_l{level}"] = moved
        out[f"group_l{level}"] = g
    return out
