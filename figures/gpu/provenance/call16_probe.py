"""Session 2026-11-27 (sixth GPU session), call 16 (argv: OUT seeds which [small]): probes of two
converged parameter files before the 2-core CPU trains them (exploratory: another engine and TF32,
not the committed verdicts). `table01`: Table 1's converged file as committed (K = 2, B_glob 2,048,
5-epoch warm-up): local SGD H = 16 vs mini-batch SGD B_loc = 2,048, without / with App. C's tricks
(an H100 run with a 1-epoch warm-up had stalled mini-batch SGD with tricks at 11.9 %). `fig07`:
Figure 7's converged file at K = 8 and 16 (its K = 2 runs are Table 5's, probed before), H = 1, 8:
does K = 16 underfit as the file expects? Device cuda, engine/precision auto (fallback:
sequential). Writes OUT/<tag>_<i>_s<seed>.csv and OUT/probe.json after every run."""
import dataclasses, json, os, sys, time, types
from pathlib import Path
import torch
from localsgd.paper import gpu_plan
from localsgd.paper.experiments.lin2020 import fig07, table01
from localsgd.train import train
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
dev = "cuda" if torch.cuda.is_available() else "cpu"
seeds = [int(x) for x in sys.argv[2].split(",")]
which = sys.argv[3].split(",")
small = len(sys.argv) > 4  # CPU test of the script: tiny data
def params(nb, **kw):
    p = gpu_plan.notebook_params(Path("notebooks"), [nb], mode="converged")[nb]
    p.update(device=dev, batched="auto", **kw)
    if os.environ.get("WARMUP"):  # call 17: the warm-up in epochs, overridden
        p.update(warmup_epochs=float(os.environ["WARMUP"]))
    if small:
        p.update(n_train=4096 * 2, n_test=256, epochs=0.5)
    return types.SimpleNamespace(**p)
jobs = []
for w in which:
    if w == "table01":
        c, l = table01.configs(params("table01_large_batch"), seeds)
        jobs += [("table01", x, y) for x, y in zip(c, l)]
    if w == "fig07":
        c = [x for x in fig07.configs(params("fig07_scaling"), seeds) if x.world_size > 2]
        jobs += [("fig07", x, {}) for x in c]
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
           "B_loc": cfg.local_batch, "H": cfg.local_steps, "lr": cfg.lr, "seed": cfg.seed,
           "engine": eng, "wall_s": round(time.perf_counter() - t0, 1),
           "final_test_acc": float(rec["test_acc"].iloc[-1]),
           "best_test_acc": float(rec["test_acc"].max()),
           "final_train_loss": float(rec["train_loss"].iloc[-1]) if "train_loss" in rec else None,
           "epochs": float(rec["epoch"].iloc[-1])}
    print(row, flush=True)
    summary.append(row)
    json.dump({"runs": summary, "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
               "configs": [j[1].to_dict() for j in jobs]},
              open(out / "probe.json", "w"), indent=1, default=str)
