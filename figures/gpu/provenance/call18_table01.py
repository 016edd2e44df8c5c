"""Session 2026-11-27 (seventh GPU session), call 18 (argv: seeds): Table 1's converged file as
committed, trained on the GPU through the results cache (`grid.run_cached`, the notebook's own
path) with ``device=cuda, batched=auto`` -- the parameters ``localsgd reproduce --mode converged
--only table01_large_batch --set device=cuda --set batched=auto`` gives -- so that the 2-core CPU
can render the notebook from the returned cache entries. Writes $LOCALSGD_CACHE/results and
runs.json (one row a run) after every run."""
import json, os, sys, time, types
from pathlib import Path
import torch
from localsgd.paper import gpu_plan, results
from localsgd.paper.experiments import grid
from localsgd.paper.experiments.lin2020 import table01
p = gpu_plan.notebook_params(Path("notebooks"), ["table01_large_batch"], mode="converged")["table01_large_batch"]
p.update(device="cuda", batched="auto")
P = types.SimpleNamespace(**p)
out = Path(os.environ["LOCALSGD_CACHE"]); rows = []
for seed in [int(s) for s in sys.argv[1].split(",")]:
    cfgs, labels = table01.configs(P, [seed])
    for cfg, lab in zip(cfgs, labels):
        t0 = time.perf_counter()
        rec = grid.run_cached(cfg, progress=False)
        rows.append({**lab, "seed": seed, "H": cfg.local_steps, "B_loc": cfg.local_batch,
                     "wall_s": round(time.perf_counter() - t0, 1),
                     "final_test_acc": float(rec["test_acc"].iloc[-1]),
                     "entry": grid.results.cache_entry("train", grid.cache_key(cfg),
                                                       code=results.library_code_hash()).name})
        print(rows[-1], flush=True)
        json.dump({"runs": rows, "torch": torch.__version__, "python": sys.version.split()[0],
                   "library_code_hash": results.library_code_hash(),
                   "gpu": torch.cuda.get_device_name(0)}, open(out / "runs.json", "w"), indent=1)
