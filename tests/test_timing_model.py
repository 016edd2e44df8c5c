"""The wall-clock model of `localsgd.timing.simulate` (issue 11, item 1)."""

import time

import numpy as np
import pytest

from localsgd.paper.experiments.hsgd_blog import BLOG_HSGD
from localsgd.timing.cluster import Cluster
from localsgd.timing.scheme import Scheme, _gossip_offset
from localsgd.timing.simulate import simulate
from localsgd.timing.stragglers import Stragglers, stall_draws

BLOG_256 = ["sync", "local:2", "local:4", "local:8", "hsgd:1-4,2-16,4-64,8-256",
            "hsgd:2-8,4-64,8-256", "hsgd:4-16,8-256"]


def _free() -> Cluster:
    return Cluster(gpus_per_node=2, intra_gbps=1e12, inter_gbps=1e12, latency_s=0.0)


def test_release_is_the_slowest_member_by_hand():
    # 4 workers on 2 nodes, 10 ms steps; rank 0 stalls 100 ms at step 1, rank 3 at step 2
    stalls = np.zeros((2, 4))
    stalls[0, 0] = stalls[1, 3] = 0.1
    # 1 MB at 8 Gbit/s: 1 ms for a pair inside a node (ring 2(g-1)/g = 1), 1.5 ms for all four
    cl = Cluster(gpus_per_node=2, intra_gbps=8.0, inter_gbps=8.0, latency_s=0.0)
    df = simulate(["sync", "local:2", "hsgd:1-2,2-4"], workers=4, steps=2, cluster=cl,
                  compute_ms=10.0, model_mb=1.0, stalls=stalls, backward_fraction=0.5,
                  grad_overlap=0.0).set_index("scheme")
    # sync: (10 + 100 + 1.5) then (10 + 100 + 1.5): both stalls hit everybody
    assert df.loc["sync", "seconds"] == pytest.approx(0.223)
    # local:2: ranks 0 and 3 both reach 120 ms, the others wait for them; then 1.5 ms
    assert df.loc["local:2", "seconds"] == pytest.approx(0.1215)
    # hierarchical: pair {0,1} released at 110 (+1), pair {2,3} at 10 (+1); world at 121 (+1.5)
    assert df.loc["hsgd:1-2,2-4", "seconds"] == pytest.approx(0.1225)
    # local:2's waiting: ranks 1 and 2 wait 100 ms each out of 4 × 121.5 ms of worker time
    assert df.loc["local:2", "wait_share"] == pytest.approx(0.2 / (4 * 0.1215))
    row = df.loc["local:2"]
    assert row.compute_share + row.stall_share + row.wait_share + row.comm_share \
        == pytest.approx(1.0)
    # overlap: half of the 10 ms step is backward and hides the sync all-reduce's 1.5 ms
    hidden = simulate(["sync"], workers=4, steps=2, cluster=cl, compute_ms=10.0, model_mb=1.0,
                      stalls=stalls, backward_fraction=0.5, grad_overlap=1.0)
    assert hidden.seconds.iloc[0] == pytest.approx(0.220)


def test_free_communication_without_stragglers_every_scheme_ties():
    schemes = ["sync", "local:2", "local:8", "hsgd:2-4,8-16", "slowmo", "slowmo:sgp,8", "sgp",
               "local:4+hostgrad"]
    df = simulate(schemes, workers=16, steps=64, cluster=_free(), compute_ms=50.0,
                  model_mb=45.0)
    assert np.allclose(df.seconds, 64 * 0.05, rtol=1e-9)
    assert np.allclose(df.speedup, 1.0)


def test_persistent_straggler_hierarchy_mitigates_nothing():
    # blog limitation 1: one rank stalls at every step; every scheme waits for it every period
    cl = Cluster(gpus_per_node=4, inter_gbps=32.0)
    df = simulate(BLOG_256, workers=256, steps=200, cluster=cl,
                  stragglers=Stragglers(1.0, 0.0, persistent=(5,))).set_index("scheme")
    hier = df[df.kind == "hier"]
    assert (hier.speedup < 1.02).all(), hier.speedup
    assert (df.speedup < 1.02).all()


def test_random_stragglers_are_absorbed_inside_periods():
    cl = Cluster(gpus_per_node=4, inter_gbps=32.0)
    df = simulate(BLOG_256, workers=256, steps=400, cluster=cl,
                  stragglers=Stragglers(1.0, 0.01)).set_index("scheme")
    assert df.loc["local:8", "speedup"] > df.loc["local:4", "speedup"] \
        > df.loc["local:2", "speedup"] > 1.2
    # blog observation 3: local SGD every 2 and every 8 steps bracket the HSGD schemes
    hier = df[df.kind == "hier"].speedup
    assert (hier > df.loc["local:2", "speedup"]).all()
    assert (hier < df.loc["local:8", "speedup"]).all()


