"""Which samples: the per-epoch data partition of §4.2.1, class-balanced subsets (quick
mode's reduced scale), and the seed mixing they share (`_mix_seed`: one stream per purpose)."""

from __future__ import annotations

import hashlib
from typing import Any

import torch


def _mix_seed(seed: int, *parts: Any) -> int:
    """A 63-bit generator seed from ``seed`` and ``parts``: distinct inputs, unrelated streams."""
    blob = repr((int(seed), *parts)).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little") & (2**63 - 1)


def _balanced_indices(y: torch.Tensor, n: int | None, num_classes: int,
                      seed: int) -> torch.Tensor | None:
    if n is None:
        return None
    if not 0 <= n <= len(y):
        raise ValueError(f"cannot draw a subset of {n} from {len(y)} images")
    counts = torch.bincount(y, minlength=num_classes)
    g = torch.Generator().manual_seed(seed)
    per_class = torch.full((num_classes,), n // num_classes, dtype=torch.int64)
    per_class[torch.randperm(num_classes, generator=g)[: n % num_classes]] += 1
    short = (per_class > counts).nonzero().flatten()
    if len(short):
        c = int(short[0])
        raise ValueError(f"cannot draw a balanced subset of {n} from {len(y)} images: class {c} "
                         f"would need {int(per_class[c])} and has {int(counts[c])}")
    # shuffle, then group by class (stable): the first per_class[c] of each group are the pick
    perm = torch.randperm(len(y), generator=g)
    by_class = perm[torch.sort(y[perm], stable=True).indices]
    labels = y[by_class]
    start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(len(y)) - start[labels]
    return by_class[rank < per_class[labels]].sort().values


def partition(n: int, world_size: int, epoch: int, seed: int) -> torch.Tensor:
    """This epoch's data partition of §4.2.1: int64 indices of shape ``[K, n // K]``.

    "The data is partitioned among the GPUs and reshuffled globally every epoch": a permutation of
    ``range(n)`` from a generator seeded by a hash of ``(seed, epoch)`` — identical on every worker
    and process, so no communication is needed — split into K disjoint contiguous parts. The
    ``n % K`` samples at the end of the permutation sit out this epoch. Worker k reads row k in
    order, in local mini-batches.
    """
    if world_size < 1 or n < world_size or epoch < 0:
        raise ValueError(f"partition: need 1 <= world_size <= n and epoch >= 0; got n={n}, "
                         f"world_size={world_size}, epoch={epoch}")
    g = torch.Generator().manual_seed(_mix_seed(seed, "partition", epoch))
    per_worker = n // world_size
    return torch.randperm(n, generator=g)[: world_size * per_worker].view(world_size, per_worker)
