"""The state one `localsgd.training.loop.train` call carries between its updates: the training sums
since the last record (`Totals`), the updates whose device values are still unread (`Unread`,
read once per record), and `Run`, which takes one update, one record (the test set and the
sums), a checkpoint's snapshot and the phases' seconds. `localsgd.training.loop._train` is the loop
that drives it; nothing here decides when to record or checkpoint."""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import nn

from localsgd import numerics
from localsgd.engines import Engine
from localsgd.training.batch_sources import MemoryBatches, StreamedBatches, combine_eval
from localsgd.training.checkpoint import CHECKPOINT_FORMAT, RankCheckpoints, save_checkpoint
from localsgd.training.config import TrainConfig
from localsgd.training.plan import RunPlan

__all__ = ["DEVICE_BUSY", "LOOP_PHASES", "Run", "Totals", "Unread", "timed_by_events"]

# the loop's phases, in seconds, that `train` reports to ``on_phases``: they split the host's
# wall time and sum to the loop's (`Unread.settle` says what compute and engine are on CUDA)
LOOP_PHASES = ("setup", "data", "compute", "engine", "evaluate", "loop")
# reported beside them: the device's busy seconds, which on CUDA overlap the host's phases
DEVICE_BUSY = "device_busy"


@dataclass
class Totals:
    """Cumulative counters of a run (saved in checkpoints)."""

    compute_seconds: float = 0.0
    data_seconds: float = 0.0
    sync: list[int] = field(default_factory=list)
    gradsync: list[int] = field(default_factory=list)
    gossip: int = 0  # SGP push-sum rounds
    outer: int = 0  # outer steps (block momentum, SlowMo)
    # this process's workers over the current epoch, combined across processes at each record
    step_seconds: list[list[float]] = field(default_factory=list)
    loss_sum: float = 0.0
    correct: int = 0
    seen: int = 0


def timed_by_events(device: torch.device) -> bool:
    """Whether ``device``'s updates are timed by events while the host runs ahead (CUDA, as
    `localsgd.engines.common.PhaseClock`); MPS synchronises at each mark, like the CPU."""
    return device.type == "cuda"


class Unread:
    """Updates whose losses, hit counts and event timings are still on the device: read
    together once per record (`settle`), so an update makes no host synchronisation on CUDA."""

    def __init__(self):
        self.rows: list[tuple[torch.Tensor, torch.Tensor | None, Any, float, float | None]] = []

    def add(self, losses: torch.Tensor, stats: dict, step_s: float) -> None:
        """One update: `Engine.step(..., sync=False)`'s losses and stats, its host seconds."""
        # with host threads the workers' spans overlap: the profile counts their wall time
        self.rows.append((losses, stats["correct"], stats["compute_seconds"], step_s,
                          stats.get("compute_wall_seconds")))

    def settle(self, tot: Totals, phases: dict[str, float], images: int, workers: int,
               also: torch.Tensor | None = None, *, asynchronous: bool = False) -> list[float]:
        """Add the unread updates to ``tot`` and ``phases``: one host read for all their losses
        and hits (Python sums in update order, as a per-update read would give), then their
        timings; ``images`` per worker and update, ``workers`` in this process. ``also``: more
        device values (a record's evaluation sums) read in the same host read; returned
        flattened, as float64.

        The phases split the host's wall time. On the CPU (synchronous) an update's host
        seconds are the workers' compute (``compute``) and the rest (``engine``: averaging,
        optimizer bookkeeping). On an ``asynchronous`` device (CUDA, timed by events) the
        device computes while the host launches kernels and prepares the next batches, so its
        busy time cannot be subtracted from the host's: ``engine`` is the host's wall time in
        the updates (launches, averaging, and any wait a full launch queue forces) and
        ``compute`` the host's wait for the device at this read (the updates' work and a
        record's evaluation still running). The device's busy seconds go to
        ``phases[DEVICE_BUSY]`` on every device, beside the split. (MPS synchronises at each
        timing mark, so its updates are booked as the CPU's.)"""
        extra = [] if also is None else [also.detach().flatten().double()]
        if not self.rows:
            return torch.cat(extra).tolist() if extra else []
        t_wait = time.perf_counter()
        rows = [torch.cat([lo.double(), (c if c is not None else torch.zeros_like(lo)).double()])
                for lo, c, *_ in self.rows]
        width = rows[0].numel()
        flat = torch.cat([*rows, *extra]).tolist()  # the one host read
        values = [flat[i:i + width] for i in range(0, width * len(rows), width)]
        # new totals first, assigned together: a second Ctrl-C in here cannot count twice
        loss_sum, correct, seen = tot.loss_sum, tot.correct, tot.seen
        step_seconds = [list(times) for times in tot.step_seconds]
        compute, engine, device = phases["compute"], phases["engine"], phases[DEVICE_BUSY]
        for row, (_, _, seconds, step_s, busy) in zip(values, self.rows, strict=True):
            n = len(row) // 2
            loss_sum += sum(row[:n]) * images
            correct += int(sum(row[n:]))
            seen += workers * images
            per_worker = seconds.get()
            for times, sec in zip(step_seconds, per_worker, strict=True):
                times.append(sec)
            busy = busy if busy is not None else sum(per_worker)
            device += busy
            if asynchronous:
                engine += step_s  # the host launched this update; the device ran beside it
            else:
                compute += busy
                engine += step_s - busy  # the host's time beyond the workers' compute
        self.rows.clear()
        tot.loss_sum, tot.correct, tot.seen, tot.step_seconds = loss_sum, correct, seen, \
            step_seconds
        wait = time.perf_counter() - t_wait  # the host read: on CUDA, the wait for the device
        phases["compute"] = compute + wait if asynchronous else compute
        phases["engine"] = engine if asynchronous else engine + wait
        phases[DEVICE_BUSY] = device
        return flat[width * len(rows):]


