"""Session 2026-11-26d, call 2: Table 1 at the converged proxy's scale on one GPU (exploratory, one
seed): the notebook's grid (lin2020.table01.configs) with the converged Table 5 proxy's settings
(ResNet-20 w0.5, all CIFAR-10, B_loc 128, 20 epochs, warm-up 1 epoch) at B_glob = 2048; device cuda,
batched/precision auto. Writes OUT/t01_<i>.csv and OUT/table01_gpu.json."""
import json, sys, time, types
from pathlib import Path
import torch
from localsgd.paper.experiments.lin2020 import table01
from localsgd.paper import gpu_plan
from localsgd.train import train
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
p = gpu_plan.notebook_params(Path("notebooks"), ["table01_large_batch"], mode="quick")["table01_large_batch"]
p.update(width=0.5, n_train=None, n_test=None, B_loc=128, B_globs=[2048], epochs=20.0,
         records_per_epoch=1, warmup_epochs=1.0, device="cuda" if torch.cuda.is_available() else "cpu",
         batched="auto")
if len(sys.argv) > 2:
    p.update(epochs=float(sys.argv[2]))
cfgs, labels = table01.configs(types.SimpleNamespace(**p), [0])
summary = []
for i, (cfg, lab) in enumerate(zip(cfgs, labels)):
    t0 = time.perf_counter()
    rec = train(cfg, progress=False)
    rec.to_csv(out / f"t01_{i}.csv", index=False)
    row = {**lab, "K": cfg.world_size, "B_loc": cfg.local_batch, "H": cfg.local_steps,
           "lr": cfg.lr, "scale_lr": cfg.scale_lr, "seed": cfg.seed,
           "wall_s": round(time.perf_counter() - t0, 1),
           "final_test_acc": float(rec["test_acc"].iloc[-1]),
           "best_test_acc": float(rec["test_acc"].max()), "epochs": float(rec["epoch"].iloc[-1])}
    print(row, flush=True)
    summary.append(row)
    json.dump({"runs": summary, "torch": torch.__version__,
               "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"},
              open(out / "table01_gpu.json", "w"), indent=1)
