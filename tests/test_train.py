"""The one training loop: tiny real trainings, determinism, checkpoint/resume, errors, time axis."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest
import torch

from localsgd import data
from localsgd.paper.experiments.grid import pool_compute, speedup_table, time_to_accuracy
from localsgd.paper.experiments.lin2020 import step_costs_from_running_times
from localsgd.timing.cluster import Cluster, modelled_time
from localsgd.training.checkpoint import load_checkpoint
from localsgd.training.config import TrainConfig
from localsgd.training.loop import RunLimit, build_engine, train
from localsgd.training.state import LOOP_PHASES

# columns that hold wall-clock measurements: everything else must repeat bitwise
TIMED = ("compute_seconds", "data_seconds", "wall_seconds")


def _cifar_subset(n_train=256, n_test=128):
    try:
        ds = data.load_cifar("cifar10", download=False)
    except FileNotFoundError:
        pytest.skip("CIFAR-10 not available locally (set LOCALSGD_DATA); CI provides it")
    return ds.subset(n_train, n_test, seed=0)


@pytest.fixture(scope="module")
def synth():
    return data.synthetic_image_dataset(256, 64, num_classes=4, image_size=16, seed=0)


TINY = TrainConfig(dataset="synthetic", model="resnet20", width=0.25, world_size=2,
                   local_batch=16, local_steps=2, epochs=3.0, lr=0.2, n_test=64)


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    cols = [c for c in a.columns if c not in TIMED]
    pd.testing.assert_frame_equal(a[cols].reset_index(drop=True), b[cols].reset_index(drop=True),
                                  check_exact=True)


def test_real_cifar_subset_loss_falls():
    ds = _cifar_subset()
    cfg = TrainConfig(width=0.25, world_size=2, local_batch=32, local_steps=2, epochs=4.0,
                      n_train=256, n_test=128)
    rec = train(cfg, dataset=ds, progress=False)
    assert len(rec) == 4  # one record per epoch
    assert rec.train_loss.iloc[-1] < rec.train_loss.iloc[0]
    assert rec.epoch.iloc[-1] == pytest.approx(4.0)
    assert (rec.sync_l0.diff().dropna() > 0).all()  # averaging happened every epoch
    assert rec.test_acc.between(0, 100).all()


def test_synthetic_learns_and_counts_syncs(synth):
    # float64: at lr 0.2 this toy is chaotic in float32, where the last bits decide whether it
    # learns in 3 epochs (seed 0: NCHW and channels-last batches, equal to 4e-7 after a step,
    # end at 56 % and 25 % test accuracy; float64 learns to 50 % in both layouts)
    rec = train(dataclasses.replace(TINY, dtype="float64"), dataset=synth, progress=False)
    steps_per_epoch = 256 // 2 // 16
    assert rec.step.tolist() == [steps_per_epoch * e for e in (1, 2, 3)]
    assert rec.sync_l0.tolist() == [s // 2 for s in rec.step]  # H = 2
    assert rec.train_loss.iloc[-1] < rec.train_loss.iloc[0]
    assert rec.test_acc.iloc[-1] > 100 / 4 + 15  # above chance on a learnable toy set
    # lr: 0.2, /10 at 50 % and 75 % of T = 24 updates (step 12 and 18)
    assert rec.lr_last.tolist() == pytest.approx([0.2, 0.02, 0.002])


def test_with_host_threads_the_profile_counts_the_overlapping_spans_once(synth):
    # the K replicas' spans overlap on two host threads: compute is their wall time, so no
    # phase goes negative (it did when the loop stopped reading the step's stats per update)
    phases = []
    cfg = dataclasses.replace(TINY, host_threads=2)
    train(cfg, dataset=synth, progress=False, limit=RunLimit(updates=6, eval_images=16),
          on_phases=phases.append)
    (info,) = phases
    assert all(info[p] >= 0 for p in LOOP_PHASES), info


def test_a_run_limit_cuts_updates_batches_and_evaluation_and_phases_are_reported(
        synth, monkeypatch):
    # what a dry run of a paper configuration asks of the loop (localsgd.paper.dry_run.limit)
    import localsgd.training.batch_sources as loop

    sizes, phases, evaluated = [], [], []
    eval_sums = loop.eval_sums

    def counted_evaluation(model, x, *args, **kwargs):
        evaluated.append(len(x))
        return eval_sums(model, x, *args, **kwargs)

    monkeypatch.setattr(loop, "eval_sums", counted_evaluation)

    def engine(c, n_train, num_classes):
        built = build_engine(c, n_train, num_classes)
        step = built.step

        def counted(batches, *args, **kwargs):
            sizes.append([len(x) for x, _ in batches])
            return step(batches, *args, **kwargs)

        built.step = counted
        return built

    rec = train(TINY, dataset=synth, progress=False, engine=engine,
                limit=RunLimit(updates=3, batch=2, eval_images=16), on_phases=phases.append)
    assert rec.step.tolist() == [3] and sizes == [[2, 2]] * 3
    assert evaluated == [16]  # of the 64 test images
    (info,) = phases
    assert info["updates"] == 3 and info["first_rank"] == 0 and info["torchrun"] is False
    assert all(info[p] >= 0 for p in LOOP_PHASES) and info["compute"] > 0
    assert info["device_busy"] == info["compute"]  # the CPU computes on the host's time


def test_on_an_asynchronous_device_the_devices_busy_time_is_booked_beside_the_hosts_phases():
    # on CUDA an update's host seconds (kernel launches) are shorter than the device's work,
    # which runs on through the next batch's data phase: subtracting the one from the other
    # booked negative engine seconds (-0.2 to -0.4 s of 50 updates on an H100, gpu-check)
    from localsgd.engines.common import Deferred
    from localsgd.training.state import DEVICE_BUSY, Totals, Unread, timed_by_events

    def settle(asynchronous):
        unread, tot = Unread(), Totals(step_seconds=[[], []])
        phases = dict.fromkeys((*LOOP_PHASES, DEVICE_BUSY), 0.0)
        for _ in range(3):  # host 1 ms an update, device 5 ms per worker
            unread.add(torch.tensor([1.0, 2.0]), {"correct": torch.tensor([3.0, 4.0]),
                                                  "compute_seconds": Deferred(lambda: [5e-3] * 2)},
                       step_s=1e-3)
        unread.settle(tot, phases, images=4, workers=2, asynchronous=asynchronous)
        assert tot.seen == 24 and tot.correct == 21 and tot.loss_sum == pytest.approx(36.0)
        assert tot.step_seconds == [[5e-3] * 3] * 2
        return phases

    gpu = settle(asynchronous=True)
    assert gpu["engine"] == pytest.approx(3e-3)  # the host's own time in the updates
    assert 0 <= gpu["compute"] < 0.5  # the host read's wait (nothing to wait for here)
    assert gpu[DEVICE_BUSY] == pytest.approx(30e-3)  # beside the split, not subtracted
    cpu = settle(asynchronous=False)  # synchronous: the workers' compute is the host's time
    assert cpu["compute"] == pytest.approx(30e-3) == cpu[DEVICE_BUSY]
    # which devices book so: CUDA only (MPS synchronises at every timing mark)
    assert [timed_by_events(torch.device(d)) for d in ("cuda", "cuda:1", "cpu", "mps")] == [
        True, True, False, False]


@pytest.mark.parametrize(("choice", "threads", "nhwc"), [
    ("auto", 1, True), ("auto", 2, False), ("contiguous", 1, False), ("channels_last", 2, True)])
def test_batches_reach_the_model_in_the_configured_layout(synth, choice, threads, nhwc):
    seen: dict[bool, set] = {True: set(), False: set()}  # training mode -> layouts seen

    def engine(cfg, n_train, num_classes):
        eng = build_engine(cfg, n_train, num_classes)
        for m in [*eng.models, eng._template]:  # evaluation runs on a copy of the template
            m.register_forward_pre_hook(lambda mod, args: seen[mod.training].add(
                args[0].is_contiguous(memory_format=torch.channels_last)))
        return eng

    cfg = dataclasses.replace(TINY, epochs=1.0, memory_format=choice)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        train(cfg, dataset=synth, progress=False, engine=engine)
    finally:
        torch.set_num_threads(old)
    assert seen == {True: {nhwc}, False: {nhwc}}
    with pytest.raises(ValueError, match="memory_format='nhwc'; valid"):
        TrainConfig(memory_format="nhwc")


def test_same_seed_is_bitwise_equal_and_other_seed_differs(synth):
    a = train(TINY, dataset=synth, progress=False)
    b = train(TINY, dataset=synth, progress=False)
    _same(a, b)
    c = train(dataclasses.replace(TINY, seed=1), dataset=synth, progress=False)
    assert not math.isclose(a.train_loss.iloc[-1], c.train_loss.iloc[-1], rel_tol=1e-12)


@pytest.mark.parametrize("host_threads", [0, 3])
def test_results_do_not_depend_on_the_thread_count(synth, host_threads):
    # K = 4 replicas on a CPU: ops run single-threaded and the replicas side by side, so one,
    # two or three threads compute the same bits; torch's own setting is restored afterwards
    cfg = dataclasses.replace(TINY, world_size=4, epochs=2.0, n_test=64, eval_batch=16,
                              host_threads=host_threads)
    old = torch.get_num_threads()
    runs = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            runs.append(train(cfg, dataset=synth, progress=False))
            assert torch.get_num_threads() == n
    finally:
        torch.set_num_threads(old)
    _same(runs[0], runs[1])
    with pytest.raises(ValueError, match="host_threads=-1: must be an integer >= 0"):
        TrainConfig(host_threads=-1)


def test_resume_mid_epoch_is_bitwise_equal(synth, tmp_path):
    ref = train(TINY, dataset=synth, progress=False)
    ckpt = tmp_path / "run.pt"

    def interrupt(t):
        if t == 11:  # mid-epoch (8 updates per epoch)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(TINY, dataset=synth, progress=False, checkpoint_path=ckpt, on_step=interrupt)
    state = load_checkpoint(ckpt, TINY)
    assert state["engine"]["driver"]["t"] == 11 and len(state["records"]) == 1
    resumed = train(TINY, dataset=synth, progress=False, checkpoint_path=ckpt)
    _same(ref, resumed)


def test_periodic_checkpoint_and_bad_checkpoints(synth, tmp_path):
    ckpt = tmp_path / "run.pt"
    train(TINY, dataset=synth, progress=False, checkpoint_path=ckpt, checkpoint_every=1)
    assert load_checkpoint(ckpt, TINY)["engine"]["driver"]["t"] == 24
    other = dataclasses.replace(TINY, local_steps=4)
    with pytest.raises(ValueError, match=r"another configuration \(local_steps: saved 2 vs now 4"):
        train(other, dataset=synth, progress=False, checkpoint_path=ckpt)
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(ckpt.read_bytes()[:100])
    with pytest.raises(ValueError, match="corrupt.pt is corrupt or not a localsgd checkpoint"):
        train(TINY, dataset=synth, progress=False, checkpoint_path=corrupt)
    assert load_checkpoint(ckpt, TINY)  # the good one is untouched
    torch.save({"something": 1}, tmp_path / "foreign.pt")
    with pytest.raises(ValueError, match="not a localsgd training checkpoint"):
        load_checkpoint(tmp_path / "foreign.pt", TINY)


def test_hierarchical_warmups_and_block_momentum_run(synth):
    cfg = dataclasses.replace(TINY, world_size=4, local_batch=8, block_size=2, block_steps=2,
                              post_local_warmup_epochs=1.0, momentum_scheme="hybrid",
                              scale_lr=True, base_batch=16, warmup_epochs=1.0, epochs=2.0)
    rec = train(cfg, dataset=synth, progress=False)
    # 8 updates per epoch; epoch 1 is post-local warm-up (global gradient all-reduce every
    # update), epoch 2 averages blocks every H = 2 and the world every H * H^b = 4 updates
    assert rec.gradsync_l1.tolist() == [8, 8]
    assert rec.sync_l0.tolist() == [0, 2] and rec.sync_l1.tolist() == [0, 2]
    assert rec.group_l0.iloc[0] == 2 and rec.group_l1.iloc[0] == 4
    # App. C: peak 0.2 * K * B_loc / base_batch = 0.4, reached linearly over 8 updates; the
    # record holds the lr of the epoch's last update (it = 7)
    assert rec.lr_last.iloc[0] == pytest.approx(0.2 + (0.4 - 0.2) * 7 / 8)


def test_slowmo_over_local_sgd_and_over_sgp(synth):
    # 4 workers, 8 updates per epoch, 16 updates: SlowMo every 4 over local SGD with H = 2
    base = dataclasses.replace(TINY, world_size=4, local_batch=8, epochs=2.0, slowmo_frequency=4,
                               slowmo_momentum=0.5, slowmo_lr=1.0)
    rec = train(base, dataset=synth, progress=False)
    assert rec.outer_steps.tolist() == [2, 4]
    assert rec.sync_l0.tolist() == [4, 8]  # the slow step forces the exact average of t = 4k
    assert rec.gossip_rounds.tolist() == [0, 0]
    assert math.isfinite(rec.train_loss.iloc[-1])
    # slow momentum 0 with slow lr 1 is plain local SGD, bitwise (the outer step is w = w_avg)
    plain = train(dataclasses.replace(TINY, world_size=4, local_batch=8, epochs=2.0),
                  dataset=synth, progress=False)
    no_mom = train(dataclasses.replace(base, slowmo_momentum=0.0), dataset=synth, progress=False)
    # float32: w_prev - gamma * (w_prev - w_avg) / gamma rounds differently from w_avg
    assert no_mom.train_loss.tolist() == pytest.approx(plain.train_loss.tolist(), rel=1e-3)
    assert rec.train_loss.tolist() != pytest.approx(plain.train_loss.tolist(), rel=1e-2)
    # over SGP: gossip after every update the slow step does not average exactly
    sgp = train(dataclasses.replace(base, local_steps=4, gossip=True), dataset=synth,
                progress=False)
    assert sgp.outer_steps.tolist() == [2, 4] and sgp.sync_l0.tolist() == [2, 4]
    assert sgp.gossip_rounds.tolist() == [6, 12]


def test_config_errors():
    with pytest.raises(ValueError, match="both want the outer step"):
        TrainConfig(slowmo_frequency=4, momentum_scheme="global")
    with pytest.raises(ValueError, match="slowmo_frequency=0"):
        TrainConfig(slowmo_frequency=0)
    with pytest.raises(ValueError, match="outer momentum"):
        TrainConfig(slowmo_momentum=1.0)
    with pytest.raises(ValueError, match="unknown TrainConfig field"):
        TrainConfig.from_dict({"local_step": 2})
    with pytest.raises(ValueError, match="block_size"):
        TrainConfig(world_size=4, block_size=3, block_steps=2)
    with pytest.raises(ValueError, match="momentum_scheme"):
        TrainConfig(momentum_scheme="nesterov")
    with pytest.raises(ValueError, match="larger than a worker's share"):
        train(dataclasses.replace(TINY, local_batch=512),
              dataset=data.synthetic_image_dataset(64, 16, num_classes=4, image_size=16),
              progress=False)


def test_modelled_time_prices_each_sync():
    rec = pd.DataFrame({"step": [10, 20], "compute_seconds": [1.0, 2.0], "param_bytes": 4e6,
                        "world_size": 4, "group_l0": 2, "sync_l0": [5, 10], "gradsync_l0": 0,
                        "group_l1": 4, "sync_l1": [1, 2], "gradsync_l1": [0, 1]})
    flat = Cluster(gpus_per_node=2, intra_gbps=80.0, inter_gbps=8.0, latency_s=0.0)
    t = modelled_time(rec, flat)
    intra = 2 * (1 / 2) * 4e6 * 8 / 80e9  # ring all-reduce bytes in a node
    inter = 2 * (3 / 4) * 4e6 * 8 / 8e9
    assert t.tolist() == pytest.approx([1 + 5 * intra + inter, 2 + 10 * intra + 3 * inter])
    delayed = dataclasses.replace(flat, extra_global_seconds=1.0)
    assert (modelled_time(rec, delayed) - t).tolist() == pytest.approx([1.0, 3.0])


def test_time_to_accuracy_and_speedups():
    assert time_to_accuracy([1, 2, 3], [10, 50, 70], 30) == pytest.approx(1.5)
    assert math.isnan(time_to_accuracy([1, 2], [10, 20], 30))
    rec = pd.DataFrame({"seed": 0, "local_steps": [1, 1, 4, 4], "step": [1, 2, 1, 2],
                        "time_s": [2.0, 4.0, 1.0, 2.0], "train_acc": [40, 60, 40, 60]})
    tab = speedup_table(rec)
    assert tab.set_index("local_steps").speedup.to_dict() == pytest.approx({1: 1.0, 4: 2.0})
    c, s = step_costs_from_running_times(2.42, 1.55, 8, 58593)
    assert 58593 * (c + s) / 3600 == pytest.approx(2.42)
    assert 58593 * (c + s / 8) / 3600 == pytest.approx(1.55)


def test_modelled_time_of_flat_and_hierarchical_runs_together():
    flat = pd.DataFrame({"step": [8], "compute_seconds": [1.0], "param_bytes": 1e6,
                         "world_size": 4, "group_l0": 4, "sync_l0": [2], "gradsync_l0": 0})
    hier = flat.assign(group_l0=2, sync_l0=[4], group_l1=4, sync_l1=[2], gradsync_l1=0)
    both = pd.concat([flat, hier], ignore_index=True)  # the flat run has NaN for level 1
    cluster = Cluster(gpus_per_node=2, latency_s=0.0)
    t = modelled_time(both, cluster)
    assert t.tolist() == pytest.approx([modelled_time(flat, cluster)[0],
                                        modelled_time(hier, cluster)[0]])
    assert t[1] > t[0]  # four more node-local rounds


def test_pool_compute_gives_runs_of_the_same_work_the_median_cost_per_update():
    # three runs of width 0.25 measured 10, 12 and 20 ms per update; one of width 0.5, 40 ms
    rec = pd.DataFrame({"run": [0, 0, 1, 1, 2, 3], "step": [5, 10, 5, 10, 10, 10],
                        "compute_seconds": [0.05, 0.10, 0.06, 0.12, 0.20, 0.40],
                        "width": [0.25] * 5 + [0.5], "model": "resnet20"})
    out = pool_compute(rec)
    assert out.compute_seconds.tolist() == pytest.approx([0.06, 0.12, 0.06, 0.12, 0.12, 0.40])
    assert out.compute_seconds_measured.tolist() == rec.compute_seconds.tolist()
    assert rec.compute_seconds.iloc[0] == 0.05  # the input is left alone
    with pytest.raises(ValueError, match="'run'"):
        pool_compute(rec.drop(columns="run"))


def test_records_per_epoch_splits_each_epoch_evenly(synth):
    steps_per_epoch = 256 // 2 // 16  # 8
    rec = train(dataclasses.replace(TINY, records_per_epoch=3), dataset=synth, progress=False)
    # marks at 8/3 -> 3, 16/3 -> 5 and the epoch's end, in each of the 3 epochs
    assert rec.step.tolist() == [e * steps_per_epoch + m for e in range(3) for m in (3, 5, 8)]
    assert rec.test_acc.notna().all()
    # the end of every epoch still matches a one-record-per-epoch run (same training)
    one = train(TINY, dataset=synth, progress=False)
    ends = rec[rec.step % steps_per_epoch == 0].reset_index(drop=True)
    pd.testing.assert_series_equal(ends.test_acc, one.test_acc, check_exact=True)
    # more records than updates per epoch: one per update
    many = train(dataclasses.replace(TINY, epochs=1.0, records_per_epoch=50), dataset=synth,
                 progress=False)
    assert many.step.tolist() == list(range(1, steps_per_epoch + 1))
    with pytest.raises(ValueError, match="records_per_epoch=0"):
        TrainConfig(records_per_epoch=0)
