"""``localsgd train``: the one front door to training, in the library wing.

One `TrainConfig` (``--config NAME|FILE`` and field flags, `localsgd.training.runner_args`)
runs on either engine: ``--engine replicas`` trains K replicas in this process
(`localsgd.training.loop.train`); ``--engine ddp`` starts ``torchrun --standalone`` with one
process per worker, each running `localsgd.training.runner` (on several machines start torchrun
on each yourself). Both write the same output folder (`localsgd.training.runner_outputs`) and
resume from ``--out``'s checkpoints under the same rules (`runner_args.prepare_resume`).

The reproduction's ``localsgd`` command (`localsgd.paper.cli`: reproduce, report, bench, plan,
doctor, gpu-check, campaign) hands ``train`` to `main` here, which imports nothing of the
reproduction; ``python -m localsgd.training.cli`` is the same door.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from localsgd.training.runner_args import add_run_arguments, prepare_resume, resolve_config

__all__ = ["main", "parser"]

# runner flags that need one process per worker (stragglers, a modelled compute time, compile,
# the process group's backend, the eager comparison, per-rank final models, the phase log)
_DDP_ONLY = ("straggler_seconds", "straggler_rate", "straggler_ranks", "compute_ms", "compile",
             "backend", "compare_eager", "save_final", "phases")


def parser() -> argparse.ArgumentParser:
    """``localsgd train``'s flags: ``--engine`` and the runner's (`add_run_arguments`)."""
    p = argparse.ArgumentParser(
        prog="localsgd train", description="Train one TrainConfig: K replicas in this process "
        "(--engine replicas) or one process per worker under torchrun (--engine ddp).")
    p.add_argument("--engine", choices=("replicas", "ddp"), default="replicas",
                   help="replicas: K models in this process; ddp: starts torchrun --standalone "
                   "with one process per worker (several machines: run torchrun yourself)")
    add_run_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``localsgd train ARGV``; a bad flag, config or checkpoint is one ``error:`` line and
    exit code 2, before anything trains."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    try:
        return _ddp(args, argv) if args.engine == "ddp" else _replicas(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _ddp(args: argparse.Namespace, argv: list[str]) -> int:
    from localsgd.training import runner  # deferred: torch.distributed

    # the runner's own flags: the same command line without --engine
    rest = [a for i, a in enumerate(argv) if not a.startswith("--engine")
            and not (i > 0 and argv[i - 1] == "--engine")]
    if "RANK" in os.environ:  # already a torchrun worker
        return runner.main(rest)
    if args.nodes not in (None, 1):
        raise ValueError(f"--nodes {args.nodes}: `localsgd train` starts one machine's torchrun; "
                         "on several machines start torchrun on each (README, 'The torchrun "
                         "runner')")
    cfg = resolve_config(args, None)
    # the runner run as a module ends with os._exit (runner.exit_now says why)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(cfg.world_size), "-m", "localsgd.training.runner", *rest]
    print("+ " + " ".join(cmd), flush=True)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # one thread per worker process on a CPU box
    return subprocess.run(cmd, env=env, check=False).returncode


def _replicas(args: argparse.Namespace) -> int:
    from localsgd.training.loop import train  # deferred: torch
    from localsgd.training.runner_outputs import format_summary, write_outputs

    given = [f"--{name.replace('_', '-')}" for name in _DDP_ONLY if getattr(args, name)]
    if given:
        raise ValueError(f"{given} need one process per worker: use --engine ddp")
    cfg = resolve_config(args, None)
    prepare_resume(args, "run.pt")
    use_ckpt = args.checkpoint_every > 0 or args.resume is not None
    records = train(cfg, checkpoint_path=args.out / "checkpoints" / "run.pt" if use_ckpt
                    else None, checkpoint_every_steps=args.checkpoint_every,
                    resume=args.resume is not None, progress=not args.no_progress)
    summary = write_outputs(args.out, records, None, [], {
        "engine": "replicas", "world_size": cfg.world_size, "steps": int(records.step.iloc[-1]),
        "seconds": float(records.wall_seconds.iloc[-1])})
    print(format_summary(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
