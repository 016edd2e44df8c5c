"""The one training loop of the deep-learning experiments (§4.2.1, Appendices C and D).

``train(TrainConfig(...))`` trains K workers with (hierarchical) local SGD on an image data set
and returns one tidy record per epoch. The loop talks to an *engine* (the in-process replica
engine here, sequential or batched; the torchrun runner runs the same loop) and never to
torch.distributed directly.

The recipe of §4.2.1 (ResNet-20 on CIFAR):

* every epoch the training set is reshuffled globally and split into K disjoint parts; worker k
  reads its local mini-batches of B_loc from its part (`localsgd.data.partition`);
* learning rate 0.1 (optionally scaled linearly with the global batch and warmed up gradually,
  App. C), divided by 10 when 50 % and 75 % of the samples are seen; momentum 0.9 without
  dampening applied to each local model; weight decay 1e-4, none on BatchNorm coefficients (§4.1);
* training stops when the workers *together* have seen as many samples as one worker in
  ``epochs`` epochs: T = epochs · N / (K · B_loc) updates per worker;
* each epoch the averaged model (w-bar, BatchNorm statistics averaged too) is evaluated on the test
  set; BatchNorm statistics are otherwise kept per worker (§4.1, following Goyal et al.).

Time: the loop measures compute seconds per step for every worker and records the median worker
(as if the K workers ran in parallel) plus the number of synchronisation rounds per level;
`localsgd.timing.cluster.modelled_time` adds modelled communication on a `Cluster`.

Checkpoints (``checkpoint_path``, `localsgd.checkpoint`): written atomically every
``checkpoint_every`` epochs and on Ctrl-C, loaded with ``weights_only=True``; a resumed run ends
bitwise equal to an uninterrupted one on CPU (same config, same seed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from localsgd import data as data_mod
from localsgd import device as device_rule
from localsgd import memory as memory_mod
from localsgd import models as models_mod
from localsgd import numerics
from localsgd.batch_sources import (
    MemoryBatches,
    StreamedBatches,
    combine_eval,
    evaluate,
    load_dataset,
)
from localsgd.checkpoint import CHECKPOINT_FORMAT, RankCheckpoints, load_checkpoint, save_checkpoint
from localsgd.engines import Engine
from localsgd.engines import packed as packing
from localsgd.engines.ddp import DDPEngine
from localsgd.engines.replicas import BatchedReplicaEngine, ReplicaEngine
from localsgd.lr import LRSchedule, milestones_from_fractions, warmup_iterations
from localsgd.outer import OuterUpdate
from localsgd.schedule import SyncSchedule
from localsgd.train_config import TrainConfig

__all__ = ["ENGINES", "RunLimit", "TrainConfig", "build_engine", "evaluate", "load_dataset",
           "lr_schedule", "train"]

# the loop's phases, in seconds, that `train` reports to ``on_phases``
LOOP_PHASES = ("setup", "data", "compute", "engine", "evaluate", "loop")


# ----------------------------------------------------------------------------------------------
# Building blocks
# ----------------------------------------------------------------------------------------------


def _steps(cfg: TrainConfig, n_train: int) -> tuple[int, int]:
    """(updates per data epoch, total updates T) for ``n_train`` training images."""
    per_worker = n_train // cfg.world_size
    steps_per_epoch = per_worker // cfg.local_batch
    if steps_per_epoch < 1:
        raise ValueError(
            f"local_batch={cfg.local_batch} is larger than a worker's share of the data "
            f"({n_train} images / K={cfg.world_size} = {per_worker}); use a smaller batch or "
            "more training images"
        )
    total = math.floor(cfg.epochs * n_train / (cfg.world_size * cfg.local_batch))
    return steps_per_epoch, max(total, 1)


def lr_schedule(cfg: TrainConfig, n_train: int) -> LRSchedule:
    """§4.2.1 step decay with App. C's linear scaling and gradual warm-up when configured."""
    _, total = _steps(cfg, n_train)
    peak = cfg.lr * cfg.world_size * cfg.local_batch / cfg.base_batch if cfg.scale_lr else cfg.lr
    warm = (warmup_iterations(n_train, cfg.world_size, cfg.local_batch, cfg.warmup_epochs)
            if cfg.warmup_epochs > 0 else 0)
    milestones = (milestones_from_fractions(total, cfg.decay_fractions)
                  if cfg.decay_fractions else [])
    return LRSchedule(peak_lr=peak, warmup_iters=warm, start_lr=cfg.lr if warm else None,
                      milestones=tuple(milestones))


