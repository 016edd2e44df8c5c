"""The runtime consistency check (`TrainConfig.check_consistency`, `SyncDriver`): every worker
starts from the same parameters and holds the same after each world-wide average; a planted
skipped average and a worker started apart fail it, on the replica engine and under gloo."""

from __future__ import annotations

import pytest
import torch

from localsgd.distributed import spawn
from localsgd.schedule import ConsistencyError
from localsgd.training.config import TrainConfig


def _cfg(world: int = 4, **over) -> TrainConfig:
    # 64 images / 4 workers / B_loc 8 = 2 updates an epoch; blocks of 2 average every 2 updates,
    # the world every 4 (with the hybrid scheme's outer step)
    base = {"dataset": "synthetic", "model": "resnet20", "width": 0.25, "n_train": 64,
            "n_test": 16, "local_batch": 8, "local_steps": 2, "world_size": world,
            "block_size": 2, "block_steps": 2, "epochs": 2.0, "lr": 0.1, "eval_batch": 16,
            "augment": False, "momentum_scheme": "hybrid", "check_consistency": True,
            "batched": False}
    if world == 2:
        base.update(block_size=None, block_steps=1)
    return TrainConfig(**{**base, **over})


def _train(cfg: TrainConfig, kind: str = "replicas", plant: str | None = None):
    from localsgd import data
    from localsgd.training.loop import build_engine, train

    def make(c, n, classes):
        engine = build_engine(c, n, classes, kind=kind)
        comm = engine.comm
        if plant == "skip":  # the world-wide average does nothing (pytorch#74157's symptom)
            top, average = c.topology().top, comm.average
            comm.average = lambda level: None if level == top else average(level)
        elif plant == "apart":  # one worker's parameters differ before the first update
            with torch.no_grad():
                if kind == "ddp":
                    if torch.distributed.get_rank() == 1:
                        next(engine.model.parameters()).add_(1e-3)
                else:
                    next(engine.models[1].parameters()).add_(1e-3)
        return engine

    ds = data.load_image_dataset("synthetic").subset(64, 16, seed=0)
    return train(cfg, dataset=ds, progress=False, engine=make)


def test_the_replica_engine_checks_and_a_planted_fault_fails():
    rec = _train(_cfg(average_compression="int8"))  # hierarchy, outer step, codes: all pass
    assert len(rec) > 0
    with pytest.raises(ConsistencyError, match=r"^after the world-wide average of update 4: "
                                               r"workers 1, 2, 3 of 4 hold other parameters"):
        _train(_cfg(momentum_scheme="local"), plant="skip")  # (an outer step re-averages)
    with pytest.raises(ConsistencyError, match=r"^before the first update: worker 1 of 4 holds"):
        _train(_cfg(), plant="apart")
    # without the check the planted skip trains on, silently
    assert len(_train(_cfg(check_consistency=False, momentum_scheme="local"), plant="skip")
               ) == len(rec)


def _ddp(rank: int, world: int) -> dict:
    out = {}
    for plant in (None, "skip", "apart"):
        try:
            _train(_cfg(world=2, momentum_scheme="local"), kind="ddp", plant=plant)
            out[plant] = "passed"
        except ConsistencyError as err:
            out[plant] = str(err)
    return out


def test_under_gloo_every_rank_sees_the_same_verdict():
    ranks = spawn(_ddp, 2)
    assert ranks[0] == ranks[1]
    got = ranks[0]
    assert got[None] == "passed"
    assert got["skip"].startswith("after the world-wide average of update 2: worker 1 of 2")
    assert got["apart"].startswith("before the first update: worker 1 of 2 holds other")


def test_a_bad_setting_is_one_line():
    with pytest.raises(ValueError, match="check_consistency='yes': must be true or false"):
        TrainConfig(check_consistency="yes")
