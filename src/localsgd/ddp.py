"""The torchrun runner: `localsgd.train.train` on one process per worker, with DDP.

Launch (one machine; ``localsgd train --engine ddp`` starts this for you)::

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 4 -m localsgd.ddp \\
        --config run.yaml --out runs/demo

`DDPEngine` has the replica engines' surface (``step``, ``t``, ``world_size``, ``local_ranks``,
``generators``, ``current_lr``, ``averaged_model``, ``param_bytes``, ``all_gather_object``,
``state_dict``), so the one training loop runs unchanged (DESIGN.md: one loop, two engines):

* **Gradients are averaged by DistributedDataParallel** -- mini-batch SGD, the post-local SGD
  warm-up (Lin et al., Sec. 3 "post-local SGD") and the PyTorch hierarchical-SGD blog's
  intra-host gradient all-reduce -- through a communication hook that follows the
  `SyncSchedule`: each bucket is averaged inside the rank's group of the step's gradient level,
  bucketed and overlapped with backward; on steps where the schedule averages no gradients the
  backward runs under ``no_sync()``, so no collective runs at all.
* **Models are averaged by the core's averagers** (`DistributedCommunicator` on a persistent
  flat buffer, Eq. (4)/(5), Algorithms 1-2) driven by the shared `SyncDriver`, including the
  outer (block-momentum) step of App. D.1.2.
* ``broadcast_buffers=False``: the project either averages BatchNorm statistics at syncs or keeps
  them per worker (Sec. 4.1); DDP's default would overwrite them with rank 0's every forward.

Per step and worker it records wall-clock timestamps (`timeline`), from which
`localsgd.timing.split_waiting` splits each step into compute, waiting and communication; it
emulates stragglers (`localsgd.timing.Stragglers`, the blog's experiment) and, with
``compute_ms``, replaces the model's compute by a sleep so 8-16 processes fit on 2 cores.

``--compile MODE`` compiles the DDP model with ``torch._dynamo.config.optimize_ddp = MODE``
("TorchDynamo Update 9: Making DDP Work with TorchDynamo": DDPOptimizer splits the graph at
bucket boundaries to keep the overlap); ``--compare-eager`` trains eager then compiled from one
seed and compares per-step time and loss curves. ``--sweep FILE`` trains a list of
configurations one after another in one launch (one torch start-up for a whole grid: what
`localsgd.validation` runs to check the timing model). Checkpoints are per rank (`RankCheckpoints` in
`localsgd.train`); a resume after SIGKILL of every worker is bitwise exact on CPU/gloo.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import os
import sys
import time
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from localsgd.averaging import DistributedCommunicator, _all_reduce_mean, float_buffers
from localsgd.outer import OuterUpdate
from localsgd.replicas import _clone_tensors, _correct, worker_generator
from localsgd.schedule import Action, SyncDriver, SyncSchedule
from localsgd.timing import Stragglers

__all__ = ["COMPILE_MODES", "SWEEP_OPTIONS", "DDPEngine", "main", "sweep_runs"]

Batch = tuple[torch.Tensor, torch.Tensor]
COMPILE_MODES = ("ddp_optimizer", "no_optimization", "python_reducer")


class _EmulatedCompute(nn.Module):
    """Sleep ``seconds`` instead of running the model; every trainable parameter still gets a
    (zero) gradient, so DDP's buckets and the averagers move the real model's bytes."""

    def __init__(self, model: nn.Module, seconds: float, num_classes: int):
        super().__init__()
        self.model, self.seconds, self.num_classes = model, seconds, num_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        touch = sum(p.view(-1)[:1].sum() for p in self.model.parameters() if p.requires_grad)
        return x.new_zeros(x.shape[0], self.num_classes) + 0.0 * touch


class _GradHookState:
    """What the comm hook needs: the groups per level and this step's gradient level."""

    def __init__(self, groups: Sequence[Any], sizes: Sequence[int]):
        self.groups, self.sizes = list(groups), list(sizes)
        self.level: int | None = None
        self.arrive: float | None = None  # when the last bucket became ready (wall clock)
        self.bytes = 0


