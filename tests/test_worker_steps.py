"""Per-worker H for heterogeneous workers (`SyncSchedule.worker_steps`,
`TrainConfig.worker_local_steps`): which worker sits out which update, and three workers of
different speeds trained by a loop written here beside the replica engines (float64; BatchNorm
statistics and momentum buffers kept while a worker is idle). DDP == replicas: tests/test_ddp.py
("worker_steps" scenario)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import nn

from localsgd.engines.batched import BatchedReplicaEngine
from localsgd.engines.replicas import ReplicaEngine
from localsgd.schedule import SyncSchedule
from localsgd.topology import Topology
from localsgd.training.config import TrainConfig

K, H, STEPS, LR, M = 3, 4, 14, 0.1, 0.9
SPEEDS = (4, 2, 1)  # worker 0 makes every update of a round, worker 2 one in four


def test_a_worker_applies_the_first_of_its_h_updates_of_each_round():
    s = SyncSchedule(Topology.from_paper(K, H, None, 1), warmup_steps=2, worker_steps=SPEEDS)
    idle = [s.action(t).idle for t in range(1, 13)]
    # warm-up (t <= 2): everyone; then rounds of 4 counted from its end: t = 3..6, 7..10
    assert idle == [(), (), (), (2,), (1, 2), (1, 2), (), (2,), (1, 2), (1, 2), (), (2,)]
    assert [s.action(t).level for t in (6, 10)] == [0, 0]  # the round still ends on an average


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"worker_steps": (4, 2)}, "one H per worker, 3 of them"),
    ({"worker_steps": (4, 5, 1)}, "worker_steps[1]=5 > 4"),
    ({"worker_steps": (4, 0, 1)}, "worker_steps[1] must be an integer >= 1"),
    ({"worker_steps": (4, 2, 1), "gossip": True}, "not with {'gossip': True}"),
])
def test_per_worker_h_that_cannot_run_says_why_in_one_line(kwargs, words):
    with pytest.raises(ValueError) as err:
        SyncSchedule(Topology.from_paper(K, H, None, 1), **kwargs)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_the_optimizer_wrapper_refuses_it():
    from localsgd.optim import LocalSGDOptimizer

    model = nn.Linear(2, 1)
    with pytest.raises(ValueError, match="use an engine"):
        LocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                          SyncSchedule(Topology.from_paper(K, H, None, 1), worker_steps=SPEEDS),
                          communicator=None)


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 2)).double()


def _batches() -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    g = torch.Generator().manual_seed(3)
    return [[(torch.randn(6, 3, generator=g, dtype=torch.float64),
              torch.randint(0, 2, (6,), generator=g)) for _ in range(K)] for _ in range(STEPS)]


def _reference(batches):
    """Each worker its own model and SGD with momentum; worker k trains only on the first
    SPEEDS[k] updates of each round of H (forward, backward, step: nothing else touches its
    model, BatchNorm statistics included); the world averages parameters every H updates."""
    torch.manual_seed(0)
    start = _model()
    models = [copy.deepcopy(start) for _ in range(K)]
    opts = [torch.optim.SGD(m.parameters(), lr=LR, momentum=M) for m in models]
    for t, step_batches in enumerate(batches, 1):
        for k, (model, opt, (x, y)) in enumerate(zip(models, opts, step_batches, strict=True)):
            if (t - 1) % H >= SPEEDS[k]:
                continue
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        if t % H == 0:
            with torch.no_grad():
                for ps in zip(*(m.parameters() for m in models), strict=True):
                    mean = sum(ps) / K
                    for p in ps:
                        p.copy_(mean)
    return models


def _state(models) -> tuple[torch.Tensor, torch.Tensor]:
    params = torch.stack([torch.cat([p.detach().reshape(-1) for p in m.parameters()])
                          for m in models])
    buffers = torch.stack([torch.cat([b.reshape(-1) for b in m.buffers()
                                      if b.is_floating_point()]) for m in models])
    return params, buffers


@pytest.mark.parametrize("cls", [ReplicaEngine, BatchedReplicaEngine])
def test_engines_train_what_the_hand_written_loop_trains(cls):
    batches = _batches()
    engine = cls(_model, SyncSchedule(Topology.from_paper(K, H, None, 1), worker_steps=SPEEDS),
                 lambda ps: torch.optim.SGD(ps, lr=LR, momentum=M), seed=0)
    for step_batches in batches:
        engine.step(step_batches, nn.functional.cross_entropy)
    want_params, want_buffers = _state(_reference(batches))
    got_params = engine.comm.packed()
    got_buffers = torch.stack([torch.cat([s[k].reshape(-1) for s in engine.comm.buffer_stacks])
                               for k in range(K)])
    assert torch.allclose(got_params, want_params, rtol=0, atol=1e-12)
    assert torch.allclose(got_buffers, want_buffers, rtol=0, atol=1e-12)
    # the slow workers' BatchNorm statistics moved less than the fast one's: not all equal
    assert (got_buffers[0] - got_buffers[2]).abs().max() > 1e-6


def test_a_planted_defect_changes_the_run():
    """The reference is sensitive to the idle set: a worker that also trains when idle (no
    restore) ends elsewhere."""
    batches = _batches()
    engine = ReplicaEngine(_model, SyncSchedule(Topology.from_paper(K, H, None, 1),
                                                worker_steps=(4, 4, 4)),
                           lambda ps: torch.optim.SGD(ps, lr=LR, momentum=M), seed=0)
    for step_batches in batches:
        engine.step(step_batches, nn.functional.cross_entropy)
    want, _ = _state(_reference(batches))
    assert (engine.comm.packed() - want).abs().max() > 1e-6


def test_train_runs_it_and_a_pack_keeps_it(tmp_path):
    from localsgd import data
    from localsgd.training.loop import train
    from localsgd.training.packs import train_runs

    ds = data.load_image_dataset("synthetic").subset(128, 32, seed=0)
    cfg = TrainConfig(dataset="synthetic", model="resnet20", width=0.25, world_size=2,
                      local_batch=8, local_steps=4, epochs=1.0, lr=0.1, n_test=32, eval_batch=32,
                      dtype="float64", worker_local_steps=(4, 1), batched=True)
    even = dataclasses.replace(cfg, worker_local_steps=None, seed=1)
    alone = train(cfg, dataset=ds, progress=False)
    packed = train_runs([cfg, even], dataset=ds, progress=False)
    cols = ["train_loss", "test_loss", "test_acc"]
    assert torch.allclose(torch.tensor(packed[0][cols].to_numpy()),
                          torch.tensor(alone[cols].to_numpy()), rtol=0, atol=1e-9)
    sequential = train(dataclasses.replace(cfg, batched=False), dataset=ds, progress=False)
    assert torch.allclose(torch.tensor(sequential[cols].to_numpy()),
                          torch.tensor(alone[cols].to_numpy()), rtol=0, atol=1e-9)
    plain = train(dataclasses.replace(cfg, worker_local_steps=None), dataset=ds, progress=False)
    assert plain["test_loss"].iloc[-1] != alone["test_loss"].iloc[-1]  # the idle updates acted


def test_the_command_line_takes_one_h_per_worker():
    """``--worker-local-steps "[4, 2]"`` (or ``4,2``) is a tuple of integers, ``none`` none; a
    float tuple field keeps its floats (the parser once turned an optional tuple's text into a
    tuple of characters)."""
    import typing

    from localsgd.training.runner_args import _field_parser

    hints = typing.get_type_hints(TrainConfig)
    parse = _field_parser(hints["worker_local_steps"])
    assert parse("[4, 2]") == (4, 2) and parse("4,2") == (4, 2) and parse("none") is None
    with pytest.raises(ValueError):
        parse("4,2.5")
    assert _field_parser(hints["decay_fractions"])("0.5,0.75") == (0.5, 0.75)
    assert _field_parser(hints["block_size"])("none") is None
    assert _field_parser(hints["block_size"])("2") == 2
