"""The path from `TrainConfig` to the engine, checked by value (issue 31, item 1): other tests
compare engines with each other, which a defect they share passes. Each test here fails on a
defect planted where the comment says (checked by planting it)."""

import copy
import dataclasses

import pytest
import torch
from torch import nn

from localsgd import data
from localsgd.training.batch_sources import MemoryBatches
from localsgd.training.config import TrainConfig
from localsgd.training.loop import build_engine

BASE = TrainConfig(dataset="synthetic", model="resnet20", width=0.25, world_size=4,
                   local_batch=4, local_steps=2, epochs=1.0, lr=0.1, momentum=0.9,
                   weight_decay=5e-4, device="cpu", batched=False)
SCHEMES = {  # name -> (config fields, inner momentum, outer (momentum, lr) or None)
    "local": ({}, 0.9, None),
    "none": ({"momentum_scheme": "none"}, 0.0, None),
    "global": ({"momentum_scheme": "global"}, 0.0, (0.9, 1.0)),
    "hybrid": ({"momentum_scheme": "hybrid", "global_momentum": 0.3}, 0.9, (0.3, 1.0)),
    "slowmo": ({"slowmo_frequency": 4, "slowmo_momentum": 0.6, "slowmo_lr": 0.8}, 0.9,
               (0.6, 0.8)),
    "nesterov": ({"nesterov": True}, 0.9, None),
}


def _bn_param_ids(model: nn.Module) -> set[int]:
    return {id(p) for m in model.modules() if isinstance(m, nn.BatchNorm2d)
            for p in m.parameters(recurse=False)}


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_inner_and_outer_optimizers_field_by_field(name):
    fields, inner_m, outer = SCHEMES[name]
    cfg = dataclasses.replace(BASE, **fields)
    engine = build_engine(cfg, n_train=64, num_classes=10)
    for model, opt in zip(engine.models, engine.optimizers, strict=True):
        assert isinstance(opt, torch.optim.SGD)
        decay, no_decay = opt.param_groups  # hybrid losing its local momentum fails here
        bn = _bn_param_ids(model)
        assert {id(p) for p in no_decay["params"]} == bn  # BatchNorm: no weight decay (§4.1)
        assert not bn & {id(p) for p in decay["params"]}
        assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
        assert (decay["weight_decay"], no_decay["weight_decay"]) == (cfg.weight_decay, 0.0)
        for group in opt.param_groups:
            assert group["momentum"] == inner_m and group["dampening"] == 0.0
            assert group["nesterov"] is (name == "nesterov")
            assert group["lr"] == pytest.approx(cfg.lr)
    got = engine.driver.outer
    if outer is None:
        assert got is None
    else:
        assert (got.momentum, got.lr) == pytest.approx(outer)


