"""Benchmark: training samples/s of the replica engines vs plain PyTorch training one model.

``localsgd bench replicas --world 4 --batch 32 --steps 5 --json`` builds the paper's CIFAR
ResNet-20 (``localsgd.models.build_model``, 10 classes) and times, interleaved in rounds so all
three share the machine's noise:

* ``single``: one model, ``torch.optim.SGD(lr 0.1, momentum 0.9, weight decay 1e-4)``, batch B
  (the floor: what one worker costs without any replica machinery);
* ``replica``: `localsgd.engines.replicas.ReplicaEngine`, K replicas of batch B each, run one
  after the other (K * B samples per step), local SGD averaging parameters and BN buffers every H
  steps;
* ``batched``: `localsgd.engines.batched.BatchedReplicaEngine`, the same K replicas as one vmapped
  forward/backward;
* ``replica_channels_last`` (with ``--layouts``): the sequential engine fed channels-last (NHWC)
  batches, the layout `localsgd.numerics.memory_format` picks for single-threaded CPU runs;
* ``replica_host_threads`` (with ``--host-threads N``): the sequential engine with its replicas
  spread over N host threads, every op single-threaded, on channels-last batches: what
  `localsgd.training.loop.train` runs on a CPU (`TrainConfig.host_threads`). Its windows run with
  one torch thread, the others with ``--threads``.

Inputs are random uint8-like images [B, 3, 32, 32] scaled to [0, 1] and random labels: a speed
benchmark, not a training run. Each round times a window of ``--steps`` engine steps and
K * ``--steps`` single-model steps (the same number of samples); ``--warmup`` untimed steps of
each come first. samples/s = samples in the window / its wall time; the JSON line reports the
median over ``--rounds`` windows. The sequential engine should be within a few per cent of
``single`` (DESIGN: the engine adds averaging, not per-step overhead); the batched engine's
speed depends on how well the device runs grouped convolutions (on CPU usually slower than K
separate ones; on a GPU it replaces K small launches by one large one -- unmeasured here).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from localsgd.engines.batched import BatchedReplicaEngine
from localsgd.engines.replicas import ReplicaEngine
from localsgd.models import build_model
from localsgd.paper.bench.common import emit, machine
from localsgd.schedule import SyncSchedule
from localsgd.topology import Topology


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="localsgd bench replicas", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=4, help="replicas K (default 4)")
    ap.add_argument("--batch", type=int, default=32, help="local batch B per replica")
    ap.add_argument("--steps", type=int, default=5, help="engine steps per timed window")
    ap.add_argument("--rounds", type=int, default=5, help="timed windows per configuration")
    ap.add_argument("--warmup", type=int, default=3, help="untimed engine steps first")
    ap.add_argument("--width", type=float, default=1.0, help="ResNet-20 channel multiplier")
    ap.add_argument("--period", type=int, default=4, help="local steps H between averages")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: torch's own choice)")
    ap.add_argument("--layouts", action="store_true",
                    help="also time the sequential engine on channels-last batches")
    ap.add_argument("--host-threads", type=int, default=0, metavar="N",
                    help="also time the replicas spread over N host threads (one torch thread "
                         "per op, channels-last), as localsgd.training.loop runs them on a CPU")
    ap.add_argument("--json", action="store_true", help="print one JSON line only")
    args = ap.parse_args(argv)
    for name in ("world", "batch", "steps", "rounds", "period"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        raise SystemExit(f"--warmup must be >= 0, got {args.warmup}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()  # of every window but the host-threaded one's

    device = torch.device(args.device)
    k, b = args.world, args.batch

    def model_fn() -> nn.Module:
        return build_model("resnet20", num_classes=10, width=args.width)

    def optimizer_fn(params) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4)

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, 256, (b, 3, 32, 32), generator=g).float().div(255).to(device),
                torch.randint(0, 10, (b,), generator=g).to(device)) for _ in range(k)]
    loss_fn = nn.functional.cross_entropy
    schedule = SyncSchedule(Topology.from_paper(k, args.period))
    engines = {name: cls(model_fn, schedule, optimizer_fn, seed=0, average_buffers=True,
                         device=device)
               for name, cls in (("replica", ReplicaEngine), ("batched", BatchedReplicaEngine),
                                 ("replica_channels_last", ReplicaEngine))}
    if args.host_threads:
        engines["replica_host_threads"] = ReplicaEngine(
            model_fn, schedule, optimizer_fn, seed=0, average_buffers=True, device=device,
            threads=args.host_threads)
    nhwc = [(x.contiguous(memory_format=torch.channels_last), y) for x, y in batches]
    torch.manual_seed(0)
    model = model_fn().to(device)
    opt = optimizer_fn(model.parameters())
    x0, y0 = batches[0]

    def single_step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x0), y0)
        loss.backward()
        opt.step()  # no host read, like the engines' steps with sync=False below

    def engine_step(name: str, inputs) -> Callable[[], Any]:
        return lambda: engines[name].step(inputs, loss_fn, sync=False)

    # name -> (one step, steps per window, samples per step)
    runs = {
        "single": (single_step, k * args.steps, b),
        "replica": (engine_step("replica", batches), args.steps, k * b),
        "batched": (engine_step("batched", batches), args.steps, k * b),
    }
    if args.layouts:
        runs["replica_channels_last"] = (engine_step("replica_channels_last", nhwc), args.steps,
                                         k * b)
    if args.host_threads:
        runs["replica_host_threads"] = (engine_step("replica_host_threads", nhwc), args.steps,
                                        k * b)
    names = list(runs)

    def torch_threads(name: str) -> None:
        torch.set_num_threads(1 if name == "replica_host_threads" else threads)

    t_start = time.perf_counter()
    for name in names:
        step, per_window, _ = runs[name]
        torch_threads(name)
        for _ in range(args.warmup * per_window // args.steps):
            step()
    rates: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.rounds):
        # rotate the order every round so no configuration always follows another
        for name in names[r % len(names):] + names[:r % len(names)]:
            step, per_window, samples = runs[name]
            torch_threads(name)
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(per_window):
                step()
            _sync(device)
            rates[name].append(per_window * samples / (time.perf_counter() - t0))
    med = {name: statistics.median(v) for name, v in rates.items()}
    out = {
        "replica_samples_per_s": round(med["replica"], 1),
        "single_samples_per_s": round(med["single"], 1),
        "batched_samples_per_s": round(med["batched"], 1),
        "replica_over_single": round(med["replica"] / med["single"], 4),
        "batched_over_single": round(med["batched"] / med["single"], 4),
        "batched_over_replica": round(med["batched"] / med["replica"], 4),
        **({"replica_channels_last_samples_per_s": round(med["replica_channels_last"], 1),
            "channels_last_over_replica": round(med["replica_channels_last"] / med["replica"], 4)}
           if args.layouts else {}),
        **({"replica_host_threads_samples_per_s": round(med["replica_host_threads"], 1),
            "host_threads_over_replica": round(med["replica_host_threads"] / med["replica"], 4),
            "host_threads": args.host_threads} if args.host_threads else {}),
        "torch_threads": threads,
        "model": "resnet20",
        "width": args.width,
        "params": sum(p.numel() for p in model.parameters()),
        "world": k,
        "batch": b,
        "period": args.period,
        "steps": args.steps,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "inputs": "random uint8-like [B, 3, 32, 32] in [0, 1], random labels (speed only)",
        "device": str(device),
        "wall_s": round(time.perf_counter() - t_start, 2),
        "machine": machine(),
    }
    emit(out, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
