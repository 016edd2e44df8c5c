"""Replica engine: equivalence with mini-batch SGD, hierarchy, determinism, resume."""

import copy

import pytest
import torch
from torch import nn

from localsgd.engines.replica_stack import ReplicaCommunicator
from localsgd.engines.replicas import ReplicaEngine
from localsgd.outer import OuterUpdate, slowmo
from localsgd.schedule import SyncSchedule
from localsgd.topology import Topology

torch.set_num_threads(1)
D, B = 5, 4  # input dimension, local batch size


def mlp():
    return nn.Sequential(nn.Linear(D, 8), nn.Tanh(), nn.Linear(8, 1))


def bn_net():
    return nn.Sequential(nn.Linear(D, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 1))


def batches(engine):
    """Each worker samples its own batch from its own stream (seed + k)."""
    out = []
    for g in engine.generators:
        x = torch.randn(B, D, generator=g)
        out.append((x, x.sum(1, keepdim=True).sin() + 0.1 * torch.randn(B, 1, generator=g)))
    return out


def sgd(lr=0.1, momentum=0.0):
    return lambda ps: torch.optim.SGD(ps, lr=lr, momentum=momentum)


def run(engine, steps):
    for _ in range(steps):
        engine.step(batches(engine), nn.functional.mse_loss)
    return engine


def test_h1_equals_minibatch_sgd_on_concatenated_batch():
    k, steps = 4, 6
    engine = ReplicaEngine(mlp, SyncSchedule(Topology.from_paper(k, 1)), sgd(0.2), seed=3)
    torch.manual_seed(3)
    ref = mlp()
    opt = torch.optim.SGD(ref.parameters(), lr=0.2)
    for _ in range(steps):
        data = batches(engine)
        engine.step(data, nn.functional.mse_loss)
        x = torch.cat([d[0] for d in data])
        y = torch.cat([d[1] for d in data])
        opt.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        opt.step()
    ref_flat = torch.cat([p.detach().flatten() for p in ref.parameters()])
    for row in engine.comm.packed():
        assert torch.allclose(row, ref_flat, atol=1e-6)


def test_warmup_models_with_momentum_averaging_equals_gradient_allreduce():
    """The documented equivalence: averaging (w, u) after each SGD+momentum step == mini-batch
    momentum SGD (gradient all-reduce)."""
    topo = Topology.from_paper(4, 4)
    a = ReplicaEngine(mlp, SyncSchedule(topo, warmup_steps=5), sgd(0.1, 0.9), seed=1)
    b = ReplicaEngine(mlp, SyncSchedule(topo, warmup_steps=5, warmup_mode="models"),
                      sgd(0.1, 0.9), seed=1, average_momentum=True)
    run(a, 5)
    run(b, 5)
    assert torch.allclose(a.comm.flat, b.comm.flat, atol=1e-6)
    assert a.comm.consensus_distance() < 1e-12


def test_hierarchical_groups_agree_inside_blocks():
    engine = ReplicaEngine(mlp, SyncSchedule(Topology.from_paper(4, 2, 2, 2)), sgd(0.1, 0.9),
                           seed=0)
    run(engine, 1)
    assert engine.comm.consensus_distance() > 0  # local steps: replicas drift apart
    run(engine, 1)  # t = 2: block average (groups [0, 1], [2, 3])
    f = engine.comm.flat
    assert torch.equal(f[0], f[1]) and torch.equal(f[2], f[3]) and not torch.equal(f[0], f[2])
    run(engine, 2)  # t = 4: global average
    assert all(torch.equal(f[0], row) for row in f)


def test_bitwise_deterministic_for_same_seed():
    def make(seed):
        sched = SyncSchedule(Topology.from_paper(4, 2, 2, 2), outer_period=4)
        return run(ReplicaEngine(bn_net, sched, sgd(0.05, 0.9), outer=slowmo(), seed=seed,
                                 average_buffers=True), 8)

    a, b, c = make(7), make(7), make(8)
    assert torch.equal(a.comm.flat, b.comm.flat)
    assert not torch.equal(a.comm.flat, c.comm.flat)


