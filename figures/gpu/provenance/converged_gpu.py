"""Session 2026-11-26d: the converged proxy of Table 5 / Figure 6 (notebooks/params/table05_models/
converged.yaml: ResNet-20 w0.5, all CIFAR-10, K = 2, B_loc 128, tricks, 20 epochs) on one GPU,
as a GPU user would run it (device cuda, batched/precision auto), for the Hs and seeds given.
Writes OUT/converged_<H>_<seed>.csv (records) and OUT/converged_gpu.json (summary)."""
import dataclasses, json, sys, time, types
from pathlib import Path
import torch, yaml
from localsgd.paper.experiments.lin2020 import table05
from localsgd.paper import gpu_plan
from localsgd.train import train
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
hs = [int(x) for x in sys.argv[2].split(",")]; seeds = [int(x) for x in sys.argv[3].split(",")]
epochs = float(sys.argv[4]) if len(sys.argv) > 4 else None
p = gpu_plan.notebook_params(Path("notebooks"), ["table05_models"], mode="converged")["table05_models"]
p.update(Hs=hs, device="cuda" if torch.cuda.is_available() else "cpu", batched="auto")
if epochs:
    p.update(epochs=epochs)
cfgs = table05.configs(types.SimpleNamespace(**p), seeds)
cfgs = cfgs[0] if isinstance(cfgs, tuple) else cfgs
summary = []
for cfg in cfgs:
    t0 = time.perf_counter()
    rec = train(cfg, progress=False)
    wall = time.perf_counter() - t0
    rec.to_csv(out / f"converged_h{cfg.local_steps}_s{cfg.seed}.csv", index=False)
    row = {"H": cfg.local_steps, "seed": cfg.seed, "wall_s": round(wall, 1),
           "final_test_acc": float(rec["test_acc"].iloc[-1]), "epochs": float(rec["epoch"].iloc[-1]),
           "batched": str(rec["batched"].iloc[-1]) if "batched" in rec else "",
           "precision": str(rec["precision"].iloc[-1]) if "precision" in rec else ""}
    print(row, flush=True)
    summary.append(row)
    json.dump({"runs": summary, "config0": cfgs[0].to_dict(), "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"},
              open(out / "converged_gpu.json", "w"), indent=1)
