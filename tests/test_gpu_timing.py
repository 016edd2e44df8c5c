"""The runner's compute / wait / communication split on a GPU, with CUDA events faked.

On CUDA the host's timestamps see only kernel launches, and NCCL's ``wait()`` returns before the
bytes have moved, so the split must come from events on the compute stream. Measured on an H200
before the fix (figures/gpu/runner_nccl_1rank_summary.json): compute_share 1.10, because the
step's wall time came from the host and its compute time from events."""

import pandas as pd
import pytest
import torch
from torch import nn

from localsgd.distributed import spawn
from localsgd.timing.stragglers import split_waiting, timing_summary

# GPU seconds per rank: forward+backward+optimizer, then the model average as this rank's
# stream sees it (rank 0 arrives first and waits for rank 1; the bytes take 0.1 s)
COMPUTE = {0: 1.0, 1: 1.2}
AVERAGE = {0: 0.3, 1: 0.1}


class FakeGPUClock:
    """PhaseClock's CUDA path with a scripted GPU: marks are GPU times, read once per update."""

    events = True

    def __init__(self, rank):
        self.rank, self.gpu_time, self.marks, self.reads = rank, 0.0, 0, 0

    def mark(self):
        # marks per update: start, after the optimizer step, after the average's wait()
        phase = self.marks % 3
        self.marks += 1
        if phase == 1:
            self.gpu_time += COMPUTE[self.rank]
        elif phase == 2:
            self.gpu_time += AVERAGE[self.rank]
        return self.gpu_time

    def seconds(self, spans):
        self.reads += 1
        return [sum(end - start for start, end in worker) for worker in spans]


def _two_updates_with_an_average(rank, world):
    from localsgd.engines.ddp import DDPEngine
    from localsgd.schedule import SyncSchedule
    from localsgd.topology import Topology

    engine = DDPEngine(lambda: nn.Linear(3, 2), SyncSchedule(Topology.from_paper(world, 2)),
                       lambda ps: torch.optim.SGD(ps, lr=0.1), seed=0)
    engine._clock = FakeGPUClock(rank)
    g = torch.Generator().manual_seed(rank)
    for _ in range(2):  # H = 2: the second update averages
        engine.step([(torch.randn(4, 3, generator=g), torch.randint(0, 2, (4,), generator=g))],
                    nn.functional.cross_entropy, stats={}, sync=False)
    assert engine._clock.reads == 0  # the updates read no event times back (a host wait each)
    return engine.timeline


def test_event_timing_splits_an_asynchronous_average_and_keeps_compute_within_the_step():
    rows = [row for timeline in spawn(_two_updates_with_an_average, 2) for row in timeline]
    df = split_waiting(pd.DataFrame(rows), [2])
    avg = df[df["step"] == 2].set_index("rank")
    # the last to arrive (rank 1) spends only the transfer; rank 0 also waits for it
    assert avg.loc[1, "comm_s"] == pytest.approx(0.1) and avg.loc[1, "wait_s"] == 0
    assert avg.loc[0, "comm_s"] == pytest.approx(0.1)
    assert avg.loc[0, "wait_s"] == pytest.approx(0.2)
    for rank in (0, 1):  # each step's time is the GPU's: compute, then the average
        assert avg.loc[rank, "wall_s"] == pytest.approx(COMPUTE[rank] + AVERAGE[rank])
        assert avg.loc[rank, "compute_s"] == pytest.approx(COMPUTE[rank])
    first = df[df["step"] == 1]  # no average: the step is compute alone
    assert (first["compute_s"] == first["wall_s"]).all()
    assert (first[["wait_s", "comm_s"]] == 0).all().all()
    s = timing_summary(df, [2])
    assert s["compute_share"] + s["wait_share"] + s["comm_share"] == pytest.approx(1.0)
    assert s["compute_share"] <= 1.0


def test_host_clock_rows_keep_the_timestamp_rule():
    # two ranks, one average: rank 1 arrives 0.2 s late, the collective ends at 1.3 for both
    rows = [{"step": 1, "rank": r, "clock": "host", "avg_level": 0, "avg_arrive": a,
             "avg_end": 1.3, "avg_dur_s": None, "grad_level": None, "grad_arrive": None,
             "grad_end": None, "grad_dur_s": None} for r, a in ((0, 1.0), (1, 1.2))]
    df = split_waiting(pd.DataFrame(rows), [2]).set_index("rank")
    assert df.loc[0, "wait_s"] == pytest.approx(0.2) and df.loc[1, "wait_s"] == 0
    assert df["comm_s"].tolist() == pytest.approx([0.1, 0.1])


def _streamed_updates(rank, world, fake_gpu):
    from localsgd.engines.ddp import DDPEngine
    from localsgd.schedule import Streaming, SyncSchedule
    from localsgd.topology import Topology

    # H = 2, two fragments (the weight, the bias), each merged one update after its launch
    schedule = SyncSchedule(Topology.from_paper(world, 2), streaming=Streaming(2, 1, 0.5))
    engine = DDPEngine(lambda: nn.Linear(3, 2), schedule, lambda ps: torch.optim.SGD(ps, lr=0.1),
                       seed=0)
    if fake_gpu:
        engine._clock = FakeGPUClock(rank)
    g = torch.Generator().manual_seed(rank)
    for _ in range(6):
        engine.step([(torch.randn(4, 3, generator=g), torch.randint(0, 2, (4,), generator=g))],
                    nn.functional.cross_entropy, stats={}, sync=False)
    return engine.timeline


@pytest.mark.parametrize("fake_gpu", [False, True], ids=["host clock", "cuda events"])
def test_a_streamed_step_books_its_launch_and_merge_as_communication(fake_gpu):
    rows = [row for timeline in spawn(_streamed_updates, 2, fake_gpu) for row in timeline]
    df = split_waiting(pd.DataFrame(rows), [2])
    streamed = df["fragment"].notna() | df["merge"].notna()
    assert streamed.sum() >= 4 and df["avg_level"].isna().all()  # fragments only, no average
    # every step's time is split whole: compute, then waiting and communication
    assert (df["compute_s"] + df["wait_s"] + df["comm_s"]).tolist() == \
        pytest.approx(df["wall_s"].tolist(), abs=1e-9)
    assert (df.loc[streamed, "comm_stream_s"] > 0).all()
    assert (df.loc[~streamed, "comm_stream_s"] == 0).all()
    if fake_gpu:  # the GPU's time after the optimizer step is the streamed communication
        for rank, part in df[streamed].groupby("rank"):
            assert part["comm_stream_s"].tolist() == pytest.approx([AVERAGE[rank]] * len(part))
            assert part["compute_s"].tolist() == pytest.approx([COMPUTE[rank]] * len(part))
    s = timing_summary(df, [2])
    assert s["compute_share"] + s["wait_share"] + s["comm_share"] == pytest.approx(1.0)
    # the bytes the world level moved are the fragments' launched (float32 weight and bias)
    assert s["bytes_l0"] == int(df["fragment_bytes"].sum()) > 0
    assert set(df.loc[df["fragment"].notna(), "fragment_bytes"]) == {6 * 4, 2 * 4}
