"""`LocalSGDOptimizer`: any torch optimizer + a `SyncSchedule` executed by a communicator.

``step()`` = the schedule's gradient all-reduce (if due) -> the inner step (local update, eq. 3;
local momentum of App. D.1.1 lives in the inner optimizer) -> gossip / model averaging of the
due level (eq. 4/5) -> outer update when due (block momentum, App. D.1.2; SlowMo). The per-step
logic is ``localsgd.schedule.SyncDriver``, the same object the replica engine runs, so the two
engines cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .schedule import Action, SyncDriver, SyncSchedule


class LocalSGDOptimizer(torch.optim.Optimizer):
    """Wrap ``optimizer`` so every ``step()`` also runs ``schedule`` through ``communicator``.

    Args:
        optimizer: the inner (local) optimizer, e.g. ``torch.optim.SGD(..., momentum=0.9)``.
        schedule: what happens at each local update ``t``.
        communicator: a ``localsgd.schedule.Communicator`` (``DistributedCommunicator`` for
            torch.distributed, ``ReplicaCommunicator`` in one process).
        outer: optional ``localsgd.outer.OuterUpdate``; required when the schedule has outer
            steps. The outer step is scaled by the inner lr of the first param group.

    ``state_dict()`` carries the inner state, the step counter ``t`` (the schedule position),
    the outer state (anchor, momentum) and the communicator's (push-sum weight), so loading it
    into a freshly built wrapper continues the run exactly (together with the model's
    ``state_dict``).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: SyncSchedule, communicator,
                 outer=None):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(  # noqa: TRY004 - the project reports bad arguments as ValueError
                f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        # Like torch's PostLocalSGDOptimizer: no Optimizer.__init__, share the inner groups.
        self.optim = optimizer
        self.param_groups = optimizer.param_groups
        self.defaults = optimizer.defaults
        if schedule.away is not None:
            raise ValueError("churn (away) keeps an absent worker's state from before its "
                             "forward pass, which an optimizer wrapper never sees: use an "
                             "engine (ReplicaEngine, DDPEngine)")
        if schedule.worker_steps is not None:
            raise ValueError("per-worker H (worker_steps) keeps an idle worker's state from "
                             "before its forward pass, which an optimizer wrapper never sees: "
                             "use an engine (ReplicaEngine, DDPEngine)")
        self.communicator = communicator
        self.driver = SyncDriver(schedule, communicator, outer)
        self.last_action: Action | None = None

    @property
    def state(self):  # type: ignore[override]
        return self.optim.state

    @property
    def t(self) -> int:
        """Completed local updates (the schedule position)."""
        return self.driver.t

    def __repr__(self) -> str:
        return f"LocalSGDOptimizer(t={self.t}, {self.optim!r})"

    def step(self, closure: Callable[[], float] | None = None):  # type: ignore[override]
        self.driver.before_step()
        loss = self.optim.step(closure) if closure is not None else self.optim.step()
        self.last_action = self.driver.after_step(float(self.param_groups[0]["lr"]))
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optim.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict) -> None:
        self.optim.add_param_group(param_group)

    def state_dict(self) -> dict:  # type: ignore[override]
        comm_state = getattr(self.communicator, "state_dict", None)
        return {
            "optimizer": self.optim.state_dict(),
            "driver": self.driver.state_dict(),
            "communicator": comm_state() if comm_state is not None else None,
        }

    def load_state_dict(self, state_dict: dict) -> None:  # type: ignore[override]
        missing = {"optimizer", "driver"} - set(state_dict)
        if missing:
            raise ValueError(
                f"not a LocalSGDOptimizer state_dict: missing {sorted(missing)} (has "
                f"{sorted(state_dict)})")
        self.optim.load_state_dict(state_dict["optimizer"])
        self.driver.load_state_dict(state_dict["driver"])
        if state_dict.get("communicator") is not None:
            self.communicator.load_state_dict(state_dict["communicator"])
