"""How much device memory K replicas need, and how many fit in a budget.

An estimate for `localsgd.engines.batched.BatchedReplicaEngine` (``batched=True``: all K replicas in
one vmapped forward/backward, so K * B_loc samples of activations are alive at once) and
`ReplicaEngine` (``batched=False``: replicas run one after the other, so one replica's
activations at a time):

* parameters: the ``[K, n]`` stack plus the engine's template model (one copy);
* gradients: K * n (kept between backward and the optimizer step);
* optimizer state: K * n per state tensor (1 for SGD with momentum, 2 for Adam, 0 for SGD);
* outer update (block momentum / SlowMo): anchor and momentum buffer, 2 * K * n when enabled;
* float buffers (BatchNorm running statistics): K copies;
* the stacked input batch: K * B_loc samples (targets ignored);
* activations: the bytes autograd saves for backward, measured by a forward of the real model
  on the CPU at batch 1 and 2 (`torch.autograd.graph.saved_tensors_hooks`, storages counted
  once, the model's own parameters excluded) and extrapolated linearly to B_loc; times K when
  batched. The backward pass's transient gradient buffers are covered by ``headroom``
  (default 1.2 on activations).

Not included: the CUDA context and the caching allocator's fragmentation (keep ~1-2 GiB of a
budget free: `max_replicas` takes ``reserve_bytes``), cuDNN workspaces, evaluation. Verified on
CPU only (exact for small models in tests/test_memory.py); no GPU measurement exists yet.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
from torch import nn

__all__ = ["ReplicaMemory", "estimate_replica_memory", "max_replicas", "replica_memory"]

OPTIMIZER_STATES = {"sgd": 0, "sgd_momentum": 1, "adam": 2}


@dataclass(frozen=True)
class ReplicaMemory:
    """Bytes by component (see the module docstring); ``total`` is their sum."""

    parameters: int
    gradients: int
    optimizer_state: int
    outer_state: int
    buffers: int
    inputs: int
    activations: int

    @property
    def total(self) -> int:
        return sum(asdict(self).values())


def _saved_activation_bytes(model: nn.Module, batch: int, input_shape: Sequence[int],
                            dtype: torch.dtype) -> int:
    """Bytes of the distinct storages autograd saves in one forward at ``batch`` (CPU)."""
    own = {p.untyped_storage().data_ptr() for p in model.parameters()}
    own |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in own and ptr != 0:
            seen[ptr] = max(seen.get(ptr, 0), storage.nbytes())
        return t

    x = torch.randn(batch, *input_shape, dtype=dtype)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(x)
    del out
    return sum(seen.values())


def replica_memory(model_fn: Callable[[], nn.Module], K: int, local_batch: int,
                   input_shape: Sequence[int], dtype: torch.dtype = torch.float32, *,
                   batched: bool = True, optimizer: str = "sgd_momentum", outer: bool = True,
                   headroom: float = 1.2) -> ReplicaMemory:
    """The estimate by component (see the module docstring).

    Args:
        model_fn: builds one model (e.g. ``lambda: build_model("resnet20")``); built on the CPU.
        K: replicas (workers) on the device.
        local_batch: B_loc, each replica's batch.
        input_shape: one sample's shape, e.g. ``(3, 32, 32)``.
        dtype: parameter / activation dtype (float32: the paper's arithmetic).
        batched: BatchedReplicaEngine (True) or ReplicaEngine (False).
        optimizer: 'sgd', 'sgd_momentum' or 'adam' (per-parameter state tensors 0, 1, 2).
        outer: an outer update (anchor + momentum) is kept.
        headroom: multiplier on activations for backward's transient buffers.
    """
    if K < 1 or local_batch < 1:
        raise ValueError(f"K and local_batch must be >= 1, got K={K}, local_batch={local_batch}")
    if optimizer not in OPTIMIZER_STATES:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_STATES)}, got {optimizer!r}")
    model = model_fn().to(dtype)
    model.train()
    elt = torch.tensor([], dtype=dtype).element_size()
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    a1 = _saved_activation_bytes(model, 1, input_shape, dtype)
    a2 = _saved_activation_bytes(model, 2, input_shape, dtype)
    per_sample = max(a2 - a1, 0)
    fixed = max(a1 - per_sample, 0)
    one_replica = fixed + per_sample * local_batch
    activations = int(headroom * one_replica) * (K if batched else 1)
    sample = elt
    for d in input_shape:
        sample *= int(d)
    return ReplicaMemory(
        parameters=(K + 1) * n * elt + (K + 1) * frozen * elt,
        gradients=K * n * elt,
        optimizer_state=OPTIMIZER_STATES[optimizer] * K * n * elt,
        outer_state=2 * K * n * elt if outer else 0,
        buffers=(K + 1) * buffers,
        inputs=K * local_batch * sample,
        activations=activations,
    )


def estimate_replica_memory(model_fn: Callable[[], nn.Module], K: int, local_batch: int,
                            input_shape: Sequence[int], dtype: torch.dtype = torch.float32,
                            **kwargs) -> int:
    """Estimated device bytes of K replicas at batch ``local_batch`` (`replica_memory`'s
    total; keyword arguments as there)."""
    return replica_memory(model_fn, K, local_batch, input_shape, dtype, **kwargs).total


def max_replicas(model_fn: Callable[[], nn.Module], local_batch: int,
                 input_shape: Sequence[int], budget_bytes: int,
                 dtype: torch.dtype = torch.float32, *, reserve_bytes: int = 0,
                 k_max: int = 1 << 16, **kwargs) -> int:
    """The largest K whose estimate fits in ``budget_bytes - reserve_bytes`` (0 if not even
    one replica fits). The estimate is affine in K, so it is measured at K = 1 and 2 only."""
    budget = budget_bytes - reserve_bytes
    m1 = estimate_replica_memory(model_fn, 1, local_batch, input_shape, dtype, **kwargs)
    m2 = estimate_replica_memory(model_fn, 2, local_batch, input_shape, dtype, **kwargs)
    slope, base = m2 - m1, 2 * m1 - m2
    if m1 > budget:
        return 0
    if slope <= 0:
        return k_max
    return int(min(k_max, (budget - base) // slope))
