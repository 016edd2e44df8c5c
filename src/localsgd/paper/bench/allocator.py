"""``localsgd bench allocator``: training images/s of one CPU model with glibc's default
allocator against `ALLOCATOR_ENV` (freed memory kept in the process: what `localsgd reproduce`
gives its kernels, `allocator_env`), each in its own fresh process (glibc reads the variables
at start), alternating, median over ``--pairs`` paired runs, with the ratio of each pair.

On a 2-core AMD EPYC the default allocator spent half of a batch-2,048 step in the kernel
(mmap / munmap and zeroing fresh pages each step)."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

__all__ = ["ALLOCATOR_ENV", "allocator_env", "main", "step_rate"]

# glibc's allocator returns every large freed block to the kernel (mmap/munmap) and takes it
# back with fresh zeroed pages on the next step: on a 2-core AMD EPYC half the CPU time of a
# batch-2,048 ResNet-20 step went to the kernel. Keeping freed memory in the process gives
# several times the images/s at batch 2,048 (docs/notebooks.md, "Allocator"); results bitwise
# unchanged (where memory comes from does not change arithmetic). Kernels inherit these.
ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2**32), "MALLOC_TRIM_THRESHOLD_": str(2**36)}


def allocator_env() -> dict[str, str]:
    """Set `ALLOCATOR_ENV` for the processes this one starts (notebook kernels), where the caller has
    not set the variables itself; returns what is in force."""
    for var, value in ALLOCATOR_ENV.items():
        os.environ.setdefault(var, value)
    return {var: os.environ[var] for var in ALLOCATOR_ENV}


def step_rate(model: str, width: float, batch: int, steps: int) -> float:
    """Images/s of ``steps`` SGD steps (after 2 untimed ones) on random CIFAR-shaped inputs,
    median step time."""
    import torch

    from localsgd.models import build_model

    torch.manual_seed(0)
    net = build_model(model, 10, width)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    times = []
    for i in range(steps + 2):
        t = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        if i >= 2:
            times.append(time.perf_counter() - t)
    return batch / statistics.median(times)


def _child(args: argparse.Namespace, env: dict[str, str]) -> float:
    code = ("import sys; from localsgd.paper.bench.allocator import step_rate; "
            f"print(step_rate({args.model!r}, {args.width}, {args.batch}, {args.steps}))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    from localsgd.paper.bench.common import emit, machine  # deferred: imports torch

    p = argparse.ArgumentParser(prog="localsgd bench allocator", description=__doc__)
    p.add_argument("--model", default="resnet20")
    p.add_argument("--width", type=float, default=0.5)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    base = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_ENV}
    default, kept = [], []
    for _ in range(args.pairs):
        default.append(_child(args, base))
        kept.append(_child(args, {**base, **ALLOCATOR_ENV}))
    ratios = [k / d for k, d in zip(kept, default, strict=True)]
    out = {"model": args.model, "width": args.width, "batch": args.batch, "steps": args.steps,
           "images_per_s_default": statistics.median(default),
           "images_per_s_kept": statistics.median(kept),
           "ratio_median": statistics.median(ratios), "ratios": ratios,
           "allocator_env": ALLOCATOR_ENV, "machine": machine()}
    emit(out, args.json, summary=f"kept / default allocator: {out['ratio_median']:.2f}x "
                                 f"(median of {args.pairs} pairs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
