"""train() on CUDA with its loop phases (setup/data/compute/engine/evaluate) printed as JSON."""
import json, sys, time
import yaml
from localsgd.train import train
from localsgd.train_config import TrainConfig
from localsgd.configs import __file__ as cfgdir
import pathlib
base = yaml.safe_load((pathlib.Path(cfgdir).parent / "cifar10_resnet20.yaml").read_text())
for spec in sys.argv[2:]:
    name, batched, prec, epochs, H, fmt = spec.split(":")
    cfg = TrainConfig(**{**base, "device": "cuda", "world_size": 16, "local_steps": int(H),
                         "epochs": float(epochs), "batched": batched == "1", "precision": prec, "memory_format": fmt})
    got = {}
    t0 = time.perf_counter()
    rec = train(cfg, progress=False, on_phases=got.update)
    wall = time.perf_counter() - t0
    steps = int(rec["step"].iloc[-1])
    row = {"run": name, "batched": cfg.batched, "precision": prec, "memory_format": fmt, "H": int(H), "epochs": float(epochs),
           "steps": steps, "wall_s": round(wall, 2), "test_acc": float(rec["test_acc"].iloc[-1]),
           **{k: round(v, 3) for k, v in got.items() if isinstance(v, float)}}
    print(json.dumps(row), flush=True)
    with open(sys.argv[1], "a") as fh:
        fh.write(json.dumps(row) + "\n")