def test_blog_256_workers_1000_steps_is_fast(slowdown):
    cl = Cluster(gpus_per_node=4, inter_gbps=32.0)
    simulate(BLOG_256, workers=256, steps=50, cluster=cl, stragglers=Stragglers(1.0, 0.01))
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        simulate(BLOG_256, workers=256, steps=1000, cluster=cl, stragglers=Stragglers(1.0, 0.01))
        times.append(time.perf_counter() - t0)
    # the issue's budget is 2 s on an idle machine of the committed figures' speed
    assert min(times) < 2.0 * slowdown, (times, slowdown)


def test_runner_stalls_are_the_runners_draws():
    st = Stragglers(0.5, 0.2, seed=3)
    a = stall_draws(st, 4, 6, np.random.default_rng(0), runner_stalls=True)
    assert a[2, 1] == st.stall(1, 3) and a.sum() == sum(st.stall(r, t) for r in range(4)
                                                         for t in range(1, 7))


def test_bad_inputs_raise_clearly():
    with pytest.raises(ValueError, match="not understood"):
        Scheme.parse("local:eight")
    with pytest.raises(ValueError, match="whole world"):
        simulate(["hsgd:2-8,4-32"], workers=64)
    with pytest.raises(ValueError, match="persistent straggler ranks"):
        simulate(["sync"], workers=4, stragglers=Stragglers(1.0, persistent=(9,)))
    with pytest.raises(ValueError, match="grad_overlap"):
        simulate(["sync"], workers=4, grad_overlap=2.0)
    with pytest.raises(ValueError, match="stalls"):
        simulate(["sync"], workers=4, steps=3, stalls=np.zeros((2, 4)))


def test_plan_free_communication_sync_is_not_beaten(capsys):
    from localsgd.paper.cli import main

    assert main(["plan", "--workers", "32", "--gpus-per-node", "4", "--inter-gbps", "1e12",
                 "--intra-gbps", "1e12", "--latency-us", "0", "--steps", "64", "--json"]) == 0
    import json

    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["scheme"] == "sync" and rows[0]["rank"] == 1
    assert max(r["speedup"] for r in rows) == pytest.approx(1.0)
    assert {r["kind"] for r in rows} == {"sync", "local", "hier"}


def test_plan_ranks_by_predicted_step_time(capsys):
    from localsgd.paper.cli import main

    # the example: random stalls → the longest global period is fastest, sync last
    assert main(["plan", "--workers", "64", "--gpus-per-node", "4", "--straggler-rate", "0.02",
                 "--straggler-s", "1", "--steps", "200", "--top", "0"]) == 0
    out = capsys.readouterr().out
    table = [line.split() for line in out.splitlines() if line[:4].strip().isdigit()]
    assert table[0][1] == "local:8" and table[-1][1] == "sync"
    ms = [float(row[2]) for row in table]
    assert ms == sorted(ms)


@pytest.mark.parametrize("argv, message", [
    (["--workers", "0"], "--workers 0: expected an integer >= 1"),
    (["--workers", "10", "--gpus-per-node", "4"], "not a multiple of --gpus-per-node 4"),
    (["--workers", "8", "--straggler-rate", "1.5"], "--straggler-rate 1.5"),
    (["--workers", "8", "--straggler-rate", "0.1"], "add --straggler-s"),
    (["--workers", "8", "--schemes", "local:two"], "scheme 'local:two' not understood"),
])
def test_plan_bad_values_are_clear_errors(capsys, argv, message):
    from localsgd.paper.cli import main

    assert main(["plan", *argv]) == 2
    assert message in capsys.readouterr().err


def test_host_run_ahead_hides_a_later_stall_by_hand():
    # 2 workers, 10 ms steps, free communication; rank 0 stalls 100 ms at step 1, rank 1 at step 2
    stalls = np.array([[0.1, 0.0], [0.0, 0.1]])
    kw = {"workers": 2, "steps": 2, "cluster": _free(), "compute_ms": 10.0, "stalls": stalls}
    blocking = simulate(["sync"], **kw).seconds.iloc[0]
    assert blocking == pytest.approx(0.22)  # both stalls add up when the host waits every step
    # two steps in flight: rank 1's host enqueued step 2 and stalled while its GPU waited for
    # rank 0, so its stall is hidden: 110 ms, then 10 ms of step 2
    ahead = simulate(["sync"], queue_steps=2, **kw).seconds.iloc[0]
    assert ahead == pytest.approx(0.12)
    # the synchronous baseline alone may keep blocking
    both = simulate(["sync", "local:2"], queue_steps=2, sync_queue_steps=0, **kw)
    assert both.set_index("scheme").seconds.to_dict() == pytest.approx(
        {"sync": 0.22, "local:2": 0.12})


