"""Batched (vmap) replica engine == sequential replica engine; per-step stats; resume; errors."""

import pytest
import torch
from torch import nn

from localsgd.engines.batched import BatchedReplicaEngine
from localsgd.engines.replicas import ReplicaEngine, make_engine
from localsgd.outer import OuterUpdate
from localsgd.schedule import SyncSchedule
from localsgd.topology import Topology

torch.set_num_threads(1)
K, B, C = 4, 6, 3  # workers, local batch, classes
BN_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d)


def cnn(dtype=torch.float64):
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
        nn.Conv2d(4, 6, 3, stride=2, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, C),
    ).to(dtype)


def no_decay_positions(model):
    """Positions (in model.parameters() order) of BatchNorm parameters."""
    bn = {id(p) for m in model.modules() if isinstance(m, BN_TYPES) for p in m.parameters()}
    return {i for i, p in enumerate(model.parameters()) if id(p) in bn}


def optimizer_fn(params):
    # position-based groups: the same split for per-replica and stacked parameters
    params, skip = list(params), no_decay_positions(cnn())
    return torch.optim.SGD([
        {"params": [p for i, p in enumerate(params) if i not in skip]},
        {"params": [p for i, p in enumerate(params) if i in skip], "weight_decay": 0.0},
    ], lr=0.05, momentum=0.9, weight_decay=1e-3)


def batches(engine, dtype=torch.float64):
    return [(torch.randn(B, 3, 8, 8, generator=g, dtype=dtype),
             torch.randint(0, C, (B,), generator=g)) for g in engine.generators]


SCENARIOS = {
    # 2 levels (pairs every 2 steps, the world every 6), post-local warm-up, local momentum +
    # weight decay, block momentum at every global average, BN buffers averaged, lr schedule
    "hierarchical_block_momentum": lambda: {
        "schedule": SyncSchedule(Topology.from_periods({2: 2, 6: 4}), warmup_steps=3,
                                 outer_period="global"),
        "outer": OuterUpdate(momentum=0.5), "average_buffers": True,
        "lr_schedule": lambda it: 0.05 if it < 8 else 0.02},
    # model-averaging warm-up with momentum averaging, then SlowMo over SGP gossip
    "slowmo_gossip_momentum_avg": lambda: {
        "schedule": SyncSchedule(Topology.from_periods({6: 4}), warmup_steps=2,
                                 warmup_mode="models", gossip=True, outer_period=6),
        "outer": OuterUpdate(momentum=0.5), "average_momentum": True},
}


def pair(kwargs_fn, model_fn=cnn, seed=3):
    return [cls(model_fn, optimizer_fn=optimizer_fn, seed=seed, **kwargs_fn())
            for cls in (ReplicaEngine, BatchedReplicaEngine)]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_batched_equals_sequential_float64(name):
    seq, bat = pair(SCENARIOS[name])
    actions = []
    for _ in range(16):
        data = batches(seq)
        batches(bat)  # keep the engines' worker streams in step
        ls, a = seq.step(data, nn.functional.cross_entropy)
        lb, b = bat.step(data, nn.functional.cross_entropy)
        assert a == b
        assert max(abs(x - y) for x, y in zip(ls, lb, strict=True)) < 1e-9
        actions.append(a)
    # the scenario exercises what it claims to
    assert any(a.warmup for a in actions) and sum(a.outer for a in actions) >= 2
    if name == "hierarchical_block_momentum":
        assert {0, 1} <= {a.level for a in actions}
    else:
        assert sum(a.gossip for a in actions) >= 8
    assert (seq.comm.flat - bat.comm.flat).abs().max() < 1e-9
    assert seq.comm.consensus_distance() > 1e-8  # not trivially equal: replicas differ at t=16
    for k in range(K):
        ours, theirs = seq.models[k].state_dict(), bat.replica_state_dict(k)
        assert ours.keys() == theirs.keys()
        for key in ours:  # parameters and per-replica BN running stats / counters
            assert torch.allclose(ours[key], theirs[key], rtol=0, atol=1e-9), (k, key)
    for m in (seq.averaged_model(), bat.averaged_model()):
        assert type(m) is nn.Sequential
    avg_s, avg_b = seq.averaged_model().state_dict(), bat.averaged_model().state_dict()
    for key in avg_s:
        assert torch.allclose(avg_s[key], avg_b[key], rtol=0, atol=1e-9), key
    # momentum buffers: per replica (sequential) == rows of the stacked state (batched)
    p_bat = list(bat.params.values())
    for j, p_seq in enumerate(seq.models[1].parameters()):
        u = seq.optimizers[1].state[p_seq]["momentum_buffer"]
        assert torch.allclose(u, bat.optimizer.state[p_bat[j]]["momentum_buffer"][1], atol=1e-9)


