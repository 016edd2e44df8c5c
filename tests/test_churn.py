"""Workers leaving and rejoining on a seeded trace (`SyncSchedule.away`, `churn_trace`,
`TrainConfig.churn_rate`): who is idle and left out of which average, the engines' partial
average against one written from the rule, a churn run resumed bitwise, and bad input."""

from __future__ import annotations

import itertools

import pytest
import torch

from localsgd.schedule import SyncSchedule, churn_trace
from localsgd.topology import Topology
from localsgd.training.config import TrainConfig


def test_an_absent_worker_is_idle_and_left_out_of_its_rounds_averages():
    # H = 2 after a warm-up of 1: round r is updates 2r .. 2r + 1; worker 2 away in rounds 2-3
    sched = SyncSchedule(Topology.from_paper(3, 2), warmup_steps=1, away=((2, 2, 3),))
    rows = [(t, a.level, a.idle, a.absent) for t in range(1, 10) if (a := sched.action(t))]
    assert rows == [(1, None, (), ()), (2, None, (), ()), (3, 0, (), ()),
                    (4, None, (2,), ()), (5, 0, (2,), (2,)), (6, None, (2,), ()),
                    (7, 0, (2,), (2,)), (8, None, (), ()), (9, 0, (), ())]


def test_the_trace_is_seeded_and_keeps_worker_0():
    a = churn_trace(8, 200, 0.1, 3.0, seed=5)
    assert a == churn_trace(8, 200, 0.1, 3.0, seed=5) != churn_trace(8, 200, 0.1, 3.0, seed=6)
    assert a and all(w != 0 for w, _, _ in a) and all(1 <= f <= last <= 200 for _, f, last in a)
    mean = sum(last - f + 1 for _, f, last in a) / len(a)
    assert 2.0 < mean < 4.0  # geometric of mean 3 (cut at the run's end)
    for w in range(1, 8):  # a returning worker stays a round before it can leave again
        spans = sorted((f, last) for v, f, last in a if v == w)
        assert all(prev[1] + 1 < nxt[0] for prev, nxt in itertools.pairwise(spans))
    assert churn_trace(4, 50, 0.0, 2.0, seed=0) == ()


def _tiny(**over):
    return TrainConfig(**{"dataset": "synthetic", "model": "resnet20", "width": 0.25,
                          "n_train": 64, "n_test": 16, "local_batch": 4, "local_steps": 2,
                          "world_size": 4, "epochs": 3.0, "lr": 0.1, "eval_batch": 16,
                          "augment": False, "dtype": "float64", "batched": False,
                          "churn_rate": 0.5, "churn_away_rounds": 1.5, "seed": 3, **over})


def test_the_engines_average_the_workers_present_and_resume_bitwise(tmp_path):
    from localsgd import data
    from localsgd.training.loop import RunLimit, build_engine, train

    cfg = _tiny()
    ds = data.load_image_dataset("synthetic").subset(64, 16, seed=0)
    seen = []

    def make(c, n, classes):  # check every average against the rule, written here
        engine = build_engine(c, n, classes)
        average = engine.comm.average

        def checked(level, absent=()):
            before = engine.comm.packed().clone()
            average(level, absent=absent)
            present = [k for k in range(c.world_size) if k not in absent]
            want = before[present].mean(0)
            assert torch.allclose(engine.comm.packed(), want.expand_as(before), atol=1e-12)
            seen.append(tuple(absent))

        engine.comm.average = checked
        return engine

    whole = train(cfg, dataset=ds, progress=False, engine=make)
    assert any(seen) and len(seen) == 6  # 12 updates, H = 2: six averages, some partial
    # the trace is a function of the seed: a run cut and resumed draws the same absences
    ckpt = tmp_path / "run.pt"
    # (through the same factory: an engine built outside `train` plans its own execution)
    train(cfg, dataset=ds, progress=False, checkpoint_path=ckpt, checkpoint_every_steps=3,
          limit=RunLimit(updates=7), engine=make)
    rest = train(cfg, dataset=ds, progress=False, checkpoint_path=ckpt, engine=make)
    timed = ["compute_seconds", "data_seconds", "wall_seconds"]
    assert rest.drop(columns=timed).equals(whole.drop(columns=timed))
    plain = train(_tiny(churn_rate=0.0), dataset=ds, progress=False, engine=make)
    assert not plain.test_loss.equals(whole.test_loss)


@pytest.mark.parametrize("make, match", [
    (lambda: SyncSchedule(Topology.from_paper(4, 2), away=((4, 1, 2),)),
     r"away: worker 4 does not exist \(world_size 4"),
    (lambda: SyncSchedule(Topology.from_paper(2, 2), away=((0, 1, 1), (1, 1, 2))),
     "every worker is away in round 1"),
    (lambda: SyncSchedule(Topology.from_paper(2, 2), away=((1, 3, 2),)), "need 1 <= first"),
    (lambda: SyncSchedule(Topology.from_paper(4, 2, 2, 2), away=((1, 1, 1),)),
     "not with a hierarchy"),
    (lambda: TrainConfig(churn_rate=1.5), r"churn_rate=1.5: must be a probability"),
    (lambda: TrainConfig(churn_rate=0.1, churn_away_rounds=0.5), "churn_away_rounds=0.5"),
    (lambda: TrainConfig(churn_rate=0.1, average_compression="int8"),
     "not with average_compression='int8'"),
    (lambda: TrainConfig(world_size=4, block_size=2, block_steps=2, churn_rate=0.1),
     "not with block_size=2"),
])
def test_bad_input_is_one_line(make, match):
    with pytest.raises(ValueError, match=match):
        make()