ENGINES = ("replicas", "ddp")


def use_batched(cfg: TrainConfig, device: torch.device, replicas: bool = True) -> bool:
    """Whether ``cfg`` runs the batched replica engine: ``cfg.batched`` itself, or for 'auto':
    yes on CUDA for K >= 2 replicas in this process (``replicas``), no elsewhere."""
    if cfg.batched != "auto":
        return bool(cfg.batched)
    return replicas and device.type == "cuda" and cfg.world_size >= 2


def use_packed(cfg: TrainConfig, device: torch.device) -> bool:
    """Whether the batched engine packs ``cfg``'s replicas into channel groups: ``cfg.packed``
    itself, or for 'auto': yes on CUDA where the model supports it (`localsgd.engines.packed`)."""
    if cfg.packed != "auto":
        return bool(cfg.packed)
    if device.type != "cuda":
        return False
    with torch.device("meta"):  # the model's structure only: no memory, no init cost
        return packing.supports(models_mod.build_model(cfg.model, width=cfg.width))


def build_engine(cfg: TrainConfig, n_train: int, num_classes: int, kind: str = "replicas",
                 threads: int | None = None, **options: Any) -> Engine:
    """The engine for ``cfg``: ``kind="replicas"`` (sequential, or batched with
    ``cfg.batched``) in this process, or ``kind="ddp"``: this process's worker of a torchrun job
    (`localsgd.engines.ddp.DDPEngine`; ``options`` are its runner options, e.g. stragglers).
    ``threads``: the sequential engine's host threads (default ``cfg.host_threads`` or 1;
    `train` passes what `host_threads` resolved)."""
    if kind not in ENGINES:
        raise ValueError(f"engine kind {kind!r}; valid: {ENGINES}")
    if kind == "replicas" and options:
        raise ValueError(f"options {sorted(options)} belong to the ddp engine, not the replicas")
    if kind == "ddp" and cfg.peers_per_step != 1:
        raise ValueError(f"peers_per_step={cfg.peers_per_step}: the ddp engine gossips with one "
                         "peer per round; use peers_per_step=1 or the replicas engine")
    if kind == "ddp" and cfg.batched is True:
        raise ValueError("batched=True vmaps K replicas in one process; the ddp engine runs one "
                         "worker per process: set batched=False (or 'auto')")
    steps_per_epoch, _ = _steps(cfg, n_train)
    dtype = getattr(torch, cfg.dtype)
    schedule = SyncSchedule(
        cfg.topology(),
        warmup_steps=round(cfg.post_local_warmup_epochs * steps_per_epoch),
        local_step_warmup_epochs=cfg.local_step_warmup_epochs,
        steps_per_epoch=steps_per_epoch if cfg.local_step_warmup_epochs else None,
        outer_period=("global" if cfg.momentum_scheme in ("global", "hybrid")
                      else cfg.slowmo_frequency),
        post_local_gradient_allreduce=0 if cfg.block_gradient_allreduce else False,
        gossip=cfg.gossip,
    )
    local_m = cfg.momentum if cfg.momentum_scheme in ("local", "hybrid") else 0.0
    global_m = cfg.momentum if cfg.global_momentum is None else cfg.global_momentum
    outer = None
    if cfg.momentum_scheme in ("global", "hybrid"):
        outer = OuterUpdate(momentum=global_m)
    elif cfg.slowmo_frequency is not None:
        outer = OuterUpdate(momentum=cfg.slowmo_momentum, lr=cfg.slowmo_lr)

    def model_fn() -> nn.Module:
        return models_mod.build_model(cfg.model, num_classes=num_classes,
                                      width=cfg.width).to(dtype)

    mask = models_mod.no_weight_decay_mask(model_fn())

    def optimizer_fn(params: Any) -> torch.optim.Optimizer:
        groups = models_mod.param_groups(params, mask, cfg.weight_decay)
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=local_m, dampening=0.0,
                               nesterov=cfg.nesterov and local_m > 0)

    device = run_device(cfg)
    if kind == "ddp":
        return DDPEngine(model_fn, schedule, optimizer_fn, outer=outer,
                         lr_schedule=lr_schedule(cfg, n_train), seed=cfg.seed,
                         average_buffers=cfg.average_buffers, device=device,
                         num_classes=num_classes, **options)
    batched = use_batched(cfg, device)
    kw = ({"packed": cfg.packed, "compile": cfg.compile_replicas} if batched
          else {"threads": threads or max(1, cfg.host_threads)})
    engine_cls = BatchedReplicaEngine if batched else ReplicaEngine
    return engine_cls(model_fn, schedule, optimizer_fn, outer=outer,
                      lr_schedule=lr_schedule(cfg, n_train), seed=cfg.seed,
                      average_buffers=cfg.average_buffers, peers_per_step=cfg.peers_per_step,
                      device=device, **kw)


