"""``localsgd bench cluster``: measurements on the emulated cluster (root), committed for the
notebooks that read them: ``--figure fig01`` (Figure 1 of Lin et al. 2020) and ``--figure
timing`` (the timing model against the runner, as `timing_validation` does on loopback),
``--figure stragglers`` (the blog's waiting non-stragglers), ``--figure hierarchy`` (§4.3's
hierarchical against flat averaging as nodes are added) and ``--figure approx`` (SlowMo's
approximate averaging against DDP's exact all-reduce).

**fig01.**
The figure times an MPI all-reduce of 100 MB as cores are added (10 Gbps, 48 cores per
machine). Here one gloo all-reduce of ``--mb`` MB (default the figure's 100) is timed on
``localsgd.netcluster`` nodes whose links are capped at ``--rate-mbit``, for each nodes ×
processes-per-node layout, ``--repeats`` times each (`allreduce_worker`). Rows go to
``--out`` (default ``figures/cluster/fig01_allreduce.csv``: the ``fig01_allreduce`` notebook
reads it), one per repeat, with the link's measured rate. The provenance goes beside it in a
``.json``: machine, load, the asked and measured rates, command and date. Needs root.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path

import pandas as pd

from localsgd import netcluster
from localsgd.paper.bench.common import machine

LAYOUTS = "1x2,2x1,2x2,4x1,4x2,8x1"  # nodes x processes per node
# the timing check: timing_validation's quick grid (8 and 16 processes in nodes of 4, 32
# updates of emulated compute and stalls), every launch on the emulated cluster
TIMING = {"workers": [8, 16], "procs_per_node": 4, "local_steps": (2, 4, 8),
          "hierarchical": ((2, 4),), "steps": 32, "compute_ms": 50.0,
          "straggler_seconds": 0.3, "straggler_rate": 0.02, "repeats": 1, "seed": 0}


# the blog's "stragglers inflate all-reduce": synchronous SGD (DDP's gradient all-reduce every
# update) on 2 nodes x 2 over 100 Mbit/s, 50 ms of emulated compute, with and without one
# persistent straggler (rank 3, +0.2 s before every backward), 3 interleaved repeats
STRAGGLERS = {"nodes": 2, "procs_per_node": 2, "steps": 24, "compute_ms": 50.0,
              "straggler_seconds": 0.2, "straggler_rank": 3, "repeats": 3}


def _window(launch_dir: Path, run: str, warm: int) -> pd.DataFrame:
    """One run's timing.csv (a row per update and worker) after its ``warm`` updates."""
    t = pd.read_csv(launch_dir / "runs" / run / "timing.csv")
    return t[t.step > warm]


def measure_stragglers(rate_mbit: float, out: Path) -> dict:
    """Per run and rank: the mean seconds an update spends in the gradient all-reduce
    (waiting for the group's last member + communicating) over the measured window;
    ``out``.csv."""
    from localsgd.paper.experiments import timing_validation as validation

    g = STRAGGLERS
    entries = []
    for r in range(g["repeats"]):
        entries += [{"name": f"clean_r{r}", "seed": r, **validation.SYNC_RUN,
                     "straggler_seconds": 0.0, "straggler_rate": 0.0, "straggler_ranks": []},
                    {"name": f"straggler_r{r}", "seed": r, **validation.SYNC_RUN,
                     "straggler_seconds": g["straggler_seconds"], "straggler_rate": 0.0,
                     "straggler_ranks": [g["straggler_rank"]]}]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        info = validation.launch(entries, g["nodes"] * g["procs_per_node"], Path(tmp),
                                 steps=g["steps"], compute_ms=g["compute_ms"],
                                 straggler_seconds=0.0, straggler_rate=0.0,
                                 cluster_rate_mbit=rate_mbit, procs_per_node=g["procs_per_node"])
        for e in entries:
            for rank, part in _window(Path(tmp), e["name"], info["warm"]).groupby("rank"):
                rows.append({"run": e["name"].split("_r")[0], "repeat": e["seed"],
                             "rank": int(rank), "straggler": rank in e["straggler_ranks"],
                             "wait_s": part.wait_grad_s.mean(), "comm_s": part.comm_grad_s.mean(),
                             "allreduce_s": (part.wait_grad_s + part.comm_grad_s).mean(),
                             "step_s": part.wall_s.mean(), "steps": len(part),
                             "link_mbit": sum(info["measured_rate_mbit"].values()) / 2})
    pd.DataFrame(rows).to_csv(out, index=False)
    return {"grid": g, "command": info["command"], "warm": info["warm"]}