def schedule_grad_hook(state, bucket):  # no annotations: DDP compares them with real classes
    """DDP communication hook: average the bucket (a ``dist.GradBucket``) inside this rank's
    group of the step's gradient level (``state.level``, set by the engine from
    ``SyncSchedule.action``); returns a future of the averaged bucket tensor."""
    buf = bucket.buffer()
    state.arrive = time.time()
    if state.level is None:  # the engine runs such steps under no_sync(); never communicate
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(buf)
        return fut
    state.bytes += buf.numel() * buf.element_size()
    work = _all_reduce_mean(buf, state.sizes[state.level], state.groups[state.level])
    return work.get_future().then(lambda f: f.value()[0])


class _DDPCommunicator(DistributedCommunicator):
    """`DistributedCommunicator` whose gradient all-reduce already happened inside DDP's
    backward (the comm hook), so the driver's ``before_step`` must not repeat it."""

    def allreduce_grads(self, level: int) -> None:
        return None


class DDPEngine:
    """One worker of a torchrun job: DDP for gradient averaging, the core's averagers for model
    averaging, the shared `SyncDriver` for the schedule (see module docstring).

    Args mirror `localsgd.replicas.ReplicaEngine` (model_fn is called under
    ``torch.manual_seed(seed)`` on every rank, so all workers start identical, Algorithm 1 line
    1; worker k's stream is seeded ``seed + k``), plus:
        stragglers: emulated stalls (`localsgd.timing.Stragglers`), slept between the loss and
            the backward pass as in the blog's snippet.
        compute_ms: if > 0, sleep this long instead of the model's forward/backward.
        num_classes: output width of the emulated model (needed with ``compute_ms``).
        compile: None (eager) or a ``torch._dynamo.config.optimize_ddp`` mode of
            `COMPILE_MODES`; the DDP-wrapped model is ``torch.compile``d with ``compile_backend``.
        bucket_cap_mb: DDP's bucket size.
    """

    def __init__(
        self,
        model_fn: Callable[[], nn.Module],
        schedule: SyncSchedule,
        optimizer_fn: Callable[[Any], torch.optim.Optimizer],
        outer: OuterUpdate | None = None,
        lr_schedule: Callable[[int], float] | None = None,
        seed: int = 0,
        average_buffers: bool = False,
        device: str | torch.device = "cpu",
        *,
        stragglers: Stragglers | None = None,
        compute_ms: float = 0.0,
        num_classes: int | None = None,
        compile: str | None = None,
        compile_backend: str = "inductor",
        bucket_cap_mb: float = 25.0,
    ):
        from torch.nn.parallel import DistributedDataParallel

        if not dist.is_initialized():
            raise ValueError("DDPEngine needs a process group: launch under torchrun "
                             "(`torchrun --nproc-per-node K -m localsgd.ddp ...`) or call "
                             "localsgd.distributed.init_from_env() first")
        world = dist.get_world_size()
        topo = schedule.topology
        if topo.world_size != world:
            raise ValueError(f"the schedule is for {topo.world_size} workers but the process "
                             f"group has {world}; launch {topo.world_size} processes")
        if compute_ms < 0:
            raise ValueError(f"compute_ms={compute_ms}: must be >= 0 (0 runs the model)")
        if compute_ms and num_classes is None:
            raise ValueError("compute_ms > 0 needs num_classes (the emulated output width)")
        if compile is not None and compile not in COMPILE_MODES:
            raise ValueError(f"compile={compile!r}; valid optimize_ddp modes: {COMPILE_MODES}")
        self.rank = dist.get_rank()
        self.schedule, self.seed, self.lr_schedule = schedule, int(seed), lr_schedule
        self.device = torch.device(device)
        self.stragglers = stragglers or Stragglers()
        torch.manual_seed(self.seed)
        model = model_fn().to(self.device)
        self._template = copy.deepcopy(model)  # plain tensors: the skeleton of averaged_model
        self.model = model
        self.comm = _DDPCommunicator(topo, model, average_buffers=average_buffers)
        self.optimizer = optimizer_fn(model.parameters())  # after adoption: sees final tensors
        self.driver = SyncDriver(schedule, self.comm, outer)
        self.generators = [worker_generator(self.seed, self.rank)]
        self._sizes = [lv.group_size for lv in topo.levels]
        self._hook = _GradHookState(self.comm.groups, self._sizes)
        module = (_EmulatedCompute(model, compute_ms / 1000.0, num_classes) if compute_ms
                  else model)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        # forward_sync_buffers=False (torch <2.14: broadcast_buffers=False): buffers are averaged
        # by the schedule or kept per worker, never overwritten by rank 0's each forward. The
        # init-time sync DDP still does is a no-op: every rank built the same model from `seed`.
        self.ddp = DistributedDataParallel(module, device_ids=device_ids,
                                           forward_sync_buffers=False, bucket_cap_mb=bucket_cap_mb)
        self.ddp.register_comm_hook(self._hook, schedule_grad_hook)
        self.compile_mode = compile
        self._forward: Callable = self.ddp
        if compile is not None:
            torch._dynamo.config.optimize_ddp = compile
            if compile == "python_reducer":
                # the Python reducer runs inside compiled autograd, which calls comm hooks as
                # hook(state, (grad, param)); ours averages DDP's C++ buckets, so refuse
                raise ValueError(
                    "compile='python_reducer' replaces DDP's bucketed C++ reducer (and its comm "
                    "hooks) by compiled autograd, so the schedule's per-level gradient hook "
                    "cannot run there; use 'ddp_optimizer' or 'no_optimization'")
            self._forward = torch.compile(self.ddp, backend=compile_backend)
        avg_bytes = self.param_bytes + (
            sum(b.numel() * b.element_size() for b in float_buffers(model))
            if average_buffers else 0)
        self._avg_bytes = avg_bytes
        self.timeline: list[dict] = []

    # -- the surface train() uses ----------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self.schedule.topology.world_size

    @property
    def t(self) -> int:
        """Completed local updates."""
        return self.driver.t

    @property
    def local_ranks(self) -> list[int]:
        """The one worker this process runs."""
        return [self.rank]

    @property
    def param_bytes(self) -> int:
        """Bytes of one worker's parameters: what one model average moves."""
        flat = self.comm.flat_params()
        return int(flat.numel() * flat.element_size())

    def current_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def all_gather_object(self, obj: Any) -> list:
        """``obj`` from every process, in rank order (collective)."""
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out

    def step(self, batches: Sequence[Batch], loss_fn, stats: dict | None = None
             ) -> tuple[list[float], Action]:
        """One local update of this worker (``batches`` = [its (inputs, targets)]), then whatever
        the schedule says. Same contract as `ReplicaEngine.step` for one worker;
        ``stats["compute_seconds"]`` excludes waiting and communication (see `timeline`)."""
        if len(batches) != 1:
            raise ValueError(f"a DDP worker takes one batch per step (its own), got {len(batches)}")
        (x, y), = batches
        if self.lr_schedule is not None:
            lr = float(self.lr_schedule(self.t))
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        t = self.t + 1
        glevel = self.schedule.action(t).allreduce_grads_level
        if glevel is not None and self._sizes[glevel] == 1:
            glevel = None
        hook = self._hook
        hook.level, hook.arrive, hook.bytes = glevel, None, 0
        start = time.time()
        if not self.ddp.training:
            self.ddp.train()
        self.optimizer.zero_grad(set_to_none=True)
        with contextlib.nullcontext() if glevel is not None else self.ddp.no_sync():
            out = self._forward(x)
            loss = loss_fn(out, y)
            stall = self.stragglers.stall(self.rank, t)
            if stall:
                time.sleep(stall)  # the blog's emulation: after the loss, before backward
            loss.backward()
        backward_end = time.time()
        self.driver.before_step()  # gradients were averaged by the hook during backward
        self.optimizer.step()
        opt_end = time.time()
        action = self.driver.after_step(self.current_lr())
        end = time.time()
        level = action.level if action.level is not None and self._sizes[action.level] > 1 \
            else None
        synced = level is not None or action.gossip
        grad_arrive = (hook.arrive if hook.arrive is not None else backward_end) \
            if glevel is not None else None
        compute = ((grad_arrive if glevel is not None else backward_end) - start
                   + opt_end - backward_end + (0.0 if synced else end - opt_end))
        self.timeline.append({
            "step": t, "rank": self.rank, "start": start, "end": end, "wall_s": end - start,
            "compute_s": compute, "stall_s": stall,
            "grad_level": glevel, "grad_arrive": grad_arrive,
            "grad_end": backward_end if glevel is not None else None,
            "grad_bytes": hook.bytes,
            "avg_level": level, "avg_arrive": opt_end if synced else None,
            "avg_end": end if synced else None,
            "avg_bytes": self._avg_bytes if level is not None else 0,
            "outer": bool(action.outer),
        })
        if stats is not None:
            c = _correct(out, y, 1)
            stats["correct"] = [None if c is None else int(c)]
            stats["compute_seconds"] = [compute]
        return [float(loss.detach())], action

    @torch.no_grad()
    def averaged_model(self) -> nn.Module:
        """A copy of the model holding the average over all workers (trainable parameters and
        float buffers; integer buffers from this worker): w-bar of Sec. 3.3. Collective."""
        model = copy.deepcopy(self._template)
        model.load_state_dict(self.model.state_dict())
        tensors = ([p for p in model.parameters() if p.requires_grad]
                   + [b for b in model.buffers() if b.is_floating_point()])
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for tensor in tensors:
            by_dtype.setdefault(tensor.dtype, []).append(tensor)
        for group in by_dtype.values():  # same order on every rank: dtypes appear identically
            flat = torch.cat([t.reshape(-1) for t in group])
            _all_reduce_mean(flat, dist.get_world_size(), None).wait()
            offset = 0
            for tensor in group:
                tensor.copy_(flat[offset:offset + tensor.numel()].view_as(tensor))
                offset += tensor.numel()
        return model

    def state_dict(self) -> dict:
        """Everything an exact resume needs (tensors cloned: the model aliases the flat buffer):
        model (parameters + buffers), inner optimizer, schedule step + outer state, push-sum
        weight, this worker's data stream, torch's RNG and the timing timeline."""
        return _clone_tensors({
            "rank": self.rank, "world_size": self.world_size,
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "driver": self.driver.state_dict(), "comm": self.comm.state_dict(),
            "generators": [g.get_state() for g in self.generators],
            "torch_rng": torch.get_rng_state(), "timeline": list(self.timeline),
        })

    def load_state_dict(self, state: dict) -> None:
        if (state.get("rank"), state.get("world_size")) != (self.rank, self.world_size):
            raise ValueError(
                f"checkpoint holds rank {state.get('rank')} of {state.get('world_size')} workers "
                f"but this process is rank {self.rank} of {self.world_size}; resume with the "
                "saved world size and each rank's own file")
        self.model.load_state_dict(state["model"])  # in place: stays a view of the flat buffer
        self.optimizer.load_state_dict(state["optimizer"])
        self.driver.load_state_dict(state["driver"])
        self.comm.load_state_dict(state["comm"])
        for g, s in zip(self.generators, state["generators"], strict=True):
            g.set_state(s)
        torch.set_rng_state(state["torch_rng"])
        self.timeline = list(state["timeline"])


