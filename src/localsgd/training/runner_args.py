"""The runner's command line (`localsgd.training.runner`): its flags (shared with ``localsgd
train``), the `TrainConfig` they resolve to, the engine options, the runs of ``--sweep FILE`` and
the ``--resume`` check. Everything is checked before any process group exists."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import shutil
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from localsgd import configs
from localsgd.engines.ddp import COMPILE_MODES
from localsgd.timing.stragglers import Stragglers
from localsgd.training.config import TrainConfig

__all__ = ["RESUME_AUTO", "RESUME_REQUIRED", "SWEEP_OPTIONS", "add_run_arguments",
           "config_values", "engine_options", "prepare_resume", "resolve_config", "sweep_runs"]


RESUME_REQUIRED, RESUME_AUTO = "required", "auto"  # --resume (bare) and --resume=auto


def _field_parser(hint: Any) -> Callable[[str], Any]:
    args = typing.get_args(hint)
    if hint is bool or set(args) == {bool, str}:  # the latter: a switch with 'auto'
        def parse_bool(text: str) -> bool | str:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            if hint is not bool and text.lower() == "auto":
                return "auto"
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a boolean (true/false{'' if hint is bool else '/auto'})")
        return parse_bool
    if type(None) in args:
        inner = _field_parser(next(a for a in args if a is not type(None)))
        return lambda text: None if text.lower() == "none" else inner(text)
    if typing.get_origin(hint) is tuple:  # "0.5,0.75" or "[4, 2]"
        kind = int if typing.get_args(hint)[0] is int else float
        return lambda text: tuple(kind(v) for v in text.strip("[]() ").split(",") if v.strip())
    return hint


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by ``python -m localsgd.training.runner`` and ``localsgd train``: every
    `TrainConfig` field as ``--field-name`` (overriding ``--config``), plus the runner's own
    options."""
    p.add_argument("--config", metavar="NAME|FILE",
                   help="a shipped config by name (" + ", ".join(configs.shipped()) + "; "
                   "src/localsgd/configs/) or a YAML file of TrainConfig fields")
    cfg = p.add_argument_group("TrainConfig fields (override --config)")
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        cfg.add_argument(f"--{f.name.replace('_', '-')}", dest=f"cfg_{f.name}",
                         type=_field_parser(hints[f.name]), default=argparse.SUPPRESS,
                         metavar="V",
                         help=f"default {f.default!r}")
    r = p.add_argument_group("runner")
    r.add_argument("--nodes", type=int, help="nodes (world = nodes x procs-per-node)")
    r.add_argument("--procs-per-node", type=int,
                   help="processes per node = block_size K' (the node-level group)")
    r.add_argument("--out", type=Path, default=Path("runs/train"),
                   help="output folder: records.csv, timing.csv, summary.json, checkpoints/")
    r.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                   help="checkpoint every N updates (per-rank files, written atomically)")
    r.add_argument("--resume", nargs="?", const=RESUME_REQUIRED, default=None, metavar="auto|DIR",
                   help="continue from the last complete checkpoint in --out (an error when "
                   "there is none); --resume=auto: continue if --out holds one, else start "
                   "fresh (for job scripts that are resubmitted); --resume DIR: continue from "
                   "the checkpoints of an earlier run's output folder DIR, writing to --out")
    r.add_argument("--straggler-seconds", type=float, default=0.0)
    r.add_argument("--straggler-rate", type=float, default=0.0,
                   help="probability that a worker stalls at a step (independent, seeded)")
    r.add_argument("--straggler-ranks", type=lambda s: tuple(int(v) for v in s.split(",") if v),
                   default=(), help="comma-separated ranks that stall at every step")
    r.add_argument("--compute-ms", type=float, default=0.0,
                   help="emulated compute: sleep this long per step instead of the model")
    r.add_argument("--compile", choices=COMPILE_MODES, default=None,
                   help="torch.compile the DDP model with this optimize_ddp mode")
    r.add_argument("--compile-backend", default="inductor",
                   help="torch.compile backend (inductor; aot_eager traces without codegen)")
    r.add_argument("--compare-eager", action="store_true",
                   help="with --compile: train eager, then compiled, from the same seed; report "
                   "both per-step times and check the loss curves agree (out/compare.json)")
    r.add_argument("--loss-rtol", type=float, default=1e-2,
                   help="--compare-eager: largest relative per-epoch train-loss difference")
    r.add_argument("--bucket-cap-mb", type=float, default=25.0)
    r.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                   help="process-group backend (default: nccl with CUDA, else gloo)")
    r.add_argument("--save-final", action="store_true",
                   help="write each rank's final model to final_rank{r}.pt")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("--phases", type=Path, default=None, metavar="FILE",
                   help="rank 0 appends one JSON line per run to FILE: where the loop's time "
                   "went (setup, data, compute, engine, evaluate, loop seconds; "
                   "`localsgd reproduce --profile` passes its file)")


def config_values(args: argparse.Namespace) -> dict:
    """TrainConfig values: the YAML file, then the flags given."""
    values: dict = {}
    if args.config is not None:
        values.update(configs.load(args.config))
    for key, value in vars(args).items():
        if key.startswith("cfg_"):  # present only when given (default=SUPPRESS): None counts
            values[key[4:]] = value
    return values


