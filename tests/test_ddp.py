"""The torchrun runner (`localsgd.training.runner`, engine `localsgd.engines.ddp`): DDP engine ==
replica engine through the one training loop, stragglers and the waiting split, exact resume after
SIGKILL, failures, two loopback nodes.

Every test starts 2-4 gloo processes on CPU with tiny models on the synthetic image set.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from localsgd import data
from localsgd.compression import wire_bytes
from localsgd.distributed import spawn
from localsgd.training.config import TrainConfig
from localsgd.training.loop import build_engine, train

K, STEPS = 4, 20
# 320 images / 4 workers / B_loc 8 = 10 updates per epoch; 2 epochs = 20 updates; warm-up 2
BASE = TrainConfig(dataset="synthetic", model="resnet20", width=0.25, world_size=K,
                   local_batch=8, local_steps=2, block_size=2, block_steps=2, epochs=2.0,
                   lr=0.1, post_local_warmup_epochs=0.2, momentum_scheme="hybrid",
                   dtype="float64", augment=True, n_test=32, eval_batch=32)
SCENARIOS = {
    # hierarchical local SGD: blocks every 2, world every 4 (+ block momentum), after a
    # 2-update warm-up of mini-batch SGD through DDP's gradient all-reduce
    "hierarchical": BASE,
    # the blog's scheme: intra-block (node) gradient all-reduce by DDP every update
    "block_gradients": dataclasses.replace(BASE, block_gradient_allreduce=True,
                                           momentum_scheme="global", average_buffers=True),
    "float32": dataclasses.replace(BASE, dtype="float32"),
    # a state-sync policy beyond the sources: local momentum buffers averaged at every average
    "momentum_averaged": dataclasses.replace(BASE, average_momentum=True),
    # beyond the sources: each group takes its first worker's BatchNorm statistics at a sync
    "buffers_broadcast": dataclasses.replace(BASE, broadcast_buffers=True),
    # beyond the sources: every average as int8 codes of the change since the group's last one
    "int8_averages": dataclasses.replace(BASE, average_compression="int8"),
    # beyond the sources: DiLoCo's recipe, AdamW inside (its moments per worker) and an outer
    # Nesterov step at every global average
    "adamw_diloco": dataclasses.replace(BASE, optimizer="adamw", lr=1e-3, weight_decay=0.1,
                                        adam_betas=(0.9, 0.95), momentum_scheme="global",
                                        global_lr=0.7, global_nesterov=True),
    # beyond the sources: the one-step-delayed outer step (round r's change applied at round
    # r + 1's end) over the hierarchy, its warm-up and hybrid momentum
    "delayed_outer": dataclasses.replace(BASE, outer_delay=1),
    # beyond the sources: workers leaving and rejoining on the seed's trace (flat, H = 4; each
    # worker but worker 0 leaves a round with probability 0.5, for 1.5 rounds on average)
    "churn": dataclasses.replace(BASE, block_size=None, block_steps=1, local_steps=4,
                                 churn_rate=0.5, churn_away_rounds=1.5),
    # beyond the sources: random-k (5 % of the entries, indices seeded by the round) with error
    # feedback at both levels
    "randk_averages": dataclasses.replace(BASE, average_compression="randk",
                                          compression_density=0.05),
    # beyond the sources: streaming fragment sync (3 fragments of a flat topology, each
    # merged 2 updates after its launch, half the local fragment kept; per-fragment block
    # momentum), exact and as int8 codes with error feedback
    "streaming": dataclasses.replace(BASE, block_size=None, block_steps=1, local_steps=4,
                                     fragments=3, overlap_steps=2, fragment_mixing=0.5),
    "streaming_int8": dataclasses.replace(BASE, block_size=None, block_steps=1, local_steps=4,
                                          fragments=2, overlap_steps=1,
                                          average_compression="int8"),
    # beyond the sources: per-worker H, worker k applying the first 4 - k updates of a round
    "worker_steps": dataclasses.replace(BASE, block_size=None, block_steps=1, local_steps=4,
                                        worker_local_steps=(4, 3, 2, 1)),
    # the same run cut to 4 updates with H = 1 so every float32 mechanism acts before rounding
    # can be amplified: 2 warm-up updates (DDP's gradient all-reduce), a block average (update
    # 3), a global average with the outer block-momentum step (update 4), BatchNorm statistics
    # averaged at both; no lr decay inside the 4 updates
    "float32_short": dataclasses.replace(BASE, dtype="float32", local_steps=1, epochs=0.4,
                                         decay_fractions=(), average_buffers=True),
}
TIMED = ("compute_seconds", "data_seconds", "wall_seconds")
EARLY = 4  # per-update snapshots (parameters, float buffers, losses) of the first updates

# Float32, measured on 2026-11-23 (AMD EPYC, 1 thread per worker, as in this test):
#
# * Over 20 updates the float32 result is bimodal, not a spread of chaos. In "float32", worker
#   3's forward at update 4 has one residual-ReLU input (blocks.3, the first stage-2 block) at
#   1.26e-6 in float64, inside the float32 forward's own error (4.4e-6). A float32 run whose
#   last bits put it on the other side gets a 2 % wrong gradient on that worker (1.2e-3 on the
#   stem and stage-1 weights), is 6.0e-5 off after the block average, and ends 5.8e-2..6.4e-2
#   from float64 (epoch loss 4 %, BatchNorm statistics 0.42 on running_var up to 6); a run
#   that keeps the sign ends 1.3e-3..2.5e-3 away (loss 1e-4). Of 12 replica runs with 1-ulp
#   perturbations of the initial parameters, 8 took the far branch, exactly those that were
#   6.0e-5 off at update 4. Which engine lands where is rounding luck: here DDP kept the sign
#   (3.0e-3 from float64) and the replicas did not (6.4e-2); the earlier record from an
#   AVX-512 Xeon was the other way round (DDP 6.2e-2, replicas 2e-3: the old bounds' 30x).
#   Neither engine computes in float64 (every tensor, DDP's gradient buckets included, is
#   float32), and the float64 scenarios agree to 2e-13.
# * Before such an event both engines agree to float32 rounding: over 8 seeds (updates 1-3 of
#   "float32", 1-4 of "float32_short") DDP and the replicas differ by at most 2.4e-7 in the
#   parameters, 4.8e-7 in the BatchNorm buffers and 1.6e-7 (relative) in the per-worker
#   losses (seed 0: 1.2e-7, 2.4e-7, 1.3e-7); the first departure came at update 4 (seed 0, 1
#   of 8 seeds). In the units of the check, |x - y| / (1 + |y|), parameters and buffers stay
#   under 1.2e-7: EARLY_TOL is 8x that and 6x the losses' 1.6e-7.
EARLY_TOL = 1e-6
EARLY_UPDATES = {"float32": 3, "float32_short": 4}
# * After 20 updates: |DDP32 - Rep32| <= CHAOS_C * max(|DDP32 - DDP64|, |Rep32 - Rep64|) per
#   parameters, buffers and epoch losses (measured ratios 0.99, 1.02, 1.04). Mind that this is
#   implied by the float64 agreement (triangle inequality: the ratio is at most 2 + 1e-9 /
#   max): it confirms the float32 difference is the two runs' own rounding, but it cannot
#   catch a defect in one engine's float32 path (that defect enlarges the right-hand side as
#   much as the left). The early comparisons are what catch those.
CHAOS_C = 1.5
# Planted defects (2026-11-23; each put into the DDP engine, this test run, then removed):
# (i) BatchNorm running statistics never updated in DDP's float32 runs (saved before the
#     forward, restored after the backward): fails "float32: update 1, worker 0: buffers
#     differ by up to 0.641" (tolerance 1e-6). The end-state ratios stay 0.99 / 1.04 / 1.04
#     (params / buffers / losses), i.e. CHAOS_C passes; the old bounds caught this one only
#     through the buffers (5.3 off at the end against atol 0.3 + rtol 0.5).
# (ii) the gradient all-reduce in bfloat16 for float32 (comm hook: bucket cast to bfloat16,
#     summed, cast back, divided by the group size): fails "float32: update 1, worker 0:
#     parameters differ by up to 0.000136"; also 1.8e-3 at update 4 of "float32_short". At
#     the end it is invisible: ratios 0.85 / 0.61 / 0.56, and the old bounds (0.1 params,
#     0.3 + 50 % buffers, 6 % loss) all passed.
# Two more, measured with the same quantities outside pytest (which assertion would fire first):
# (iii) the same hook in float16 (divided first, summed in float16): parameters 1.9e-5 off at
#     update 1 of "float32" (19x EARLY_TOL); end ratios 0.70 / 0.86 / 0.77, old bounds passed.
# (iv) the model average in bfloat16 (DistributedCommunicator.average rounds the flat buffer to
#     bfloat16 before its all-reduce): invisible in "float32" up to update 3 (no average yet),
#     at the end (ratios 0.86 / 0.85 / 0.83) and to the old bounds; "float32_short" fails at
#     update 3, its block average: parameters 2.6e-3 off (|x - y| / (1 + |y|) = 1.3e-3).


def _dataset():
    return data.synthetic_image_dataset(320, 32, num_classes=4, image_size=16, seed=0)


def _train_capturing(cfg, kind, **options):
    """Train `cfg`; return (records, engine, early) where early[t - 1] holds update t's
    (per-worker parameters, per-worker float buffers, per-worker losses) for t <= EARLY."""
    holder, early = [], []

    def make(c, n, classes):
        engine = build_engine(c, n, classes, kind=kind, **options)
        step = engine.step

        def capture(*args, **kwargs):
            losses, action = step(*args, **kwargs)
            if engine.t <= EARLY:
                models = [engine.model] if kind == "ddp" else engine.models
                early.append(([[p.detach().clone() for p in m.parameters()] for m in models],
                              [[b.clone() for b in m.buffers() if b.is_floating_point()]
                               for m in models], list(losses)))
            return losses, action

        engine.step = capture
        holder.append(engine)
        return engine

    rec = train(cfg, dataset=_dataset(), progress=False, engine=make)
    return rec, holder[0], early


def _ddp_worker(rank: int, world: int) -> dict:
    out = {}
    for name, cfg in SCENARIOS.items():
        rec, engine, early = _train_capturing(cfg, "ddp")
        out[name] = {"params": [p.detach().clone() for p in engine.model.parameters()],
                     "buffers": [b.clone() for b in engine.model.buffers()
                                 if b.is_floating_point()],
                     "early": early, "records": rec,
                     "grad_steps": sum(r["grad_level"] is not None for r in engine.timeline),
                     "fragments": [(r["step"], r["fragment"], r["fragment_bytes"], r["merge"])
                                   for r in engine.timeline
                                   if r["fragment"] is not None or r["merge"] is not None]}
    return out


def _gap(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b, strict=True))


def _rel_gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


def test_ddp_engine_equals_replica_engine_through_train():
    results = spawn(_ddp_worker, K)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # like the workers: the same kernels, only the all-reduce differs
    try:
        replicas = {name: _train_capturing(cfg, "replicas") for name, cfg in SCENARIOS.items()}
    finally:
        torch.set_num_threads(threads)
    final = {}  # name -> (DDP's per-worker (params, buffers), the replicas')
    for name, cfg in SCENARIOS.items():
        rec, engine, early = replicas[name]
        steps = STEPS if name != "float32_short" else 4
        assert engine.t == steps
        ours = [(results[k][name]["params"], results[k][name]["buffers"]) for k in range(K)]
        theirs = [([p.detach() for p in engine.models[k].parameters()],
                   [b for b in engine.models[k].buffers() if b.is_floating_point()])
                  for k in range(K)]
        final[name] = (ours, theirs)
        ddp_rec = results[0][name]["records"]
        if cfg.dtype == "float64":
            for k in range(K):
                assert _gap(ours[k][0], theirs[k][0]) < 1e-9, f"{name}: worker {k} parameters"
                assert _gap(ours[k][1], theirs[k][1]) < 1e-9, f"{name}: worker {k} buffers"
            cols = [c for c in rec.columns if c not in TIMED]
            pd.testing.assert_frame_equal(ddp_rec[cols], rec[cols], check_exact=False,
                                          atol=1e-9, rtol=0)
        # the first updates, before float32 rounding can be amplified: float32 rounding only
        tol = 1e-9 if cfg.dtype == "float64" else EARLY_TOL
        for t in range(EARLY_UPDATES.get(name, EARLY)):
            ddp_losses = [results[k][name]["early"][t][2][0] for k in range(K)]
            rep_params, rep_buffers, rep_losses = early[t]
            for k in range(K):
                params, buffers, _ = results[k][name]["early"][t]
                for what, a, b in (("parameters", params[0], rep_params[k]),
                                   ("buffers", buffers[0], rep_buffers[k])):
                    ok = all(torch.allclose(x, y, rtol=tol, atol=tol)
                             for x, y in zip(a, b, strict=True))
                    assert ok, (f"{name}: update {t + 1}, worker {k}: {what} differ by up to "
                                f"{_gap(a, b):.3g} (tolerance {tol:g} (1 + |value|))")
            assert _rel_gap(ddp_losses, rep_losses) <= tol, (
                f"{name}: update {t + 1}: losses {ddp_losses} vs {rep_losses}")
        if name == "float32_short":
            assert ddp_rec.train_loss.tolist() == pytest.approx(rec.train_loss.tolist(),
                                                                rel=EARLY_TOL)
        # DDP averaged gradients in the warm-up (2 updates) / at every update (block gradients)
        assert results[0][name]["grad_steps"] == (STEPS if cfg.block_gradient_allreduce else 2)
        # workers still differ at the end (at update 3 in the short run, which ends on a global
        # average), so equality is not the trivial one of equal models
        flat = (engine.comm.flat if name != "float32_short"
                else torch.stack([torch.cat([p.reshape(-1) for p in ps]) for ps in early[2][0]]))
        spread = (flat - flat.mean(0)).abs().max().item()
        assert spread > 1e-6 or cfg.block_gradient_allreduce, name

    # averaging the momentum buffers changes the run (both engines did it, or they would differ)
    moved = _gap(final["momentum_averaged"][1][0][0], final["hierarchical"][1][0][0])
    assert moved > 1e-6, f"average_momentum left the parameters within {moved:.3g}"
    # broadcast buffers: after the last sync (a block average, update 20: the schedule counts
    # from the end of the warm-up) each block's second worker holds its first's statistics;
    # kept per worker, they differ
    for name, same in (("buffers_broadcast", True), ("hierarchical", False)):
        gaps = [_gap(final[name][1][k + 1][1], final[name][1][k][1]) for k in (0, 2)]
        assert (max(gaps) == 0.0) == same, f"{name}: buffer gaps within blocks {gaps}"
    moved = _gap(final["int8_averages"][1][0][0], final["hierarchical"][1][0][0])
    assert moved > 1e-6, f"int8 averages left the parameters within {moved:.3g}"
    # streaming: DDP launched and merged what the schedule says, each launch's bytes those of
    # its fragment (float64 values, or int8 codes with their scales: about 1/7 of their bytes)
    for name in ("streaming", "streaming_int8"):
        engine = replicas[name][1]
        bounds = engine.driver.streaming.bounds
        sizes = [engine.comm.read_tensors(*b).shape[1] for b in bounds]
        plan = [(a.t, a.fragment, a.merge) for a in map(engine.schedule.action,
                                                       range(1, STEPS + 1))
                if a.fragment is not None or a.merge is not None]
        rows = results[0][name]["fragments"]
        assert [(t, f, m) for t, f, _, m in rows] == plan, name
        for _, f, nbytes, _ in rows:
            if f is not None and name == "streaming":
                assert nbytes == 8 * sizes[f]
            elif f is not None:  # codes padded to whole blocks per rank, 4 bytes of scale each
                assert nbytes == wire_bytes(sizes[f], "int8", K) <= 0.15 * 8 * sizes[f]

    # float32 after 20 updates: the DDP-vs-replicas difference is no larger than what float32
    # rounding did to each engine against its own float64 run (see CHAOS_C)
    (d32, r32), (d64, r64) = final["float32"], final["hierarchical"]
    for i, what in enumerate(("parameters", "buffers")):
        across = max(_gap(d32[k][i], r32[k][i]) for k in range(K))
        rounding = max(max(_gap(d32[k][i], d64[k][i]), _gap(r32[k][i], r64[k][i]))
                       for k in range(K))
        assert across <= CHAOS_C * rounding, f"float32 {what}: {across:.3g} vs {rounding:.3g}"
    loss = {name: (results[0][name]["records"].train_loss.tolist(),
                   replicas[name][0].train_loss.tolist()) for name in ("float32", "hierarchical")}
    across = _rel_gap(loss["float32"][0], loss["float32"][1])
    rounding = max(_rel_gap(loss["float32"][0], loss["hierarchical"][0]),
                   _rel_gap(loss["float32"][1], loss["hierarchical"][1]))
    assert across <= CHAOS_C * rounding, f"float32 epoch losses: {across:.3g} vs {rounding:.3g}"


# ------------------------------------------------------------------------------------------------
# torchrun launches
# ------------------------------------------------------------------------------------------------

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
TINY = {"dataset": "synthetic", "model": "resnet20", "width": 0.25, "n_train": 192,
        "n_test": 32, "local_batch": 8, "local_steps": 2, "epochs": 1.0, "lr": 0.1,
        "eval_batch": 32, "augment": False}


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _config(tmp_path: Path, **values) -> Path:
    import yaml

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**TINY, **values}))
    return path


def _torchrun(nproc: int, *args: str, launcher: tuple[str, ...] = ("--standalone",),
              timeout: float = 120, **popen) -> subprocess.CompletedProcess:
    cmd = [TORCHRUN, *launcher, "--nproc-per-node", str(nproc), "-m", "localsgd.training.runner",
           "--no-progress", *args]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout, check=False,
                          **popen)


def test_stalled_worker_delays_its_own_group_only(tmp_path):
    # 4 workers in blocks of 2 averaging every update; the world only every 64 (never here).
    # Rank 0 stalls 0.15 s at every update: rank 1 waits for it, ranks 2 and 3 do not.
    cfg = _config(tmp_path, local_steps=1, block_steps=64, epochs=2.0)
    out = tmp_path / "out"
    r = _torchrun(4, "--config", str(cfg), "--world-size", "4", "--procs-per-node", "2",
                  "--compute-ms", "5", "--straggler-seconds", "0.15", "--straggler-ranks", "0",
                  "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    df = pd.read_csv(out / "timing.csv")
    assert (df.avg_level == 0).all() and df.grad_level.isna().all()
    assert (df[df["rank"] == 0].stall_s == 0.15).all() and (df[df["rank"] > 0].stall_s == 0).all()
    wait = df.groupby("rank").wait_s.median()
    assert wait[1] > 0.1, wait  # blocked behind the straggler in its own group
    assert wait[2] < 0.05 and wait[3] < 0.05, wait  # the other group runs on
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stalls"] == len(df[df["rank"] == 0]) and summary["bytes_l1"] == 0
    assert 0 < summary["wait_share"] < 1 and "ddp engine, 4 workers" in r.stdout


def test_random_stragglers_are_seeded_per_worker_and_step():
    from localsgd.timing.stragglers import Stragglers

    s = Stragglers(seconds=1.0, rate=0.3, seed=5)
    draws = [[s.stall(r, t) for t in range(1, 201)] for r in range(4)]
    assert draws == [[s.stall(r, t) for t in range(1, 201)] for r in range(4)]  # stateless
    rates = [sum(d) / 200 for d in draws]
    assert all(0.15 < x < 0.45 for x in rates) and len({tuple(d) for d in draws}) == 4
    assert Stragglers(1.0, 0.0, (2,)).stall(2, 7) == 1.0
    with pytest.raises(ValueError, match="probability"):
        Stragglers(1.0, 1.5)


BN_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


def _final_state(out: Path, world: int) -> list[dict]:
    return [torch.load(out / f"final_rank{r}.pt", weights_only=True) for r in range(world)]


def _worker_pids(launcher_pid: int) -> list[int]:
    path = Path(f"/proc/{launcher_pid}/task/{launcher_pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _wait_for(pattern: Path, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not list(pattern.parent.glob(pattern.name)) and time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"


def test_sigkill_dead_worker_corrupt_checkpoint_and_exact_resume(tmp_path):
    # 2 workers, 48 updates: warm-up 3 (DDP gradients), local SGD H=2 with block momentum,
    # random stragglers; a checkpoint every 3 updates
    cfg = _config(tmp_path, epochs=4.0, post_local_warmup_epochs=0.25,
                  momentum_scheme="hybrid", augment=True)
    common = ["--config", str(cfg), "--checkpoint-every", "3", "--save-final",
              "--straggler-rate", "0.2", "--straggler-seconds", "0.05"]
    ref = tmp_path / "ref"
    r = _torchrun(2, *common, "--out", str(ref))
    assert r.returncode == 0, r.stderr[-3000:]

    run = tmp_path / "run"
    ckpts = run / "checkpoints"

    def start(*extra: str) -> subprocess.Popen:
        cmd = [TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "localsgd.training.runner",
               "--no-progress", *common, "--out", str(run), *extra]
        return subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)

    # 1. SIGKILL every worker and torchrun mid-run (workers run in sessions of their own)
    proc = start()
    _wait_for(ckpts / "run.rank1.step000000009.pt", proc)
    workers = _worker_pids(proc.pid)
    assert len(workers) == 2, workers
    for pid in [*workers, proc.pid]:
        os.kill(pid, signal.SIGKILL)
    proc.communicate()
    assert not (run / "records.csv").exists()

    # 2. resume; then one worker dies: torchrun stops the other and reports it (no hang)
    proc = start("--resume")
    _wait_for(ckpts / "run.rank1.step000000024.pt", proc)
    workers = _worker_pids(proc.pid)
    assert len(workers) == 2, workers
    os.kill(workers[1], signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert "ChildFailedError" in err and "SIGKILL" in err, err[-3000:]

    # 3. a corrupt newest checkpoint is refused on every rank, naming it and the fallback
    # (a rank killed between writing step t and the ranks' agreement may hold t alone)
    held = [{int(f.name.split("step")[1][:9]) for f in ckpts.glob(f"run.rank{r}.step*.pt")}
            for r in (0, 1)]
    complete = sorted(held[0] & held[1])
    assert len(complete) >= 2, held  # the newest complete step and its predecessor
    previous, newest = complete[-2:]
    bad = ckpts / f"run.rank1.step{newest:09d}.pt"
    bad.write_bytes(bad.read_bytes()[:200])
    r = _torchrun(2, *common, "--out", str(run), "--resume")
    assert r.returncode != 0
    # every rank refuses; which of their messages reach stderr before torchrun stops the
    # others is a race, so at least one is asserted
    assert f"cannot resume from step {newest}" in r.stderr, r.stderr[-3000:]
    assert "rank 1: checkpoint" in r.stderr and "is corrupt" in r.stderr
    assert f"step {previous} is the previous complete checkpoint" in r.stderr
    for f in ckpts.glob(f"run.rank*.step{newest:09d}.pt"):
        f.unlink()

    # 4. resume from the previous checkpoint to the end: bitwise equal to the uninterrupted run
    r = _torchrun(2, *common, "--out", str(run), "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    for a, b in zip(_final_state(ref, 2), _final_state(run, 2), strict=True):
        for key in a:
            assert torch.equal(a[key], b[key]), key
    ra, rb = pd.read_csv(ref / "records.csv"), pd.read_csv(run / "records.csv")
    cols = [c for c in ra.columns if c not in TIMED]
    pd.testing.assert_frame_equal(ra[cols], rb[cols], check_exact=True)
    ta, tb = pd.read_csv(ref / "timing.csv"), pd.read_csv(run / "timing.csv")
    assert ta.stall_s.tolist() == tb.stall_s.tolist()  # the same stalls at the same steps

    # another configuration (or world size) is refused, naming the difference
    from localsgd.training.checkpoint import load_checkpoint

    saved = max(ckpts.glob("run.rank0.step*.pt"))
    values = {**TINY, "epochs": 4.0, "post_local_warmup_epochs": 0.25,
              "momentum_scheme": "hybrid", "augment": True, "world_size": 2}
    assert load_checkpoint(saved, TrainConfig.from_dict(values))["engine"]["rank"] == 0
    with pytest.raises(ValueError, match="world_size: saved 2 vs now 4"):
        load_checkpoint(saved, TrainConfig.from_dict({**values, "world_size": 4}))


def test_invalid_launch_fails_fast_on_every_rank(tmp_path, monkeypatch, capsys):
    # What the runner guarantees: every rank validates its inputs before any collective (so a
    # bad launch cannot hang a rank waiting for the others), exits 2 and names the problem.
    # Which rank's message reaches stderr under torchrun is a race (torchrun stops the other
    # ranks once one exits), so each rank's own check is run here in-process, one at a time.
    from localsgd.training.runner import main

    def no_process_group(*_, **__):
        raise AssertionError("a process group was initialised before validation failed")

    monkeypatch.setattr(torch.distributed, "init_process_group", no_process_group)
    cfg = _config(tmp_path)
    args = ["--config", str(cfg), "--nodes", "2", "--procs-per-node", "2",
            "--out", str(tmp_path / "o"), "--no-progress"]
    needs = "error: torchrun started 2 processes but the run needs world_size=4"
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert main(args) == 2
        err = capsys.readouterr().err
        if rank == 0:  # rank 0 reports for all (they check the same inputs), in one line
            assert err.startswith(needs) and err.count("\n") == 1, err
            assert "multiples of 2 (2, 4, 6, 8, ...)" in err
        else:
            assert err == "", err
    monkeypatch.undo()
    # under torchrun the launch fails (no hang: the timeout would raise), reported once
    r = _torchrun(2, *args, timeout=60)
    assert r.returncode != 0
    assert r.stderr.count(needs) == 1, r.stderr[-2000:]
    assert not (tmp_path / "o").exists()  # nothing trained, nothing written


def test_config_from_yaml_and_flags_is_checked_before_launch(tmp_path):
    import argparse

    from localsgd.training.runner_args import add_run_arguments, resolve_config

    p = argparse.ArgumentParser()
    add_run_arguments(p)
    cfg = resolve_config(p.parse_args(["--config", str(_config(tmp_path)), "--nodes", "2",
                                       "--procs-per-node", "2", "--block-steps", "2",
                                       "--decay-fractions", "0.5", "--n-test", "none"]), 4)
    assert (cfg.world_size, cfg.block_size, cfg.block_steps, cfg.n_test) == (4, 2, 2, None)
    assert cfg.decay_fractions == (0.5,) and cfg.width == 0.25
    with pytest.raises(ValueError, match=r"valid block sizes are \[1, 3\]"):
        resolve_config(p.parse_args(["--block-size", "2", "--block-steps", "2"]), 3)
    bad = tmp_path / "bad.yaml"
    bad.write_text("local_step: 2\n")
    with pytest.raises(ValueError, match="unknown TrainConfig field"):
        resolve_config(p.parse_args(["--config", str(bad)]), 2)


def test_two_nodes_on_loopback(tmp_path):
    # two torchrun agents (--nnodes 2), 2 processes each: node-level groups of 2, world of 4,
    # rendezvous over TCP on 127.0.0.1 (a port is retried if another test took it)
    cfg = _config(tmp_path, block_steps=2, post_local_warmup_epochs=0.5, epochs=2.0,
                  block_gradient_allreduce=True)
    out = tmp_path / "out"
    for attempt in range(3):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        launch = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(port)]
        args = ["--config", str(cfg), "--nodes", "2", "--procs-per-node", "2", "--out", str(out),
                "--save-final"]
        cmd = [TORCHRUN, *launch, "--nproc-per-node", "2", "-m", "localsgd.training.runner",
               "--no-progress", *args]
        procs = [subprocess.Popen([*cmd[:1], "--node-rank", str(n), *cmd[1:]], env=_env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for n in (0, 1)]
        outs = [p.communicate(timeout=120) for p in procs]
        if all(p.returncode == 0 for p in procs):
            break
        assert "address already in use" in (outs[0][1] + outs[1][1]).lower() and attempt < 2, \
            outs[0][1][-2000:] + outs[1][1][-2000:]
    df = pd.read_csv(out / "timing.csv")
    assert sorted(df["rank"].unique()) == [0, 1, 2, 3]
    local = df[df.step > 3]  # after the 3-update warm-up: node-level gradients every update
    assert (local.grad_level == 0).all() and set(local.avg_level.dropna()) == {1}
    assert (df[df.step <= 3].grad_level == 1).all()
    assert "4 workers" in outs[0][0]
    # the models themselves: node-mates share every update's node-level gradient, so their
    # parameters are bitwise equal; the two nodes agree exactly when the last update ended in a
    # world average and differ otherwise (BatchNorm statistics are not averaged: left out)
    finals = [{k: v for k, v in st.items() if not k.endswith(BN_BUFFERS)}
              for st in _final_state(out, 4)]

    def same(a, b):
        return all(torch.equal(a[k], b[k]) for k in a)

    assert same(finals[0], finals[1]) and same(finals[2], finals[3])
    last = df[df.step == df.step.max()]
    world_averaged = bool((last.avg_level == 1).all())
    assert same(finals[0], finals[2]) == world_averaged


def test_compiled_loss_curve_matches_eager(tmp_path):
    # one launch trains eager, then torch.compile'd with DDPOptimizer (graph split at DDP's
    # buckets); aot_eager traces the graphs without C++ codegen, to keep the test short
    cfg = _config(tmp_path, epochs=2.0, post_local_warmup_epochs=1.0)
    out = tmp_path / "out"
    r = _torchrun(2, "--config", str(cfg), "--compile", "ddp_optimizer", "--compile-backend",
                  "aot_eager", "--compare-eager", "--loss-rtol", "1e-3", "--out", str(out),
                  timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((out / "compare.json").read_text())
    # recomputed from both loss curves, not the runner's own "agree" flag
    eager_loss, compiled_loss = report["train_loss_eager"], report["train_loss_compiled"]
    assert len(eager_loss) == len(compiled_loss) == 2
    assert max(abs(c / e - 1) for e, c in zip(eager_loss, compiled_loss)) <= 1e-3
    # ... while the model trains (the compared losses move by far more than the tolerance) and
    # the compiled run really compiled (dynamo's graph counter; DDPOptimizer splits at buckets)
    assert abs(eager_loss[-1] / eager_loss[0] - 1) > 1e-2
    assert report["graphs_eager"] == 0 and report["graphs_compiled"] >= 1
    assert "compiled (ddp_optimizer, aot_eager) vs eager: median step" in r.stdout
    eager = pd.read_csv(out / "eager" / "timing.csv")
    assert (eager[eager.step <= 12].grad_level == 0).all()  # warm-up: DDP gradient all-reduce


def test_sweep_runs_several_configurations_in_one_launch(tmp_path):
    # one torch start-up for a grid (localsgd.paper.experiments.timing_validation's launches): each
    # entry sets its own schedule and stragglers over the shared --config and flags; same seed =
    # same stall draws
    import yaml

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump([
        {"name": "sync", "local_steps": 1, "post_local_warmup_epochs": 1.0},
        {"name": "hier", "local_steps": 1, "block_size": 2, "block_steps": 2,
         "straggler_ranks": [3], "straggler_rate": 0.0},
    ]))
    out = tmp_path / "out"
    r = _torchrun(4, "--config", str(_config(tmp_path)), "--compute-ms", "5",
                  "--straggler-seconds", "0.05", "--straggler-rate", "0.2", "--sweep", str(sweep),
                  "--out", str(out), "--fast-exit")
    assert r.returncode == 0, r.stderr[-3000:]
    table = pd.read_csv(out / "sweep.csv", dtype={"straggler_ranks": str})
    assert list(table.name) == ["sync", "hier"] and (table.steps == 6).all()
    sync, hier = (pd.read_csv(out / n / "timing.csv") for n in ("sync", "hier"))
    assert (sync.grad_level == 0).all() and sync.avg_level.isna().all()
    assert set(hier.avg_level) == {0, 1} and hier.grad_level.isna().all()
    assert (hier[hier["rank"] == 3].stall_s == 0.05).all() and (hier[hier["rank"] < 3].stall_s == 0).all()
    assert 0 < (sync.stall_s > 0).sum() < len(sync)  # random stalls at rate 0.2
    assert table.set_index("name").loc["hier", "straggler_ranks"] == "3"
    assert r.stdout.count("ddp engine, 4 workers") == 2


def test_sweep_entries_are_checked_before_launch(tmp_path):
    import argparse

    import yaml

    from localsgd.training.runner_args import add_run_arguments, sweep_runs

    p = argparse.ArgumentParser()
    add_run_arguments(p)
    p.add_argument("--sweep", type=Path)
    sweep = tmp_path / "s.yaml"

    def runs(entries, world=4):
        sweep.write_text(yaml.safe_dump(entries))
        return sweep_runs(p.parse_args(["--config", str(_config(tmp_path)), "--sweep",
                                        str(sweep), "--compute-ms", "7"]), world)

    (name, run, cfg), = runs([{"name": "a", "local_steps": 4, "straggler_rate": 0.1}])
    assert (name, cfg.local_steps, cfg.world_size, run.straggler_rate, run.compute_ms) == \
        ("a", 4, 4, 0.1, 7.0)
    with pytest.raises(ValueError, match="unknown key 'local_step'"):
        runs([{"name": "a", "local_step": 4}])
    with pytest.raises(ValueError, match="'a' is used twice"):
        runs([{"name": "a"}, {"name": "a"}])
    with pytest.raises(ValueError, match="entry 'b': .*block"):
        runs([{"name": "b", "block_size": 3, "block_steps": 2}])
    with pytest.raises(ValueError, match="probability"):
        runs([{"name": "c", "straggler_rate": 2.0}])


@pytest.mark.parametrize("device, gpus, words", [
    ("cuda", 0, "asked for but torch sees no CUDA GPU"),
    ("cuda", 1, "2 processes per node but only 1 visible GPU"),
    ("cuda:0", 2, "would put every process on GPU 0"),
])
def test_runner_applies_the_device_rule_before_any_process_group(tmp_path, monkeypatch, capsys,
                                                                  device, gpus, words):
    # the runner resolves the config's device with localsgd.device's rule on every rank before
    # joining a process group (CUDA facts mocked: this machine has no GPU)
    from localsgd import device as device_rule
    from localsgd.training.runner import main

    def no_process_group(*_, **__):
        raise AssertionError("a process group was initialised before the device was checked")

    monkeypatch.setattr(torch.distributed, "init_process_group", no_process_group)
    monkeypatch.setattr(device_rule, "cuda_facts", lambda: (gpus > 0, gpus))
    cfg = _config(tmp_path, device=device, world_size=2)
    for rank in range(2):
        for key, value in {"RANK": rank, "WORLD_SIZE": 2, "LOCAL_RANK": rank,
                           "LOCAL_WORLD_SIZE": 2}.items():
            monkeypatch.setenv(key, str(value))
        assert main(["--config", str(cfg), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert (err.startswith("error:") and words in err) if rank == 0 else err == "", err
    assert not (tmp_path / "o").exists()


def test_runner_places_cuda_on_the_local_rank(monkeypatch):
    from localsgd import device as device_rule
    from localsgd.training.config import TrainConfig
    from localsgd.training.runner import _placed

    monkeypatch.setattr(device_rule, "cuda_facts", lambda: (True, 4))
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    placement = device_rule.resolve_from_env("cuda", torchrun=True)
    assert placement.backend == "nccl"
    assert _placed(TrainConfig(device="cuda"), placement).device == "cuda:3"
