"""Replica memory estimate (localsgd.memory) on CPU with small models."""

import torch
from torch import nn

from localsgd.memory import estimate_replica_memory, max_replicas, replica_memory
from localsgd.models import build_model


def mlp():
    return nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5))


def test_mlp_components_exact():
    n = 10 * 20 + 20 + 20 * 5 + 5
    m = replica_memory(mlp, K=4, local_batch=8, input_shape=(10,), headroom=1.0)
    assert m.parameters == 5 * n * 4  # the [K, n] stack + the template
    assert m.gradients == 4 * n * 4 and m.optimizer_state == 4 * n * 4
    assert m.outer_state == 2 * 4 * n * 4 and m.buffers == 0
    assert m.inputs == 4 * 8 * 10 * 4
    # autograd saves the input [B, 10] (first addmm) and the ReLU output [B, 20] (ReLU and the
    # second addmm: one storage): (10 + 20) floats per sample, times K when batched
    assert m.activations == 4 * 8 * 30 * 4
    seq = replica_memory(mlp, K=4, local_batch=8, input_shape=(10,), headroom=1.0,
                         batched=False, optimizer="adam", outer=False)
    assert seq.activations == 8 * 30 * 4 and seq.optimizer_state == 2 * 4 * n * 4
    assert seq.outer_state == 0
    assert m.total == sum(vars(m).values())


def test_dtype_and_batchnorm_buffers():
    def net():
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                             nn.Linear(4 * 6 * 6, 2))
    f32 = replica_memory(net, 2, 4, (3, 8, 8))
    f64 = replica_memory(net, 2, 4, (3, 8, 8), torch.float64)
    assert f64.parameters == 2 * f32.parameters and f64.inputs == 2 * f32.inputs
    # BatchNorm: running mean and var (float) + num_batches_tracked (int64), K + 1 copies
    assert f32.buffers == 3 * (4 * 4 + 4 * 4 + 8)
    assert f32.activations > 0


def test_grows_with_k_and_batch_and_max_replicas_fits():
    def small():
        return build_model("resnet20", width=0.25)
    shape = (3, 16, 16)
    a = estimate_replica_memory(small, 2, 8, shape)
    assert estimate_replica_memory(small, 4, 8, shape) > a
    assert estimate_replica_memory(small, 2, 16, shape) > a
    budget = 64 * 2**20
    k = max_replicas(small, 8, shape, budget)
    assert k >= 1
    assert estimate_replica_memory(small, k, 8, shape) <= budget
    assert estimate_replica_memory(small, k + 1, 8, shape) > budget
    assert max_replicas(small, 8, shape, 1000) == 0
    assert max_replicas(small, 8, shape, budget, reserve_bytes=budget // 2) < k
