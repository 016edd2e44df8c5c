"""The torchrun runner: `localsgd.train.train` on one process per worker (`DDPEngine`).

Launch (one machine; ``localsgd train --engine ddp`` starts this for you)::

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 4 -m localsgd.runner \\
        --config run --out runs/demo

(``-m localsgd.ddp`` is the same command.) Every rank validates the configuration before any
process group exists, so a bad launch fails on all ranks at once with exit code 2 and a message
naming the problem. Outputs: records.csv, timing.csv (one row per step x worker, split into
compute / waiting / communication by `localsgd.timing.stragglers.split_waiting`) and
summary.json.

``--compile MODE`` compiles the DDP model (`localsgd.engines.ddp.COMPILE_MODES`);
``--compare-eager`` trains eager then compiled from one seed and compares per-step time and loss
curves. ``--sweep FILE`` trains a list of configurations one after another in one launch (one
torch start-up for a whole grid: what `localsgd.paper.experiments.timing_validation` runs to check the
timing model). Checkpoints are per rank (`localsgd.checkpoint.RankCheckpoints`); a resume after
SIGKILL of every worker is bitwise exact on CPU/gloo.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import shutil
import sys
import time
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist
import yaml

from localsgd import configs
from localsgd import device as device_rule
from localsgd.distributed import init_from_env
from localsgd.engines.common import clone_tensors
from localsgd.engines.ddp import COMPILE_MODES, DDPEngine
from localsgd.paths import append_event
from localsgd.timing.stragglers import Stragglers, split_waiting, timing_summary
from localsgd.train import TrainConfig, build_engine, load_dataset, train

__all__ = ["SWEEP_OPTIONS", "add_run_arguments", "config_values", "engine_options",
           "format_summary", "main", "resolve_config", "sweep_runs", "write_outputs"]


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
    if typing.get_origin(hint) is tuple:
        return lambda text: tuple(float(v) for v in text.split(",") if v.strip())
    if type(None) in args:
        inner = next(a for a in args if a is not type(None))
        return lambda text: None if text.lower() == "none" else inner(text)
    return hint


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by ``python -m localsgd.runner`` and ``localsgd train``: every `TrainConfig`
    field as ``--field-name`` (overriding ``--config``), plus the runner's own options."""
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


def write_outputs(out: Path, records, timeline_rows: list[dict] | None, group_sizes: list[int],
                  meta: dict) -> dict:
    """records.csv, timing.csv (one row per step x worker) and summary.json; returns the
    summary (steps/s, compute / waiting / communication shares, bytes per level)."""
    out.mkdir(parents=True, exist_ok=True)
    records.to_csv(out / "records.csv", index=False)
    summary = dict(meta)
    if timeline_rows:
        df = split_waiting(pd.DataFrame(timeline_rows), group_sizes)
        df.sort_values(["step", "rank"]).to_csv(out / "timing.csv", index=False)
        summary.update(timing_summary(df, group_sizes))
    summary["final_train_loss"] = float(records.train_loss.iloc[-1])
    summary["final_test_acc"] = float(records.test_acc.iloc[-1])
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def format_summary(s: dict) -> str:
    workers = s.get("workers", s.get("world_size"))
    lines = [f"{s.get('engine', '?')} engine, {workers} workers, {s.get('steps', '?')} steps"]
    if "steps_per_s" in s:
        lines.append(f"  {s['steps_per_s']:.2f} steps/s (median step {1e3 * s['median_step_s']:.1f}"
                     f" ms); worker time: compute "
                     f"{100 * s['compute_share']:.1f} %, waiting {100 * s['wait_share']:.1f} %, "
                     f"communication {100 * s['comm_share']:.1f} %; {s['stalls']} stalls "
                     f"({s['stall_seconds']:.1f} s)")
        levels = sorted(k for k in s if k.startswith("bytes_l"))
        lines.append("  bytes all-reduced per level (sum over workers): " + ", ".join(
            f"l{k[7:]} (groups of {s['group_l' + k[7:]]}) {s[k] / 1e6:.1f} MB" for k in levels))
    lines.append(f"  final train loss {s['final_train_loss']:.4f}, test acc "
                 f"{s['final_test_acc']:.1f} %")
    return "\n".join(lines)


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


