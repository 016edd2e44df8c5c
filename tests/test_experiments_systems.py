"""Table 2's fitted time model and the SlowMo experiment helpers
(localsgd.paper.experiments.lin2020, .slowmo; the break-even benchmark
localsgd.paper.bench.breakeven)."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from localsgd.paper.bench.breakeven import breakeven_benchmark
from localsgd.paper.experiments.lin2020 import (
    barrier_time_per_update,
    fit_step_costs,
    table02_fit,
    update_and_sync_counts,
)
from localsgd.paper.experiments.slowmo import slowmo_configs, slowmo_summary
from localsgd.training.config import TrainConfig


def test_fit_recovers_known_costs_from_synthetic_times():
    hs = [1, 2, 4, 8, 16, 32, 64]
    counts = update_and_sync_counts(hs)
    c, s = 0.071, 0.043  # seconds per update, per sync
    seconds = counts.updates * c + counts.syncs * s
    fit = fit_step_costs(counts.updates, counts.syncs, seconds)
    assert fit["compute_s"] == pytest.approx(c, rel=1e-9)
    assert fit["sync_s"] == pytest.approx(s, rel=1e-9)
    # with 1 % multiplicative noise the costs still come back within a few %
    rng = np.random.default_rng(0)
    noisy = seconds * (1 + 0.01 * rng.standard_normal(len(hs)))
    fit = fit_step_costs(counts.updates, counts.syncs, noisy)
    assert fit["compute_s"] == pytest.approx(c, rel=0.03)
    assert fit["sync_s"] == pytest.approx(s, rel=0.05)
    # an extra term (here U·log2 H) is recovered when asked for, and is zero when absent
    extra = {"log_s": counts.updates * np.log2(counts.H)}
    with_log = fit_step_costs(counts.updates, counts.syncs, seconds + 0.002 * extra["log_s"],
                              extra)
    assert with_log["log_s"] == pytest.approx(0.002, rel=1e-6)
    assert fit_step_costs(counts.updates, counts.syncs, seconds, extra)["log_s"] < 1e-9
    with pytest.raises(ValueError, match="cannot determine"):
        fit_step_costs([1.0], [1.0], [2.0])


def test_table02_fit_explains_h_up_to_32_not_beyond():
    fit = table02_fit()
    tab = fit.table
    assert tab.updates.iloc[0] == 7324 and tab.syncs.tolist()[:2] == [7325, 3663]
    assert fit.fit_hs == (1, 2, 4, 8, 16, 32)
    assert 0.05 < fit.compute_s < 0.08 and 0.08 < fit.sync_s < 0.12
    assert tab[tab.used].residual_pct.abs().max() < 4.0  # the fitted rows: within 4 %
    # leave-one-out: each fitted row predicted by a fit on the other five, within 6 %
    loo_err = (tab.loo_minutes / tab.minutes - 1)[tab.used].abs()
    assert loo_err.max() < 0.06 and (tab.loo_minutes != tab.model_minutes)[tab.used].all()
    assert (tab.loo_minutes == tab.model_minutes)[~tab.used].all()
    beyond = tab[~tab.used]
    assert (beyond.residual_pct < -10).all()  # the model cannot rise again beyond H = 32
    # the cluster reproduces the fitted sync cost for the 16-worker all-reduce of ResNet-20
    cl = fit.cluster()
    assert fit.param_bytes == 4 * 269_722
    assert cl.allreduce_seconds(16, fit.param_bytes, 16) == pytest.approx(fit.sync_s)
    assert fit.time_kwargs() == {"compute_seconds_per_step": fit.compute_s,
                                 "sync_seconds": fit.sync_s}
    with pytest.raises(ValueError, match="fewer than 2 rows"):
        table02_fit(fit_max_h=1)


def test_barrier_model_never_rises_with_h_under_stragglers():
    hs = [1, 2, 4, 8, 16, 32, 64, 128]
    free = barrier_time_per_update(hs, workers=4, updates=512, compute_s=0.1, sync_s=0.05)
    assert free.seconds_per_update.tolist() == pytest.approx([0.1 + 0.05 * math.ceil(512 / h)
                                                              / 512 for h in hs])
    noisy = barrier_time_per_update(hs, workers=8, updates=1024, compute_s=0.1, sync_s=0.0,
                                    jitter_cv=0.3, stall_rate=0.02, stall_s=1.0,
                                    slow_factor=3.0, slow_rate=0.01, slow_len=50)
    per = noisy.seconds_per_update.to_numpy()
    assert (np.diff(per) <= 1e-12).all()  # subadditivity of the max: no rise along doublings
    assert per[0] > 0.1 * 1.5  # stragglers do cost time at H = 1


def test_slowmo_grid_configs():
    base = TrainConfig(world_size=4, local_batch=16, epochs=1.0)
    configs, labels = slowmo_configs(base, localsgd_frequency=3, slowmo_frequency=12,
                                     momenta=[0.0, 0.2], slow_lrs=[2.0], sgp_momenta=[0.0, 0.4],
                                     seeds=[0, 1], sync_reference=True)
    assert len(configs) == len(labels) == 2 * (1 + 1 + 1 + 1 + 2)
    assert configs[0].local_steps == 1 and labels[0]["base"] == "H = 1"
    by = {(lab["base"], lab["slowmo_momentum"], lab["slowmo_lr"], c.seed): c
          for c, lab in zip(configs, labels, strict=True)}
    plain = by[("local SGD", 0.0, 1.0, 0)]  # beta 0, alpha 1 *is* local SGD: trained once
    assert plain.slowmo_frequency is None and plain.local_steps == 3
    assert by[("local SGD", 0.2, 1.0, 1)].slowmo_frequency == 12
    assert by[("local SGD", 0.0, 2.0, 0)].slowmo_lr == 2.0
    sgp = by[("SGP", 0.4, 1.0, 0)]
    assert sgp.gossip and sgp.local_steps == 12 and sgp.slowmo_frequency == 12
    with pytest.raises(ValueError, match="multiple of localsgd_frequency"):
        slowmo_configs(base, localsgd_frequency=5, slowmo_frequency=12, momenta=[0.1],
                       slow_lrs=[], sgp_momenta=[], seeds=[0])
    assert dataclasses.replace(plain, seed=0) == plain


def _tiny_slowmo_base(**values):
    return TrainConfig(dataset="synthetic", model="resnet20", width=0.25, world_size=4,
                       local_batch=8, lr=0.2, n_test=64, **values)


def _synthetic_256():
    from localsgd import data

    return data.synthetic_image_dataset(256, 64, num_classes=4, image_size=16, seed=0)


def test_slowmo_summary_on_real_tiny_runs():
    from localsgd.training.loop import train

    synth = _synthetic_256()
    # 256 images / 4 workers / B_loc 8 = 8 updates: slow steps after updates 4 and 8. With
    # alpha = 0.5 the first slow step moves the model off the average by (x0 - avg)/2 (see
    # test_slowmo_first_slow_step_by_hand), so updates 5-8 and their loss differ from local SGD
    # alone. (beta = 0.5, alpha = 1 would not do: its first slow step is the identity, u = 0.)
    base = _tiny_slowmo_base(epochs=1.0)
    configs, labels = slowmo_configs(base, localsgd_frequency=2, slowmo_frequency=4,
                                     momenta=[0.5], slow_lrs=[0.5], sgp_momenta=[0.5],
                                     seeds=[0])
    import pandas as pd

    recs = pd.concat([train(c, dataset=synth, progress=False).assign(run=i, **lab)
                      for i, (c, lab) in enumerate(zip(configs, labels, strict=True))])
    summ = slowmo_summary(recs).set_index("variant")
    assert list(summ.index) == ["local SGD alone", "local SGD + SlowMo β=0.5, α=1",
                                "local SGD + SlowMo β=0, α=0.5", "SGP + SlowMo β=0.5, α=1"]
    assert summ.loc["local SGD alone", "d_acc"] == 0.0  # the reference itself
    assert summ.loc["local SGD + SlowMo β=0.5, α=1", "outer_steps"] == 2  # 8 updates / 4
    assert summ.loc["SGP + SlowMo β=0.5, α=1", "gossip_rounds"] == 6
    # the slow step acts: a change of O(lr), far above float rounding (~1e-7)
    assert abs(summ.loc["local SGD + SlowMo β=0, α=0.5", "d_loss"]) > 1e-3


def test_slowmo_first_slow_step_by_hand():
    # after the first slow step (update 4) the SlowMo model is x0 - alpha*gamma*u with
    # u = (x0 - avg)/gamma, i.e. x0 + alpha*(avg - x0), where avg is local SGD's average at the
    # same update (same seed, same data: the runs agree until then) -- outer.py's heavy ball
    from localsgd.training.loop import build_engine, train

    synth = _synthetic_256()
    base = _tiny_slowmo_base(epochs=0.5, dtype="float64")  # 4 updates
    plain, slow = slowmo_configs(base, localsgd_frequency=2, slowmo_frequency=4, momenta=[],
                                 slow_lrs=[0.5], sgp_momenta=[], seeds=[0])[0]
    flats = {}
    for name, cfg in (("plain", plain), ("slow", slow)):
        holder = []

        def make(c, n, classes, holder=holder):
            holder.append(build_engine(c, n, classes))
            return holder[0]

        train(cfg, dataset=synth, progress=False, engine=make)
        engine = holder[0]
        assert engine.t == 4
        flats[name] = engine.comm.flat.clone()
    x0 = build_engine(slow, 256, 4).comm.flat[0]  # the initial model, before any update
    avg = flats["plain"][0]
    assert torch.equal(flats["plain"], avg.expand_as(flats["plain"]))  # a global average at 4
    expected = x0 + 0.5 * (avg - x0)
    assert (avg - x0).abs().max() > 1e-3  # the workers moved: the check is not trivial
    torch.testing.assert_close(flats["slow"], expected.expand_as(flats["slow"]), rtol=0,
                               atol=1e-12)


def test_breakeven_benchmark_measures_both_sides_of_the_rule():
    df = breakeven_benchmark([{"model": "mlp", "width": 32, "batch": 2},
                              {"model": "embedding", "width": 100, "batch": 2}],
                             world_size=2, frequency=3, repeats=2)
    assert df.param_bytes.iloc[1] == 4 * (100 * 256 + 256 * 10 + 10)
    row = df.iloc[0]
    assert row.param_bytes == 4 * (3072 * 32 + 32 + 32 * 32 + 32 + 32 * 10 + 10)
    for col in ("fwd_s", "bwd_s", "allreduce_s", "ddp_step_s", "local_step_s"):
        assert 0 < row[col] < 5.0
    assert row.rule_lhs_s == pytest.approx(row.allreduce_s * 2 / 3)
    assert bool(row.rule_predicts_pays) == (row.rule_lhs_s > row.bwd_s)
    assert row.ddp_rule_model_s == pytest.approx(row.fwd_s + max(row.bwd_s, row.allreduce_s))
    with pytest.raises(ValueError, match="need model"):
        breakeven_benchmark([{"model": "vgg", "batch": 2}])


def test_a_dry_run_times_the_breakeven_steps_at_most_n_times(monkeypatch):
    from localsgd.paper import dry_run
    from localsgd.paper.bench import breakeven

    asked = []

    def spawn(worker, world_size, specs, frequency, repeats):
        asked.append(repeats)
        raise RuntimeError("stop")  # the arguments are what is checked

    monkeypatch.setattr(breakeven, "spawn", spawn)
    spec = [{"model": "mlp", "width": 32, "batch": 2}]
    for env, expected in (("", 20), ("2", 2), ("50", 20)):
        monkeypatch.setenv(dry_run.ENV, env)
        with pytest.raises(RuntimeError, match="stop"):
            breakeven.breakeven_benchmark(spec, repeats=20)
        assert asked.pop() == expected


def test_fig07_paper_time_axis_uses_the_table02_fit():
    import yaml

    from localsgd.paper.results import repo_root

    paper = yaml.safe_load((repo_root() / "notebooks/params/fig07_scaling/paper.yaml").read_text())
    fit = table02_fit()
    assert paper["compute_ms_per_update"] == round(fit.compute_s * 1e3, 1)
    cluster = fit.cluster(gpus_per_node=paper["gpus_per_node"], inter_gbps=paper["inter_gbps"])
    assert paper["latency_s"] == round(cluster.latency_s, 4)