def test_batched_float32_within_tolerance_and_stats():
    kw = SCENARIOS["hierarchical_block_momentum"]
    seq, bat = pair(kw, model_fn=lambda: cnn(torch.float32))
    for _ in range(8):
        data = batches(seq, torch.float32)
        batches(bat, torch.float32)
        s_stats, b_stats = {}, {}
        ls, _ = seq.step(data, nn.functional.cross_entropy, stats=s_stats)
        lb, _ = bat.step(data, nn.functional.cross_entropy, stats=b_stats)
        assert torch.allclose(torch.tensor(ls), torch.tensor(lb), atol=1e-5)
        for st in (s_stats, b_stats):
            assert len(st["correct"]) == K and len(st["compute_seconds"]) == K
            assert all(isinstance(c, int) and 0 <= c <= B for c in st["correct"])
            assert all(isinstance(s, float) and s > 0 for s in st["compute_seconds"])
        assert len(set(b_stats["compute_seconds"])) == 1  # batched: step time / K for everyone
        # the same outputs (up to float32 rounding): the argmax agrees except at near-ties
        assert sum(abs(a - b) for a, b in zip(s_stats["correct"], b_stats["correct"],
                                              strict=True)) <= 1
    assert torch.allclose(seq.comm.flat, bat.comm.flat, atol=1e-4)
    for a, b in zip(seq.comm.buffer_stacks, bat.comm.buffer_stacks, strict=True):
        assert torch.allclose(a, b, atol=1e-4)


def test_stats_correct_counts_hits_before_the_update():
    eng = BatchedReplicaEngine(cnn, SyncSchedule(Topology.from_paper(K, 2)), optimizer_fn)
    data = batches(eng)
    with torch.no_grad():  # train-mode outputs of the initial model, replica by replica
        expected = [int((cnn_out.argmax(1) == y).sum()) for cnn_out, y in
                    ((eng.averaged_model().train()(x), y) for x, y in data)]
    stats = {}
    eng.step(data, nn.functional.cross_entropy, stats=stats)
    assert stats["correct"] == expected


@pytest.mark.parametrize("cls", [ReplicaEngine, BatchedReplicaEngine])
def test_state_dict_round_trip_resumes_bitwise(cls):
    def make():
        return cls(cnn, optimizer_fn=optimizer_fn, seed=5,
                   **SCENARIOS["hierarchical_block_momentum"]())

    def run(engine, steps):
        return [engine.step(batches(engine), nn.functional.cross_entropy)[0]
                for _ in range(steps)]

    a = make()
    run(a, 5)
    state = a.state_dict()
    la = run(a, 7)
    b = make()
    b.load_state_dict(state)
    assert b.t == 5
    assert run(b, 7) == la
    assert torch.equal(a.comm.flat, b.comm.flat)
    for x, y in zip(a.comm.buffer_stacks, b.comm.buffer_stacks, strict=True):
        assert torch.equal(x, y)
    assert a.comm.consensus_distance() > 0


def test_bad_batches_and_unsupported_models_raise():
    eng = BatchedReplicaEngine(cnn, SyncSchedule(Topology.from_paper(K, 2)), optimizer_fn)
    data = batches(eng)
    with pytest.raises(ValueError, match="need 4 batches"):
        eng.step(data[:3], nn.functional.cross_entropy)
    data[2] = (data[2][0][:-1], data[2][1][:-1])  # a short last batch
    with pytest.raises(ValueError, match="batch 2 has inputs .* same local batch size"):
        eng.step(data, nn.functional.cross_entropy)
    with pytest.raises(ValueError, match="does not support dropout.*p=0.5"):
        BatchedReplicaEngine(lambda: nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)),
                             SyncSchedule(Topology.from_paper(K, 2)), optimizer_fn)
    with pytest.raises(ValueError, match="saved by ReplicaEngine"):
        eng.load_state_dict(ReplicaEngine(cnn, SyncSchedule(Topology.from_paper(K, 2)),
                                          optimizer_fn).state_dict())


def test_make_engine_and_dropout_zero():
    kw = {"model_fn": lambda: nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.0), nn.Linear(4, 2)),
          "schedule": SyncSchedule(Topology.from_paper(2, 2)),
          "optimizer_fn": lambda ps: torch.optim.SGD(ps, lr=0.1)}
    seq, bat = make_engine(batched=False, **kw), make_engine(batched=True, **kw)
    assert type(seq) is ReplicaEngine and type(bat) is BatchedReplicaEngine
    data = [(torch.randn(5, 3, generator=g), torch.randint(0, 2, (5,), generator=g))
            for g in bat.generators]
    for e in (seq, bat):
        e.step(data, nn.functional.cross_entropy)
        e.step(data, nn.functional.cross_entropy)  # t = 2: average
    assert torch.allclose(seq.comm.flat, bat.comm.flat, atol=1e-6)
    assert bat.comm.consensus_distance() == 0 and bat.t == 2 and bat.world_size == 2
    for e in (seq, bat):  # floating targets (regression): "correct" has no meaning
        stats = {}
        e.step([(x, torch.randn(5, 2)) for x, _ in data], nn.functional.mse_loss, stats=stats)
        assert stats["correct"] == [None, None] and len(stats["compute_seconds"]) == 2
