"""Who averages with whom, and when: `Topology`, `SyncSchedule` and the plan executor.

This module is pure Python (no torch, no torch.distributed) so the convex simulator, the
in-process replica engine and the distributed engine share one answer to *what happens at
step t*.

Step convention: ``t = 1, 2, ...`` is the number of completed local (inner optimizer) updates.
``SyncSchedule.action(t)`` describes what happens around update ``t``:

* ``allreduce_grads_level`` -- groups of this level all-reduce (average) gradients *before*
  update ``t`` (post-local SGD warm-up in "gradients" mode, or the blog's intra-host gradient
  all-reduce after warm-up);
* then, *after* update ``t``: ``gossip`` (one SGP round), ``level`` (model averaging inside the
  groups of that level; only the highest due level runs), ``outer`` (outer / slow-momentum step on
  the globally averaged model); with streaming fragment sync (`Streaming`) ``fragment`` (launch
  the average of that fragment's change) and then ``merge`` (apply a fragment's average launched
  ``overlap`` updates before).

Averaging replaces every model of a group by the group mean, Eq. (4)/(5). Algorithm 1 line 10
(and Algorithm 2 lines 11 and 14) multiply the averaged Delta by gamma once more; that would
pull each synchronised model back towards its round start and disagrees with Eq. (4)/(5) and
with App. D.1.2 at m = 0, so the code follows the equations.

`Topology` and `Level` live in `localsgd.topology` and are importable from here.

Paper: Lin, Stich, Patel, Jaggi, "Don't Use Large Mini-Batches, Use Local SGD" (ICLR 2020),
Sec. 3.1-3.2, Eq. (3)-(5), Algorithms 1-2. Hierarchy rules: PyTorch hierarchical SGD blog.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

from localsgd.topology import Topology, check_int

__all__ = ["Action", "Communicator", "ConsistencyError", "OuterStep", "Streaming", "SyncDriver",
           "SyncSchedule", "churn_trace", "qsr_rounds"]


# --------------------------------------------------------------------------------------------
# Schedule
# --------------------------------------------------------------------------------------------


def churn_trace(workers: int, rounds: int, leave_rate: float, away_rounds: float,
                seed: int) -> tuple[tuple[int, int, int], ...]:
    """A seeded trace of workers leaving and rejoining for `SyncSchedule`'s ``away``: at each of
    ``rounds`` rounds every worker present but worker 0 (who always stays, so every round has an
    average) leaves with probability ``leave_rate`` for a geometric number of rounds of mean
    ``away_rounds`` (>= 1); a returning worker stays at least one round, so spells do not
    join up. The same arguments give the same trace on every machine."""
    check_int("churn workers", workers, 1)
    check_int("churn rounds", rounds, 0)
    if not 0.0 <= leave_rate <= 1.0:
        raise ValueError(f"churn leave_rate={leave_rate!r}: must be a probability in [0, 1]")
    if not away_rounds >= 1.0:
        raise ValueError(f"churn away_rounds={away_rounds!r}: must be >= 1 (rounds a worker "
                         "stays away, on average)")
    rng = random.Random(seed)
    back = [0] * workers  # the first round worker w is present again
    trace = []
    for r in range(1, rounds + 1):
        for w in range(1, workers):
            if back[w] < r and rng.random() < leave_rate:  # back for a round first
                length = 1
                while rng.random() >= 1.0 / away_rounds:  # geometric, mean away_rounds
                    length += 1
                trace.append((w, r, min(rounds, r + length - 1)))
                back[w] = r + length
    return tuple(trace)


def qsr_rounds(lr: Callable[[int], float], alpha: float, base: int, updates: int,
               start: int = 0, lr_warmup: int = 0) -> tuple[int, ...]:
    """Round lengths by the quadratic synchronization rule (QSR; Gu, Lyu, Arora, Zhang, Huang,
    ICLR 2024): the round that starts after update ``start + s`` lasts H = max(``base``,
    floor((``alpha`` / lr)^2)) updates, lr the learning rate of its first update (``lr(i)`` of
    the 0-based iteration i), so H grows as the learning rate decays (H ∝ 1/η²), up to the run's
    ``updates``; rounds that start inside the lr's warm-up (``lr_warmup`` iterations) last
    ``base``, as Gu et al.'s code keeps its initial H there (a warm-up starts from a small lr).
    For `SyncSchedule`'s ``rounds``."""
    check_int("QSR base H", base, 1)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not (
            0.0 < alpha < float("inf")):
        raise ValueError(f"QSR alpha={alpha!r}: must be a number > 0 (H = (alpha / lr)^2)")
    rounds, s = [], start
    while s < updates:
        eta = lr(s)
        if not eta > 0:
            raise ValueError(f"QSR needs a learning rate > 0; lr({s}) = {eta!r}")
        # 1e-9: a decayed lr is 0.010000000000000002, and 399.99999999999994 means 400
        h = base if s < lr_warmup else max(base, math.floor((alpha / eta) ** 2 * (1 + 1e-9)))
        rounds.append(h)
        s += h
    return tuple(rounds) or (base,)


