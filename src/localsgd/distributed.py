"""Process-group helpers for the torch.distributed engine.

`spawn` starts W CPU processes joined by a gloo process group (tests and benchmarks);
`init_from_env` joins the group described by torchrun's environment variables.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank: int, world_size: int, store_file: str, threads: int, fn, args,
            queue) -> None:
    # Each worker is a fresh interpreter (spawn), so pin threads before any tensor work.
    torch.set_num_threads(threads)
    try:
        # A FileStore rendezvous: no TCP port is picked in advance, so parallel test runs
        # (pytest-xdist) cannot race for one; gloo's own sockets bind to ports the OS assigns.
        dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank,
                                world_size=world_size)
        result = fn(rank, world_size, *args)
        # Serialise to bytes: tensors sent through a torch queue would travel as shared-memory
        # handles that die with this process.
        buf = io.BytesIO()
        torch.save(result, buf)
        queue.put((rank, True, buf.getvalue()))
    except BaseException:  # the parent re-raises with this traceback
        queue.put((rank, False, traceback.format_exc()))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(fn: Callable[..., Any], world_size: int, *args: Any, threads: int = 1,
          timeout: float = 300.0) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` gloo processes on CPU.

    ``fn`` must be importable (a module-level function). Returns the per-rank return values
    (which must be picklable), ordered by rank. A failure on any rank raises ``RuntimeError``
    carrying that rank's traceback.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    store_dir = tempfile.mkdtemp(prefix="localsgd-spawn-")
    store_file = os.path.join(store_dir, "store")
    procs = [
        ctx.Process(target=_worker, args=(r, world_size, store_file, threads, fn, args, queue),
                    daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: list[str] = []
    for _ in range(world_size):
        # A crashed rank never reports; the others then fail on their next collective.
        rank, ok, payload = _get(queue, procs, timeout)
        if rank is None:
            errors.append(payload)
            break
        if ok:
            results[rank] = torch.load(io.BytesIO(payload), weights_only=False)
        else:
            errors.append(f"rank {rank}:\n{payload}")
            break
    for p in procs:
        p.join(timeout=5 if errors else timeout)
        if p.is_alive():
            p.kill()
            p.join()
    shutil.rmtree(store_dir, ignore_errors=True)
    if errors:
        raise RuntimeError("spawned worker failed:\n" + "\n".join(errors))
    return [results[r] for r in range(world_size)]


def _get(queue, procs, timeout: float):
    """Wait for one worker report, noticing workers that died without reporting."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not queue.empty():
            return queue.get()
        dead = [p for p in procs if p.exitcode not in (None, 0)]
        if dead and queue.empty():
            time.sleep(0.2)  # the failing rank may still be flushing its report
            if queue.empty():
                return None, False, f"worker exited with code {dead[0].exitcode} and no report"
        time.sleep(0.005)
    return None, False, f"timed out after {timeout} s waiting for workers"


def init_from_env(backend: str | None = None, *, device: str | torch.device | None = None,
                  placement=None) -> tuple[int, int, torch.device]:
    """Join the process group described by torchrun's environment (RANK, WORLD_SIZE, ...).

    Where this rank runs and which backend it uses come from one rule,
    `localsgd.device.resolve`: pass the resolved ``placement`` (preferred: resolve it, and so
    fail, before building anything), or the configured ``device`` (resolved here), or neither
    (the old call ``init_from_env(backend)``: ``backend='nccl'`` means device ``cuda`` and
    anything else device ``cpu`` -- NOT "NCCL whenever CUDA exists", which handed CPU tensors to
    NCCL when the engine ran on CPU). On CUDA the rank's GPU is made current and passed to
    ``init_process_group(backend, device_id=...)``, binding NCCL to it.

    Returns ``(rank, world_size, device)``; on CUDA the device is ``cuda:LOCAL_RANK`` (the
    engine must be built on it).

    Raises:
        ValueError: torchrun's variables are missing, or `localsgd.device.DeviceError` (a
            ValueError) for an impossible device / backend / GPU-count combination.
    """
    from localsgd import device as device_mod

    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
               if k not in os.environ]
    if missing:
        raise ValueError(
            f"init_from_env needs torchrun's environment variables; missing {missing} "
            "(launch with `torchrun --nproc-per-node N ...`)")
    if placement is None:
        if device is None:
            device = "cuda" if backend == "nccl" else "cpu"
        placement = device_mod.resolve_from_env(device, backend, torchrun=True)
    elif backend is not None and backend != placement.backend:
        raise ValueError(f"backend {backend!r} contradicts the resolved placement "
                         f"({placement.backend} on {placement.device})")
    dev = device_mod.apply(placement)
    if not dist.is_initialized():
        if placement.device_id is not None:
            dist.init_process_group(placement.backend, device_id=placement.device_id)
        else:
            dist.init_process_group(placement.backend)
    return dist.get_rank(), dist.get_world_size(), dev
