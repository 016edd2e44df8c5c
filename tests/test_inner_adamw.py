"""AdamW as the inner optimizer (`TrainConfig.optimizer`): built with decoupled weight decay off
the BatchNorm coefficients, the batched engine's stacked AdamW equal to K AdamWs, a run resumed
bitwise with its moments, and bad input. DDP against the replicas: tests/test_ddp.py."""

from __future__ import annotations

import pytest
import torch
from test_compression import _records  # the tiny run's records, timings dropped

from localsgd.training.config import TrainConfig


def _tiny(**over):
    # DiLoCo's shape: AdamW inside, an outer Nesterov step at every global average
    return TrainConfig(**{"dataset": "synthetic", "model": "resnet20", "width": 0.25,
                          "n_train": 64, "n_test": 16, "local_batch": 8, "local_steps": 2,
                          "world_size": 4, "epochs": 3.0, "lr": 1e-3, "eval_batch": 16,
                          "augment": False, "dtype": "float64", "batched": False,
                          "optimizer": "adamw", "weight_decay": 0.1, "adam_betas": (0.9, 0.95),
                          "momentum_scheme": "global", "global_lr": 0.7,
                          "global_nesterov": True, **over})


def test_the_inner_optimizer_is_adamw_with_decay_off_batchnorm():
    from localsgd.training.loop import engine_parts

    parts = engine_parts(_tiny(), 64, 10)
    model = parts.model_fn()
    opt = parts.optimizer_fn(list(model.parameters()))
    assert isinstance(opt, torch.optim.AdamW)
    decay, none = opt.param_groups
    assert decay["weight_decay"] == 0.1 and none["weight_decay"] == 0.0
    assert decay["betas"] == (0.9, 0.95) and all(p.dim() == 1 for p in none["params"])
    sgd = engine_parts(_tiny(optimizer="sgd", lr=0.1), 64, 10)
    assert isinstance(sgd.optimizer_fn(list(model.parameters())), torch.optim.SGD)


def test_a_run_resumes_bitwise_and_the_batched_engine_agrees(tmp_path):
    from localsgd.training.loop import RunLimit

    cfg = _tiny()
    whole = _records(cfg)
    ckpt = tmp_path / "run.pt"
    _records(cfg, checkpoint_path=ckpt, checkpoint_every_steps=2, limit=RunLimit(updates=4))
    assert _records(cfg, checkpoint_path=ckpt).equals(whole)  # the moments are in the checkpoint
    batched = _records(_tiny(batched=True, packed=False))
    for c in (c for c in whole.columns if c not in ("batched", "packed")):
        if whole[c].dtype.kind == "f":
            assert ((whole[c] - batched[c]).abs() <= 1e-9 * (1 + batched[c].abs())).all(), c
        else:
            assert whole[c].equals(batched[c]), c
    assert not _records(_tiny(optimizer="sgd", lr=0.1)).test_loss.equals(whole.test_loss)


@pytest.mark.parametrize("over, match", [
    ({"optimizer": "adam"}, "optimizer='adam'; valid: sgd, adamw"),
    ({"adam_betas": (0.9,)}, r"adam_betas=\(0.9,\): two numbers in \[0, 1\)"),
    ({"adam_betas": (0.9, 1.0)}, "adam_betas="),
    ({"nesterov": True}, "optimizer='adamw' is not run with nesterov=True"),
    ({"churn_rate": 0.2}, "an idle worker's Adam step count would move on"),
])
def test_bad_input_is_one_line(over, match):
    with pytest.raises(ValueError, match=match):
        _tiny(**over)