# ------------------------------------------------------------------------------------------------
# Command line: TrainConfig from YAML + flags, runner options, validation before any training
# ------------------------------------------------------------------------------------------------


def _field_parser(hint: Any) -> Callable[[str], Any]:
    args = typing.get_args(hint)
    if hint is bool:
        def parse_bool(text: str) -> bool:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise argparse.ArgumentTypeError(f"{text!r} is not a boolean (true/false)")
        return parse_bool
    if typing.get_origin(hint) is tuple:
        return lambda text: tuple(float(v) for v in text.split(",") if v.strip())
    if type(None) in args:
        inner = next(a for a in args if a is not type(None))
        return lambda text: None if text.lower() == "none" else inner(text)
    return hint


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by ``python -m localsgd.ddp`` and ``localsgd train``: every `TrainConfig`
    field as ``--field-name`` (overriding ``--config``), plus the runner's own options."""
    from localsgd.train import TrainConfig

    p.add_argument("--config", type=Path, help="YAML file of TrainConfig fields")
    cfg = p.add_argument_group("TrainConfig fields (override --config)")
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        cfg.add_argument(f"--{f.name.replace('_', '-')}", dest=f"cfg_{f.name}",
                         type=_field_parser(hints[f.name]), default=argparse.SUPPRESS,
                         metavar="V",
                         help=f"default {f.default!r}")
    r = p.add_argument_group("runner")
    r.add_argument("--nodes", type=int, help="nodes (world = nodes x procs-per-node)")
    r.add_argument("--procs-per-node", type=int,
                   help="processes per node = block_size K' (the node-level group)")
    r.add_argument("--out", type=Path, default=Path("runs/train"),
                   help="output folder: records.csv, timing.csv, summary.json, checkpoints/")
    r.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                   help="checkpoint every N updates (per-rank files, written atomically)")
    r.add_argument("--resume", action="store_true",
                   help="continue from the last complete checkpoint in --out")
    r.add_argument("--straggler-seconds", type=float, default=0.0)
    r.add_argument("--straggler-rate", type=float, default=0.0,
                   help="probability that a worker stalls at a step (independent, seeded)")
    r.add_argument("--straggler-ranks", type=lambda s: tuple(int(v) for v in s.split(",") if v),
                   default=(), help="comma-separated ranks that stall at every step")
    r.add_argument("--compute-ms", type=float, default=0.0,
                   help="emulated compute: sleep this long per step instead of the model")
    r.add_argument("--compile", choices=COMPILE_MODES, default=None,
                   help="torch.compile the DDP model with this optimize_ddp mode")
    r.add_argument("--compile-backend", default="inductor",
                   help="torch.compile backend (inductor; aot_eager traces without codegen)")
    r.add_argument("--compare-eager", action="store_true",
                   help="with --compile: train eager, then compiled, from the same seed; report "
                   "both per-step times and check the loss curves agree (out/compare.json)")
    r.add_argument("--loss-rtol", type=float, default=1e-2,
                   help="--compare-eager: largest relative per-epoch train-loss difference")
    r.add_argument("--bucket-cap-mb", type=float, default=25.0)
    r.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                   help="process-group backend (default: nccl with CUDA, else gloo)")
    r.add_argument("--save-final", action="store_true",
                   help="write each rank's final model to final_rank{r}.pt")
    r.add_argument("--no-progress", action="store_true")


