"""Resume on any device (issue: GPU paper mode): after a load, every piece of state sits on the
engine's device, and a resumed run with outer momentum still ends bitwise equal on CPU.

This machine has no GPU, so "another device" is torch's ``meta`` device: the engine is told it
lives there and the checkpoint is loaded as `load_checkpoint` loads it (``map_location="cpu"``);
state copied into live tensors (model, optimizer) keeps the live tensors' device, and state kept
as loaded (the outer step's anchor and momentum buffer) must follow the engine's device.
"""

from __future__ import annotations

import dataclasses
import typing

import pandas as pd
import pytest
import torch

from localsgd import data, numerics
from localsgd.engines.common import set_cuda_rng_state, to_device
from localsgd.training.checkpoint import load_checkpoint
from localsgd.training.config import TrainConfig
from localsgd.training.loop import build_engine, train

TIMED = ("compute_seconds", "data_seconds", "wall_seconds")
# block (global) momentum: the outer step keeps an anchor and a momentum buffer between averages
HYBRID = TrainConfig(dataset="synthetic", model="resnet20", width=0.25, world_size=2,
                     local_batch=16, local_steps=2, epochs=2.0, lr=0.2, n_test=64,
                     momentum_scheme="hybrid", global_momentum=0.5)


@pytest.fixture(scope="module")
def synth():
    return data.synthetic_image_dataset(256, 64, num_classes=4, image_size=16, seed=0)


def _interrupted(cfg, synth, ckpt, at):
    def stop(t):
        if t == at:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, dataset=synth, progress=False, checkpoint_path=ckpt, on_step=stop)
    return load_checkpoint(ckpt, cfg)


@pytest.mark.parametrize("batched", [False, True])
def test_loaded_outer_state_follows_the_engine_device(synth, tmp_path, batched):
    cfg = dataclasses.replace(HYBRID, batched=batched)
    state = _interrupted(cfg, synth, tmp_path / "run.pt", at=5)  # mid-way between averages
    outer = state["engine"]["driver"]["outer"]
    assert outer["anchor"] is not None and outer["anchor"].device.type == "cpu"
    engine = build_engine(cfg, 256, 4)
    engine.device = torch.device("meta")  # stands in for cuda:N (no GPU here)
    engine.load_state_dict(state["engine"])
    loaded = engine.driver.outer
    assert loaded.anchor.device.type == "meta"
    assert loaded.buf is None or loaded.buf.device.type == "meta"
    # RNG states stay CPU byte tensors (torch requires them so for every generator)
    assert all(g.device.type == "cpu" for g in engine.generators)


def test_resumed_run_with_outer_momentum_is_bitwise_equal(synth, tmp_path):
    ref = train(HYBRID, dataset=synth, progress=False)
    ckpt = tmp_path / "run.pt"
    _interrupted(HYBRID, synth, ckpt, at=5)
    resumed = train(HYBRID, dataset=synth, progress=False, checkpoint_path=ckpt)
    cols = [c for c in ref.columns if c not in TIMED]
    assert ref.outer_steps.iloc[-1] >= 2  # the outer step acted before and after the resume
    pd.testing.assert_frame_equal(ref[cols], resumed[cols], check_exact=True)


def test_to_device_moves_nested_tensors_and_keeps_the_rest():
    state = {"t": 3, "outer": {"anchor": torch.ones(2), "buf": None, "lr": 1.0},
             "list": [torch.zeros(1), "x"]}
    moved = to_device(state, torch.device("meta"))
    assert moved["outer"]["anchor"].device.type == "meta" and moved["outer"]["buf"] is None
    assert moved["list"][0].device.type == "meta" and moved["list"][1] == "x" and moved["t"] == 3
    set_cuda_rng_state(torch.zeros(4, dtype=torch.uint8), torch.device("cpu"))  # no-op off CUDA


# -- numerics policy: TrainConfig.precision / deterministic, applied by train() and recorded


def test_precision_is_validated_and_applied_by_train(synth):
    with pytest.raises(ValueError, match="precision='fp16'"):
        dataclasses.replace(HYBRID, precision="fp16")
    with numerics.numerics_scope("tf32"):  # train() must switch TF32 back off for fp32
        rec = train(dataclasses.replace(HYBRID, epochs=1.0), dataset=synth, progress=False)
        assert torch.get_float32_matmul_precision() == "highest"
        assert torch.backends.cudnn.allow_tf32 is False
    assert set(rec.precision) == {"fp32"} and set(rec.deterministic) == {False}