# §4.3's "synchronising inside nodes first ... the gain grows with cluster size": flat local SGD
# (the world averages every H = 2 updates) against hierarchical (nodes every 2, the world every
# 2 x 4), no stragglers, nodes of 2 processes over 100 Mbit/s, 2 / 4 / 8 nodes, 3 repeats
HIERARCHY = {"nodes": [2, 4, 8], "procs_per_node": 2, "steps": 32, "compute_ms": 50.0,
             "H": 2, "Hb": 4, "repeats": 3}


def measure_hierarchy(rate_mbit: float, out: Path) -> dict:
    """Per node count, run and repeat: seconds per update over the measured window (the
    slowest worker's), for flat and hierarchical local SGD; ``out``.csv."""
    from localsgd.paper.experiments import timing_validation as validation

    g = HIERARCHY
    rows, commands = [], []
    for nodes in g["nodes"]:
        entries = []
        for r in range(g["repeats"]):
            none = {"straggler_seconds": 0.0, "straggler_rate": 0.0, "straggler_ranks": []}
            entries += [{"name": f"flat_r{r}", "seed": r, "local_steps": g["H"], **none},
                        {"name": f"hier_r{r}", "seed": r, "local_steps": g["H"],
                         "block_size": g["procs_per_node"], "block_steps": g["Hb"], **none}]
        with tempfile.TemporaryDirectory() as tmp:
            info = validation.launch(entries, nodes * g["procs_per_node"], Path(tmp),
                                     steps=g["steps"], compute_ms=g["compute_ms"],
                                     straggler_seconds=0.0, straggler_rate=0.0,
                                     cluster_rate_mbit=rate_mbit,
                                     procs_per_node=g["procs_per_node"])
            commands.append(info["command"])
            for e in entries:
                m = validation.measure(Path(tmp) / "runs" / e["name"], info["warm"])
                rows.append({"nodes": nodes, "processes": nodes * g["procs_per_node"],
                             "run": e["name"].split("_r")[0], "repeat": e["seed"],
                             "seconds_per_update": m["seconds"] / m["steps"],
                             "link_mbit": sum(info["measured_rate_mbit"].values()) / 2})
    pd.DataFrame(rows).to_csv(out, index=False)
    return {"grid": g, "commands": commands}


# SlowMo's overview: approximate parameter averaging (SlowMo over local SGD, localsgd_frequency
# 3, a slow momentum step every 48) against DDP's exact gradient all-reduce, 2 nodes x 2 over
# 100 Mbit/s, random stragglers (0.3 s at 2 % per worker and update, as timing_validation's),
# 3 interleaved repeats
APPROX = {"nodes": 2, "procs_per_node": 2, "steps": 100, "compute_ms": 50.0,
          "localsgd_frequency": 3, "slowmo_frequency": 48, "straggler_seconds": 0.3,
          "straggler_rate": 0.02, "repeats": 3}


def measure_approx(rate_mbit: float, out: Path) -> dict:
    """Per run, repeat and rank: mean seconds per update waiting and communicating, and per
    update in all, over the measured window, for DDP and SlowMo over local SGD; ``out``.csv."""
    from localsgd.paper.experiments import timing_validation as validation

    g = APPROX
    entries = []
    for r in range(g["repeats"]):
        entries += [{"name": f"ddp_r{r}", "seed": r, **validation.SYNC_RUN},
                    {"name": f"slowmo_r{r}", "seed": r, "local_steps": g["localsgd_frequency"],
                     "slowmo_frequency": g["slowmo_frequency"], "slowmo_momentum": 0.5}]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        info = validation.launch(entries, g["nodes"] * g["procs_per_node"], Path(tmp),
                                 steps=g["steps"], compute_ms=g["compute_ms"],
                                 straggler_seconds=g["straggler_seconds"],
                                 straggler_rate=g["straggler_rate"], cluster_rate_mbit=rate_mbit,
                                 procs_per_node=g["procs_per_node"])
        for e in entries:
            for rank, part in _window(Path(tmp), e["name"], info["warm"]).groupby("rank"):
                rows.append({"run": e["name"].split("_r")[0], "repeat": e["seed"],
                             "rank": int(rank), "wait_s": part.wait_s.mean(),
                             "comm_s": part.comm_s.mean(), "step_s": part.wall_s.mean(),
                             "stall_s": part.stall_s.mean(), "steps": len(part),
                             "link_mbit": sum(info["measured_rate_mbit"].values()) / 2})
    pd.DataFrame(rows).to_csv(out, index=False)
    return {"grid": g, "command": info["command"], "warm": info["warm"]}


