"""How one machine runs a `TrainConfig`, decided in one place (`plan_run`) and then only read.

A config says what a run computes (the paper's recipe) and, in its 'auto' fields, leaves to the
machine how: the device, the engine (K replicas one after another, vmapped in one batch, packed
into channel groups, or one worker per process under torchrun), the host threads the sequential
engine spreads its replicas over, the float32 matmul precision and the input layout. `plan_run`
resolves all of them once, before any data is loaded (a bad device fails there), into a frozen
`RunPlan`; `fit_to_memory` is its one later step, on CUDA once the input shape is known (the
batched engine's K replicas fall back to the sequential one when only that fits). Engine
building (`localsgd.training.loop.build_engine`), the loop, resume, run packs and the torchrun
runner read the plan and decide nothing again; the plan is written into every checkpoint (a resume
on a machine that would plan another engine stops in one line) and shown in the records through
`RunPlan.applied` (the config with its 'auto' fields as they ran).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from localsgd import device as device_rule
from localsgd import memory as memory_mod
from localsgd import models as models_mod
from localsgd import numerics
from localsgd.engines import packed as packing
from localsgd.training.config import TrainConfig

__all__ = ["ENGINES", "RUNNERS", "RunPlan", "check_replica_memory", "fit_to_memory",
           "plan_run", "torchrun_placement", "use_batched", "use_packed"]

# what executes the workers: K replicas in this process one after another, vmapped together,
# vmapped and packed into channel groups (`localsgd.engines.packed`), one worker per torchrun
# process, or an engine the caller built (the plan then only fixes device and numerics)
ENGINES = ("sequential", "batched", "packed", "ddp", "given")
# who asks for a plan: `localsgd.training.loop.train` with its replica engine, the torchrun runner,
# a caller's own engine, a pack of runs (`localsgd.training.packs`, always the batched engine), or
# a replica engine built on its own (`localsgd.training.loop.build_engine` outside `train`)
RUNNERS = ("replicas", "ddp", "given", "pack", "engine")


@dataclass(frozen=True)
class RunPlan:
    """Everything a machine decided about running one config (`plan_run`); frozen.

    Attributes:
        device: where this process's workers live (cuda:LOCAL_RANK under torchrun).
        engine: one of `ENGINES`.
        threads: host threads the sequential engine spreads its replicas over, torch's intra-op
            threads set to 1 for the run (0: torch's threads left alone).
        precision: the float32 matmul precision in force (`localsgd.numerics.PRECISIONS`).
        deterministic: deterministic kernels asked.
        memory_format: the layout batches are handed to the model in ('contiguous' or
            'channels_last').
        compile: the batched engine compiles its step (`TrainConfig.compile_replicas`).
    """

    device: torch.device
    engine: str
    threads: int
    precision: str
    deterministic: bool
    memory_format: str
    compile: bool

    @property
    def batched(self) -> bool:
        """The batched replica engine (vmapped or packed) runs the workers."""
        return self.engine in ("batched", "packed")

    @property
    def packed(self) -> bool:
        return self.engine == "packed"

    @property
    def layout(self) -> torch.memory_format:
        return (torch.channels_last if self.memory_format == "channels_last"
                else torch.contiguous_format)

    def applied(self, cfg: TrainConfig) -> TrainConfig:
        """``cfg`` with its 'auto' fields as this plan runs them (what the records show)."""
        return cfg.run_as(precision=self.precision, batched=self.batched, packed=self.packed)

    def to_dict(self) -> dict:
        """The plan as JSON (checkpoints' ``ran``, provenance)."""
        return {**dataclasses.asdict(self), "device": str(self.device)}


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


def _host_threads(cfg: TrainConfig, device: torch.device, engine: str, runner: str) -> int:
    """`TrainConfig.host_threads` (0 resolved from torch's intra-op threads now), or 0 where
    torch's threads are left alone: off the CPU, any engine but the sequential one, or a single
    worker. A sequential engine built on its own (runner 'engine') takes ``cfg.host_threads`` as
    it is: only `localsgd.training.loop.train` sets torch's threads to 1 for the replicas'."""
    if runner == "engine":
        return cfg.host_threads if engine == "sequential" else 0
    if (device.type != "cpu" or engine != "sequential"
            or (cfg.world_size < 2 and not cfg.host_threads)):
        return 0
    return cfg.host_threads or min(cfg.world_size, torch.get_num_threads())


def plan_run(cfg: TrainConfig, runner: str = "replicas", *,
             placement: device_rule.Placement | None = None) -> RunPlan:
    """The `RunPlan` of ``cfg`` on this machine, for ``runner`` (one of `RUNNERS`).

    The device comes from ``placement`` (`torchrun_placement`, which the torchrun runner calls
    before joining its process group) or from `localsgd.device`'s rule for one process (an
    absent GPU or index is a `localsgd.device.DeviceError` naming the fix). The engine: 'ddp'
    under torchrun; for the replicas the batched one where `use_batched` says so, packed where
    `use_packed` says so; a pack of runs is always batched."""
    if runner not in RUNNERS:
        raise ValueError(f"runner {runner!r}; valid: {RUNNERS}")
    if runner == "ddp" and cfg.batched is True:
        raise ValueError("batched=True vmaps K replicas in one process; the ddp engine runs one "
                         "worker per process: set batched=False (or 'auto')")
    device = (placement.device if placement is not None
              else device_rule.resolve_from_env(cfg.device, torchrun=False).device)
    batched = True if runner == "pack" else use_batched(
        cfg, device, replicas=runner in ("replicas", "engine"))
    if batched:
        engine = "packed" if use_packed(cfg, device) else "batched"
    else:
        engine = {"replicas": "sequential", "engine": "sequential", "ddp": "ddp",
                  "given": "given"}[runner]
    threads = _host_threads(cfg, device, engine, runner)
    # the run sets torch's threads to 1 when it spreads replicas over host threads: the layout
    # is chosen for the threads an op will have
    layout = numerics.memory_format(cfg.memory_format, device, threads=1 if threads else None)
    return RunPlan(device=device, engine=engine, threads=threads,
                   precision=numerics.resolve_precision(cfg.precision, device),
                   deterministic=cfg.deterministic,
                   memory_format="channels_last" if layout == torch.channels_last
                   else "contiguous",
                   compile=bool(cfg.compile_replicas) and batched)


def torchrun_placement(cfgs: list[TrainConfig], backend: str | None) -> device_rule.Placement:
    """Where this torchrun process's worker lives for ``cfgs`` (one run, or a sweep's runs in one
    launch): `localsgd.device`'s rule for a torchrun rank, resolved before the process group is
    joined and handed to `plan_run` as its ``placement``. One launch joins one process group on
    one device, so every config must ask for the same one (a ValueError otherwise)."""
    devices = sorted({str(cfg.device) for cfg in cfgs})
    if len(devices) > 1:
        raise ValueError(f"the sweep's runs ask for devices {devices}; one launch joins one "
                         "process group on one device: give every run the same device")
    return device_rule.resolve_from_env(cfgs[0].device, backend, torchrun=True)


def check_replica_memory(cfg: TrainConfig, num_classes: int, input_shape: tuple[int, ...],
                         free_bytes: int, reserve_bytes: int = 1 << 30, *,
                         batched: bool) -> None:
    """Raise a ValueError naming the largest K that fits when the replica engine's K replicas
    (`localsgd.memory`'s estimate: parameters, gradients, optimizer and outer state, buffers,
    inputs, activations at B_loc; ``batched``: the plan's engine, vmapped, or the sequential
    one) need more than ``free_bytes`` less ``reserve_bytes`` (the CUDA context and allocator
    slack)."""
    dtype = getattr(torch, cfg.dtype)

    def model_fn() -> nn.Module:
        return models_mod.build_model(cfg.model, num_classes=num_classes, width=cfg.width)

    outer = cfg.momentum_scheme in ("global", "hybrid") or cfg.slowmo_frequency is not None
    kw = {"batched": batched, "outer": outer,
          "optimizer": ("adam" if cfg.optimizer == "adamw"  # two moments a parameter
                        else "sgd_momentum" if cfg.momentum > 0 else "sgd")}
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


def fit_to_memory(plan: RunPlan, cfg: TrainConfig, num_classes: int,
                  input_shape: tuple[int, ...], free_bytes: int) -> RunPlan:
    """``plan`` if ``cfg``'s K replicas fit ``free_bytes`` of its device, the sequential
    engine's plan if 'auto' chose the batched one and only that does not fit; else
    `check_replica_memory`'s error. (``cfg``: the config as asked.)"""
    try:
        check_replica_memory(cfg, num_classes, input_shape, free_bytes, batched=plan.batched)
    except ValueError:
        if not (cfg.batched == "auto" and plan.batched):
            raise
        # 'auto' chose the batched engine, whose K replicas' activations do not fit at once
        print(f"batched replicas of {cfg.model} do not fit: running them one after another")
        check_replica_memory(cfg, num_classes, input_shape, free_bytes, batched=False)
        plan = dataclasses.replace(plan, engine="sequential", compile=False)
    return plan