class Action(NamedTuple):
    """What happens around local update `t` (see module docstring for the order)."""

    t: int
    level: int | None = None  # level whose groups average models after update t
    allreduce_grads_level: int | None = None  # level whose groups average grads before update t
    outer: bool = False  # outer / slow-momentum step after the (global) average
    gossip: bool = False  # one SGP push-sum round after update t
    warmup: bool = False  # t is inside the post-local SGD warm-up (t <= warmup_steps)
    fragment: int | None = None  # streaming: fragment whose average is launched after update t
    merge: int | None = None  # streaming: fragment whose launched average is applied after t
    idle: tuple[int, ...] = ()  # workers whose update t is not applied (their own H is spent)
    absent: tuple[int, ...] = ()  # churn, quorum: workers left out of this round's average


@dataclass(frozen=True)
class Streaming:
    """Streaming fragment sync (Douillard et al. 2025, *Streaming DiLoCo with overlapping
    communication*, Sec. 2): the parameters split into ``fragments`` = P parts (whole tensors in
    parameter order, balanced by size: `localsgd.streaming.fragment_bounds`), each averaged once
    every H updates at its own offset instead of the whole model at once, so the peak bandwidth
    drops by about P.

    After update ``s = t - W`` of the local phase (W the post-local warm-up), fragment p's
    average is *launched* when ``s % H == ((p + 1) * H // P) % H`` (evenly spread; the last
    fragment at multiples of H, so P = 1 launches where local SGD averages) and *merged*
    ``overlap`` = τ updates later, the workers training on meanwhile (the average travels while
    they compute). At the merge the fragment's new global value is its reference (the last
    global value, the same on every worker) minus the averaged change each worker made up to the
    launch, through the outer update when there is one (its Eq. 2: Nesterov for DiLoCo, block
    momentum, or none: the plain average); each worker then takes
    ``mixing * local + (1 - mixing) * global`` (α = ``mixing``; 0 replaces the local fragment,
    the paper's default). P = 1, τ = 0, α = 0 is local SGD (or DiLoCo with an outer update).
    Needs P <= H (distinct offsets) and τ < H (a fragment is merged before its next launch).
    """

    fragments: int
    overlap: int = 0
    mixing: float = 0.0

    def __post_init__(self) -> None:
        check_int("streaming fragments", self.fragments, 1)
        check_int("streaming overlap (updates between a fragment's launch and its merge)",
                  self.overlap, 0)
        if isinstance(self.mixing, bool) or not isinstance(self.mixing, int | float) \
                or not 0.0 <= self.mixing < 1.0:
            raise ValueError(f"streaming mixing={self.mixing!r}: must be in [0, 1) (the local "
                             "fragment's weight at a merge; 0 takes the global value)")

    def launched(self, s: int, period: int) -> int | None:
        """The fragment whose average is launched after update ``s`` of the local phase."""
        if s < 1:
            return None
        r = s % period
        for p in range(self.fragments):
            if (p + 1) * period // self.fragments % period == r:
                return p
        return None

    def merged(self, s: int, period: int) -> int | None:
        """The fragment whose average is merged after update ``s`` of the local phase."""
        return self.launched(s - self.overlap, period)


