"""Session 2026-11-27, calls 14-15 (argv: OUT [seeds [which [small]]]): seed-0 probes of two converged parameter files before the CPU
trains them (exploratory, one seed, not verdicts): SlowMo's converged file as committed (K = 4,
lr 0.4, warm-up 1 epoch: H = 1, local SGD alone, SlowMo beta 0.4), and Table 3's converged file
changed to the smallest K that keeps its shape, 2x2 (K = 4, blocks of 2), lr 0.1 without App. C's
tricks (as Figure 9's converged file, whose H^b = 1 reached 75.5 % on the CPU), at its three
(H, H^b). Device cuda, engine/precision auto (fallback: sequential engine). Writes
OUT/<tag>_<i>.csv and OUT/converged_probe.json after every run."""
import json, sys, time, types
from pathlib import Path
import torch
from localsgd.paper.experiments import slowmo
from localsgd.paper.experiments.lin2020 import table03
from localsgd.paper import gpu_plan
from localsgd.train import train
import dataclasses
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
dev = "cuda" if torch.cuda.is_available() else "cpu"
nbs = Path("notebooks")
seeds = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else [0]
which = sys.argv[3].split(",") if len(sys.argv) > 3 else ["slowmo", "table03"]
small = len(sys.argv) > 4  # CPU test of the script: tiny data
def params(nb, **kw):
    p = gpu_plan.notebook_params(nbs, [nb], mode="converged")[nb]
    p.update(device=dev, batched="auto", **kw)
    if small:
        p.update(n_train=512, n_test=256, epochs=1.0)
    return types.SimpleNamespace(**p)
jobs = []
if "table03" in which:
    c, l = table03.configs(params("table03_topologies", K=4, topologies=["2x2"], tricks=False), seeds)
    jobs += [("table03_2x2", x, y) for x, y in zip(c, l)]
if "slowmo" in which:
    c, l = slowmo.configs(params("slowmo"), seeds); jobs += [("slowmo", x, y) for x, y in zip(c, l)]
summary = []
for i, (tag, cfg, lab) in enumerate(jobs):
    t0 = time.perf_counter()
    try:
        rec = train(cfg, progress=False); eng = "auto"
    except Exception as e:  # an engine that cannot run this configuration: the sequential one
        print(tag, i, "auto failed:", repr(e)[:300], flush=True)
        cfg = dataclasses.replace(cfg, batched=False); rec = train(cfg, progress=False); eng = "sequential"
    rec.to_csv(out / f"{tag}_{i}_s{cfg.seed}.csv", index=False)
    row = {"tag": tag, **{k: str(v) for k, v in lab.items()}, "K": cfg.world_size,
           "H": cfg.local_steps, "Hb": cfg.block_steps, "lr": cfg.lr, "seed": cfg.seed,
           "engine": eng, "wall_s": round(time.perf_counter() - t0, 1),
           "final_test_acc": float(rec["test_acc"].iloc[-1]),
           "best_test_acc": float(rec["test_acc"].max()),
           "final_train_acc": float(rec["train_acc"].iloc[-1]) if "train_acc" in rec else None,
           "epochs": float(rec["epoch"].iloc[-1])}
    print(row, flush=True)
    summary.append(row)
    json.dump({"runs": summary, "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
               "configs": [j[1].to_dict() for j in jobs]},
              open(out / "converged_probe.json", "w"), indent=1, default=str)
