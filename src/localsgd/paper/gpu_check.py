"""``localsgd gpu-check``: the first command to run on a GPU, turning the plan's estimates into
measurements in one go (a few minutes on one H200; it stops each part at its time budget).

1. ``doctor``: both replica engines on the device against a hand-written CPU float64 run, and a
   one-process NCCL group (`localsgd.paper.doctor`) -> ``doctor.json``.
2. A throughput sweep of the CIFAR ResNet-20 (random inputs, so no data is needed): one model at
   batch B and at K * B, `ReplicaEngine` and `BatchedReplicaEngine` (its vmap path, ``batched``,
   and its channel-packed one, ``packed``; compiled, ``packed_compiled``, in TF32 and bf16) with
   K replicas of batch B and H = 8, and a `localsgd.engines.run_pack.RunPack` of K / 2 runs of
   K = 2 (``runpack``: the campaign's packs), for each precision (``fp32`` = TF32 off, the
   paper's arithmetic; ``tf32``; ``bf16`` autocast) and input layout (NCHW, NHWC); images/s is
   the median of timed windows after untimed warm-up steps -> ``sweep.csv``.
3. The training loop on the first configuration of every paper notebook that trains
   (`gpu_plan.paper_configs`), as paper mode builds it (``precision: auto``: TF32 on CUDA),
   for 50 updates after 5 untimed ones: where the
   loop's time goes (`localsgd.training.state.LOOP_PHASES`, the host's; the device's busy seconds
   beside them, ``device_busy_s``) and its training images/s -> ``loop.csv``.
   A notebook whose data set is not on the machine is listed as skipped, with the reason.
4. ``provenance.json``: the GPU's name, the versions, the command, the commit, the wall time.

``localsgd reproduce --plan --gpu NAME`` prices the plan with ``loop.csv``'s measured ResNet-20
throughput (`gpu_plan.measured_throughputs`) wherever the GPU's name matches. With ``--toy`` the
same steps run at toy size (K = 2, B = 4, width 0.25, 2 updates with 2 samples per worker), the
way tests/test_gpu_check.py runs it on a CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

PRECISIONS = ("fp32", "tf32", "bf16")
LAYOUTS = {"nchw": torch.contiguous_format, "nhwc": torch.channels_last}
H_SWEEP = 8  # the sweep's averaging period (Table 5's local-SGD setting)


@dataclass(frozen=True)
class Size:
    """How big each part runs: the sweep's K, B, width, windows and steps per window; the loop's
    untimed warm-up updates (cuDNN tunes its kernels for each new shape there), timed updates,
    samples per worker (None: the configuration's B_loc) and evaluated images."""

    k: int
    b: int
    width: float
    windows: int
    steps: int
    warmup: int
    loop_warmup: int
    updates: int
    loop_batch: int | None
    eval_images: int | None


FULL = Size(k=16, b=128, width=1.0, windows=5, steps=4, warmup=3, loop_warmup=5, updates=50,
            loop_batch=None, eval_images=None)
TOY = Size(k=2, b=4, width=0.25, windows=2, steps=1, warmup=1, loop_warmup=1, updates=2,
           loop_batch=2, eval_images=16)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _sweep_steps(device: torch.device, size: Size) -> list[tuple[str, str, str, Callable, int]]:
    """(precision, layout, configuration, build, images per call): ``build()`` returns one step."""
    from localsgd.engines.batched import BatchedReplicaEngine
    from localsgd.engines.replicas import ReplicaEngine
    from localsgd.models import build_model
    from localsgd.numerics import autocast
    from localsgd.schedule import SyncSchedule
    from localsgd.topology import Topology

    k, b = size.k, size.b
    loss_fn = nn.functional.cross_entropy

    def model_fn() -> nn.Module:
        return build_model("resnet20", num_classes=10, width=size.width)

    def optimizer_fn(params) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4)

    g = torch.Generator().manual_seed(0)
    xs = [torch.rand((b, 3, 32, 32), generator=g).to(device) for _ in range(k)]
    ys = [torch.randint(0, 10, (b,), generator=g).to(device) for _ in range(k)]

    def single(batch: int, fmt, precision: str) -> Callable[[], None]:
        torch.manual_seed(0)
        model = model_fn().to(device).to(memory_format=fmt)
        opt = optimizer_fn(model.parameters())
        x, y = torch.cat(xs)[:batch].contiguous(memory_format=fmt), torch.cat(ys)[:batch]

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            with autocast(precision, device):
                loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()  # no host read: the engines' steps below make none either
        return step

    def engine(cls, fmt, precision: str, **kw: Any) -> Callable[[], None]:
        e = cls(model_fn, SyncSchedule(Topology.from_paper(k, H_SWEEP)), optimizer_fn, seed=0,
                average_buffers=True, device=device, **kw)
        batches = [(x.contiguous(memory_format=fmt), y) for x, y in zip(xs, ys, strict=True)]

        def step() -> None:
            with autocast(precision, device):
                e.step(batches, loss_fn, sync=False)  # as train() steps: no host read
        return step

    def pack(fmt, precision: str, **kw: Any) -> Callable[[], None]:
        # the campaign's case: k / 2 independent runs of K = 2 (`localsgd.training.packs`), each
        # its own optimizer, schedule and lr, one packed forward and backward for all
        from localsgd.engines.run_pack import RunPack
        from localsgd.training.loop import EngineParts

        parts = [EngineParts(model_fn, SyncSchedule(Topology.from_paper(2, H_SWEEP)),
                             optimizer_fn, None, None, r, True, 1) for r in range(k // 2)]
        e = RunPack(parts, device=device, packed=True, **kw)
        batches = [(x.contiguous(memory_format=fmt), y) for x, y in zip(xs, ys, strict=True)]

        def step() -> None:
            with autocast(precision, device):
                e.step(batches, loss_fn)
        return step

    out = []
    for precision in PRECISIONS:
        for layout, fmt in LAYOUTS.items():
            if layout == "nchw" and precision != "fp32" and device.type == "cuda":
                # torch.compile of the packed step: ~26 s to build each, GPUs only
                out.append((precision, layout, f"packed_compiled_k{k}_b{b}",
                            lambda f=fmt, p=precision: engine(BatchedReplicaEngine, f, p,
                                                              packed=True, compile=True), k * b))
            out += [
                (precision, layout, f"single_b{b}",
                 lambda f=fmt, p=precision: single(b, f, p), b),
                (precision, layout, f"single_b{k * b}",
                 lambda f=fmt, p=precision: single(k * b, f, p), k * b),
                (precision, layout, f"replica_k{k}_b{b}",
                 lambda f=fmt, p=precision: engine(ReplicaEngine, f, p), k * b),
                (precision, layout, f"batched_k{k}_b{b}",  # the vmap path
                 lambda f=fmt, p=precision: engine(BatchedReplicaEngine, f, p, packed=False),
                 k * b),
                (precision, layout, f"packed_k{k}_b{b}",  # channel groups (engines.packed)
                 lambda f=fmt, p=precision: engine(BatchedReplicaEngine, f, p, packed=True),
                 k * b),
                (precision, layout, f"runpack_r{k // 2}x2_b{b}",  # k/2 runs of K = 2, packed
                 lambda f=fmt, p=precision: pack(f, p), k * b),
            ]
    return out


def sweep(device: torch.device, size: Size, budget_s: float,
          say: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Part 2: one row per (precision, layout, configuration); rows past ``budget_s`` are
    listed with ``error = "not run: time budget spent"``."""
    from localsgd.numerics import apply_numerics

    t0, rows = time.perf_counter(), []
    for precision, layout, name, build, images in _sweep_steps(device, size):
        row: dict[str, Any] = {"model": "resnet20", "width": size.width, "precision": precision,
                               "layout": layout, "configuration": name, "images_per_s": "",
                               "min": "", "max": "", "windows": 0, "error": ""}
        if time.perf_counter() - t0 > budget_s:
            rows.append({**row, "error": "not run: time budget spent"})
            continue
        apply_numerics(precision, False, device)  # TF32 per precision; cuDNN benchmark on CUDA
        rates = []
        try:
            step = build()
            # one model at batch B takes K calls per window: every window times K * B images
            calls = size.steps * (size.k if name == f"single_b{size.b}" else 1)
            for _ in range(size.warmup * calls // size.steps or 1):
                step()
            _sync(device)
            for _ in range(size.windows):
                start = time.perf_counter()
                for _ in range(calls):
                    step()
                _sync(device)
                rates.append(calls * images / (time.perf_counter() - start))
        except Exception as exc:  # noqa: BLE001 -- a configuration that fails is a result
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            if "CUDA error" in row["error"]:  # the context is gone: nothing after it can run
                rows.append(row)
                say(f"  sweep: {precision} {layout} {name}: {row['error']} (stopping the sweep)")
                break
        if rates:
            row.update(images_per_s=round(statistics.median(rates), 1),
                       min=round(min(rates), 1), max=round(max(rates), 1), windows=len(rates))
        rows.append(row)
        say(f"  sweep: {precision} {layout} {name}: {row['images_per_s'] or row['error']}"
            + (" images/s" if rates else ""))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _dataset(name: str):
    """The data set of a configuration if it is on this machine, else raise (never downloads)."""
    from localsgd import data

    if name in data.CIFAR_DATASETS:
        return data.load_cifar(name, download=False)
    return data.load_image_dataset(name)


def short_paths(text: str) -> str:
    """``text`` with every absolute path cut to its last part (``.../imagenet``): the committed
    CSVs carry nothing of the machine's folders (provenance.json holds the machine)."""
    return re.sub(r"(?<![\w.<>])/(?:[^\s,;:()'\"/]+/)*([^\s,;:()'\"/]+)", r".../\1", text)


def loop(device: torch.device, size: Size, notebooks_dir: Path, only: list[str] | None,
         budget_s: float, say: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Part 3: the first configuration of each training notebook for ``size.updates`` updates."""
    from localsgd.paper import gpu_plan
    from localsgd.training.loop import RunLimit, train
    from localsgd.training.state import DEVICE_BUSY, LOOP_PHASES

    t0, rows, cache = time.perf_counter(), [], {}
    for notebook, configs in gpu_plan.paper_configs(notebooks_dir, only).items():
        if not configs:
            continue
        cfg = configs[0].run_as(device=str(device))
        row: dict[str, Any] = {
            "notebook": notebook, "dataset": cfg.dataset, "model": cfg.model,
            "width": cfg.width, "world_size": cfg.world_size, "local_batch": cfg.local_batch,
            "local_steps": cfg.local_steps, "batched": cfg.batched,
            "precision": cfg.precision,
            "status": "ok", "updates": 0, "train_images": 0, "images_per_s": ""}
        if time.perf_counter() - t0 > budget_s:
            rows.append({**row, "status": "not run: time budget spent"})
            continue
        try:
            if cfg.dataset not in cache:
                cache[cfg.dataset] = _dataset(cfg.dataset)
        except (OSError, ValueError) as exc:  # not on this machine (or unreadable): skipped
            first = short_paths((str(exc).strip().splitlines() or [""])[0])[:200]
            rows.append({**row, "status": f"skipped: {type(exc).__name__}: {first}"})
            say(f"  loop: {notebook}: {rows[-1]['status']}")
            continue
        try:
            phases: dict[str, Any] = {}
            if size.loop_warmup:  # untimed: the first updates of a new shape tune cuDNN
                train(cfg, dataset=cache[cfg.dataset], progress=False,
                      limit=RunLimit(updates=size.loop_warmup, batch=size.loop_batch,
                                     eval_images=size.eval_images or 1000))
            limit = RunLimit(updates=size.updates, batch=size.loop_batch,
                             eval_images=size.eval_images)
            records = train(cfg, dataset=cache[cfg.dataset], progress=False, limit=limit,
                            on_phases=phases.update)
            updates = int(records["step"].iloc[-1])
            per_worker = size.loop_batch or cfg.local_batch
            busy = sum(float(phases.get(k, 0.0)) for k in ("data", "compute", "engine"))
            # what ran: 'auto' resolved for this device (and the memory check's fallback)
            row.update(batched=bool(records["batched"].iloc[-1]),
                       precision=str(records["precision"].iloc[-1]))
            row.update(updates=updates, train_images=updates * cfg.world_size * per_worker,
                       **{f"{k}_s": round(float(phases.get(k, 0.0)), 3)
                          for k in (*LOOP_PHASES, DEVICE_BUSY)})
            row["images_per_s"] = round(row["train_images"] / busy, 1) if busy > 0 else ""
        except Exception as exc:  # noqa: BLE001 -- reported as a failed row, the others go on
            first = short_paths((str(exc).strip().splitlines() or [""])[0])[:200]
            row["status"] = f"FAIL: {type(exc).__name__}: {first}"
        rows.append(row)
        say(f"  loop: {notebook} ({cfg.model}, K={cfg.world_size}, B_loc={cfg.local_batch}): "
            + (f"{row['images_per_s']} images/s" if row["status"] == "ok" else row["status"]))
    return rows


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    import pandas as pd

    pd.DataFrame(rows).to_csv(path, index=False)  # columns in first-seen order


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


def main(argv: list[str] | None = None) -> int:
    from localsgd.paper import doctor
    from localsgd.paper.results import git_state, repo_root

    p = argparse.ArgumentParser(prog="localsgd gpu-check", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", type=Path, default=repo_root() / "figures" / "gpu",
                   help="folder for doctor.json, sweep.csv, loop.csv, provenance.json")
    p.add_argument("--toy", action="store_true", help="toy sizes (a CPU test of the steps)")
    p.add_argument("--only", nargs="+", metavar="NB", help="loop: only these notebooks")
    p.add_argument("--skip", nargs="+", default=[], choices=["doctor", "sweep", "loop"])
    p.add_argument("--sweep-minutes", type=float, default=6.0)
    p.add_argument("--loop-minutes", type=float, default=8.0)
    p.add_argument("--notebooks", type=Path, default=repo_root() / "notebooks")
    args = p.parse_args(argv)
    try:
        device = torch.device(args.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("torch.cuda.is_available() is False")
    except (RuntimeError, ValueError) as exc:
        print(f"error: --device {args.device}: {exc}", file=sys.stderr)
        return 2
    size = TOY if args.toy else FULL
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    name = device_name(device)
    print(f"gpu-check on {name} ({device}), {'toy' if args.toy else 'full'} size -> {args.out}")
    status = 0
    if "doctor" not in args.skip:
        print("1/3 doctor")
        lines: list[str] = []
        status |= doctor.run(devices=[str(device) if device.index is not None or
                                      device.type == "cpu" else f"{device.type}:0"],
                             as_json=True, out=lines.append)
        (args.out / "doctor.json").write_text("\n".join(lines) + "\n")
        checks = json.loads(lines[-1])["checks"]
        for c in checks:
            print(f"  doctor: [{c['status']}] {c['name']}")
    extra = {"gpu": name, "device": str(device)}
    if "sweep" not in args.skip:
        print(f"2/3 throughput sweep (at most {args.sweep_minutes:g} min)")
        rows = sweep(device, size, args.sweep_minutes * 60)
        _write_csv(args.out / "sweep.csv", [{**r, **extra} for r in rows])
    if "loop" not in args.skip:
        print(f"3/3 training loop, {size.updates} updates of each notebook's first "
              f"configuration (at most {args.loop_minutes:g} min)")
        rows = loop(device, size, args.notebooks, args.only, args.loop_minutes * 60)
        status |= any(r["status"].startswith("FAIL") for r in rows)
        _write_csv(args.out / "loop.csv", [{**r, **extra} for r in rows])
    provenance = {
        "command": "localsgd gpu-check " + " ".join(argv if argv is not None else sys.argv[1:]),
        "gpu": name, "device": str(device), "size": dataclasses.asdict(size),
        "versions": doctor.versions(), **git_state(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_seconds": round(time.perf_counter() - t0, 1),
    }
    (args.out / "provenance.json").write_text(json.dumps(provenance, indent=1, default=str) + "\n")
    print(f"done in {provenance['wall_seconds']:.0f} s: {args.out}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