def config_values(args: argparse.Namespace) -> dict:
    """TrainConfig values: the YAML file, then the flags given."""
    import yaml

    values: dict = {}
    if args.config is not None:
        loaded = yaml.safe_load(args.config.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{args.config}: expected a mapping of TrainConfig fields")
        values.update(loaded)
    for key, value in vars(args).items():
        if key.startswith("cfg_"):  # present only when given (default=SUPPRESS): None counts
            values[key[4:]] = value
    return values


def resolve_config(args: argparse.Namespace, world_size: int | None):
    """The run's TrainConfig, checked against the launched world size (None: no launch yet)."""
    from localsgd.train import TrainConfig

    values = config_values(args)
    if args.procs_per_node is not None:
        values["block_size"] = args.procs_per_node
    if args.nodes is not None and args.procs_per_node is not None:
        expected = args.nodes * args.procs_per_node
        if values.get("world_size", expected) != expected:
            raise ValueError(f"--nodes {args.nodes} x --procs-per-node {args.procs_per_node} = "
                             f"{expected} workers, but world_size={values['world_size']}; drop "
                             "one of them")
        values["world_size"] = expected
    if world_size is not None:
        values.setdefault("world_size", world_size)
        if values["world_size"] != world_size:
            k = values["world_size"]
            p = values.get("block_size")
            fit = (f"; with {p} processes per node the world sizes that fit are multiples of {p} "
                   f"({', '.join(str(p * n) for n in range(1, 5))}, ...)" if p else "")
            raise ValueError(
                f"torchrun started {world_size} processes but the run needs world_size={k}: "
                f"launch with --nproc-per-node {k} (one machine) or --nnodes N --nproc-per-node "
                f"P with N*P = {k}, or pass --world-size {world_size}{fit}")
    try:
        return TrainConfig.from_dict(values)
    except ValueError as err:
        raise ValueError(f"invalid configuration for {values.get('world_size')} workers: {err}"
                         ) from None


def engine_options(args: argparse.Namespace, seed: int) -> dict:
    return {
        "stragglers": Stragglers(args.straggler_seconds, args.straggler_rate,
                                 tuple(args.straggler_ranks), seed),
        "compute_ms": args.compute_ms, "compile": args.compile,
        "compile_backend": args.compile_backend, "bucket_cap_mb": args.bucket_cap_mb,
    }


def write_outputs(out: Path, records, timeline_rows: list[dict] | None, group_sizes: list[int],
                  meta: dict) -> dict:
    """records.csv, timing.csv (one row per step x worker) and summary.json; returns the
    summary (steps/s, compute / waiting / communication shares, bytes per level)."""
    import pandas as pd

    from localsgd import timing

    out.mkdir(parents=True, exist_ok=True)
    records.to_csv(out / "records.csv", index=False)
    summary = dict(meta)
    if timeline_rows:
        df = timing.split_waiting(pd.DataFrame(timeline_rows), group_sizes)
        df.sort_values(["step", "rank"]).to_csv(out / "timing.csv", index=False)
        summary.update(timing.timing_summary(df, group_sizes))
    summary["final_train_loss"] = float(records.train_loss.iloc[-1])
    summary["final_test_acc"] = float(records.test_acc.iloc[-1])
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def format_summary(s: dict) -> str:
    workers = s.get("workers", s.get("world_size"))
    lines = [f"{s.get('engine', '?')} engine, {workers} workers, {s.get('steps', '?')} steps"]
    if "steps_per_s" in s:
        lines.append(f"  {s['steps_per_s']:.2f} steps/s (median step {1e3 * s['median_step_s']:.1f}"
                     f" ms); worker time: compute "
                     f"{100 * s['compute_share']:.1f} %, waiting {100 * s['wait_share']:.1f} %, "
                     f"communication {100 * s['comm_share']:.1f} %; {s['stalls']} stalls "
                     f"({s['stall_seconds']:.1f} s)")
        levels = sorted(k for k in s if k.startswith("bytes_l"))
        lines.append("  bytes all-reduced per level (sum over workers): " + ", ".join(
            f"l{k[7:]} (groups of {s['group_l' + k[7:]]}) {s[k] / 1e6:.1f} MB" for k in levels))
    lines.append(f"  final train loss {s['final_train_loss']:.4f}, test acc "
                 f"{s['final_test_acc']:.1f} %")
    return "\n".join(lines)


# runner options a --sweep entry may set besides TrainConfig fields (the per-run knobs of a
# timing experiment); --out, --resume, checkpoints and --compare-eager stay launch-wide
SWEEP_OPTIONS = ("nodes", "procs_per_node", "straggler_seconds", "straggler_rate",
                 "straggler_ranks", "compute_ms", "bucket_cap_mb")


def sweep_runs(args: argparse.Namespace, world: int | None) -> list[tuple[str, argparse.Namespace,
                                                                        Any]]:
    """The runs of ``--sweep FILE``: (name, the launch's args with the entry applied, TrainConfig)
    per entry, every entry checked before any training (``world``: launched processes, or None).

    The file is a YAML list of mappings; each has a ``name`` (its output folder under --out) and
    any TrainConfig fields and `SWEEP_OPTIONS`, applied over ``--config`` and the flags."""
    import yaml

    from localsgd.train import TrainConfig

    entries = yaml.safe_load(Path(args.sweep).read_text())
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"--sweep {args.sweep}: expected a non-empty YAML list of runs, each a "
                         "mapping with a 'name' and TrainConfig fields / runner options")
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    runs, seen = [], set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(  # noqa: TRY004 -- main reports ValueErrors on every rank
                f"--sweep {args.sweep}: entry {i} is not a mapping: {entry!r}")
        name = entry.get("name")
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise ValueError(f"--sweep entry {i}: 'name' must be a folder name, got {name!r}")
        if name in seen:
            raise ValueError(f"--sweep entry {i}: name {name!r} is used twice")
        seen.add(name)
        run = copy.copy(args)
        for key, value in entry.items():
            key = key.replace("-", "_")
            if key == "name":
                continue
            if key in SWEEP_OPTIONS:
                if key == "straggler_ranks":
                    value = tuple(int(r) for r in (value or ()))
                setattr(run, key, value)
            elif key in fields:
                setattr(run, f"cfg_{key}", value)
            else:
                raise ValueError(f"--sweep entry {name!r}: unknown key {key!r}; use TrainConfig "
                                 f"fields or one of {', '.join(SWEEP_OPTIONS)}")
        try:
            cfg = resolve_config(run, world)
            engine_options(run, cfg.seed)
        except ValueError as err:
            raise ValueError(f"--sweep entry {name!r}: {err}") from None
        runs.append((name, run, cfg))
    return runs