def host_threads(cfg: TrainConfig, device: torch.device, default_engine: bool = True) -> int:
    """Host threads a run of ``cfg`` spreads its replicas over (`TrainConfig.host_threads`,
    0 resolved from torch's intra-op threads now), or 0 where torch's threads are left alone:
    off the CPU, the batched engine, a single worker, or an engine ``train`` did not build."""
    if (device.type != "cpu" or use_batched(cfg, device) or not default_engine
            or (cfg.world_size < 2 and not cfg.host_threads)):
        return 0
    return cfg.host_threads or min(cfg.world_size, torch.get_num_threads())


def check_replica_memory(cfg: TrainConfig, num_classes: int, input_shape: tuple[int, ...],
                         free_bytes: int, reserve_bytes: int = 1 << 30) -> None:
    """Raise a ValueError naming the largest K that fits when the replica engine's K replicas
    (`localsgd.memory`'s estimate: parameters, gradients, optimizer and outer state, buffers,
    inputs, activations at B_loc; batched or sequential) need more than ``free_bytes`` less
    ``reserve_bytes`` (the CUDA context and allocator slack)."""
    dtype = getattr(torch, cfg.dtype)

    def model_fn() -> nn.Module:
        return models_mod.build_model(cfg.model, num_classes=num_classes, width=cfg.width)

    outer = cfg.momentum_scheme in ("global", "hybrid") or cfg.slowmo_frequency is not None
    batched = use_batched(cfg, torch.device("cuda"))  # this check runs for CUDA runs
    kw = {"batched": batched, "outer": outer,
          "optimizer": "sgd_momentum" if cfg.momentum > 0 else "sgd"}
    need = memory_mod.estimate_replica_memory(model_fn, cfg.world_size, cfg.local_batch,
                                              input_shape, dtype, **kw)
    if need <= free_bytes - reserve_bytes:
        return
    fit = memory_mod.max_replicas(model_fn, cfg.local_batch, input_shape, free_bytes, dtype,
                                  reserve_bytes=reserve_bytes, k_max=cfg.world_size, **kw)
    gib = 1 << 30
    raise ValueError(
        f"{cfg.world_size} {'batched ' if batched else ''}replicas of {cfg.model} (width "
        f"{cfg.width:g}) at B_loc = {cfg.local_batch} need about {need / gib:.1f} GiB of device "
        f"memory, {free_bytes / gib:.1f} GiB are free (keeping {reserve_bytes / gib:.1f} GiB "
        f"back): at most {fit} fit. Use batched=False (one replica's activations at a time), "
        "fewer workers, or the torchrun runner (one GPU per worker)")


def run_device(cfg: TrainConfig) -> torch.device:
    """The device of this process's workers by `localsgd.device`'s rule, as one process sees
    it: 'cuda' is cuda:0 for the replica engines (the torchrun runner has already placed its
    config on cuda:LOCAL_RANK); an absent GPU or index is a `DeviceError` naming the fix."""
    return device_rule.resolve_from_env(cfg.device, torchrun=False).device


# ----------------------------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------------------------


@dataclass
class _Totals:
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


