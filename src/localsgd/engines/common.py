"""Helpers both engines share (replicas and DDP): worker streams, cloned state, accuracy counts,
and `ScheduledWorkers`, the counters and resume state every engine keeps."""

from __future__ import annotations

import concurrent.futures
import functools
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["Batch", "Deferred", "PhaseClock", "ScheduledWorkers", "clone_tensors", "count_correct",
           "cuda_rng_state", "host_map", "read_step", "set_cuda_rng_state", "to_device",
           "worker_generator"]

Batch = tuple[torch.Tensor, torch.Tensor]


def worker_generator(seed: int, rank: int, device: str | torch.device = "cpu") -> torch.Generator:
    """Worker `rank`'s own random stream (data order, sampling): seeded with ``seed + rank``."""
    return torch.Generator(device=device).manual_seed(int(seed) + int(rank))


@functools.cache
def _host_pool(threads: int) -> concurrent.futures.ThreadPoolExecutor:
    # one pool per size for the whole process: engines come and go, the threads stay; each
    # thread's own OpenMP setting starts at the process's (one thread: see `host_map`)
    return concurrent.futures.ThreadPoolExecutor(
        threads, thread_name_prefix="localsgd-replica",
        initializer=lambda: torch.set_num_threads(torch.get_num_threads()))


def host_map(fn: Callable[[Any], Any], items: Iterable[Any], threads: int = 1) -> list:
    """``[fn(item) for item in items]``, spread over ``threads`` host threads when > 1.

    For CPU work that releases the GIL (torch ops): K replicas' forward/backward passes or
    evaluation batches run side by side, each op single-threaded. Each item is computed exactly
    as in the sequential loop, so results are bitwise those of a one-thread run. Raises a
    ValueError unless torch runs one intra-op thread (``torch.set_num_threads(1)``): otherwise
    every op would fan out too and oversubscribe the cores."""
    if threads <= 1:
        return [fn(item) for item in items]
    if torch.get_num_threads() != 1:
        raise ValueError(
            f"{threads} host threads need torch.set_num_threads(1) first (torch has "
            f"{torch.get_num_threads()} intra-op threads: each op would fan out again and "
            "oversubscribe the cores); `localsgd.training.loop.train` sets it for its run")
    # grad mode and autocast are thread-local: carry the caller's into the pool's threads
    grad = torch.is_grad_enabled()
    cast = torch.is_autocast_enabled("cpu")
    cast_dtype = torch.get_autocast_dtype("cpu")

    def call(item: Any) -> Any:
        with torch.set_grad_enabled(grad), torch.autocast("cpu", cast_dtype, enabled=cast):
            return fn(item)

    return list(_host_pool(threads).map(call, items))


def clone_tensors(obj: Any) -> Any:
    """``obj`` (nested dicts / lists / tuples) with every tensor detached and cloned: a state
    dict that no later in-place update of the model or its flat buffer can change."""
    if torch.is_tensor(obj):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return type(obj)((k, clone_tensors(v)) for k, v in obj.items())
    if isinstance(obj, list | tuple):
        return type(obj)(clone_tensors(v) for v in obj)
    return obj


class ScheduledWorkers:
    """What every engine keeps, whatever runs its workers: the schedule and its `SyncDriver`
    (``schedule``, ``driver``), the communicator (``comm``), one random stream per local worker
    (``generators``) and a ``device``; from them the counters `localsgd.training.loop.train` reads
    and the part of a resume state all engines save alike."""

    @property
    def world_size(self) -> int:
        """K, the number of workers of the run (all processes)."""
        return self.schedule.topology.world_size

    @property
    def t(self) -> int:
        """Completed local updates."""
        return self.driver.t

    def _common_state(self) -> dict:
        return {
            "driver": self.driver.state_dict(),
            "comm": self.comm.state_dict(),
            "generators": [g.get_state() for g in self.generators],
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": cuda_rng_state(self.device),
        }

    def _load_common_state(self, state: dict) -> None:
        self.driver.load_state_dict(to_device(state["driver"], self.device))
        self.comm.load_state_dict(state["comm"])  # copied into live tensors: keeps their device
        for g, s in zip(self.generators, state["generators"], strict=True):
            g.set_state(s.cpu())  # generator states are CPU byte tensors on every device
        torch.set_rng_state(state["torch_rng"].cpu())
        set_cuda_rng_state(state.get("cuda_rng"), self.device)


