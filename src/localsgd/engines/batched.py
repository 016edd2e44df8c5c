"""`BatchedReplicaEngine`: the replica engine's batched path (`localsgd.engines.replicas`).

All K replicas run as one ``torch.vmap`` of ``torch.func.functional_call`` over stacked
``[K, ...]`` parameters (stacked layout: one module skeleton, one optimizer over the stacks), or
for CIFAR ResNets as one model packed into channel groups (`localsgd.engines.packed`) -- the way
one GPU simulates K workers at about the cost of one model with batch K * B_loc.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, stack_module_state

from localsgd.engines.common import (
    Batch,
    Deferred,
    PhaseClock,
    clone_tensors,
    count_correct,
    read_step,
)
from localsgd.engines.packed import logits as packed_logits
from localsgd.engines.packed import supports as packable
from localsgd.engines.replica_base import LossFn, ReplicaEngineBase
from localsgd.engines.replica_stack import ReplicaCommunicator, stack_into_flat
from localsgd.outer import OuterUpdate
from localsgd.schedule import Action, SyncDriver, SyncSchedule

__all__ = ["BatchedReplicaEngine"]


def _float_batchnorm_input(module: nn.Module, args: tuple) -> tuple | None:
    """Forward pre-hook: hand BatchNorm float32 inputs under bf16/fp16 autocast. Under vmap, the
    BatchNorm rule runs ops that need the running statistics in the input's dtype (seen on an
    H200: "Expected running_mean to have type BFloat16 but got Float"). cuDNN's own BatchNorm
    takes bf16 inputs and computes in float32 anyway; what changes is its output's dtype: the
    ReLU and residual add after it run in float32 here (bf16 in the sequential engine) until
    the next convolution casts back to bf16. bf16 is opt-in and for speed only."""
    x = args[0]
    if x.dtype in (torch.bfloat16, torch.float16):
        return (x.float(), *args[1:])
    return None


def _reject_dropout(model: nn.Module) -> None:
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            raise ValueError(
                f"BatchedReplicaEngine does not support dropout: module {name!r} has p={m.p}. "
                "Under torch.vmap the K replicas' masks would come from one batched draw of the "
                "global generator, not the K draws the sequential engine makes, so the batched "
                "run would silently differ from ReplicaEngine; use ReplicaEngine or p=0"
            )


class BatchedReplicaEngine(ReplicaEngineBase):
    """`ReplicaEngine` with all K replicas in one vmapped forward/backward.

    Same constructor and surface as `ReplicaEngine` (``step``, ``t``, ``world_size``,
    ``generators``, ``current_lr()``, ``averaged_model()``, ``state_dict()``, ``comm``,
    ``driver``). The model is stacked with ``torch.func.stack_module_state``; its trainable
    parameters become ``[K, *shape]`` views of the ``[K, n]`` stack ``comm.flat`` (so averaging,
    gossip and the outer step are exactly `ReplicaCommunicator`'s) and its buffers ``[K, *shape]``
    stacks (BatchNorm running statistics stay per replica; updated under vmap in train mode).
    One step is ``vmap(functional_call(model, ...))`` over the stacked parameters, buffers and
    batches, then ``losses.sum().backward()``: replica k's loss depends only on its own row, so
    row k of each gradient is worker k's gradient.

    ``optimizer_fn`` receives the stacked parameters (``self.params``, in
    ``model.parameters()`` order; each has one more leading dim than the model's) and builds
    ONE optimizer. For element-wise optimizers (SGD with momentum / weight decay / Nesterov,
    Adam) that is exactly K independent optimizers; position-based param groups (e.g. BN
    parameters without weight decay) work, ``p.dim()``-based ones see the extra dim. Optimizers
    with cross-element state (LARS/LAMB trust ratios, gradient clipping by norm) would mix the
    K replicas: use `ReplicaEngine` for those.

    ``packed``: run a CIFAR ResNet / WideResNet's replicas packed into channel groups
    (`localsgd.engines.packed`: grouped convolutions over the same stacks, equal to the vmap in
    float64) instead of vmap. 'auto' (default): packed on CUDA where the model supports it
    (1.5x vmap's images/s on an H100, figures/gpu/h100/packed.json), vmap elsewhere. The
    chosen path is ``self.packed``. ``compile``: `torch.compile` the packed forward (off by
    default: 1.17x the packed eager step on an H100 for 26 s of compiling, the same probe).

    Limits: the K batches must have equal shapes (they are stacked); the model must not draw
    random numbers in its forward (dropout with p > 0 raises: see `_reject_dropout`).
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
        packed: bool | str = "auto",
        compile: bool = False,
    ):
        k = self._init_common(schedule, seed, lr_schedule, device)
        torch.manual_seed(self.seed)
        self._template = model_fn().to(device)  # skeleton for functional_call; own tensors unused
        _reject_dropout(self._template)
        if packed not in (True, False, "auto"):
            raise ValueError(f"packed={packed!r}: must be true, false or 'auto'")
        if packed is True and not packable(self._template):
            raise ValueError(
                f"packed=True: {type(self._template).__name__} cannot be packed into channel "
                "groups (localsgd.engines.packed.supports); use packed=False (vmap) or 'auto'")
        self.packed = bool(packed is True or (packed == "auto" and self.device.type == "cuda"
                                              and packable(self._template)))
        if compile and not self.packed:
            raise ValueError("compile=True compiles the packed replicas' forward; this engine "
                             "runs the vmap (packed=False, or a model that cannot be packed)")
        template = self._template

        def logits(params, buffers, x, memory_format):
            return packed_logits(template, params, buffers, x, memory_format)

        # compiled: one graph of the K replicas' forward (its backward follows)
        self._packed_logits = torch.compile(logits) if compile else logits
        for m in self._template.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.register_forward_pre_hook(_float_batchnorm_input)
        names = [n for n, _ in self._template.named_parameters()]
        trainable = [n for n, p in self._template.named_parameters() if p.requires_grad]
        if not trainable:
            raise ValueError("model has no trainable parameters")
        dtypes = {p.dtype for p in self._template.parameters() if p.requires_grad}
        if len(dtypes) != 1:
            raise ValueError(f"all parameters must share one dtype for the flat stack: {dtypes}")
        # the replicas start identical (Algorithm 1, line 1): K references to one model suffice
        params, buffers = stack_module_state([self._template] * k)
        flat, views = stack_into_flat([params[n].detach() for n in trainable])
        stacked = dict(zip(trainable, views, strict=True))
        self.params: dict[str, nn.Parameter] = {
            n: nn.Parameter(stacked[n]) if n in stacked
            else nn.Parameter(params[n].detach().clone(), requires_grad=False)
            for n in names
        }
        self.buffers: dict[str, torch.Tensor] = {n: b.contiguous() for n, b in buffers.items()}
        self.optimizer = optimizer_fn(list(self.params.values()))
        self.comm = ReplicaCommunicator.stacked(
            schedule.topology, flat, [self.params[n] for n in trainable],
            [b for b in self.buffers.values() if b.is_floating_point()], self.optimizer,
            average_buffers, average_momentum, peers_per_step,
        )
        self.driver = SyncDriver(schedule, self.comm, outer)

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]

    def _stack_batches(self, batches: Sequence[Batch]) -> tuple[torch.Tensor, torch.Tensor]:
        self._check_batches(batches)
        for r, (x, y) in enumerate(batches):
            if (x.shape, y.shape, x.dtype, y.dtype) != (batches[0][0].shape, batches[0][1].shape,
                                                         batches[0][0].dtype, batches[0][1].dtype):
                raise ValueError(
                    f"BatchedReplicaEngine stacks the K batches into one tensor, so they need "
                    f"equal shapes and dtypes: batch {r} has inputs {tuple(x.shape)} {x.dtype} and "
                    f"targets {tuple(y.shape)} {y.dtype}, batch 0 has "
                    f"{tuple(batches[0][0].shape)} {batches[0][0].dtype} and "
                    f"{tuple(batches[0][1].shape)} {batches[0][1].dtype}; give every worker the "
                    "same local batch size (drop the last partial batch) or use ReplicaEngine"
                )
        return torch.stack([b[0] for b in batches]), torch.stack([b[1] for b in batches])

    def _forward(self, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn,
                 memory_format: torch.memory_format = torch.contiguous_format):
        template = self._template
        if self.packed:
            out = self._packed_logits(self.params, self.buffers, x, memory_format)
            return torch.vmap(loss_fn)(out, y), out

        def one_replica(params, buffers, xk, yk):
            out = functional_call(template, (params, buffers), (xk,))
            return loss_fn(out, yk), out

        # randomness="error": a random op in the forward fails loudly instead of sharing a mask
        return torch.vmap(one_replica, randomness="error")(self.params, self.buffers, x, y)

    def step(
        self,
        batches: Sequence[Batch],
        loss_fn: LossFn,
        stats: dict | None = None,
        sync: bool = True,
    ) -> tuple[list[float] | torch.Tensor, Action]:
        """One local update on every replica, as one vmapped forward/backward and one optimizer
        step over the stacks; then whatever the schedule says. Same contract as
        `ReplicaEngine.step`, except that ``stats["compute_seconds"]`` gives every worker the
        batched step's wall time / K (per-worker time is not separable inside one vmap)."""
        x, y = self._stack_batches(batches)
        layout = (torch.channels_last if x.dim() == 5 and batches[0][0].is_contiguous(
            memory_format=torch.channels_last) and not batches[0][0].is_contiguous()
            else torch.contiguous_format)
        self._apply_lr_schedule()
        timed = stats is not None
        clock = PhaseClock(self.device) if timed else None
        spans: list = []
        t0 = clock.mark() if timed else None
        idle = self.schedule.action(self.t + 1).idle  # per-worker H: updates sat out
        restore = self.comm.hold(idle) if idle else None
        if not self._template.training:
            self._template.train()
        self.optimizer.zero_grad(set_to_none=True)
        losses, out = self._forward(x, y, loss_fn, layout)
        losses.sum().backward()
        if timed:
            spans.append((t0, clock.mark()))
        self.driver.before_step()
        t0 = clock.mark() if timed else None
        self.optimizer.step()
        if timed:
            spans.append((t0, clock.mark()))
        if restore is not None:
            restore()
        action = self.driver.after_step(self.current_lr())
        k = self.world_size
        if timed:
            stats["correct"] = count_correct(out, y, 2)
            stats["compute_seconds"] = Deferred(lambda: [clock.seconds([spans])[0] / k] * k)
        losses = losses.detach()
        return (read_step(losses, stats) if sync else losses), action

    def replica_state_dict(self, k: int) -> dict[str, torch.Tensor]:
        """Replica k's model state (views of the live stacks), keyed like the model's own."""
        state = self._template.state_dict(keep_vars=True)
        missing = [n for n in state if n not in self.params and n not in self.buffers]
        if missing:
            raise ValueError(f"state entries {missing} are neither parameters nor buffers "
                             "(shared parameters?); BatchedReplicaEngine cannot stack them")
        return {n: (self.params[n] if n in self.params else self.buffers[n])[k].detach()
                for n in state}

    def averaged_model(self) -> nn.Module:
        """A plain `nn.Module` holding the mean of the K replicas (parameters and float
        buffers; integer buffers and frozen parameters from replica 0): w-bar of Sec. 3.3."""
        model = copy.deepcopy(self._template)
        model.load_state_dict(self.replica_state_dict(0))
        return self.comm.mean_model_(model)

    def state_dict(self) -> dict:
        """Everything a resume needs. ``models`` holds K per-replica state dicts in the same
        format as `ReplicaEngine.state_dict`; ``optimizer`` the one stacked optimizer."""
        return clone_tensors({
            "models": [self.replica_state_dict(k) for k in range(self.world_size)],
            "optimizer": self.optimizer.state_dict(),
            **self._common_state(),
        })

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        if "optimizer" not in state:
            raise ValueError(
                "state has no stacked 'optimizer' (saved by ReplicaEngine?); load it into a "
                "ReplicaEngine built with the same arguments"
            )
        if len(state["models"]) != self.world_size:
            raise ValueError(
                f"state has {len(state['models'])} replicas, this engine has {self.world_size}"
            )
        for k, saved in enumerate(state["models"]):
            live = self.replica_state_dict(k)
            if saved.keys() != live.keys():
                raise ValueError(f"replica {k}: state keys {sorted(saved)} differ from the "
                                 f"model's {sorted(live)}; build the engine with the same model")
            for n, t in live.items():
                t.copy_(saved[n])  # in place: parameters stay views of the stack
        self.optimizer.load_state_dict(state["optimizer"])
        self._load_common_state(state)
