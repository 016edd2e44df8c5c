"""Operator launches per update of the replica engines, counted with the profiler on a CPU.

ResNet-20 on a GPU is launch-bound at these batch sizes (figures/gpu/sweep.csv: the sequential
engine at K = 16 runs no faster than one model at B = 128), so the batched engine must launch the
same operators whatever K is: one vmapped forward/backward, one optimizer step and one average
over the [K, ...] stacks. Counted here as the top-level ``aten::`` calls of two updates (one with
an average); each one is at least one kernel launch on CUDA. The sequential engine's count grows
with K by construction; it is measured too, so the test would notice the two becoming alike.
"""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from localsgd.engines.batched import BatchedReplicaEngine
from localsgd.engines.replicas import ReplicaEngine
from localsgd.models import build_model
from localsgd.schedule import SyncSchedule
from localsgd.topology import Topology


def top_level_ops(cls, k: int, steps: int = 2, **kw) -> int:
    engine = cls(lambda: build_model("resnet20", 10, width=0.25),
                 SyncSchedule(Topology.from_paper(k, 2)),
                 lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-4),
                 seed=0, average_buffers=True, **kw)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(2, 3, 32, 32, generator=g), torch.randint(0, 10, (2,), generator=g))
               for _ in range(k)]
    loss = torch.nn.functional.cross_entropy
    engine.step(batches, loss, stats={}, sync=False)  # momentum buffers exist from here on
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.step(batches, loss, stats={}, sync=False)
    return sum(1 for e in prof.events() if e.name.startswith("aten::")
               and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("packed", [False, True], ids=["vmap", "packed"])
def test_the_batched_engine_launches_as_many_operators_for_six_replicas_as_for_two(packed):
    assert (top_level_ops(BatchedReplicaEngine, 2, packed=packed)
            == top_level_ops(BatchedReplicaEngine, 6, packed=packed))


def test_the_sequential_engine_launches_k_times_as_many():
    two, six = top_level_ops(ReplicaEngine, 2), top_level_ops(ReplicaEngine, 6)
    assert six > 2.5 * two and top_level_ops(BatchedReplicaEngine, 6) < six / 2
