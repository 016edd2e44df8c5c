"""`localsgd bench ddp`: eager vs torch.compile'd DDP on gloo CPU processes (tiny real runs).

The compiled runs use the ``aot_eager`` backend: Dynamo graphs, AOTAutograd and DDPOptimizer's
graph split are real, only TorchInductor's C++ code generation (tens of seconds on 2 cores) is
left out. Quick mode of the notebook runs inductor.
"""

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from localsgd.paper.bench import ddp as bench_ddp
from localsgd.paper.bench.ddp import BenchConfig

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench_json():
    """One CLI run shared by the tests below: 2 processes, the 2 MiB model, every mode."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = bench_ddp.main(["--models", "ffn_s", "--world", "2", "--compile-backend",
                               "aot_eager", "--warmup", "1", "--rounds", "2", "--steps", "2",
                               "--json"])
    assert code == 0
    lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("{")]
    assert len(lines) == 1, out.getvalue()
    return json.loads(lines[0])


def test_medians_for_every_mode_and_what_it_ran_on(bench_json):
    meta = bench_json["meta"]
    assert meta["process_group"] == "gloo" and meta["device"] == "cpu"
    assert meta["torch"] and meta["cores"] >= 1 and meta["wall_s"] > 0
    assert meta["config"]["compile_backend"] == "aot_eager"
    s = pd.DataFrame(bench_json["summary"]).set_index("mode")
    assert sorted(s.index) == sorted(bench_ddp.MODES)
    assert (s.timed_steps == 2 * 2).all()  # rounds x steps, warm-up excluded
    for col in ("step_ms", "forward_ms", "backward_compute_ms", "optimizer_ms"):
        assert (s[col] > 0).all(), col
    assert (s.exposed_comm_ms >= 0).all()
    assert s.loc["eager", "speed_vs_eager"] == pytest.approx(1.0)
    assert (s.speed_vs_eager > 0).all()
    # what was compiled: nothing, one graph, one graph per bucket-sized piece
    assert s.loc["eager", "graphs"] == 0
    assert s.loc["no_optimization", "graphs"] == 1
    assert s.loc["ddp_optimizer", "graphs"] >= 2
    assert (s.buckets >= 2).all()  # 2 MiB of gradients in 1 MiB buckets


def test_compiled_losses_match_eager(bench_json):
    s = pd.DataFrame(bench_json["summary"]).set_index("mode")
    for mode in ("ddp_optimizer", "no_optimization"):
        assert s.loc[mode, "loss_max_rel_diff"] <= 1e-4, mode
    # ... while the model trains: the compared losses move by far more than the tolerance
    assert abs(s.loc["eager", "loss_last"] / s.loc["eager", "loss_first"] - 1) > 1e-2


def test_overlap_only_with_graph_splitting(bench_json):
    """The source's mechanism: with one compiled graph no all-reduce starts before backward
    compute ends; eager DDP and DDPOptimizer start one while backward still computes."""
    s = pd.DataFrame(bench_json["summary"]).set_index("mode")
    assert s.loc["no_optimization", "first_allreduce_at"] >= 1.0
    assert s.loc["eager", "first_allreduce_at"] < 1.0
    assert s.loc["ddp_optimizer", "first_allreduce_at"] < 1.0


@pytest.mark.parametrize("overrides, words", [
    ({"modes": ["eager", "fast"]}, ["'fast'", "ddp_optimizer", "no_optimization"]),
    ({"modes": ["python_reducer"]}, ["python_reducer", "compiled autograd"]),
    ({"models": ["gpt9"]}, ["gpt9", "ffn_s"]),
    ({"world_sizes": [1]}, ["world_sizes", ">= 2"]),
    ({"bucket_cap_mb": 0.5}, ["bucket_cap_mb", "1 MiB"]),
    ({"warmup": 0}, ["warmup", "compiles"]),
    ({"models": ["ffn_s", "ffn_m"], "batch": [32]}, ["one batch size per model"]),
    ({"compile_backend": "tensorrt_nope"}, ["compile_backend", "inductor"]),
])
def test_bad_configuration_is_a_clear_error_before_any_process(overrides, words):
    with pytest.raises(ValueError) as err:
        bench_ddp.run(BenchConfig(**overrides))
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_cli_bad_mode_exits_with_the_reason(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_ddp.main(["--modes", "python_reducer"])
    assert "python_reducer" in str(exit_.value.code) and "compiled autograd" in str(
        exit_.value.code)


def test_registered_as_localsgd_bench_ddp():
    from localsgd.paper.cli import BENCHES

    assert BENCHES["ddp"] == "localsgd.paper.bench.ddp"


def test_paper_yaml_is_the_sources_configuration():
    reported = pd.read_csv(REPO / "papers" / "dynamo_ddp_update" / "reported.csv")
    cfg = reported[reported.artifact == "Benchmark configuration"]
    p = yaml.safe_load((REPO / "notebooks" / "params" / "dynamo_ddp" / "paper.yaml").read_text())

    def value(setting, metric):
        row = cfg[(cfg.setting == setting) & (cfg.metric == metric)]
        assert len(row) == 1, (setting, metric)
        return float(row.value.iloc[0])

    sizes = cfg[cfg.metric == "batch size"]
    full = sizes[~sizes.setting.str.contains(";")]  # not resnet50's extra small-batch run
    names = {s.removeprefix("model=") for s in full.setting}
    # the source writes timm_vision_transformer_large in its configuration list
    assert set(p["ddp_models"]) == names
    assert set(p["ddp_models"]) == set(bench_ddp.SOURCE_MODELS)
    for name, batch in zip(p["ddp_models"], p["batches"], strict=True):
        assert batch == value(f"model={name}", "batch size"), name
    gpus = value("cluster", "GPUs")
    per_node = value("cluster", "GPUs per node")
    assert max(p["world_sizes"]) == gpus == value("cluster", "nodes") * per_node
    assert min(p["world_sizes"]) == per_node  # the 1-node comparison of the DDPOptimizer chart
    assert p["rounds"] == value("measurements", "samples")
    bucket = reported[(reported.artifact == "Background") & (reported.metric == "bucket size")]
    assert p["bucket_cap_mb"] == float(bucket.value.iloc[0])
    assert p["device"] == "cuda" and p["process_group"] == "nccl"
    assert p.get("compile_backend", "inductor") == "inductor"