def test_blog_notebook_paper_params_are_the_blogs_setting():
    import pandas as pd
    import yaml

    from localsgd.paper.results import repo_root

    root = repo_root()
    folder = root / "notebooks" / "params" / "blog_hsgd_stragglers"
    p = {**yaml.safe_load((folder / "quick.yaml").read_text()),
         **yaml.safe_load((folder / "paper.yaml").read_text())}
    rep = pd.read_csv(root / "papers" / "cruise_meta_hsgd_blog" / "reported.csv")

    def value(artifact, setting, metric):
        row = rep[(rep.artifact == artifact) & (rep.setting == setting) & (rep.metric == metric)]
        return float(row.value.iloc[0])

    rates = {w: value("Experimental setup", f"GPUs={w}", "straggler rate") / 100
             for w in (64, 128, 256)}
    assert dict(zip(p["worker_counts"], p["straggler_rates"], strict=True)) == rates
    assert p["steps"] == value("Experimental setup", "all runs", "iterations")
    assert p["straggler_s"] == value("Experimental setup", "all runs", "straggler stall")
    assert p["step_ms"] == value("Experimental setup", "all runs", "normal step time")
    assert p["model_mb"] == value("Experimental setup", "model=ResNet18", "model size")
    assert p["gpus_per_node"] == value("Experimental setup", "cluster", "GPUs per machine")
    assert p["inter_gbps"] == value("Experimental setup", "cluster", "network bandwidth")
    # every HSGD configuration the blog lists is simulated for its GPU count
    for w in (64, 128, 256):
        listed = {s.split("scheme=HSGD ")[1].split(";")[0] for s in rep.setting
                  if s.startswith(f"GPUs={w}; scheme=HSGD")}
        assert {s.removeprefix("hsgd:") for s in BLOG_HSGD[w]} == listed


@pytest.mark.parametrize("allreduce_ms, faster", [(60.0, True), (40.0, False)])
def test_slowmo_break_even_rule_of_the_slowmo_document(allreduce_ms, faster):
    # SlowMo page: SlowMo (local SGD base) beats DDP when
    # all-reduce time * (1 - 1/localsgd_frequency) > backward time. One GPU per node, no
    # stragglers, no slow-momentum step inside the run: 30 ms of backward, F = 3 → break-even
    # at a 45 ms all-reduce
    workers, steps, freq = 8, 60, 3
    cl = Cluster(gpus_per_node=1, inter_gbps=8.0, latency_s=0.0)
    # ring all-reduce of B bytes among 8 at 8 Gbit/s: 2 * 7/8 * B * 8 / 8e9 seconds
    mb = allreduce_ms / 1e3 * 8e9 / 8 / (2 * 7 / 8) / 1e6
    df = simulate(["sync", Scheme.slowmo("localsgd", freq, slowmo_frequency=steps + 1)],
                  workers=workers, steps=steps, cluster=cl, compute_ms=45.0,
                  backward_fraction=30 / 45, model_mb=mb).set_index("kind")
    assert df.loc["sync", "step_ms"] == pytest.approx(15 + max(30, allreduce_ms))
    assert df.loc["slowmo", "step_ms"] == pytest.approx(45 + allreduce_ms / freq)
    assert (df.loc["slowmo", "speedup"] > 1) == faster


def test_sgp_waits_only_for_its_in_peer_by_hand():
    # 4 single-GPU nodes, step 1 of the exponential graph: i receives from i - 2; rank 0 stalls
    stalls = np.array([[0.1, 0.0, 0.0, 0.0]])
    cl = Cluster(gpus_per_node=1, intra_gbps=1e12, inter_gbps=1e12, latency_s=0.0)
    df = simulate(["sync", "sgp"], workers=4, steps=1, cluster=cl, compute_ms=10.0,
                  stalls=stalls).set_index("scheme")
    # sync: everybody at 110 ms, 3 x 100 ms of waiting; SGP: only rank 2 waits for rank 0
    assert df.loc["sync", "wait_share"] == pytest.approx(0.3 / 0.44)
    assert df.loc["sgp", "wait_share"] == pytest.approx(0.1 / 0.24)
    assert _gossip_offset(1, 4) == 2


def test_scheme_forms_agree_with_each_other_and_the_runner_config():
    from localsgd.training.config import TrainConfig

    def plan(s, workers=8, gpn=4, host_grad=False):
        return {k: v.tolist() for k, v in Scheme.parse(s).plan(workers, gpn, 32,
                                                               host_grad).items()}

    # the paper's H, K', H^b and PyTorch's period -> group size describe the same hierarchy
    assert plan(Scheme.paper(2, 4, 4)) == plan("hsgd:2-4,8-8") == plan("hier:H=2,Kp=4,Hb=4")
    assert plan(Scheme.paper(4, 4, 1)) == plan("local:4")
    runner = {  # what `python -m localsgd.training.runner` runs for these flags (README examples)
        "local:4": TrainConfig(world_size=8, local_steps=4),
        "hsgd:2-4,8-8": TrainConfig(world_size=8, block_size=4, local_steps=2, block_steps=4),
        "local:8+hostgrad": TrainConfig(world_size=8, block_size=4, local_steps=1,
                                        block_steps=8, block_gradient_allreduce=True),
    }
    for text, cfg in runner.items():
        assert plan(Scheme.from_train_config(cfg, steps_per_epoch=25)) == plan(text), text
    # the post-local warm-up of the runner's synchronous baseline is DDP's gradient all-reduce
    sync_cfg = TrainConfig(world_size=8, local_steps=1, post_local_warmup_epochs=8.0)
    assert plan(Scheme.from_train_config(sync_cfg, steps_per_epoch=25)) == plan("sync")
