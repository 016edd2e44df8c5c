"""`RunPack`: R independent training runs of one model, K and B_loc as one stack of R·K replicas.

Runs that differ only in what a run does *between* its forward passes -- its seed (initial
model, data order, augmentation streams), its schedule (H, H^b, warm-ups, SGP), its learning
rate schedule, its momentum scheme and weight decay, its outer step -- share the forward and
backward pass: the R·K replicas are one vmapped or channel-packed model
(`localsgd.engines.batched.BatchedReplicaEngine`, the way one GPU trains K workers at about the
cost of one model at batch K·B_loc, now R·K). Everything else is per run (`RunSlice`): the
run's rows ``r·K … r·K + K - 1`` of the stacks, its own inner optimizer over views of those
rows, its `ReplicaCommunicator` and `SyncDriver` (averaging never crosses runs: a run's
communicator sees only its rows), its lr schedule and its worker streams. A run's records equal
the same run trained alone (tests/test_run_pack.py, float64), and a run that diverges to NaN
leaves the others' rows untouched: replica i's loss depends on its own row only.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from localsgd.engines.batched import BatchedReplicaEngine
from localsgd.engines.common import Deferred, PhaseClock, clone_tensors, count_correct
from localsgd.engines.replica_base import LossFn, ReplicaEngineBase
from localsgd.engines.replica_stack import ReplicaCommunicator
from localsgd.schedule import Action, SyncDriver, SyncSchedule
from localsgd.topology import Topology

__all__ = ["RunPack", "RunSlice"]


class RunSlice(ReplicaEngineBase):
    """Run r of a `RunPack`: the `localsgd.engines.Engine` surface the training loop reads
    (``t``, ``world_size``, ``generators``, ``current_lr``, ``averaged_model``, ``state_dict``,
    ``comm``, ``driver``), over the run's rows of the pack's stacks. Its ``step`` is the pack's:
    one update trains every run."""

    def __init__(self, pack: RunPack, r: int, parts: Any):
        k = self._init_common(parts.schedule, parts.seed, parts.lr_schedule, pack.device)
        self.pack, self.rows = pack, slice(r * k, (r + 1) * k)
        # the run's initial model, as the run alone draws it (Algorithm 1, line 1)
        torch.manual_seed(self.seed)
        start = parts.model_fn().to(pack.device)
        state = start.state_dict()
        with torch.no_grad():
            for n, p in pack.params.items():
                p[self.rows] = state[n]
            for n, b in pack.buffers.items():
                b[self.rows] = state[n]
        # leaves over the run's rows (views: the pack's forward and the run's optimizer share
        # the storage); their gradients are views of the pack's
        self.params = {n: nn.Parameter(p.detach()[self.rows], requires_grad=p.requires_grad)
                       for n, p in pack.params.items()}
        trainable = [p for p in self.params.values() if p.requires_grad]
        self.optimizer = parts.optimizer_fn(list(self.params.values()))
        self.comm = ReplicaCommunicator.stacked(
            parts.schedule.topology, pack.comm.flat[self.rows], trainable,
            [b[self.rows] for b in pack.buffers.values() if b.is_floating_point()],
            self.optimizer, parts.average_buffers, parts.average_momentum,
            parts.peers_per_step)
        self.driver = SyncDriver(parts.schedule, self.comm, parts.outer)
        parts.apply_state_sync(self.comm, self.driver)

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]

    def _take_grads(self) -> None:
        for n, p in self.params.items():
            g = self.pack.params[n].grad
            p.grad = None if g is None else g[self.rows]

    def step(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a packed run steps with its pack: RunPack.step trains every run")

    def averaged_model(self) -> nn.Module:
        """The mean of the run's K replicas (w-bar, Sec. 3.3), as a plain module."""
        model = copy.deepcopy(self.pack._template)
        model.load_state_dict(self.pack.replica_state_dict(self.rows.start))
        return self.comm.mean_model_(model)

    def state_dict(self) -> dict:
        """What resuming this run needs, in `BatchedReplicaEngine.state_dict`'s format."""
        return clone_tensors({
            "models": [self.pack.replica_state_dict(i)
                       for i in range(self.rows.start, self.rows.stop)],
            "optimizer": self.optimizer.state_dict(), **self._common_state()})

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        if len(state["models"]) != self.world_size:
            raise ValueError(f"state has {len(state['models'])} replicas, this run has "
                             f"{self.world_size}")
        for i, saved in zip(range(self.rows.start, self.rows.stop), state["models"],
                            strict=True):
            for n, t in self.pack.replica_state_dict(i).items():
                t.copy_(saved[n])
        self.optimizer.load_state_dict(state["optimizer"])
        self._load_common_state(state)


