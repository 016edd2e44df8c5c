"""localsgd: local SGD and hierarchical local SGD in PyTorch.

The public names below are importable from the package itself (``from localsgd import
Topology, SyncSchedule, TrainConfig``); each is loaded on first use (PEP 562), so
``import localsgd`` stays light and imports no torch. Where they live:

* the algorithms, pure Python: `localsgd.schedule` (over `localsgd.topology`), `localsgd.outer`,
  `localsgd.gossip`, `localsgd.lr`;
* torch.distributed: `localsgd.averaging` (over `localsgd.collectives`), `localsgd.optim`,
  `localsgd.distributed`; beyond the sources: compressed averaging (`localsgd.compression`) and
  streaming fragment sync (`localsgd.streaming`, planned by `localsgd.schedule.Streaming`);
* the engines: `localsgd.engines` (replicas, DDP); training: `localsgd.training` (its config,
  plan, loop, checkpoints, packs of runs, results key, the torchrun runner and the one front
  door, ``localsgd train``);
* data and models: `localsgd.data`, `localsgd.models`;
* time models: `localsgd.timing`; the convex simulator: `localsgd.convex`;
* the reproduction, built on the library and never imported by it (the ``[paper]`` extra):
  `localsgd.paper` -- per-source experiments, benchmarks, the notebook harness, the report and
  the `localsgd` command (docs/layout.md); its results cache is
  `localsgd.paper.experiments.grid.run_cached`.

Each public name has one address besides this one: the module that defines it (CHANGELOG.md).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it (the loop itself: ``from localsgd.training.loop
# import train``).
_EXPORTS = {
    "Action": "localsgd.schedule",
    "Level": "localsgd.topology",
    "SyncDriver": "localsgd.schedule",
    "SyncSchedule": "localsgd.schedule",
    "Streaming": "localsgd.schedule",
    "Topology": "localsgd.topology",
    "OuterUpdate": "localsgd.outer",
    "LRSchedule": "localsgd.lr",
    "LocalSGDOptimizer": "localsgd.optim",
    "DistributedCommunicator": "localsgd.averaging",
    "HierarchicalAverager": "localsgd.averaging",
    "PeriodicAverager": "localsgd.averaging",
    "spawn": "localsgd.distributed",
    "init_from_env": "localsgd.distributed",
    "Engine": "localsgd.engines",
    "ReplicaEngine": "localsgd.engines.replicas",
    "BatchedReplicaEngine": "localsgd.engines.batched",
    "DDPEngine": "localsgd.engines.ddp",
    "TrainConfig": "localsgd.training.config",
    "build_engine": "localsgd.training.loop",
    "load_checkpoint": "localsgd.training.checkpoint",
    "save_checkpoint": "localsgd.training.checkpoint",
    "build_model": "localsgd.models",
    "load_image_dataset": "localsgd.data",
    "Cluster": "localsgd.timing.cluster",
    "Scheme": "localsgd.timing.scheme",
    "Stragglers": "localsgd.timing.stragglers",
    "simulate": "localsgd.timing.simulate",
}

__all__ = [  # the keys of _EXPORTS (tests/test_imports.py checks both)
    "Action",
    "BatchedReplicaEngine",
    "Cluster",
    "DDPEngine",
    "DistributedCommunicator",
    "Engine",
    "HierarchicalAverager",
    "LRSchedule",
    "Level",
    "LocalSGDOptimizer",
    "OuterUpdate",
    "PeriodicAverager",
    "ReplicaEngine",
    "Scheme",
    "Stragglers",
    "Streaming",
    "SyncDriver",
    "SyncSchedule",
    "Topology",
    "TrainConfig",
    "__version__",
    "build_engine",
    "build_model",
    "init_from_env",
    "load_checkpoint",
    "load_image_dataset",
    "save_checkpoint",
    "simulate",
    "spawn",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'localsgd' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