def main(argv: list[str] | None = None) -> int:
    """``python -m localsgd.runner`` under torchrun: one worker of the job."""
    p = argparse.ArgumentParser(prog="python -m localsgd.runner",
                                description=__doc__.split("\n")[0])
    add_run_arguments(p)
    p.add_argument("--sweep", type=Path, default=None, metavar="FILE",
                   help="YAML list of runs (name + TrainConfig fields / straggler, compute and "
                   "topology options) trained one after another in this one launch (one torch "
                   "start-up for all): OUT/<name>/ per run and OUT/sweep.csv")
    p.add_argument("--fast-exit", action="store_true",
                   help="end the process with os._exit once every output is written and the "
                   "process group is destroyed, skipping the interpreter's teardown of torch: "
                   "always so when run as `python -m localsgd.runner`; this flag asks it of "
                   "main() called from Python")
    args = p.parse_args(argv)
    if "RANK" not in os.environ:
        print("error: run under torchrun, e.g. `torchrun --standalone --nproc-per-node 4 -m "
              "localsgd.runner ...`, or use `localsgd train --engine ddp`, which starts torchrun",
              file=sys.stderr)
        return 2
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    code = _sweep(args, rank, world) if args.sweep is not None else _single(args, rank, world)
    if args.fast_exit:
        exit_now(code)
    return code


def _single(args: argparse.Namespace, rank: int, world: int) -> int:
    """One run (``--config`` and flags), or its eager and compiled versions (--compare-eager)."""
    try:  # every rank checks the same inputs, so a bad launch fails on all of them at once
        cfg = resolve_config(args, world)
        prepare_resume(args, f"run.rank{rank}.step*.pt")
        engine_options(args, cfg.seed)  # validates the straggler options
        placement = device_rule.resolve_from_env(cfg.device, args.backend, torchrun=True)
    except (ValueError, OSError) as err:  # DeviceError included: no CUDA, nccl on cpu, ...
        return _fail(rank, err)
    init_from_env(placement=placement)
    cfg = _placed(cfg, placement)
    try:
        if args.compare_eager and (args.compile is None or args.resume
                                   or args.checkpoint_every):
            return _fail(rank, "--compare-eager needs --compile MODE and no checkpoints (it "
                         "trains the config twice from scratch)")
        try:  # prepared once per node before any rank reads it; one load serves every run
            dataset = _prepared_dataset(cfg)
        except (ValueError, OSError) as err:  # the same message on every rank
            return _fail(rank, err)
        if args.compare_eager:
            eager = _run_once(args, cfg, args.out / "eager", None, rank, world, dataset=dataset)
            compiled = _run_once(args, cfg, args.out / args.compile, args.compile, rank, world,
                                 dataset=dataset)
            if rank == 0:
                return _compare(eager, compiled, args)
            return 0
        return 0 if _run_once(args, cfg, args.out, args.compile, rank, world,
                              dataset=dataset) is not None else 2
    finally:
        dist.destroy_process_group()


def _sweep(args: argparse.Namespace, rank: int, world: int) -> int:
    """Every run of ``--sweep`` in this launch (see `sweep_runs`); OUT/sweep.csv on rank 0."""
    try:
        if args.resume or args.checkpoint_every or args.compare_eager:
            raise ValueError("--sweep trains each run once from scratch: drop --resume, "
                             "--checkpoint-every and --compare-eager")
        runs = sweep_runs(args, world)
        for name, _, _ in runs:
            if (args.out / name / "summary.json").exists():
                raise ValueError(f"{args.out / name} holds an earlier run; choose another --out")
        devices = sorted({cfg.device for _, _, cfg in runs})
        if len(devices) > 1:
            raise ValueError(f"the sweep's runs ask for devices {devices}; one launch joins one "
                             "process group on one device: give every run the same device")
        placement = device_rule.resolve_from_env(devices[0], args.backend, torchrun=True)
    except (ValueError, OSError) as err:
        return _fail(rank, err)
    init_from_env(placement=placement)
    runs = [(name, run, _placed(cfg, placement)) for name, run, cfg in runs]
    rows, datasets = [], {}
    try:
        for name, run, cfg in runs:
            # runs on the same data share one copy: building it again per run costs every
            # process the same CPU (seconds for 16 processes on 2 cores)
            key = (cfg.dataset, cfg.n_train, cfg.n_test)
            if key not in datasets:
                try:  # prepared once per node before any rank reads it
                    datasets[key] = _prepared_dataset(cfg)
                except (ValueError, OSError) as err:  # the same message on every rank
                    return _fail(rank, err)
            dist.barrier()  # every run starts from aligned ranks (the previous one's tails)
            summary = _run_once(run, cfg, args.out / name, run.compile, rank, world,
                                dataset=datasets[key])
            if summary is None:
                return 2
            if rank == 0:
                rows.append({"name": name, **{k: v for k, v in summary.items()
                                              if k != "train_loss"},
                             **{k: getattr(run, k) for k in SWEEP_OPTIONS},
                             **{k: v for k, v in cfg.to_dict().items()
                                if k in ("world_size", "block_size", "local_steps",
                                         "block_steps", "block_gradient_allreduce",
                                         "post_local_warmup_epochs", "seed")}})
        if rank == 0:
            table = pd.DataFrame(rows)
            table["straggler_ranks"] = table["straggler_ranks"].map(
                lambda r: ",".join(map(str, r)))
            table.to_csv(args.out / "sweep.csv", index=False)
        return 0
    finally:
        dist.destroy_process_group()


