"""The torch.distributed averagers against torch's own, on 4 gloo processes (one spawn)."""

from collections import OrderedDict

import pytest
import torch
import torch.distributed as dist
from torch import nn

from localsgd.averaging import HierarchicalAverager, PeriodicAverager
from localsgd.collectives import FlatBuffer, _adoptable, contiguous_blocks
from localsgd.distributed import spawn


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 4 * 4, 3))


def _train(model, opt, averager, rank, steps, average=None):
    g = torch.Generator().manual_seed(100 + rank)  # different data on every rank
    for _ in range(steps):
        x = torch.randn(5, 3, 6, 6, generator=g)
        y = torch.randint(0, 3, (5,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if average is not None:
            average(model)


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def _gathered_mean(t: torch.Tensor, group=None) -> torch.Tensor:
    out = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, t.contiguous(), group=group)
    return torch.stack(out).mean(0)


def _raises(fn, match: str) -> str:
    try:
        fn()
    except ValueError as e:
        assert match in str(e), str(e)
        return str(e)
    raise AssertionError(f"expected ValueError matching {match!r}")


def _checks(rank: int, world: int) -> dict:
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.algorithms.model_averaging.hierarchical_model_averager import (
        HierarchicalModelAverager,
    )
    from torch.distributed.optim import PostLocalSGDOptimizer

    from localsgd.schedule import SyncSchedule
    from localsgd.topology import Topology

    out = {}

    # 1. Periodic: same models, data and steps as torch's PeriodicModelAverager -> equal params.
    runs = {}
    for name, make in [("torch", lambda: PeriodicModelAverager(period=2, warmup_steps=3)),
                       ("ours", lambda: PeriodicAverager(period=2, warmup_steps=3))]:
        m = _net()
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        av = make()
        _train(m, opt, av, rank, 9, lambda mod, av=av: av.average_parameters(mod.parameters()))
        runs[name] = _params(m)
    out["periodic_maxdiff"] = max((a - b).abs().max().item()
                                  for a, b in zip(runs["torch"], runs["ours"], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(runs["torch"], runs["ours"], strict=True))

    # 2. Hierarchical (torch's class runs on gloo: it passes group_size to new_subgroups), ours
    #    with the same dict, and ours driven by SyncSchedule(torch_compat="hierarchical").
    hier = OrderedDict([(2, 2), (4, 4)])
    topo = Topology.from_periods(hier)
    makers = {
        "torch": lambda: HierarchicalModelAverager(hier, warmup_steps=1),
        "ours": lambda: HierarchicalAverager(hier, warmup_steps=1),
        "schedule": lambda: HierarchicalAverager.from_schedule(
            SyncSchedule(topo, warmup_steps=1, torch_compat="hierarchical")),
    }
    runs = {}
    for name, make in makers.items():
        m = _net()
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        av = make()
        _train(m, opt, av, rank, 11, lambda mod, av=av: av.average_parameters(mod.parameters()))
        runs[name] = _params(m)
    for name in ("ours", "schedule"):
        assert all(torch.equal(a, b) for a, b in zip(runs["torch"], runs[name], strict=True)), name
    # ... and the block level really mixed only within blocks: after step 11 (s=10, period 2)
    # ranks {0,1} agree and {2,3} agree, but the blocks differ.
    w = runs["ours"][0]
    blocks = [torch.stack(_all(w)[i:i + 2]) for i in (0, 2)]
    assert torch.equal(blocks[0][0], blocks[0][1]) and torch.equal(blocks[1][0], blocks[1][1])
    assert not torch.equal(blocks[0][0], blocks[1][0])

    # 3. Our averager inside torch's PostLocalSGDOptimizer (param_groups input, state_dict step).
    runs = {}
    for name, av_cls in [("torch", PeriodicModelAverager), ("ours", PeriodicAverager)]:
        m = _net()
        opt = PostLocalSGDOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                    av_cls(period=3, warmup_steps=2))
        _train(m, opt, None, rank, 8)
        runs[name] = _params(m)
        assert opt.state_dict()["step"] == 8
    assert all(torch.equal(a, b) for a, b in zip(runs["torch"], runs["ours"], strict=True))

    # 4. Identity, pointers and channels_last survive averaging; values are the true mean.
    m = _net().to(memory_format=torch.channels_last)
    conv_w = m[0].weight
    assert conv_w.is_contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    av = PeriodicAverager(period=1)
    ids = [id(p) for p in m.parameters()]
    _train(m, opt, av, rank, 1)
    expected = [_gathered_mean(p.detach()) for p in m.parameters()]
    av.average_parameters(m.parameters())  # first call adopts the parameters
    ptrs = [p.data_ptr() for p in m.parameters()]
    for p, e in zip(m.parameters(), expected, strict=True):
        assert torch.allclose(p, e, atol=1e-6)
    _train(m, opt, av, rank, 3, lambda mod: av.average_parameters(mod.parameters()))
    assert [id(p) for p in m.parameters()] == ids
    assert [p.data_ptr() for p in m.parameters()] == ptrs
    assert m[0].weight is conv_w and conv_w.is_contiguous(memory_format=torch.channels_last)
    assert all(torch.equal(a, b) for a, b in zip(_all(conv_w)[1:], _all(conv_w)[:-1],
                                                   strict=True))
    # A rebound parameter (what module.to() / load_state_dict(assign=True) do) is re-adopted.
    conv_w.data = conv_w.data.clone() + rank
    expected = _gathered_mean(conv_w.detach())
    av.average_parameters(m.parameters())
    assert torch.allclose(conv_w, expected, atol=1e-6) and conv_w.data_ptr() == ptrs[0]

    # 5. BatchNorm running stats averaged on request only; momentum buffers too.
    for average_buffers in (False, True):
        m = _net()
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        av = PeriodicAverager(period=1, module=m, average_buffers=average_buffers,
                              optimizer=opt if average_buffers else None)
        _train(m, opt, av, rank, 2)
        rm = m[1].running_mean.clone()
        mom = opt.state[m[0].weight]["momentum_buffer"].clone()
        av.average_parameters(m.parameters())
        if average_buffers:
            assert torch.allclose(m[1].running_mean, _gathered_mean(rm), atol=1e-6)
            assert torch.allclose(opt.state[m[0].weight]["momentum_buffer"], _gathered_mean(mom),
                                  atol=1e-6)
            assert m[1].num_batches_tracked.item() == 2  # integer buffers are left alone
        else:
            assert torch.equal(m[1].running_mean, rm)
            assert torch.equal(opt.state[m[0].weight]["momentum_buffer"], mom)

    # 6. Ranks that disagree on the parameters fail loudly, on every rank.
    extra = [nn.Parameter(torch.zeros(2))] if rank == 0 else []
    out["count_error"] = _raises(
        lambda: PeriodicAverager(1).average_parameters(list(_net().parameters()) + extra),
        "ranks disagree")
    shape = (2, 3) if rank % 2 else (3, 2)  # same count and numel, different shapes
    out["shape_error"] = _raises(
        lambda: PeriodicAverager(1).average_parameters([nn.Parameter(torch.zeros(shape))]),
        "ranks disagree")
    return out


def _all(t: torch.Tensor) -> list[torch.Tensor]:
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t.detach().contiguous())
    return out


