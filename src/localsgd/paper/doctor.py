"""``localsgd doctor``: what this machine offers and whether the engines compute the right
numbers on it.

1. Versions: python, torch, torchvision, CUDA / cuDNN / NCCL (where torch has them), gloo/NCCL
   availability.
2. Devices: the CPU, every visible CUDA GPU (name, compute capability, memory), MPS; what is
   absent is listed as skipped, with the reason.
3. Numerics: the flags in force (`localsgd.numerics.numerics_state`), then the checks run under
   ``apply_numerics("fp32", deterministic=True)`` (the paper's arithmetic; flags restored after).
4. Engines: on every available device, the sequential and the batched replica engine
   (``ReplicaEngine`` / ``BatchedReplicaEngine``, imported lazily from `ENGINE_MODULE`) train a
   small ResNet-20 (width 0.25, 16x16 inputs, K = 4 workers in blocks of 2, SGD with momentum
   and weight decay, BatchNorm buffers and momentum averaged, block average every 2 updates,
   global average + block-momentum outer step every 4) for a few updates in float32, compared
   after every update with the same training written out by hand in float64 on the CPU
   (`reference_run`: plain torch models and optimizers, none of the package's engine,
   schedule or outer-step code, so a defect they share cannot pass): parameters, BatchNorm
   buffers, losses, the outer step's momentum buffer, and that an averaging step leaves the
   averaged replicas bitwise equal.
5. NCCL: a one-process NCCL process group on cuda:0 (all_reduce + broadcast) where CUDA and
   NCCL exist.

Exit status 0 when every check that ran passed, 1 on any mismatch or failure (skips are not
failures). Verified on CPU only: no GPU was available when this was written, so the CUDA
branches (device listing, NCCL smoke test, engines on cuda:i) have not run.
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib
import json
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["ENGINE_MODULE", "Check", "available_devices", "engine_check", "main", "nccl_smoke",
           "run", "versions"]

# Where the replica engines live; phase 2 of the restructuring moves them (one-line change).
ENGINE_MODULE = "localsgd.engines.replicas"
ENGINES = ("ReplicaEngine", "BatchedReplicaEngine")

K, BATCH, SIDE, WIDTH, SEED = 4, 16, 16, 0.25, 0
# Errors are scaled by how far training moved the reference (see `engine_check`). Measured on
# this CPU, float32 vs float64 over 8 updates and 14 seeds: ~4e-6 (rounding) or, when a ReLU
# pre-activation near 0 falls on different sides in the two precisions, up to 5.2e-3 (that
# element's gradient then differs and training amplifies it). A skipped average or a dropped
# buffer/outer step is O(0.1-1) of the movement.
TOLERANCE = 3e-2


@dataclass
class Check:
    """One line of the report."""

    name: str
    status: str  # "ok", "FAIL" or "skipped"
    detail: str = ""

    def line(self) -> str:
        return f"[{self.status:>7}] {self.name}" + (f": {self.detail}" if self.detail else "")


# --------------------------------------------------------------------------- facts


def versions() -> dict[str, Any]:
    """Versions of python, torch, torchvision, CUDA, cuDNN, NCCL (None where absent)."""
    try:
        import torchvision

        tv = torchvision.__version__
    except Exception:  # noqa: BLE001 -- absent or broken: report, do not fail
        tv = None
    nccl = None
    if torch.cuda.is_available() and torch.distributed.is_nccl_available():
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception as exc:  # noqa: BLE001
            nccl = f"unknown ({exc.__class__.__name__})"
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": tv,
        "cuda_build": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": nccl,
        "gloo_available": torch.distributed.is_gloo_available(),
        "nccl_available": torch.distributed.is_nccl_available(),
    }


def available_devices() -> tuple[list[dict[str, Any]], list[Check]]:
    """The devices the engines can run on (cpu first) and the skips for the absent ones."""
    found: list[dict[str, Any]] = [{"device": "cpu", "name": platform.processor() or "cpu",
                                    "threads": torch.get_num_threads()}]
    skipped: list[Check] = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            prop = torch.cuda.get_device_properties(i)
            found.append({"device": f"cuda:{i}", "name": prop.name,
                          "capability": f"{prop.major}.{prop.minor}",
                          "memory_gib": round(prop.total_memory / 2**30, 2)})
    else:
        skipped.append(Check("cuda", "skipped", "torch.cuda.is_available() is False "
                             f"(torch built with CUDA {torch.version.cuda}; "
                             f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"))
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        found.append({"device": "mps", "name": "Apple MPS"})
    else:
        skipped.append(Check("mps", "skipped", "torch.backends.mps.is_available() is False"))
    return found, skipped


# --------------------------------------------------------------------------- engine check


def _model_fn(dtype: torch.dtype) -> Callable[[], torch.nn.Module]:
    from localsgd.models import build_model

    return lambda: build_model("resnet20", num_classes=10, width=WIDTH).to(dtype)


@functools.cache
def _param_sizes() -> list[int]:
    """Elements of each trainable parameter of the check's model, in order."""
    return [p.numel() for p in _model_fn(torch.float32)().parameters() if p.requires_grad]