def test_state_dict_round_trip_mid_run_continues_identically():
    def make():
        sched = SyncSchedule(Topology.from_paper(4, 2, 2, 2), outer_period=4, warmup_steps=1)
        return ReplicaEngine(bn_net, sched, sgd(0.05, 0.9), outer=OuterUpdate(0.6, 1.0), seed=5,
                             average_buffers=True, average_momentum=True)

    a = run(make(), 5)
    state = a.state_dict()
    run(a, 7)
    b = make()
    b.load_state_dict(state)
    assert b.t == 5
    run(b, 7)
    assert torch.equal(a.comm.flat, b.comm.flat)
    for ma, mb in zip(a.models, b.models, strict=True):
        for x, y in zip(ma.state_dict().values(), mb.state_dict().values(), strict=True):
            assert torch.equal(x, y)


def test_batchnorm_buffers_averaged_on_request():
    sched = SyncSchedule(Topology.from_paper(2, 2))
    on = run(ReplicaEngine(bn_net, sched, sgd(), seed=0, average_buffers=True), 2)
    off = run(ReplicaEngine(bn_net, sched, sgd(), seed=0), 2)
    mean_on = [m[1].running_mean for m in on.models]
    mean_off = [m[1].running_mean for m in off.models]
    assert torch.equal(mean_on[0], mean_on[1])
    assert not torch.equal(mean_off[0], mean_off[1])
    # parameters are averaged either way
    assert torch.equal(on.comm.flat[0], on.comm.flat[1])


def test_gossip_engine_preserves_average_and_outer_step_syncs():
    sched = SyncSchedule(Topology.from_paper(8, 6), gossip=True, outer_period=6)
    engine = ReplicaEngine(mlp, sched, sgd(0.05), outer=slowmo(0.5), seed=2)
    run(engine, 5)
    assert engine.comm.consensus_distance() > 0
    assert torch.allclose(engine.comm.ps_weight, torch.ones(8, dtype=torch.float32))
    before = engine.comm.flat.mean(0).clone()
    engine.comm.gossip(engine.t + 1)  # one extra round: the average is unchanged
    assert torch.allclose(engine.comm.flat.mean(0), before, atol=1e-6)
    run(engine, 1)  # t = 6: exact average + SlowMo step
    assert all(torch.equal(engine.comm.flat[0], row) for row in engine.comm.flat)


def test_communicator_validation():
    with pytest.raises(ValueError, match="got 3 models for a topology of world_size 4"):
        ReplicaCommunicator(Topology.from_paper(4, 2), [mlp() for _ in range(3)])
    engine = ReplicaEngine(mlp, SyncSchedule(Topology.from_paper(2, 2)), sgd(), seed=0)
    with pytest.raises(ValueError, match="need 2 batches"):
        engine.step(batches(engine)[:1], nn.functional.mse_loss)


def test_intra_host_gradient_allreduce_keeps_hosts_identical():
    topo = Topology.from_periods({1: 2, 4: 4}, names=["host", "world"])
    sched = SyncSchedule(topo, warmup_steps=2, post_local_gradient_allreduce=True)
    engine = run(ReplicaEngine(mlp, sched, sgd(0.1, 0.9), seed=4), 5)  # t = 5: no world average
    f = engine.comm.flat
    assert torch.equal(f[0], f[1]) and torch.equal(f[2], f[3]) and not torch.equal(f[0], f[2])
    run(engine, 1)  # t = 6 = W + 4: world average
    assert all(torch.equal(f[0], row) for row in f)


def test_shared_model_objects_are_rejected():
    model = mlp()
    with pytest.raises(ValueError, match="replicas share parameter objects"):
        ReplicaCommunicator(Topology.from_paper(2, 2), [model, model])


def flat(model):
    return nn.utils.parameters_to_vector(model.parameters())