def main(argv: list[str] | None = None) -> int:
    """``python -m localsgd.ddp`` under torchrun: one worker of the job."""
    from localsgd.distributed import init_from_env

    p = argparse.ArgumentParser(prog="python -m localsgd.ddp", description=__doc__.split("\n")[0])
    add_run_arguments(p)
    p.add_argument("--sweep", type=Path, default=None, metavar="FILE",
                   help="YAML list of runs (name + TrainConfig fields / straggler, compute and "
                   "topology options) trained one after another in this one launch (one torch "
                   "start-up for all): OUT/<name>/ per run and OUT/sweep.csv")
    p.add_argument("--fast-exit", action="store_true",
                   help="end the process with os._exit once every output is written: skips the "
                   "interpreter's teardown of torch (~2 s of CPU per process, which 16 processes "
                   "on 2 cores pay one after another)")
    args = p.parse_args(argv)
    if "RANK" not in os.environ:
        print("error: run under torchrun, e.g. `torchrun --standalone --nproc-per-node 4 -m "
              "localsgd.ddp ...`, or use `localsgd train --engine ddp`, which starts torchrun",
              file=sys.stderr)
        return 2
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.sweep is not None:
        code = _sweep(args, rank, world)
        if args.fast_exit:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code
    try:  # every rank checks the same inputs, so a bad launch fails on all of them at once
        cfg = resolve_config(args, world)
        checkpoints = args.out / "checkpoints"
        if not args.resume and any(checkpoints.glob(f"run.rank{rank}.step*.pt")):
            raise ValueError(f"{checkpoints} holds checkpoints of an earlier run: pass --resume "
                             "to continue it, or choose another --out")
        engine_options(args, cfg.seed)  # validates the straggler options
    except ValueError as err:
        print(f"[rank {rank}] error: {err}", file=sys.stderr)
        return 2
    init_from_env(args.backend)
    try:
        if args.compare_eager:
            if args.compile is None or args.resume or args.checkpoint_every:
                print(f"[rank {rank}] error: --compare-eager needs --compile MODE and no "
                      "checkpoints (it trains the config twice from scratch)", file=sys.stderr)
                return 2
            eager = _run_once(args, cfg, args.out / "eager", None, rank, world)
            compiled = _run_once(args, cfg, args.out / args.compile, args.compile, rank, world)
            if rank == 0:
                return _compare(eager, compiled, args)
            return 0
        return 0 if _run_once(args, cfg, args.out, args.compile, rank, world) is not None else 2
    finally:
        dist.destroy_process_group()


