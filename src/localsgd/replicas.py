"""The replica engine: K model copies in one process (CPU or one GPU), each with its own inner
optimizer, mixing through a ``[K, n]`` stack of flattened parameters.

* `ReplicaCommunicator` implements `localsgd.schedule.Communicator` with tensor ops: averaging
  level l is ``flat.view(G, g, n)`` -> mean over the group dim, in place (Eq. 4/5 of the paper);
  gossip is one push-sum round of `localsgd.gossip`. Optionally averages float buffers (BatchNorm
  running stats) and the inner optimizers' per-parameter state (momentum buffers).
* `ReplicaEngine` builds the K replicas from one seed (identical init), gives worker k its own
  random stream (``seed + k``) and runs the shared `SyncDriver` around every inner step, so the
  algorithm code is the same one the distributed engine runs.

Each replica's parameters are views into one row of the persistent stack (rebound once at
construction), so averaging never concatenates or rebinds.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from . import gossip as gossip_mod
from .outer import OuterUpdate
from .schedule import Action, SyncDriver, SyncSchedule, Topology

__all__ = ["ReplicaCommunicator", "ReplicaEngine", "worker_generator"]


def worker_generator(seed: int, rank: int, device: str | torch.device = "cpu") -> torch.Generator:
    """Worker `rank`'s own random stream (data order, sampling): seeded with ``seed + rank``."""
    return torch.Generator(device=device).manual_seed(int(seed) + int(rank))


