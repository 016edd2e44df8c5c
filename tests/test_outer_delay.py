"""The one-step-delayed outer step (`OuterUpdate(delay=1)`, `TrainConfig.outer_delay`): the
rule against a hand recursion on a quadratic (and a planted on-time step failing it), the
state through a checkpoint, a training run resumed bitwise, and bad input. DDP against the
replicas: tests/test_ddp.py's ``delayed_outer``."""

from __future__ import annotations

import pytest
import torch
from test_compression import _records  # the tiny run's records, timings dropped

from localsgd.outer import OuterUpdate
from localsgd.schedule import SyncDriver, SyncSchedule
from localsgd.topology import Topology
from localsgd.training.config import TrainConfig

K, H, ROUNDS, LR = 3, 2, 5, 0.1
TARGETS = torch.tensor([[1.0, -2.0], [3.0, 0.5], [-1.0, 4.0]], dtype=torch.float64)


class StackComm:
    """K workers' flat parameters as the rows of one tensor; exact averages."""

    def __init__(self, x):
        self.x, self.world_size = x, x.shape[0]

    def average(self, level, absent=()):
        self.x.copy_(self.x.mean(0, keepdim=True).expand_as(self.x))

    def allreduce_grads(self, level):
        raise AssertionError("no gradient all-reduce in local SGD")

    def gossip(self, step):
        raise AssertionError("no gossip")

    def flat_params(self):
        return self.x


def _local_round(x):
    """H gradient steps of f_k(x) = |x - target_k|^2 / 2 per worker."""
    for _ in range(H):
        x = x - LR * (x - TARGETS)
    return x


def _driven(delay, momentum=0.5, nesterov=True):
    """The averaged model after each round, as `SyncDriver` and `OuterUpdate` compute it."""
    comm = StackComm(torch.zeros(K, 2, dtype=torch.float64))
    outer = OuterUpdate(momentum=momentum, lr=0.7, nesterov=nesterov, delay=delay)
    driver = SyncDriver(SyncSchedule(Topology.from_paper(K, H), outer_period="global"), comm,
                        outer)
    out = []
    for _ in range(ROUNDS):
        for _ in range(H):
            driver.before_step()
            comm.x.sub_(LR * (comm.x - TARGETS))
            driver.after_step(LR)
        out.append(comm.x[0].clone())
        assert torch.equal(comm.x, comm.x[:1].expand_as(comm.x))  # every worker starts equal
    return out


def _by_hand(momentum=0.5, nesterov=True):
    """The stated rule: round r's change d_r = w_{r-1} - mean_k x_k is applied at round r + 1's
    end, w_r = w_{r-1} - alpha * gamma * (Nesterov direction of u = beta u + d_{r-1} / gamma),
    w_1 = w_0."""
    w, u, pending, out = torch.zeros(2, dtype=torch.float64), torch.zeros(2,
                                                                         dtype=torch.float64), None, []
    for _ in range(ROUNDS):
        d = w - _local_round(w.expand(K, 2)).mean(0)
        if pending is not None:
            g = pending / LR
            u = momentum * u + g
            w = w - 0.7 * LR * (g + momentum * u if nesterov else u)
        pending = d
        out.append(w.clone())
    return out


def test_the_delayed_step_applies_the_previous_round_and_an_on_time_step_fails_it():
    want = _by_hand()
    assert torch.equal(want[0], torch.zeros(2, dtype=torch.float64))  # round 1: nothing arrived
    for got, ref in zip(_driven(delay=1), want, strict=True):
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-14)
    on_time = _driven(delay=0)  # the planted defect: the step applies this round's change
    assert not torch.allclose(on_time[1], want[1], atol=1e-6)
    heavy = _driven(delay=1, nesterov=False)
    for got, ref in zip(heavy, _by_hand(nesterov=False), strict=True):
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-14)


def test_the_pending_change_survives_a_state_dict_and_a_reset_drops_it():
    a = OuterUpdate(momentum=0.9, lr=0.7, nesterov=True, scale_by_lr=False, delay=1)
    x = torch.zeros(4)
    a.reset(x)
    x += 1.0
    a.step(x)
    assert torch.equal(x, torch.zeros(4)) and a.num_steps == 0  # sent, not applied
    b = OuterUpdate(momentum=0.9, lr=0.7, nesterov=True, scale_by_lr=False, delay=1)
    b.load_state_dict(a.state_dict())
    y = x.clone() + 2.0
    a.step(x.add_(2.0))
    b.step(y)
    assert torch.equal(x, y) and a.num_steps == b.num_steps == 1
    assert not torch.equal(x, torch.zeros(4))
    a.reset(x)
    assert a.pending is None
    old = {k: v for k, v in a.state_dict().items() if k not in ("delay", "pending")}
    OuterUpdate(momentum=0.9, lr=0.7, nesterov=True, scale_by_lr=False).load_state_dict(old)
    with pytest.raises(ValueError, match="delay=1"):
        OuterUpdate(momentum=0.9, lr=0.7, nesterov=True, scale_by_lr=False).load_state_dict(
            a.state_dict())


def _tiny(**over):
    return TrainConfig(**{"dataset": "synthetic", "model": "resnet20", "width": 0.25,
                          "n_train": 64, "n_test": 16, "local_batch": 8, "local_steps": 2,
                          "world_size": 2, "epochs": 3.0, "lr": 0.05, "eval_batch": 16,
                          "augment": False, "dtype": "float64", "batched": False,
                          "momentum_scheme": "global", "global_lr": 0.7,
                          "global_nesterov": True, "outer_delay": 1, **over})


def test_a_delayed_run_resumes_bitwise_and_differs_from_the_on_time_one(tmp_path):
    from localsgd.training.loop import RunLimit

    cfg = _tiny()
    whole = _records(cfg)
    ckpt = tmp_path / "run.pt"
    # cut after update 8 of 12 (epoch 2's end): round 4's change is in flight in the checkpoint
    _records(cfg, checkpoint_path=ckpt, checkpoint_every_steps=4, limit=RunLimit(updates=8))
    assert _records(cfg, checkpoint_path=ckpt).equals(whole)
    on_time = _records(_tiny(outer_delay=0))
    assert not on_time["train_loss"].equals(whole["train_loss"])


@pytest.mark.parametrize(("over", "match"), [
    ({"outer_delay": 2}, "outer delay must be 0"),
    ({"outer_delay": True}, "outer delay must be 0"),
    ({"momentum_scheme": "local"}, "has none"),
    ({"momentum_scheme": "global", "fragments": 2, "local_steps": 4}, "overlap_steps"),
])
def test_bad_delays_are_one_line(over, match):
    with pytest.raises(ValueError, match=match):
        _tiny(**over)
    TrainConfig(momentum_scheme="local", slowmo_frequency=4, outer_delay=1)  # SlowMo's step
