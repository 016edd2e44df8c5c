"""Outer update: block momentum (App. D.1.2), SlowMo, Nesterov, state round trip."""

import pytest
import torch

from localsgd.outer import OuterUpdate, block_momentum, nesterov_outer, slowmo


def test_zero_momentum_unit_lr_is_plain_averaging():
    gen = torch.Generator().manual_seed(0)
    stack = torch.randn(4, 10, generator=gen, dtype=torch.float64)
    outer = block_momentum(0.0)
    outer.reset(stack[0:1].expand(4, 10))
    stack += 0.1 * torch.randn(4, 10, generator=gen, dtype=torch.float64)
    avg = stack.mean(0)
    stack.copy_(avg.expand_as(stack))  # global average first, as the schedule does
    outer.step(stack, lr=0.37)
    assert torch.allclose(stack, avg.expand_as(stack), atol=1e-12)


def test_block_momentum_two_rounds_by_hand():
    w = torch.tensor([1.0, 2.0], dtype=torch.float64)
    outer = block_momentum(0.9)
    outer.reset(w)
    w.copy_(torch.tensor([0.8, 2.2]))  # averaged model after round 1, gamma = 0.5
    outer.step(w, lr=0.5)
    # d = ([1, 2] - [0.8, 2.2]) / 0.5 = [0.4, -0.4]; u = d; w = [1, 2] - 0.5 u
    assert torch.allclose(w, torch.tensor([0.8, 2.2], dtype=torch.float64))
    w.copy_(torch.tensor([0.7, 2.0]))
    outer.step(w, lr=0.5)
    # d = [0.2, 0.4]; u = 0.9 [0.4, -0.4] + d = [0.56, 0.04]; w = [0.8, 2.2] - 0.5 u
    assert torch.allclose(w, torch.tensor([0.52, 2.18], dtype=torch.float64))
    assert torch.allclose(outer.buf, torch.tensor([0.56, 0.04], dtype=torch.float64))


def test_nesterov_outer_step_formula():
    w = torch.tensor([1.0], dtype=torch.float64)
    outer = nesterov_outer(lr=0.7, momentum=0.9)
    outer.reset(w)
    w.fill_(0.9)
    outer.step(w, lr=123.0)  # DiLoCo form ignores the inner lr
    # d = 0.1; u = 0.1; w = 1 - 0.7 (d + 0.9 u) = 0.867
    assert w.item() == pytest.approx(0.867)
    w.fill_(0.8)
    outer.step(w)
    # d = 0.067; u = 0.09 + 0.067 = 0.157; w = 0.867 - 0.7 (0.067 + 0.9 * 0.157)
    assert w.item() == pytest.approx(0.867 - 0.7 * (0.067 + 0.9 * 0.157))


def test_slowmo_matches_documented_update():
    """SlowMo: u <- beta u + (w_old - w_avg) / gamma; w_old <- w_old - alpha gamma u."""
    beta, alpha = 0.5, 1.3
    gen = torch.Generator().manual_seed(1)
    stack = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    stack.copy_(stack[0].expand_as(stack))
    outer = slowmo(beta, alpha)
    outer.reset(stack)
    ref_old, ref_u = stack[0].clone(), torch.zeros(5, dtype=torch.float64)
    for gamma in (0.1, 0.05, 0.2):
        stack += torch.randn(3, 5, generator=gen, dtype=torch.float64) * gamma
        stack.copy_(stack.mean(0).expand_as(stack))
        ref_u = beta * ref_u + (ref_old - stack[0]) / gamma
        ref_old = ref_old - alpha * gamma * ref_u
        outer.step(stack, lr=gamma)
        assert torch.allclose(stack, ref_old.expand(3, 5), atol=1e-12)


def test_state_dict_round_trip_continues_identically():
    a = OuterUpdate(momentum=0.7, lr=0.9)
    w = torch.ones(4)
    a.reset(w)
    w -= 0.1
    a.step(w, lr=0.1)
    b = OuterUpdate(momentum=0.7, lr=0.9)
    b.load_state_dict(a.state_dict())
    wa, wb = w.clone() - 0.05, w.clone() - 0.05
    a.step(wa, lr=0.1)
    b.step(wb, lr=0.1)
    assert torch.equal(wa, wb) and b.num_steps == 2
    with pytest.raises(ValueError, match="momentum=0.7 but this OuterUpdate has momentum=0.5"):
        OuterUpdate(momentum=0.5, lr=0.9).load_state_dict(a.state_dict())


def test_validation():
    with pytest.raises(ValueError, match=r"outer momentum must be in \[0, 1\), got 1.0"):
        OuterUpdate(momentum=1.0)
    with pytest.raises(ValueError, match="before reset"):
        OuterUpdate().step(torch.zeros(2), lr=0.1)
    outer = OuterUpdate()
    outer.reset(torch.zeros(3))
    with pytest.raises(ValueError, match="params have 2 entries per worker but the anchor .* 3"):
        outer.step(torch.zeros(2), lr=0.1)
    with pytest.raises(ValueError, match=r"inner lr gamma must be > 0"):
        outer.step(torch.zeros(3), lr=0.0)
