"""Host synchronisations of train() on CUDA, per update and per record: the CUDA sync debug mode's
warnings (tolist, item, bool(tensor), ...) plus torch.cuda.Event.synchronize calls (the debug mode
does not see those), split by update with on_step."""
import json, sys, warnings, pathlib
import torch, yaml
from localsgd.train import train
from localsgd.train_config import TrainConfig
from localsgd.configs import __file__ as cfgdir
base = yaml.safe_load((pathlib.Path(cfgdir).parent / "cifar10_resnet20.yaml").read_text())
waits = [0]
_sync = torch.cuda.Event.synchronize
def counted(self):
    waits[0] += 1
    return _sync(self)
torch.cuda.Event.synchronize = counted
for spec in sys.argv[2:]:
    name, batched, epochs, H, rpe = spec.split(":")
    cfg = TrainConfig(**{**base, "device": "cuda", "world_size": 16, "local_steps": int(H),
                         "epochs": float(epochs), "batched": batched in ("1", "p"),
                         "packed": batched == "p", "records_per_epoch": int(rpe)})
    seen = {}
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        def on_step(t):
            seen[t] = sum("synchroniz" in str(x.message) for x in w) + waits[0]
        waits[0] = 0
        torch.cuda.set_sync_debug_mode("warn")
        rec = train(cfg, progress=False, on_step=on_step)
        torch.cuda.set_sync_debug_mode(0)
    steps = int(rec["step"].iloc[-1])
    recs = set(int(s) for s in rec["step"])
    first = min(seen)
    between = {t: seen[t] - seen[t - 1] for t in seen if t > first}
    plain = [n for t, n in between.items() if t not in recs]
    at = [n for t, n in between.items() if t in recs]
    row = {"run": name, "batched": cfg.batched, "packed": bool(rec["packed"].iloc[-1]),
           "updates_without_record": len(plain), "syncs_in_those": sum(plain),
           "syncs_per_update": round(sum(plain) / max(len(plain), 1), 3),
           "syncs_per_record": at, "setup_and_first_update": seen[first],
           "test_acc": float(rec["test_acc"].iloc[-1])}
    print(json.dumps(row), flush=True)
    with open(sys.argv[1], "a") as fh:
        fh.write(json.dumps(row) + "\n")
