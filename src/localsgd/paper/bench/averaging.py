"""Benchmark: one model-averaging call, ours vs torch's ``average_parameters`` vs a bare all-reduce.

``localsgd bench averaging --world 4 --params 270000 --json`` spawns W gloo processes on CPU,
builds a parameter set of about N floats with realistic tensor shapes (ResNet-20 CIFAR shapes
near 0.27M, torchvision ResNet-18 shapes near 11M, a width-scaled ResNet-20 otherwise) and times,
interleaved in rounds, (a) ``PeriodicAverager(period=1)`` from :mod:`localsgd.averaging`,
(b) ``torch.distributed.algorithms.model_averaging.utils.average_parameters`` and (c) a bare
``all_reduce`` of a preallocated flat buffer of the same size (the floor). The time of a call is
the slowest rank's; the JSON line reports medians in milliseconds.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.model_averaging.utils import average_parameters

from localsgd.averaging import PeriodicAverager
from localsgd.distributed import spawn
from localsgd.paper.bench.common import emit, machine


def resnet20_shapes(width: float = 1.0) -> list[tuple[int, ...]]:
    """Parameter shapes of the CIFAR ResNet-20 of He et al. (option-A shortcuts, 0.27M params);
    ``width`` scales every channel count."""
    c = [max(1, round(16 * width)), max(1, round(32 * width)), max(1, round(64 * width))]
    shapes: list[tuple[int, ...]] = [(c[0], 3, 3, 3), (c[0],), (c[0],)]
    cin = c[0]
    for cout in c:
        for _ in range(3):
            for _ in range(2):
                shapes += [(cout, cin, 3, 3), (cout,), (cout,)]
                cin = cout
    return shapes + [(10, c[2]), (10,)]


def resnet18_shapes() -> list[tuple[int, ...]]:
    """Parameter shapes of torchvision's ResNet-18 (11.7M params), built on the meta device."""
    import torchvision  # deferred: a slow import, needed only for this shape list

    with torch.device("meta"):
        model = torchvision.models.resnet18()
    return [tuple(p.shape) for p in model.parameters()]


def _numel(shapes) -> int:
    return sum(math.prod(s) for s in shapes)


def shapes_for(n: int) -> list[tuple[int, ...]]:
    """A realistic shape list with about ``n`` elements."""
    if n < 1:
        raise ValueError(f"params must be a positive number of floats, got {n}")
    r20 = resnet20_shapes()
    if abs(n / _numel(r20) - 1) < 0.1:
        return r20
    r18 = resnet18_shapes()
    if abs(n / _numel(r18) - 1) < 0.1:
        return r18
    return resnet20_shapes(math.sqrt(n / _numel(r20)))  # convolutions grow with width squared


def _make(shapes, seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]


def _worker(rank: int, world: int, shapes, repeats: int, warmup: int) -> dict | None:
    # Three independent parameter sets: torch's function rebinds .data, which must not disturb
    # ours (our parameters are views of our flat buffer).
    ours_params = _make(shapes, rank)
    ours_copy_params = _make(shapes, rank)
    torch_params = _make(shapes, rank)
    floor_buf = torch.randn(_numel(shapes), generator=torch.Generator().manual_seed(rank))
    ours = PeriodicAverager(period=1)
    ours_copy = PeriodicAverager(period=1, adopt=False)
    methods = {
        "ours": lambda: ours.average_parameters(ours_params),
        "ours_copy": lambda: ours_copy.average_parameters(ours_copy_params),
        "torch": lambda: average_parameters(iter(torch_params), dist.group.WORLD),
        "allreduce": lambda: dist.all_reduce(floor_buf),
    }
    names = list(methods)
    times = {k: [] for k in names}
    for r in range(warmup + repeats):
        # Rotate the order every round so no method always runs right after another.
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            dist.barrier()
            t0 = time.perf_counter()
            methods[name]()
            dt = time.perf_counter() - t0
            if r >= warmup:
                times[name].append(dt)
    # The slowest rank finishes the collective last: that is the call's cost.
    table = torch.tensor([times[k] for k in names], dtype=torch.float64)
    dist.all_reduce(table, op=dist.ReduceOp.MAX)
    if rank != 0:
        return None
    return {k: 1e3 * statistics.median(table[i].tolist()) for i, k in enumerate(names)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="localsgd bench averaging", description=__doc__)
    ap.add_argument("--world", type=int, default=4, help="number of gloo processes")
    ap.add_argument("--params", type=int, default=270_000, help="floats in the parameter set")
    ap.add_argument("--repeats", type=int, default=30, help="timed rounds")
    ap.add_argument("--warmup", type=int, default=5, help="untimed rounds first")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--json", action="store_true", help="print one JSON line only")
    args = ap.parse_args(argv)
    if args.world < 2:
        raise SystemExit(f"--world must be >= 2 to average anything, got {args.world}")
    if args.repeats < 1 or args.warmup < 0:
        raise SystemExit("--repeats must be >= 1 and --warmup >= 0")

    shapes = shapes_for(args.params)
    t0 = time.perf_counter()
    res = spawn(_worker, args.world, shapes, args.repeats, args.warmup, threads=args.threads)[0]
    out = {
        "ours_ms": round(res["ours"], 4),
        "torch_ms": round(res["torch"], 4),
        "allreduce_ms": round(res["allreduce"], 4),
        "ours_copy_ms": round(res["ours_copy"], 4),
        "ours_over_floor": round(res["ours"] / res["allreduce"], 4),
        "ours_over_torch": round(res["ours"] / res["torch"], 4),
        "world": args.world,
        "params": _numel(shapes),
        "tensors": len(shapes),
        "repeats": args.repeats,
        "warmup": args.warmup,
        "threads": args.threads,
        "backend": "gloo",
        "wall_s": round(time.perf_counter() - t0, 2),
        "machine": machine(),
    }
    emit(out, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