def resolve_config(args: argparse.Namespace, world_size: int | None):
    """The run's TrainConfig, checked against the launched world size (None: no launch yet)."""
    values = config_values(args)
    if args.procs_per_node is not None:
        values["block_size"] = args.procs_per_node
    if args.nodes is not None and args.procs_per_node is not None:
        expected = args.nodes * args.procs_per_node
        if values.get("world_size", expected) != expected:
            raise ValueError(f"--nodes {args.nodes} x --procs-per-node {args.procs_per_node} = "
                             f"{expected} workers, but world_size={values['world_size']}; drop "
                             "one of them")
        values["world_size"] = expected
    if world_size is not None:
        values.setdefault("world_size", world_size)
        if values["world_size"] != world_size:
            k = values["world_size"]
            p = values.get("block_size")
            fit = (f"; with {p} processes per node the world sizes that fit are multiples of {p} "
                   f"({', '.join(str(p * n) for n in range(1, 5))}, ...)" if p else "")
            raise ValueError(
                f"torchrun started {world_size} processes but the run needs world_size={k}: "
                f"launch with --nproc-per-node {k} (one machine) or --nnodes N --nproc-per-node "
                f"P with N*P = {k}, or pass --world-size {world_size}{fit}")
    try:
        return TrainConfig.from_dict(values)
    except ValueError as err:
        raise ValueError(f"invalid configuration for {values.get('world_size')} workers: {err}"
                         ) from None


def engine_options(args: argparse.Namespace, seed: int) -> dict:
    return {
        "stragglers": Stragglers(args.straggler_seconds, args.straggler_rate,
                                 tuple(args.straggler_ranks), seed),
        "compute_ms": args.compute_ms, "compile": args.compile,
        "compile_backend": args.compile_backend, "bucket_cap_mb": args.bucket_cap_mb,
    }

# runner options a --sweep entry may set besides TrainConfig fields (the per-run knobs of a
# timing experiment); --out, --resume, checkpoints and --compare-eager stay launch-wide
SWEEP_OPTIONS = ("nodes", "procs_per_node", "straggler_seconds", "straggler_rate",
                 "straggler_ranks", "compute_ms", "bucket_cap_mb")


def sweep_runs(args: argparse.Namespace, world: int | None) -> list[tuple[str, argparse.Namespace,
                                                                        Any]]:
    """The runs of ``--sweep FILE``: (name, the launch's args with the entry applied, TrainConfig)
    per entry, every entry checked before any training (``world``: launched processes, or None).

    The file is a YAML list of mappings; each has a ``name`` (its output folder under --out) and
    any TrainConfig fields and `SWEEP_OPTIONS`, applied over ``--config`` and the flags."""
    entries = yaml.safe_load(Path(args.sweep).read_text())
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"--sweep {args.sweep}: expected a non-empty YAML list of runs, each a "
                         "mapping with a 'name' and TrainConfig fields / runner options")
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    runs, seen = [], set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(  # noqa: TRY004 -- main reports ValueErrors on every rank
                f"--sweep {args.sweep}: entry {i} is not a mapping: {entry!r}")
        name = entry.get("name")
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise ValueError(f"--sweep entry {i}: 'name' must be a folder name, got {name!r}")
        if name in seen:
            raise ValueError(f"--sweep entry {i}: name {name!r} is used twice")
        seen.add(name)
        run = copy.copy(args)
        for key, value in entry.items():
            key = key.replace("-", "_")
            if key == "name":
                continue
            if key in SWEEP_OPTIONS:
                if key == "straggler_ranks":
                    value = tuple(int(r) for r in (value or ()))
                setattr(run, key, value)
            elif key in fields:
                setattr(run, f"cfg_{key}", value)
            else:
                raise ValueError(f"--sweep entry {name!r}: unknown key {key!r}; use TrainConfig "
                                 f"fields or one of {', '.join(SWEEP_OPTIONS)}")
        try:
            cfg = resolve_config(run, world)
            engine_options(run, cfg.seed)
        except ValueError as err:
            raise ValueError(f"--sweep entry {name!r}: {err}") from None
        runs.append((name, run, cfg))
    return runs

def prepare_resume(args: argparse.Namespace, pattern: str) -> None:
    """Check ``--resume`` against the checkpoints in ``--out`` before anything trains.

    ``pattern`` globs this process's checkpoint files in OUT/checkpoints. No ``--resume`` with
    checkpoints present, or a bare ``--resume`` with none, is an error (a run never silently
    restarts from step 0 or overwrites an earlier run); ``--resume=auto`` continues when there
    are checkpoints and starts fresh otherwise; ``--resume DIR`` copies this process's newest
    checkpoints from an earlier run's output folder DIR (or its checkpoints/) into an empty
    OUT/checkpoints and continues from them. ``args.resume`` is left as the mode."""
    checkpoints = Path(args.out) / "checkpoints"
    present = sorted(checkpoints.glob(pattern))
    mode = args.resume
    if mode is None:
        if present:
            raise ValueError(f"{checkpoints} holds checkpoints of an earlier run: pass --resume "
                             "to continue it, or choose another --out")
        return
    if mode in (RESUME_REQUIRED, RESUME_AUTO):
        if not present and mode == RESUME_REQUIRED:
            raise ValueError(f"--resume: no checkpoint to resume from in {checkpoints}; pass "
                             "--resume=auto to start fresh when there is none (job scripts), or "
                             "--resume DIR with an earlier run's output folder")
        return
    source = Path(mode)
    source = source / "checkpoints" if (source / "checkpoints").is_dir() else source
    found = sorted(source.glob(pattern))
    if not found:
        raise ValueError(f"--resume {mode}: no checkpoint matching {pattern} in {source}")
    if present and source.resolve() != checkpoints.resolve():
        raise ValueError(f"--resume {mode}: {checkpoints} already holds checkpoints; choose an "
                         "empty --out to continue another run's checkpoints in")
    checkpoints.mkdir(parents=True, exist_ok=True)
    for f in found:
        if source.resolve() != checkpoints.resolve():
            shutil.copy2(f, checkpoints / f.name)
