"""A merge that proceeds without its late workers: a quorum with a grace window (beyond the
sources; Decoupled DiLoCo's minimum quorum), on a seeded trace of arrivals.

Every round of flat local SGD starts together from the last average (H updates). Worker k
arrives at the merge after A_k = sum over its H updates of (``step_s`` + its stall), the stalls
drawn with `Stragglers` semantics (a pure function of seed, rank and update, as the runner and
the wall-clock simulator draw them). The merge waits for the ``quorum``-th arrival among the
workers present, then ``grace_s`` more, and proceeds at

    M = min(A_(q) + grace_s, max_k A_k)

(not later than the last arrival). **The stated rule for the late** (A_k > M): their change of
the round is *dropped*: they are left out of the round's average (`SyncSchedule.late`, the mean
of the workers on time) and, like everyone, start the next round from it, so no worker carries
a stale model into the next round. The trace also prices itself: a round lasts M under the
quorum and max_k A_k synchronously (`QuorumRound`).
"""

from __future__ import annotations

from typing import NamedTuple

from localsgd.timing.stragglers import Stragglers
from localsgd.topology import check_int

__all__ = ["QuorumRound", "late_pairs", "quorum_seconds", "quorum_trace"]


class QuorumRound(NamedTuple):
    """One round of a quorum trace: who misses the merge, when it happens and when the last
    worker arrives (seconds from the round's start)."""

    late: tuple[int, ...]
    merge_s: float
    all_s: float


def quorum_trace(workers: int, rounds: int, local_steps: int, quorum: int, grace_s: float,
                 step_s: float = 1.0, stragglers: Stragglers | None = None, start: int = 0,
                 away: dict[int, tuple[int, ...]] | None = None) -> tuple[QuorumRound, ...]:
    """The quorum's ``rounds`` rounds of ``local_steps`` updates each: round r (1-based) holds
    the updates ``start + (r - 1) H + 1 .. start + r H``, ``start`` the post-local warm-up;
    ``away`` maps a round to workers away in it (churn: they neither arrive nor count). A quorum
    above the workers present waits for all of them."""
    check_int("quorum workers", workers, 1)
    check_int("quorum rounds", rounds, 0)
    check_int("quorum local_steps", local_steps, 1)
    check_int("quorum", quorum, 1)
    if quorum > workers:
        raise ValueError(f"quorum={quorum} > {workers} workers: a merge can wait for at most "
                         "all of them")
    for name, v in (("grace_s", grace_s), ("step_s", step_s)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < float("inf"):
            raise ValueError(f"quorum {name}={v!r}: must be a number of seconds >= 0")
    stragglers = stragglers or Stragglers()
    bad = [r for r in stragglers.persistent if r >= workers]
    if bad:
        raise ValueError(f"persistent straggler ranks {bad} do not exist among {workers} "
                         f"workers (ranks 0..{workers - 1})")
    away = away or {}
    trace = []
    for r in range(1, rounds + 1):
        first = start + (r - 1) * local_steps + 1
        present = [k for k in range(workers) if k not in away.get(r, ())]
        arrive = {k: sum(step_s + stragglers.stall(k, t)
                         for t in range(first, first + local_steps)) for k in present}
        order = sorted(arrive.values())
        last = order[-1]
        merge = min(order[min(quorum, len(order)) - 1] + grace_s, last)
        trace.append(QuorumRound(tuple(k for k in present if arrive[k] > merge), merge, last))
    return tuple(trace)


def late_pairs(trace: tuple[QuorumRound, ...]) -> tuple[tuple[int, int], ...]:
    """The trace as `SyncSchedule`'s ``late``: (worker, round) for every change dropped."""
    return tuple((k, r) for r, rnd in enumerate(trace, 1) for k in rnd.late)


def quorum_seconds(trace: tuple[QuorumRound, ...]) -> dict[str, float]:
    """The trace's compute-and-wait time: under the quorum (each round ends at its merge) and
    synchronously (at its last arrival), the rounds, and the workers' rounds dropped."""
    return {"quorum_s": sum(r.merge_s for r in trace), "sync_s": sum(r.all_s for r in trace),
            "rounds": len(trace), "late": sum(len(r.late) for r in trace)}