def test_hybrid_block_momentum_engine_matches_hand_written_reference():
    """Post-local warm-up, then local momentum SGD (App. D.1.1) with global block momentum
    (App. D.1.2) every H = 3 steps and a changing inner lr, against plain torch code."""
    k, h, w, m, steps = 4, 3, 2, 0.6, 11
    lrs = [0.1, 0.1, 0.08, 0.08, 0.06, 0.05, 0.05, 0.04, 0.04, 0.03, 0.03]
    sched = SyncSchedule(Topology.from_paper(k, h), warmup_steps=w, outer_period="global")
    engine = ReplicaEngine(mlp, sched, sgd(1.0, 0.9), outer=OuterUpdate(momentum=m), seed=6,
                           lr_schedule=lambda it: lrs[it])
    torch.manual_seed(6)
    base = mlp()
    refs = [copy.deepcopy(base) for _ in range(k)]
    opts = [torch.optim.SGD(r.parameters(), lr=1.0, momentum=0.9) for r in refs]
    anchor, u = None, None
    for t in range(1, steps + 1):
        data = batches(engine)
        engine.step(data, nn.functional.mse_loss)
        for r, o, (x, y) in zip(refs, opts, data, strict=True):
            o.zero_grad()
            nn.functional.mse_loss(r(x), y).backward()
            o.param_groups[0]["lr"] = lrs[t - 1]
        if t <= w:  # mini-batch SGD: average gradients
            for ps in zip(*(r.parameters() for r in refs), strict=True):
                g = torch.stack([p.grad for p in ps]).mean(0)
                for p in ps:
                    p.grad = g.clone()
        for o in opts:
            o.step()
        if t == w:
            anchor, u = flat(refs[0]).detach().clone(), torch.zeros_like(flat(refs[0]))
        elif t > w and (t - w) % h == 0:
            avg = torch.stack([flat(r) for r in refs]).mean(0).detach()
            u = m * u + (anchor - avg) / lrs[t - 1]
            anchor = anchor - lrs[t - 1] * u
            for r in refs:
                nn.utils.vector_to_parameters(anchor.clone(), r.parameters())
    for row, r in zip(engine.comm.packed(), refs, strict=True):
        assert torch.allclose(row, flat(r).detach(), atol=1e-6)
    assert engine.driver.outer.num_steps == (steps - w) // h == 3


def test_rebinding_a_parameter_is_detected_before_mixing():
    engine = ReplicaEngine(mlp, SyncSchedule(Topology.from_paper(2, 2)), sgd(), seed=0)
    run(engine, 1)
    # vector_to_parameters rebinds .data: replica 1 would silently drop out of the average
    nn.utils.vector_to_parameters(flat(engine.models[1]).detach() + 1, engine.models[1].parameters())
    with pytest.raises(RuntimeError, match="parameter 0 of replica 1 no longer aliases its row"):
        run(engine, 1)
    engine = ReplicaEngine(mlp, SyncSchedule(Topology.from_paper(2, 2)), sgd(), seed=0)
    engine.models[1].load_state_dict(engine.models[0].state_dict())  # in place: still aliased
    run(engine, 2)
    assert engine.comm.consensus_distance() == 0


def _conv_engine(threads, schedule):
    from localsgd.models import build_model

    def model_fn():
        return build_model("resnet20", num_classes=4, width=0.25)

    return ReplicaEngine(model_fn, schedule, sgd(0.05, momentum=0.9), seed=1,
                         average_buffers=True, threads=threads)


def _image_batches(engine):
    return [(torch.randn(8, 3, 16, 16, generator=g).contiguous(memory_format=torch.channels_last),
             torch.randint(0, 4, (8,), generator=g)) for g in engine.generators]


@pytest.mark.parametrize("schedule", [
    SyncSchedule(Topology.from_paper(4, 2, block_size=2, block_steps=2)),  # two levels
    SyncSchedule(Topology.from_paper(4, 4), warmup_steps=3),  # gradient all-reduce first
], ids=["hierarchical", "post-local"])
def test_host_threads_compute_the_sequential_bits(schedule):
    # replicas side by side on host threads, each op single-threaded: every tensor and every
    # reported number equals the one-at-a-time engine's, bit for bit
    seq, par = _conv_engine(1, schedule), _conv_engine(3, schedule)
    seen = set()
    for m in par.models:
        m.register_forward_pre_hook(lambda mod, args: seen.add(__import__("threading")
                                                               .current_thread().name))
    for _ in range(6):
        s_seq, s_par = {}, {}
        out_seq = seq.step(_image_batches(seq), nn.functional.cross_entropy, stats=s_seq)
        out_par = par.step(_image_batches(par), nn.functional.cross_entropy, stats=s_par)
        assert out_seq == out_par
        assert s_seq["correct"] == s_par["correct"]
        assert len(s_par["compute_seconds"]) == 4 and min(s_par["compute_seconds"]) > 0
        # the profile's compute phase: the wall time of the overlapping spans, not their sum
        assert "compute_wall_seconds" not in s_seq
        assert 0 < s_par["compute_wall_seconds"] < sum(s_par["compute_seconds"]) + 0.05
    assert torch.equal(seq.comm.flat, par.comm.flat)
    for a, b in zip(seq.comm.buffer_stacks, par.comm.buffer_stacks, strict=True):
        assert torch.equal(a, b)
    assert seq.comm.consensus_distance() == par.comm.consensus_distance()
    # the replicas really ran on the pool's threads, not the caller's
    assert {n.startswith("localsgd-replica") for n in seen} == {True}