def _sweep(args: argparse.Namespace, rank: int, world: int) -> int:
    """Every run of ``--sweep`` in this launch (see `sweep_runs`); OUT/sweep.csv on rank 0."""
    from localsgd.distributed import init_from_env

    try:
        if args.resume or args.checkpoint_every or args.compare_eager:
            raise ValueError("--sweep trains each run once from scratch: drop --resume, "
                             "--checkpoint-every and --compare-eager")
        runs = sweep_runs(args, world)
        for name, _, _ in runs:
            if (args.out / name / "summary.json").exists():
                raise ValueError(f"{args.out / name} holds an earlier run; choose another --out")
    except (ValueError, OSError) as err:
        print(f"[rank {rank}] error: {err}", file=sys.stderr)
        return 2
    init_from_env(args.backend)
    from localsgd.train import _load

    rows, datasets = [], {}
    try:
        for name, run, cfg in runs:
            # runs on the same data share one copy: building it again per run costs every
            # process the same CPU (seconds for 16 processes on 2 cores)
            key = (cfg.dataset, cfg.n_train, cfg.n_test)
            if key not in datasets:
                datasets[key] = _load(cfg)
            dist.barrier()  # every run starts from aligned ranks (the previous one's tails)
            summary = _run_once(run, cfg, args.out / name, run.compile, rank, world,
                                dataset=datasets[key])
            if summary is None:
                return 2
            if rank == 0:
                rows.append({"name": name, **{k: v for k, v in summary.items()
                                              if k != "train_loss"},
                             **{k: getattr(run, k) for k in SWEEP_OPTIONS},
                             **{k: v for k, v in cfg.to_dict().items()
                                if k in ("world_size", "block_size", "local_steps",
                                         "block_steps", "block_gradient_allreduce",
                                         "post_local_warmup_epochs", "seed")}})
        if rank == 0:
            import pandas as pd

            table = pd.DataFrame(rows)
            table["straggler_ranks"] = table["straggler_ranks"].map(
                lambda r: ",".join(map(str, r)))
            table.to_csv(args.out / "sweep.csv", index=False)
        return 0
    finally:
        dist.destroy_process_group()


