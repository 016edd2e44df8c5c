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

Checkpoints (``checkpoint_path``, `localsgd.training.checkpoint`): written atomically every
``checkpoint_every`` epochs and on Ctrl-C, loaded with ``weights_only=True``; a resumed run ends
bitwise equal to an uninterrupted one on CPU (same config, same seed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from localsgd import data as data_mod
from localsgd import models as models_mod
from localsgd import numerics
from localsgd.compression import Compression
from localsgd.engines import Engine
from localsgd.engines.batched import BatchedReplicaEngine
from localsgd.engines.ddp import DDPEngine
from localsgd.engines.replicas import ReplicaEngine
from localsgd.lr import LRSchedule, milestones_from_fractions, warmup_iterations
from localsgd.outer import OuterUpdate
from localsgd.schedule import SyncSchedule
from localsgd.training.batch_sources import (
    MemoryBatches,
    StreamedBatches,
    load_dataset,
)
from localsgd.training.checkpoint import load_checkpoint, save_checkpoint
from localsgd.training.config import TrainConfig
from localsgd.training.plan import RunPlan, fit_to_memory, plan_run
from localsgd.training.state import Run, Totals

__all__ = ["ENGINES", "EngineParts", "RunLimit", "build_engine", "engine_parts", "lr_schedule",
           "train", "update_counts"]



# ----------------------------------------------------------------------------------------------
# Building blocks
# ----------------------------------------------------------------------------------------------


def update_counts(cfg: TrainConfig, n_train: int) -> tuple[int, int]:
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
    _, total = update_counts(cfg, n_train)
    peak = cfg.lr * cfg.world_size * cfg.local_batch / cfg.base_batch if cfg.scale_lr else cfg.lr
    warm = (warmup_iterations(n_train, cfg.world_size, cfg.local_batch, cfg.warmup_epochs)
            if cfg.warmup_epochs > 0 else 0)
    milestones = (milestones_from_fractions(total, cfg.decay_fractions)
                  if cfg.decay_fractions else [])
    return LRSchedule(peak_lr=peak, warmup_iters=warm, start_lr=cfg.lr if warm else None,
                      milestones=tuple(milestones))


ENGINES = ("replicas", "ddp")


class EngineParts(NamedTuple):
    """What an engine of ``cfg`` is built from (`engine_parts`): the model, the schedule, the
    inner optimizer, the outer step, the learning-rate schedule, the seed and the averaging
    options; `build_engine` hands them to one engine, `localsgd.training.packs` to one run's rows
    of a pack."""

    model_fn: Callable[[], nn.Module]
    schedule: SyncSchedule
    optimizer_fn: Callable[[Any], torch.optim.Optimizer]
    outer: OuterUpdate | None
    lr_schedule: LRSchedule
    seed: int
    average_buffers: bool
    peers_per_step: int
    average_momentum: bool = False
    compression: Compression | None = None  # model averages as codes (None: exact)
    broadcast_buffers: bool = False
    check_consistency: bool = False  # SyncDriver's runtime check of the workers' parameters

    def apply_state_sync(self, comm: Any, driver: Any) -> None:
        """Set on ``comm`` (an engine's communicator) and ``driver`` (its `SyncDriver`) what a
        sync does beyond the parameters' average that their constructors do not take:
        compressed codes, broadcast buffers, the consistency check."""
        if self.compression is not None:
            comm.set_compression(self.compression)
        comm.broadcast_buffers = self.broadcast_buffers
        driver.check_consistency = self.check_consistency


def engine_parts(cfg: TrainConfig, n_train: int, num_classes: int) -> EngineParts:
    """`EngineParts` of ``cfg`` for ``n_train`` training images and ``num_classes``: Algorithm
    2's schedule (with the post-local and local-step warm-ups, SlowMo's or block momentum's outer
    period, SGP), the local momentum of ``momentum_scheme`` (App. D), weight decay off the
    BatchNorm coefficients (§4.1) and §4.2.1's lr schedule with App. C's tricks."""
    steps_per_epoch, _ = update_counts(cfg, n_train)
    lrs = lr_schedule(cfg, n_train)
    dtype = getattr(torch, cfg.dtype)
    schedule = cfg.sync_schedule(steps_per_epoch, lrs, update_counts(cfg, n_train)[1])
    local_m = cfg.momentum if cfg.momentum_scheme in ("local", "hybrid") else 0.0
    global_m = cfg.momentum if cfg.global_momentum is None else cfg.global_momentum
    outer = None
    if cfg.momentum_scheme in ("global", "hybrid"):
        outer = OuterUpdate(momentum=global_m, lr=cfg.global_lr, nesterov=cfg.global_nesterov,
                            delay=cfg.outer_delay)
    elif cfg.slowmo_frequency is not None:
        outer = OuterUpdate(momentum=cfg.slowmo_momentum, lr=cfg.slowmo_lr, delay=cfg.outer_delay)

    def model_fn() -> nn.Module:
        return models_mod.build_model(cfg.model, num_classes=num_classes,
                                      width=cfg.width).to(dtype)

    mask = models_mod.no_weight_decay_mask(model_fn())

    def optimizer_fn(params: Any) -> torch.optim.Optimizer:
        groups = models_mod.param_groups(params, mask, cfg.weight_decay)
        if cfg.optimizer == "adamw":  # decoupled weight decay on the same groups
            return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.adam_betas)
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=local_m, dampening=0.0,
                               nesterov=cfg.nesterov and local_m > 0)

    return EngineParts(model_fn, schedule, optimizer_fn, outer, lrs,
                       cfg.seed, cfg.average_buffers, cfg.peers_per_step, cfg.average_momentum,
                       None if cfg.average_compression == "fp32" else Compression(
                           cfg.average_compression, feedback=cfg.compression_feedback,
                           density=cfg.compression_density, seed=cfg.seed),
                       cfg.broadcast_buffers, cfg.check_consistency)