class RunPack(BatchedReplicaEngine):
    """R runs (``parts``: each run's `localsgd.training.loop.EngineParts`; one model, K) as one
    `BatchedReplicaEngine` of R·K replicas whose own schedule never runs: each run has its
    `RunSlice` (``runs``). ``packed``/``compile`` as the batched engine's."""

    def __init__(self, parts: Sequence[Any], device: str | torch.device = "cpu",
                 packed: bool | str = "auto", compile: bool = False):
        if not parts:
            raise ValueError("a RunPack needs at least one run")
        k = parts[0].schedule.topology.world_size
        if any(p.schedule.topology.world_size != k for p in parts):
            raise ValueError("the runs of a pack share K: got "
                             f"{[p.schedule.topology.world_size for p in parts]}")
        total = k * len(parts)
        # the stacks of R·K replicas; their own schedule (one group, never due) stays unused
        idle = SyncSchedule(Topology([(10**9, total)], total))
        super().__init__(parts[0].model_fn, idle, lambda ps: torch.optim.SGD(ps, lr=0.0),
                         device=device, packed=packed, compile=compile)
        self.k = k
        self.runs = [RunSlice(self, r, p) for r, p in enumerate(parts)]

    @property
    def t(self) -> int:
        return self.runs[0].t

    def step(self, batches: Sequence[Any], loss_fn: LossFn, stats: dict | None = None,
             sync: bool = False) -> tuple[torch.Tensor, list[Action]]:
        """One local update of every run: ``batches`` are the R·K workers' (run r's at
        r·K … r·K + K - 1); one forward and backward for all, then each run's own gradient
        all-reduce (warm-ups), optimizer step and schedule action. Returns the R·K losses
        (on the device) and the R actions; ``stats`` as `BatchedReplicaEngine.step`'s."""
        x, y = self._stack_batches(batches)
        layout = (torch.channels_last if x.dim() == 5 and batches[0][0].is_contiguous(
            memory_format=torch.channels_last) and not batches[0][0].is_contiguous()
            else torch.contiguous_format)
        for run in self.runs:
            run._apply_lr_schedule()
        # per-worker H: each run's workers that sit this update out keep their state
        holds = [run.comm.hold(idle) if (idle := run.schedule.action(run.t + 1).idle)
                 else None for run in self.runs]
        clock = PhaseClock(self.device) if stats is not None else None
        t0 = clock.mark() if clock else None
        if not self._template.training:
            self._template.train()
        for p in self.params.values():
            p.grad = None
        losses, out = self._forward(x, y, loss_fn, layout)
        losses.sum().backward()
        actions = []
        for run, restore in zip(self.runs, holds, strict=True):
            run._take_grads()
            run.driver.before_step()
            run.optimizer.step()
            if restore is not None:
                restore()
            actions.append(run.driver.after_step(run.current_lr()))
        if clock is not None:
            span = [(t0, clock.mark())]
            n = len(batches)
            stats["correct"] = count_correct(out, y, 2)
            stats["compute_seconds"] = Deferred(lambda: [clock.seconds([span])[0] / n] * n)
        return losses.detach(), actions

    def state_dict(self) -> dict:
        return {"runs": [run.state_dict() for run in self.runs]}

    def load_state_dict(self, state: dict) -> None:
        for run, saved in zip(self.runs, state["runs"], strict=True):
            run.load_state_dict(saved)

