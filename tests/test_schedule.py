"""Schedule tables: paper Fig. 3, the blog's 4-level example, warm-ups, torch compatibility."""

import itertools
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from localsgd.schedule import Action, SyncDriver, SyncSchedule
from localsgd.topology import Level, Topology


def levels(schedule, steps):
    return [schedule.action(t).level for t in range(1, steps + 1)]


def sync_steps(schedule, steps):
    return [t for t in range(1, steps + 1) if schedule.action(t).level is not None]


# -- Topology ---------------------------------------------------------------------------------


def test_paper_fig3_block_and_global_steps():
    # Fig. 3: H = 3 local steps, H^b = 2 block steps; K = 4 workers in blocks of K' = 2
    topo = Topology.from_paper(world_size=4, local_steps=3, block_size=2, block_steps=2)
    assert topo.levels == (Level(3, 2, "block"), Level(6, 4, "world"))
    s = SyncSchedule(topo)
    assert levels(s, 12) == [None, None, 0, None, None, 1, None, None, 0, None, None, 1]
    assert topo.groups("block") == [[0, 1], [2, 3]]
    assert topo.groups(1) == [[0, 1, 2, 3]]


def test_blog_16_process_4_level_example():
    topo = Topology.from_periods({2: 4, 4: 8, 8: 16})
    assert topo.world_size == 16
    s = SyncSchedule(topo)
    expected = [None, 0, None, 1, None, 0, None, 2, None, 0, None, 1, None, 0, None, 2]
    assert levels(s, 16) == expected
    assert topo.groups(0) == [list(range(i, i + 4)) for i in (0, 4, 8, 12)]
    assert topo.groups(1) == [list(range(8)), list(range(8, 16))]
    assert topo.groups(2) == [list(range(16))]
    assert topo.group_of(9, 0) == [8, 9, 10, 11]
    assert topo.group_of(9, 1) == list(range(8, 16))
    sizes = [None if pd.isna(x) else int(x) for x in s.table(16)["group_size"]]
    assert sizes == [None, 4, None, 8, None, 4, None, 16, None, 4, None, 8, None, 4, None, 16]


def test_blog_128_process_config_and_names():
    topo = Topology.from_periods({2: 8, 4: 32, 8: 128}, names=["node", "rack", "world"])
    assert topo.world_size == 128 and topo.num_levels == 3
    assert topo.level_index("rack") == 1
    assert len(topo.groups("node")) == 16
    assert topo.period_group_sizes == {2: 8, 4: 32, 8: 128}


def test_flat_forms():
    assert Topology.from_paper(8, 4).levels == (Level(4, 8, "world"),)
    # Table 2 / Table 3 "H = 16, H^b = 1" on an 8x2 cluster: blocks of 2 never average alone
    assert Topology.from_paper(16, 16, block_size=2, block_steps=1) == Topology.from_paper(16, 16)
    assert sync_steps(SyncSchedule(Topology.from_paper(16, 4, 2, 1)), 12) == [4, 8, 12]
    assert Topology.from_paper(8, 4, block_size=8, block_steps=3).levels == (Level(12, 8, "world"),)
    s = SyncSchedule(Topology.from_paper(8, 4))
    assert sync_steps(s, 12) == [4, 8, 12]
    assert all(s.action(t).level in (None, 0) for t in range(1, 13))


