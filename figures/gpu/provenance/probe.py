"""GPU throughput sweep (one-off, first lent GPU): ResNet-20 CIFAR shapes, images/s.

single model at B and at K*B, ReplicaEngine (K sequential), BatchedReplicaEngine (vmap), for
precision fp32 (TF32 off) / tf32 / bf16 autocast and NCHW / NHWC inputs. Medians of windows.
"""
import csv
import json
import statistics
import sys
import time

import torch
from torch import nn

from localsgd.engines.replicas import ReplicaEngine
from localsgd.engines.batched import BatchedReplicaEngine
from localsgd.models import build_model
from localsgd.numerics import apply_numerics, autocast
from localsgd.schedule import SyncSchedule
from localsgd.topology import Topology

out_path = sys.argv[1]
budget_s = float(sys.argv[2]) if len(sys.argv) > 2 else 200.0
import os
dev = torch.device(os.environ.get("PROBE_DEV", "cuda"))
K, B, H = int(os.environ.get("PROBE_K", 16)), int(os.environ.get("PROBE_B", 128)), 8
loss_fn = nn.functional.cross_entropy
t_begin = time.perf_counter()


def model_fn():
    return build_model("resnet20", num_classes=10, width=1.0)


def opt_fn(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4)


g = torch.Generator().manual_seed(0)
xs = [torch.rand((B, 3, 32, 32), generator=g).to(dev) for _ in range(K)]
ys = [torch.randint(0, 10, (B,), generator=g).to(dev) for _ in range(K)]


def single_fn(batch, fmt, prec):
    torch.manual_seed(0)
    m = model_fn().to(dev).to(memory_format=fmt)
    o = opt_fn(m.parameters())
    x = torch.cat(xs)[:batch].contiguous(memory_format=fmt)
    y = torch.cat(ys)[:batch]

    def step():
        o.zero_grad(set_to_none=True)
        with autocast(prec, dev):
            loss = loss_fn(m(x), y)
        loss.backward()
        o.step()
        return float(loss.detach())  # one host sync per step, as the engines do today
    return step


def engine_fn(cls, fmt, prec):
    sched = SyncSchedule(Topology.from_paper(K, H))
    e = cls(model_fn, sched, opt_fn, seed=0, average_buffers=True, device=dev)
    batches = [(x.contiguous(memory_format=fmt), y) for x, y in zip(xs, ys)]

    def step():
        with autocast(prec, dev):
            e.step(batches, loss_fn)
    return step


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


rows = []
configs = []
for prec in ("fp32", "tf32", "bf16"):
    for fmt_name, fmt in (("nchw", torch.contiguous_format), ("nhwc", torch.channels_last)):
        configs += [(prec, fmt_name, "single_b128", lambda f=fmt, p=prec: single_fn(B, f, p), B, K),
                    (prec, fmt_name, "single_b2048", lambda f=fmt, p=prec: single_fn(K * B, f, p), K * B, 1),
                    (prec, fmt_name, "replica_k16_b128", lambda f=fmt, p=prec: engine_fn(ReplicaEngine, f, p), K * B, 1)]
        if fmt_name == "nhwc" and "replica_nhwc" in os.environ.get("PROBE_SKIP", ""):
            configs.pop()  # crashed on CUDA (misaligned address) in the first run
        if fmt_name == "nchw" or os.environ.get("PROBE_ONLY"):
            configs.append((prec, fmt_name, "batched_k16_b128",
                            lambda f=fmt, p=prec: engine_fn(BatchedReplicaEngine, f, p), K * B, 1))
only = os.environ.get("PROBE_ONLY", "").split()
if only:
    configs = [c for c in configs if "/".join(c[:3]) in only]

for prec, fmt_name, name, make, samples, reps in configs:
    if time.perf_counter() - t_begin > budget_s:
        print("budget spent, skipping", prec, fmt_name, name, flush=True)
        continue
    apply_numerics(prec, False, dev)  # cudnn.benchmark on (non-deterministic), TF32 per prec
    err = ""
    rates = []
    try:
        step = make()
        for _ in range(3 * reps):
            step()
        sync()
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(4 * reps):
                step()
            sync()
            rates.append(4 * reps * samples / (time.perf_counter() - t0))
    except Exception as exc:  # record and go on: a sweep, not a test
        err = f"{type(exc).__name__}: {str(exc)[:200]}"
    med = statistics.median(rates) if rates else float("nan")
    row = dict(precision=prec, layout=fmt_name, config=name, images_per_s=round(med, 1),
               windows=len(rates), min=round(min(rates), 1) if rates else "",
               max=round(max(rates), 1) if rates else "", error=err)
    rows.append(row)
    print(json.dumps(row), flush=True)
    if dev.type == "cuda":
        torch.cuda.empty_cache()

with open(out_path, "w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
print("probe wall s", round(time.perf_counter() - t_begin, 1))
