"""The distributed engine: one worker per process (torchrun), DDP for gradients.

`DDPEngine` has the replica engines' surface (the `localsgd.engines.Engine` protocol: ``step``,
``t``, ``world_size``, ``local_ranks``, ``generators``, ``current_lr``, ``averaged_model``,
``param_bytes``, ``all_gather_object``, ``state_dict``), so the one training loop runs unchanged
(docs/layout.md: one loop, two engines); `localsgd.training.runner` is its command line:

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
`localsgd.timing.stragglers.split_waiting` splits each step into compute, waiting and
communication. On CUDA the host's timestamps see only kernel launches (NCCL's ``wait()`` does
not block the host), so there the step's durations come from CUDA events on the compute stream,
read together when the timeline (or a step's seconds) is read, not per update: compute (forward,
backward with DDP's gradient all-reduce, optimizer step), the model average (``avg_dur_s``), and
their sum as the step's ``wall_s``. It emulates stragglers (`localsgd.timing.stragglers.Stragglers`,
the blog's experiment) and, with ``compute_ms``, replaces the model's compute by a sleep so 8-16
processes fit on 2 cores. ``compile`` compiles the DDP model with
``torch._dynamo.config.optimize_ddp = MODE`` ("TorchDynamo Update 9: Making DDP Work with
TorchDynamo": DDPOptimizer splits the graph at bucket boundaries to keep the overlap).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

# all_reduce_mean: averaging.py's one all-reduce-to-mean (AVG op, fp16-safe); the comm hook
# must average exactly as the averagers do.
from localsgd.averaging import DistributedCommunicator, all_reduce_mean
from localsgd.collectives import float_buffers
from localsgd.compression import wire_bytes
from localsgd.engines.common import (
    Batch,
    Deferred,
    PhaseClock,
    ScheduledWorkers,
    clone_tensors,
    count_correct,
    read_step,
    worker_generator,
)
from localsgd.outer import OuterUpdate
from localsgd.schedule import Action, SyncDriver, SyncSchedule
from localsgd.timing.stragglers import Stragglers

__all__ = ["COMPILE_MODES", "DDPEngine", "schedule_grad_hook"]

COMPILE_MODES = ("ddp_optimizer", "no_optimization", "python_reducer")
# DDP must not overwrite buffers with rank 0's each forward: torch >= 2.14 names that
# forward_sync_buffers, older releases broadcast_buffers (seen on torch 2.11, the first GPU's)
_DDP_ARGS = inspect.signature(DistributedDataParallel).parameters
_NO_BUFFER_SYNC = ({"forward_sync_buffers": False} if "forward_sync_buffers" in _DDP_ARGS
                   else {"broadcast_buffers": False})


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
    work = all_reduce_mean(buf, state.sizes[state.level], state.groups[state.level])
    return work.get_future().then(lambda f: f.value()[0])


class _DDPCommunicator(DistributedCommunicator):
    """`DistributedCommunicator` whose gradient all-reduce already happened inside DDP's
    backward (the comm hook), so the driver's ``before_step`` must not repeat it."""

    def allreduce_grads(self, level: int) -> None:
        return None


