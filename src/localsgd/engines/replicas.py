"""The replica engine: K model copies in one process (CPU or one GPU), each with its own inner
optimizer, mixing through a ``[K, n]`` stack of flattened parameters.

* `ReplicaCommunicator` implements `localsgd.schedule.Communicator` with tensor ops: averaging
  level l is ``flat.view(G, g, n)`` -> mean over the group dim, in place (Eq. 4/5 of the paper);
  gossip is one push-sum round of `localsgd.gossip`. Optionally averages float buffers (BatchNorm
  running stats) and the inner optimizers' per-parameter state (momentum buffers). One
  implementation serves both layouts below.
* `ReplicaEngine` builds the K replicas from one seed (identical init), gives worker k its own
  random stream (``seed + k``) and runs the shared `SyncDriver` around every inner step, so the
  algorithm code is the same one the distributed engine runs. It runs the K models one after
  the other (per-replica layout: K modules, K optimizers).
* `BatchedReplicaEngine` has the same surface but runs all K replicas as one ``torch.vmap`` of
  ``torch.func.functional_call`` over stacked ``[K, ...]`` parameters (stacked layout: one
  module skeleton, one optimizer over the stacks), or for CIFAR ResNets as one model packed
  into channel groups (`localsgd.engines.packed`) -- the way one GPU simulates K workers at
  about the cost of one model with batch K * B_loc.

In both layouts the trainable parameters alias the persistent stack (replica k's parameter j is
``flat[k, off_j:off_j + numel_j]``; stacked, it is ``flat[:, off_j:off_j + numel_j]`` viewed as
``[K, *shape]``) and every float buffer is row k of a contiguous ``[K, *shape]`` stack, so
averaging never concatenates or rebinds. (Buffer stacks are contiguous per buffer, not columns
of one flat buffer, because vmap's BatchNorm rule updates non-contiguous running stats in a
copy.)

This module holds `ReplicaEngine` and `make_engine`; `ReplicaCommunicator` and the stack's
layout (`FLAT_ALIGN`, `aligned_offsets`) live in `localsgd.engines.replica_stack`,
`BatchedReplicaEngine` in `localsgd.engines.batched` and what both engines share in
`localsgd.engines.replica_base`. Every name is importable from here.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from localsgd.engines.batched import BatchedReplicaEngine
from localsgd.engines.common import (
    Batch,
    Deferred,
    PhaseClock,
    clone_tensors,
    count_correct,
    host_map,
    read_step,
)
from localsgd.engines.replica_base import LossFn, ReplicaEngineBase
from localsgd.engines.replica_stack import ReplicaCommunicator
from localsgd.outer import OuterUpdate
from localsgd.schedule import Action, SyncDriver, SyncSchedule

__all__ = ["ReplicaEngine", "make_engine"]


class ReplicaEngine(ReplicaEngineBase):
    """K replicas trained with local / hierarchical local SGD (+ outer update, gossip), run one
    after the other.

    Args:
        model_fn: builds one model; called once under ``torch.manual_seed(seed)`` and copied K
            times, so all replicas start identical (Algorithm 1, line 1).
        schedule: the `SyncSchedule` (its topology fixes K).
        optimizer_fn: builds the inner optimizer of one replica from its parameters (in
            ``model.parameters()`` order); local momentum lives here (App. D.1.1), e.g.
            ``lambda ps: torch.optim.SGD(ps, 0.1, 0.9)``.
        outer: optional `OuterUpdate` (block momentum, SlowMo, Nesterov); needed when the
            schedule has an ``outer_period``.
        lr_schedule: optional ``it -> lr`` (e.g. `localsgd.lr.LRSchedule`), set on every
            replica before update ``it + 1``.
        seed: fixes init; worker k's data stream is ``self.generators[k]`` seeded ``seed + k``.
        average_buffers / average_momentum / peers_per_step: see `ReplicaCommunicator`.
        device: where the replicas live.
        threads: host threads the K replicas' local updates are spread over (CPU only; needs
            ``torch.set_num_threads(1)``, see `localsgd.engines.common.host_map`). Every
            replica computes exactly what it computes alone, so the result is bitwise that of
            ``threads=1``; two replicas on two cores train ~1.3-1.4x faster than one replica at a
            time with two threads per op (docs/profile.md).
    """

    def __init__(
        self,
        model_fn: Callable[[], nn.Module],
        schedule: SyncSchedule,
        optimizer_fn: Callable[[Any], torch.optim.Optimizer],
        outer: OuterUpdate | None = None,
        lr_schedule: Callable[[int], float] | None = None,
        seed: int = 0,
        average_buffers: bool = False,
        average_momentum: bool = False,
        peers_per_step: int = 1,
        device: str | torch.device = "cpu",
        threads: int = 1,
    ):
        k = self._init_common(schedule, seed, lr_schedule, device)
        if threads < 1 or (threads > 1 and self.device.type != "cpu"):
            raise ValueError(f"threads={threads}: must be >= 1, and 1 off the CPU (a GPU "
                             "already overlaps the replicas' kernels)")
        self.threads = min(int(threads), k)
        torch.manual_seed(self.seed)
        self._template = model_fn().to(device)  # never trained: the skeleton of averaged_model
        self.models = [copy.deepcopy(self._template) for _ in range(k)]
        self.comm = ReplicaCommunicator(
            schedule.topology, self.models, None, average_buffers, False, peers_per_step
        )
        # optimizers after the rebinding so any eager state sees the final tensors
        self.optimizers = [optimizer_fn(m.parameters()) for m in self.models]
        self.comm.optimizers, self.comm.average_momentum = self.optimizers, average_momentum
        self.driver = SyncDriver(schedule, self.comm, outer)

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        return self.optimizers

    def step(
        self,
        batches: Sequence[Batch],
        loss_fn: LossFn,
        stats: dict | None = None,
        sync: bool = True,
    ) -> tuple[list[float] | torch.Tensor, Action]:
        """One local update on every replica (batches[k] = (inputs, targets) of worker k), then
        whatever the schedule says. Returns the K losses (before the update) and the action.
        A replica in eval mode is put back in train mode (a sub-module left in eval mode on
        purpose, e.g. frozen BatchNorm, stays so).

        If `stats` is a dict it receives ``correct`` (K ints: argmax of the output == target on
        worker k's batch, train mode, before the update; None per worker for floating targets)
        and ``compute_seconds`` (K floats: wall time of worker k's zero_grad + forward +
        backward + optimizer step; accelerators are synchronised before each clock read); with
        host threads also ``compute_wall_seconds``, the wall time of those overlapping spans.

        ``sync=False`` reads nothing back from the device: the losses come as a tensor [K] on
        the device, ``correct`` as a device tensor [K] (or None) and ``compute_seconds`` as a
        `Deferred` (CUDA events read when asked), so an update costs no host synchronisation;
        `localsgd.training.loop.train` reads them once per record.
        """
        self._check_batches(batches)
        self._apply_lr_schedule()
        timed = stats is not None
        clock = PhaseClock(self.device) if timed else None

        def local(r: int) -> tuple[torch.Tensor, torch.Tensor | None, tuple | None]:
            model, opt, (x, y) = self.models[r], self.optimizers[r], batches[r]
            t0 = clock.mark() if timed else None
            if not model.training:  # Module.train() walks every module: ~1 us each, per step
                model.train()
            opt.zero_grad(set_to_none=True)
            out = model(x)
            loss = loss_fn(out, y)
            loss.backward()
            span = (t0, clock.mark()) if timed else None
            return loss.detach(), count_correct(out, y, 1) if timed else None, span

        def inner_step(r: int) -> tuple | None:
            t0 = clock.mark() if timed else None
            self.optimizers[r].step()
            return (t0, clock.mark()) if timed else None

        replicas = range(len(self.models))
        idle = self.schedule.action(self.t + 1).idle  # per-worker H: updates sat out
        restore = self.comm.hold(idle) if idle else None
        wall = time.perf_counter()
        losses, correct, first = zip(*host_map(local, replicas, self.threads), strict=True)
        wall = time.perf_counter() - wall
        self.driver.before_step()  # e.g. a gradient all-reduce: after every backward
        t0 = time.perf_counter()
        second = host_map(inner_step, replicas, self.threads)
        wall += time.perf_counter() - t0
        spans = [[a, b] for a, b in zip(first, second, strict=True)] if timed else []
        if restore is not None:
            restore()
        action = self.driver.after_step(self.current_lr())
        if timed:
            stats["correct"] = torch.stack(correct) if correct[0] is not None else None
            stats["compute_seconds"] = Deferred(lambda: clock.seconds(spans))
            if self.threads > 1:  # the K spans overlap: the profile needs their wall time
                stats["compute_wall_seconds"] = wall
        losses_out = torch.stack(losses)
        return (read_step(losses_out, stats) if sync else losses_out), action

    def averaged_model(self) -> nn.Module:
        """A copy of replica 0 holding the average of all replicas (parameters and float
        buffers): the model to evaluate, w-bar of Sec. 3.3."""
        model = copy.deepcopy(self._template)
        model.load_state_dict(self.models[0].state_dict())  # integer buffers, frozen params
        return self.comm.mean_model_(model)

    def state_dict(self) -> dict:
        """Everything a resume needs; tensors are cloned (model tensors alias the live stack)."""
        return clone_tensors({
            "models": [m.state_dict() for m in self.models],
            "optimizers": [o.state_dict() for o in self.optimizers],
            **self._common_state(),
        })

    def load_state_dict(self, state: dict) -> None:
        if "optimizers" not in state:
            raise ValueError(
                "state has no per-replica 'optimizers' (saved by BatchedReplicaEngine?); load "
                "it into a BatchedReplicaEngine built with the same arguments"
            )
        if len(state["models"]) != self.world_size:
            raise ValueError(
                f"state has {len(state['models'])} replicas, this engine has {self.world_size}"
            )
        for m, s in zip(self.models, state["models"], strict=True):
            m.load_state_dict(s)  # copies in place: parameters stay views of the stack
        for o, s in zip(self.optimizers, state["optimizers"], strict=True):
            o.load_state_dict(s)
        self._load_common_state(state)


def make_engine(batched: bool = False, **kwargs: Any) -> ReplicaEngine | BatchedReplicaEngine:
    """`BatchedReplicaEngine(**kwargs)` if `batched` else `ReplicaEngine(**kwargs)`."""
    return (BatchedReplicaEngine if batched else ReplicaEngine)(**kwargs)
