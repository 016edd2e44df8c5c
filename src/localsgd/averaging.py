"""Model averaging over torch.distributed on persistent flat buffers.

The averagers have the shape of torch's ``ModelAverager`` (a ``step`` counter and
``average_parameters(params)``; they subclass it, so torch's ``PostLocalSGDOptimizer`` accepts
them) and implement the synchronisation of eq. (4) (local SGD) and eq. (5) (hierarchical local
SGD) of Lin et al., i.e. the all-reduce lines 10/11/13/14 of Algorithms 1-2.

What differs from ``torch.distributed.algorithms.model_averaging.utils.average_parameters``:

* one persistent flat buffer per (device, dtype): an averaging step is one in-place all-reduce
  per level, with no ``torch.cat`` allocation and no ``.data`` rebinding per call;
* by default parameters *become views into* that buffer (adopted once, at first use), so the
  averaged values land in the parameters without any copy; ``id(p)``, ``p.data_ptr()`` (after
  adoption) and the memory format (e.g. channels_last) never change afterwards. Tensors that
  cannot be adopted, or whose storage was replaced later (``module.to()``, ``load_state_dict(
  assign=True)``), are detected by pointer and copied in/out or re-adopted;
* optional averaging of floating-point module buffers (BatchNorm running statistics) and of
  optimizer state (momentum buffers);
* ranks that disagree on the tensors being averaged (count, shapes, dtypes) fail loudly with a
  ``ValueError`` raised on every rank, instead of silently mixing unrelated values;
* per-level process groups are built once with ``dist.new_group`` (works on gloo/CPU, unlike
  ``dist.new_subgroups``' CUDA-based default).

The flat buffers, process groups and tensor sets live in `localsgd.collectives` (import them
from there); this module holds what averages through them: the averagers and
`DistributedCommunicator`, which share the one all-reduce to the mean (`all_reduce_mean`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.model_averaging.averagers import ModelAverager

from localsgd.collectives import (
    TensorSet,
    build_groups,
    contiguous_blocks,
    digest,
    float_buffers,
    optimizer_state_tensors,
    per_element_state,
)
from localsgd.compression import Compression, compressed_average

# the public names defined here (the flat buffers and groups: localsgd.collectives)
__all__ = ["DistributedCommunicator", "FlatAverager", "HierarchicalAverager", "PeriodicAverager",
           "TorchHierarchy", "all_reduce_mean", "average_parameters"]


# --------------------------------------------------------------------------- averagers


def _params_of(params) -> list[torch.Tensor]:
    """Accept ``model.parameters()`` or ``optimizer.param_groups`` (what PostLocalSGDOptimizer
    passes); keep tensors that require grad (a stable set, unlike torch's ``grad is not None``
    filter, so the flat buffer stays valid from call to call)."""
    out: list[torch.Tensor] = []
    for item in params:
        if isinstance(item, torch.Tensor):
            if item.requires_grad:
                out.append(item)
        elif isinstance(item, dict):
            out.extend(p for p in item["params"] if p.requires_grad)
        else:
            raise TypeError(
                f"params must be tensors or param-group dicts, got {type(item).__name__}")
    return out


def all_reduce_mean(buf: torch.Tensor, size: int, group) -> dist.Work:
    """Start an in-place all-reduce that leaves the mean of ``buf`` over ``group``.

    ReduceOp.AVG costs the same as SUM on gloo and NCCL, saving the separate division pass
    (~20 % of the call at 11M floats on CPU). For a power-of-two group size it is bitwise equal
    to torch's divide-then-sum. fp16 keeps torch's divide-first order so the sum cannot overflow.
    """
    if buf.dtype != torch.float16:
        return dist.all_reduce(buf, op=dist.ReduceOp.AVG, group=group, async_op=True)
    buf.div_(size)
    return dist.all_reduce(buf, group=group, async_op=True)


class FlatAverager(ModelAverager):
    """Averaging machinery shared by :class:`PeriodicAverager` and :class:`HierarchicalAverager`.

    Args:
        process_group: the group all levels live in (default: WORLD).
        module: module whose floating-point buffers (BatchNorm running stats) are averaged
            together with the parameters when ``average_buffers`` is true.
        optimizer: optimizer whose per-parameter state (momentum buffers; ``state_keys`` to pick
            entries) is averaged too, in a second flat buffer: the entries appear only after the
            first step and optimizers may replace them, so they are copied, never adopted.
        adopt: make parameters views of the flat buffer (zero-copy); False copies in and out.
    """

    def __init__(self, process_group: dist.ProcessGroup | None = None, *,
                 module: nn.Module | None = None, average_buffers: bool = False,
                 optimizer: torch.optim.Optimizer | None = None,
                 state_keys: Sequence[str] | None = None, adopt: bool = True):
        super().__init__(process_group)
        if average_buffers and module is None:
            raise ValueError("average_buffers=True needs module=<the model> to find its buffers")
        self.module = module if average_buffers else None
        self.optimizer = optimizer
        self.state_keys = None if state_keys is None else tuple(state_keys)
        self.adopt = adopt
        self._main = TensorSet("parameters/buffers", adopt, self.process_group)
        self._state = TensorSet("optimizer state", False, self.process_group)

    @torch.no_grad()
    def average_in(self, params, group: dist.ProcessGroup | None) -> None:
        """Replace ``params`` (and the extras) by their mean over ``group``: one in-place
        all-reduce per flat buffer (eq. 4; eq. 5 for a block group)."""
        if group is not None and dist._rank_not_in_group(group):
            return
        tensors = _params_of(params) + float_buffers(self.module)
        state = optimizer_state_tensors(self.optimizer, self.state_keys)
        jobs = [(self._main.prepare(tensors), tensors), (self._state.prepare(state), state)]
        size = dist.get_world_size(group)
        works = [all_reduce_mean(buf, size, group)
                 for fb, _ in jobs if fb is not None for buf in fb.flats]
        for w in works:
            w.wait()
        for fb, ts in jobs:
            if fb is not None:
                fb.scatter(ts)


class PeriodicAverager(FlatAverager):
    """Global averaging every ``period`` steps after ``warmup_steps`` (local SGD, Algorithm 1).

    Same step semantics as torch's ``PeriodicModelAverager``: at call number ``step`` it averages
    iff ``step >= warmup_steps and (step - warmup_steps) % period == 0``.
    """

    def __init__(self, period: int, warmup_steps: int = 0,
                 process_group: dist.ProcessGroup | None = None, **kwargs):
        super().__init__(process_group, **kwargs)
        if period < 1:
            raise ValueError(f"period must be a positive integer, got {period}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.period = period
        self.warmup_steps = warmup_steps

    def average_parameters(self, params) -> None:
        if self.step >= self.warmup_steps and (self.step - self.warmup_steps) % self.period == 0:
            self.average_in(params, self.process_group)
        self.step += 1


class TorchHierarchy:
    """torch's ``HierarchicalModelAverager`` rule as a level chooser: at ``step >= warmup`` the
    largest period dividing ``step`` wins (``step % period``, not offset by the warm-up)."""

    def __init__(self, periods: Sequence[int], warmup_steps: int):
        self.periods = list(periods)
        self.warmup_steps = warmup_steps

    def level_at(self, step: int) -> int | None:
        if step < self.warmup_steps:
            return None
        for level in reversed(range(len(self.periods))):
            if step % self.periods[level] == 0:
                return level
        return None


class HierarchicalAverager(FlatAverager):
    """Multi-level averaging (hierarchical local SGD, eq. 5 / Algorithm 2).

    Either ``period_group_size_dict`` (torch's form: ordered ``period -> group size``, the last
    size being the whole group) with torch's step semantics, or ``level_at``: any callable
    ``step -> level index or None`` (e.g. from the project's ``SyncSchedule``) together with
    ``group_sizes`` (one per level, contiguous rank blocks). Groups are built once.
    """

    def __init__(self, period_group_size_dict: OrderedDict[int, int] | None = None,
                 warmup_steps: int = 0, process_group: dist.ProcessGroup | None = None, *,
                 level_at: Callable[[int], int | None] | None = None,
                 group_sizes: Sequence[int] | None = None,
                 partitions: Sequence[Sequence[Sequence[int]]] | None = None, **kwargs):
        super().__init__(process_group, **kwargs)
        world = dist.get_world_size(self.process_group)
        if period_group_size_dict is not None:
            if level_at is not None or group_sizes is not None:
                raise ValueError("give either period_group_size_dict or level_at/group_sizes")
            if not period_group_size_dict:
                raise ValueError("period_group_size_dict must not be empty")
            periods = list(period_group_size_dict)
            if min(periods) < 1:
                raise ValueError(f"periods must be positive, got {periods}")
            group_sizes = list(period_group_size_dict.values())
            if group_sizes[-1] != world:
                raise ValueError(
                    f"the last group size {group_sizes[-1]} must equal the size of the process "
                    f"group ({world})")
            if warmup_steps < 0:
                raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
            level_at = TorchHierarchy(periods, warmup_steps).level_at
        elif level_at is None or (group_sizes is None and partitions is None):
            raise ValueError("need period_group_size_dict, or level_at with group_sizes")
        self.warmup_steps = warmup_steps
        self.level_at = level_at
        if partitions is None:
            partitions = [contiguous_blocks(world, s) for s in group_sizes]
        self.groups = build_groups(partitions, self.process_group)

    @classmethod
    def from_schedule(cls, schedule, process_group: dist.ProcessGroup | None = None,
                      **kwargs) -> HierarchicalAverager:
        """Averager following a ``localsgd.schedule.SyncSchedule`` (default or ``torch_compat``
        semantics): call number ``step`` is local update ``t = step + 1``. Gossip, outer steps and
        gradient all-reduce are not an averager's job: use ``LocalSGDOptimizer`` for those."""
        if schedule.away is not None or schedule.worker_steps is not None:
            raise ValueError("a schedule with idle workers (away, worker_steps) needs an engine "
                             "(ReplicaEngine, DDPEngine): an averager cannot keep them idle")
        if schedule.gossip or schedule.outer_period is not None:
            raise ValueError(
                "a schedule with gossip or outer steps needs LocalSGDOptimizer with a "
                "DistributedCommunicator; HierarchicalAverager only averages models")
        topo = schedule.topology
        return cls(process_group=process_group,
                   level_at=lambda step: schedule.action(step + 1).level,
                   partitions=[topo.groups(i) for i in range(topo.num_levels)],
                   warmup_steps=schedule.warmup_steps, **kwargs)

    def average_parameters(self, params) -> None:
        level = self.level_at(self.step)
        if level is not None:
            self.average_in(params, self.groups[level])
        self.step += 1


def average_parameters(params: Iterable[torch.Tensor],
                       process_group: dist.ProcessGroup | None = None) -> None:
    """One-shot average over ``process_group`` (uses a fresh flat buffer; prefer an averager)."""
    FlatAverager(process_group).average_in(params, process_group)


# --------------------------------------------------------------------------- communicator


class DistributedCommunicator:
    """``localsgd.schedule.Communicator`` over torch.distributed: this process is one worker.

    The model's trainable parameters are adopted once into one flat buffer (``flat_params()``,
    the tensor the outer update works on); averaging a level is one in-place all-reduce inside
    this rank's group of that level (groups built once from ``topology.groups``); gossip is one
    SGP push-sum round: its point-to-point sends and receives (``localsgd.gossip.plan``) posted
    together with ``batch_isend_irecv``.

    Args:
        topology: levels and group sizes; ``world_size`` must equal the process group's size.
        model: this worker's model.
        optimizer: its inner optimizer (needed for ``average_momentum``).
        average_buffers: also average floating-point buffers (BatchNorm running stats).
        average_momentum: also average the optimizer's per-parameter float state.
        peers_per_step: SGP peers per gossip round.
        process_group: the group of all workers (default WORLD).
    """

    def __init__(self, topology, model: nn.Module,
                 optimizer: torch.optim.Optimizer | None = None, *,
                 average_buffers: bool = False, average_momentum: bool = False,
                 peers_per_step: int = 1, process_group: dist.ProcessGroup | None = None):
        self.process_group = process_group if process_group is not None else dist.group.WORLD
        self.world_size = dist.get_world_size(self.process_group)
        if topology.world_size != self.world_size:
            raise ValueError(f"topology is for {topology.world_size} workers but the process "
                             f"group has {self.world_size}")
        if average_momentum and optimizer is None:
            raise ValueError("average_momentum=True needs optimizer=<the inner optimizer>")
        self.topology, self.model, self.optimizer = topology, model, optimizer
        self.average_buffers, self.average_momentum = average_buffers, average_momentum
        self.peers_per_step = peers_per_step
        self.rank = dist.get_rank(self.process_group)
        self._global_ranks = dist.get_process_group_ranks(self.process_group)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self._params = TensorSet("parameters", True, self.process_group)
        fb = self._params.prepare(self.params)
        if fb is None or len(fb.buckets) != 1 or not all(fb._adoptable):
            raise ValueError(
                "DistributedCommunicator needs trainable parameters of one dtype and device with "
                "dense layouts (one flat buffer the model aliases); got "
                f"{sorted({(str(p.dtype), str(p.device)) for p in self.params})}")
        self.groups = build_groups([topology.groups(i) for i in range(topology.num_levels)],
                                   self.process_group)
        self._buffers = TensorSet("buffers", True, self.process_group)
        self._state = TensorSet("optimizer state", False, self.process_group)
        self._grads = TensorSet("gradients", False, self.process_group)
        self.ps_weight = 1.0  # push-sum weight w_i of SGP (1 until the first gossip round)
        self._gossip_bufs: list[torch.Tensor] = []
        self._gossiped = False
        self.compression: Compression | None = None  # set_compression
        self.broadcast_buffers = False  # at a sync, the group's first rank's float buffers

    # -- Communicator ---------------------------------------------------------------------------

    def flat_params(self) -> torch.Tensor:
        """This worker's parameters as one flat ``[n]`` tensor the model aliases."""
        return self._params.prepare(self.params).flats[0]

    def worker_digests(self) -> list[int]:
        """Every worker's parameter digest, gathered over the world (a collective)."""
        flat = self.flat_params()
        mine = torch.tensor([digest(flat)], dtype=torch.int64, device=flat.device)
        got = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(got, mine, group=self.groups[self.topology.top])
        return [int(g) for g in got]

    @torch.no_grad()
    def average(self, level: int, absent: tuple[int, ...] = ()) -> None:
        """Average parameters (+ buffers, optimizer state) inside this rank's group of
        ``level`` (eq. 4/5). After gossip the push-sum numerators and weights are averaged.
        With ``absent`` (churn, the world level): the mean of the ranks present, which every
        rank takes (an absent rank adds zeros to the sum)."""
        group = self.groups[level]
        size = self.topology.levels[level].group_size
        flat = self.flat_params()
        if absent:
            if size != self.world_size or self.compression is not None or self.average_buffers \
                    or self.average_momentum or self.broadcast_buffers or self._gossiped:
                raise ValueError("a churn average (workers absent) is a world-wide average of "
                                 "the parameters alone: not with compression, gossip or "
                                 "averaged buffers / state")
            if self.rank in absent:
                flat.zero_()
            dist.all_reduce(flat, group=group)
            flat.div_(self.world_size - len(absent))
            return
        if size == 1:
            return
        jobs = []
        if self.compression is not None:
            self._compressed_mean(level, group)
        if self.average_buffers:
            bufs = float_buffers(self.model)
            jobs.append((self._buffers.prepare(bufs), bufs))
        if self.average_momentum:
            state = optimizer_state_tensors(self.optimizer)
            jobs.append((self._state.prepare(state), state))
        works = [all_reduce_mean(b, size, group) for fb, _ in jobs if fb is not None
                 for b in fb.flats]
        # Every rank takes the same branch (gossip rounds are collective), whatever its weight.
        if self.compression is not None:
            pass  # the parameters are averaged already, with codes on the wire
        elif not self._gossiped:
            works.append(all_reduce_mean(flat, size, group))
        else:
            # Push-sum: z = mean(x) / mean(w) with x = z * w (the replica engine's rule).
            flat.mul_(self.ps_weight)
            w = torch.tensor([self.ps_weight], dtype=flat.dtype, device=flat.device)
            works += [all_reduce_mean(flat, size, group), all_reduce_mean(w, size, group)]
        if self.broadcast_buffers and not self.average_buffers:
            first = dist.get_process_group_ranks(group)[0] if group is not None else 0
            works += [dist.broadcast(b, src=first, group=group, async_op=True)
                      for b in float_buffers(self.model)]
        for work in works:
            work.wait()
        if self._gossiped:
            flat.div_(w)
            self.ps_weight = float(w)
        for fb, ts in jobs:
            if fb is not None:
                fb.scatter(ts)

    @torch.no_grad()
    def allreduce_grads(self, level: int) -> None:
        """Average the existing gradients inside this rank's group of ``level``."""
        size = self.topology.levels[level].group_size
        if size == 1:
            return
        grads = [p.grad for p in self.params if p.grad is not None]
        fb = self._grads.prepare(grads)
        if fb is None:
            return
        works = [all_reduce_mean(b, size, self.groups[level]) for b in fb.flats]
        for work in works:
            work.wait()
        fb.scatter(grads)

    @torch.no_grad()
    def gossip(self, step: int) -> None:
        """One SGP push-sum round (``localsgd.gossip``): keep ``weight`` of (x, w), push
        ``weight`` of it to each peer of the exponential graph, add what the in-peers push."""
        from . import gossip as gossip_mod

        plan = gossip_mod.plan(step, self.world_size, self.peers_per_step)
        if not plan.offsets:
            return
        flat = self.flat_params()
        n = flat.numel()
        if len(self._gossip_bufs) != 1 + len(plan.offsets):
            self._gossip_bufs = [flat.new_empty(n + 1) for _ in range(1 + len(plan.offsets))]
        send, *recvs = self._gossip_bufs
        # Same operation order as gossip.mix_: x = z * w, then x * weight.
        torch.mul(flat, self.ps_weight, out=send[:n]).mul_(plan.weight)
        send[n] = self.ps_weight * plan.weight
        # All sends and receives of the round are posted together (one batch_isend_irecv): with
        # NCCL a lone isend may block until its peer posts the matching irecv, so posting them
        # one by one around the ring can deadlock; batched, NCCL groups them (ncclGroupStart/End)
        # and gloo posts them all before any wait.
        ops = []
        for peer, src, buf in zip(plan.send_to(self.rank), plan.recv_from(self.rank), recvs,
                                  strict=True):
            ops.append(dist.P2POp(dist.isend, send, self._global_ranks[peer],
                                  group=self.process_group))
            ops.append(dist.P2POp(dist.irecv, buf, self._global_ranks[src],
                                  group=self.process_group))
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        total = send.clone()
        for buf in recvs:
            total += buf
        self.ps_weight = float(total[n])
        self._gossiped = True
        torch.div(total[:n], total[n], out=flat)

    # -- an update sat out (per-worker H, `localsgd.schedule.Action.idle`) ------------------------

    @torch.no_grad()
    def hold(self):
        """Keep this worker's parameters, float buffers and per-element optimizer state as they
        are now; returns the function that puts them back (state the update created goes to
        zeros; a scalar state such as Adam's step count moves on)."""
        flat = self.flat_params()
        params, buffers = flat.clone(), [b.clone() for b in float_buffers(self.model)]
        opt = self.optimizer
        saved = {p: {k: v.clone() for k, v in opt.state.get(p, {}).items() if per_element_state(v)}
                 for p in self.params} if opt is not None else {}

        @torch.no_grad()
        def restore() -> None:
            flat.copy_(params)
            for b, before in zip(float_buffers(self.model), buffers, strict=True):
                b.copy_(before)
            for p, before in saved.items():
                for key, value in opt.state.get(p, {}).items():
                    if per_element_state(value) and key in before:
                        value.copy_(before[key])
                    elif per_element_state(value):
                        value.zero_()

        return restore

    # -- what streaming fragment sync reads and writes (`localsgd.streaming`) --------------------

    def param_numels(self) -> list[int]:
        """Sizes of this worker's trainable tensors, in parameter order."""
        return [p.numel() for p in self.params]

    def read_tensors(self, j0: int, j1: int) -> torch.Tensor:
        """Trainable tensors ``j0 .. j1 - 1`` of this worker: a view of the flat buffer."""
        start = sum(p.numel() for p in self.params[:j0])
        return self.flat_params()[start:start + sum(p.numel() for p in self.params[j0:j1])]

    @torch.no_grad()
    def write_tensors(self, j0: int, j1: int, values: torch.Tensor) -> None:
        self.read_tensors(j0, j1).copy_(values)

    def start_mean(self, delta: torch.Tensor, key: object):
        """Start averaging ``delta`` over all workers in place; returns a function that waits
        for it and gives it. Exact averages are an asynchronous all-reduce that travels while
        this worker computes; compressed ones (`localsgd.compression.compressed_average`, error
        feedback under ``key``) are exchanged now."""
        group = self.groups[self.topology.top]
        if self.compression is None:
            work = all_reduce_mean(delta, self.world_size, group)

            def wait() -> torch.Tensor:
                work.wait()
                return delta

            return wait
        comp = self.compression
        compressed_average([delta], comp.fmt, group=group, block=comp.block, key=key,
                           density=comp.density,
                           feedback=self._comp_feedback[self.topology.top])
        return lambda: delta

    # -- resume ----------------------------------------------------------------------------------

    def set_compression(self, compression: Compression) -> None:
        """Send model averages as `localsgd.compression` codes of this worker's change since its
        group's last average (before any update: the workers' common start, same seed)."""
        if self._gossiped:
            raise ValueError("compressed averages need a common reference; SGP's gossip leaves "
                             "none")
        self.compression = compression
        start = torch.cat([p.detach().reshape(-1) for p in self.params])
        self._comp_refs = {lv: start.clone() for lv in range(self.topology.num_levels)}
        self._comp_feedback = {lv: compression.new_feedback(lv)
                               for lv in range(self.topology.num_levels)}

    def _compressed_mean(self, level: int, group: dist.ProcessGroup) -> None:
        comp = self.compression
        ref = self._comp_refs[level]
        delta = torch.cat([p.detach().reshape(-1) for p in self.params]) - ref
        compressed_average([delta], comp.fmt, group=group, block=comp.block,
                           density=comp.density, feedback=self._comp_feedback[level])
        new = ref + delta
        self._comp_refs[level] = new
        offset = 0
        for p in self.params:
            p.copy_(new[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def state_dict(self) -> dict:
        state = {"ps_weight": self.ps_weight, "gossiped": self._gossiped}
        if self.compression is not None:
            state["compression"] = {
                "refs": {lv: r.clone() for lv, r in self._comp_refs.items()},
                "residuals": {lv: dict(fb.residuals) for lv, fb in self._comp_feedback.items()},
                "rounds": {lv: dict(fb.rounds) for lv, fb in self._comp_feedback.items()}}
        return state

    def load_state_dict(self, state: dict) -> None:
        self.ps_weight = float(state["ps_weight"])
        self._gossiped = bool(state.get("gossiped", self.ps_weight != 1.0))
        if self.compression is not None:
            saved = state.get("compression")
            if saved is None:
                raise ValueError("the checkpoint was written without compressed averaging; "
                                 "resume with the configuration it was written with")
            for lv, ref in self._comp_refs.items():
                ref.copy_(saved["refs"][lv])
                # a checkpoint from before random-k has no rounds: its formats drew no indices
                self._comp_feedback[lv].load({"residuals": saved["residuals"][lv],
                                              "rounds": saved.get("rounds", {}).get(lv, {})},
                                             ref.device)
