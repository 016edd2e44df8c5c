"""Benchmark: the long proxy's pilot grid -- one ResNet-20 worker's training speed on this CPU
over the levers a proxy may pull (issue 62: resolution, width, batch, memory layout, numerics).

``localsgd bench proxy --json`` times, for each point of the grid, a window of ``--steps``
training steps of `localsgd.models.build_model('resnet20', width=w)` (SGD, momentum 0.9, weight
decay 1e-4, cross-entropy) on random images [B, 3, r, r] and labels, after ``--warmup`` untimed
steps; each point's figure is the median over ``--rounds`` windows, the points interleaved round
by round so they share the machine's noise. It reports images/s, ms per step, the step's
FLOPs (forward + backward counted by ``torch.utils.flop_counter``) and the fraction of the
machine's measured matmul rate (a [n, n] @ [n, n] product in the same dtype and thread count,
`matmul_rate`) the step reaches. ``precision='bf16'`` runs the step under CPU autocast to
bfloat16 (AMX / AVX-512-BF16 where the CPU has them). A speed benchmark, not a training run:
what a run costs follows from it as updates x ms per step (the pilot's table in docs/).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import time
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from localsgd.models import build_model
from localsgd.paper.bench.common import emit, machine

__all__ = ["main", "matmul_rate", "step_flops"]


def matmul_rate(dtype: torch.dtype = torch.float32, n: int = 1024, reps: int = 20) -> float:
    """The machine's matmul rate in GFLOP/s at this process's torch threads (median of
    ``reps`` products of two [n, n] matrices of ``dtype``)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * n**3 / statistics.median(times) / 1e9


def _autocast(precision: str) -> contextlib.AbstractContextManager:
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


class _Point:
    """One grid point: a model, its optimizer and a fixed batch, ready to step."""

    def __init__(self, width: float, res: int, batch: int, layout: str, precision: str):
        self.key = {"width": width, "resolution": res, "batch": batch, "layout": layout,
                    "precision": precision}
        self.precision = precision
        fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        self.model = build_model("resnet20", width=width).to(memory_format=fmt)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9,
                                   weight_decay=1e-4)
        gen = torch.Generator().manual_seed(0)
        self.x = torch.rand(batch, 3, res, res, generator=gen).contiguous(memory_format=fmt)
        self.y = torch.randint(0, 10, (batch,), generator=gen)
        self.loss = nn.CrossEntropyLoss()
        self.times: list[float] = []

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        with _autocast(self.precision):
            out = self.model(self.x)
        self.loss(out.float(), self.y).backward()
        self.opt.step()

    def flops(self) -> float:
        return step_flops(self.step)


def step_flops(step) -> float:
    """FLOPs of one call of ``step`` (forward and backward) as torch's flop counter counts them."""
    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return float(counter.get_total_flops())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="localsgd bench proxy", description=__doc__.split("\n")[0])
    p.add_argument("--widths", type=float, nargs="+", default=[1.0, 0.5, 0.25])
    p.add_argument("--resolutions", type=int, nargs="+", default=[32, 16])
    p.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--layouts", nargs="+", default=["channels_last", "contiguous"],
                   choices=["channels_last", "contiguous"])
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--steps", type=int, default=5, help="steps per timed window")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", action="store_true", help="one JSON line")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    points = [_Point(w, r, b, lay, prec) for w, r, b, lay, prec in itertools.product(
        args.widths, args.resolutions, args.batches, args.layouts, args.precisions)]
    flops = [pt.flops() for pt in points]
    for pt in points:
        for _ in range(args.warmup):
            pt.step()
    for _ in range(args.rounds):
        for pt in points:
            t = time.perf_counter()
            for _ in range(args.steps):
                pt.step()
            pt.times.append((time.perf_counter() - t) / args.steps)
    rates = {"fp32": matmul_rate(torch.float32), "bf16": matmul_rate(torch.bfloat16)}
    rows: list[dict[str, Any]] = []
    for pt, f in zip(points, flops, strict=True):
        s = statistics.median(pt.times)
        rows.append({**pt.key, "ms_per_step": 1e3 * s, "img_per_s": pt.key["batch"] / s,
                     "gflop_per_step": f / 1e9,
                     "matmul_fraction": f / s / 1e9 / rates[pt.key["precision"]]})
    emit({"machine": machine(), "matmul_gflops": rates, "steps": args.steps,
          "rounds": args.rounds, "points": rows}, args.json,
         summary="\n".join(
             f"w={r['width']:<5g} r={r['resolution']:<3d} B={r['batch']:<4d} "
             f"{r['layout']:<13s} {r['precision']:<5s} {r['ms_per_step']:8.1f} ms "
             f"{r['img_per_s']:8.0f} img/s  {r['matmul_fraction']:.3f} of matmul"
             for r in rows))


if __name__ == "__main__":
    main()