def _run_once(args: argparse.Namespace, cfg, out: Path, compile: str | None, rank: int,
              world: int, dataset=None) -> dict | None:
    """Train ``cfg`` once (this rank's worker) and write the outputs on rank 0; the summary on
    rank 0, {} on the others, None after an error (printed)."""
    holder: list[DDPEngine] = []
    options = {**engine_options(args, cfg.seed), "compile": compile}

    def make_engine(c, n_train, num_classes):
        holder.append(build_engine(c, n_train, num_classes, kind="ddp", **options))
        return holder[0]

    checkpoints = out / "checkpoints"
    use_ckpt = args.checkpoint_every > 0 or args.resume is not None
    graphs_before = _dynamo_graphs()
    try:
        records = train(cfg, engine=make_engine, dataset=dataset,
                        checkpoint_path=checkpoints / "run.pt" if use_ckpt else None,
                        checkpoint_every_steps=args.checkpoint_every,
                        resume=args.resume is not None,
                        progress=not args.no_progress and rank == 0,
                        on_phases=_phases_writer(args.phases) if rank == 0 else None)
    except (ValueError, OSError) as err:  # bad checkpoint, configuration or data: every rank
        _fail(rank, err)
        return None
    engine = holder[0]
    # rank 0 alone writes the timing table: only it receives the other ranks' timelines
    timelines: list | None = [None] * world if rank == 0 else None
    dist.gather_object(engine.timeline, timelines, dst=0)
    if args.save_final:
        out.mkdir(parents=True, exist_ok=True)
        torch.save(clone_tensors(engine.model.state_dict()), out / f"final_rank{rank}.pt")
    if rank != 0:
        return {}
    meta = {"engine": "ddp", "world_size": world, "backend": dist.get_backend(),
            "compile": compile, "compile_backend": args.compile_backend if compile else None,
            "compute_ms": args.compute_ms, "straggler_seconds": args.straggler_seconds,
            "straggler_rate": args.straggler_rate, "straggler_ranks": list(args.straggler_ranks)}
    summary = write_outputs(out, records, [r for tl in timelines or [] for r in tl],
                            [lv.group_size for lv in cfg.topology().levels], meta)
    summary["train_loss"] = records.train_loss.tolist()
    summary["compiled_graphs"] = _dynamo_graphs() - graphs_before  # 0 for an eager run
    print(format_summary(summary))
    return summary


def _phases_writer(path: Path | None):
    """``train``'s on_phases hook for ``--phases FILE``: one JSON line per run (a "train" event
    in the format `localsgd.paper.profile` reads), in one short append-mode write."""
    return None if path is None else lambda phases: append_event(path, "train", **phases)


def _fail(rank: int, err: Exception | str) -> int:
    """Report a launch error once: every rank checks the same inputs and fails alike, so rank 0
    alone prints the line (the others exit quietly with the same code)."""
    if rank == 0:
        print(f"error: {err}", file=sys.stderr, flush=True)
    else:  # torchrun stops the job when any rank exits: let rank 0's line out first
        time.sleep(1.0)
    return 2


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


