"""The timing model against real runs (`localsgd.validation`): one smoke-sized torchrun launch
of 4 gloo processes (nodes of 2) — the two calibration runs, synchronous SGD, local SGD H = 4 and
hierarchical SGD (H = 2, H^b = 2) with emulated compute and stragglers — and the model's
out-of-sample predictions checked against the measured speed-ups."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from localsgd.paper.experiments import timing_validation as tv
from localsgd.timing.cluster import Cluster
from localsgd.timing.scheme import Scheme

# Stated tolerance for the smoke size: a 12-update window of 4 workers on a machine shared with
# other jobs (quick mode, 8 and 16 workers and a 24-update window, claims 10 %)
SMOKE_TOL = 0.15
STALL_S, RATE = 0.3, 0.05


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("validation")
    rows, launches = tv.validate([4], out, procs_per_node=2, local_steps=(4,),
                                 hierarchical=((2, 2),), steps=16, compute_ms=30.0,
                                 straggler_seconds=STALL_S, straggler_rate=RATE, timeout=240)
    return rows.set_index("run"), launches, out / "w4"


def test_model_predicts_measured_speedups_of_real_runs(smoke):
    rows, launches, _ = smoke
    assert list(rows.index) == ["calib", "calib_sync", "sync", "local4", "hier2x2"]
    tested = rows.drop(["calib", "calib_sync"])
    assert (tested.stalls > 0).all()  # seed 0's draws: the same stalls in every run
    assert (rows.loc[["calib", "calib_sync"], "stalls"] == 0).all()
    # stalls are absorbed between averages: local SGD measurably faster than synchronous SGD
    assert rows.loc["local4", "measured_speedup"] > 1.1, rows.measured_speedup
    for run in ("local4", "hier2x2"):  # out of sample: nothing of these runs was fitted
        err = rows.loc[run, "speedup_error"]
        assert abs(err) <= SMOKE_TOL, (run, rows.loc[run, ["measured_speedup",
                                                          "predicted_speedup"]].to_dict())
    # the synchronous baseline's own time with stalls (its gradient calibration had none)
    assert abs(rows.loc["sync", "time_error"]) <= SMOKE_TOL, rows.time_error
    for run in ("calib", "calib_sync"):  # in sample
        assert abs(rows.loc[run, "time_error"]) <= 0.1, rows.time_error
    cal = launches.iloc[0]
    assert 30.0 < cal.compute_ms < 60.0 and cal.intra_ms > 0 and cal.inter_ms > 0
    assert 30.0 < cal.sync_compute_ms < 60.0 and cal.grad_ms > 0
    assert "--sweep" in cal.command and "--nproc-per-node 4" in cal.command


def test_calibration_prices_exactly_the_measured_collectives(smoke):
    _, launches, where = smoke
    cal = tv.calibrate(where / "runs" / "calib", 4, launches.iloc[0].model_mb)
    cluster = cal.cluster()
    nbytes = cal.model_mb * 1e6
    assert cluster.latency_s == 0 and cluster.gpus_per_node == 2
    assert cluster.allreduce_seconds(2, nbytes, 4) == pytest.approx(cal.intra_ms / 1e3)
    assert cluster.allreduce_seconds(4, nbytes, 4) == pytest.approx(cal.inter_ms / 1e3)
    # the timing MLP's float32 parameters (ResNet-20's bytes, 4 tensors) are what moved
    assert cal.model_mb == pytest.approx(271_314 * 4 / 1e6, rel=1e-6)
    grad = tv.calibrate(where / "runs" / "calib_sync", 4, cal.model_mb)
    sync = tv.measure(where / "runs" / "calib_sync", 4)
    assert grad.kind == "gradient" and grad.inter_ms == sync["comm_ms"]["grad_4"]
    assert grad.cluster().allreduce_seconds(4, nbytes, 4) == pytest.approx(grad.inter_ms / 1e3)
    with pytest.raises(ValueError, match="straggler-free"):
        tv.calibrate(where / "runs" / "sync", 4, cal.model_mb)
    m = tv.measure(where / "runs" / "local4", 4)
    assert m["stalls"].shape == (12, 4) and set(np.unique(m["stalls"])) <= {0.0, STALL_S}


def test_grid_interleaves_repeats_and_warms_up_to_every_period():
    entries = tv.grid(4, local_steps=(2, 8), hierarchical=((2, 4),), repeats=2)
    names = [e["name"] for e in entries]
    assert names == ["calib_r0", "calib_sync_r0", "sync_r0", "local2_r0", "local8_r0",
                     "hier2x4_r0", "calib_r1", "calib_sync_r1", "sync_r1", "local2_r1",
                     "local8_r1", "hier2x4_r1"]
    assert {e["seed"] for e in entries[6:]} == {1}
    assert entries[0]["straggler_rate"] == 0 and entries[0]["block_size"] == 4
    assert entries[1]["straggler_rate"] == 0 and entries[1]["post_local_warmup_epochs"] > 0
    assert tv.warm_steps(entries) == 8
    with pytest.raises(ValueError, match="repeats"):
        tv.grid(4, repeats=0)
    with pytest.raises(ValueError, match="exceed"):
        tv.launch(entries, 4, "unused", steps=8, compute_ms=1, straggler_seconds=0,
                  straggler_rate=0)
    assert isinstance(tv.Calibration(8, 4, 1.0, 50.0, 0.1, 10.0, 20.0).cluster(), Cluster)


def _synthetic_run(path, work):
    """A run directory `tv.measure` reads: synchronous SGD over ``work`` ([steps, workers]
    seconds of compute per update, no stalls), each update ending with a 5 ms gradient
    all-reduce that releases every worker when the slowest arrives."""
    steps, workers = work.shape
    rows, t = [], 0.0
    for step in range(1, steps + 1):
        arrive = t + work[step - 1]
        end = arrive.max() + 0.005
        rows += [{"step": step, "rank": r, "start": t, "end": end, "compute_s": work[step - 1, r],
                  "stall_s": 0.0, "grad_level": 0, "avg_level": np.nan, "comm_grad_s": 0.005,
                  "comm_avg_s": 0.0} for r in range(workers)]
        t = end
    path.mkdir()
    pd.DataFrame(rows).to_csv(path / "timing.csv", index=False)
    (path / "summary.json").write_text(json.dumps({"group_l0": workers}))
    return path


def test_jitter_is_the_spread_among_workers_not_a_pause_of_the_whole_machine(tmp_path):
    even = np.full((12, 4), 0.030)
    paused = even.copy()
    paused[5] = 0.090  # every worker slowed alike (the machine paused): nobody waits for anyone
    straggler = even.copy()
    straggler[5, 2] = 0.090  # one worker slow: the other three wait at the all-reduce
    m = {name: tv.measure(_synthetic_run(tmp_path / name, w), 1)  # window: steps 2-12
         for name, w in (("even", even), ("paused", paused), ("straggler", straggler))}
    assert m["even"]["work_cv"] == pytest.approx(0.0, abs=1e-9)
    assert m["paused"]["work_ms"] == pytest.approx(1e3 * paused[1:].mean())  # in the mean ...
    assert m["paused"]["work_cv"] == pytest.approx(0.0, abs=1e-9)  # ... not in the jitter
    assert m["straggler"]["work_ms"] == pytest.approx(1e3 * straggler[1:].mean())
    assert m["straggler"]["work_cv"] > 0.2
    assert m["paused"]["seconds"] == pytest.approx(m["straggler"]["seconds"])
    # end to end, what CI once tripped on: calibrated on the paused straggler-free run, the model
    # predicts that run's own time (counted as jitter, the pause made it 26 % slow)
    cal = tv.calibrate(tmp_path / "paused", 1, model_mb=1.0)
    predicted = tv.predict({"gradient": cal, "average": cal}, {tv.CALIB_SYNC: Scheme.sync(
        tv.CALIB_SYNC)}, np.zeros((11, 4)))[tv.CALIB_SYNC]
    assert predicted == pytest.approx(m["paused"]["seconds"], rel=0.02)


def test_own_work_estimates_the_per_worker_jitter_without_bias():
    rng = np.random.default_rng(0)
    steps, workers, sigma = 20_000, 4, 0.003
    common = rng.uniform(0.03, 0.09, steps)[:, None]  # whole-machine slow-downs: not jitter
    work = pd.Series((common + rng.normal(0, sigma, (steps, workers))).ravel())
    step = pd.Series(np.repeat(np.arange(steps), workers))
    assert tv.own_work(work, step).std() == pytest.approx(sigma, rel=0.02)
    assert (work - work.groupby(step).transform("mean")).std() < 0.9 * sigma  # (K-1)/K of it


def test_timing_mlp_moves_resnet20s_bytes_in_four_tensors():
    from localsgd.models import build_model, count_params

    mlp, resnet = build_model("mlp"), build_model("resnet20")
    assert len(list(mlp.parameters())) == 4 and len(list(resnet.parameters())) > 50
    assert count_params(mlp) == pytest.approx(count_params(resnet), rel=0.01)
    assert mlp(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match="mlp"):
        build_model("nope")


def test_hosts_running_ahead_of_an_emulated_device_queue():
    # blog_hsgd_stragglers' mechanism: averaging hosts one step ahead of their device (Q = 2)
    # beside a blocking DDP baseline; real gloo processes, the device queue a thread
    table = tv.queue_experiment(workers=4, steps=16, compute_ms=30.0, stall_s=STALL_S, rate=RATE,
                                schemes=tv.queue_schemes((4,))).set_index(["scheme", "Q"])
    assert table.stalls.iloc[0] > 0
    q1, q2 = table.loc[("local:4", 1)], table.loc[("local:4", 2)]
    assert q2.measured_speedup > q1.measured_speedup  # a stall is served while the device waits
    assert q2.predicted_speedup > q1.predicted_speedup
    for row in (q1, q2):
        assert abs(row.speedup_error) <= SMOKE_TOL, table[["measured_speedup",
                                                           "predicted_speedup"]]