INVALID_TOPOLOGIES = [
    (lambda: Topology.from_periods({2: 4, 4: 6, 8: 12}), r"group size 6 of level 1 is not a mult"),
    (lambda: Topology.from_periods({2: 3, 4: 6}, world_size=8), r"does not divide world_size 8"),
    (lambda: Topology.from_periods({4: 4, 2: 8}), r"strictly ascending.*period 2"),
    (lambda: Topology.from_periods({2: 4, 3: 8}), r"period 3 of level 1 is not a multiple of .* 2"),
    (lambda: Topology.from_periods({2: 4, 4: 8}, world_size=16), r"last level must be the whole"),
    (lambda: Topology.from_periods({0: 4}), r"period of level 0 must be an integer >= 1, got 0"),
    (lambda: Topology.from_periods({}), r"must not be empty"),
    (lambda: Topology.from_paper(8, 0), r"local_steps \(H\) must be an integer >= 1, got 0"),
    (lambda: Topology.from_paper(8, 2, 4, 0), r"block_steps \(H\^b\) must be .* got 0"),
    (lambda: Topology.from_paper(8, 2, 3, 2),
     r"block_size \(K'\) 3 does not divide world_size \(K\) 8; valid .* \[1, 2, 4, 8\]"),
    (lambda: Topology.from_paper(8, 2, 3, 1), r"block_size \(K'\) 3 does not divide"),
    (lambda: Topology.from_paper(8, 2, 16, 2), r"block_size \(K'\) 16 does not divide"),
    (lambda: Topology.from_paper(8, 2, 0, 2), r"block_size \(K'\) must be an integer >= 1"),
    (lambda: Topology.from_paper(0, 2), r"world_size \(K\) must be an integer >= 1, got 0"),
    (lambda: Topology([], 4), r"at least one level"),
    (lambda: Topology.from_periods({2: 4, 4: 8}, names=["a", "a"]), r"names must be unique"),
    (lambda: SyncSchedule(Topology.from_paper(4, 2), warmup_steps=-1),
     r"warmup_steps must be an integer >= 0, got -1"),
    (lambda: SyncSchedule(Topology.from_paper(4, 2), local_step_warmup_epochs=2),
     r"needs steps_per_epoch"),
    (lambda: SyncSchedule(Topology.from_paper(4, 2), outer_period=0), r"outer_period .* got 0"),
    (lambda: SyncSchedule(Topology.from_paper(4, 2), post_local_gradient_allreduce=3),
     r"level 3 does not exist; valid levels are 0..0"),
    (lambda: SyncSchedule(Topology.from_paper(4, 2), torch_compat=True, gossip=True),
     r"torch_compat .* no \{'gossip': True\}"),
    (lambda: SyncSchedule(Topology.from_periods({2: 2, 4: 4}), torch_compat="periodic"),
     r"needs exactly one averaging level, got 2"),
    (lambda: SyncSchedule(Topology.from_paper(4, 2), warmup_mode="both"), r"warmup_mode must be"),
    (lambda: Topology.from_paper(4, 2).groups(1), r"level must be an index in \[-1, 0\]"),
    (lambda: Topology.from_paper(4, 2).groups("rack"), r"unknown level name 'rack'"),
    (lambda: Topology.from_paper(4, 2).group_of(4, 0), r"rank must be in \[0, 3\], got 4"),
    (lambda: SyncSchedule(Topology.from_paper(4, 2)).action(0), r"step t must be .* >= 1, got 0"),
]


@pytest.mark.parametrize(("make", "match"), INVALID_TOPOLOGIES)
def test_invalid_configurations_raise_clear_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# -- warm-ups -----------------------------------------------------------------------------------


def test_post_local_warmup_gradients_mode():
    s = SyncSchedule(Topology.from_paper(4, 2), warmup_steps=3)
    for t in (1, 2, 3):
        assert s.action(t) == Action(t, level=None, allreduce_grads_level=0, warmup=True)
    # local phase counted from the end of warm-up: average at t = W + H, W + 2H, ...
    assert sync_steps(s, 10) == [5, 7, 9]
    assert s.action(4) == Action(4)


def test_post_local_warmup_models_mode():
    s = SyncSchedule(Topology.from_periods({2: 2, 4: 4}), warmup_steps=2, warmup_mode="models")
    assert [s.action(t).level for t in (1, 2)] == [1, 1]
    assert all(s.action(t).warmup for t in (1, 2)) and not s.action(3).warmup
    assert levels(s, 10)[2:] == [None, 0, None, 1, None, 0, None, 1]


def test_exponential_local_step_warmup_paper_footnote():
    # ImageNet footnote: H = 8 reached through H = 1, 2, 4 in the first three epochs
    s = SyncSchedule(Topology.from_paper(4, 8), local_step_warmup_epochs=3, steps_per_epoch=8)
    assert sync_steps(s, 48) == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 32, 40, 48]


def test_exponential_warmup_phases_restart_at_epoch_start():
    s = SyncSchedule(Topology.from_paper(2, 4), local_step_warmup_epochs=3, steps_per_epoch=5)
    # epoch 0 (t 1-5): H=1; epoch 1 (t 6-10): H=2 from t=5, the epoch's last update closes the
    # round (t=10); epoch 2 (t 11-15): H=4 from t=10, closed at t=15; then H=4 from t=15
    assert sync_steps(s, 27) == [1, 2, 3, 4, 5, 7, 9, 10, 14, 15, 19, 23, 27]