def test_auto_precision_is_tf32_on_cuda_and_exactly_fp32_on_a_cpu(synth):
    assert TrainConfig().precision == "auto"
    assert numerics.resolve_precision("auto", "cuda:1") == "tf32"
    assert numerics.resolve_precision("auto", torch.device("cpu")) == "fp32"
    assert numerics.resolve_precision("bf16", "cuda") == "bf16"
    with pytest.raises(ValueError, match="fp16"):
        numerics.resolve_precision("fp16", "cpu")
    cfg = dataclasses.replace(HYBRID, epochs=1.0)
    auto = train(dataclasses.replace(cfg, precision="auto"), dataset=synth, progress=False)
    fp32 = train(dataclasses.replace(cfg, precision="fp32"), dataset=synth, progress=False)
    assert set(auto.precision) == {"fp32"}  # the column holds what ran
    assert auto.train_loss.tolist() == fp32.train_loss.tolist()  # bitwise, on a CPU


def test_auto_batched_is_the_batched_engine_for_replicas_on_cuda_only(synth):
    from localsgd.training.plan import use_batched
    from localsgd.training.runner_args import _field_parser

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    cfg = TrainConfig(world_size=4)
    assert cfg.batched == "auto" and use_batched(cfg, cuda) is True
    assert not use_batched(cfg, cpu) and not use_batched(cfg, cuda, replicas=False)
    assert not use_batched(dataclasses.replace(cfg, world_size=1), cuda)
    assert use_batched(dataclasses.replace(cfg, batched=True), cpu) is True
    assert use_batched(dataclasses.replace(cfg, batched=False), cuda) is False
    with pytest.raises(ValueError, match="true, false or 'auto'"):
        TrainConfig(batched="maybe")
    assert TrainConfig.from_dict({"batched": "auto"}).batched == "auto"
    with pytest.raises(ValueError, match="true, false or 'auto'"):
        TrainConfig.from_dict({"batched": "yes please"})
    parse = _field_parser(typing.get_type_hints(TrainConfig)["batched"])
    assert (parse("auto"), parse("true"), parse("off")) == ("auto", True, False)
    rec = train(dataclasses.replace(HYBRID, epochs=1.0), dataset=synth, progress=False)
    assert set(rec.batched) == {False}  # what ran on this CPU


def test_bf16_autocast_changes_the_arithmetic_and_still_trains(synth):
    cfg = dataclasses.replace(HYBRID, epochs=1.0)
    fp32 = train(cfg, dataset=synth, progress=False)
    with numerics.numerics_scope():
        bf16 = train(dataclasses.replace(cfg, precision="bf16"), dataset=synth, progress=False)
    a, b = fp32.train_loss.iloc[-1], bf16.train_loss.iloc[-1]
    assert a != b and abs(a - b) / a < 0.2  # bfloat16 rounding, not a different computation


def test_numerics_flags_in_figure_provenance():
    from localsgd.paper import results

    info = results.device_info()
    assert "float32_matmul_precision" in info["numerics"]


# -- honest timing: the engines' compute seconds come from one PhaseClock per update


def test_phase_clock_on_cpu_sums_wall_time_per_worker():
    import time

    from localsgd.engines.common import PhaseClock

    clock = PhaseClock(torch.device("cpu"))
    assert not clock.events
    spans = [[], []]
    for worker, pause in enumerate((0.02, 0.06)):
        t0 = clock.mark()
        time.sleep(pause)
        spans[worker].append((t0, clock.mark()))
    a, b = clock.seconds(spans)
    assert 0.02 <= a < b and b >= 0.06


def test_phase_clock_on_cuda_records_events_and_waits_once(monkeypatch):
    # CUDA mocked: marks are events recorded on the stream, read with one synchronize
    from localsgd.engines import common

    made, waits = [], []

    class FakeEvent:
        def __init__(self, enable_timing):
            assert enable_timing
            self.at = len(made)
            made.append(self)

        def record(self):
            pass

        def query(self):  # the GPU is still busy: reading the times must wait
            return False

        def synchronize(self):
            waits.append(self)

        def elapsed_time(self, end):  # milliseconds, as CUDA reports
            return 10.0 * (end.at - self.at)

    monkeypatch.setattr(common.torch.cuda, "Event", FakeEvent)
    clock = common.PhaseClock(torch.device("cuda", 0))
    assert clock.events
    spans = [[(clock.mark(), clock.mark())], [(clock.mark(), clock.mark()),
                                              (clock.mark(), clock.mark())]]
    assert clock.seconds(spans) == pytest.approx([0.01, 0.02])
    assert len(waits) == 1 and waits[0] is made[-1]


