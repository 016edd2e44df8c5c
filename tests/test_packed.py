"""K replicas packed into channel groups (`localsgd.engines.packed`) compute what the vmapped
batched engine computes: equal in float64 through updates and averages, for both packable model
families and both memory layouts; unsupported models are refused by name; 'auto' packs on CUDA
only (on a CPU the engines keep the vmap)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from localsgd.engines import packed as packing
from localsgd.engines.batched import BatchedReplicaEngine
from localsgd.models import build_model
from localsgd.schedule import SyncSchedule
from localsgd.topology import Topology

LAYOUTS = {"nchw": torch.contiguous_format, "nhwc": torch.channels_last}


def run(model: str, width: float, packed, layout, steps: int = 3):
    engine = BatchedReplicaEngine(
        lambda: build_model(model, num_classes=10, width=width).double(),
        SyncSchedule(Topology.from_paper(3, 2)),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-4),
        seed=0, average_buffers=True, packed=packed)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.rand((4, 3, 16, 16), generator=g, dtype=torch.float64)
                .contiguous(memory_format=layout), torch.randint(0, 10, (4,), generator=g))
               for _ in range(3)]
    stats: dict = {}
    losses = [engine.step(batches, F.cross_entropy, stats=stats)[0] for _ in range(steps)]
    return engine, losses, stats


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize(("model", "width"), [("resnet20", 0.5), ("wrn28_10", 0.1)])
def test_packed_equals_vmap_in_float64(model, width, layout):
    vmap, lv, sv = run(model, width, False, LAYOUTS[layout])
    pack, lp, sp = run(model, width, True, LAYOUTS[layout])
    assert pack.packed and not vmap.packed
    assert torch.allclose(torch.tensor(lv), torch.tensor(lp), rtol=0, atol=1e-12)
    # three updates with an average after the second: parameters, momenta and running stats
    assert vmap.comm.flat.shape == pack.comm.flat.shape
    assert (vmap.comm.flat - pack.comm.flat).abs().max() < 1e-12
    for name, buf in vmap.buffers.items():
        assert torch.allclose(buf.double(), pack.buffers[name].double(), rtol=0, atol=1e-12), name
    assert sv["correct"] == sp["correct"]
    mv, mp = vmap.optimizer.state_dict()["state"], pack.optimizer.state_dict()["state"]
    for i in mv:
        assert (mv[i]["momentum_buffer"] - mp[i]["momentum_buffer"]).abs().max() < 1e-12


def test_what_can_be_packed_and_what_auto_chooses():
    assert packing.supports(build_model("resnet20", width=0.25))
    assert packing.supports(build_model("wrn28_10", width=0.05))
    assert not packing.supports(build_model("densenet40_12", width=0.25))
    cumulative = build_model("resnet20", width=0.25)
    cumulative.bn1.momentum = None  # cumulative running averages: not packed
    assert not packing.supports(cumulative)
    with pytest.raises(ValueError, match="DenseNetCifar cannot be packed"):
        BatchedReplicaEngine(lambda: build_model("densenet40_12", width=0.25),
                             SyncSchedule(Topology.from_paper(2, 1)),
                             lambda ps: torch.optim.SGD(ps, lr=0.1), packed=True)
    with pytest.raises(ValueError, match="packed='yes'"):
        BatchedReplicaEngine(lambda: build_model("resnet20", width=0.25),
                             SyncSchedule(Topology.from_paper(2, 1)),
                             lambda ps: torch.optim.SGD(ps, lr=0.1), packed="yes")
    auto = BatchedReplicaEngine(lambda: build_model("resnet20", width=0.25),
                                SyncSchedule(Topology.from_paper(2, 1)),
                                lambda ps: torch.optim.SGD(ps, lr=0.1))
    assert auto.packed is False  # CPU: the vmap


def test_train_resolves_auto_per_device_and_model(monkeypatch):
    from localsgd.training import plan as loop
    from localsgd.training.config import TrainConfig

    cfg = TrainConfig(dataset="synthetic", model="resnet20", world_size=2)
    assert loop.use_packed(cfg, torch.device("cpu")) is False
    assert loop.use_packed(cfg, torch.device("cuda")) is True
    assert loop.use_packed(TrainConfig(dataset="synthetic", model="densenet40_12", width=0.25),
                           torch.device("cuda")) is False
    assert loop.use_packed(TrainConfig(dataset="synthetic", packed=True),
                           torch.device("cpu")) is True
    with pytest.raises(ValueError, match="packed='on'"):
        TrainConfig(dataset="synthetic", packed="on")


def test_the_compiled_packed_forward_equals_the_eager_one():
    # torch.compile (inductor, C++ on a CPU) of the packed forward; running stats updated too
    eager, le, _ = run("resnet20", 0.25, True, torch.contiguous_format, steps=2)
    engine = BatchedReplicaEngine(
        lambda: build_model("resnet20", num_classes=10, width=0.25).double(),
        SyncSchedule(Topology.from_paper(3, 2)),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-4),
        seed=0, average_buffers=True, packed=True, compile=True)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.rand((4, 3, 16, 16), generator=g, dtype=torch.float64),
                torch.randint(0, 10, (4,), generator=g)) for _ in range(3)]
    lc = [engine.step(batches, F.cross_entropy)[0] for _ in range(2)]
    assert torch.allclose(torch.tensor(le), torch.tensor(lc), rtol=0, atol=1e-10)
    assert (eager.comm.flat - engine.comm.flat).abs().max() < 1e-10
    for name, buf in eager.buffers.items():
        assert torch.allclose(buf.double(), engine.buffers[name].double(), rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="compile=True compiles the packed"):
        BatchedReplicaEngine(lambda: build_model("resnet20", width=0.25),
                             SyncSchedule(Topology.from_paper(2, 1)),
                             lambda ps: torch.optim.SGD(ps, lr=0.1), packed=False, compile=True)


def test_a_fallback_to_the_sequential_engine_records_that_nothing_was_packed(monkeypatch):
    # 'auto' chose the batched (packed) engine and its K replicas do not fit the GPU
    from localsgd.training import plan as run_plan
    from localsgd.training.config import TrainConfig

    def check(cfg, num_classes, shape, free, *, batched):
        if batched:
            raise ValueError("does not fit")

    monkeypatch.setattr(run_plan, "check_replica_memory", check)
    plan = run_plan.RunPlan(device=torch.device("cuda"), engine="packed", threads=0,
                            precision="tf32", deterministic=False, memory_format="contiguous",
                            compile=False)
    asked = TrainConfig(dataset="synthetic", world_size=2)
    ran = run_plan.fit_to_memory(plan, asked, 10, (3, 8, 8), free_bytes=1)
    assert ran.engine == "sequential" and not ran.batched and not ran.packed
    assert ran.applied(asked).batched is False and ran.applied(asked).packed is False
    # a batched engine the config asks for by name is not swapped: the error stands
    with pytest.raises(ValueError, match="does not fit"):
        run_plan.fit_to_memory(plan, dataclasses.replace(asked, batched=True), 10, (3, 8, 8), 1)


def test_each_batchnorm_keeps_its_own_mode_when_packed():
    # a model whose first BatchNorm is frozen in eval mode: its running stats stay put
    engine = BatchedReplicaEngine(lambda: build_model("resnet20", width=0.25).double(),
                                  SyncSchedule(Topology.from_paper(2, 1)),
                                  lambda ps: torch.optim.SGD(ps, lr=0.1), packed=True)
    engine._template.bn1.eval()
    before = engine.buffers["bn1.running_mean"].clone()
    g = torch.Generator().manual_seed(0)
    x = torch.rand((2, 4, 3, 8, 8), generator=g, dtype=torch.float64)
    packing.logits(engine._template, engine.params, engine.buffers, x)
    assert torch.equal(engine.buffers["bn1.running_mean"], before)
    assert not torch.equal(engine.buffers["blocks.0.bn1.running_mean"],
                           torch.zeros_like(engine.buffers["blocks.0.bn1.running_mean"]))