def _prepared_dataset(cfg: TrainConfig):
    """``load_dataset(cfg)`` on this rank, once the data set is prepared on its node.

    The first process of every node (``LOCAL_RANK`` 0) loads it first -- downloads, extracts and
    decodes into the cache whatever ``load_dataset`` needs -- while every other rank waits; then
    the others load it from the prepared cache, so ranks never download into one folder at once.
    Per node rather than on global rank 0 alone: each node may have its own cache (the default
    ``~/.cache/localsgd`` is node-local). Nodes sharing one cache folder are serialized by the
    inter-process lock `localsgd.data` holds around a download: the first node fetches, the
    others wait for it and find the finished copy.

    The wait is an ``all_gather_object`` (a barrier that also carries each preparing rank's
    ``ValueError``/``OSError``): when preparation fails, every rank raises it (one line, the same
    on every rank, so rank 0 can report a failure on another node) instead of waiting at a
    barrier for a rank that has given up. ``synthetic`` data is computed, not read: every rank
    builds it at once.
    """
    if cfg.dataset == "synthetic":
        return load_dataset(cfg)
    dataset, error = None, None
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        try:
            dataset = load_dataset(cfg)
        except (ValueError, OSError) as err:
            error = err
    reports: list = [None] * dist.get_world_size()
    dist.all_gather_object(reports, None if error is None else (
        dist.get_rank(), isinstance(error, OSError), " ".join(str(error).split())))
    failed = next((r for r in reports if r is not None), None)
    if failed is not None:
        rank, is_os_error, message = failed
        if error is not None and rank == dist.get_rank():
            raise error
        raise (OSError if is_os_error else ValueError)(
            f"rank {rank} could not prepare the data: {message}")
    return dataset if dataset is not None else load_dataset(cfg)


def _placed(cfg: TrainConfig, placement: device_rule.Placement) -> TrainConfig:
    """``cfg`` on this rank's device (``cuda`` -> ``cuda:LOCAL_RANK``; `localsgd.device`)."""
    return dataclasses.replace(cfg, device=str(placement.device))


def _dynamo_graphs() -> int:
    """Graphs torch.compile has compiled in this process so far (dynamo's own counter)."""
    from torch._dynamo.utils import counters  # deferred: loading dynamo costs ~1 s per process

    return int(counters["stats"]["unique_graphs"])


def _compare(eager: dict, compiled: dict, args: argparse.Namespace) -> int:
    """Per-step time of eager vs compiled and the compiled loss curve against eager's."""
    a, b = eager["train_loss"], compiled["train_loss"]
    rel = max(abs(x - y) / abs(x) for x, y in zip(a, b, strict=True))
    ok = rel <= args.loss_rtol
    report = {"mode": args.compile, "backend": args.compile_backend,
              "eager_median_step_s": eager["median_step_s"],
              "compiled_median_step_s": compiled["median_step_s"],
              "speedup": eager["median_step_s"] / compiled["median_step_s"],
              "train_loss_eager": a, "train_loss_compiled": b,
              "graphs_eager": eager["compiled_graphs"],
              "graphs_compiled": compiled["compiled_graphs"],
              "max_rel_loss_diff": rel, "loss_rtol": args.loss_rtol, "agree": ok}
    (args.out / "compare.json").write_text(json.dumps(report, indent=2))
    print(f"compiled ({args.compile}, {args.compile_backend}) vs eager: median step "
          f"{1e3 * report['compiled_median_step_s']:.1f} ms vs "
          f"{1e3 * report['eager_median_step_s']:.1f} ms ({report['speedup']:.2f}x); per-epoch "
          f"train loss differs by at most {rel:.2e} relative ({'within' if ok else 'ABOVE'} "
          f"--loss-rtol {args.loss_rtol})")
    return 0 if ok else 1


def exit_now(code: int) -> None:
    """End a worker process at once (``os._exit``) once its outputs are written.

    The interpreter's teardown of torch costs ~2 s of CPU per process (16 processes on 2 cores
    pay it one after another), and a gloo worker thread still alive at interpreter finalization
    can abort the process ("terminate called without an active exception", pytorch#179291):
    seen twice in CI here, once under `localsgd train` and once in the two-node recipe."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
