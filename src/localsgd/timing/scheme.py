"""`Scheme`: one communication schedule for the wall-clock simulator (`localsgd.timing.simulate`)
-- synchronous, local and hierarchical SGD, SlowMo, SGP or any `SyncSchedule` -- and its
per-step plan (`Scheme.plan`: which groups all-reduce gradients, average models or gossip at
each step).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from localsgd.schedule import Streaming, SyncSchedule
from localsgd.topology import Topology

__all__ = ["SCHEME_KINDS", "Scheme"]

SCHEME_KINDS = ("sync", "local", "hier", "slowmo", "sgp", "stream", "schedule")

_SCHEME_HELP = (
    "'sync' | 'local:H' | 'hsgd:P1-G1,P2-G2,...' (PyTorch period-group pairs, e.g. "
    "'hsgd:2-8,4-32,8-64') | 'hier:H=2,Kp=4,Hb=4' (the paper's H, K', H^b) | "
    "'slowmo:localsgd,F,S' (base local SGD every F steps, slow momentum every S) | "
    "'slowmo:sgp,S' | 'sgp' | 'stream:H,P,T' (streaming fragment sync: P fragments, each "
    "averaged every H steps and merged T steps after its launch); append '+hostgrad' / '-hostgrad' to force the per-step intra-host "
    "gradient all-reduce on / off for that scheme")


@dataclass(frozen=True)
class Scheme:
    """One communication schedule for `simulate`.

    ``levels`` are model-averaging levels in PyTorch's ``period → group size`` form (contiguous
    ranks, group sizes nesting, the last the whole world; when several are due only the largest
    runs — the blog's "How Does Hierarchical SGD Work?" rules, `localsgd.schedule.SyncSchedule`).

    kinds: ``sync`` (DDP: gradient all-reduce of the world every step, overlapped with backward);
    ``local`` / ``hier`` (model averaging by ``levels``; with ``host_grad`` the workers of a host
    also all-reduce gradients every step, PyTorch's ``post_local_gradient_allreduce``, blog
    "Algorithm Hyperparameters"); ``slowmo`` (SlowMo document, 001: intra-node gradient
    all-reduce every step, base algorithm local SGD every ``localsgd_frequency`` steps or SGP
    every step between nodes, and every ``slowmo_frequency`` steps an exact world average plus
    the sharded slow-momentum step); ``sgp`` (one push-sum message per step to one peer of the
    exponential graph, `localsgd.gossip`, between nodes with intra-node gradient all-reduce);
    ``stream`` (streaming fragment sync, `localsgd.schedule.Streaming`: ``fragments`` parts of
    the model each averaged by the world every H = ``levels[0][0]`` steps at its own offset, the
    average travelling ``overlap`` steps while the workers compute);
    ``schedule`` (any `SyncSchedule`, e.g. exactly what the torchrun runner executes: see
    `Scheme.from_train_config`).

    ``host_grad``: None follows `simulate(intra_host_grad_allreduce=...)`; True/False forces it.
    ``warmup_steps``: post-local SGD warm-up (world gradient all-reduce for those first steps).
    """

    kind: str
    levels: tuple[tuple[int, int], ...] = ()
    name: str = ""
    host_grad: bool | None = None
    warmup_steps: int = 0
    base: str = "localsgd"
    localsgd_frequency: int = 1
    slowmo_frequency: int = 48
    schedule: object = None  # a SyncSchedule for kind "schedule"
    fragments: int = 1  # kind "stream": P
    overlap: int = 0  # kind "stream": τ

    def __post_init__(self) -> None:
        if self.kind not in SCHEME_KINDS:
            raise ValueError(f"scheme kind {self.kind!r}: expected one of {SCHEME_KINDS}")
        if self.kind == "slowmo" and self.base not in ("localsgd", "sgp"):
            raise ValueError(f"slowmo base {self.base!r}: expected 'localsgd' or 'sgp'")
        for field in ("localsgd_frequency", "slowmo_frequency"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{field}={v!r}: must be an integer >= 1")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) \
                or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps={self.warmup_steps!r}: must be an integer >= 0")
        if self.kind == "stream":
            Streaming(self.fragments, self.overlap)  # P >= 1, τ >= 0 in its words
            if len(self.levels) != 1:
                raise ValueError("a 'stream' scheme has one level: ((H, 0),)")
        if self.kind in ("local", "hier") and not self.levels:
            raise ValueError(f"a {self.kind!r} scheme needs levels, e.g. ((8, world_size),)")
        if self.kind == "schedule" and self.schedule is None:
            raise ValueError("kind 'schedule' needs schedule=SyncSchedule(...)")
        if not self.name:
            object.__setattr__(self, "name", self._default_name())

    # -- constructors ----------------------------------------------------------------------

    @classmethod
    def sync(cls, name: str = "sync") -> Scheme:
        """Synchronous SGD (DDP): world gradient all-reduce every step."""
        return cls("sync", name=name)

    @classmethod
    def local(cls, H: int, *, host_grad: bool | None = None, warmup_steps: int = 0,
              name: str = "") -> Scheme:
        """Local SGD: the world averages models every ``H`` steps (world size filled in later)."""
        return cls("local", ((H, 0),), name=name, host_grad=host_grad, warmup_steps=warmup_steps)

    @classmethod
    def hierarchical(cls, period_group_sizes, *, host_grad: bool | None = None,
                     warmup_steps: int = 0, name: str = "") -> Scheme:
        """PyTorch form ``{period: group_size}`` (``HierarchicalModelAverager``), e.g.
        ``{2: 8, 4: 32, 8: 128}``; a last group size of 0 means "the whole world"."""
        items = list(period_group_sizes.items() if hasattr(period_group_sizes, "items")
                     else period_group_sizes)
        if not items:
            raise ValueError("period_group_sizes must not be empty, e.g. {2: 8, 8: 64}")
        return cls("hier", tuple((int(p), int(g)) for p, g in items), name=name,
                   host_grad=host_grad, warmup_steps=warmup_steps)

    @classmethod
    def paper(cls, H: int, block_size: int, block_steps: int, *, host_grad: bool | None = None,
              warmup_steps: int = 0, name: str = "") -> Scheme:
        """Lin et al. Algorithm 2 (eq. 5): blocks of K' = ``block_size`` average every ``H``
        steps, the world every ``H·H^b``; flat local SGD when H^b = 1."""
        if block_steps == 1:
            return cls.local(H, host_grad=host_grad, warmup_steps=warmup_steps,
                             name=name or f"hier H={H} K'={block_size} Hb=1")
        return cls("hier", ((H, block_size), (H * block_steps, 0)), host_grad=host_grad,
                   warmup_steps=warmup_steps,
                   name=name or f"hier H={H} K'={block_size} Hb={block_steps}")

    @classmethod
    def slowmo(cls, base: str = "localsgd", localsgd_frequency: int = 3,
               slowmo_frequency: int = 48, name: str = "") -> Scheme:
        """SlowMo (fairscale document, 001): defaults are its recommended
        ``localsgd_frequency`` = 3 and "typically every 48 iterations"."""
        return cls("slowmo", name=name, base=base, localsgd_frequency=localsgd_frequency,
                   slowmo_frequency=slowmo_frequency)

    @classmethod
    def streaming(cls, H: int, fragments: int, overlap: int = 0, *, warmup_steps: int = 0,
                  name: str = "") -> Scheme:
        """Streaming fragment sync (Douillard et al. 2025): ``fragments`` parts, each averaged
        by the world once every ``H`` steps, merged ``overlap`` steps after its launch."""
        return cls("stream", ((H, 0),), name=name, warmup_steps=warmup_steps,
                   fragments=fragments, overlap=overlap)

    @classmethod
    def sgp(cls, name: str = "sgp") -> Scheme:
        return cls("sgp", name=name)

    @classmethod
    def from_schedule(cls, schedule, name: str = "schedule") -> Scheme:
        """Exactly the syncs of a `localsgd.schedule.SyncSchedule` (levels, gradient levels,
        warm-up, gossip, outer steps): ``action(t)`` is read for every simulated step."""
        return cls("schedule", name=name, schedule=schedule)

    @classmethod
    def from_train_config(cls, cfg, steps_per_epoch: int, name: str = "", lr=None,
                          updates: int | None = None) -> Scheme:
        """What ``python -m localsgd.training.runner`` runs for a `TrainConfig`: the
        `SyncSchedule` `localsgd.training.loop.train` builds (`TrainConfig.sync_schedule`;
        ``steps_per_epoch`` = per-worker share of the data // local_batch, as
        `localsgd.training.loop.update_counts` computes it; ``lr`` and ``updates`` for QSR)."""
        return cls.from_schedule(cfg.sync_schedule(steps_per_epoch, lr, updates),
                                 name=name or "train config")

    @classmethod
    def parse(cls, text: str) -> Scheme:
        """Parse a scheme string: """ + _SCHEME_HELP + "."
        if isinstance(text, Scheme):
            return text
        raw = str(text).strip()
        s = raw.lower().replace(" ", "")
        host_grad = None
        if s.endswith("+hostgrad"):
            s, host_grad = s[: -len("+hostgrad")], True
        elif s.endswith("-hostgrad"):
            s, host_grad = s[: -len("-hostgrad")], False
        kind, _, arg = s.partition(":")
        try:
            if kind == "sync" and not arg:
                return cls.sync(name=raw)
            if kind == "local":
                return cls.local(int(arg), host_grad=host_grad, name=raw)
            if kind == "hsgd":
                pairs = [tuple(int(v) for v in part.split("-")) for part in arg.split(",")]
                if not pairs or any(len(p) != 2 for p in pairs):
                    raise ValueError
                return cls.hierarchical(pairs, host_grad=host_grad, name=raw)
            if kind == "hier":
                kv = dict(part.split("=") for part in arg.split(","))
                return cls.paper(int(kv["h"]), int(kv["kp"]), int(kv["hb"]),
                                 host_grad=host_grad, name=raw)
            if kind == "slowmo":
                parts = arg.split(",") if arg else ["localsgd"]
                if parts[0] == "localsgd":
                    nums = [int(v) for v in parts[1:]] or [3]
                    return cls.slowmo("localsgd", nums[0], nums[1] if len(nums) > 1 else 48,
                                      name=raw)
                if parts[0] == "sgp":
                    return cls.slowmo("sgp", 1, int(parts[1]) if len(parts) > 1 else 48,
                                      name=raw)
                raise ValueError
            if kind == "sgp" and not arg:
                return cls.sgp(name=raw)
            if kind == "stream":
                h, p, tau = (int(v) for v in arg.split(","))
                return cls.streaming(h, p, tau, name=raw)
        except (ValueError, KeyError, IndexError):
            pass
        raise ValueError(f"scheme {raw!r} not understood; expected {_SCHEME_HELP}")

    def _default_name(self) -> str:
        if self.kind == "sync":
            return "sync"
        if self.kind == "local":
            return f"local:{self.levels[0][0]}"
        if self.kind == "hier":
            return "hsgd:" + ",".join(f"{p}-{g or 'K'}" for p, g in self.levels)
        if self.kind == "slowmo":
            return (f"slowmo:localsgd,{self.localsgd_frequency},{self.slowmo_frequency}"
                    if self.base == "localsgd" else f"slowmo:sgp,{self.slowmo_frequency}")
        if self.kind == "stream":
            return f"stream:{self.levels[0][0]},{self.fragments},{self.overlap}"
        return self.kind

    # -- the per-step plan ------------------------------------------------------------------

    def plan(self, workers: int, gpus_per_node: int, steps: int,
             host_grad_default: bool = False) -> dict[str, np.ndarray]:
        """Per step t = 1..steps: ``grad`` (group size all-reducing gradients before the update,
        1 = none), ``avg`` (group size averaging models after it, 1 = none), ``gossip`` (offset
        in ranks of the peer a worker receives from, 0 = none), ``allgather`` (1 where a
        sharded slow-momentum step all-gathers the model after a world average), ``fragment``
        (P where one of P streamed fragments starts its world average, 0 = none) and
        ``merge`` (1 where a streamed fragment's average must have arrived)."""
        return _plan(self, workers, gpus_per_node, steps, host_grad_default)


def _gossip_offset(step: int, units: int) -> int:
    """Offset of the one peer of `localsgd.gossip.plan(step, units)` (exponential graph,
    one peer per step: ``2^(step mod J)``); inlined so the model does not import torch."""
    phases = max(units - 1, 0).bit_length()
    return 2 ** (step % phases) if phases else 0


def _schedule_plan(schedule, steps: int) -> dict[str, np.ndarray]:
    topo = schedule.topology
    sizes = [lv.group_size for lv in topo.levels]
    out = {k: np.ones(steps, dtype=np.int64) for k in ("grad", "avg")}
    for key in ("gossip", "allgather", "fragment", "merge"):
        out[key] = np.zeros(steps, dtype=np.int64)
    for i in range(steps):
        a = schedule.action(i + 1)
        if a.fragment is not None:
            out["fragment"][i] = schedule.streaming.fragments
        if a.merge is not None:
            out["merge"][i] = 1
        if a.allreduce_grads_level is not None:
            out["grad"][i] = sizes[a.allreduce_grads_level]
        if a.level is not None:
            out["avg"][i] = sizes[a.level]
        if a.gossip:
            out["gossip"][i] = _gossip_offset(i + 1, topo.world_size)
    return out


@lru_cache(maxsize=256)
def _plan(scheme: Scheme, workers: int, gpn: int, steps: int,
          host_grad_default: bool) -> dict[str, np.ndarray]:
    if scheme.kind == "schedule":
        if scheme.schedule.topology.world_size != workers:
            raise ValueError(f"scheme {scheme.name!r}: its schedule is for "
                             f"{scheme.schedule.topology.world_size} workers, not {workers}")
        return _schedule_plan(scheme.schedule, steps)
    if scheme.kind == "sync":
        return _schedule_plan(SyncSchedule(Topology([(1, workers)], workers),
                                           warmup_steps=steps), steps)
    if scheme.kind == "stream":
        return _schedule_plan(SyncSchedule(
            Topology([(scheme.levels[0][0], workers)], workers),
            warmup_steps=scheme.warmup_steps,
            streaming=Streaming(scheme.fragments, scheme.overlap)), steps)
    if scheme.kind in ("local", "hier"):
        levels = [(p, g if g else workers) for p, g in scheme.levels]
        if levels[-1][1] != workers:
            raise ValueError(f"scheme {scheme.name!r}: the last group ({levels[-1][1]}) must be "
                             f"the whole world of {workers} workers")
        host_grad = host_grad_default if scheme.host_grad is None else scheme.host_grad
        grad_level: int | bool = False
        if host_grad and gpn > 1:
            if any(g % gpn for _, g in levels if g >= gpn) or any(g < gpn for _, g in levels):
                raise ValueError(f"scheme {scheme.name!r}: intra-host gradient all-reduce needs "
                                 f"every group size to be a multiple of gpus_per_node={gpn}")
            if levels[0][1] == gpn:  # the host level exists: it all-reduces gradients instead
                grad_level = 0
            elif levels[0][0] == 1:
                raise ValueError(f"scheme {scheme.name!r}: a period-1 level of "
                                 f"{levels[0][1]} workers beside the host gradient group")
            else:
                levels = [(1, gpn), *levels]
                grad_level = 0
        topo = Topology(levels, workers)
        return _schedule_plan(SyncSchedule(topo, warmup_steps=scheme.warmup_steps,
                                           post_local_gradient_allreduce=grad_level), steps)
    # slowmo / sgp: nodes are the units; GPUs of a node all-reduce gradients every step (001)
    if workers % gpn:
        raise ValueError(f"{workers} workers are not whole nodes of gpus_per_node={gpn}")
    nodes = workers // gpn
    t = np.arange(1, steps + 1)
    out = {"grad": np.full(steps, max(1, gpn), dtype=np.int64),
           "avg": np.ones(steps, dtype=np.int64), "gossip": np.zeros(steps, dtype=np.int64),
           "allgather": np.zeros(steps, dtype=np.int64),
           "fragment": np.zeros(steps, dtype=np.int64), "merge": np.zeros(steps, dtype=np.int64)}
    gossiping = scheme.kind == "sgp" or scheme.base == "sgp"
    if gossiping and nodes > 1:
        out["gossip"] = np.array([_gossip_offset(int(s), nodes) * gpn for s in t])
    elif scheme.kind == "slowmo":
        out["avg"][t % scheme.localsgd_frequency == 0] = workers
    if scheme.kind == "slowmo":
        slow = t % scheme.slowmo_frequency == 0
        out["avg"][slow] = workers  # exact average before the slow-momentum step
        out["gossip"][slow] = 0
        out["allgather"][slow] = 1
    return out