@dataclass(frozen=True)
class SyncSchedule:
    """At step t, what happens? A pure function of t.

    Default semantics (the paper's Eq. (3)-(5), the blog's hierarchy rules):

    * **Post-local SGD warm-up** (``warmup_steps`` = W): for t <= W the world behaves like
      mini-batch SGD. ``warmup_mode="gradients"`` (default) all-reduces gradients globally before
      each update (``allreduce_grads_level = top``), like torch's ``post_localSGD_hook``;
      ``warmup_mode="models"`` averages models globally after each update (``level = top``).
      They are identical for plain SGD from equal models, and for SGD with momentum/weight decay
      when momentum buffers are averaged as well (the update is linear in (w, u, g)); they differ
      for non-linear optimizers (Adam) or when local momentum buffers are left alone.
      No outer step during warm-up; the outer anchor is reset when warm-up ends.
    * **Local phase**: level l is due at t when ``(t - t0) % period_l == 0`` with t0 the start of
      the current regime (W, or the end of the local-step warm-up). Only the highest due level
      runs (the blog's rule). Fig. 3 of the paper (H=3, H^b=2): block averages at t=3, 9, 15 ...,
      the world at t=6, 12 ...
    * **Exponential local-step warm-up** (ImageNet footnote 4): during epoch e <
      ``local_step_warmup_epochs`` every period is capped at 2^e (H = 1, 2, 4, ... for flat local
      SGD) and phases count from the start of that epoch. The last update of each warm-up epoch
      averages at the highest level, so no round spans two epochs (a round is never longer than
      its epoch's capped period, even when ``steps_per_epoch`` is not a multiple of it).
      Needs ``steps_per_epoch``.
    * **Intra-host gradient all-reduce** (blog; ``post_local_gradient_allreduce``): after warm-up,
      groups of level g (True means level 0) all-reduce gradients before every update. Their
      models stay identical, so levels <= g never model-average (it would be a no-op).
    * **Outer step** (``outer_period``): an int p gives an outer step when ``(t - W) % p == 0``;
      such a step forces a global average first. ``"global"`` gives an outer step at every global
      average of the local phase. None: no outer steps.
    * **Gossip** (``gossip=True``, SGP base of SlowMo): one push-sum round after every local-phase
      update that does not average.
    * **Per-worker H** (``worker_steps``, beyond the sources: heterogeneous workers): with one
      level of period H (a round), worker k applies only the first H_k updates of each round of
      the local phase and is idle for the rest (``Action.idle``: its batch is computed, its
      update not applied), as a slower worker makes fewer steps between the same averages.
    * **Streaming fragments** (``streaming``): see `Streaming`.
    * **Churn** (``away``, beyond the sources; flat local SGD, as torchft and prime let workers
      leave and rejoin): ``(worker, first, last)`` takes the worker out for rounds ``first`` ..
      ``last`` of the local phase (1-based, H updates each): it is idle there (``Action.idle``)
      and left out of those rounds' world averages (``Action.absent``: the mean is over the
      workers present), and since every worker takes the average, it rejoins from the group's
      average. `churn_trace` draws such a trace from a seed. ``rejoin="zero"`` (prime's joiner):
      in its first round back a worker sends a zero pseudo-gradient: it is idle that round and
      counted in its average with the model it started from (the last average).
    * **Quorum** (``late``, beyond the sources; Decoupled DiLoCo): ``(worker, round)`` marks a
      change that missed the merge of that round of the local phase: the worker trained, but is
      left out of the round's world average (``Action.absent``) and takes it, its change dropped
      (`localsgd.timing.quorum` draws such a trace from seeded arrivals).
    * **Explicit rounds** (``rounds``, beyond the sources; flat local SGD): the local phase's
      i-th round lasts ``rounds[i]`` updates and ends with the global average, the last length
      repeating; `qsr_rounds` writes them by Gu et al.'s quadratic synchronization rule.

    ``torch_compat`` reproduces torch.distributed's model averagers exactly (they count
    ``s = t - 1`` from 0, incremented after each ``average_parameters`` call):

    * ``"hierarchical"`` (``HierarchicalModelAverager``): average at the largest period p with
      ``s % p == 0`` if ``s >= W``; phases are absolute, not relative to W, so with W = 0 the
      world averages right after the first update (t = 1), then e.g. period 2 at t = 3, 5, ...
    * ``"periodic"`` (``PeriodicModelAverager``, one level): average when ``s >= W`` and
      ``(s - W) % period == 0``: t = W+1, W+1+p, ...
    * True picks "periodic" for one level, "hierarchical" otherwise.
    * gradients: global all-reduce for t <= W (``post_localSGD_hook`` with
      ``start_localSGD_iter = W``), then level g if ``post_local_gradient_allreduce`` (torch's
      ``PostLocalSGDState`` defaults it to True; here the default is False). The averager's
      ``period_group_size_dict`` is the levels above g (all levels if no gradient level), so
      torch's hook subgroup is modelled as level g.

    Default vs torch_compat: the default averages at the *end* of each period counted from the
    end of warm-up (t = W + p, W + 2p, ...), exactly Algorithm 1/2; torch averages at the
    *start* (t = W + 1 + kp for periodic, t - 1 divisible by p for hierarchical).
    torch_compat supports no gossip, no outer step and no local-step warm-up.
    """

    topology: Topology
    warmup_steps: int = 0
    local_step_warmup_epochs: int = 0
    steps_per_epoch: int | None = None
    post_local_gradient_allreduce: bool | int = False
    torch_compat: bool | Literal["periodic", "hierarchical"] = False
    gossip: bool = False
    outer_period: int | Literal["global"] | None = None
    warmup_mode: Literal["gradients", "models"] = "gradients"
    streaming: Streaming | None = None
    worker_steps: tuple[int, ...] | None = None
    rounds: tuple[int, ...] | None = None
    away: tuple[tuple[int, int, int], ...] | None = None
    rejoin: Literal["average", "zero"] = "average"
    late: tuple[tuple[int, int], ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.topology, Topology):
            raise ValueError(  # noqa: TRY004 - the project reports bad arguments as ValueError
                f"topology must be a Topology, got {type(self.topology).__name__}"
            )
        check_int("warmup_steps", self.warmup_steps, 0)
        check_int("local_step_warmup_epochs", self.local_step_warmup_epochs, 0)
        if self.local_step_warmup_epochs and self.steps_per_epoch is None:
            raise ValueError(
                f"local_step_warmup_epochs={self.local_step_warmup_epochs} needs steps_per_epoch "
                "(an integer >= 1): the local-step warm-up doubles H once per epoch"
            )
        if self.steps_per_epoch is not None:
            check_int("steps_per_epoch", self.steps_per_epoch, 1)
        if self.warmup_mode not in ("gradients", "models"):
            raise ValueError(
                f"warmup_mode must be 'gradients' or 'models', got {self.warmup_mode!r}"
            )
        g = self.post_local_gradient_allreduce
        if not isinstance(g, bool):
            check_int("post_local_gradient_allreduce (a level index or bool)", g, 0)
            if g >= self.topology.num_levels:
                raise ValueError(
                    f"post_local_gradient_allreduce level {g} does not exist; valid levels are "
                    f"0..{self.topology.num_levels - 1}"
                )
        if self.outer_period is not None and self.outer_period != "global":
            check_int("outer_period (an int >= 1, 'global' or None)", self.outer_period, 1)
        if self.torch_compat not in (False, True, "periodic", "hierarchical"):
            raise ValueError(
                f"torch_compat must be False, True, 'periodic' or 'hierarchical', "
                f"got {self.torch_compat!r}"
            )
        if self.torch_compat:
            unsupported = {
                "gossip": self.gossip,
                "outer_period": self.outer_period,
                "local_step_warmup_epochs": self.local_step_warmup_epochs,
            }
            bad = {k: v for k, v in unsupported.items() if v}
            if bad:
                raise ValueError(
                    f"torch_compat reproduces torch's model averagers, which have no {bad}; "
                    "set them to their defaults (False / None / 0) or use torch_compat=False"
                )
            if self.warmup_mode != "gradients":
                raise ValueError("torch_compat warms up with gradient all-reduce (post_localSGD_"
                                 "hook); warmup_mode must be 'gradients'")
            if self._torch_kind() == "periodic" and len(self._averaged_levels()) != 1:
                raise ValueError(
                    "torch_compat='periodic' (PeriodicModelAverager) needs exactly one averaging "
                    f"level, got {len(self._averaged_levels())}; use 'hierarchical'"
                )

        if self.streaming is not None:
            self._check_streaming()
        if self.worker_steps is not None:
            self._check_worker_steps()
        if self.rounds is not None:
            self._check_rounds()
        if self.rejoin not in ("average", "zero"):
            raise ValueError(f"rejoin={self.rejoin!r}: 'average' (a returning worker trains "
                             "from the group's average) or 'zero' (its first round back sends a "
                             "zero pseudo-gradient)")
        if self.rejoin == "zero" and self.away is None:
            raise ValueError("rejoin='zero' is the rule for workers returning from away: give "
                             "away too")
        if self.away is not None:
            self._check_away()
        if self.late is not None:
            self._check_late()

    def _check_away(self) -> None:
        k = self.topology.world_size
        try:
            away = tuple(tuple(int(v) for v in iv) for iv in self.away)
        except (TypeError, ValueError):
            away = ()
        if not away or any(len(iv) != 3 for iv in away):
            raise ValueError(f"away={self.away!r}: a non-empty list of (worker, first round, last "
                             "round) triples")
        for w, first, last in away:
            if not 0 <= w < k:
                raise ValueError(f"away: worker {w} does not exist (world_size {k}: workers 0 .. "
                                 f"{k - 1})")
            if not 1 <= first <= last:
                raise ValueError(f"away: worker {w}'s rounds {first} .. {last}: need 1 <= first "
                                 "<= last (rounds of the local phase count from 1)")
        object.__setattr__(self, "away", away)
        self._refuse_unless_flat_rounds("away (churn)")
        rounds = {r for _, first, last in away for r in range(first, last + 1)}
        for r in sorted(rounds):
            if len({w for w, first, last in away if first <= r <= last}) == k:
                raise ValueError(f"away: every worker is away in round {r}; at least one must "
                                 "stay to average")

    def _check_late(self) -> None:
        k = self.topology.world_size
        try:
            late = tuple(tuple(int(v) for v in p) for p in self.late)
        except (TypeError, ValueError):
            late = ((),)
        if any(len(p) != 2 for p in late):
            raise ValueError(f"late={self.late!r}: a list of (worker, round) pairs")
        for w, r in late:
            if not 0 <= w < k:
                raise ValueError(f"late: worker {w} does not exist (world_size {k}: workers 0 .. "
                                 f"{k - 1})")
            if r < 1:
                raise ValueError(f"late: worker {w}'s round {r}: rounds of the local phase "
                                 "count from 1")
        object.__setattr__(self, "late", late)
        self._refuse_unless_flat_rounds("late (a quorum's merge)")
        for w, r in late:
            if w in self._away_in_round(r):
                raise ValueError(f"late: worker {w} is away in round {r}; only a worker present "
                                 "can miss the merge")
            if w in self._joining_in_round(r):
                raise ValueError(f"late: worker {w} rejoins in round {r} with a zero "
                                 "pseudo-gradient (rejoin='zero'); it cannot be late")
        for r in sorted({r for _, r in late}):
            gone = self._away_in_round(r) | {w for w, q in late if q == r}
            if len(gone) == k:
                raise ValueError(f"late: no worker is on time in round {r}; a merge needs one")

    def _refuse_unless_flat_rounds(self, what: str) -> None:
        """One line naming the first setting churn's or a quorum's rounds of flat local SGD
        cannot run with."""
        clash = {"a hierarchy": self.topology.num_levels > 1, "gossip": self.gossip,
                 "torch_compat": bool(self.torch_compat), "streaming": self.streaming,
                 "worker_steps": self.worker_steps, "rounds": self.rounds,
                 "an int outer_period": isinstance(self.outer_period, int)
                 and not isinstance(self.outer_period, bool),
                 "local_step_warmup_epochs": self.local_step_warmup_epochs,
                 "post_local_gradient_allreduce": self.grad_level is not None}
        bad = [name for name, v in clash.items() if v]
        if bad:
            raise ValueError(f"{what} runs rounds of flat local SGD: not with {bad[0]}")

    def _round(self, t: int) -> int:
        """The 1-based round of the local phase that local update ``t`` belongs to (0: warm-up)."""
        s = t - self.warmup_steps
        return 0 if s < 1 else (s - 1) // self.topology.levels[0].period + 1

    def _away_in_round(self, r: int) -> set[int]:
        return {w for w, first, last in self.away or () if first <= r <= last}

    def _joining_in_round(self, r: int) -> set[int]:
        if self.rejoin != "zero":
            return set()
        return {w for w, _, last in self.away or () if last + 1 == r} - self._away_in_round(r)

    def absent_in(self, t: int) -> tuple[int, ...]:
        """Workers away (``away``) during local update ``t``, in order."""
        r = self._round(t)
        return tuple(sorted(self._away_in_round(r))) if r else ()

    def late_in(self, t: int) -> tuple[int, ...]:
        """Workers whose change of ``t``'s round misses its merge (``late``), in order."""
        r = self._round(t)
        return tuple(sorted({w for w, q in self.late or () if q == r})) if r else ()

    def _check_rounds(self) -> None:
        if not isinstance(self.rounds, tuple | list) or not self.rounds:
            raise ValueError(f"rounds={self.rounds!r}: a non-empty list of round lengths")
        object.__setattr__(self, "rounds", tuple(self.rounds))
        for i, h in enumerate(self.rounds):
            check_int(f"rounds[{i}]", h, 1)
        clash = {"a hierarchy": self.topology.num_levels > 1, "gossip": self.gossip,
                 "torch_compat": bool(self.torch_compat), "streaming": self.streaming,
                 "worker_steps": self.worker_steps, "away": self.away,
                 "an int outer_period": isinstance(
                     self.outer_period, int) and not isinstance(self.outer_period, bool),
                 "local_step_warmup_epochs": self.local_step_warmup_epochs,
                 "post_local_gradient_allreduce": self.grad_level is not None}
        bad = [k for k, v in clash.items() if v]
        if bad:
            raise ValueError(f"rounds (explicit round lengths) run flat local SGD: not with "
                             f"{bad[0]}")
        ends, s = [], 0
        for h in self.rounds:
            s += h
            ends.append(s)
        object.__setattr__(self, "_round_ends", frozenset(ends))
        object.__setattr__(self, "_rounds_total", s)

    def _check_worker_steps(self) -> None:
        steps = self.worker_steps
        if not isinstance(steps, tuple | list) or len(steps) != self.topology.world_size:
            raise ValueError(f"worker_steps={steps!r}: one H per worker, "
                             f"{self.topology.world_size} of them")
        object.__setattr__(self, "worker_steps", tuple(steps))
        period = self.topology.levels[-1].period
        for k, h in enumerate(steps):
            check_int(f"worker_steps[{k}]", h, 1)
            if h > period:
                raise ValueError(f"worker_steps[{k}]={h} > {period}, the round between global "
                                 "averages: a worker makes at most one update per step")
        periodic_outer = self.outer_period not in (None, "global")  # SlowMo's own period
        bad = {k: v for k, v in {"torch_compat": self.torch_compat, "gossip": self.gossip,
                                 "streaming": self.streaming,
                                 "outer_period": self.outer_period if periodic_outer else None,
                                 "local_step_warmup_epochs": self.local_step_warmup_epochs,
                                 "post_local_gradient_allreduce":
                                     self.post_local_gradient_allreduce}.items() if v}
        if bad or self.topology.num_levels != 1:
            raise ValueError(f"per-worker H (worker_steps) runs rounds of flat local SGD: not "
                             f"with {bad or f'{self.topology.num_levels} levels'}")

    def _check_streaming(self) -> None:
        st = self.streaming
        if not isinstance(st, Streaming):
            raise ValueError(f"streaming must be a Streaming, got {type(st).__name__}")  # noqa: TRY004
        bad = {"torch_compat": self.torch_compat, "gossip": self.gossip,
               "local_step_warmup_epochs": self.local_step_warmup_epochs,
               "post_local_gradient_allreduce": self.post_local_gradient_allreduce}
        bad = {k: v for k, v in bad.items() if v}
        if bad:
            raise ValueError(f"streaming fragment sync cannot run with {bad}: fragments are "
                             "merged against a global reference on a fixed period")
        if self.topology.num_levels != 1:
            raise ValueError(f"streaming fragment sync averages the whole world on one period; "
                             f"the topology has {self.topology.num_levels} levels (give a flat "
                             "one: no block_size)")
        if self.outer_period not in (None, "global"):
            raise ValueError(f"streaming fragment sync applies the outer update to each fragment "
                             f"at its merge: outer_period must be 'global' or None, got "
                             f"{self.outer_period!r}")
        period = self.topology.levels[0].period
        if st.fragments > period:
            raise ValueError(f"streaming fragments={st.fragments} > H={period}: every fragment "
                             "needs its own offset in the period")
        if st.overlap >= period:
            raise ValueError(f"streaming overlap={st.overlap} >= H={period}: a fragment's "
                             "average must be merged before its next launch")

    # -- helpers -----------------------------------------------------------------------------

    @property
    def grad_level(self) -> int | None:
        """Level whose groups all-reduce gradients after warm-up (None: no such level)."""
        g = self.post_local_gradient_allreduce
        if g is False:
            return None
        return 0 if g is True else int(g)

    def _averaged_levels(self) -> list[int]:
        g = self.grad_level
        return list(range(0 if g is None else g + 1, self.topology.num_levels))

    def _torch_kind(self) -> str:
        if self.torch_compat in ("periodic", "hierarchical"):
            return str(self.torch_compat)
        return "periodic" if len(self._averaged_levels()) == 1 else "hierarchical"

    def _due_level(self, t: int, origin: int, cap: int | None) -> int | None:
        """Highest averaged level whose (possibly capped) period divides t - origin."""
        for i in reversed(self._averaged_levels()):
            period = self.topology.levels[i].period
            if cap is not None:
                period = min(period, cap)
            if (t - origin) % period == 0:
                return i
        return None

    # -- the question ------------------------------------------------------------------------

    def action(self, t: int) -> Action:
        """What happens around local update t (t = 1, 2, ...)."""
        check_int("step t", t, 1)
        top = self.topology.top
        w = self.warmup_steps
        if self.torch_compat:
            return self._torch_action(t)
        if t <= w:
            if self.warmup_mode == "gradients":
                return Action(t, allreduce_grads_level=top, warmup=True)
            return Action(t, level=top, warmup=True)
        origin, cap, epoch_end = w, None, False
        if self.local_step_warmup_epochs:
            epoch = (t - 1) // self.steps_per_epoch  # update t belongs to epoch (t-1)//S
            if epoch < self.local_step_warmup_epochs:
                origin, cap = max(w, epoch * self.steps_per_epoch), 2**epoch
                epoch_end = t % self.steps_per_epoch == 0
            else:
                origin = max(w, self.local_step_warmup_epochs * self.steps_per_epoch)
        if self.streaming is not None:
            s, period = t - w, self.topology.levels[0].period
            return Action(t, fragment=self.streaming.launched(s, period),
                          merge=self.streaming.merged(s, period))
        if self.rounds is not None:  # explicit rounds: the world averages where one ends
            s, last = t - w, self._rounds_total
            due = s in self._round_ends or (s > last and (s - last) % self.rounds[-1] == 0)
            level = top if due else None
            return Action(t, level=level, outer=due and self.outer_period == "global")
        averaged = self._averaged_levels()
        if epoch_end and averaged:  # close the epoch's last round: phases restart next epoch
            level = averaged[-1]
        else:
            level = self._due_level(t, origin, cap)
        idle = absent = ()
        if self.worker_steps is not None:  # worker k updates in the first H_k steps of a round
            place = (t - origin - 1) % self.topology.levels[-1].period
            idle = tuple(k for k, h in enumerate(self.worker_steps) if place >= h)
        if self.away is not None or self.late is not None:
            r = self._round(t)  # churn: away for the round, left out of its average
            away, joining = self._away_in_round(r), self._joining_in_round(r)
            idle = tuple(sorted(away | joining))  # a zero joiner: idle, but in the average
            absent = tuple(sorted(away | set(self.late_in(t)))) if level == top else ()
        outer = False
        if self.outer_period == "global":
            outer = level == top
        elif self.outer_period is not None and (t - w) % self.outer_period == 0:
            outer, level = True, top
        gossip = self.gossip and level is None
        return Action(t, level=level, allreduce_grads_level=self.grad_level, outer=outer,
                      gossip=gossip, idle=idle, absent=absent)

    def _torch_action(self, t: int) -> Action:
        s, w = t - 1, self.warmup_steps
        if s < w:  # post_localSGD_hook: global gradient all-reduce while iter < start iter
            return Action(t, allreduce_grads_level=self.topology.top, warmup=True)
        level = None
        if self._torch_kind() == "periodic":
            (i,) = self._averaged_levels()
            if (s - w) % self.topology.levels[i].period == 0:
                level = i
        else:
            level = self._due_level(s, 0, None)
        return Action(t, level=level, allreduce_grads_level=self.grad_level)

    def table(self, steps: int | Iterable[int]) -> Any:
        """Actions for steps 1..steps (or the given steps) as a pandas DataFrame, with the
        level's name and group size for display."""
        ts = range(1, steps + 1) if isinstance(steps, int) else steps
        rows = []
        for t in ts:
            a = self.action(t)
            lv = self.topology.levels[a.level] if a.level is not None else None
            rows.append({
                **a._asdict(),
                "level_name": None if lv is None else lv.name,
                "group_size": None if lv is None else lv.group_size,
            })
        import pandas as pd  # local import: the schedule itself needs no third-party package

        df = pd.DataFrame(rows, columns=[*Action._fields, "level_name", "group_size"])
        # nullable ints so "no level" shows as <NA> instead of turning levels into floats
        for col in ("level", "allreduce_grads_level", "group_size", "fragment", "merge"):
            df[col] = df[col].astype("Int64")
        return df


