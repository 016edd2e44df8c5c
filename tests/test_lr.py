"""Learning-rate schedules of App. C and Sec. 4 against hand-computed values."""

import pytest
import torch

from localsgd.lr import (
    LRSchedule,
    gradual_warmup,
    milestones_from_epochs,
    milestones_from_fractions,
    scaled_lr,
    step_decay,
    warmup_iterations,
)


def test_linear_scaling():
    assert scaled_lr(0.1, 16) == pytest.approx(1.6)
    # ImageNet: 0.1 per 256 samples, K = 16 GPUs with B_loc = 128
    assert scaled_lr(0.1, global_batch=16 * 128, base_batch=256) == pytest.approx(0.8)
    with pytest.raises(ValueError, match="exactly one of world_size or global_batch .* got "
                                         "world_size=4, global_batch=64"):
        scaled_lr(0.1, 4, global_batch=64, base_batch=32)


def test_gradual_warmup_increment():
    # App. C: increment (K gamma - gamma) / (5N / (K B_loc)) per iteration
    n, k, b = 50_000, 16, 128
    iters = warmup_iterations(n, k, b)
    assert iters == 123  # ceil(5 * 50000 / 2048) = ceil(122.07)
    gamma, target = 0.1, 1.6
    assert gradual_warmup(0, gamma, target, iters) == pytest.approx(0.1)
    assert gradual_warmup(1, gamma, target, iters) - gradual_warmup(0, gamma, target, iters) == \
        pytest.approx(1.5 / 123)
    assert gradual_warmup(10, 0.1, 1.6, 10) == pytest.approx(1.6)
    assert gradual_warmup(5, 0.1, 1.6, 10) == pytest.approx(0.85)
    assert gradual_warmup(500, 0.1, 1.6, 10) == pytest.approx(1.6)


def test_step_decay_fractions_and_epochs():
    ms = milestones_from_fractions(1000)
    assert ms == [500, 750]
    assert step_decay(499, 0.1, ms) == pytest.approx(0.1)
    assert step_decay(500, 0.1, ms) == pytest.approx(0.01)
    assert step_decay(750, 0.1, ms) == pytest.approx(0.001)
    assert milestones_from_epochs([30, 60, 80], 100) == [3000, 6000, 8000]
    with pytest.raises(ValueError, match=r"fractions must be in \(0, 1\), got 1.5"):
        milestones_from_fractions(10, [1.5])


def test_paper_schedule_and_lambda_lr():
    sched = LRSchedule.paper(0.1, world_size=4, iters_per_epoch=10, warmup_epochs=1,
                             decay_epochs=[3, 5])
    assert [sched(i) for i in (0, 5, 10, 29, 30, 50)] == pytest.approx(
        [0.1, 0.25, 0.4, 0.4, 0.04, 0.004])
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.4)
    lam = torch.optim.lr_scheduler.LambdaLR(opt, sched.multiplier(0.4))
    seen = []
    for _ in range(35):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        lam.step()
    assert seen == pytest.approx([sched(i) for i in range(35)])


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"peak_lr": 0.0}, r"peak_lr must be > 0, got 0.0"),
    ({"peak_lr": 1.0, "start_lr": -0.1, "warmup_iters": 5}, r"start_lr must be > 0 .* got -0.1"),
    ({"peak_lr": 1.0, "factor": 0.0}, r"decay factor must be in \(0, 1\], got 0.0"),
    ({"peak_lr": 1.0, "milestones": (5, -1)}, r"milestones must be iterations >= 0"),
])
def test_lr_schedule_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LRSchedule(**kwargs)
