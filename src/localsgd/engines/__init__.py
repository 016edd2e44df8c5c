"""Engines: what runs the K workers' inner steps and executes the schedule's plan.

* `localsgd.engines.replicas`: K model copies in this process (`ReplicaEngine`, one after the
  other; `BatchedReplicaEngine`, one ``torch.vmap``), mixing through a ``[K, n]`` stack.
* `localsgd.engines.ddp`: `DDPEngine`, this process's worker of a torchrun job (DDP for gradient
  averaging, the core's averagers for model averaging); `localsgd.training.runner` is its command
  line.

Both have the surface of `Engine`, the one thing the training loop (`localsgd.training.loop.train`)
and the checkpoints (`localsgd.training.checkpoint`) talk to (docs/layout.md: one loop, two
engines).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from localsgd.engines.batched import BatchedReplicaEngine
from localsgd.engines.common import Batch, clone_tensors, count_correct, worker_generator
from localsgd.engines.ddp import COMPILE_MODES, DDPEngine
from localsgd.engines.replica_stack import ReplicaCommunicator
from localsgd.engines.replicas import ReplicaEngine, make_engine
from localsgd.schedule import Action

__all__ = ["COMPILE_MODES", "Batch", "BatchedReplicaEngine", "DDPEngine", "Engine",
           "ReplicaCommunicator", "ReplicaEngine", "clone_tensors", "count_correct",
           "make_engine", "worker_generator"]


@runtime_checkable
class Engine(Protocol):
    """The surface `localsgd.training.loop.train` uses: one local update of this process's workers
    plus the schedule's action, the counters and streams a resume needs, and the one collective the
    loop itself runs (``all_gather_object``)."""

    generators: list[torch.Generator]
    """One random stream per worker this process runs (``seed + rank``: data order, crops)."""

    @property
    def t(self) -> int:
        """Completed local updates."""

    @property
    def world_size(self) -> int:
        """K, the number of workers of the run (all processes)."""

    @property
    def local_ranks(self) -> list[int]:
        """The workers this process runs: all K in the replica engines, one under torchrun."""

    @property
    def param_bytes(self) -> int:
        """Bytes of one worker's parameters: what one model average moves."""

    def step(self, batches: Sequence[Batch], loss_fn: Callable[[torch.Tensor, torch.Tensor],
             torch.Tensor], stats: dict | None = None,
             sync: bool = True) -> tuple[list[float] | torch.Tensor, Action]:
        """One local update of every local worker (``batches[i]`` for ``local_ranks[i]``), then
        what the schedule says; the losses and the `Action` taken. With ``stats``, fills
        ``stats["correct"]`` and ``stats["compute_seconds"]`` (one entry per local worker).
        ``sync=False``: losses and hit counts as device tensors, the seconds as a `Deferred`
        (no host synchronisation; `localsgd.training.loop.train` reads them once per record)."""

    def current_lr(self) -> float:
        """The learning rate of the last update."""

    def averaged_model(self) -> nn.Module:
        """A copy of the model averaged over all K workers (w-bar, Sec. 3.3); collective."""

    def all_gather_object(self, obj: Any) -> list:
        """``obj`` from every process, in rank order (collective; ``[obj]`` in one process)."""

    def state_dict(self) -> dict:
        """Everything an exact resume of this process's workers needs."""

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict`'s output."""
