"""One rule for where a worker runs and which process-group backend it uses.

`resolve` is a pure function of the configured device string and facts about the machine and the
launch (passed in, so every combination is testable without a GPU); `resolve_from_env` reads
those facts from torch and torchrun's environment. Every engine, runner and `init_from_env` call
should go through them, so that the device the model lives on and the backend that moves its
tensors are decided once, together, before any training starts.

The rule:

* The configured device decides the backend: ``cpu`` -> gloo, ``cuda`` -> NCCL. An explicit
  ``backend`` may only restate that choice: NCCL with a CPU device (NCCL moves CUDA tensors
  only) and gloo with a CUDA device (gloo has no CUDA point-to-point ops, which gossip needs)
  are errors.
* Under torchrun, ``cuda`` means ``cuda:LOCAL_RANK``: one GPU per process. There must be at
  least ``LOCAL_WORLD_SIZE`` visible GPUs, else the error names both numbers and the fixes
  (fewer processes per node, the replica engine, or ``device: cpu``).
* Under torchrun with more than one process per node, an explicit ``cuda:N`` is an ERROR, not
  silently remapped: it would put every process of the node on GPU N (NCCL then fails or
  serialises). Use ``cuda`` (each process takes ``cuda:LOCAL_RANK``), or restrict
  ``CUDA_VISIBLE_DEVICES`` per process. With one process per node ``cuda:N`` is honoured.
* Without torchrun (the replica engines: K workers in one process) ``cuda`` means ``cuda:0`` and
  ``cuda:N`` is checked against the GPU count; the backend is still reported (what a process
  group would use) but nothing is initialised.
* ``mps`` (Apple GPUs) is accepted for the replica engines only: torch.distributed has no MPS
  backend, so ``mps`` under torchrun is an error.

Verified on CPU only (CUDA facts mocked in tests/test_device.py); no GPU was available when this
was written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["DeviceError", "Placement", "apply", "cuda_facts", "resolve", "resolve_from_env"]

BACKENDS = ("gloo", "nccl")


class DeviceError(ValueError):
    """A device / backend / launch combination that cannot work; the message names the fix."""


@dataclass(frozen=True)
class Placement:
    """Where this process's worker(s) live and which backend a process group uses.

    Attributes:
        device: the torch device for models and batches (``cuda:LOCAL_RANK`` under torchrun).
        backend: ``"gloo"`` or ``"nccl"``.
        torchrun: launched by torchrun (one worker per process).
        local_rank / local_world_size: torchrun's LOCAL_RANK / LOCAL_WORLD_SIZE (0 / 1 without).
    """

    device: torch.device
    backend: str
    torchrun: bool = False
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def device_id(self) -> torch.device | None:
        """What ``init_process_group(device_id=...)`` gets: the CUDA device (binds NCCL's
        communicator to it eagerly), None on CPU."""
        return self.device if self.device.type == "cuda" else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable description (for run metadata / figure provenance)."""
        return {"device": str(self.device), "backend": self.backend, "torchrun": self.torchrun,
                "local_rank": self.local_rank, "local_world_size": self.local_world_size}


def _parse(device: str | torch.device) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise DeviceError(f"device {device!r} is not a torch device string; use 'cpu', 'cuda' "
                          "or 'cuda:N'") from exc


