"""Command line: ``localsgd reproduce | report | bench | plan | doctor | gpu-check | campaign``
(also ``python -m localsgd``), and ``train``, handed to the library's front door
(`localsgd.training.cli`)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from localsgd.paper import speed
from localsgd.paper.notebook import MODES, PROXY_MODES
from localsgd.paper.report import write_report
from localsgd.paper.results import repo_root
from localsgd.timing.plan import format_plan, plan_schedules
from localsgd.timing.simulate import FORMATS as WIRE_FORMATS

# `localsgd bench NAME ...` hands the rest of the command line to NAME's module `main(argv)`.
BENCHES = {
    "allocator": "localsgd.paper.bench.allocator",
    "averaging": "localsgd.paper.bench.averaging",
    "cluster": "localsgd.paper.cluster_bench",
    "convex": "localsgd.paper.bench.convex",
    "ddp": "localsgd.paper.bench.ddp",
    "proxy": "localsgd.paper.bench.proxy",
    "replicas": "localsgd.paper.bench.replicas",
}


def _parser() -> argparse.ArgumentParser:
    """The reproduction's command line (``train``'s flags are the library's: it imports no
    torch here, so `localsgd plan` starts in a fraction of the time)."""
    root = repo_root()
    p = argparse.ArgumentParser(prog="localsgd", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("reproduce", help="execute the notebooks and write figures/ + REPORT.md")
    r.add_argument("--mode", default="quick", help=f"one of {', '.join(MODES)} (default quick)")
    r.add_argument("--only", nargs="+", metavar="ID", help="notebook ids to run (default: all)")
    r.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", dest="sets",
                   help="set one notebook parameter (repeatable; the value is YAML, e.g. --set "
                   "n_seeds=1 --set 'Hs=[1, 2]'); every selected notebook's parameters cell must "
                   "define NAME; applied after the mode's notebooks/params/<id>/<mode>.yaml")
    r.add_argument("--list", action="store_true", help="list notebook ids and exit")
    r.add_argument("--notebooks", type=Path, default=root / "notebooks", help=argparse.SUPPRESS)
    r.add_argument("--out-dir", type=Path, default=None,
                   help="where figures, CSVs and REPORT.md go (default figures/; with "
                   "--dry-run a new temporary folder)")
    r.add_argument("--build-dir", type=Path, default=root / "build" / "notebooks",
                   help="where executed notebooks go (default build/notebooks/)")
    r.add_argument("--kernel", default="python3", help="Jupyter kernel name (default python3)")
    r.add_argument("--no-report", action="store_true", help="do not rewrite REPORT.md")
    r.add_argument("--plan", action="store_true",
                   help="print each notebook's runs, updates, images and estimated GPU-hours "
                   "for --mode (paper by default when given) and exit: nothing runs")
    r.add_argument("--dry-run", type=int, default=None, metavar="N",
                   help="with --mode paper: run every paper configuration on the CPU, one "
                   "seed each, for N updates per run (full-size models, the real K, B_loc, H and "
                   "schedule; 2 samples per worker and update, a 16-image evaluation) through "
                   "the notebooks' plots and claims; nothing cached, nothing written to figures/")
    r.add_argument("--profile", type=Path, default=None, metavar="FILE",
                   help="also record where each notebook's time goes (kernel start, imports, "
                   "data, model compute, engine, evaluation, saving, other) and write the table "
                   "to FILE (markdown); start from an empty results cache to profile training")
    r.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="notebooks at once (default 1). With N > 1 the notebooks that measure "
                   "time run alone first, the others N at a time with cpu_count/N threads each "
                   "(make reproduce: 2 in quick mode)")
    r.add_argument("--gpu", default=None,
                   help="with --plan: the GPU whose (estimated) throughput prices the plan")

    rep = sub.add_parser("report", help="write figures/REPORT.md (paper vs reproduced)")
    rep.add_argument("--papers", type=Path, default=root / "papers")
    rep.add_argument("--figures", type=Path, default=root / "figures")
    rep.add_argument("--check", action="store_true",
                     help="write nothing; list every result of figures/ that README, docs/ or "
                     "papers/*/notes.md copy outside a block this command generates "
                     "(localsgd.paper.prose_numbers), and every claim a notebook judges that no "
                     "papers/*/claims.csv lists; exit 1 if any")

    b = sub.add_parser("bench", help="benchmarks; `localsgd bench NAME --help` for options")
    b.add_argument("name", choices=sorted(BENCHES))
    b.add_argument("args", nargs=argparse.REMAINDER)

    # `localsgd doctor ...` is dispatched before parsing (main); listed here for --help
    sub.add_parser("doctor", help="versions, devices, numerics flags; the replica engines on "
                   "every device vs a CPU float64 reference (`localsgd doctor --help`)")
    sub.add_parser("gpu-check", help="the first command on a GPU: doctor, a throughput sweep "
                   "and 50 updates of each paper notebook's first configuration, written to "
                   "figures/gpu/ (`localsgd gpu-check --help`)")
    sub.add_parser("campaign", help="the paper's CIFAR runs at the paper's scale, packed, a "
                   "budget of minutes at a time; --plan prices it in GPU stints "
                   "(`localsgd campaign --help`)")

    # listed for --help only: main hands `train` to the library's front door before parsing
    sub.add_parser("train", add_help=False, help="train one TrainConfig: in this process "
                   "(--engine replicas) or one process per worker under torchrun (--engine "
                   "ddp); `localsgd train --help` (localsgd.training.cli)")

    sub.add_parser("cluster", add_help=False, help="run a torchrun job on an emulated cluster "
                   "(network namespaces as nodes, tc-shaped links; root): `localsgd cluster "
                   "--help` (localsgd.netcluster)")

    pl = sub.add_parser("plan", help="rank sync / local / hierarchical SGD schedules for a "
                        "cluster by predicted time per step (the timing model)",
                        description="Rank schedules by the wall-clock model of "
                        "localsgd.timing.simulate: speed only, not convergence (longer periods "
                        "are faster per step but may need more steps).")
    pl.add_argument("--workers", type=int, required=True, help="processes (GPUs), e.g. 256")
    pl.add_argument("--gpus-per-node", type=int, default=1)
    pl.add_argument("--model-mb", type=float, default=45.0,
                    help="bytes averaged per sync, MB (ResNet-18: 45)")
    pl.add_argument("--step-ms", type=float, default=55.0, help="compute per step, ms")
    pl.add_argument("--jitter", type=float, default=0.0,
                    help="coefficient of variation of the per-step compute (0: none)")
    pl.add_argument("--straggler-rate", type=float, default=0.0,
                    help="probability that a worker stalls at a step (0..1)")
    pl.add_argument("--straggler-s", type=float, default=0.0, help="stall length, seconds")
    pl.add_argument("--persistent", type=lambda s: tuple(int(v) for v in s.split(",") if v),
                    default=(), metavar="RANKS", help="comma-separated ranks that stall every step")
    pl.add_argument("--inter-gbps", type=float, default=32.0, help="network between nodes")
    pl.add_argument("--intra-gbps", type=float, default=100.0, help="inside a node")
    pl.add_argument("--latency-us", type=float, default=50.0, help="per collective hop")
    pl.add_argument("--steps", type=int, default=1000, help="simulated steps")
    pl.add_argument("--max-period", type=int, default=8,
                    help="longest global averaging period among the candidates (default 8)")
    pl.add_argument("--schemes", nargs="+", metavar="S",
                    help="rank these instead of the generated candidates (e.g. sync local:4 "
                    "hsgd:2-8,8-256 stream:32,4,4; stream:H,P,T is streaming fragment sync)")
    pl.add_argument("--host-grad", action="store_true",
                    help="local/hierarchical schemes also all-reduce gradients inside each node "
                    "every step (PyTorch's post_local_gradient_allreduce default)")
    pl.add_argument("--no-overlap", action="store_true",
                    help="gradient all-reduce does not overlap backward")
    pl.add_argument("--compress", default="fp32", choices=WIRE_FORMATS,
                    help="format of the model averages on the wire (localsgd.compression; "
                    "gradients stay fp32): bytes per sync scale by codes plus scales")
    pl.add_argument("--density", type=float, default=0.01,
                    help="share of entries topk / chunk-topk / randk averages send (default "
                    "0.01)")
    pl.add_argument("--seed", type=int, default=0)
    pl.add_argument("--top", type=int, default=15, help="rows to print (0: all)")
    pl.add_argument("--json", action="store_true", help="print the ranking as JSON records")
    return p


def _plan(args: argparse.Namespace) -> int:
    checks = [("--workers", args.workers, args.workers >= 1, "an integer >= 1"),
              ("--gpus-per-node", args.gpus_per_node, args.gpus_per_node >= 1, "an integer >= 1"),
              ("--model-mb", args.model_mb, args.model_mb >= 0, "MB >= 0"),
              ("--step-ms", args.step_ms, args.step_ms > 0, "milliseconds > 0"),
              ("--straggler-rate", args.straggler_rate, 0 <= args.straggler_rate <= 1,
               "a probability in [0, 1] (0.01 = 1 %)"),
              ("--straggler-s", args.straggler_s, args.straggler_s >= 0, "seconds >= 0"),
              ("--inter-gbps", args.inter_gbps, args.inter_gbps > 0, "Gbit/s > 0"),
              ("--intra-gbps", args.intra_gbps, args.intra_gbps > 0, "Gbit/s > 0"),
              ("--latency-us", args.latency_us, args.latency_us >= 0, "microseconds >= 0"),
              ("--steps", args.steps, args.steps >= 1, "an integer >= 1"),
              ("--max-period", args.max_period, args.max_period >= 2, "an integer >= 2"),
              ("--top", args.top, args.top >= 0, "an integer >= 0"),
              ("--density", args.density, 0 < args.density <= 1, "a fraction in (0, 1]")]
    bad = [f"{flag} {value}: expected {what}" for flag, value, ok, what in checks if not ok]
    if bad:
        raise ValueError("; ".join(bad))
    if (args.straggler_rate > 0 or args.persistent) and args.straggler_s == 0:
        raise ValueError("stragglers need a stall length: add --straggler-s SECONDS (e.g. 1)")
    df = plan_schedules(workers=args.workers, gpus_per_node=args.gpus_per_node,
                        model_mb=args.model_mb, step_ms=args.step_ms,
                        straggler_rate=args.straggler_rate, straggler_s=args.straggler_s,
                        persistent=args.persistent, inter_gbps=args.inter_gbps,
                        intra_gbps=args.intra_gbps, latency_s=args.latency_us * 1e-6,
                        steps=args.steps, max_period=args.max_period, schemes=args.schemes,
                        jitter=args.jitter, seed=args.seed,
                        intra_host_grad_allreduce=args.host_grad,
                        grad_overlap=0.0 if args.no_overlap else 1.0,
                        average_compression=args.compress,
                        compression_density=args.density)
    if args.json:
        print(json.dumps(df.to_dict(orient="records"), indent=1))
        return 0
    print(f"{args.workers} workers ({args.gpus_per_node} per node), {args.model_mb:g} MB model, "
          f"{args.step_ms:g} ms/step, stalls {args.straggler_s:g} s at "
          f"{100 * args.straggler_rate:g} %, {args.inter_gbps:g} Gbit/s between nodes, "
          f"averages in {args.compress}"
          + (f" (density {args.density:g})" if args.compress in ("topk", "chunk-topk", "randk")
             else "") + "; "
          f"{args.steps} simulated steps (localsgd.timing.simulate)")
    print(format_plan(df, args.top or None))
    print("Speed only: a longer period is faster per step but may need more steps to reach "
          "the same accuracy (the blog did not measure model parity).")
    return 0


def _converged_estimate(args: argparse.Namespace, ids: list[str], sets: dict) -> str:
    """What ``--mode converged`` will train, and about how long on a 2-core CPU: a run two
    notebooks share counts once, a run the results cache holds not at all."""
    from localsgd.paper import gpu_plan, run_progress
    from localsgd.paper.experiments import grid

    items = gpu_plan.paper_items(args.notebooks, ids, "converged", sets)
    unique = {i.key: i for i in items}  # the cache trains a shared configuration once
    todo = {key: i for key, i in unique.items() if not grid.is_cached(key)}
    # (training images, B_loc) of each configuration to train
    sizes = [(i.runs * i.updates * i.images_per_update, i.images_per_update // (i.world_size or 1))
             for i in todo.values()]
    images = sum(n for n, _ in sizes)
    seconds = sum(run_progress.proxy_seconds(n, b) for n, b in sizes)
    # a run cut off mid-way goes on from its checkpoint (counted whole: the estimate errs long)
    part = sum(grid.checkpoint_path(key).is_file() for key in todo)
    left = (f"{len(todo)} to train" + (f" ({part} from a checkpoint)" if part else "")
            + f", {images:,} training images: {run_progress.proxy_time(seconds)}"
            if todo else "nothing to train")
    return (f"converged mode: {len(unique)} runs ({len(items) - len(unique)} more shared between "
            f"notebooks), {len(unique) - len(todo)} of them cached; {left}")


def _dry_run(args: argparse.Namespace, h: Any, specs: list, figures: Path,
             sets: dict[str, Any]) -> int:
    """``reproduce --mode paper --dry-run N`` (`localsgd.paper.dry_run`)."""
    import tempfile

    from localsgd.paper import dry_run

    if args.mode != "paper":
        raise ValueError(f"--dry-run runs paper mode's configurations; got --mode {args.mode}: "
                         "use --mode paper")
    if args.dry_run < 1:
        raise ValueError(f"--dry-run {args.dry_run}: give the updates per run, at least 1")
    out_dir = (args.out_dir or Path(tempfile.mkdtemp(prefix="localsgd-dry-run-"))).resolve()
    if out_dir == figures.resolve() or figures.resolve() in out_dir.parents:
        raise ValueError("a dry run never writes into figures/: pick another --out-dir (or none)")
    seeds = sets.get("n_seeds", dry_run.SEEDS)
    os.environ[dry_run.ENV] = str(args.dry_run)  # the kernels inherit it
    try:  # paper mode's own skips (reproduce.CLUSTER_ONLY) come with the commands to run
        results = h.run(specs, "paper", out_dir=out_dir,
                        build_dir=args.build_dir.resolve(), cwd=args.notebooks.resolve().parent,
                        kernel=args.kernel, sets=sets,
                        overrides={"device": "cpu", "n_seeds": seeds},
                        skip=dry_run.SKIP)
    finally:
        del os.environ[dry_run.ENV]
    print(h.summary_table(results))
    print(f"dry run ({args.dry_run} updates per run, {seeds} seed(s) per configuration; not "
          f"results): outputs in {out_dir}")
    return _exit_code(results)


def _exit_code(results: list) -> int:
    """1 (naming them) when a notebook failed, else 0."""
    failed = [r.id for r in results if r.status == "failed"]
    if failed:
        print(f"error: {len(failed)} notebook(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _write_profile(args: argparse.Namespace, results: list, probe_s: float | None,
                   wall: float) -> Path:
    """``reproduce --profile FILE``: the phase table with the machine, commit and command."""
    import datetime

    from localsgd.paper import profile
    from localsgd.paper import results as results_mod

    rows = [r.phases for r in results if r.phases is not None]
    state = results_mod.git_state()
    head = (f"Measured {datetime.date.today()} on {speed.cpu_model()} "
            f"({os.cpu_count()} cores{f', probe {probe_s:.3f} s' if probe_s else ''}), commit "
            f"{str(state.get('commit', '?'))[:7]}, mode {args.mode}: `localsgd reproduce --mode "
            f"{args.mode}{f' --jobs {args.jobs}' if args.jobs > 1 else ''}"
            f"{''.join(f' --set {item}' for item in args.sets)} --profile "
            f"{args.profile}`. Seconds of wall time; phases are defined in "
            "`src/localsgd/paper/profile.py`."
            + (f" With {args.jobs} notebooks at once the run took {wall:.0f} s of wall time, "
               "less than the notebooks' sum." if args.jobs > 1 else "") + "\n\n")
    return results_mod.write_text(args.profile, head + profile.table(rows))


def _reproduce(args: argparse.Namespace) -> int:
    from localsgd.paper import reproduce as h  # deferred: nbformat takes seconds to import

    sets = h.parse_sets(args.sets)
    if args.list:
        for nb_id, path in h.discover(args.notebooks).items():
            modes = [m for m in h.MODES if (path.parent / "params" / nb_id / f"{m}.yaml").exists()]
            print(f"{nb_id:32s} {' '.join(modes)}")
        return 0
    if args.plan:
        from localsgd.paper import gpu_plan

        gpu = args.gpu or gpu_plan.DEFAULT_GPU
        # what `localsgd gpu-check` measured beside the notebooks replaces the estimates
        table = {**gpu_plan.THROUGHPUT, **gpu_plan.measured_folder(
            args.notebooks.resolve().parent / "figures" / "gpu")}
        known = sorted({key[0] for key in table})
        if gpu not in known:
            raise ValueError(f"--gpu {gpu!r}: no throughput for it; known: {', '.join(known)}")
        mode = "paper" if args.mode == "quick" and "--mode" not in sys.argv else args.mode
        # unknown ids / modes: the harness's errors; a partial mode plans its own notebooks
        ids = [s.id for s in h.plan(args.notebooks, mode, args.only, sets)]
        print(gpu_plan.plan(gpu_plan.paper_items(args.notebooks, ids, mode, sets),
                            gpu, table).format())
        return 0
    specs = h.plan(args.notebooks, args.mode, args.only, sets)
    if sets:
        print(f"--set (every selected notebook): {h.format_sets(sets)}", flush=True)
    reference = args.notebooks.resolve().parent / "figures" / speed.SPEED_FILE
    if args.dry_run is not None:
        return _dry_run(args, h, specs, reference.parent, sets)
    if args.jobs < 1:
        raise ValueError(f"--jobs {args.jobs}: must be at least 1")
    # converged mode's results live apart (<out-dir>/converged/, figures/converged/ by
    # default): the report built in <out-dir> gives them their own section and rows; paper
    # mode's go to figures/paper/ by default (the report reads them there), never over the
    # committed quick-mode files in figures/
    base_dir = (args.out_dir or reference.parent).resolve()
    out_dir = base_dir / args.mode if args.mode in PROXY_MODES else base_dir
    if args.mode == "paper" and args.out_dir is None:
        out_dir = base_dir / "paper"
    if sets and base_dir == reference.parent.resolve():
        # figures/ holds what the mode's parameter files give; a changed parameter goes elsewhere
        raise ValueError("--set changes a notebook's parameters: give --out-dir (e.g. "
                         "build/try) so that figures/ keeps the mode's own results")
    # kept runs: converged mode's beside its figures; paper mode's in figures/paper/runs/,
    # where `localsgd campaign` keeps what lent GPUs trained (also for a render elsewhere)
    kept = {**{m: out_dir / "runs" for m in PROXY_MODES},
            "paper": reference.parent / "paper" / "runs"}.get(args.mode)
    with _kept_runs(kept):
        return _run_and_report(args, h, specs, sets, reference, base_dir, out_dir)


@contextlib.contextmanager
def _kept_runs(folder: Path | None) -> Iterator[None]:
    """Converged and paper mode keep finished runs in a committed folder and read them back
    where the results cache lacks them (`grid.runs_dir`): a reproduction cut off on one machine
    goes on on another. The kernels inherit the variable; the old value comes back after."""
    if folder is None:
        yield
        return
    from localsgd.paper.experiments.grid import RUNS_ENV

    old = os.environ.get(RUNS_ENV)
    os.environ[RUNS_ENV] = str(folder)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(RUNS_ENV, None)
        else:
            os.environ[RUNS_ENV] = old


def _run_and_report(args: argparse.Namespace, h: Any, specs: list, sets: dict[str, Any],
                    reference: Path, base_dir: Path, out_dir: Path) -> int:
    """`localsgd reproduce` once the notebooks and folders are settled: estimate, run, report."""
    probe_s, committed = None, {}
    if reference.is_file():
        committed = json.loads(reference.read_text()).get("notebook_seconds", {})
    if args.mode == "converged":  # the estimate first: hours of CPU
        print(_converged_estimate(args, [s.id for s in specs], sets), flush=True)
    if args.mode == "quick":  # smoke runs take seconds: no estimate
        probe_s = speed.probe()
        est = speed.estimate(reference, [s.id for s in specs], probe_s, jobs=args.jobs,
                             timed=h.TIMED)
        print(est.format() if est else f"no {reference}: no time estimate", flush=True)
    t0 = time.perf_counter()
    results = h.run(specs, args.mode, out_dir=out_dir, build_dir=args.build_dir.resolve(),
                    cwd=args.notebooks.resolve().parent, kernel=args.kernel, sets=sets,
                    profiled=args.profile is not None, jobs=args.jobs, expected=committed)
    wall = time.perf_counter() - t0
    print(h.summary_table(results))
    if sets:
        print(f"--set (every selected notebook): {h.format_sets(sets)}")
    if args.profile is not None:
        print(f"profile: {_write_profile(args, results, probe_s, wall)}")
    every = {s.id for s in specs} == set(h.discover(args.notebooks))
    if (probe_s is not None and every and not sets and out_dir == reference.parent.resolve()
            and all(r.status == "ok" for r in results)):
        # the committed figures' machine: the reference the next estimate scales from; its probe
        # is the faster of one before and one after the run (one can catch a slow moment)
        speed.write_reference(reference, min(probe_s, speed.probe()),
                              {r.id: round(r.seconds, 1) for r in results},
                              jobs=args.jobs, wall_seconds=round(wall, 1))
    papers = args.notebooks.resolve().parent / "papers"
    if not args.no_report and papers.is_dir():  # converged runs: a section of base_dir's
        print(f"report: {write_report(papers, base_dir)}")
    elif not args.no_report:
        print(f"no {papers} beside the notebooks: REPORT.md not written")
    return _exit_code(results)


def _check_prose(papers: Path, figures: Path) -> int:
    """`localsgd report --check`: results copied into README, docs/ or notes outside a generated
    block, claims a notebook judges that no source's ledger lists, and verdicts without the
    rule they were judged by."""
    from localsgd.paper import ledger, prose_numbers  # deferred: reads the checkout's figures/

    problems = prose_numbers.unlinked() + [
        f"claim not in any papers/*/claims.csv: {c!r}"
        for c in ledger.unregistered_claims(papers, figures)] + [
        f"{path}: a verdict without the rule it was judged by (an older notebook's output): "
        "run its notebook again" for path in ledger.unruled_verdicts(figures)]
    for line in problems:
        print(line)
    print(f"prose and claims: {len(problems)} problem(s)")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["doctor"]:
        from localsgd.paper.doctor import main as doctor

        return doctor(argv[1:])
    if argv[:1] == ["gpu-check"]:
        from localsgd.paper.gpu_check import main as gpu_check

        return gpu_check(argv[1:])
    if argv[:1] == ["train"]:
        from localsgd.training.cli import main as train

        return train(argv[1:])
    if argv[:1] == ["cluster"]:
        from localsgd.netcluster import main as cluster

        return cluster(argv[1:])
    if argv[:1] == ["campaign"]:
        from localsgd.paper.campaign import main as campaign

        return campaign(argv[1:])
    args = _parser().parse_args(argv)
    try:
        if args.command == "reproduce":
            return _reproduce(args)
        if args.command == "report":
            if args.check:
                return _check_prose(args.papers, args.figures)
            print(write_report(args.papers, args.figures))
            return 0
        if args.command == "plan":
            return _plan(args)
        if args.command == "bench":
            module = importlib.import_module(BENCHES[args.name])
            return int(module.main(args.args) or 0)
    except (ValueError, FileNotFoundError) as exc:  # reproduce.HarnessError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
