"""A torchrun target: time ``--repeats`` gloo all-reduces of a ``--mb`` MB float32 buffer
(Figure 1 of Lin et al. 2020 on the emulated cluster, `localsgd.paper.cluster_bench`).

Each repeat starts after a barrier, and its time is the slowest rank's, since an all-reduce has
ended only when every rank holds the sum. A small all-reduce first opens gloo's connections, so
they are not timed. Rank 0 writes ``{"world_size", "seconds": [...]}`` to ``--out``."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="allreduce_worker")
    p.add_argument("--mb", type=float, required=True)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    dist.init_process_group("gloo")
    buf = torch.ones(int(args.mb * 2**20) // 4)
    dist.all_reduce(torch.ones(16))  # connections open
    seconds = []
    for _ in range(args.repeats):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        seconds.append(time.perf_counter() - t0)
    slowest = torch.tensor(seconds, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        args.out.write_text(json.dumps({"world_size": dist.get_world_size(),
                                        "seconds": slowest.tolist()}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
