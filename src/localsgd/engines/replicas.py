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
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, stack_module_state

from localsgd import gossip as gossip_mod
from localsgd.engines.common import (
    Batch,
    Deferred,
    PhaseClock,
    clone_tensors,
    count_correct,
    cuda_rng_state,
    host_map,
    read_step,
    set_cuda_rng_state,
    to_device,
    worker_generator,
)
from localsgd.engines.packed import logits as packed_logits
from localsgd.engines.packed import supports as packable
from localsgd.outer import OuterUpdate
from localsgd.schedule import Action, SyncDriver, SyncSchedule, Topology

__all__ = [
    "BatchedReplicaEngine",
    "ReplicaCommunicator",
    "ReplicaEngine",
    "make_engine",
]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _group_mean_(stack: torch.Tensor, group_size: int) -> None:
    """Replace every row of stack [K, ...] by the mean of its contiguous group, in place."""
    k = stack.shape[0]
    if stack.is_contiguous():
        v = stack.view(k // group_size, group_size, -1)
        v.copy_(v.mean(dim=1, keepdim=True).expand_as(v))
    else:  # e.g. a transposed grad: average a contiguous copy, write it back
        v = stack.reshape(k // group_size, group_size, -1)
        stack.copy_(v.mean(dim=1, keepdim=True).expand_as(v).reshape(stack.shape))


def _mean_rows_(rows: torch.Tensor | Sequence[torch.Tensor], group_size: int) -> None:
    """Group mean over K replicas given as one [K, ...] tensor or as K separate tensors."""
    if torch.is_tensor(rows):
        _group_mean_(rows, group_size)
        return
    stack = torch.stack(list(rows))
    _group_mean_(stack, group_size)
    for row, mean in zip(rows, stack, strict=True):
        row.copy_(mean)


# Each tensor's slice of a row of the [K, n] stack starts on a multiple of this many elements
# (256 B in float32, 128 B in bfloat16). cuDNN's channels-last kernels load weights with vector
# instructions and failed with "misaligned address" on ResNet-20's replica 1, whose row began
# 8 bytes past a 16-byte boundary (H200, figures/gpu/). Counted in elements, not bytes, so the
# layout is the same in every dtype (doctor compares float32 with float64 state by state).
# torchrun's flat buffers stay gap-free: gloo's ring all-reduce sums each chunk in another rank
# order, so gaps there would break bit-equality with torch's averagers.
FLAT_ALIGN = 64


def aligned_offsets(numels: Sequence[int]) -> tuple[list[int], int]:
    """Start of each tensor in a row when every start is a multiple of FLAT_ALIGN, and the row's
    length (elements). The gaps hold zeros, which averaging, gossip and the outer step keep at
    zero: each is linear with no constant term, applied column by column."""
    offsets, end = [], 0
    for n in numels:
        offsets.append(end)
        end += -(-int(n) // FLAT_ALIGN) * FLAT_ALIGN
    return offsets, end


def _stack_into_flat(stacks: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Copy [K, *shape_j] tensors into one zero-padded [K, n] buffer; return it and the
    [K, *shape_j] views ``flat[:, off_j:off_j + numel_j].view(K, *shape_j)`` that alias it.
    Every row and every ``off_j`` starts on a multiple of `FLAT_ALIGN` (`aligned_offsets`)."""
    k = stacks[0].shape[0]
    offsets, n = aligned_offsets([s[0].numel() for s in stacks])
    flat = torch.zeros(k, n, dtype=stacks[0].dtype, device=stacks[0].device)
    views = []
    for s, offset in zip(stacks, offsets, strict=True):
        view = flat[:, offset : offset + s[0].numel()].view(s.shape)
        view.copy_(s)
        views.append(view)
    return flat, views


class ReplicaCommunicator:
    """`Communicator` over K in-process replicas (see module docstring).

    Args:
        topology: levels and group sizes; ``world_size`` must equal ``len(models)``.
        models: the K replicas (same architecture); their trainable parameters get rebound to
            rows of the stack ``self.flat`` ([K, n]) and their float buffers to rows of
            ``self.buffer_stacks`` (one contiguous [K, *shape] tensor per buffer).
        optimizers: the K inner optimizers (needed only for ``average_momentum``).
        average_buffers: also average floating-point buffers (BatchNorm running mean/var).
        average_momentum: also average the optimizers' per-parameter float state with the
            parameter's shape (SGD momentum buffers, Adam moments).
        peers_per_step: SGP peers per gossip round.

    `ReplicaCommunicator.stacked` builds the same communicator for the batched engine's layout.
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
        self.models = list(models)
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
            raise ValueError(f"all parameters must share one dtype for the flat stack: {dtypes}")
        k = len(self.models)
        flat, columns = _stack_into_flat([torch.stack([ps[j].detach() for ps in self.params])
                                          for j in range(len(first))])
        aliases = []
        for r, ps in enumerate(self.params):
            for j, p in enumerate(ps):
                p.data = columns[j][r]  # persistent alias of flat[r, off_j:off_j + numel_j]
                aliases.append((p, f"parameter {j} of replica {r}"))
        bufs = [[b for b in m.buffers() if b.is_floating_point()] for m in self.models]
        if any([b.shape for b in bs] != [b.shape for b in bufs[0]] for bs in bufs):
            raise ValueError("all replicas must have the same floating-point buffer shapes")
        buffer_stacks = []
        for j in range(len(bufs[0])):
            stack = torch.stack([bs[j] for bs in bufs])
            for r in range(k):
                bufs[r][j].data = stack[r]  # BatchNorm updates running stats in place: the row
                aliases.append((bufs[r][j], f"buffer {j} of replica {r}"))
            buffer_stacks.append(stack)
        self._setup(topology, flat, [list(col) for col in zip(*self.params, strict=True)],
                    buffer_stacks, optimizers, False, average_buffers, average_momentum,
                    peers_per_step, aliases)

    @classmethod
    def stacked(
        cls,
        topology: Topology,
        flat: torch.Tensor,
        params: Sequence[torch.Tensor],
        buffer_stacks: Sequence[torch.Tensor],
        optimizer: torch.optim.Optimizer | None = None,
        average_buffers: bool = False,
        average_momentum: bool = False,
        peers_per_step: int = 1,
    ) -> ReplicaCommunicator:
        """The communicator of the batched layout: `params` are the trainable [K, *shape] views
        of `flat` ([K, n]), `buffer_stacks` the contiguous [K, *shape] float buffers, and one
        `optimizer` over the stacks (its state is [K, *shape] too)."""
        if flat.dim() != 2 or flat.shape[0] != topology.world_size:
            raise ValueError(
                f"flat must be [world_size={topology.world_size}, n], got {tuple(flat.shape)}"
            )
        self = cls.__new__(cls)
        self.models, self.params = [], []
        aliases = [(p, f"stacked parameter {j}") for j, p in enumerate(params)]
        self._setup(topology, flat, [[p] for p in params], list(buffer_stacks),
                    None if optimizer is None else [optimizer], True, average_buffers,
                    average_momentum, peers_per_step, aliases)
        return self

    def _setup(self, topology, flat, slots, buffer_stacks, optimizers, stacked, average_buffers,
               average_momentum, peers_per_step, aliases) -> None:
        expected = 1 if stacked else topology.world_size
        if average_momentum and (optimizers is None or len(optimizers) != expected):
            need = "one optimizer over the stacks" if stacked else "one optimizer per model"
            raise ValueError(
                f"average_momentum=True needs {need}: got "
                f"{0 if optimizers is None else len(optimizers)} for {topology.world_size} models"
            )
        self.topology, self.world_size = topology, topology.world_size
        self.flat, self.buffer_stacks, self.optimizers = flat, buffer_stacks, list(optimizers or [])
        self.average_buffers, self.average_momentum = average_buffers, average_momentum
        self.peers_per_step = peers_per_step
        # _slots[j]: trainable parameter j of every replica (K tensors, or one [K, ...] stack)
        self._slots, self._stacked = slots, stacked
        # one worker's parameter elements (flat's rows also hold alignment gaps)
        self.param_numel = sum(col[0].numel() // (self.world_size if stacked else 1)
                               for col in slots)
        self._aliases = [(t, t.data_ptr(), label) for t, label in aliases]
        self.ps_weight = torch.ones(self.world_size, dtype=flat.dtype, device=flat.device)
        self.gossiped = False  # ps_weight may differ from 1 (SGP's push-sum weights)

    # -- Communicator ------------------------------------------------------------------------

    def flat_params(self) -> torch.Tensor:
        return self.flat

    def packed(self) -> torch.Tensor:
        """A copy of the replicas' parameters as a gap-free ``[K, n_params]`` matrix (row k is
        ``torch.cat([p.flatten() for p in trainable params of replica k])``); ``self.flat``
        is the same numbers with each tensor starting on an aligned offset."""
        k = self.world_size
        with torch.no_grad():
            return torch.cat([(col[0] if self._stacked else torch.stack(col)).reshape(k, -1)
                              for col in self._slots], dim=1)

    def _check_aliasing(self) -> None:
        # rebinding p.data (vector_to_parameters, .to(), load_state_dict(assign=True)) detaches a
        # tensor from its row: mixing the stack would then silently miss that replica
        for t, ptr, label in self._aliases:
            if t.data_ptr() != ptr:
                raise RuntimeError(
                    f"{label} no longer aliases its row of the replica stack (its .data was "
                    "rebound); update parameters and buffers in place, e.g. p.copy_(...) or "
                    "model.load_state_dict(state)"
                )

    def _rows(self, tensors: list[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
        return tensors[0] if self._stacked else tensors

    @torch.no_grad()
    def average(self, level: int) -> None:
        self._check_aliasing()
        g = self.topology.levels[level].group_size
        if g == 1:
            return
        if not self.gossiped:  # a host flag: reading ps_weight would wait for the GPU
            _group_mean_(self.flat, g)
        else:  # after gossip on an irregular graph: average numerators and weights (push-sum)
            x = self.flat * self.ps_weight[:, None]
            w = self.ps_weight.clone()[:, None]
            _group_mean_(x, g)
            _group_mean_(w, g)
            self.flat.copy_(x / w)
            self.ps_weight.copy_(w[:, 0])
        if self.average_buffers:
            for stack in self.buffer_stacks:
                _group_mean_(stack, g)
        if self.average_momentum:
            self._average_optimizer_state(g)

    @torch.no_grad()
    def allreduce_grads(self, level: int) -> None:
        g = self.topology.levels[level].group_size
        if g == 1:
            return
        for members in self._slots:
            if all(p.grad is None for p in members):
                continue
            for p in members:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            _mean_rows_(self._rows([p.grad for p in members]), g)

    @torch.no_grad()
    def gossip(self, step: int) -> None:
        self._check_aliasing()
        plan = gossip_mod.plan(step, self.world_size, self.peers_per_step)
        gossip_mod.mix_(self.flat, self.ps_weight, plan)
        self.gossiped = True

    # -- extras ------------------------------------------------------------------------------

    def _average_optimizer_state(self, g: int) -> None:
        for members in self._slots:
            states = [opt.state.get(p, {}) for opt, p in zip(self.optimizers, members,
                                                             strict=True)]
            for key, value in states[0].items():
                if not (torch.is_tensor(value) and value.is_floating_point()
                        and value.shape == members[0].shape):
                    continue
                if any(key not in s or s[key] is None for s in states):
                    continue
                _mean_rows_(self._rows([s[key] for s in states]), g)

    def consensus_distance(self) -> float:
        """(1/K) sum_k ||w_k - w_bar||^2, the diversity measure of Sec. 3.3."""
        return float(((self.flat - self.flat.mean(0, keepdim=True)) ** 2).sum(1).mean())

    def mean_model_(self, model: nn.Module) -> nn.Module:
        """Write the replicas' mean into `model` (same architecture): trainable parameters from
        the flat stack, float buffers from the buffer stacks; w-bar of Sec. 3.3."""
        with torch.no_grad():
            mean = self.flat.mean(0)
            params = [p for p in model.parameters() if p.requires_grad]
            offsets, _ = aligned_offsets([p.numel() for p in params])
            for p, offset in zip(params, offsets, strict=True):
                p.copy_(mean[offset : offset + p.numel()].view_as(p))
            bufs = [b for b in model.buffers() if b.is_floating_point()]
            for b, stack in zip(bufs, self.buffer_stacks, strict=True):
                b.copy_(stack.mean(0))
        return model

    def state_dict(self) -> dict:
        return {"ps_weight": self.ps_weight.clone(), "gossiped": self.gossiped}

    def load_state_dict(self, state: dict) -> None:
        self.ps_weight.copy_(state["ps_weight"])
        self.gossiped = bool(state.get("gossiped", not torch.all(self.ps_weight == 1)))


class _Engine:
    """What both replica engines share: schedule/driver bookkeeping, lr schedule, resume state."""

    driver: SyncDriver
    comm: ReplicaCommunicator

    def _init_common(self, schedule: SyncSchedule, seed: int, lr_schedule, device) -> int:
        self.schedule, self.seed, self.lr_schedule = schedule, int(seed), lr_schedule
        self.device = torch.device(device)
        self.generators = [worker_generator(self.seed, r) for r in range(self.world_size)]
        return schedule.topology.world_size

    @property
    def world_size(self) -> int:
        return self.schedule.topology.world_size

    @property
    def t(self) -> int:
        """Completed local updates."""
        return self.driver.t

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

    def _common_state(self) -> dict:
        return {
            "driver": self.driver.state_dict(),
            "comm": self.comm.state_dict(),
            "generators": [g.get_state() for g in self.generators],
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": cuda_rng_state(self.device),
        }

    def _load_common_state(self, state: dict) -> None:
        self.driver.load_state_dict(to_device(state["driver"], self.device))
        self.comm.load_state_dict(state["comm"])  # copied into live tensors: keeps their device
        for g, s in zip(self.generators, state["generators"], strict=True):
            g.set_state(s.cpu())  # generator states are CPU byte tensors on every device
        torch.set_rng_state(state["torch_rng"].cpu())
        set_cuda_rng_state(state.get("cuda_rng"), self.device)


class ReplicaEngine(_Engine):
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
        `localsgd.train.train` reads them once per record.
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
        wall = time.perf_counter()
        losses, correct, first = zip(*host_map(local, replicas, self.threads), strict=True)
        wall = time.perf_counter() - wall
        self.driver.before_step()  # e.g. a gradient all-reduce: after every backward
        t0 = time.perf_counter()
        second = host_map(inner_step, replicas, self.threads)
        wall += time.perf_counter() - t0
        spans = [[a, b] for a, b in zip(first, second, strict=True)] if timed else []
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


class BatchedReplicaEngine(_Engine):
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
        flat, views = _stack_into_flat([params[n].detach() for n in trainable])
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


def make_engine(batched: bool = False, **kwargs: Any) -> ReplicaEngine | BatchedReplicaEngine:
    """`BatchedReplicaEngine(**kwargs)` if `batched` else `ReplicaEngine(**kwargs)`."""
    return (BatchedReplicaEngine if batched else ReplicaEngine)(**kwargs)