def test_averagers_match_torch_and_keep_identity():
    results = spawn(_checks, 4)
    assert results[0]["periodic_maxdiff"] == 0.0
    assert "rank 0: " in results[1]["count_error"] and "rank 1: " in results[1]["count_error"]
    assert "ranks disagree" in results[3]["shape_error"]


# -- single-process units ---------------------------------------------------------------------


def test_flat_buffer_adopts_views_and_keeps_channels_last():
    conv = torch.randn(8, 3, 3, 3).to(memory_format=torch.channels_last)
    ts = [conv, torch.randn(5), torch.randn(4, 6).t()]  # the transpose is dense too
    before = [t.clone() for t in ts]
    fb = FlatBuffer(ts)
    assert [torch.equal(a, b) for a, b in zip(ts, before, strict=True)] == [True] * 3
    assert ts[0].is_contiguous(memory_format=torch.channels_last)
    assert ts[2].stride() == before[2].stride()
    fb.flats[0].mul_(2)  # writes into the buffer are writes into the tensors
    assert all(torch.equal(a, 2 * b) for a, b in zip(ts, before, strict=True))


def test_flat_buffer_copies_what_it_cannot_adopt():
    base = torch.randn(6, 6)
    strided = base[:, ::2]  # not dense: cannot be a view of a flat slice
    assert not _adoptable(strided)
    fb = FlatBuffer([strided], adopt=True)
    assert strided.data_ptr() == base.data_ptr()
    fb.flats[0].fill_(3.0)
    fb.scatter([strided])
    assert torch.equal(base[:, ::2], torch.full((6, 3), 3.0))


def test_contiguous_blocks_validates():
    assert contiguous_blocks(4, 2) == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="divisor"):
        contiguous_blocks(6, 4)