class DDPEngine(ScheduledWorkers):
    """One worker of a torchrun job: DDP for gradient averaging, the core's averagers for model
    averaging, the shared `SyncDriver` for the schedule (see module docstring).

    Args mirror `localsgd.engines.replicas.ReplicaEngine` (model_fn is called under
    ``torch.manual_seed(seed)`` on every rank, so all workers start identical, Algorithm 1 line
    1; worker k's stream is seeded ``seed + k``), plus:
        stragglers: emulated stalls (`localsgd.timing.stragglers.Stragglers`), slept between
            the loss and the backward pass as in the blog's snippet.
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
        average_momentum: bool = False,
        device: str | torch.device = "cpu",
        *,
        stragglers: Stragglers | None = None,
        compute_ms: float = 0.0,
        num_classes: int | None = None,
        compile: str | None = None,
        compile_backend: str = "inductor",
        bucket_cap_mb: float = 25.0,
    ):
        if not dist.is_initialized():
            raise ValueError("DDPEngine needs a process group: launch under torchrun "
                             "(`torchrun --nproc-per-node K -m localsgd.training.runner ...`) "
                             "or call localsgd.distributed.init_from_env() first")
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
        self._clock = PhaseClock(self.device)
        self.stragglers = stragglers or Stragglers()
        torch.manual_seed(self.seed)
        model = model_fn().to(self.device)
        self._template = copy.deepcopy(model)  # plain tensors: the skeleton of averaged_model
        self.model = model
        self.comm = _DDPCommunicator(topo, model, average_buffers=average_buffers)
        self.optimizer = optimizer_fn(model.parameters())  # after adoption: sees final tensors
        self.comm.optimizer, self.comm.average_momentum = self.optimizer, average_momentum
        self.driver = SyncDriver(schedule, self.comm, outer)
        self.generators = [worker_generator(self.seed, self.rank)]
        self._sizes = [lv.group_size for lv in topo.levels]
        self._hook = _GradHookState(self.comm.groups, self._sizes)
        module = (_EmulatedCompute(model, compute_ms / 1000.0, num_classes) if compute_ms
                  else model)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        # _NO_BUFFER_SYNC: buffers are averaged by the schedule or kept per worker, never
        # overwritten by rank 0's each forward. The init-time sync DDP still does is a no-op:
        # every rank built the same model from `seed`.
        self.ddp = DistributedDataParallel(module, device_ids=device_ids,
                                           bucket_cap_mb=bucket_cap_mb, **_NO_BUFFER_SYNC)
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
        self._timeline: list[dict] = []
        # CUDA: rows whose event times are not read yet (row, marks, synced, streamed), resolved
        # together
        self._unread: list[tuple[dict, list, bool, bool]] = []

    @property
    def timeline(self) -> list[dict]:
        """One row per update: host stamps, and on CUDA the GPU's seconds from events (read
        here, for every update since the last read, in one host wait)."""
        self._read_events()
        return self._timeline

    @timeline.setter
    def timeline(self, rows: list[dict]) -> None:
        self._timeline, self._unread = rows, []

    def _compute_seconds(self, row: dict) -> list[float]:
        self._read_events()
        return [row["compute_s"]]

    def _read_events(self) -> None:
        for row, marks, synced, streamed in self._unread:
            # the GPU's own time: forward, backward and the optimizer step, including the
            # wait for DDP's gradient all-reduce, which blocks the compute stream at the end of
            # backward (not separable on one stream: counted as compute, once); then the model
            # average. The first read waits for the last event; the others are done by then.
            compute, after = self._clock.seconds([[(marks[0], marks[1])], [(marks[1], marks[2])]])
            row["wall_s"] = compute + after  # so compute <= wall, as on a CPU
            row["compute_s"] = compute if synced or streamed else compute + after
            row["avg_dur_s"] = after if synced else None
            row["stream_s"] = after if streamed and not synced else 0.0
        self._unread.clear()

    # -- the surface train() uses ----------------------------------------------------------------

    @property
    def local_ranks(self) -> list[int]:
        """The one worker this process runs."""
        return [self.rank]

    def _average_bytes(self, level: int) -> int:
        """Bytes of one average at ``level``: the parameters (as codes when the averages are
        compressed, `localsgd.compression.wire_bytes`) and any averaged buffers."""
        comp = self.comm.compression
        if comp is None:
            return self._avg_bytes
        n = sum(p.numel() for p in self.comm.params)
        return self._avg_bytes - self.param_bytes + wire_bytes(n, comp.fmt, self._sizes[level],
                                                                comp.block, comp.density)

    def _fragment_bytes(self, p: int) -> int:
        """Bytes of fragment ``p``'s average: its values, or their codes when compressed."""
        n = self.comm.read_tensors(*self.driver.streaming.bounds[p]).numel()
        comp = self.comm.compression
        if comp is None:
            return n * self.comm.flat_params().element_size()
        return wire_bytes(n, comp.fmt, self.world_size, comp.block, comp.density)

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

    def step(self, batches: Sequence[Batch], loss_fn, stats: dict | None = None,
             sync: bool = True) -> tuple[list[float] | torch.Tensor, Action]:
        """One local update of this worker (``batches`` = [its (inputs, targets)]), then whatever
        the schedule says. Same contract as `ReplicaEngine.step` for one worker;
        ``stats["compute_seconds"]`` excludes waiting and communication (see `timeline`). With
        ``sync=False`` nothing is read back: the loss and hit count stay on the device and, on
        CUDA, the step's events are read with the others when the timeline or the seconds are."""
        if len(batches) != 1:
            raise ValueError(f"a DDP worker takes one batch per step (its own), got {len(batches)}")
        (x, y), = batches
        if self.lr_schedule is not None:
            lr = float(self.lr_schedule(self.t))
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        t = self.t + 1
        upcoming = self.schedule.action(t)
        glevel = upcoming.allreduce_grads_level
        # per-worker H: a worker that sits this update out keeps its state
        restore = self.comm.hold() if self.rank in upcoming.idle else None
        if glevel is not None and self._sizes[glevel] == 1:
            glevel = None
        hook = self._hook
        hook.level, hook.arrive, hook.bytes = glevel, None, 0
        gpu = self._clock.events
        marks = [self._clock.mark()] if gpu else []
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
        if restore is not None:
            restore()
        opt_end = time.time()
        if gpu:
            marks.append(self._clock.mark())
        action = self.driver.after_step(self.current_lr())
        end = time.time()
        if gpu:  # after the average's wait(): the compute stream waits for NCCL's stream here
            marks.append(self._clock.mark())
        level = action.level if action.level is not None and self._sizes[action.level] > 1 \
            else None
        synced = level is not None or action.gossip
        streamed = action.fragment is not None or action.merge is not None
        grad_arrive = (hook.arrive if hook.arrive is not None else backward_end) \
            if glevel is not None else None
        compute = ((grad_arrive if glevel is not None else backward_end) - start
                   + opt_end - backward_end + (0.0 if synced or streamed else end - opt_end))
        wall = end - start  # on CUDA the events' times replace these (`_read_events`): the
        row = {  # host stamps time kernel launches there

            "step": t, "rank": self.rank, "start": start, "end": end, "wall_s": wall,
            "compute_s": compute, "stall_s": stall,
            "grad_level": glevel, "grad_arrive": grad_arrive,
            "grad_end": backward_end if glevel is not None else None,
            "grad_bytes": hook.bytes,
            # on CUDA: the sync's duration on this rank from events (split_waiting's rule);
            # the gradient all-reduce is inside compute there, so it has none
            "clock": "events" if gpu else "host", "grad_dur_s": None, "avg_dur_s": None,
            "avg_level": level, "avg_arrive": opt_end if synced else None,
            "avg_end": end if synced else None,
            "avg_bytes": self._average_bytes(level) if level is not None else 0,
            "outer": bool(action.outer), "idle": self.rank in action.idle,
            # streaming fragment sync: the fragment launched (its codes' bytes) and the one
            # merged, with the host's wait for its average (short when it travelled meanwhile;
            # under NCCL wait() does not block the host, so there it is ~0 whatever the overlap)
            "fragment": action.fragment, "merge": action.merge,
            "fragment_bytes": (self._fragment_bytes(action.fragment)
                               if action.fragment is not None else 0),
            "merge_wait_s": (self.driver.streaming.last_wait_s if action.merge is not None
                             else None),
            # the host's time in the launch, the merge (its wait included) and the mixing:
            # the communication a streamed step did not hide (`split_waiting` books it as such)
            "stream_s": end - opt_end if streamed and not synced else 0.0,
        }
        self._timeline.append(row)
        if gpu:  # read at the record (or whenever the timeline is), not now: no wait per update
            # (a streamed fragment's launch and merge are after the step, as a sync is)
            self._unread.append((row, marks, synced, streamed))
        loss = loss.detach().reshape(1)
        if stats is not None:
            c = count_correct(out, y, 1)
            stats["correct"] = c.reshape(1) if c is not None else None
            stats["compute_seconds"] = Deferred(lambda: self._compute_seconds(row))
        return (read_step(loss, stats) if sync else loss), action

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
            all_reduce_mean(flat, dist.get_world_size(), None).wait()
            offset = 0
            for tensor in group:
                tensor.copy_(flat[offset:offset + tensor.numel()].view_as(tensor))
                offset += tensor.numel()
        return model

    def state_dict(self) -> dict:
        """Everything an exact resume needs (tensors cloned: the model aliases the flat buffer):
        model (parameters + buffers), inner optimizer, schedule step + outer state, push-sum
        weight, this worker's data stream, torch's RNG and the timing timeline."""
        return clone_tensors({
            "rank": self.rank, "world_size": self.world_size,
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            **self._common_state(), "timeline": list(self.timeline),
        })

    def load_state_dict(self, state: dict) -> None:
        if (state.get("rank"), state.get("world_size")) != (self.rank, self.world_size):
            raise ValueError(
                f"checkpoint holds rank {state.get('rank')} of {state.get('world_size')} workers "
                f"but this process is rank {self.rank} of {self.world_size}; resume with the "
                "saved world size and each rank's own file")
        self.model.load_state_dict(state["model"])  # in place: stays a view of the flat buffer
        self.optimizer.load_state_dict(state["optimizer"])
        self._load_common_state(state)
        self.timeline = list(state["timeline"])