def _run_once(args: argparse.Namespace, cfg, out: Path, compile: str | None, rank: int,
              world: int, dataset=None) -> dict | None:
    """Train ``cfg`` once (this rank's worker) and write the outputs on rank 0; the summary on
    rank 0, {} on the others, None after an error (printed)."""
    from localsgd.train import build_engine, train

    holder: list[DDPEngine] = []
    options = {**engine_options(args, cfg.seed), "compile": compile}

    def make_engine(c, n_train, num_classes):
        holder.append(build_engine(c, n_train, num_classes, kind="ddp", **options))
        return holder[0]

    checkpoints = out / "checkpoints"
    use_ckpt = args.checkpoint_every > 0 or args.resume
    try:
        records = train(cfg, engine=make_engine, dataset=dataset,
                        checkpoint_path=checkpoints / "run.pt" if use_ckpt else None,
                        checkpoint_every_steps=args.checkpoint_every, resume=args.resume,
                        progress=not args.no_progress and rank == 0)
    except ValueError as err:  # bad checkpoint or configuration: raised on every rank
        print(f"[rank {rank}] error: {err}", file=sys.stderr)
        return None
    engine = holder[0]
    timelines = engine.all_gather_object(engine.timeline)
    if args.save_final:
        out.mkdir(parents=True, exist_ok=True)
        torch.save(_clone_tensors(engine.model.state_dict()), out / f"final_rank{rank}.pt")
    if rank != 0:
        return {}
    meta = {"engine": "ddp", "world_size": world, "backend": dist.get_backend(),
            "compile": compile, "compile_backend": args.compile_backend if compile else None,
            "compute_ms": args.compute_ms, "straggler_seconds": args.straggler_seconds,
            "straggler_rate": args.straggler_rate, "straggler_ranks": list(args.straggler_ranks)}
    summary = write_outputs(out, records, [r for tl in timelines for r in tl],
                            [lv.group_size for lv in cfg.topology().levels], meta)
    summary["train_loss"] = records.train_loss.tolist()
    print(format_summary(summary))
    return summary


