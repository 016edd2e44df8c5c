"""The persistent flat buffers and process groups that model averaging over torch.distributed
runs on, shared by the averagers and `DistributedCommunicator` (`localsgd.averaging`):

* `FlatBuffer`: flat storage per (device, dtype) that the tensors become views of (adopted
  once); `TensorSet`: a named set of tensors averaged through one, rebuilt when the tensors
  change shape or dtype;
* `check_same_tensors`: the collective check that every rank passes the same tensors;
* `contiguous_blocks` / `build_groups`: the per-level process groups, built once;
* `float_buffers` / `optimizer_state_tensors`: what is averaged besides the parameters.

What this adds over torch's ``average_parameters``: `localsgd.averaging`'s docstring.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "FlatBuffer",
    "TensorSet",
    "build_groups",
    "check_same_tensors",
    "contiguous_blocks",
    "float_buffers",
    "optimizer_state_tensors",
    "per_element_state",
]

# --------------------------------------------------------------------------- flat buffers


def _adoptable(t: torch.Tensor) -> bool:
    """True if ``t`` fills its own span of memory densely, so a strided view of a flat slice can
    stand in for it with the same strides (contiguous, channels_last, any dense permutation)."""
    if t.numel() <= 1:
        return True
    dims = sorted((s, n) for s, n in zip(t.stride(), t.shape, strict=True) if n > 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def _signature(tensors: Sequence[torch.Tensor]) -> str:
    """What ranks must agree on before their tensors may be averaged elementwise."""
    return ";".join(f"{tuple(t.shape)}:{t.dtype}" for t in tensors)


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little", signed=True)


def digest(values: torch.Tensor) -> int:
    """A 64-bit digest of ``values``' bytes (its dtype and shape included): equal digests, equal
    tensors bitwise, but for a 2^-64 chance. For the runtime consistency check (`SyncDriver`'s
    ``check_consistency``)."""
    data = values.detach().contiguous().cpu()
    head = f"{data.dtype}:{tuple(data.shape)}".encode()
    raw = data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b""
    return int.from_bytes(hashlib.blake2b(head + raw, digest_size=8).digest(), "little",
                          signed=True)


def check_same_tensors(tensors: Sequence[torch.Tensor], what: str,
                       group: dist.ProcessGroup | None = None) -> None:
    """Collective check that every rank of ``group`` holds the same tensor signature.

    All-gathers (hash of shapes and dtypes, total element count) and raises ``ValueError`` on
    every rank when any two ranks differ, naming the ranks and their counts.
    """
    sig = _signature(tensors)
    mine = torch.tensor([_hash64(sig), len(tensors), sum(t.numel() for t in tensors)],
                        dtype=torch.int64)
    if dist.get_backend(group) == "nccl":
        mine = mine.cuda()
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    rows = [tuple(g.tolist()) for g in gathered]
    if len(set(rows)) != 1:
        detail = ", ".join(f"rank {r}: {n} tensors / {numel} elements (hash {h & 0xffff:04x})"
                           for r, (h, n, numel) in enumerate(rows))
        raise ValueError(
            f"ranks disagree on the {what} to average ({detail}); every rank must pass the "
            "same tensors (same count, order, shapes and dtypes)")


class _Bucket:
    """One flat buffer holding every tensor of one (device, dtype)."""

    def __init__(self, tensors: list[torch.Tensor], indices: list[int]):
        self.indices = indices
        numel = sum(t.numel() for t in tensors)
        self.flat = torch.empty(numel, dtype=tensors[0].dtype, device=tensors[0].device)
        self.slots: list[torch.Tensor] = []
        offset = 0
        for t in tensors:
            n = t.numel()
            piece = self.flat[offset:offset + n]
            # Same strides as the tensor so the memory format survives adoption.
            self.slots.append(piece.as_strided(t.shape, t.stride()) if _adoptable(t)
                              else piece.view(t.shape))
            offset += n


class FlatBuffer:
    """Persistent flat storage for a fixed list of tensors, grouped by (device, dtype).

    With ``adopt=True`` every tensor whose layout allows it is rebound (``t.data = slot``) to a
    strided view of the flat buffer once; afterwards the buffer *is* the tensors' storage. Others
    are copied in by :meth:`gather` and out by :meth:`scatter`.
    """

    def __init__(self, tensors: Sequence[torch.Tensor], *, adopt: bool = True):
        tensors = list(tensors)
        if not tensors:
            raise ValueError("FlatBuffer needs at least one tensor, got none")
        self.signature = _signature(tensors)
        self.adopt = adopt
        by_kind: dict[tuple, list[int]] = OrderedDict()
        for i, t in enumerate(tensors):
            by_kind.setdefault((t.device, t.dtype), []).append(i)
        self.buckets = [_Bucket([tensors[i] for i in idx], idx) for idx in by_kind.values()]
        self._slot_of: list[torch.Tensor] = [None] * len(tensors)  # type: ignore[list-item]
        for b in self.buckets:
            for i, slot in zip(b.indices, b.slots, strict=True):
                self._slot_of[i] = slot
        self._adoptable = [adopt and _adoptable(t) and t.numel() > 0 for t in tensors]
        self.gather(tensors)

    @property
    def flats(self) -> list[torch.Tensor]:
        return [b.flat for b in self.buckets]

    def matches(self, tensors: Sequence[torch.Tensor]) -> bool:
        return _signature(tensors) == self.signature

    @torch.no_grad()
    def gather(self, tensors: Sequence[torch.Tensor]) -> None:
        """Make the flat buffers hold the current values of ``tensors``."""
        stale_dst, stale_src = [], []
        for t, slot, adoptable in zip(tensors, self._slot_of, self._adoptable, strict=True):
            if t.data_ptr() == slot.data_ptr():
                continue  # already a view of the buffer: nothing to move
            stale_dst.append(slot)
            stale_src.append(t)
            if adoptable:
                slot.copy_(t)
                t.data = slot
        if stale_dst:
            survivors = [(d, s) for d, s in zip(stale_dst, stale_src, strict=True)
                         if s.data_ptr() != d.data_ptr()]
            if survivors:
                torch._foreach_copy_([d for d, _ in survivors], [s for _, s in survivors])

    @torch.no_grad()
    def scatter(self, tensors: Sequence[torch.Tensor]) -> None:
        """Write the flat buffers back into tensors that are not views of them."""
        dst, src = [], []
        for t, slot in zip(tensors, self._slot_of, strict=True):
            if t.data_ptr() != slot.data_ptr():
                dst.append(t)
                src.append(slot)
        if dst:
            torch._foreach_copy_(dst, src)

    def views(self) -> list[torch.Tensor]:
        """The per-tensor views of the flat buffers, in the original order."""
        return list(self._slot_of)


# --------------------------------------------------------------------------- process groups


def contiguous_blocks(world_size: int, group_size: int) -> list[list[int]]:
    """Consecutive ranks in blocks of ``group_size`` (the layout of torch's new_subgroups)."""
    if group_size < 1 or world_size % group_size:
        raise ValueError(
            f"group size {group_size} must be a positive divisor of the world size {world_size}")
    return [list(range(s, s + group_size)) for s in range(0, world_size, group_size)]


def build_groups(partitions: Sequence[Sequence[Sequence[int]]],
                 process_group: dist.ProcessGroup | None = None) -> list[dist.ProcessGroup]:
    """Create the process groups of each level once; return the one this rank belongs to.

    ``partitions[l]`` lists the rank blocks of level ``l`` (ranks within ``process_group``). Every
    rank creates every group in the same order, as ``dist.new_group`` requires; a level whose only
    block is the whole group reuses ``process_group`` instead of creating a copy.
    """
    parent = process_group if process_group is not None else dist.group.WORLD
    world = dist.get_world_size(parent)
    me = dist.get_rank(parent)
    global_ranks = dist.get_process_group_ranks(parent)
    mine: list[dist.ProcessGroup] = []
    for level, blocks in enumerate(partitions):
        flat = sorted(r for b in blocks for r in b)
        if flat != list(range(world)):
            raise ValueError(
                f"level {level} blocks {blocks} must partition ranks 0..{world - 1} exactly")
        if len(blocks) == 1:
            mine.append(parent)
            continue
        own = None
        for block in blocks:
            pg = dist.new_group([global_ranks[r] for r in block])
            if me in block:
                own = pg
        mine.append(own)
    return mine


# --------------------------------------------------------------------------- tensor sets


class TensorSet:
    """A named set of tensors averaged through one persistent :class:`FlatBuffer`.

    ``prepare(tensors)`` returns the buffer holding their current values, (re)building it, after
    a collective signature check over ``group``, whenever the tensor objects change shape or
    dtype; new objects with the old signature (a rebound optimizer state) are simply copied in.
    """

    def __init__(self, what: str, adopt: bool, group: dist.ProcessGroup | None):
        self.what, self.adopt, self.group = what, adopt, group
        self.flat: FlatBuffer | None = None
        self._key: tuple[int, ...] = ()

    def prepare(self, tensors: list[torch.Tensor]) -> FlatBuffer | None:
        key = tuple(id(t) for t in tensors)
        if key != self._key:
            if not tensors:
                self.flat = None
            elif self.flat is None or not self.flat.matches(tensors):
                check_same_tensors(tensors, self.what, self.group)
                self.flat = FlatBuffer(tensors, adopt=self.adopt)
            self._key = key
        if self.flat is not None:
            self.flat.gather(tensors)
        return self.flat


def float_buffers(module: nn.Module | None) -> list[torch.Tensor]:
    """Floating-point buffers (BatchNorm running mean/var; not ``num_batches_tracked``)."""
    return [] if module is None else [b for b in module.buffers() if b.is_floating_point()]


def per_element_state(value: object) -> bool:
    """Optimizer state kept per parameter element (momentum, moments), not a step count."""
    return torch.is_tensor(value) and value.is_floating_point() and value.dim() > 0


def optimizer_state_tensors(optimizer: torch.optim.Optimizer | None,
                            keys: Sequence[str] | None = None) -> list[torch.Tensor]:
    """Per-parameter float state of ``optimizer`` shaped like its parameter (SGD momentum,
    Adam moments), or only the entries named in ``keys``; step counters are skipped."""
    if optimizer is None:
        return []
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            st = optimizer.state.get(p, {})
            for k, v in st.items():
                if (keys is None or k in keys) and isinstance(v, torch.Tensor) \
                        and v.is_floating_point() and v.shape == p.shape:
                    out.append(v)
    return out