def build_engine(cfg: TrainConfig, n_train: int, num_classes: int, kind: str = "replicas",
                 plan: RunPlan | None = None, **options: Any) -> Engine:
    """The engine for ``cfg``: ``kind="replicas"`` (sequential, batched or packed as ``plan``
    says) in this process, or ``kind="ddp"``: this process's worker of a torchrun job
    (`localsgd.engines.ddp.DDPEngine`; ``options`` are its runner options, e.g. stragglers).
    ``plan``: how this machine runs it (default: `localsgd.training.plan.plan_run` of ``cfg``
    with runner ``'engine'`` for the replicas, ``'ddp'`` for ddp); its device, engine, host
    threads and compilation are used as they are."""
    if kind not in ENGINES:
        raise ValueError(f"engine kind {kind!r}; valid: {ENGINES}")
    if kind == "replicas" and options:
        raise ValueError(f"options {sorted(options)} belong to the ddp engine, not the replicas")
    if kind == "ddp" and cfg.peers_per_step != 1:
        raise ValueError(f"peers_per_step={cfg.peers_per_step}: the ddp engine gossips with one "
                         "peer per round; use peers_per_step=1 or the replicas engine")
    if plan is None:  # built on its own, outside `train`
        plan = plan_run(cfg, "engine" if kind == "replicas" else kind)
    parts = engine_parts(cfg, n_train, num_classes)
    if kind == "ddp":
        engine = DDPEngine(parts.model_fn, parts.schedule, parts.optimizer_fn, outer=parts.outer,
                         lr_schedule=parts.lr_schedule, seed=parts.seed,
                         average_buffers=parts.average_buffers,
                         average_momentum=parts.average_momentum, device=plan.device,
                         num_classes=num_classes, **options)
        parts.apply_state_sync(engine.comm, engine.driver)
        return engine
    kw = ({"packed": plan.packed, "compile": plan.compile} if plan.batched
          else {"threads": max(1, plan.threads)})
    engine_cls = BatchedReplicaEngine if plan.batched else ReplicaEngine
    engine = engine_cls(parts.model_fn, parts.schedule, parts.optimizer_fn, outer=parts.outer,
                        lr_schedule=parts.lr_schedule, seed=parts.seed,
                        average_buffers=parts.average_buffers,
                        average_momentum=parts.average_momentum,
                        peers_per_step=parts.peers_per_step, device=plan.device, **kw)
    parts.apply_state_sync(engine.comm, engine.driver)
    return engine