def _compare(eager: dict, compiled: dict, args: argparse.Namespace) -> int:
    """Per-step time of eager vs compiled and the compiled loss curve against eager's."""
    a, b = eager["train_loss"], compiled["train_loss"]
    rel = max(abs(x - y) / abs(x) for x, y in zip(a, b, strict=True))
    ok = rel <= args.loss_rtol
    report = {"mode": args.compile, "backend": args.compile_backend,
              "eager_median_step_s": eager["median_step_s"],
              "compiled_median_step_s": compiled["median_step_s"],
              "speedup": eager["median_step_s"] / compiled["median_step_s"],
              "train_loss_eager": a, "train_loss_compiled": b,
              "max_rel_loss_diff": rel, "loss_rtol": args.loss_rtol, "agree": ok}
    (args.out / "compare.json").write_text(json.dumps(report, indent=2))
    print(f"compiled ({args.compile}, {args.compile_backend}) vs eager: median step "
          f"{1e3 * report['compiled_median_step_s']:.1f} ms vs "
          f"{1e3 * report['eager_median_step_s']:.1f} ms ({report['speedup']:.2f}x); per-epoch "
          f"train loss differs by at most {rel:.2e} relative ({'within' if ok else 'ABOVE'} "
          f"--loss-rtol {args.loss_rtol})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
