"""What both replica engines (`localsgd.engines.replicas`) share: their base class
`ReplicaEngineBase` (on top of `localsgd.engines.common.ScheduledWorkers`: worker streams,
learning-rate schedule, batch checks) and the `LossFn` type."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from localsgd.engines.common import Batch, ScheduledWorkers, worker_generator
from localsgd.engines.replica_stack import ReplicaCommunicator
from localsgd.schedule import SyncDriver, SyncSchedule

__all__ = ["LossFn", "ReplicaEngineBase"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class ReplicaEngineBase(ScheduledWorkers):
    """What both replica engines share: schedule/driver bookkeeping, lr schedule, resume state."""

    driver: SyncDriver
    comm: ReplicaCommunicator

    def _init_common(self, schedule: SyncSchedule, seed: int, lr_schedule, device) -> int:
        self.schedule, self.seed, self.lr_schedule = schedule, int(seed), lr_schedule
        self.device = torch.device(device)
        self.generators = [worker_generator(self.seed, r) for r in range(self.world_size)]
        return schedule.topology.world_size

    @property
    def local_ranks(self) -> list[int]:
        """The workers this process runs: all K (under torchrun each process runs one)."""
        return list(range(self.world_size))

    def all_gather_object(self, obj: Any) -> list:
        """One ``obj`` from every process, in rank order (here: this process only); the training
        loop's one point of contact with other processes (torch.distributed.all_gather_object
        under torchrun)."""
        return [obj]

    @property
    def param_bytes(self) -> int:
        """Bytes of one worker's parameters: what one model average moves."""
        return int(self.comm.param_numel * self.comm.flat.element_size())

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        raise NotImplementedError

    def current_lr(self) -> float:
        return float(self._optimizers()[0].param_groups[0]["lr"])

    def _check_batches(self, batches: Sequence[Batch]) -> None:
        if len(batches) != self.world_size:
            raise ValueError(f"need {self.world_size} batches (one per worker), got {len(batches)}")

    def _apply_lr_schedule(self) -> None:
        if self.lr_schedule is None:
            return
        lr = float(self.lr_schedule(self.t))
        for opt in self._optimizers():
            for group in opt.param_groups:
                group["lr"] = lr