# ----------------------------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------------------------


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
    of paper configurations (`localsgd.paper.dry_run`) use it to build every run at full size
    cheaply."""

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
    plan: RunPlan | None = None,
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
            and the rest of the ``loop`` (they split the host's wall time; on CUDA compute is
            the host's wait for the device, `localsgd.training.state.Unread.settle`), the
            device's busy seconds beside them (``device_busy``), plus ``updates`` run,
            ``first_rank``, ``torchrun``, ``model`` and ``world_size`` (the reproduction's
            profiler records them).
        plan: how this machine runs ``cfg`` (default `localsgd.training.plan.plan_run` for the
            replica engine, or for ``engine``); the torchrun runner passes the plan of its
            placement.

    Record columns: epoch (one worker's epochs), step, train_loss / train_acc (workers' mini-
    batches since the previous record, before each update, augmented), test_loss / test_acc
    (averaged model), lr_last (the lr of the record's last update), compute_seconds
    (cumulative, median worker per step), data_seconds (cumulative batch preparation),
    wall_seconds, and per level i: group_l{i}, sync_l{i} (model averages),
    gradsync_l{i} (gradient all-reduces); gossip_rounds and outer_steps; plus the config.

    On a CPU with K >= 2 replicas (`RunPlan.threads`) every op runs single-threaded for the run
    and the replicas (and evaluation batches) side by side; torch's thread count is restored
    afterwards.
    """
    if plan is None:  # a bad device fails here, before any data is loaded
        plan = plan_run(cfg, "given" if engine is not None else "replicas")
    # the plan's process-wide settings: float32 matmul precision, deterministic kernels, threads
    numerics.apply_numerics(plan.precision, plan.deterministic, plan.device)
    saved_threads = torch.get_num_threads()
    if plan.threads:
        torch.set_num_threads(1)
    try:
        return _train(cfg, plan, dataset, checkpoint_path, checkpoint_every, resume, progress,
                      on_step, engine, checkpoint_every_steps, limit, on_phases)
    finally:
        torch.set_num_threads(saved_threads)


def _resume(state: dict, engine: Engine, plan: RunPlan, asked: TrainConfig,
            checkpoint_path: Any) -> tuple[list[dict], Totals]:
    """Load a checkpoint's ``state`` into ``engine``; its records and totals. Fails in one line
    when this machine's plan runs another replica engine than the one that wrote it."""
    ran = state.get("ran", {})  # the plan the checkpoint was written under
    if ran.get("batched", plan.batched) != plan.batched:
        written = "batched" if ran["batched"] else "sequential"
        raise ValueError(
            f"checkpoint {checkpoint_path} was written by the {written} replica engine, "
            f"this run would use the {'batched' if plan.batched else 'sequential'} one "
            f"(batched: {asked.batched!r}); resume with batched={ran['batched']}")
    engine.load_state_dict(state["engine"])
    return list(state["records"]), Totals(**state["totals"])