class Deferred:
    """A value computed at its first `get()`: CUDA event times read at the record, not at every
    update (each read waits for the GPU, a host synchronisation)."""

    __slots__ = ("_fn", "_value")
    _UNSET = object()

    def __init__(self, fn: Callable[[], Any]):
        self._fn, self._value = fn, Deferred._UNSET

    def get(self) -> Any:
        if self._value is Deferred._UNSET:
            self._value, self._fn = self._fn(), None
        return self._value


def read_step(losses: torch.Tensor, stats: dict | None) -> list[float]:
    """A ``step(..., sync=False)`` result read to the host, as ``sync=True`` returns it: the
    losses and hit counts in one read (``stats["correct"]`` ints, or None per worker for
    floating targets), the `Deferred` seconds resolved."""
    k = len(losses)
    if stats is None:
        return losses.tolist()
    correct = stats["correct"]
    if correct is None:
        out, stats["correct"] = losses.tolist(), [None] * k
    else:
        values = torch.cat([losses, correct.to(losses.dtype)]).tolist()
        out, stats["correct"] = values[:k], [int(c) for c in values[k:]]
    stats["compute_seconds"] = stats["compute_seconds"].get()
    return out


class PhaseClock:
    """Seconds a worker spends in the marked phases of one update (forward + backward, optimizer
    step), read once per update.

    On CPU a mark is ``time.perf_counter()``. On CUDA a mark records a CUDA event on the current
    stream, so the time is the GPU's work, not the kernel launches, and `seconds` waits once, on
    the last event, instead of synchronising the device at every mark. Other accelerators (MPS)
    synchronise at each mark, then read the wall clock.
    """

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.events = self.device.type == "cuda"
        backend = getattr(torch, self.device.type, None) if self.device.type != "cpu" else None
        self._sync = None if self.events else getattr(backend, "synchronize", None)

    def mark(self) -> Any:
        if self.events:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        if self._sync is not None:
            self._sync()
        return time.perf_counter()

    def seconds(self, spans: list[list[tuple[Any, Any]]]) -> list[float]:
        """Total seconds of each worker's (start, end) mark pairs; one host wait on CUDA."""
        if not self.events:
            return [sum(end - start for start, end in worker) for worker in spans]
        last = [end for worker in spans for _, end in worker]
        if last and not last[-1].query():  # done already (a record's read waited): no wait
            last[-1].synchronize()
        return [sum(start.elapsed_time(end) for start, end in worker) / 1e3 for worker in spans]


def to_device(obj: Any, device: torch.device) -> Any:
    """``obj`` (nested dicts / lists / tuples) with every tensor on ``device``: checkpoints load
    on the CPU (``map_location="cpu"``), so state that is not copied into live tensors (the
    outer step's anchor and momentum buffer) must be moved to the engine's device."""
    if torch.is_tensor(obj):
        return obj.to(device)
    if isinstance(obj, dict):
        return type(obj)((k, to_device(v, device)) for k, v in obj.items())
    if isinstance(obj, list | tuple):
        return type(obj)(to_device(v, device) for v in obj)
    return obj


def cuda_rng_state(device: torch.device) -> torch.Tensor | None:
    """The CUDA generator state of ``device`` (a CPU byte tensor), None off CUDA: a resumed GPU
    run continues the same random stream (e.g. dropout) as an uninterrupted one."""
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def set_cuda_rng_state(state: torch.Tensor | None, device: torch.device) -> None:
    if state is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state.cpu(), device)


def count_correct(out: torch.Tensor, y: torch.Tensor, class_dim: int) -> torch.Tensor | None:
    """Number of argmax hits along `class_dim` (per replica if stacked); None for non-class
    (floating) targets, where "correct" has no meaning."""
    if y.is_floating_point():
        return None
    hits = out.detach().argmax(dim=class_dim) == y
    return hits.flatten(class_dim - 1).sum(class_dim - 1) if class_dim > 1 else hits.sum()