class _Unread:
    """Updates whose losses, hit counts and event timings are still on the device: read
    together once per record (`settle`), so an update makes no host synchronisation on CUDA."""

    def __init__(self):
        self.rows: list[tuple[torch.Tensor, torch.Tensor | None, Any, float, float | None]] = []

    def add(self, losses: torch.Tensor, stats: dict, step_s: float) -> None:
        """One update: `Engine.step(..., sync=False)`'s losses and stats, its host seconds."""
        # with host threads the workers' spans overlap: the profile counts their wall time
        self.rows.append((losses, stats["correct"], stats["compute_seconds"], step_s,
                          stats.get("compute_wall_seconds")))

    def settle(self, tot: _Totals, phases: dict[str, float], images: int, workers: int,
               also: torch.Tensor | None = None) -> list[float]:
        """Add the unread updates to ``tot`` and ``phases``: one host read for all their losses
        and hits (Python sums in update order, as a per-update read would give), then their
        timings; ``images`` per worker and update, ``workers`` in this process. ``also``: more
        device values (a record's evaluation sums) read in the same host read; returned
        flattened, as float64."""
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
        compute, engine = phases["compute"], phases["engine"]
        for row, (_, _, seconds, step_s, busy) in zip(values, self.rows, strict=True):
            n = len(row) // 2
            loss_sum += sum(row[:n]) * images
            correct += int(sum(row[n:]))
            seen += workers * images
            per_worker = seconds.get()
            for times, sec in zip(step_seconds, per_worker, strict=True):
                times.append(sec)
            busy = busy if busy is not None else sum(per_worker)
            compute += busy
            engine += step_s - busy  # the host's time beyond the device's work
        self.rows.clear()
        tot.loss_sum, tot.correct, tot.seen, tot.step_seconds = loss_sum, correct, seen, \
            step_seconds
        phases["compute"] = compute
        phases["engine"] = engine + time.perf_counter() - t_wait  # + the wait for the device
        return flat[width * len(rows):]


@contextlib.contextmanager
def _deferred_interrupt():
    """Turn the first Ctrl-C into a flag checked between updates, so a checkpoint never holds a
    half-done step (some replicas updated, others not); a second Ctrl-C interrupts at once."""
    flag = {"set": False}
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, frame):
        if flag["set"]:
            raise KeyboardInterrupt
        flag["set"] = True

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


@dataclasses.dataclass(frozen=True)
class RunLimit:
    """Cut a run short: at most ``updates`` updates, ``batch`` samples of each worker's batch per
    update, ``eval_images`` test images per evaluation (None: uncut). The reproduction's dry runs
    of paper configurations (`localsgd.paper.dry_run`) use it to build every run at full size cheaply."""

    updates: int
    batch: int | None = None
    eval_images: int | None = None


def train(
    cfg: TrainConfig,
    *,
    dataset: data_mod.ImageDataset | None = None,
    checkpoint_path: str | Path | None = None,
    checkpoint_every: int = 0,
    resume: bool = True,
    progress: bool = True,
    on_step: Callable[[int], None] | None = None,
    engine: Callable[[TrainConfig, int, int], Engine] | None = None,
    checkpoint_every_steps: int = 0,
    limit: RunLimit | None = None,
    on_phases: Callable[[dict], None] | None = None,
) -> pd.DataFrame:
    """Train ``cfg`` and return ``cfg.records_per_epoch`` records per epoch (and one at the last
    update).

    Args:
        dataset: the data (default: ``load_image_dataset(cfg.dataset)`` reduced to
            ``cfg.n_train`` / ``cfg.n_test``).
        checkpoint_path: where to keep the run's checkpoint; with ``resume`` an existing one is
            continued (after checking it is this configuration's).
        checkpoint_every: also checkpoint every this many epochs (0: only on Ctrl-C).
        progress: show a tqdm progress bar (only rank 0 of a multi-process run shows one).
        on_step: called with t after every update (tests use it to interrupt a run).
        engine: builds the engine, ``engine(cfg, n_train, num_classes)`` (default
            `build_engine`: the replica engine); its ``step`` is called with ``sync=False``
            (`localsgd.engines.Engine.step`). An engine running one worker per process (the
            torchrun runner) gets per-rank checkpoint files (`RankCheckpoints`).
        checkpoint_every_steps: also checkpoint every this many updates (0: never).
        limit: cut the run short (`RunLimit`; None: train ``cfg`` whole).
        on_phases: called once when the loop ends (also by an error or Ctrl-C) with where its
            time went: seconds of ``setup``, ``data``, ``compute``, ``engine``, ``evaluate``
            and the rest of the ``loop``, plus ``updates`` run, ``first_rank``, ``torchrun``,
            ``model`` and ``world_size`` (the reproduction's profiler records them).

    Record columns: epoch (one worker's epochs), step, train_loss / train_acc (workers' mini-
    batches since the previous record, before each update, augmented), test_loss / test_acc
    (averaged model), lr_last (the lr of the record's last update), compute_seconds
    (cumulative, median worker per step), data_seconds (cumulative batch preparation),
    wall_seconds, and per level i: group_l{i}, sync_l{i} (model averages),
    gradsync_l{i} (gradient all-reduces); gossip_rounds and outer_steps; plus the config.

    On a CPU with K >= 2 replicas (`host_threads`) every op runs single-threaded for the run
    and the replicas (and evaluation batches) side by side; torch's thread count is restored
    afterwards.
    """
    device = run_device(cfg)  # a bad device fails here, before any data is loaded
    threads = host_threads(cfg, device, default_engine=engine is None)
    # the 'auto' fields decided for this device: the records show what ran; checkpoints keep
    # the configuration as asked (a resume compares with that)
    asked = cfg
    batched = use_batched(cfg, device, replicas=engine is None)
    cfg = dataclasses.replace(cfg, precision=numerics.resolve_precision(cfg.precision, device),
                              batched=batched, packed=batched and use_packed(cfg, device))
    saved_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(1)
    try:
        return _train(cfg, device, threads, dataset, checkpoint_path, checkpoint_every, resume,
                      progress, on_step, engine, checkpoint_every_steps, limit, on_phases,
                      asked)
    finally:
        torch.set_num_threads(saved_threads)


