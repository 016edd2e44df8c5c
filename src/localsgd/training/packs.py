"""`train_runs`: several training runs of one model, K and B_loc trained together as one
`localsgd.engines.run_pack.RunPack` (R·K replicas, one forward and backward per update), each
returning the records `localsgd.training.loop.train` would return for it alone.

What may differ between the runs of a pack is what a run does between forward passes
(`PER_RUN`: seed, schedule, learning rate, momentum, weight decay, outer step, SGP); everything
else -- the data, the model, K, B_loc, the length, the numerics -- is shared, and a difference
there is one ValueError line naming the field (`check_packable`). Each run keeps its own data
partition and augmentation streams (its seed), its own records and totals (`Run`), and is
evaluated on its own averaged model. Checkpoints hold every run of the pack, so a pack cut off
resumes (bitwise on a CPU, as `train`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from torch import nn
from tqdm.auto import tqdm

from localsgd import data as data_mod
from localsgd import numerics
from localsgd.engines.common import Deferred
from localsgd.engines.run_pack import RunPack
from localsgd.training.batch_sources import STREAMED, MemoryBatches, load_dataset
from localsgd.training.checkpoint import CHECKPOINT_FORMAT, read_state, save_checkpoint
from localsgd.training.config import TrainConfig
from localsgd.training.loop import RunLimit, engine_parts, update_counts
from localsgd.training.plan import plan_run
from localsgd.training.state import Run

__all__ = ["PER_RUN", "OutOfTime", "check_packable", "train_runs"]


class OutOfTime(Exception):
    """`train_runs` stopped at its ``deadline``, at an epoch's end, after saving the pack's
    checkpoint (``path``): the next call with the same configurations resumes there."""

    def __init__(self, path: Path, update: int, total: int):
        super().__init__(f"time budget spent at update {update} of {total}; checkpoint {path}")
        self.path, self.update, self.total = path, update, total

# the fields runs of one pack may differ in: what a run does between its forward passes
PER_RUN = frozenset({
    "seed", "local_steps", "block_size", "block_steps", "post_local_warmup_epochs",
    "local_step_warmup_epochs", "block_gradient_allreduce", "lr", "scale_lr", "base_batch",
    "warmup_epochs", "decay_fractions", "momentum", "momentum_scheme", "global_momentum",
    "global_lr", "global_nesterov", "outer_delay",
    "nesterov", "weight_decay", "average_buffers", "broadcast_buffers", "average_momentum",
    "average_compression", "fragments", "overlap_steps", "fragment_mixing", "worker_local_steps",
    "compression_feedback", "compression_density", "qsr_alpha", "churn_rate",
    "churn_away_rounds", "churn_rejoin", "quorum", "quorum_grace_steps", "quorum_stall_rate",
    "quorum_stall_steps", "optimizer", "adam_betas", "slowmo_frequency", "slowmo_momentum",
    "slowmo_lr", "gossip", "peers_per_step",
    # how a run is computed, not what: the pack decides (batched, packed on CUDA)
    "batched", "packed", "host_threads", "loader_workers", "check_consistency"})


def check_packable(cfgs: Sequence[TrainConfig]) -> None:
    """Raise one ValueError line when ``cfgs`` cannot share a pack: none, a streamed data set,
    or a field outside `PER_RUN` that differs (named, with its values)."""
    if not cfgs:
        raise ValueError("train_runs needs at least one configuration")
    first = cfgs[0].to_dict()
    for i, cfg in enumerate(cfgs[1:], 1):
        diff = {k: (first[k], v) for k, v in cfg.to_dict().items()
                if k not in PER_RUN and first[k] != v}
        if diff:
            name, (a, b) = next(iter(diff.items()))
            raise ValueError(f"run {i} cannot share a pack with run 0: {name} = {b!r}, run 0 has "
                             f"{a!r} (runs of a pack differ only in "
                             "localsgd.training.packs.PER_RUN: "
                             "seed, schedule, lr, momentum, weight decay, outer step)")
    if cfgs[0].dataset in STREAMED:
        raise ValueError(f"dataset={cfgs[0].dataset!r} is streamed from image folders; packs "
                         "hold their data in memory (CIFAR): train it with "
                         "localsgd.training.loop.train")


def train_runs(cfgs: Sequence[TrainConfig], *, dataset: data_mod.ImageDataset | None = None,
               checkpoint_path: str | Path | None = None, checkpoint_every: int = 0,
               resume: bool = True, progress: bool = True,
               limit: RunLimit | None = None,
               deadline: float | None = None) -> list[pd.DataFrame]:
    """Train ``cfgs`` as one pack and return each run's records, as `localsgd.training.loop.train`
    would for the run alone (its ``batched`` column says True: the pack is the batched engine,
    vmapped, or packed where ``packed`` says so on CUDA).

    ``checkpoint_path``: the pack's checkpoint, written every ``checkpoint_every`` epochs and on
    Ctrl-C, continued when ``resume`` and it holds these configurations. ``limit``: cut the runs
    short (`localsgd.training.loop.RunLimit`). ``deadline`` (a `time.monotonic` value, needs
    ``checkpoint_path``): past it, at the next epoch's end, the checkpoint is written and
    `OutOfTime` raised, so a GPU lent for minutes leaves work the next one resumes."""
    if deadline is not None and checkpoint_path is None:
        raise ValueError("deadline needs checkpoint_path: a run stopped by time resumes there")
    check_packable(cfgs)
    asked = list(cfgs)
    plan = plan_run(asked[0], "pack")  # `check_packable`: one plan serves every run
    device = plan.device
    cfgs = [plan.applied(c) for c in asked]
    t_start = time.perf_counter()
    numerics.apply_numerics(plan.precision, plan.deterministic, device)
    ds = dataset if dataset is not None else load_dataset(cfgs[0])
    source = MemoryBatches(ds, cfgs[0], device)
    steps_per_epoch, total = update_counts(cfgs[0], source.n_train)
    if limit is not None:
        total = min(total, limit.updates)
        source.eval_limit = limit.eval_images
    pack = RunPack([engine_parts(c, source.n_train, source.num_classes) for c in cfgs], device,
                   packed=plan.packed, compile=plan.compile)
    # each run its own source: its epoch's partition is cached there (the data is shared)
    runs = [Run(cfg, a, eng, copy.copy(source), plan, None)
            for cfg, a, eng in zip(cfgs, asked, pack.runs, strict=True)]
    if checkpoint_path is not None and resume and Path(checkpoint_path).is_file():
        _resume(runs, pack, checkpoint_path)
        print(f"resumed a pack of {len(runs)} runs from update {pack.t} of {total}", flush=True)
    k, per = cfgs[0].world_size, min(cfgs[0].records_per_epoch, steps_per_epoch)
    marks = {round(i * steps_per_epoch / per) % steps_per_epoch for i in range(1, per + 1)}
    bar = tqdm(total=total, initial=pack.t, disable=not progress, leave=False, mininterval=2.0,
               desc=f"{len(runs)} runs of {cfgs[0].model} K={k} B={cfgs[0].local_batch}")
    partition_epoch, parts = -1, None
    try:
        while pack.t < total:
            epoch, pos = divmod(pack.t, steps_per_epoch)
            if epoch != partition_epoch:  # each run's own §4.2.1 partition (its seed)
                parts = [data_mod.partition(source.n_train, k, epoch, c.seed) for c in cfgs]
                partition_epoch = epoch
            t0 = time.perf_counter()
            batches = [b for run, p in zip(runs, parts, strict=True)
                       for b in run.batches(p, epoch, pos, limit)]
            t1 = time.perf_counter()
            stats: dict = {}
            with numerics.autocast(plan.precision, device):
                losses, actions = pack.step(batches, nn.functional.cross_entropy, stats=stats)
            step_s = time.perf_counter() - t1
            for r, (run, action) in enumerate(zip(runs, actions, strict=True)):
                rows = slice(r * k, (r + 1) * k)
                run.tot.data_seconds += (t1 - t0) / len(runs)
                run.phases["data"] += (t1 - t0) / len(runs)
                run.account(losses[rows], _run_stats(stats, rows), action, step_s / len(runs))
            bar.update(1)
            if pack.t % steps_per_epoch in marks or pack.t == total:
                for run in runs:
                    run.record(pack.t)
                epochs_done, partial = divmod(pack.t, steps_per_epoch)
                if (checkpoint_path is not None and checkpoint_every and not partial
                        and epochs_done % checkpoint_every == 0):
                    save_checkpoint(checkpoint_path, _snapshot(runs))
                if (deadline is not None and not partial and pack.t < total
                        and time.monotonic() > deadline):
                    save_checkpoint(checkpoint_path, _snapshot(runs))
                    raise OutOfTime(Path(checkpoint_path), pack.t, total)
    except KeyboardInterrupt:
        if checkpoint_path is not None:
            save_checkpoint(checkpoint_path, _snapshot(runs))
            print(f"interrupted at update {pack.t}/{total}: the pack's checkpoint is in "
                  f"{checkpoint_path}; run again with the same configurations to resume")
        raise
    finally:
        bar.close()
    return [run.frame(t_start) for run in runs]


def _run_stats(stats: dict, rows: slice) -> dict:
    """Run ``rows``'s share of the pack's step stats (hits per replica, seconds per worker)."""
    correct, seconds = stats["correct"], stats["compute_seconds"]
    return {"correct": None if correct is None else correct[rows],
            "compute_seconds": Deferred(lambda: seconds.get()[rows])}


def _snapshot(runs: list[Run]) -> dict:
    return {"format": CHECKPOINT_FORMAT, "pack": [run.snapshot() for run in runs]}


def _resume(runs: list[Run], pack: RunPack, path: str | Path) -> None:
    """Load a pack checkpoint written for these runs (one ValueError line otherwise)."""
    state = read_state(path, "a pack checkpoint")
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT \
            or not isinstance(state.get("pack"), list):
        raise ValueError(f"checkpoint {path} is not a pack checkpoint (format "
                         f"{CHECKPOINT_FORMAT}); delete it or use another path")
    saved = state["pack"]
    mine = [(run.asked or run.cfg).to_dict() for run in runs]
    theirs = [s.get("config") if isinstance(s, dict) else None for s in saved]
    if [_plain(c) for c in theirs] != [_plain(c) for c in mine]:
        raise ValueError(f"checkpoint {path} holds another pack of runs; resume with the same "
                         "configurations in the same order or use another checkpoint_path")
    pack.load_state_dict({"runs": [s["engine"] for s in saved]})
    for run, s in zip(runs, saved, strict=True):
        run.records = list(s["records"])
        for key, value in s["totals"].items():
            setattr(run.tot, key, value)


def _plain(cfg: dict | None) -> Any:
    return None if cfg is None else {k: list(v) if isinstance(v, tuple) else v
                                     for k, v in cfg.items()}
