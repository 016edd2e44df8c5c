"""The replicas' ``[K, n]`` stack and `ReplicaCommunicator`, the `localsgd.schedule.Communicator`
both replica engines (`localsgd.engines.replicas`) run the schedule through.

Row k of the stack holds worker k's trainable parameters, each tensor's slice starting on a
multiple of `FLAT_ALIGN` elements (`aligned_offsets`). Averaging level l is
``flat.view(G, g, n)`` -> mean over the group dim, in place (Eq. 4/5 of the paper); gossip is one
push-sum round of `localsgd.gossip`. Optionally averages float buffers (BatchNorm running stats)
and the inner optimizers' per-parameter state (momentum buffers). One implementation serves both
layouts (per replica and stacked: `localsgd.engines.replicas`' docstring).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from localsgd import gossip as gossip_mod
from localsgd.collectives import digest, per_element_state
from localsgd.compression import Compression, mean_of_rows
from localsgd.topology import Topology

__all__ = ["FLAT_ALIGN", "ReplicaCommunicator", "aligned_offsets", "stack_into_flat"]


def _group_mean_(stack: torch.Tensor, group_size: int) -> None:
    """Replace every row of stack [K, ...] by the mean of its contiguous group, in place."""
    k = stack.shape[0]
    if stack.is_contiguous():
        v = stack.view(k // group_size, group_size, -1)
        v.copy_(v.mean(dim=1, keepdim=True).expand_as(v))
    else:  # e.g. a transposed grad: average a contiguous copy, write it back
        v = stack.reshape(k // group_size, group_size, -1)
        stack.copy_(v.mean(dim=1, keepdim=True).expand_as(v).reshape(stack.shape))


def _group_first_(stack: torch.Tensor, group_size: int) -> None:
    """Replace every row of stack [K, ...] by the first row of its contiguous group, in place."""
    v = stack.view(stack.shape[0] // group_size, group_size, -1)
    v.copy_(v[:, :1].expand_as(v))


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


def stack_into_flat(stacks: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
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
        flat, columns = stack_into_flat([torch.stack([ps[j].detach() for ps in self.params])
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
        self.compression: Compression | None = None  # set_compression
        self.broadcast_buffers = False  # at a sync, every row takes its group's first row's

    def set_compression(self, compression: Compression) -> None:
        """Send model averages as `localsgd.compression` codes of each replica's change since
        its group's last average (before any update: the replicas' common start)."""
        if self.gossiped:
            raise ValueError("compressed averages need a common reference; SGP's gossip leaves "
                             "none")
        self.compression = compression
        start = self.packed()
        self._comp_refs = {lv: start.clone() for lv in range(self.topology.num_levels)}
        self._comp_feedback = {lv: [compression.new_feedback(lv) for _ in range(self.world_size)]
                               for lv in range(self.topology.num_levels)}

    def _compressed_mean_(self, level: int, g: int) -> None:
        """The group mean of `average` with the codes of `localsgd.compression.mean_of_rows`:
        each group's mean change since its reference, added to the reference."""
        comp = self.compression
        ref = self._comp_refs[level]
        delta = self.packed() - ref
        new = torch.empty_like(ref)
        for start in range(0, self.world_size, g):
            rows = slice(start, start + g)
            mean = mean_of_rows(delta[rows], comp.fmt, comp.block,
                                self._comp_feedback[level][rows])
            new[rows] = ref[rows] + mean.to(ref.dtype)
        self._comp_refs[level] = new
        self.write_tensors(0, len(self._slots), new)

    # -- Communicator ------------------------------------------------------------------------

    def flat_params(self) -> torch.Tensor:
        return self.flat

    def worker_digests(self) -> list[int]:
        """Each replica's parameter digest (`localsgd.collectives.digest` of its row)."""
        return [digest(row) for row in self.packed()]

    def packed(self) -> torch.Tensor:
        """A copy of the replicas' parameters as a gap-free ``[K, n_params]`` matrix (row k is
        ``torch.cat([p.flatten() for p in trainable params of replica k])``); ``self.flat``
        is the same numbers with each tensor starting on an aligned offset."""
        return self.read_tensors(0, len(self._slots))

    # -- what streaming fragment sync reads and writes (`localsgd.streaming`) ------------------

    def param_numels(self) -> list[int]:
        """Sizes of one replica's trainable tensors, in parameter order."""
        k = self.world_size
        return [col[0].numel() // (k if self._stacked else 1) for col in self._slots]

    def read_tensors(self, j0: int, j1: int) -> torch.Tensor:
        """Trainable tensors ``j0 .. j1 - 1`` of every replica, a gap-free ``[K, n]`` copy."""
        k = self.world_size
        with torch.no_grad():
            return torch.cat([(col[0] if self._stacked else torch.stack(col)).reshape(k, -1)
                              for col in self._slots[j0:j1]], dim=1)

    @torch.no_grad()
    def write_tensors(self, j0: int, j1: int, values: torch.Tensor) -> None:
        """Write gap-free ``values`` (``[K, n]``, or ``[n]`` for every replica) into trainable
        tensors ``j0 .. j1 - 1`` of the aligned stack."""
        k = self.world_size
        values = values.expand(k, -1) if values.dim() == 1 else values
        offset = 0
        for col in self._slots[j0:j1]:
            width = col[0].numel() // (k if self._stacked else 1)
            if self._stacked:
                col[0].copy_(values[:, offset:offset + width].reshape(col[0].shape))
            else:
                for r, p in enumerate(col):
                    p.copy_(values[r, offset:offset + width].view_as(p))
            offset += width

    def start_mean(self, delta: torch.Tensor, key: object) -> Callable[[], torch.Tensor]:
        """The mean over all replicas of ``delta``'s rows ([K, n] -> [n]), exact or as the codes
        of the run's compression (each replica's error feedback under ``key``), computed now:
        one process has nothing to overlap."""
        if self.compression is None:
            mean = delta.mean(0)
        else:
            comp = self.compression
            mean = mean_of_rows(delta, comp.fmt, comp.block, self._comp_feedback[self.topology.top],
                                key=key).to(delta.dtype)
        return lambda: mean

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
    def average(self, level: int, absent: tuple[int, ...] = ()) -> None:
        self._check_aliasing()
        g = self.topology.levels[level].group_size
        if absent:  # churn: every row takes the mean of the rows present
            _check_churn(self, level, g)
            present = torch.ones(self.world_size, dtype=self.flat.dtype, device=self.flat.device)
            present[list(absent)] = 0
            mean = (self.flat * present[:, None]).sum(0) / present.sum()
            self.flat.copy_(mean.expand_as(self.flat))
            return
        if g == 1:
            return
        if self.compression is not None:
            self._compressed_mean_(level, g)
        elif not self.gossiped:  # a host flag: reading ps_weight would wait for the GPU
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
        elif self.broadcast_buffers:
            for stack in self.buffer_stacks:
                _group_first_(stack, g)
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

    # -- idle workers (per-worker H) --------------------------------------------------------

    @torch.no_grad()
    def hold(self, workers: Sequence[int]) -> Callable[[], None]:
        """Keep ``workers``' state (parameters, float buffers, per-element optimizer state) as it
        is now; returns the function that puts it back after an update they sat out
        (`localsgd.schedule.Action.idle`). Optimizer state the update created (SGD's momentum
        buffer at its first step) goes back to zeros, where such state starts. A scalar state
        (Adam's step count) moves on, which is why AdamW is refused with idle workers."""
        rows = torch.tensor(list(workers), device=self.flat.device)
        params = self.flat.index_select(0, rows)
        buffers = [b.index_select(0, rows) for b in self.buffer_stacks]
        if not self.optimizers:
            owned = []
        elif self._stacked:
            owned = [(self.optimizers[0], col[0]) for col in self._slots]
        else:
            owned = [(self.optimizers[k], col[k]) for k in workers for col in self._slots]
        saved = [(opt, p, {key: value.index_select(0, rows) if self._stacked else value.clone()
                           for key, value in opt.state.get(p, {}).items() if per_element_state(value)})
                 for opt, p in owned]

        @torch.no_grad()
        def restore() -> None:
            self.flat.index_copy_(0, rows, params)
            for stack, before in zip(self.buffer_stacks, buffers, strict=True):
                stack.index_copy_(0, rows, before)
            for opt, p, before in saved:
                for key, value in opt.state.get(p, {}).items():
                    if not per_element_state(value):
                        continue
                    old = before.get(key)
                    if self._stacked:
                        if old is None:
                            value.index_fill_(0, rows, 0.0)
                        else:
                            value.index_copy_(0, rows, old)
                    elif old is None:
                        value.zero_()
                    else:
                        value.copy_(old)

        return restore

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
        state = {"ps_weight": self.ps_weight.clone(), "gossiped": self.gossiped}
        if self.compression is not None:
            state["compression"] = _compression_state(self._comp_refs, self._comp_feedback)
        return state

    def load_state_dict(self, state: dict) -> None:
        self.ps_weight.copy_(state["ps_weight"])
        self.gossiped = bool(state.get("gossiped", not torch.all(self.ps_weight == 1)))
        if self.compression is not None:
            _load_compression_state(state, self._comp_refs, self._comp_feedback)


def _check_churn(comm, level: int, group_size: int) -> None:
    """Churn's partial average is of the parameters alone, over the world (`SyncSchedule.away`;
    `TrainConfig` refuses the rest in one line before any training)."""
    if group_size != comm.world_size or comm.compression is not None or comm.average_buffers \
            or comm.average_momentum or comm.broadcast_buffers:
        raise ValueError("a churn average (workers absent) is a world-wide average of the "
                         "parameters alone: not with compression or averaged buffers / state")


def _compression_state(refs: dict, feedback: dict) -> dict:
    """References and residuals of compressed averaging, per level (a checkpoint's part)."""
    return {"refs": {lv: r.clone() for lv, r in refs.items()},
            "residuals": {lv: [dict(fb.residuals) for fb in fbs] for lv, fbs in feedback.items()},
            "rounds": {lv: [dict(fb.rounds) for fb in fbs] for lv, fbs in feedback.items()}}


def _load_compression_state(state: dict, refs: dict, feedback: dict) -> None:
    saved = state.get("compression")
    if saved is None:
        raise ValueError("the checkpoint was written without compressed averaging; resume with "
                         "the configuration it was written with")
    for lv, ref in refs.items():
        ref.copy_(saved["refs"][lv])
        # a checkpoint from before random-k has no rounds: its formats drew no indices
        rounds = saved.get("rounds", {}).get(lv, [{}] * len(feedback[lv]))
        for fb, residuals, counts in zip(feedback[lv], saved["residuals"][lv], rounds,
                                         strict=True):
            fb.load({"residuals": residuals, "rounds": counts}, ref.device)
