"""Host synchronisations per update of train() on CUDA, counted with torch.cuda.set_sync_debug_mode('warn')."""
import json, sys, time, warnings, pathlib
import torch, yaml
from localsgd.train import train
from localsgd.train_config import TrainConfig
from localsgd.configs import __file__ as cfgdir
base = yaml.safe_load((pathlib.Path(cfgdir).parent / "cifar10_resnet20.yaml").read_text())
for spec in sys.argv[2:]:
    name, batched, epochs, H = spec.split(":")
    cfg = TrainConfig(**{**base, "device": "cuda", "world_size": 16, "local_steps": int(H),
                         "epochs": float(epochs), "batched": batched == "1"})
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        rec = train(cfg, progress=False)
    torch.cuda.set_sync_debug_mode(0)
    sync = [x for x in w if "synchroniz" in str(x.message)]
    where = {}
    for x in sync:
        k = f"{pathlib.Path(x.filename).name}:{x.lineno}"
        where[k] = where.get(k, 0) + 1
    steps = int(rec["step"].iloc[-1])
    row = {"run": name, "steps": steps, "records": len(rec), "syncs": len(sync),
           "syncs_per_update": round(len(sync) / steps, 3), "where": where}
    print(json.dumps(row), flush=True)
    with open(sys.argv[1], "a") as fh:
        fh.write(json.dumps(row) + "\n")