@pytest.mark.parametrize(("h", "epochs", "spe", "warmup"), [(4, 3, 5, 0), (8, 4, 7, 3), (6, 3, 3, 0)])
def test_exponential_warmup_rounds_never_exceed_the_epoch_cap(h, epochs, spe, warmup):
    # regression: a round used to span an epoch boundary (5 local steps while H was capped at 4)
    s = SyncSchedule(Topology.from_paper(4, h), warmup_steps=warmup,
                     local_step_warmup_epochs=epochs, steps_per_epoch=spe)
    syncs = [warmup, *sync_steps(s, epochs * spe + 3 * h)]
    for prev, t in itertools.pairwise(syncs):
        epoch = (t - 1) // spe
        cap = min(h, 2**epoch) if epoch < epochs else h
        assert t - prev <= cap, (prev, t, cap)


def test_exponential_warmup_caps_every_level():
    s = SyncSchedule(Topology.from_paper(4, 2, block_size=2, block_steps=2),
                     local_step_warmup_epochs=2, steps_per_epoch=4)
    # epoch 0: all periods capped at 1 -> world every step; epoch 1: capped at 2 -> world at 6, 8
    assert levels(s, 8) == [1, 1, 1, 1, None, 1, None, 1]
    assert levels(s, 16)[8:] == [None, 0, None, 1, None, 0, None, 1]


def test_intra_host_gradient_allreduce_after_warmup():
    topo = Topology.from_periods({1: 2, 4: 8, 8: 16}, names=["host", "rack", "world"])
    s = SyncSchedule(topo, warmup_steps=2, post_local_gradient_allreduce=True)
    assert [s.action(t).allreduce_grads_level for t in range(1, 5)] == [2, 2, 0, 0]
    # the host level shares gradients, so it never averages models; rack at W+4, world at W+8
    assert {t: s.action(t).level for t in sync_steps(s, 18)} == {6: 1, 10: 2, 14: 1, 18: 2}


def test_outer_steps_and_gossip():
    s = SyncSchedule(Topology.from_paper(8, 3), outer_period=12)  # SlowMo: local SGD every 3
    assert [t for t in range(1, 25) if s.action(t).outer] == [12, 24]
    assert all(s.action(t).level == 0 for t in (12, 24))
    g = SyncSchedule(Topology.from_paper(8, 48), gossip=True, outer_period=48, warmup_steps=2)
    assert [g.action(t).gossip for t in (1, 2, 3, 49)] == [False, False, True, True]
    assert g.action(50).outer and g.action(50).level == 0 and not g.action(50).gossip
    h = SyncSchedule(Topology.from_paper(4, 2, 2, 2), outer_period="global")
    assert [t for t in range(1, 13) if h.action(t).outer] == [4, 8, 12]


def test_schedule_is_hashable_and_comparable():
    a = SyncSchedule(Topology.from_paper(4, 2, 2, 2), warmup_steps=3)
    b = SyncSchedule(Topology.from_paper(4, 2, 2, 2), warmup_steps=3)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1


def test_table_columns():
    df = SyncSchedule(Topology.from_paper(4, 3, 2, 2)).table(6)
    assert list(df["t"]) == [1, 2, 3, 4, 5, 6]
    assert df.loc[5, "level_name"] == "world" and df.loc[2, "level_name"] == "block"
    assert int(df.loc[2, "group_size"]) == 2


# -- torch compatibility: run torch's own averager / hook logic in one process ----------------


@pytest.fixture
def single_process_group():
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def torch_hierarchical_levels(topo, warmup, steps, monkeypatch):
    """Levels chosen by torch's HierarchicalModelAverager: the averager's groups are replaced by
    level markers and the averaging call is recorded instead of run."""
    from torch.distributed.algorithms.model_averaging import hierarchical_model_averager as hma

    periods = {lv.period: 1 for lv in topo.levels}  # world of 1: no subgroups are created
    averager = hma.HierarchicalModelAverager(periods, warmup_steps=warmup)
    averager.period_process_group_dict = {lv.period: i for i, lv in enumerate(topo.levels)}
    seen = []
    monkeypatch.setattr(hma.utils, "average_parameters_or_parameter_groups",
                        lambda params, group: seen.append(group))
    out = []
    for _ in range(steps):
        before = len(seen)
        averager.average_parameters([torch.zeros(1)])
        out.append(seen[-1] if len(seen) > before else None)
    return out


@pytest.mark.parametrize("warmup", [0, 3, 5])
def test_torch_compat_matches_hierarchical_model_averager(single_process_group, monkeypatch,
                                                          warmup):
    topo = Topology.from_periods({2: 4, 4: 8, 8: 16})
    ours = SyncSchedule(topo, warmup_steps=warmup, torch_compat=True)
    assert levels(ours, 40) == torch_hierarchical_levels(topo, warmup, 40, monkeypatch)
    if warmup == 0:  # torch averages right after the first update: s = t - 1 = 0
        assert levels(ours, 5) == [2, None, 0, None, 1]
        assert levels(SyncSchedule(topo), 5) == [None, 0, None, 1, None]


