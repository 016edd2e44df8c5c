"""Helpers both engines share (replicas and DDP): worker streams, cloned state, accuracy counts."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Batch", "clone_tensors", "count_correct", "worker_generator"]

Batch = tuple[torch.Tensor, torch.Tensor]


def worker_generator(seed: int, rank: int, device: str | torch.device = "cpu") -> torch.Generator:
    """Worker `rank`'s own random stream (data order, sampling): seeded with ``seed + rank``."""
    return torch.Generator(device=device).manual_seed(int(seed) + int(rank))


def clone_tensors(obj: Any) -> Any:
    """``obj`` (nested dicts / lists / tuples) with every tensor detached and cloned: a state
    dict that no later in-place update of the model or its flat buffer can change."""
    if torch.is_tensor(obj):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return type(obj)((k, clone_tensors(v)) for k, v in obj.items())
    if isinstance(obj, list | tuple):
        return type(obj)(clone_tensors(v) for v in obj)
    return obj


def count_correct(out: torch.Tensor, y: torch.Tensor, class_dim: int) -> torch.Tensor | None:
    """Number of argmax hits along `class_dim` (per replica if stacked); None for non-class
    (floating) targets, where "correct" has no meaning."""
    if y.is_floating_point():
        return None
    hits = out.detach().argmax(dim=class_dim) == y
    return hits.flatten(class_dim - 1).sum(class_dim - 1) if class_dim > 1 else hits.sum()