def resolve(device: str | torch.device, *, torchrun: bool, local_rank: int = 0,
            local_world_size: int = 1, cuda_available: bool, cuda_count: int,
            backend: str | None = None, mps_available: bool = False) -> Placement:
    """Apply the module's rule (see the module docstring) to one process.

    Args:
        device: the configured device (``TrainConfig.device``): 'cpu', 'cuda', 'cuda:N', 'mps'.
        torchrun: whether this process is one worker of a torchrun launch.
        local_rank / local_world_size: torchrun's LOCAL_RANK and LOCAL_WORLD_SIZE (processes on
            this node); ignored without torchrun.
        cuda_available / cuda_count: ``torch.cuda.is_available()`` / ``device_count()``.
        backend: an explicit backend (``--backend``); None: the device's own.
        mps_available: ``torch.backends.mps.is_available()``.

    Raises:
        DeviceError: before anything is initialised, naming the problem and the fix.
    """
    dev = _parse(device)
    if backend is not None and backend not in BACKENDS:
        raise DeviceError(f"backend must be one of {BACKENDS} (or None: chosen by the device), "
                          f"got {backend!r}")
    if not torchrun:
        local_rank, local_world_size = 0, 1
    elif not (0 <= local_rank < local_world_size):
        raise DeviceError(f"LOCAL_RANK={local_rank} is outside 0..LOCAL_WORLD_SIZE-1 "
                          f"(LOCAL_WORLD_SIZE={local_world_size}); launch with torchrun")
    where = {"torchrun": torchrun, "local_rank": local_rank, "local_world_size": local_world_size}

    if dev.type == "cpu":
        if backend == "nccl":
            raise DeviceError(
                "backend 'nccl' with device 'cpu': NCCL only moves CUDA tensors, so the first "
                "collective would fail; set device: cuda (one GPU per process) or drop "
                "--backend nccl (gloo is used on CPU)")
        return Placement(torch.device("cpu"), "gloo", **where)

    if dev.type == "mps":
        if torchrun:
            raise DeviceError(
                "device 'mps' under torchrun: torch.distributed has no MPS backend; use device "
                "cpu with gloo, or run the replica engine (--engine replicas) on mps")
        if not mps_available:
            raise DeviceError("device 'mps' asked for but torch.backends.mps.is_available() is "
                              "False; use device cpu")
        if backend == "nccl":
            raise DeviceError("backend 'nccl' needs CUDA devices; device 'mps' has none")
        return Placement(torch.device("mps"), "gloo", **where)

    if dev.type != "cuda":
        raise DeviceError(f"device {str(dev)!r} is not supported; use 'cpu', 'cuda' or 'cuda:N'")

    # -- CUDA
    if not cuda_available or cuda_count < 1:
        raise DeviceError(
            f"device {str(dev)!r} asked for but torch sees no CUDA GPU "
            f"(torch.cuda.is_available()={cuda_available}, device_count()={cuda_count}, "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')!r}); "
            "set device: cpu, or install a CUDA build of torch on a machine with a GPU")
    if backend == "gloo":
        raise DeviceError(
            f"backend 'gloo' with device {str(dev)!r}: gloo has no CUDA point-to-point ops "
            "(gossip) and copies through the host; drop --backend gloo (NCCL is used on CUDA) "
            "or set device: cpu")
    if torchrun:
        if dev.index is not None and local_world_size > 1:
            raise DeviceError(
                f"device {str(dev)!r} under torchrun with {local_world_size} processes per node "
                f"would put every process on GPU {dev.index}; use device 'cuda' (process i takes "
                "cuda:LOCAL_RANK) or give each process its own CUDA_VISIBLE_DEVICES")
        if dev.index is None and local_world_size > cuda_count:
            raise DeviceError(
                f"{local_world_size} processes per node but only {cuda_count} visible GPU(s): "
                f"process LOCAL_RANK={local_rank} would ask for cuda:{local_rank} ('invalid "
                f"device ordinal'); launch at most {cuda_count} processes per node "
                f"(--nproc-per-node {cuda_count}, more nodes), simulate the workers with the "
                "replica engine on one GPU (--engine replicas), or set device: cpu")
        index = local_rank if dev.index is None else dev.index
    else:
        index = 0 if dev.index is None else dev.index
    if index >= cuda_count:
        raise DeviceError(f"device cuda:{index} asked for but only {cuda_count} GPU(s) are "
                          f"visible (cuda:0..cuda:{cuda_count - 1}); pick one of those or 'cuda'")
    return Placement(torch.device("cuda", index), "nccl", **where)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise DeviceError(f"environment variable {name}={value!r} is not an integer") from exc


def cuda_facts() -> tuple[bool, int]:
    """``(torch.cuda.is_available(), torch.cuda.device_count())`` (0 when unavailable)."""
    available = bool(torch.cuda.is_available())
    return available, int(torch.cuda.device_count()) if available else 0


def resolve_from_env(device: str | torch.device = "cpu", backend: str | None = None, *,
                     torchrun: bool | None = None) -> Placement:
    """`resolve` with the facts of this process: torchrun is detected from RANK in the
    environment (unless given), LOCAL_RANK / LOCAL_WORLD_SIZE from torchrun's variables, CUDA
    from torch.cuda, MPS from torch.backends.mps. Initialises nothing."""
    if torchrun is None:
        torchrun = "RANK" in os.environ
    local_world = _env_int("LOCAL_WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    available, count = cuda_facts()
    mps = getattr(torch.backends, "mps", None)
    return resolve(device, torchrun=torchrun, local_rank=local_rank,
                   local_world_size=local_world, cuda_available=available, cuda_count=count,
                   backend=backend, mps_available=bool(mps and mps.is_available()))


def apply(placement: Placement) -> torch.device:
    """Make the placement current for this process (``torch.cuda.set_device`` on CUDA, so
    NCCL, ``torch.cuda.*`` calls and un-indexed ``'cuda'`` tensors use this rank's GPU);
    returns its device."""
    if placement.device.type == "cuda":
        torch.cuda.set_device(placement.device)
    return placement.device