def _fit_on_gpu(cfg: TrainConfig, source: MemoryBatches | StreamedBatches,
                device: torch.device, asked: TrainConfig | None) -> TrainConfig:
    """``cfg`` if its K replicas fit the GPU's free memory, the sequential engine's ``cfg`` if
    'auto' chose the batched one and only that does not fit; else `check_replica_memory`'s
    error."""
    shape = ((3, cfg.image_size, cfg.image_size) if isinstance(source, StreamedBatches)
             else tuple(source.train_x.shape[1:]))
    free = torch.cuda.mem_get_info(device)[0]
    try:
        check_replica_memory(cfg, source.num_classes, shape, free)
    except ValueError:
        if not (asked is not None and asked.batched == "auto" and cfg.batched):
            raise
        # 'auto' chose the batched engine, whose K replicas' activations do not fit at once
        cfg = dataclasses.replace(cfg, batched=False, packed=False)
        print(f"batched replicas of {cfg.model} do not fit: running them one after another")
        check_replica_memory(cfg, source.num_classes, shape, free)
    return cfg


def _resume(state: dict, engine: Engine, cfg: TrainConfig, asked: TrainConfig | None,
            checkpoint_path: Any) -> tuple[list[dict], _Totals]:
    """Load a checkpoint's ``state`` into ``engine``; its records and totals. Fails in one line
    when 'auto' would now choose the other replica engine than the one that wrote it."""
    ran = state.get("ran", {})  # what 'auto' chose when the checkpoint was written
    if ran.get("batched", cfg.batched) != cfg.batched:
        written = "batched" if ran["batched"] else "sequential"
        raise ValueError(
            f"checkpoint {checkpoint_path} was written by the {written} replica engine, "
            f"this run would use the {'batched' if cfg.batched else 'sequential'} one "
            f"(batched: {asked.batched if asked else cfg.batched!r}); resume with "
            f"batched={ran['batched']}")
    engine.load_state_dict(state["engine"])
    return list(state["records"]), _Totals(**state["totals"])