def test_each_worker_reads_its_own_disjoint_part_of_the_epoch():
    k, b, n = 4, 3, 50
    ds = data.synthetic_image_dataset(n, 8, num_classes=n, image_size=8, seed=0)
    ds = dataclasses.replace(ds, train_y=torch.arange(n))  # a label is the sample's index
    source = MemoryBatches(ds, dataclasses.replace(BASE, world_size=k, local_batch=b,
                                                   augment=False), torch.device("cpu"))
    gens = [torch.Generator().manual_seed(r) for r in range(k)]
    for epoch in (0, 1):
        parts = data.partition(n, k, epoch, seed=0)
        seen = [[] for _ in range(k)]
        for pos in range(parts.shape[1] // b):
            for w, (_, y) in enumerate(source.batches(parts, epoch, pos, list(range(k)), gens, b)):
                seen[w] += y.tolist()
        for w in range(k):  # worker w reads its own row (every worker reading row 0 fails)
            assert seen[w] == parts[w, :len(seen[w])].tolist()
        flat = [i for s in seen for i in s]
        assert len(flat) == len(set(flat)) == k * b * (parts.shape[1] // b)  # disjoint
    assert data.partition(n, k, 0, 0).tolist() != data.partition(n, k, 1, 0).tolist()


def test_block_and_global_averages_by_value():
    # K = 4 in blocks of 2, H = 1, H^b = 2: update 1 averages inside blocks, update 2 globally
    cfg = dataclasses.replace(BASE, local_steps=1, block_size=2, block_steps=2, momentum=0.0,
                              weight_decay=0.0)
    averaging = build_engine(cfg, n_train=64, num_classes=10)
    local = build_engine(dataclasses.replace(cfg, local_steps=1000, block_size=None,
                                             block_steps=1), n_train=64, num_classes=10)
    g = torch.Generator().manual_seed(0)
    loss = nn.functional.cross_entropy
    for t in (1, 2):
        batches = [(torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g))
                   for _ in range(4)]
        before = local.comm.packed().clone() if t == 1 else averaging.comm.packed().clone()
        if t == 2:  # the local step of update 2 from the block-averaged models
            local.comm.flat.copy_(averaging.comm.flat)
            for m_local, m_avg in zip(local.models, averaging.models, strict=True):
                m_local.load_state_dict(copy.deepcopy(m_avg.state_dict()))
        local.step(batches, loss)
        averaging.step(batches, loss)
        stepped = local.comm.packed()
        got = averaging.comm.packed()
        if t == 1:  # block means (a block average divided by K instead of 2 fails here)
            want = torch.cat([stepped[:2].mean(0, keepdim=True).expand(2, -1),
                              stepped[2:].mean(0, keepdim=True).expand(2, -1)])
        else:
            want = stepped.mean(0, keepdim=True).expand(4, -1)
        assert before.shape == got.shape
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def _hand_written(cfg: TrainConfig, inner_m: float, outer: tuple[float, float] | None,
                  outer_every: int | None, batches: list) -> list[nn.Module]:
    """The scheme written out with plain torch (none of the package's engine, schedule or outer
    code): K copies of one model, SGD with the inner momentum (BatchNorm without weight decay),
    a global average every H updates, then the outer step of App. D.1.2 on the average every
    ``outer_every`` updates: d = (anchor - mean) / gamma, u = beta u + d,
    anchor -= alpha gamma u, every worker = anchor."""
    from localsgd.models import build_model

    torch.manual_seed(cfg.seed)
    template = build_model(cfg.model, num_classes=10, width=cfg.width).to(torch.float64)
    models = [copy.deepcopy(template) for _ in range(cfg.world_size)]
    opts = []
    for m in models:
        bn = _bn_param_ids(m)
        opts.append(torch.optim.SGD(
            [{"params": [p for p in m.parameters() if id(p) not in bn],
              "weight_decay": cfg.weight_decay},
             {"params": [p for p in m.parameters() if id(p) in bn], "weight_decay": 0.0}],
            lr=cfg.lr, momentum=inner_m, nesterov=cfg.nesterov))
    gamma = cfg.lr
    anchor = [p.detach().clone() for p in models[0].parameters()]
    u = [torch.zeros_like(p) for p in anchor]
    for t, batch in enumerate(batches, start=1):
        for m, opt, (x, y) in zip(models, opts, batch, strict=True):
            m.train()
            opt.zero_grad()
            nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
        if t % cfg.local_steps:
            continue
        with torch.no_grad():
            for same in zip(*(m.parameters() for m in models), strict=True):
                mean = torch.stack([p for p in same]).mean(0)
                for p in same:
                    p.copy_(mean)
            if outer is not None and t % outer_every == 0:
                beta, alpha = outer
                for j, p0 in enumerate(models[0].parameters()):
                    d = (anchor[j] - p0) / gamma
                    u[j].mul_(beta).add_(d)
                    anchor[j].sub_(alpha * gamma * u[j])
                for m in models:
                    for j, p in enumerate(m.parameters()):
                        p.copy_(anchor[j])
    return models


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_four_updates_equal_a_hand_written_loop(name):
    # issue 31, item 1: each momentum scheme through build_engine against plain torch, by value
    fields, inner_m, outer = SCHEMES[name]
    cfg = dataclasses.replace(BASE, **fields, dtype="float64", decay_fractions=(), width=0.25)
    outer_every = cfg.slowmo_frequency or cfg.local_steps  # global/hybrid: at every average
    engine = build_engine(cfg, n_train=64, num_classes=10)
    g = torch.Generator().manual_seed(1)
    batches = [[(torch.randn(4, 3, 16, 16, generator=g, dtype=torch.float64),
                 torch.randint(0, 10, (4,), generator=g)) for _ in range(cfg.world_size)]
               for _ in range(4)]
    for batch in batches:
        engine.step(batch, nn.functional.cross_entropy)
    want = _hand_written(cfg, inner_m, outer, outer_every, batches)
    for got_model, want_model in zip(engine.models, want, strict=True):
        for (n, p), q in zip(got_model.named_parameters(), want_model.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-12, msg=f"{name}: {n}")
