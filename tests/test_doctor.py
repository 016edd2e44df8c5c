"""`localsgd doctor` on this CPU-only machine: passes, says what it skipped, and fails (exit 1)
when an engine is made to differ from the CPU float64 reference."""

import importlib
import inspect
import json

import pytest
import torch

from localsgd.paper import doctor
from localsgd.paper.cli import main as cli_main


def test_doctor_passes_on_cpu_and_reports_skips(capsys):
    flags = torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()
    assert cli_main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    checks = {c["name"]: c for c in report["checks"]}
    for engine in doctor.ENGINES:
        assert checks[f"{engine} on cpu"]["status"] == "ok", checks[f"{engine} on cpu"]
        # the schedule exercised averaging at both levels and the outer step
        assert "avg0" in checks[f"{engine} on cpu"]["detail"]
        assert "avg1+outer" in checks[f"{engine} on cpu"]["detail"]
    if not torch.cuda.is_available():
        assert checks["cuda"]["status"] == "skipped"
        assert checks["nccl smoke test"]["status"] == "skipped"
    assert report["versions"]["torch"] == torch.__version__
    assert report["numerics_of_checks"]["precision"] == "fp32"
    assert report["numerics_of_checks"]["cudnn_allow_tf32"] is False
    # the process's flags are restored afterwards
    assert (torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()) == flags


@pytest.fixture(scope="module")
def reference():
    return doctor.reference_run(6)


def _engines():
    return importlib.import_module(doctor.ENGINE_MODULE)


def test_engine_check_catches_a_small_drift(monkeypatch, reference):
    module = _engines()
    original = module.BatchedReplicaEngine.step

    def drifting(self, *args, **kwargs):  # parameters 0.1 % off after every update
        out = original(self, *args, **kwargs)
        with torch.no_grad():
            self.comm.flat.mul_(1 + 1e-3)
        return out

    monkeypatch.setattr(module.BatchedReplicaEngine, "step", drifting)
    bad = doctor.engine_check("BatchedReplicaEngine", "cpu", reference=reference)
    assert bad.status == "FAIL" and "parameters" in bad.detail
    assert doctor.engine_check("ReplicaEngine", "cpu", reference=reference).status == "ok"


def test_doctor_exits_nonzero_when_an_engine_skips_averaging(monkeypatch, capsys):
    module = _engines()
    original = module.ReplicaEngine.__init__

    def no_averaging(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if kwargs.get("device", "cpu") != "cpu" or next(
                iter(self.models[0].parameters())).dtype == torch.float32:
            self.comm.average = lambda level: None  # the engine under test, not the reference

    monkeypatch.setattr(module.ReplicaEngine, "__init__", no_averaging)
    assert doctor.main(["--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "[   FAIL] ReplicaEngine on cpu: replicas differ right after an average" in out
    assert "[     ok] BatchedReplicaEngine on cpu" in out
    assert "FAILED: 1 failed" in out


def test_the_reference_is_written_by_hand_and_agrees_with_the_engine_in_float64(reference):
    # the float64 ReplicaEngine run (the reference before issue 32) against the hand-written
    # one: the same numbers up to float64 rounding, so the hand-written loop is the same
    # algorithm, written independently
    module = _engines()
    engine = doctor._build(module.ReplicaEngine, torch.float64, "cpu")
    for t, batch in enumerate(doctor._batches(6)):
        losses, _ = engine.step(batch, torch.nn.functional.cross_entropy)
        ref_losses, ref = reference["updates"][t]
        assert losses == pytest.approx(ref_losses, rel=1e-10)
        got = doctor._snapshot(engine)
        assert got.keys() == ref.keys()
        for key in got:
            assert torch.allclose(got[key], ref[key], rtol=1e-9, atol=1e-12), (t, key)
    code = inspect.getsource(doctor.reference_run).split('"""')[2]  # without the docstring
    for name in ("ENGINE_MODULE", "_build", "Engine", "Schedule", "Topology", "OuterUpdate",
                 "comm", "driver", "localsgd"):
        assert name not in code, f"the hand-written reference uses {name}"


def test_a_defect_both_engines_share_fails_the_check(monkeypatch):
    # issue 32, item 5: a block average divided by K instead of the block size passed the old
    # check, which compared each engine with the sequential engine in float64. The group mean
    # is called by ReplicaCommunicator, in the module that defines both
    module = importlib.import_module("localsgd.engines.replica_stack")
    original = module._group_mean_

    def divides_by_k(stack, group_size):
        original(stack, group_size)
        if group_size < stack.shape[0]:
            stack.mul_(group_size / stack.shape[0])

    monkeypatch.setattr(module, "_group_mean_", divides_by_k)
    reference = doctor.reference_run(6)  # built with the defect in place, as `doctor` would
    for engine in doctor.ENGINES:
        check = doctor.engine_check(engine, "cpu", reference=reference)
        assert check.status == "FAIL" and "parameters" in check.detail, check