@pytest.mark.parametrize(("period", "warmup"), [(4, 0), (4, 6), (3, 2)])
def test_torch_compat_matches_periodic_model_averager(single_process_group, monkeypatch,
                                                      period, warmup):
    from torch.distributed.algorithms.model_averaging import averagers

    averager = averagers.PeriodicModelAverager(period=period, warmup_steps=warmup)
    seen = []
    monkeypatch.setattr(averagers.utils, "average_parameters_or_parameter_groups",
                        lambda params, group: seen.append(averager.step))
    for _ in range(30):
        averager.average_parameters([torch.zeros(1)])
    torch_steps = [s + 1 for s in seen]  # torch's counter s is t - 1 when it averages
    ours = SyncSchedule(Topology.from_paper(8, period), warmup_steps=warmup, torch_compat=True)
    assert sync_steps(ours, 30) == torch_steps


@pytest.mark.parametrize("post_local", [True, False])
def test_torch_compat_matches_post_local_sgd_hook(monkeypatch, post_local):
    from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook as hook_mod

    recorded = []
    monkeypatch.setattr(hook_mod.default, "_allreduce_fut",
                        lambda group, tensor: recorded.append(group))
    state = hook_mod.PostLocalSGDState(process_group="world", subgroup="host",
                                       start_localSGD_iter=3,
                                       post_local_gradient_allreduce=post_local)
    bucket = SimpleNamespace(buffer=lambda: torch.zeros(1), is_last=lambda: True)
    torch_groups = []
    for _ in range(8):
        before = len(recorded)
        hook_mod.post_localSGD_hook(state, bucket)
        torch_groups.append(recorded[-1] if len(recorded) > before else None)
    topo = Topology.from_periods({1: 2, 4: 8}, names=["host", "world"])
    ours = SyncSchedule(topo, warmup_steps=3, torch_compat=True,
                        post_local_gradient_allreduce=post_local)
    names = {None: None, 0: "host", 1: "world"}
    assert [names[ours.action(t).allreduce_grads_level] for t in range(1, 9)] == torch_groups


# -- driver ----------------------------------------------------------------------------------


class RecordingComm:
    def __init__(self, world_size):
        self.world_size, self.calls = world_size, []

    def average(self, level):
        self.calls.append(("average", level))

    def allreduce_grads(self, level):
        self.calls.append(("grads", level))

    def gossip(self, step):
        self.calls.append(("gossip", step))

    def flat_params(self):
        return torch.zeros(3)


class RecordingOuter:
    def __init__(self, comm):
        self.comm = comm

    def reset(self, params):
        self.comm.calls.append(("reset",))

    def step(self, params, lr):
        self.comm.calls.append(("outer", lr))

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def test_driver_executes_schedule_in_order():
    s = SyncSchedule(Topology.from_paper(4, 2), warmup_steps=1, gossip=True, outer_period=4)
    comm = RecordingComm(4)
    driver = SyncDriver(s, comm, RecordingOuter(comm))
    for _ in range(5):
        driver.before_step()
        driver.after_step(lr=0.5)
    assert comm.calls == [
        ("reset",),  # construction
        ("grads", 0), ("reset",),  # warm-up step 1, anchor restarts when warm-up ends
        ("gossip", 2),
        ("average", 0),
        ("gossip", 4),
        ("average", 0), ("outer", 0.5),
    ]
    assert driver.state_dict()["t"] == 5


def test_driver_validates():
    s = SyncSchedule(Topology.from_paper(4, 2), outer_period=4)
    with pytest.raises(ValueError, match="outer_period=4 but no outer update"):
        SyncDriver(s, RecordingComm(4))
    with pytest.raises(ValueError, match="world_size 4 but the communicator has 2"):
        SyncDriver(SyncSchedule(Topology.from_paper(4, 2)), RecordingComm(2))
    comm = RecordingComm(4)
    with pytest.raises(ValueError, match="outer_period=None, so it would never run"):
        SyncDriver(SyncSchedule(Topology.from_paper(4, 2)), comm, RecordingOuter(comm))
    plain = SyncDriver(SyncSchedule(Topology.from_paper(4, 2)), RecordingComm(4))
    with_outer = SyncDriver(s, comm, RecordingOuter(comm))
    with pytest.raises(ValueError, match="has outer-update state but this driver has no outer"):
        plain.load_state_dict(with_outer.state_dict())
    with pytest.raises(ValueError, match="has no outer-update state but this driver has"):
        with_outer.load_state_dict(plain.state_dict())