@dataclass
class Run:
    """What one `train` call carries between its updates (`_train` is the loop): the engine
    and the batches, the plan they run by (`localsgd.training.plan.RunPlan`), the totals since the
    last record, the records and the phases' seconds."""

    cfg: TrainConfig
    asked: TrainConfig | None
    engine: Engine
    source: MemoryBatches | StreamedBatches
    plan: RunPlan
    checkpoint_path: Any
    records: list[dict] = field(default_factory=list)
    phases: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys((*LOOP_PHASES, DEVICE_BUSY), 0.0))
    unread: Unread = field(default_factory=Unread)

    def __post_init__(self):
        ranks = self.ranks = self.engine.local_ranks  # all K in the replica engine
        k = self.engine.world_size
        # this process's evaluation shard: (0, 1) in the replica engine, (rank, K) under torchrun
        self.shard = (ranks[0] // len(ranks), k // len(ranks))
        self.multi = ranks != list(range(k))  # one worker per process: per-rank files
        self.per_rank = (RankCheckpoints(self.checkpoint_path, self.engine)
                         if self.multi and self.checkpoint_path else None)
        levels = self.cfg.topology().num_levels
        self.tot = Totals(sync=[0] * levels, gradsync=[0] * levels,
                           step_seconds=[[] for _ in ranks])

    @property
    def device(self) -> torch.device:
        return self.plan.device

    def settle(self, also: torch.Tensor | None = None) -> list[float]:
        return self.unread.settle(self.tot, self.phases, images=self.cfg.local_batch,
                                  workers=len(self.ranks), also=also,
                                  asynchronous=timed_by_events(self.device))

    def snapshot(self) -> dict:
        self.settle()
        return {"format": CHECKPOINT_FORMAT, "config": (self.asked or self.cfg).to_dict(),
                "ran": {**self.plan.to_dict(), "batched": self.plan.batched},
                "engine": self.engine.state_dict(),
                "records": self.records, "totals": dataclasses.asdict(self.tot)}

    def checkpoint(self) -> None:
        if self.per_rank is not None:
            self.per_rank.save(self.snapshot(), self.engine.t)
        else:
            save_checkpoint(self.checkpoint_path, self.snapshot())

    def update(self, parts: torch.Tensor, epoch: int, pos: int, limit: Any) -> None:
        """One local update of this process's workers on their batches of ``parts``."""
        t0 = time.perf_counter()
        batches = self.batches(parts, epoch, pos, limit)
        t1 = time.perf_counter()
        self.tot.data_seconds += t1 - t0
        self.phases["data"] += t1 - t0
        stats: dict = {}
        # bf16 autocast around the whole step: it only changes the forward's matmuls and
        # convolutions (backward follows their dtypes; SGD and averaging stay float32)
        with numerics.autocast(self.plan.precision, self.device):
            losses, action = self.engine.step(batches, nn.functional.cross_entropy, stats=stats,
                                              sync=False)
        self.account(losses, stats, action, time.perf_counter() - t1)

    def batches(self, parts: torch.Tensor, epoch: int, pos: int, limit: Any) -> list:
        """This process's workers' mini-batches of update ``pos`` of ``epoch`` (``parts``: the
        epoch's partition), in the run's dtype and layout, cut by ``limit``."""
        cfg = self.cfg
        batches = [(x.to(getattr(torch, cfg.dtype), memory_format=self.plan.layout), y) for x, y in
                   self.source.batches(parts, epoch, pos, self.ranks, self.engine.generators,
                                       cfg.local_batch)]
        if limit is not None and limit.batch is not None:
            batches = [(x[:limit.batch], y[:limit.batch]) for x, y in batches]
        return batches

    def account(self, losses: torch.Tensor, stats: dict, action: Any, step_s: float) -> None:
        """Book one update: its (unread) losses and stats, the host's ``step_s`` seconds in it
        and the schedule's ``action``."""
        tot = self.tot
        self.unread.add(losses, stats, step_s)
        if action.level is not None:
            tot.sync[action.level] += 1
        if action.allreduce_grads_level is not None:
            tot.gradsync[action.allreduce_grads_level] += 1
        tot.gossip += bool(action.gossip)
        tot.outer += bool(action.outer)

    def record(self, t: int) -> None:
        """The record after update ``t``: the test set, the training sums since the last one."""
        engine, tot, cfg, source = self.engine, self.tot, self.cfg, self.source
        t_eval = time.perf_counter()
        # each process evaluates its shard of the test batches (under torchrun: 1/K each); its
        # sums are read with the unread updates' in one host read (on CUDA, the device's
        # evaluation time lands in the compute phase's wait)
        pending = source.eval_sums(engine.averaged_model(), self.plan.layout,
                                   max(1, self.plan.threads), self.shard)
        self.phases["evaluate"] += time.perf_counter() - t_eval
        mine = pending.read(self.settle(pending.sums))
        acc, loss = combine_eval(engine.all_gather_object(mine))
        # the median worker of every step (mean of the middle two for even K), as if the K
        # workers ran in parallel; the median, not the slowest, keeps CPU scheduling noise out
        per_worker = [w for proc in engine.all_gather_object(tot.step_seconds) for w in proc]
        if per_worker and per_worker[0]:  # in Python: host numbers need no tensor (or read)
            tot.compute_seconds += sum(statistics.median(step) for step in zip(*per_worker))
        loss_sum, correct, seen = (sum(v) for v in zip(
            *engine.all_gather_object((tot.loss_sum, tot.correct, tot.seen)), strict=True))
        row = {
            "epoch": t * cfg.world_size * cfg.local_batch / source.n_train, "step": t,
            "lr_last": engine.current_lr(),
            "train_loss": loss_sum / max(seen, 1), "train_acc": 100.0 * correct / max(seen, 1),
            "test_loss": loss, "test_acc": acc,
            "compute_seconds": tot.compute_seconds, "data_seconds": tot.data_seconds,
            "param_bytes": engine.param_bytes, "train_images": source.n_train,
            "test_images": source.test_images,
        }
        for i, level in enumerate(cfg.topology().levels):
            row.update({f"group_l{i}": level.group_size, f"sync_l{i}": tot.sync[i],
                        f"gradsync_l{i}": tot.gradsync[i]})
        row.update({"gossip_rounds": tot.gossip, "outer_steps": tot.outer})
        self.records.append(row)
        tot.loss_sum, tot.correct, tot.seen = 0.0, 0, 0
        tot.step_seconds = [[] for _ in self.ranks]

    def report_phases(self, on_phases: Callable[[dict], None], t_loop: float,
                      updates: int) -> None:
        with contextlib.suppress(Exception):  # the loop's own error is the one to see
            self.settle()  # updates since the last record, when the loop ended early
        phases = self.phases
        phases["loop"] = (time.perf_counter() - t_loop
                          - sum(phases[p] for p in ("data", "compute", "engine", "evaluate")))
        on_phases({"first_rank": self.ranks[0], "torchrun": self.multi, "updates": updates,
                   "model": self.cfg.model, "world_size": self.cfg.world_size, **phases})

    def frame(self, t_start: float) -> pd.DataFrame:
        """The records, with the configuration (as it ran) in every row."""
        df = pd.DataFrame(self.records)
        clash = set(df.columns) & set(self.cfg.to_dict())
        assert not clash, f"record columns {clash} would be overwritten by config fields"
        for key, value in self.cfg.to_dict().items():
            df[key] = str(value) if isinstance(value, tuple | list) else value
        df["world_size"] = self.cfg.world_size
        df["wall_seconds"] = time.perf_counter() - t_start
        return df