def _optimizer_fn(params):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4)


def _build(cls, dtype: torch.dtype, device: str):
    from localsgd.outer import OuterUpdate
    from localsgd.schedule import SyncSchedule
    from localsgd.topology import Topology

    schedule = SyncSchedule(Topology.from_paper(K, local_steps=2, block_size=2, block_steps=2),
                            outer_period="global")
    return cls(model_fn=_model_fn(dtype), schedule=schedule, optimizer_fn=_optimizer_fn,
               outer=OuterUpdate(momentum=0.5), seed=SEED, average_buffers=True,
               average_momentum=True, device=device)


def _batches(updates: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    g = torch.Generator().manual_seed(SEED)
    return [[(torch.randn(BATCH, 3, SIDE, SIDE, generator=g, dtype=torch.float64),
              torch.randint(0, 10, (BATCH,), generator=g)) for _ in range(K)]
            for _ in range(updates)]


def _snapshot(engine) -> dict[str, torch.Tensor]:
    """Every float tensor of every replica's model state, plus the outer momentum buffer, as
    float64 on the CPU (keys ``k/name``)."""
    out = {}
    for k, state in enumerate(engine.state_dict()["models"]):
        for name, t in state.items():
            if t.is_floating_point():
                out[f"{k}/{name}"] = t.detach().to("cpu", torch.float64, copy=True)
    buf = getattr(engine.driver.outer, "buf", None)
    if buf is not None:  # the engine's row has alignment gaps: the parameters' parts, in order
        from localsgd.engines.replica_stack import aligned_offsets

        sizes = _param_sizes()
        offsets, _ = aligned_offsets(sizes)
        out["outer/momentum"] = torch.cat([buf[o:o + n] for o, n in zip(offsets, sizes,
                                                                      strict=True)]
                                          ).detach().to("cpu", torch.float64, copy=True)
    return out


def _max_abs(a: torch.Tensor) -> float:
    return float(a.abs().max()) if a.numel() else 0.0


def reference_run(updates: int = 6) -> dict[str, Any]:
    """The check's configuration written out by hand in float64 on the CPU, using none of the
    package's engines, schedule, communicator or outer step: K copies of one model, plain
    ``torch.optim.SGD`` each, then every 2nd update the mean of each block of 2 workers and every
    4th update the mean of all K (parameters, float buffers and SGD momentum alike), followed by
    the block-momentum outer step on the parameters (Lin et al. 2020, App. D.1.2: with gamma the
    inner lr, d = (anchor - mean) / gamma, u = 0.5 u + d, anchor -= gamma u, every worker =
    anchor). A defect the engines share (say a block mean that divides by K) thus fails the
    check. Returns ``init`` (snapshot before training) and ``updates`` ((losses, snapshot) after
    each update), snapshots keyed like `_snapshot`'s."""
    torch.manual_seed(SEED)
    template = _model_fn(torch.float64)()
    models = [copy.deepcopy(template) for _ in range(K)]
    optimizers = [_optimizer_fn(m.parameters()) for m in models]
    gamma = optimizers[0].param_groups[0]["lr"]
    anchor = torch.cat([p.detach().reshape(-1) for p in models[0].parameters()]).clone()
    momentum = torch.zeros_like(anchor)  # the outer step's u

    def snapshot() -> dict[str, torch.Tensor]:
        out = {f"{k}/{name}": t.detach().clone() for k, m in enumerate(models)
               for name, t in m.state_dict().items() if t.is_floating_point()}
        out["outer/momentum"] = momentum.clone()
        return out

    def tensors(k: int) -> list[torch.Tensor]:  # what an average touches on worker k
        m, opt = models[k], optimizers[k]
        return ([p.data for p in m.parameters()]
                + [b for b in m.buffers() if b.is_floating_point()]
                + [opt.state[p]["momentum_buffer"] for p in m.parameters()])

    ref = {"init": snapshot(), "updates": []}
    for t, batch in enumerate(_batches(updates), start=1):
        losses = []
        for model, opt, (x, y) in zip(models, optimizers, batch, strict=True):
            model.train()
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        groups = [range(K)] if t % 4 == 0 else [range(2), range(2, K)] if t % 2 == 0 else []
        with torch.no_grad():
            for members in groups:
                for same in zip(*(tensors(k) for k in members), strict=True):
                    mean = sum(same) / len(same)
                    for tensor in same:
                        tensor.copy_(mean)
            if t % 4 == 0:
                params = [p for p in models[0].parameters()]
                avg = torch.cat([p.reshape(-1) for p in params])
                d = (anchor - avg) / gamma
                momentum.mul_(0.5).add_(d)
                anchor.sub_(gamma * momentum)
                for m in models:
                    offset = 0
                    for p in m.parameters():
                        p.copy_(anchor[offset:offset + p.numel()].view_as(p))
                        offset += p.numel()
        ref["updates"].append((losses, snapshot()))
    return ref


def engine_check(engine_name: str, device: str, *, updates: int = 6,
                 tolerance: float = TOLERANCE, reference: dict | None = None) -> Check:
    """Train ``engine_name`` on ``device`` in float32 and compare with the CPU float64
    sequential engine after every update (see the module docstring).

    Errors are scaled by how far training moved the reference (largest |x_t - x_0| over the
    parameters, resp. the buffers; largest |u| of the outer momentum; largest |loss| for the
    losses): float32 rounding is ~1e-6 of that, a ReLU kink crossed in one precision but not the
    other ~1e-2 at worst (measured, CPU), a wrong average, buffer or outer step >= 0.1.
    ``reference`` may carry `reference_run`'s result to reuse.
    """
    name = f"{engine_name} on {device}"
    try:
        module = importlib.import_module(ENGINE_MODULE)
        if reference is None:
            reference = reference_run(updates)
        if len(reference["updates"]) < updates:
            raise ValueError(f"reference has {len(reference['updates'])} updates, need {updates}")
        engine = _build(getattr(module, engine_name), torch.float32, device)
        params = {n for n, _ in _model_fn(torch.float32)().named_parameters()}

        def category(key: str) -> str:
            if key.startswith("outer/"):
                return "outer step"
            return "parameters" if key.split("/", 1)[1] in params else "buffers"

        init = reference["init"]
        err = {"parameters": 0.0, "buffers": 0.0, "outer step": 0.0, "losses": 0.0}
        scale = dict.fromkeys(err, 0.0)
        averaged_equal, actions = True, []
        for t, batch in enumerate(_batches(updates)):
            dev_batch = [(x.to(device, torch.float32), y.to(device)) for x, y in batch]
            losses, action = engine.step(dev_batch, F.cross_entropy)
            ref_losses, ref = reference["updates"][t]
            got_l, ref_l = (torch.tensor(v, dtype=torch.float64) for v in (losses, ref_losses))
            err["losses"] = max(err["losses"], _max_abs(got_l - ref_l))
            scale["losses"] = max(scale["losses"], _max_abs(ref_l))
            got = _snapshot(engine)
            if got.keys() != ref.keys():
                return Check(name, "FAIL", f"state keys differ from the reference at update "
                             f"{t + 1}: {sorted(set(got) ^ set(ref))[:5]}")
            for key, value in got.items():
                what = category(key)
                err[what] = max(err[what], _max_abs(value - ref[key]))
                moved = ref[key] if what == "outer step" else ref[key] - init[key]
                scale[what] = max(scale[what], _max_abs(moved))
            if action.level is not None:
                actions.append(f"t={t + 1}:avg{action.level}" + ("+outer" if action.outer else ""))
                size = engine.schedule.topology.levels[action.level].group_size
                groups = engine.comm.flat.view(K // size, size, -1)
                averaged_equal &= bool((groups == groups[:, :1]).all())
        worst = {k: err[k] / max(scale[k], 1e-12) for k in err}
        bad = {k: v for k, v in worst.items() if not v <= tolerance}
        detail = (", ".join(f"{k} {v:.1e}" for k, v in worst.items())
                  + " (max error vs the hand-written CPU float64 run / how far training moved "
                  f"it, tolerance {tolerance:g}; {updates} updates, "
                  f"{' '.join(actions) or 'no averaging'})")
        if not averaged_equal:
            return Check(name, "FAIL", "replicas differ right after an average; " + detail)
        if not any("+outer" in a for a in actions):
            return Check(name, "FAIL", "no outer step ran: the check is incomplete; " + detail)
        return Check(name, "FAIL" if bad else "ok", detail)
    except Exception as exc:  # noqa: BLE001 -- a crash on a device is a failed check
        return Check(name, "FAIL", f"{exc.__class__.__name__}: {exc}")


# --------------------------------------------------------------------------- NCCL


def nccl_smoke() -> Check:
    """A one-process NCCL group on cuda:0: all_reduce and broadcast (skipped without CUDA or
    NCCL, or when this process already belongs to a process group)."""
    import torch.distributed as dist

    if not torch.cuda.is_available():
        return Check("nccl smoke test", "skipped", "no CUDA device")
    if not dist.is_nccl_available():
        return Check("nccl smoke test", "skipped", "this torch build has no NCCL")
    if dist.is_initialized():
        return Check("nccl smoke test", "skipped", "a process group already exists here")
    store_dir = tempfile.mkdtemp(prefix="localsgd-doctor-")
    try:
        dev = torch.device("cuda", 0)
        torch.cuda.set_device(dev)
        store = dist.FileStore(os.path.join(store_dir, "store"), 1)
        dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=dev)
        x = torch.arange(4, dtype=torch.float32, device=dev)
        dist.all_reduce(x)
        dist.broadcast(x, 0)
        torch.cuda.synchronize(dev)
        ok = torch.equal(x.cpu(), torch.arange(4, dtype=torch.float32))
        return Check("nccl smoke test", "ok" if ok else "FAIL",
                     f"1-process group on {dev}: all_reduce + broadcast"
                     + ("" if ok else f" gave {x.tolist()}"))
    except Exception as exc:  # noqa: BLE001
        return Check("nccl smoke test", "FAIL", f"{exc.__class__.__name__}: {exc}")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        import shutil

        shutil.rmtree(store_dir, ignore_errors=True)


# --------------------------------------------------------------------------- report


def run(*, updates: int = 6, devices: list[str] | None = None, as_json: bool = False,
        out: Callable[[str], None] = print) -> int:
    """Print the report; 0 if every check that ran passed, 1 otherwise. ``devices`` limits the
    engine checks (default: every available device)."""
    from localsgd.numerics import numerics_scope, numerics_state

    found, checks = available_devices()
    report: dict[str, Any] = {"versions": versions(), "devices": found,
                              "numerics_in_force": numerics_state()}
    targets = [d["device"] for d in found] if devices is None else list(devices)
    with numerics_scope("fp32", deterministic=True,
                        device="cuda" if any(t.startswith("cuda") for t in targets) else "cpu") \
            as record:
        report["numerics_of_checks"] = record
        reference = reference_run(updates)
        for dev in targets:
            for engine in ENGINES:
                checks.append(engine_check(engine, dev, updates=updates, reference=reference))
    checks.append(nccl_smoke())
    report["checks"] = [asdict(c) for c in checks]
    failed = [c for c in checks if c.status == "FAIL"]
    if as_json:
        out(json.dumps(report, indent=1, default=str))
    else:
        out("versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()))
        for d in found:
            out("device: " + ", ".join(f"{k} {v}" for k, v in d.items()))
        out("numerics in force: " + ", ".join(f"{k}={v}"
                                              for k, v in report["numerics_in_force"].items()))
        out("checks run with: precision fp32, deterministic (TF32 off, cuDNN deterministic)")
        for c in checks:
            out(c.line())
        out(f"{'FAILED' if failed else 'OK'}: {len(failed)} failed, "
            f"{sum(c.status == 'skipped' for c in checks)} skipped, "
            f"{sum(c.status == 'ok' for c in checks)} ok")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="localsgd doctor", description="What this machine offers "
                                "and whether the replica engines compute the right numbers on "
                                "it (exit status 1 on any mismatch).")
    p.add_argument("--updates", type=int, default=6, help="updates per engine check (>= 4)")
    p.add_argument("--device", action="append", dest="devices", metavar="DEV",
                   help="check only this device (repeatable; default: all available)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    if args.updates < 4:
        print("error: --updates must be >= 4 (the check needs an outer step at update 4)",
              file=sys.stderr)
        return 2
    return run(updates=args.updates, devices=args.devices, as_json=args.json)


if __name__ == "__main__":
    sys.exit(main())