# --------------------------------------------------------------------------------------------
# Executing the plan: the communicator protocol and the driver shared by both torch engines
# --------------------------------------------------------------------------------------------


@runtime_checkable
class Communicator(Protocol):
    """What an engine must provide to execute a schedule.

    The replica engine (``localsgd.engines.replicas.ReplicaCommunicator``) implements it with tensor ops
    on a ``[K, n]`` stack; the distributed engine with torch.distributed on a persistent flat
    buffer. All operations are in place on the tensors the model's parameters alias.
    """

    world_size: int

    def average(self, level: int, absent: tuple[int, ...] = ()) -> None:
        """Average parameters (and configured buffers) inside each group of `level`; with
        ``absent`` (churn, the world level only) the mean of the other workers, which every
        worker takes."""

    def allreduce_grads(self, level: int) -> None:
        """Average gradients inside each group of `level` (before the optimizer step)."""

    def gossip(self, step: int) -> None:
        """One SGP push-sum round using the peer plan of `step` (``gossip.GossipPlan``)."""

    def flat_params(self) -> Any:
        """The flat parameter tensor the model aliases: ``[n]`` (distributed, this worker) or
        ``[K, n]`` (replicas). Writes into it update the model(s). Used by the outer step right
        after a global average, when all workers hold the same values."""

    def worker_digests(self) -> list[int]:
        """Every worker's parameter digest (`localsgd.collectives.digest`), in rank order, on
        every rank (a collective under torchrun); only for ``check_consistency``."""