def _train(asked: TrainConfig, plan: RunPlan, dataset, checkpoint_path, checkpoint_every,
           resume, progress, on_step, engine, checkpoint_every_steps, limit,
           on_phases) -> pd.DataFrame:
    """`train`'s body, with torch's threads (``plan.threads``; 0: left alone) and numerics set;
    ``asked``: the config as asked (checkpoints keep it, a resume compares with it)."""
    t_start = time.perf_counter()
    device = plan.device
    ds = dataset if dataset is not None else load_dataset(asked)
    source = (StreamedBatches(ds, asked, device) if isinstance(ds, data_mod.ImageFolders)
              else MemoryBatches(ds, asked, device))
    steps_per_epoch, total = update_counts(asked, source.n_train)
    if limit is not None:
        total = min(total, limit.updates)
        source.eval_limit = limit.eval_images
    if device.type == "cuda" and engine is None:  # K replicas on one GPU: stop now, not at OOM
        shape = ((3, asked.image_size, asked.image_size) if isinstance(source, StreamedBatches)
                 else tuple(source.train_x.shape[1:]))
        plan = fit_to_memory(plan, asked, source.num_classes, shape,
                             torch.cuda.mem_get_info(device)[0])
    cfg = plan.applied(asked)  # the records show what ran
    engine = (engine(cfg, source.n_train, source.num_classes) if engine is not None
              else build_engine(cfg, source.n_train, source.num_classes, plan=plan))
    run = Run(cfg, asked, engine, source, plan, checkpoint_path)
    state = None
    if run.per_rank is not None and resume:
        state = run.per_rank.load_latest(asked)
    elif checkpoint_path is not None and resume and Path(checkpoint_path).is_file():
        state = load_checkpoint(checkpoint_path, asked)
    if state is not None:
        run.records, run.tot = _resume(state, engine, plan, asked, checkpoint_path)
        if run.ranks[0] == 0:  # a resumed run says so, once: it never silently restarts
            print(f"resumed from update {engine.t} of {total} (checkpoint in "
                  f"{Path(checkpoint_path).parent})", flush=True)

    partition_epoch, parts = -1, None
    # updates into an epoch at which a record is taken (0: the epoch's end)
    per = min(cfg.records_per_epoch, steps_per_epoch)
    marks = {round(i * steps_per_epoch / per) % steps_per_epoch for i in range(1, per + 1)}
    bar = tqdm(total=total, initial=engine.t, disable=not progress or run.ranks[0] != 0,
               leave=False, desc=f"{cfg.model} K={cfg.world_size} H={cfg.local_steps} "
               f"B={cfg.local_batch}", mininterval=2.0)  # a refresh: a line in a notebook
    t_loop, t0_updates = time.perf_counter(), engine.t
    run.phases["setup"] = t_loop - t_start
    with _deferred_interrupt() as interrupt:
        try:
            while engine.t < total:
                epoch, pos = divmod(engine.t, steps_per_epoch)  # this step is update t + 1
                if epoch != partition_epoch:
                    parts = data_mod.partition(source.n_train, cfg.world_size, epoch, cfg.seed)
                    partition_epoch = epoch
                run.update(parts, epoch, pos, limit)
                bar.update(1)
                if engine.t % steps_per_epoch in marks or engine.t == total:
                    run.record(engine.t)
                    bar.set_postfix(train_acc=f"{run.records[-1]['train_acc']:.1f}",
                                    test_acc=f"{run.records[-1]['test_acc']:.1f}")
                    epochs_done, partial = divmod(engine.t, steps_per_epoch)
                    if (checkpoint_path is not None and checkpoint_every and not partial
                            and epochs_done % checkpoint_every == 0):
                        run.checkpoint()
                if (checkpoint_path is not None and checkpoint_every_steps
                        and engine.t % checkpoint_every_steps == 0):
                    run.checkpoint()
                if on_step is not None:
                    on_step(engine.t)
                if interrupt["set"]:
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            # one worker per process: the others may be at another step or gone, so no
            # consistent snapshot can be taken now; the last periodic one is the resume point
            if checkpoint_path is not None and not run.multi:
                save_checkpoint(checkpoint_path, run.snapshot())
                print(f"interrupted at update {engine.t}/{total}: checkpoint saved to "
                      f"{checkpoint_path}; run again with the same config to resume")
            raise
        finally:
            bar.close()
            if on_phases is not None:
                run.report_phases(on_phases, t_loop, engine.t - t0_updates)
    return run.frame(t_start)