def test_host_threads_need_single_threaded_ops_and_a_cpu():
    from localsgd.engines.common import host_map

    schedule = SyncSchedule(Topology.from_paper(2, 2))
    engine = _conv_engine(2, schedule)
    torch.set_num_threads(2)
    try:
        with pytest.raises(ValueError, match=r"torch.set_num_threads\(1\) first"):
            engine.step(_image_batches(engine), nn.functional.cross_entropy)
        assert host_map(abs, [-1, 2], threads=1) == [1, 2]  # one thread: no requirement
    finally:
        torch.set_num_threads(1)
    with pytest.raises(ValueError, match="threads=2: must be >= 1, and 1 off the CPU"):
        ReplicaEngine(mlp, schedule, sgd(), device="meta", threads=2)
    with pytest.raises(ValueError, match="threads=0"):
        ReplicaEngine(mlp, schedule, sgd(), threads=0)


def test_host_map_carries_grad_mode_and_autocast_into_its_threads():
    from localsgd.engines.common import host_map

    def probe(_):
        return torch.is_grad_enabled(), torch.is_autocast_enabled("cpu")

    assert host_map(probe, range(3), threads=2) == [(True, False)] * 3
    with torch.no_grad():
        assert host_map(probe, range(3), threads=2) == [(False, False)] * 3
    with torch.autocast("cpu", torch.bfloat16):
        assert host_map(probe, range(3), threads=2) == [(True, True)] * 3
        x = torch.randn(4, 4)
        assert host_map(lambda _: (x @ x).dtype, range(2), threads=2) == [torch.bfloat16] * 2


@pytest.mark.parametrize("batched,gossip", [(False, False), (True, False), (False, True)])
def test_every_parameter_starts_aligned_and_the_gaps_stay_zero(batched, gossip):
    """cuDNN's channels-last kernels failed with "misaligned address" on replica 1 of ResNet-20
    (row 1 started 8 bytes past a 16-byte boundary; figures/gpu/): every tensor's view of the
    flat stack starts on a multiple of FLAT_ALIGN elements (256 B here), and averaging, gossip and SlowMo leave the gaps 0."""
    from localsgd.engines.batched import BatchedReplicaEngine
    from localsgd.engines.replica_stack import FLAT_ALIGN

    def odd():  # 5*7+7 = 42 and 7+1 = 8 elements: nothing lands aligned by itself
        return nn.Sequential(nn.Linear(D, 7), nn.Tanh(), nn.Linear(7, 1))

    cls = BatchedReplicaEngine if batched else ReplicaEngine
    sched = SyncSchedule(Topology.from_paper(4, 2), gossip=gossip, outer_period=4)
    engine = cls(odd, sched, sgd(0.1, momentum=0.9), outer=slowmo(0.5), seed=1)
    params = ([p for p in engine.params.values()] if batched
              else [p for m in engine.models for p in m.parameters()])
    starts = ([p[r].data_ptr() for p in params for r in range(4)] if batched
              else [p.data_ptr() for p in params])
    base = engine.comm.flat.data_ptr()  # cudaMalloc aligns it to 256 B; a CPU allocator to 64
    assert all((s - base) % (FLAT_ALIGN * 4) == 0 for s in starts)
    run(engine, 6)
    packed = engine.comm.packed().detach()
    assert packed.shape == (4, 5 * 7 + 7 + 7 + 1)
    assert float(engine.comm.flat.detach().abs().sum()) == pytest.approx(float(packed.abs().sum()),
                                                                 rel=1e-6)  # gaps hold 0
    assert engine.param_bytes == packed[0].numel() * 4
