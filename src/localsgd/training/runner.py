"""The torchrun runner: `localsgd.training.loop.train` on one process per worker (`DDPEngine`).

Launch (one machine; ``localsgd train --engine ddp`` starts this for you)::

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 4 -m localsgd.training.runner \\
        --config run --out runs/demo

Every rank validates the configuration before any
process group exists, so a bad launch fails on all ranks at once with exit code 2 and a message
naming the problem. Outputs: records.csv, timing.csv (one row per step x worker, split into
compute / waiting / communication by `localsgd.timing.stragglers.split_waiting`) and
summary.json.

``--compile MODE`` compiles the DDP model (`localsgd.engines.ddp.COMPILE_MODES`);
``--compare-eager`` trains eager then compiled from one seed and compares per-step time and loss
curves. ``--sweep FILE`` trains a list of configurations one after another in one launch (one
torch start-up for a whole grid: what `localsgd.paper.experiments.timing_validation` runs to check
the timing model). Checkpoints are per rank (`localsgd.training.checkpoint.RankCheckpoints`); a
resume after SIGKILL of every worker is bitwise exact on CPU/gloo.

The flags, the configuration they resolve to and ``--sweep``'s runs are
`localsgd.training.runner_args`; the output folder is `localsgd.training.runner_outputs` (import their names from there).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist

from localsgd import device as device_rule
from localsgd.distributed import init_from_env
from localsgd.engines.common import clone_tensors
from localsgd.engines.ddp import DDPEngine
from localsgd.paths import append_event
from localsgd.training.batch_sources import load_dataset
from localsgd.training.config import TrainConfig
from localsgd.training.loop import build_engine, train
from localsgd.training.plan import plan_run, torchrun_placement
from localsgd.training.runner_args import (
    SWEEP_OPTIONS,
    add_run_arguments,
    engine_options,
    prepare_resume,
    resolve_config,
    sweep_runs,
)
from localsgd.training.runner_outputs import format_summary, write_outputs

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """``python -m localsgd.training.runner`` under torchrun: one worker of the job."""
    p = argparse.ArgumentParser(prog="python -m localsgd.training.runner",
                                description=__doc__.split("\n")[0])
    add_run_arguments(p)
    p.add_argument("--sweep", type=Path, default=None, metavar="FILE",
                   help="YAML list of runs (name + TrainConfig fields / straggler, compute and "
                   "topology options) trained one after another in this one launch (one torch "
                   "start-up for all): OUT/<name>/ per run and OUT/sweep.csv")
    p.add_argument("--fast-exit", action="store_true",
                   help="end the process with os._exit once every output is written and the "
                   "process group is destroyed, skipping the interpreter's teardown of torch: "
                   "always so when run as `python -m localsgd.training.runner`; this flag asks "
                   "it of main() called from Python")
    args = p.parse_args(argv)
    if "RANK" not in os.environ:
        print("error: run under torchrun, e.g. `torchrun --standalone --nproc-per-node 4 -m "
              "localsgd.training.runner ...`, or use `localsgd train --engine ddp`, which "
              "starts torchrun",
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
        placement = torchrun_placement([cfg], args.backend)
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
            eager = _run_once(args, cfg, args.out / "eager", None, rank, world, placement,
                              dataset=dataset)
            compiled = _run_once(args, cfg, args.out / args.compile, args.compile, rank, world,
                                 placement,
                                 dataset=dataset)
            if rank == 0:
                return _compare(eager, compiled, args)
            return 0
        return 0 if _run_once(args, cfg, args.out, args.compile, rank, world, placement,
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
        placement = torchrun_placement([cfg for _, _, cfg in runs], args.backend)
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
            summary = _run_once(run, cfg, args.out / name, run.compile, rank, world, placement,
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
              world: int, placement: device_rule.Placement, dataset=None) -> dict | None:
    """Train ``cfg`` once (this rank's worker at ``placement``) and write the outputs on rank
    0; the summary on rank 0, {} on the others, None after an error (printed)."""
    holder: list[DDPEngine] = []
    options = {**engine_options(args, cfg.seed), "compile": compile}
    try:
        plan = plan_run(cfg, "ddp", placement=placement)
    except ValueError as err:
        _fail(rank, err)
        return None

    def make_engine(c, n_train, num_classes):
        holder.append(build_engine(c, n_train, num_classes, kind="ddp", plan=plan, **options))
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
                        on_phases=_phases_writer(args.phases) if rank == 0 else None,
                        plan=plan)
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
    return cfg.run_as(device=str(placement.device))


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
