"""A run's plan (`localsgd.training.plan`): resolved once from the config and the machine, frozen,
read by the engine builder, the loop, resume and the runners, shown in checkpoints."""

import dataclasses

import pytest
import torch

from localsgd import data
from localsgd.device import DeviceError
from localsgd.training import plan as run_plan
from localsgd.training.checkpoint import load_checkpoint
from localsgd.training.config import TrainConfig
from localsgd.training.loop import build_engine, train

TINY = TrainConfig(dataset="synthetic", model="resnet20", width=0.25, world_size=2,
                   local_batch=4, local_steps=2, epochs=1.0, dtype="float32")


@pytest.fixture(scope="module")
def synth():
    return data.synthetic_image_dataset(16, 8, num_classes=4, image_size=8, seed=0)


def test_a_cpu_plan_runs_the_sequential_engine_over_host_threads():
    plan = run_plan.plan_run(dataclasses.replace(TINY, host_threads=2))
    assert (plan.device, plan.engine, plan.threads) == (torch.device("cpu"), "sequential", 2)
    assert plan.precision == "fp32" and plan.memory_format == "channels_last"  # one thread/op
    assert not plan.batched and not plan.packed and not plan.compile
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.engine = "batched"
    # a pack of runs is always the batched engine; a single worker leaves torch's threads alone
    assert run_plan.plan_run(TINY, "pack").engine == "batched"
    assert run_plan.plan_run(dataclasses.replace(TINY, world_size=1)).threads == 0
    assert run_plan.plan_run(TINY, "ddp").engine == "ddp"


def test_bad_plans_fail_in_one_line_before_any_data():
    with pytest.raises(ValueError, match="runner 'gpu'; valid"):
        run_plan.plan_run(TINY, "gpu")
    with pytest.raises(ValueError, match="the ddp engine runs one worker per process"):
        run_plan.plan_run(dataclasses.replace(TINY, batched=True), "ddp")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError):
            train(dataclasses.replace(TINY, device="cuda"), dataset=None, progress=False)


def test_the_loop_and_the_engine_builder_run_the_plan_they_are_given(synth):
    # a plan that differs from what this machine would choose: the batched engine on a CPU
    plan = dataclasses.replace(run_plan.plan_run(TINY), engine="batched", threads=0)
    records = train(TINY, dataset=synth, progress=False, plan=plan)
    assert set(records.batched) == {True} and set(records.packed) == {False}
    engine = build_engine(TINY, 16, 4, plan=plan)
    assert type(engine).__name__ == "BatchedReplicaEngine"
    assert type(build_engine(TINY, 16, 4)).__name__ == "ReplicaEngine"


def test_a_checkpoint_holds_the_plan_it_was_written_under(tmp_path, synth):
    ckpt = tmp_path / "run.pt"
    train(TINY, dataset=synth, progress=False, checkpoint_path=ckpt, checkpoint_every=1)
    ran = load_checkpoint(ckpt, TINY)["ran"]
    assert ran == {**run_plan.plan_run(TINY).to_dict(), "batched": False}
    assert ran["engine"] == "sequential" and ran["device"] == "cpu"
