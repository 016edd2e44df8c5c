"""Session 2026-11-26c, call 3: one paper-scale cell of Table 3 on one GPU: the notebook's first paper
configuration (gpu_plan.paper_configs: ResNet-20, all of CIFAR-10, K = 16 as 8x2, H = 1, H^b = 16,
300 epochs, seed 0; packed replicas, TF32), records to OUT/records.csv."""
import dataclasses, json, sys, time
from pathlib import Path
import torch
from localsgd.paper import gpu_plan
from localsgd.train import train
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
cfg = dataclasses.replace(gpu_plan.paper_configs(Path("notebooks"))["table03_topologies"][0], device="cuda")
print(cfg, flush=True)
t0 = time.perf_counter()
def on_step(t):
    if t % 732 == 0:
        print(f"update {t}: {time.perf_counter() - t0:.0f} s", flush=True)
import pandas as pd
ckpt = Path("/tmp/table03_cell.pt")
try:  # SIGINT (timeout -s INT): train checkpoints its records, kept here as a partial run
    rec = train(cfg, progress=False, on_step=on_step, checkpoint_path=ckpt)
except BaseException as exc:
    print("interrupted:", type(exc).__name__, flush=True)
    rec = pd.DataFrame(torch.load(ckpt, weights_only=True)["records"]) if ckpt.exists() else pd.DataFrame()
    rec.to_csv(out / "records_partial.csv", index=False)
    print(rec[["epoch", "test_acc"]].tail(3).to_string() if len(rec) else "no records", flush=True)
    raise SystemExit(1)
rec.to_csv(out / "records.csv", index=False)
json.dump({"config": cfg.to_dict(), "wall_s": round(time.perf_counter() - t0, 1),
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__},
          open(out / "run.json", "w"), indent=1)
print(rec[["epoch", "test_acc", "train_loss"]].iloc[[0, 49, 149, 224, -1]].to_string(), flush=True)
print("wall", round(time.perf_counter() - t0, 1), flush=True)
