"""Host synchronisations of the training loop, counted on a CPU with CUDA's event clock faked.

On a GPU every read of a device value on the host (``tolist``, ``item``, ``bool(tensor)``, an
event's ``synchronize``) waits for all the work queued before it. Issue 32 asks for at most one
such wait per record, none per update: the loop queues updates back to back and reads the
losses, hit counts and event timings of a whole record at once. Measured on an H200 before the
change (`figures/gpu/syncs.jsonl`): 1 + 1/H reads per update (the losses; SGP's push-sum weight
check at every average), and one event wait per update that the debug mode does not count.

Every read is counted here with a `TorchFunctionMode` (the tensor methods that copy to the host)
and a fake ``torch.cuda.Event`` (its ``synchronize``), and split by update with ``on_step``. The
mode is thread-local, so the runs use one host thread. A fake event is done once a host read or
wait came after it was recorded (as on a GPU, where a read waits for all the work queued before
it): reading an update's times right away would count a wait.
"""

from __future__ import annotations

import time

import pytest
import torch
from torch.overrides import TorchFunctionMode

from localsgd.engines import common
from localsgd.training.config import TrainConfig
from localsgd.training.loop import train

HOST_READS = {"tolist", "item", "__bool__", "__float__", "__int__", "__index__", "cpu", "numpy"}


DRAINED = [0]  # host reads and waits so far: each one finishes the work queued before it


class HostReads(TorchFunctionMode):
    """Counts the tensor methods that copy a value to the host (a sync on CUDA)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in HOST_READS:
            self.count += 1
            DRAINED[0] += 1
        return func(*args, **(kwargs or {}))


class FakeEvent:
    """``torch.cuda.Event`` on a CPU: records the host clock, counts host waits; done once a
    host read or wait has come after it."""

    waits = 0

    def __init__(self, enable_timing=False):
        self.t, self.at = None, None

    def record(self, stream=None):
        self.t, self.at = time.perf_counter(), DRAINED[0]

    def query(self):
        return DRAINED[0] > self.at

    def synchronize(self):
        FakeEvent.waits += 1
        DRAINED[0] += 1

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


@pytest.fixture
def event_clock(monkeypatch):
    """PhaseClock takes the CUDA path (events, one wait when read) on this CPU."""
    original = common.PhaseClock.__init__

    def init(self, device):
        original(self, device)
        self.events, self._sync = True, None

    monkeypatch.setattr(common.PhaseClock, "__init__", init)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    FakeEvent.waits = 0


CASES = {  # schedule kinds whose averaging paths differ
    "local_sgd_sequential": {"local_steps": 2, "batched": False},
    "local_sgd_batched": {"local_steps": 2, "batched": True},
    "mini_batch_sgd": {"local_steps": 1, "batched": True},
    "hierarchical": {"world_size": 4, "block_size": 2, "local_steps": 2, "block_steps": 2,
                     "batched": False},
    "sgp_gossip": {"world_size": 4, "local_steps": 1, "gossip": True, "batched": False},
    "slowmo": {"local_steps": 2, "slowmo_frequency": 2, "batched": False},
}


@pytest.mark.parametrize("name", CASES)
def test_an_update_reads_nothing_back_and_a_record_reads_a_few_values(name, event_clock):
    cfg = TrainConfig(**{"dataset": "synthetic", "model": "resnet20", "width": 0.25,
                         "n_train": 64, "n_test": 16, "local_batch": 4, "world_size": 2,
                         "epochs": 2, "records_per_epoch": 2, "lr": 0.05, "eval_batch": 8,
                         "host_threads": 1, **CASES[name]})
    per_epoch = 64 // (cfg.world_size * cfg.local_batch)
    records = {per_epoch // 2 * i for i in range(1, 5)}
    reads = HostReads()
    seen: dict[int, int] = {}

    def on_step(t: int) -> None:  # cumulative reads after update t (and its record, if any)
        seen[t] = reads.count + FakeEvent.waits

    with reads:
        df = train(cfg, progress=False, on_step=on_step)
    assert len(df) == len(records) and max(seen) == 2 * per_epoch
    first = min(seen)  # the first interval also holds setup, not counted
    between = {t: seen[t] - seen[t - 1] for t in seen if t > first}
    plain = {t: n for t, n in between.items() if t not in records}
    assert plain and all(n == 0 for n in plain.values()), \
        f"host reads during updates without a record: {plain}"
    at_records = {t: n for t, n in between.items() if t in records}
    # a record: ONE read for the unread updates' losses and hits and the evaluation's sums
    # (their event timings are done by then: no wait), whatever the number of updates it
    # covers. Three before (updates; evaluation; the median step times as a tensor).
    assert at_records == dict.fromkeys(records, 1), at_records
