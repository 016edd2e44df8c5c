"""A run's plan (`localsgd.training.plan`): resolved once from the config and the machine, frozen,
read by the engine builder, the loop, resume and the runners, shown in checkpoints."""

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

from localsgd import data
from localsgd.device import DeviceError
from localsgd.training import plan as run_plan
from localsgd.training.checkpoint import load_checkpoint
from localsgd.training.config import TrainConfig
from localsgd.training.loop import build_engine, train

PACKAGE = Path(run_plan.__file__).resolve().parents[1]

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


def test_an_engine_built_on_its_own_takes_the_config_s_host_threads():
    # outside `train` torch's threads are not set to 1, so the replicas take host threads only
    # where the config names them (runner 'engine')
    assert run_plan.plan_run(TINY, "engine").threads == 0
    assert run_plan.plan_run(dataclasses.replace(TINY, host_threads=3), "engine").threads == 3
    assert run_plan.plan_run(TINY, "engine").engine == "sequential"


def test_a_torchrun_launch_places_every_run_on_one_device():
    placement = run_plan.torchrun_placement([TINY, dataclasses.replace(TINY, seed=1)], "gloo")
    assert (placement.device, placement.backend) == (torch.device("cpu"), "gloo")
    with pytest.raises(ValueError, match=r"ask for devices \['cpu', 'cuda'\]; one launch"):
        run_plan.torchrun_placement([TINY, dataclasses.replace(TINY, device="cuda")], None)


# What `plan_run` decides from a config. No module reads these fields of a config again (a
# second decision, which could disagree with the plan's), except where the reason is given.
PLANNED = {"device", "batched", "packed", "host_threads", "precision", "memory_format",
           "compile_replicas", "deterministic"}
# how the package names a config (``cfg.x``, ``run.cfg.x``) and a list of them (``cfgs[0].x``)
CONFIG_NAMES = {"cfg", "asked", "base", "c", "config", "recipe"}
CONFIG_LISTS = {"cfgs", "configs", "asked"}
READS_ALLOWED = {  # a file (every read in it) or file:function:field
    "training/plan.py": "the plan itself",
    "training/loop.py:_resume:batched": "the refused resume's message names the asked value",
    "paper/campaign.py:entry_configs:batched": ("refuses an entry that asks for the "
                                                "sequential engine, before any plan: a pack "
                                                "runs the batched one"),
    "paper/campaign.py:_rate:device": ("prices a pack before it is planned: the asked device "
                                       "picks the measured rate (CPU or a GPU's)"),
    "paper/experiments/grid.py:run_grid:device": "labels the console's time estimate as the CPU "
                                                 "proxy's; runs nothing",
    "paper/gpu_check.py:loop:batched": "the loop's table (loop.csv) shows the asked config",
    "paper/gpu_check.py:loop:precision": "the loop's table (loop.csv) shows the asked config",
}


def _names_a_config(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in CONFIG_NAMES
    if isinstance(node, ast.Attribute):
        return node.attr in CONFIG_NAMES
    if isinstance(node, ast.Subscript):
        inner = node.value
        name = inner.id if isinstance(inner, ast.Name) else getattr(inner, "attr", None)
        return name in CONFIG_LISTS
    return False


def planned_field_reads(root: Path) -> list[tuple[str, int]]:
    """``(file:function:field, line)`` of every read of a `PLANNED` field of a config under
    ``root`` (file relative to it; the innermost function, or ``<module>``), but in the files
    `READS_ALLOWED` names whole."""
    found = []

    class Reads(ast.NodeVisitor):
        def __init__(self, rel: str) -> None:
            self.rel, self.func = rel, "<module>"

        def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
            outer, self.func = self.func, node.name
            self.generic_visit(node)
            self.func = outer

        visit_AsyncFunctionDef = visit_FunctionDef

        def visit_Attribute(self, node: ast.Attribute) -> None:
            if node.attr in PLANNED and _names_a_config(node.value):
                found.append((f"{self.rel}:{self.func}:{node.attr}", node.lineno))
            self.generic_visit(node)

    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel not in READS_ALLOWED:
            Reads(rel).visit(ast.parse(path.read_text(), str(path)))
    return found


def test_no_module_decides_again_what_the_plan_decided():
    reads = planned_field_reads(PACKAGE)
    unexplained = [f"{where} (line {line})" for where, line in reads
                   if where not in READS_ALLOWED]
    assert not unexplained, ("these read a field `plan_run` decides from the config; read the "
                             "RunPlan instead (or give the reason in READS_ALLOWED): "
                             f"{unexplained}")
    seen = {where for where, _ in reads}
    stale = [k for k in READS_ALLOWED
             if (k not in seen if ":" in k else not (PACKAGE / k).is_file())]
    assert not stale, f"READS_ALLOWED entries that match no read (or file) any more: {stale}"


def test_a_planted_second_decision_is_found(tmp_path):
    engines = tmp_path / "engines"
    engines.mkdir()
    (engines / "fast.py").write_text(
        "def build(cfg, plan, run, cfgs):\n"
        "    kind = 'vmap' if cfg.batched else 'loop'\n"
        "    return kind, run.cfg.device, cfgs[0].precision, plan.batched\n")
    assert planned_field_reads(tmp_path) == [
        ("engines/fast.py:build:batched", 2), ("engines/fast.py:build:device", 3),
        ("engines/fast.py:build:precision", 3)]