def _train(cfg: TrainConfig, device: torch.device, threads: int, dataset, checkpoint_path,
           checkpoint_every, resume, progress, on_step, engine, checkpoint_every_steps, limit,
           on_phases, asked: TrainConfig | None = None) -> pd.DataFrame:
    """`train`'s body, with torch's threads already set for ``threads`` (0: left alone)."""
    t_start = time.perf_counter()
    precision = cfg.precision  # resolved by train()
    numerics.apply_numerics(precision, cfg.deterministic, device)
    layout = numerics.memory_format(cfg.memory_format, device)  # of every image batch
    ds = dataset if dataset is not None else load_dataset(cfg)
    source = (StreamedBatches(ds, cfg, device) if isinstance(ds, data_mod.ImageFolders)
              else MemoryBatches(ds, cfg, device))
    n_train = source.n_train
    steps_per_epoch, total = _steps(cfg, n_train)
    if limit is not None:
        total = min(total, limit.updates)
        source.eval_limit = limit.eval_images
    if device.type == "cuda" and engine is None:  # K replicas on one GPU: stop now, not at OOM
        cfg = _fit_on_gpu(cfg, source, device, asked)
    engine = (engine(cfg, n_train, source.num_classes) if engine is not None
              else build_engine(cfg, n_train, source.num_classes, threads=max(1, threads)))
    topo, k, b = cfg.topology(), cfg.world_size, cfg.local_batch
    dtype = getattr(torch, cfg.dtype)
    ranks = engine.local_ranks  # the workers this process runs (all K in the replica engine)
    # this process's evaluation shard: (0, 1) in the replica engine, (rank, K) under torchrun
    shard = (ranks[0] // len(ranks), engine.world_size // len(ranks))
    multi = ranks != list(range(engine.world_size))  # one worker per process: per-rank files
    per_rank = RankCheckpoints(checkpoint_path, engine) if multi and checkpoint_path else None

    records: list[dict] = []
    phases = dict.fromkeys(LOOP_PHASES, 0.0)  # where the time went: on_phases
    tot = _Totals(sync=[0] * topo.num_levels, gradsync=[0] * topo.num_levels,
                  step_seconds=[[] for _ in ranks])
    state = None
    if per_rank is not None and resume:
        state = per_rank.load_latest(asked or cfg)
    elif checkpoint_path is not None and resume and Path(checkpoint_path).is_file():
        state = load_checkpoint(checkpoint_path, asked or cfg)
    if state is not None:
        records, tot = _resume(state, engine, cfg, asked, checkpoint_path)
        if ranks[0] == 0:  # a resumed run says so, once: it never silently restarts
            print(f"resumed from update {engine.t} of {total} (checkpoint in "
                  f"{Path(checkpoint_path).parent})", flush=True)

    unread = _Unread()

    def settle(also: torch.Tensor | None = None) -> list[float]:
        return unread.settle(tot, phases, images=b, workers=len(ranks), also=also)

    def snapshot() -> dict:
        settle()
        return {"format": CHECKPOINT_FORMAT, "config": (asked or cfg).to_dict(),
                "ran": {"batched": cfg.batched, "precision": cfg.precision},
                "engine": engine.state_dict(),
                "records": records, "totals": dataclasses.asdict(tot)}

    def checkpoint() -> None:
        if per_rank is not None:
            per_rank.save(snapshot(), engine.t)
        else:
            save_checkpoint(checkpoint_path, snapshot())

    def record(t: int) -> None:
        t_eval = time.perf_counter()
        # each process evaluates its shard of the test batches (under torchrun: 1/K each); its
        # sums are read with the unread updates' in one host read (on CUDA, the device's
        # evaluation time lands in the engine phase's wait)
        pending = source.eval_sums(engine.averaged_model(), layout, max(1, threads), shard)
        phases["evaluate"] += time.perf_counter() - t_eval
        mine = pending.read(settle(pending.sums))
        acc, loss = combine_eval(engine.all_gather_object(mine))
        # the median worker of every step (mean of the middle two for even K), as if the K
        # workers ran in parallel; the median, not the slowest, keeps CPU scheduling noise out
        per_worker = [w for proc in engine.all_gather_object(tot.step_seconds) for w in proc]
        if per_worker and per_worker[0]:  # in Python: host numbers need no tensor (or read)
            tot.compute_seconds += sum(statistics.median(step) for step in zip(*per_worker))
        loss_sum, correct, seen = (sum(v) for v in zip(
            *engine.all_gather_object((tot.loss_sum, tot.correct, tot.seen)), strict=True))
        row = {
            "epoch": t * k * b / n_train, "step": t, "lr_last": engine.current_lr(),
            "train_loss": loss_sum / max(seen, 1), "train_acc": 100.0 * correct / max(seen, 1),
            "test_loss": loss, "test_acc": acc,
            "compute_seconds": tot.compute_seconds, "data_seconds": tot.data_seconds,
            "param_bytes": engine.param_bytes, "train_images": n_train,
            "test_images": source.test_images,
        }
        for i, level in enumerate(topo.levels):
            row.update({f"group_l{i}": level.group_size, f"sync_l{i}": tot.sync[i],
                        f"gradsync_l{i}": tot.gradsync[i]})
        row.update({"gossip_rounds": tot.gossip, "outer_steps": tot.outer})
        records.append(row)
        tot.loss_sum, tot.correct, tot.seen = 0.0, 0, 0
        tot.step_seconds = [[] for _ in ranks]

    partition_epoch, parts = -1, None
    # updates into an epoch at which a record is taken (0: the epoch's end)
    per = min(cfg.records_per_epoch, steps_per_epoch)
    marks = {round(i * steps_per_epoch / per) % steps_per_epoch for i in range(1, per + 1)}
    bar = tqdm(total=total, initial=engine.t, disable=not progress or ranks[0] != 0, leave=False,
               desc=f"{cfg.model} K={k} H={cfg.local_steps} B={b}",
               mininterval=2.0)  # a refresh is an output line in an executed notebook
    t_loop, t0_updates = time.perf_counter(), engine.t
    phases["setup"] = t_loop - t_start
    with _deferred_interrupt() as interrupt:
        try:
            while engine.t < total:
                t = engine.t  # completed updates; this step is update t + 1
                epoch, pos = divmod(t, steps_per_epoch)
                if epoch != partition_epoch:
                    parts = data_mod.partition(n_train, k, epoch, cfg.seed)
                    partition_epoch = epoch
                t0 = time.perf_counter()
                batches = [(x.to(dtype, memory_format=layout), y) for x, y in
                           source.batches(parts, epoch, pos, ranks, engine.generators, b)]
                if limit is not None and limit.batch is not None:
                    batches = [(x[:limit.batch], y[:limit.batch]) for x, y in batches]
                t1 = time.perf_counter()
                tot.data_seconds += t1 - t0
                phases["data"] += t1 - t0
                stats: dict = {}
                # bf16 autocast around the whole step: it only changes the forward's matmuls and
                # convolutions (backward follows their dtypes; SGD and averaging stay float32)
                with numerics.autocast(precision, device):
                    losses, action = engine.step(batches, nn.functional.cross_entropy,
                                                 stats=stats, sync=False)
                unread.add(losses, stats, time.perf_counter() - t1)
                if action.level is not None:
                    tot.sync[action.level] += 1
                if action.allreduce_grads_level is not None:
                    tot.gradsync[action.allreduce_grads_level] += 1
                tot.gossip += bool(action.gossip)
                tot.outer += bool(action.outer)
                bar.update(1)
                if engine.t % steps_per_epoch in marks or engine.t == total:
                    record(engine.t)
                    bar.set_postfix(train_acc=f"{records[-1]['train_acc']:.1f}",
                                    test_acc=f"{records[-1]['test_acc']:.1f}")
                    epochs_done, partial = divmod(engine.t, steps_per_epoch)
                    if (checkpoint_path is not None and checkpoint_every and not partial
                            and epochs_done % checkpoint_every == 0):
                        checkpoint()
                if (checkpoint_path is not None and checkpoint_every_steps
                        and engine.t % checkpoint_every_steps == 0):
                    checkpoint()
                if on_step is not None:
                    on_step(engine.t)
                if interrupt["set"]:
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            # one worker per process: the others may be at another step or gone, so no
            # consistent snapshot can be taken now; the last periodic one is the resume point
            if checkpoint_path is not None and not multi:
                save_checkpoint(checkpoint_path, snapshot())
                print(f"interrupted at update {engine.t}/{total}: checkpoint saved to "
                      f"{checkpoint_path}; run again with the same config to resume")
            raise
        finally:
            bar.close()
            if on_phases is not None:
                with contextlib.suppress(Exception):  # the loop's own error is the one to see
                    settle()  # updates since the last record, when the loop ended early
                phases["loop"] = (time.perf_counter() - t_loop
                                  - sum(phases[p] for p in ("data", "compute", "engine",
                                                            "evaluate")))
                on_phases({"first_rank": ranks[0], "torchrun": multi,
                           "updates": engine.t - t0_updates, "model": cfg.model,
                           "world_size": k, **phases})
    df = pd.DataFrame(records)
    clash = set(df.columns) & set(cfg.to_dict())
    assert not clash, f"record columns {clash} would be overwritten by config fields"
    for key, value in cfg.to_dict().items():
        df[key] = str(value) if isinstance(value, tuple | list) else value
    df["world_size"] = k
    df["wall_seconds"] = time.perf_counter() - t_start
    return df