def measure_timing(rate_mbit: float, out: Path, workers: list[int] | None = None) -> dict:
    """timing_validation's grid on the emulated cluster: ``out``.rows.csv (one row per run)
    and ``out``.launches.csv (per launch: calibration, link, command)."""
    from localsgd.paper.experiments import timing_validation as validation

    kw = {**TIMING, **({"workers": workers} if workers else {})}
    with tempfile.TemporaryDirectory() as tmp:
        rows, launches = validation.validate(kw.pop("workers"), Path(tmp), **kw,
                                             cluster_rate_mbit=rate_mbit)
    rows.to_csv(out.with_suffix(".rows.csv"), index=False)
    launches.to_csv(out.with_suffix(".launches.csv"), index=False)
    return {"grid": {k: v for k, v in TIMING.items()}, "rows": len(rows)}


def measure(layouts: list[tuple[int, int]], rate_mbit: float, mb: float, repeats: int,
            say=print) -> tuple[pd.DataFrame, dict]:
    """One row per layout and repeat: nodes, procs_per_node, processes, repeat, seconds,
    asked and measured Mbit/s (the probe's mean of both ways; NaN on one node)."""
    rows, runs = [], []
    worker = ["-m", "localsgd.paper.bench.allreduce_worker", "--mb", str(mb), "--repeats",
              str(repeats)]
    with tempfile.TemporaryDirectory() as tmp:
        for nodes, per in layouts:
            out = Path(tmp) / f"{nodes}x{per}.json"
            rec = netcluster.run_job(nodes, per, rate_mbit, [*worker, "--out", str(out)],
                                     probe_mb=8.0, timeout=1800, say=say)
            got = json.loads(out.read_text())
            rates = list(rec.get("measured_rate_mbit", {}).values())
            measured = sum(rates) / len(rates) if rates else float("nan")
            for i, s in enumerate(got["seconds"]):
                rows.append({"nodes": nodes, "procs_per_node": per, "processes": nodes * per,
                             "repeat": i, "seconds": s, "asked_rate_mbit": rate_mbit,
                             "measured_rate_mbit": measured, "mb": mb})
            runs.append({k: rec.get(k) for k in ("nodes", "procs_per_node", "measured_rate_mbit",
                                                  "seconds", "left_behind")})
            say(f"{nodes} x {per}: " + ", ".join(f"{s:.2f}" for s in got["seconds"]) + " s")
    return pd.DataFrame(rows), {"jobs": runs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="localsgd bench cluster", description=__doc__.split("\n")[0])
    p.add_argument("--figure", choices=("fig01", "timing", "stragglers", "hierarchy",
                                                  "approx"), default="fig01")
    p.add_argument("--workers", type=int, nargs="+", default=None,
                   help="timing: the world sizes (default 8 16)")
    p.add_argument("--layouts", default=LAYOUTS, help=f"nodes x processes (default {LAYOUTS})")
    p.add_argument("--rate-mbit", type=float, default=100.0)
    p.add_argument("--mb", type=float, default=100.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None,
                   help="default figures/cluster/fig01_allreduce.csv, or for timing "
                        "figures/cluster/timing_validation (.rows.csv, .launches.csv)")
    args = p.parse_args(argv)
    if args.out is None:
        args.out = Path("figures/cluster") / {"fig01": "fig01_allreduce.csv",
                                              "timing": "timing_validation",
                                              "stragglers": "blog_stragglers.csv",
                                              "hierarchy": "sec43_hierarchy.csv",
                                              "approx": "slowmo_approx.csv"}[args.figure]
    try:
        layouts = [tuple(int(v) for v in s.split("x")) for s in args.layouts.split(",")]
        if any(len(t) != 2 for t in layouts):
            raise ValueError
    except ValueError:
        print(f"error: --layouts {args.layouts!r}: comma-separated NODESxPROCS, e.g. 2x1,4x2",
              file=sys.stderr)
        return 2
    start = datetime.datetime.now(datetime.UTC)
    try:
        netcluster.require_net_admin()
        load0 = os.getloadavg()[0]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if args.figure == "timing":
            prov = measure_timing(args.rate_mbit, args.out, args.workers)
        elif args.figure == "stragglers":
            prov = measure_stragglers(args.rate_mbit, args.out)
        elif args.figure == "hierarchy":
            prov = measure_hierarchy(args.rate_mbit, args.out)
        elif args.figure == "approx":
            prov = measure_approx(args.rate_mbit, args.out)
        else:
            frame, prov = measure(layouts, args.rate_mbit, args.mb, args.repeats)
            frame.to_csv(args.out, index=False)
    except (netcluster.ClusterError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    prov.update({"command": "localsgd bench cluster " + " ".join(
                     sys.argv[1:] if argv is None else argv),
                 "started_utc": start.isoformat(timespec="seconds"),
                 "load_avg_1min_before": load0, "machine": machine(),
                 "delay": "none emulated (no netem in this kernel)"})
    args.out.with_suffix(".json").write_text(json.dumps(prov, indent=1, default=str) + "\n")
    print(f"wrote {args.out} and its .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
