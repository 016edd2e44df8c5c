"""The quadratic synchronization rule (Gu et al., ICLR 2024) as explicit rounds of a
`SyncSchedule`: H = max(H_base, floor((alpha / lr)^2)) at each round's start, so H grows as the
learning rate decays; the rounds a training run and the timing model read; bad input."""

from __future__ import annotations

import pytest

from localsgd.lr import LRSchedule
from localsgd.schedule import SyncSchedule, qsr_rounds
from localsgd.topology import Topology
from localsgd.training.config import TrainConfig


def test_h_grows_as_the_learning_rate_decays():
    lr = LRSchedule(peak_lr=0.1, milestones=(100, 150), factor=0.1)
    rounds = qsr_rounds(lr, alpha=0.2, base=2, updates=1000)
    # lr 0.1: (0.2 / 0.1)^2 = 4 (above the base 2) for 25 rounds up to update 100; then lr 0.01:
    # (0.2 / 0.01)^2 = 400, its first round starting at 100 where the decay already applies
    assert rounds[:25] == (4,) * 25 and rounds[25] == 400
    # the next round starts at 500, past the second decay (lr 0.001): (0.2 / 0.001)^2 = 40,000
    assert sum(rounds[:26]) == 500 and rounds[26:] == (40000,)
    # a small alpha is plain local SGD with H = base
    assert set(qsr_rounds(lr, alpha=0.001, base=2, updates=1000)) == {2}
    # a warm-up start counts rounds from there
    assert sum(qsr_rounds(lr, 0.2, 2, 1000, start=10)[:23]) == 92
    # rounds that start inside the lr's warm-up keep the base H (a warm-up's small lr would
    # otherwise give a first round of (alpha / start lr)^2)
    warm = LRSchedule(peak_lr=0.1, warmup_iters=20, start_lr=0.001, milestones=(100,))
    assert qsr_rounds(warm, 0.2, 2, 1000, lr_warmup=20)[:11] == (2,) * 10 + (4,)
    assert qsr_rounds(warm, 0.2, 2, 1000)[0] == 40000


def test_the_world_averages_where_a_round_ends_and_the_last_length_repeats():
    sched = SyncSchedule(Topology.from_paper(4, 1), warmup_steps=3, rounds=(2, 3, 5),
                         outer_period="global")
    ends = [t for t in range(1, 30) if sched.action(t).level == 0]
    assert ends == [5, 8, 13, 18, 23, 28]  # warm-up 3, then 2, 3, 5, 5, 5, ...
    assert all(sched.action(t).outer for t in ends)
    assert all(sched.action(t).warmup for t in (1, 2, 3))


@pytest.mark.parametrize("make, match", [
    (lambda: SyncSchedule(Topology.from_paper(4, 2, 2, 2), rounds=(2,)),
     "rounds .* run flat local SGD: not with a hierarchy"),
    (lambda: SyncSchedule(Topology.from_paper(4, 2), rounds=(2, 0)), r"rounds\[1\]"),
    (lambda: SyncSchedule(Topology.from_paper(4, 2), rounds=()), "a non-empty list"),
    (lambda: SyncSchedule(Topology.from_paper(4, 2), rounds=(2,), gossip=True), "not with gossip"),
    (lambda: qsr_rounds(lambda i: 0.1, alpha=0, base=2, updates=10), "QSR alpha=0"),
    (lambda: qsr_rounds(lambda i: 0.0, alpha=1.0, base=2, updates=10), r"lr\(0\) = 0.0"),
    (lambda: TrainConfig(qsr_alpha=-1.0), "qsr_alpha=-1.0: must be a number > 0"),
    (lambda: TrainConfig(world_size=4, block_size=2, block_steps=2, qsr_alpha=0.2),
     "qsr_alpha .* not with block_size=2"),
])
def test_bad_input_is_one_line(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_a_training_run_and_the_timing_model_read_the_same_rounds():
    from localsgd.timing.scheme import Scheme
    from localsgd.timing.simulate import simulate
    from localsgd.training.loop import engine_parts, lr_schedule, update_counts

    cfg = TrainConfig(dataset="synthetic", world_size=2, local_steps=2, local_batch=8,
                      epochs=8.0, lr=0.1, scale_lr=False, warmup_epochs=0.0,
                      decay_fractions=(0.5,), qsr_alpha=0.5)
    n = 320  # 20 updates an epoch, 160 in all; the lr drops tenfold at update 80
    spe, total = update_counts(cfg, n)
    lrs = lr_schedule(cfg, n)
    parts = engine_parts(cfg, n, 10)
    assert parts.schedule.rounds == qsr_rounds(lrs, 0.5, 2, total)
    # lr 0.1: (0.5 / 0.1)^2 = 25 updates a round; after the decay 2,500 (one round to the end)
    assert parts.schedule.rounds[:4] == (25, 25, 25, 25)
    ends = [t for t in range(1, total + 1) if parts.schedule.action(t).level == 0]
    assert ends == [25, 50, 75, 100]
    scheme = Scheme.from_train_config(cfg, spe, lr=lrs, updates=total)
    row = simulate([scheme], workers=2, steps=total, baseline=False).iloc[0]
    assert row["syncs_avg"] == len(ends)
    with pytest.raises(ValueError, match="qsr_alpha needs the run's learning-rate schedule"):
        Scheme.from_train_config(cfg, spe)
