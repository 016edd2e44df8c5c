"""A quorum with a grace window and prime's zero-pseudo-gradient joiner (`localsgd.timing.quorum`,
`SyncSchedule.late` / ``rejoin``, `TrainConfig.quorum` / ``churn_rejoin``): the trace from
arrivals written by hand, who is dropped from which average, the engine's averages against the
rule (a joiner that trains fails it), a resumed run bitwise, the trace's price, bad input."""

from __future__ import annotations

import pytest
import torch

from localsgd.schedule import SyncSchedule
from localsgd.timing.quorum import late_pairs, quorum_seconds, quorum_trace
from localsgd.timing.stragglers import Stragglers
from localsgd.topology import Topology
from localsgd.training.config import TrainConfig


def test_the_merge_waits_for_the_quorum_then_the_grace_window():
    # H = 2, one step time each; worker 2 stalls 1 s at every update: it arrives at 4, the
    # others at 2. A quorum of 2 merges at 2 + grace (never after the last arrival, 4).
    slow = Stragglers(seconds=1.0, persistent=(2,))
    for grace, quorum, merge, late in ((0.0, 2, 2.0, (2,)), (1.0, 2, 3.0, (2,)),
                                       (2.0, 2, 4.0, ()), (9.0, 2, 4.0, ()), (0.0, 3, 4.0, ())):
        (rnd,) = quorum_trace(3, 1, 2, quorum, grace, 1.0, slow)
        assert (rnd.merge_s, rnd.all_s, rnd.late) == (merge, 4.0, late), (grace, quorum)
    # workers away are not waited for: with worker 2 away nobody is late
    assert quorum_trace(3, 1, 2, 2, 0.0, 1.0, slow, away={1: (2,)})[0].late == ()


def test_the_trace_is_seeded_and_prices_itself():
    stalls = Stragglers(seconds=3.0, rate=0.1, seed=4)
    trace = quorum_trace(8, 50, 4, 6, 1.0, 1.0, stalls)
    assert trace == quorum_trace(8, 50, 4, 6, 1.0, 1.0, stalls)
    assert trace != quorum_trace(8, 50, 4, 6, 1.0, 1.0, Stragglers(seconds=3.0, rate=0.1, seed=5))
    price = quorum_seconds(trace)
    assert price["rounds"] == 50 and price["late"] == len(late_pairs(trace)) > 0
    assert price["quorum_s"] < price["sync_s"]  # a dropped change saves its wait
    # every round waits for at least the quorum: six of eight arrive by the merge
    assert all(len(r.late) <= 2 and 4.0 <= r.merge_s <= r.all_s for r in trace)


def test_a_late_worker_trains_but_is_left_out_and_a_zero_joiner_idles_but_counts():
    # H = 2 after a warm-up of 1: round r is updates 2r .. 2r + 1. Worker 2 away in rounds 2-3
    # and back in round 4 with a zero pseudo-gradient; worker 1 late in round 2, worker 0 in 5
    sched = SyncSchedule(Topology.from_paper(3, 2), warmup_steps=1, away=((2, 2, 3),),
                         rejoin="zero", late=((1, 2), (0, 5)))
    rows = [(t, a.level, a.idle, a.absent) for t in range(1, 12) if (a := sched.action(t))]
    assert rows == [(1, None, (), ()), (2, None, (), ()), (3, 0, (), ()),
                    (4, None, (2,), ()), (5, 0, (2,), (1, 2)), (6, None, (2,), ()),
                    (7, 0, (2,), (2,)), (8, None, (2,), ()), (9, 0, (2,), ()),
                    (10, None, (), ()), (11, 0, (), (0,))]


def _tiny(**over):
    return TrainConfig(**{"dataset": "synthetic", "model": "resnet20", "width": 0.25,
                          "n_train": 64, "n_test": 16, "local_batch": 4, "local_steps": 2,
                          "world_size": 4, "epochs": 3.0, "lr": 0.1, "eval_batch": 16,
                          "augment": False, "dtype": "float64", "batched": False,
                          "churn_rate": 0.5, "churn_away_rounds": 1.5, "churn_rejoin": "zero",
                          "quorum": 2, "quorum_grace_steps": 0.5, "quorum_stall_rate": 0.3,
                          "quorum_stall_steps": 2.0, "seed": 5, **over})