def _group_mean_(stack: torch.Tensor, group_size: int) -> None:
    """Replace every row of stack [K, ...] by the mean of its contiguous group, in place."""
    k = stack.shape[0]
    v = stack.view(k // group_size, group_size, -1)
    v.copy_(v.mean(dim=1, keepdim=True).expand_as(v))


def _clone_tensors(obj: Any) -> Any:
    if torch.is_tensor(obj):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return type(obj)((k, _clone_tensors(v)) for k, v in obj.items())
    if isinstance(obj, list | tuple):
        return type(obj)(_clone_tensors(v) for v in obj)
    return obj


class ReplicaCommunicator:
    """`Communicator` over K in-process replicas (see module docstring).

    Args:
        topology: levels and group sizes; ``world_size`` must equal ``len(models)``.
        models: the K replicas (same architecture); their parameters get rebound to rows of the
            stack ``self.flat`` ([K, n]).
        optimizers: the K inner optimizers (needed only for ``average_momentum``).
        average_buffers: also average floating-point buffers (BatchNorm running mean/var).
        average_momentum: also average the optimizers' per-parameter float state with the
            parameter's shape (SGD momentum buffers, Adam moments).
        peers_per_step: SGP peers per gossip round.
    """

    def __init__(
        self,
        topology: Topology,
        models: Sequence[nn.Module],
        optimizers: Sequence[torch.optim.Optimizer] | None = None,
        average_buffers: bool = False,
        average_momentum: bool = False,
        peers_per_step: int = 1,
    ):
        if len(models) != topology.world_size:
            raise ValueError(
                f"got {len(models)} models for a topology of world_size {topology.world_size}"
            )
        if average_momentum and (optimizers is None or len(optimizers) != len(models)):
            raise ValueError(
                f"average_momentum=True needs one optimizer per model: got "
                f"{0 if optimizers is None else len(optimizers)} for {len(models)} models"
            )
        self.topology, self.world_size = topology, topology.world_size
        self.models, self.optimizers = list(models), list(optimizers or [])
        self.average_buffers, self.average_momentum = average_buffers, average_momentum
        self.peers_per_step = peers_per_step
        self.params = [[p for p in m.parameters() if p.requires_grad] for m in self.models]
        shapes = [[p.shape for p in ps] for ps in self.params]
        if any(s != shapes[0] for s in shapes):
            raise ValueError("all replicas must have the same parameter shapes")
        first = self.params[0]
        if not first:
            raise ValueError("models have no trainable parameters")
        if len({id(p) for ps in self.params for p in ps}) != len(models) * len(first):
            # a shared parameter can alias only one row: the others would go stale silently
            raise ValueError(
                "replicas share parameter objects (the same model passed twice?); pass K "
                "independent copies, e.g. [copy.deepcopy(model) for _ in range(K)]"
            )
        dtypes = {p.dtype for ps in self.params for p in ps}
        if len(dtypes) != 1:
            raise ValueError(f"all parameters must share one dtype for the flat stack, got {dtypes}")
        n = sum(p.numel() for p in first)
        self.flat = torch.empty(self.world_size, n, dtype=first[0].dtype, device=first[0].device)
        for k, ps in enumerate(self.params):
            offset = 0
            for p in ps:
                view = self.flat[k, offset : offset + p.numel()].view_as(p)
                view.copy_(p.data)
                p.data = view  # persistent alias: averaging the stack updates the model
                offset += p.numel()
        self._ptrs = [[p.data_ptr() for p in ps] for ps in self.params]
        self.ps_weight = torch.ones(self.world_size, dtype=self.flat.dtype, device=self.flat.device)

    # -- Communicator ------------------------------------------------------------------------

    def flat_params(self) -> torch.Tensor:
        return self.flat

    def _check_aliasing(self) -> None:
        # rebinding p.data (vector_to_parameters, .to(), load_state_dict(assign=True)) detaches a
        # parameter from its row: mixing the stack would then silently miss that replica
        for k, (ps, ptrs) in enumerate(zip(self.params, self._ptrs, strict=True)):
            for j, (p, ptr) in enumerate(zip(ps, ptrs, strict=True)):
                if p.data_ptr() != ptr:
                    raise RuntimeError(
                        f"parameter {j} of replica {k} no longer aliases its row of the [K, n] "
                        "stack (its .data was rebound); update parameters in place, e.g. "
                        "p.copy_(...) or model.load_state_dict(state)"
                    )

    @torch.no_grad()
    def average(self, level: int) -> None:
        self._check_aliasing()
        g = self.topology.levels[level].group_size
        if g == 1:
            return
        if torch.all(self.ps_weight == 1):
            _group_mean_(self.flat, g)
        else:  # after gossip on an irregular graph: average numerators and weights (push-sum)
            x = self.flat * self.ps_weight[:, None]
            w = self.ps_weight.clone()[:, None]
            _group_mean_(x, g)
            _group_mean_(w, g)
            self.flat.copy_(x / w)
            self.ps_weight.copy_(w[:, 0])
        if self.average_buffers:
            self._average_buffers(g)
        if self.average_momentum:
            self._average_optimizer_state(g)

    @torch.no_grad()
    def allreduce_grads(self, level: int) -> None:
        g = self.topology.levels[level].group_size
        if g == 1:
            return
        for j in range(len(self.params[0])):
            grads = [ps[j].grad for ps in self.params]
            if all(gr is None for gr in grads):
                continue
            stack = torch.stack([
                torch.zeros_like(ps[j]) if gr is None else gr
                for ps, gr in zip(self.params, grads, strict=True)
            ])
            _group_mean_(stack, g)
            for ps, row in zip(self.params, stack, strict=True):
                ps[j].grad = row.clone()

    @torch.no_grad()
    def gossip(self, step: int) -> None:
        self._check_aliasing()
        plan = gossip_mod.plan(step, self.world_size, self.peers_per_step)
        gossip_mod.mix_(self.flat, self.ps_weight, plan)

    # -- extras ------------------------------------------------------------------------------

    def _average_buffers(self, g: int) -> None:
        bufs = [[b for b in m.buffers() if b.is_floating_point()] for m in self.models]
        for j in range(len(bufs[0])):
            stack = torch.stack([b[j] for b in bufs])
            _group_mean_(stack, g)
            for b, row in zip(bufs, stack, strict=True):
                b[j].copy_(row)

    def _average_optimizer_state(self, g: int) -> None:
        for j in range(len(self.params[0])):
            states = [opt.state.get(ps[j], {}) for opt, ps in zip(self.optimizers, self.params,
                                                                   strict=True)]
            for key, value in states[0].items():
                if not (torch.is_tensor(value) and value.is_floating_point()
                        and value.shape == self.params[0][j].shape):
                    continue
                if any(key not in s or s[key] is None for s in states):
                    continue
                stack = torch.stack([s[key] for s in states])
                _group_mean_(stack, g)
                for s, row in zip(states, stack, strict=True):
                    s[key].copy_(row)

    def consensus_distance(self) -> float:
        """(1/K) sum_k ||w_k - w_bar||^2, the diversity measure of Sec. 3.3."""
        return float(((self.flat - self.flat.mean(0, keepdim=True)) ** 2).sum(1).mean())

    def state_dict(self) -> dict:
        return {"ps_weight": self.ps_weight.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.ps_weight.copy_(state["ps_weight"])


class ReplicaEngine:
    """K replicas trained with local / hierarchical local SGD (+ outer update, gossip).

    Args:
        model_fn: builds one model; called once under ``torch.manual_seed(seed)`` and copied K
            times, so all replicas start identical (Algorithm 1, line 1).
        schedule: the `SyncSchedule` (its topology fixes K).
        optimizer_fn: builds the inner optimizer of one replica from its parameters; local
            momentum lives here (App. D.1.1), e.g. ``lambda ps: torch.optim.SGD(ps, 0.1, 0.9)``.
        outer: optional `OuterUpdate` (block momentum, SlowMo, Nesterov); needed when the
            schedule has an ``outer_period``.
        lr_schedule: optional ``it -> lr`` (e.g. `localsgd.lr.LRSchedule`), set on every
            replica before update ``it + 1``.
        seed: fixes init; worker k's data stream is ``self.generators[k]`` seeded ``seed + k``.
        average_buffers / average_momentum / peers_per_step: see `ReplicaCommunicator`.
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
    ):
        self.schedule, self.seed = schedule, int(seed)
        k = schedule.topology.world_size
        torch.manual_seed(self.seed)
        base = model_fn().to(device)
        self.models = [copy.deepcopy(base) for _ in range(k)]
        self.comm = ReplicaCommunicator(
            schedule.topology, self.models, None, average_buffers, False, peers_per_step
        )
        # optimizers after the rebinding so any eager state sees the final tensors
        self.optimizers = [optimizer_fn(m.parameters()) for m in self.models]
        self.comm.optimizers, self.comm.average_momentum = self.optimizers, average_momentum
        self.lr_schedule = lr_schedule
        self.driver = SyncDriver(schedule, self.comm, outer)
        self.generators = [worker_generator(self.seed, r) for r in range(k)]

    @property
    def world_size(self) -> int:
        return len(self.models)

    @property
    def t(self) -> int:
        """Completed local updates."""
        return self.driver.t

    def current_lr(self) -> float:
        return float(self.optimizers[0].param_groups[0]["lr"])

    def step(
        self,
        batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> tuple[list[float], Action]:
        """One local update on every replica (batches[k] = (inputs, targets) of worker k), then
        whatever the schedule says. Returns the K losses (before the update) and the action."""
        if len(batches) != self.world_size:
            raise ValueError(f"need {self.world_size} batches (one per worker), got {len(batches)}")
        if self.lr_schedule is not None:
            lr = float(self.lr_schedule(self.t))
            for opt in self.optimizers:
                for group in opt.param_groups:
                    group["lr"] = lr
        losses = []
        for model, opt, (x, y) in zip(self.models, self.optimizers, batches, strict=True):
            model.train()
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            losses.append(float(loss.detach()))
        self.driver.before_step()
        for opt in self.optimizers:
            opt.step()
        action = self.driver.after_step(self.current_lr())
        return losses, action

    def averaged_model(self) -> nn.Module:
        """A copy of replica 0 holding the average of all replicas (parameters and float
        buffers): the model to evaluate, w-bar of Sec. 3.3."""
        model = copy.deepcopy(self.models[0])
        with torch.no_grad():
            mean = self.comm.flat.mean(0)
            offset = 0
            for p in (p for p in model.parameters() if p.requires_grad):
                p.copy_(mean[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
            all_bufs = [list(m.buffers()) for m in self.models]
            for j, b in enumerate(model.buffers()):
                if b.is_floating_point():
                    b.copy_(torch.stack([bs[j] for bs in all_bufs]).mean(0))
        return model

    def state_dict(self) -> dict:
        """Everything a resume needs; tensors are cloned (model tensors alias the live stack)."""
        return _clone_tensors({
            "models": [m.state_dict() for m in self.models],
            "optimizers": [o.state_dict() for o in self.optimizers],
            "driver": self.driver.state_dict(),
            "comm": self.comm.state_dict(),
            "generators": [g.get_state() for g in self.generators],
            "torch_rng": torch.get_rng_state(),
        })

    def load_state_dict(self, state: dict) -> None:
        if len(state["models"]) != self.world_size:
            raise ValueError(
                f"state has {len(state['models'])} replicas, this engine has {self.world_size}"
            )
        for m, s in zip(self.models, state["models"], strict=True):
            m.load_state_dict(s)  # copies in place: parameters stay views of the stack
        for o, s in zip(self.optimizers, state["optimizers"], strict=True):
            o.load_state_dict(s)
        self.driver.load_state_dict(state["driver"])
        self.comm.load_state_dict(state["comm"])
        for g, s in zip(self.generators, state["generators"], strict=True):
            g.set_state(s)
        torch.set_rng_state(state["torch_rng"])