def test_replicas_that_do_not_fit_stop_before_training_with_the_largest_k():
    from localsgd.training.plan import check_replica_memory

    cfg = TrainConfig(model="resnet20", width=0.25, world_size=8, local_batch=32, batched=True)
    shape = (3, 32, 32)
    check_replica_memory(cfg, 10, shape, free_bytes=64 << 30, batched=True)  # plenty: no error
    with pytest.raises(ValueError, match=r"8 batched replicas of resnet20 .* at most (\d) fit"):
        check_replica_memory(cfg, 10, shape, free_bytes=(1 << 30) + (40 << 20),
                             reserve_bytes=1 << 30, batched=True)
    # sequential replicas keep one replica's activations: more of them fit in the same memory
    from localsgd import memory
    from localsgd.models import build_model

    def fn():
        return build_model("resnet20", num_classes=10, width=0.25)

    budget = 40 << 20
    assert memory.max_replicas(fn, 32, shape, budget, batched=False) > \
        memory.max_replicas(fn, 32, shape, budget, batched=True)


def test_a_cached_run_cut_off_mid_way_resumes_from_its_last_epoch(synth, tmp_path, monkeypatch,
                                                                  capsys):
    # `grid.run_cached` checkpoints every epoch beside the cache entry: a run killed mid-way (no
    # Ctrl-C, so no checkpoint of its own) goes on from its last epoch and ends bitwise equal
    from localsgd.paper.experiments import grid

    monkeypatch.setenv("LOCALSGD_CACHE", str(tmp_path / "cache"))
    cfg = dataclasses.replace(HYBRID, epochs=3.0)  # 8 updates an epoch
    ref = train(cfg, dataset=synth, progress=False)
    kill_at = [12]  # mid-way through the second epoch

    def killed(t):
        if t in kill_at:
            raise RuntimeError("killed")

    monkeypatch.setattr(grid, "train", lambda c, **kw: train(c, dataset=synth, on_step=killed,
                                                             **kw))
    with pytest.raises(RuntimeError, match="killed"):
        grid.run_cached(cfg, progress=False)
    assert grid.checkpoint_path(cfg).is_file() and not grid.is_cached(cfg)
    kill_at.clear()
    capsys.readouterr()
    resumed = grid.run_cached(cfg, progress=False)
    assert "resumed from update 8 of 24" in capsys.readouterr().out
    cols = [c for c in ref.columns if c not in TIMED]
    pd.testing.assert_frame_equal(ref[cols], resumed[cols], check_exact=True)
    assert grid.is_cached(cfg) and not grid.checkpoint_path(cfg).exists()
    # refresh trains from the start: it drops a checkpoint unread
    grid.checkpoint_path(cfg).write_bytes(b"not a checkpoint")
    again = grid.run_cached(cfg, progress=False, refresh=True)
    assert not grid.checkpoint_path(cfg).exists()
    pd.testing.assert_frame_equal(ref[cols], again[cols], check_exact=True)
    # a garbled checkpoint is not trusted: one line, then the run from the start
    other = dataclasses.replace(cfg, seed=1)
    grid.checkpoint_path(other).write_bytes(b"not a checkpoint")
    grid.run_cached(other, progress=False)
    assert "is corrupt or not a localsgd checkpoint" in capsys.readouterr().out
    assert grid.is_cached(other) and not grid.checkpoint_path(other).exists()


def test_a_cached_run_failing_after_a_resume_names_its_checkpoint(tmp_path, monkeypatch):
    # an error of the run itself propagates (no silent restart), naming the file it resumed
    from localsgd.paper.experiments import grid

    monkeypatch.setenv("LOCALSGD_CACHE", str(tmp_path / "cache"))

    def broken(c, **kw):
        raise ValueError("no such model")

    monkeypatch.setattr(grid, "train", broken)
    with pytest.raises(ValueError, match="no such model") as fresh:
        grid.run_cached(HYBRID, progress=False)
    assert not getattr(fresh.value, "__notes__", None)  # nothing was resumed
    ckpt = grid.checkpoint_path(HYBRID)
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    ckpt.write_bytes(b"a checkpoint")
    with pytest.raises(ValueError, match="no such model") as resumed:
        grid.run_cached(HYBRID, progress=False)
    note = f"(the run resumed from {ckpt}; delete it to train from the start)"
    assert resumed.value.__notes__ == [note]
    assert ckpt.is_file()  # kept: the error was not the checkpoint's


def test_a_dry_run_never_checkpoints(synth, tmp_path, monkeypatch):
    from localsgd.paper import dry_run
    from localsgd.paper.experiments import grid

    monkeypatch.setenv("LOCALSGD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(dry_run.ENV, "3")
    seen = {}

    def spy(c, **kw):
        seen.update(kw)
        return train(c, dataset=synth, **kw)

    monkeypatch.setattr(grid, "train", spy)
    grid.run_cached(HYBRID, progress=False)
    assert seen["checkpoint_path"] is None and seen["checkpoint_every"] == 0
    assert not list((tmp_path / "cache").rglob("*.ckpt.pt"))