def test_the_engine_drops_late_changes_and_keeps_joiners_at_the_average(tmp_path):
    from localsgd import data
    from localsgd.training.loop import RunLimit, build_engine, train

    cfg = _tiny()
    sched = cfg.sync_schedule(4, updates=12)
    ds = data.load_image_dataset("synthetic").subset(64, 16, seed=0)
    seen = []

    def make(c, n, classes):  # every average against the rule, written here
        engine = build_engine(c, n, classes)
        average, last = engine.comm.average, []

        def checked(level, absent=()):
            before = engine.comm.packed().clone()
            r = len(seen) + 1  # the round this average ends
            joiners = sorted(sched._joining_in_round(r))  # zero pseudo-gradient: still there
            for k in joiners:
                assert torch.equal(before[k], last[-1]), f"round {r}: joiner {k} trained"
            average(level, absent=absent)
            present = [k for k in range(c.world_size) if k not in absent]
            want = before[present].mean(0)
            assert torch.allclose(engine.comm.packed(), want.expand_as(before), atol=1e-12)
            last.append(engine.comm.packed()[0].clone())
            seen.append((tuple(absent), tuple(joiners)))

        engine.comm.average = checked
        return engine

    whole = train(cfg, dataset=ds, progress=False, engine=make)
    late = {r for _, r in sched.late or ()}
    assert late and any(j for _, j in seen) and len(seen) == 6  # 12 updates, H = 2
    assert all(set(sched.late_in(2 * r)) <= set(a) for r, (a, _) in enumerate(seen, 1))
    ckpt = tmp_path / "run.pt"  # the trace is the seed's: a resumed run drops the same changes
    train(cfg, dataset=ds, progress=False, checkpoint_path=ckpt, checkpoint_every_steps=3,
          limit=RunLimit(updates=7), engine=build_engine)
    rest = train(cfg, dataset=ds, progress=False, checkpoint_path=ckpt, engine=build_engine)
    timed = ["compute_seconds", "data_seconds", "wall_seconds"]
    assert rest.drop(columns=timed).equals(whole.drop(columns=timed))
    everyone = train(_tiny(quorum=0), dataset=ds, progress=False)
    assert not everyone.test_loss.equals(whole.test_loss)


@pytest.mark.parametrize("make, match", [
    (lambda: quorum_trace(4, 2, 2, 5, 0.0), "quorum=5 > 4 workers"),
    (lambda: quorum_trace(4, 2, 2, 2, -1.0), r"quorum grace_s=-1.0: must be"),
    (lambda: quorum_trace(2, 2, 2, 1, 0.0, 1.0, Stragglers(1.0, persistent=(3,))),
     r"persistent straggler ranks \[3\] do not exist"),
    (lambda: SyncSchedule(Topology.from_paper(4, 2), late=((4, 1),)),
     r"late: worker 4 does not exist"),
    (lambda: SyncSchedule(Topology.from_paper(2, 2), late=((0, 1), (1, 1))),
     "no worker is on time in round 1"),
    (lambda: SyncSchedule(Topology.from_paper(2, 2), away=((1, 1, 2),), late=((1, 2),)),
     "worker 1 is away in round 2"),
    (lambda: SyncSchedule(Topology.from_paper(4, 2, 2, 2), late=((1, 1),)),
     "not with a hierarchy"),
    (lambda: SyncSchedule(Topology.from_paper(2, 2), rejoin="zero"), "give away too"),
    (lambda: TrainConfig(world_size=4, block_size=None, quorum=5), r"quorum=5: a number of "),
    (lambda: TrainConfig(quorum=2, quorum_stall_rate=2.0), "quorum_stall_rate=2.0: must be a "),
    (lambda: TrainConfig(churn_rejoin="stale"), "churn_rejoin='stale'"),
    (lambda: TrainConfig(world_size=4, block_size=2, block_steps=2, quorum=2),
     r"quorum \(a quorum's merge\) .* not with block_size=2"),
])
def test_bad_input_is_one_line(make, match):
    with pytest.raises(ValueError, match=match):
        make()
