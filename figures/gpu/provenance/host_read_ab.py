"""Paired: engine.step with a host read per update (sync=True, as train() did) vs none (sync=False,
read once per window of 24 updates, as train() now does per record). ResNet-20 CIFAR, tf32, NCHW."""
import json, statistics, sys, time
import torch
from localsgd.engines.replicas import ReplicaEngine
from localsgd.engines.batched import BatchedReplicaEngine
from localsgd.models import build_model
from localsgd.schedule import SyncSchedule
from localsgd.topology import Topology
from localsgd.numerics import resolve_precision  # noqa
torch.backends.cuda.matmul.allow_tf32 = True; torch.backends.cudnn.allow_tf32 = True
torch.backends.cudnn.benchmark = True
dev = torch.device("cuda")
loss_fn = torch.nn.functional.cross_entropy
out = []
for cls, k, H in [(BatchedReplicaEngine, 16, 8), (ReplicaEngine, 16, 8), (BatchedReplicaEngine, 2, 1), (ReplicaEngine, 2, 1)]:
    e = cls(lambda: build_model("resnet20", 10), SyncSchedule(Topology.from_paper(k, H)),
            lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-4), seed=0, average_buffers=True, device=dev)
    g = torch.Generator(device=dev).manual_seed(0)
    b = [(torch.randn(128, 3, 32, 32, device=dev, generator=g), torch.randint(0, 10, (128,), device=dev, generator=g)) for _ in range(k)]
    for _ in range(5): e.step(b, loss_fn, stats={})
    torch.cuda.synchronize()
    rates = {True: [], False: []}
    for w in range(6):
        for sync in (True, False) if w % 2 == 0 else (False, True):
            torch.cuda.synchronize(); t0 = time.perf_counter(); pend = []
            for _ in range(24):
                st = {}
                losses, _ = e.step(b, loss_fn, stats=st, sync=sync)
                pend.append((losses, st))
            if not sync:
                torch.stack([l for l, _ in pend]).tolist(); [st["compute_seconds"].get() for _, st in pend]
            torch.cuda.synchronize()
            rates[sync].append(24 * k * 128 / (time.perf_counter() - t0))
    row = {"engine": cls.__name__, "K": k, "H": H, "per_update_read_img_s": round(statistics.median(rates[True])),
           "per_window_read_img_s": round(statistics.median(rates[False])),
           "ratio": round(statistics.median(rates[False]) / statistics.median(rates[True]), 3),
           "windows": 6, "updates_per_window": 24}
    print(json.dumps(row), flush=True); out.append(row)
    del e
json.dump(out, open(sys.argv[1], "w"), indent=1)