class ConsistencyError(RuntimeError):
    """Workers that must hold the same parameters do not (`SyncDriver`'s
    ``check_consistency``): at the start, or after a world-wide average."""


class OuterStep(Protocol):
    """Outer update (``localsgd.outer.OuterUpdate``) as seen by the driver."""

    def reset(self, params: Any) -> None: ...

    def step(self, params: Any, lr: float) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class SyncDriver:
    """Runs a `SyncSchedule` through a `Communicator` (+ optional outer update).

    Use it around the inner optimizer step of every worker::

        driver.before_step()      # gradient all-reduce if the schedule asks for it
        optimizer.step()
        driver.after_step(lr)     # gossip / average / outer step; lr = inner lr of this step

    `t` counts completed local updates; `state_dict()` saves it (and the outer state) so a
    resumed run continues the same schedule.

    ``check_consistency`` (beyond the sources; torch's post-local SGD once skipped its averages
    silently, pytorch#74157, and prime's DiLoCo once started its workers from different inits,
    prime-diloco PR #13): before the first update every worker must hold the same parameters,
    and after every world-wide average (and its outer step) again; else `ConsistencyError`
    names the workers that differ. It costs one digest of the parameters per worker and check.
    """

    def __init__(self, schedule: SyncSchedule, comm: Communicator, outer: OuterStep | None = None,
                 *, check_consistency: bool = False):
        if schedule.topology.world_size != comm.world_size:
            raise ValueError(
                f"schedule is for world_size {schedule.topology.world_size} but the communicator "
                f"has {comm.world_size} workers"
            )
        needs_outer = schedule.outer_period is not None
        if needs_outer and outer is None:
            raise ValueError(
                f"schedule has outer_period={schedule.outer_period!r} but no outer update was "
                "given; pass outer=OuterUpdate(...) or set outer_period=None"
            )
        if outer is not None and not needs_outer:
            # without outer steps the outer update would be silently ignored
            raise ValueError(
                f"an outer update ({outer!r}) was given but the schedule has outer_period=None, "
                "so it would never run; set outer_period ('global' for block momentum, an int "
                "for SlowMo) or pass outer=None"
            )
        self.schedule, self.comm, self.outer = schedule, comm, outer
        self.check_consistency = check_consistency
        self.t = 0
        self.streaming = None
        if schedule.streaming is not None:
            # torch lives there; this module stays pure Python for the convex simulator
            from localsgd.streaming import FragmentSync

            self.streaming, self.outer = FragmentSync(schedule.streaming, comm, outer), None
        elif outer is not None:
            outer.reset(comm.flat_params())

    def before_step(self) -> Action:
        """Call after backward, before ``optimizer.step()``."""
        if self.check_consistency and self.t == 0:
            self._check_consensus("before the first update")
        a = self.schedule.action(self.t + 1)
        if a.allreduce_grads_level is not None:
            self.comm.allreduce_grads(a.allreduce_grads_level)
        return a

    def after_step(self, lr: float | None = None) -> Action:
        """Call after ``optimizer.step()``; `lr` is the inner learning rate (outer step scale)."""
        self.t += 1
        a = self.schedule.action(self.t)
        if a.gossip:
            self.comm.gossip(self.t)
        if a.absent:  # churn, quorum: the mean of the workers present, which every worker takes
            self.comm.average(a.level, absent=a.absent)
        elif a.level is not None:
            self.comm.average(a.level)
        if self.streaming is not None:
            if a.fragment is not None:
                self.streaming.launch(a.fragment, lr)
            if a.merge is not None:
                self.streaming.merge(a.merge)
            elif a.warmup and not self.schedule.action(self.t + 1).warmup:
                self.streaming.reset()  # the fragments' references: the model warm-up left
        if self.outer is not None:
            if a.outer:
                if lr is None:
                    raise ValueError("an outer step needs the inner lr: call after_step(lr)")
                self.outer.step(self.comm.flat_params(), lr)
            elif a.warmup and not self.schedule.action(self.t + 1).warmup:
                # warm-up progress is not a pseudo-gradient: start the outer anchor here
                self.outer.reset(self.comm.flat_params())
        if self.check_consistency and a.level == self.schedule.topology.top:
            self._check_consensus(f"after the world-wide average of update {self.t}")
        return a

    def _check_consensus(self, when: str) -> None:
        digests = self.comm.worker_digests()
        odd = [k for k, d in enumerate(digests) if d != digests[0]]
        if odd:
            raise ConsistencyError(
                f"{when}: worker{'s' if len(odd) > 1 else ''} {', '.join(map(str, odd))} of "
                f"{len(digests)} hold{'' if len(odd) > 1 else 's'} other parameters than worker "
                "0 (digests differ); an average was skipped or the workers started apart")

    def state_dict(self) -> dict:
        state = {"t": self.t, "outer": None if self.outer is None else self.outer.state_dict()}
        if self.streaming is not None:
            state["streaming"] = self.streaming.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        saved_outer = state.get("outer")
        if (self.outer is None) != (saved_outer is None):
            raise ValueError(
                f"state_dict {'has' if saved_outer is not None else 'has no'} outer-update state "
                f"but this driver {'has' if self.outer is not None else 'has no'} outer update; "
                "build the driver with the same outer update as the saved run"
            )
        self.t = int(state["t"])
        if self.outer is not None:
            self.outer.load_state_dict(saved_outer)
        if self.streaming is not None:
            if "streaming" not in state:
                raise ValueError("the state was saved without streaming fragment sync; resume "
                                 "with the schedule it was written with")
            self.streaming.load_state_dict(state["streaming"])
