"""Dynamo + DDP ("TorchDynamo Update 9: Making DDP Work with TorchDynamo", PyTorch dev-discuss):
the benchmark's tables for the notebook and the post's claims as compare rows
(`summary_claims`). The benchmark itself is `localsgd.paper.bench.ddp`.

The post (TL;DR and "Results"): without graph splitting compiled DDP was up to 25 % slower than
eager on more than one node, because no bucket's all-reduce could start before the one backward
graph ended; with DDPOptimizer it is "never more than 1 % slower" and up to 15 % faster (64
A100s). Here each claim is judged per configuration (model, processes) on the per-round values
of the interleaved windows (`localsgd.paper.bench.ddp`'s ``--rounds``): the rounds are the repeated
measurements whose spread the verdict rule of `localsgd.paper.experiments.claims` needs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from localsgd.paper.experiments import claims

__all__ = ["MODES", "PALETTE", "SUMMARY_COLUMNS", "bucket_timeline", "check_runnable",
           "label_configs", "mechanism_verdict", "optimizer_verdict", "per_round",
           "step_split", "summary_claims"]

PALETTE = {"eager": "C0", "ddp_optimizer": "C2", "no_optimization": "C3"}
MODES = tuple(PALETTE)  # eager first: the reference every ratio is taken against
SUMMARY_COLUMNS = ["config", "mode", "graphs", "compile_s", "step_ms", "forward_ms",
                   "backward_compute_ms", "exposed_comm_ms", "optimizer_ms", "first_allreduce_at",
                   "speed_vs_eager", "speed_lo", "speed_hi", "loss_max_rel_diff"]
# the timing split of panel (b): column -> label
SPLIT = {"forward_ms": "forward", "backward_compute_ms": "backward compute",
         "exposed_comm_ms": "exposed communication", "optimizer_ms": "optimizer"}
_KEYS = ["model", "world"]


def check_runnable(*, mode: str, device: str, process_group: str, ddp_models: Sequence[str],
                   batches: Sequence[int], world_sizes: Sequence[int]) -> None:
    """Stop with what to run instead when the parameters ask for the source's GPUs (paper
    mode: torchbench models on 8 and 64 A100s over NCCL); `localsgd.paper.bench.ddp` runs gloo CPU
    processes only. Also one batch size per model."""
    if mode == "paper" or device != "cpu" or process_group != "gloo":
        raise RuntimeError(
            "paper mode is the source's configuration: torchbench's " + ", ".join(ddp_models)
            + f" (batches {list(batches)}) on {' and '.join(map(str, world_sizes))} A100 GPUs "
            "(8 per node, NCCL over EFA), 25 MB buckets, TorchInductor. It needs those GPUs and "
            "torchbench; localsgd.bench_ddp runs gloo CPU processes only. Run mode = 'quick' or "
            "'smoke' here.")
    if len(batches) != len(ddp_models):
        raise RuntimeError(f"batches = {list(batches)}: give one batch size per model in "
                           "ddp_models")


def _label(model: pd.Series, mib: pd.Series, world: pd.Series) -> pd.Series:
    return (model + " (" + mib.round(0).astype(int).astype(str) + " MiB), "
            + world.astype(str) + " proc")


def label_configs(summary: pd.DataFrame) -> pd.DataFrame:
    """The benchmark summary with a ``config`` label: "<model> (<MiB> MiB), <world> proc"."""
    return summary.assign(config=_label(summary.model, summary.model_mib, summary.world))


def per_round(steps: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, world, mode, round) of the timed steps: the round's median step time
    (each step: mean over ranks), its ratio to eager's in the same round (``speed_vs_eager``,
    > 1: faster; the ratio `localsgd.paper.bench.ddp.summarize` gives as ``speed_lo``/``speed_hi``)
    and the round's median ``first_allreduce_at``."""
    timed = steps[~steps.warmup.astype(bool)]
    step = timed.groupby([*_KEYS, "mode", "round", "step"])[["step_ms", "first_allreduce_at"]] \
        .mean()
    rnd = step.groupby(level=[*_KEYS, "mode", "round"]).median().reset_index()
    eager = rnd[rnd["mode"] == "eager"].set_index([*_KEYS, "round"]).step_ms
    idx = pd.MultiIndex.from_frame(rnd[[*_KEYS, "round"]])
    rnd["speed_vs_eager"] = eager.reindex(idx).to_numpy() / rnd.step_ms.to_numpy()
    return rnd


def _configs(summary: pd.DataFrame, mode: str) -> pd.DataFrame:
    return summary[summary["mode"] == mode].sort_values(["model_mib", "world"])


def _rounds(rounds: pd.DataFrame, r, mode: str, column: str) -> list[float]:
    part = rounds[(rounds.model == r.model) & (rounds.world == r.world)
                  & (rounds["mode"] == mode)]
    return [float(v) for v in part[column]]


def _by_round(v: claims.Verdict) -> claims.Verdict:
    """The verdict with its reason counting rounds, not seeds (the rounds are the repeats)."""
    return dataclasses.replace(v, reason=v.reason.replace("seed", "round"))


def _joined(parts: list[tuple[str, claims.Verdict]], extra: str) -> str:
    """A claim judged per configuration: the combined outcome, then each part's verdict."""
    text = "; ".join(f"{name}: {v}" for name, v in parts)
    return f"{claims.combine([v for _, v in parts])}: {text}{extra}"


def optimizer_verdict(summary: pd.DataFrame, rounds: pd.DataFrame,
                      cores: int | None = None) -> str:
    """TL;DR: "with DDPOptimizer compiled DDP is never more than 1 % slower than eager". Per
    configuration the per-round slowdown 100 (1 - eager step / compiled step) against <= 1 %,
    unless its processes fill the machine's ``cores`` (`claims.overlap_premise`: DDPOptimizer
    buys back the overlap, which needs a core free for communication)."""
    opt = _configs(summary, "ddp_optimizer")
    if not len(opt):
        return str(claims.Verdict(claims.NOT_MEASURABLE, math.nan, math.nan, 0,
                                  "ddp_optimizer not run"))
    parts = [(r.config, claims.overlap_premise(int(r.world), cores, what="per-round slowdown")
              or _by_round(claims.verdict(
                  [100 * (1 - s) for s in _rounds(rounds, r, "ddp_optimizer", "speed_vs_eager")],
                  1.0, higher_is_better=False, unit=" %", what="per-round slowdown",
                  origin="the page's: 'never more than 1 % slower'")))
             for r in opt.itertuples()]
    extra = (f" (at reduced scale: DDPOptimizer speed vs eager {opt.speed_vs_eager.min():.2f}x "
             f"to {opt.speed_vs_eager.max():.2f}x, per-round range {opt.speed_lo.min():.2f}-"
             f"{opt.speed_hi.max():.2f}, over {len(opt)} configurations; worst "
             f"{(100 * (1 - opt.speed_vs_eager)).max():+.1f} % slower, best "
             f"{(100 * (opt.speed_vs_eager - 1)).max():+.1f} % faster)")
    return _joined(parts, extra)


# Where backward "ends" is known to about a tenth of it: with 4 processes on 2 cores the rounds'
# own spread of the first all-reduce's start reached 0.09 of backward (quick runs, eager and
# unsplit alike). An unsplit graph's all-reduce starts at its end (1 + a hook's latency), so a
# test of ">= 1" sat on its own prediction and flipped between two runs (1.02 ± 0.025).
BACKWARD_END = 0.9
BACKWARD_END_ORIGIN = ("our tolerance: 'after the backward ends' read as after 90 % of its "
                       "compute, room for timer jitter")


def mechanism_verdict(summary: pd.DataFrame, rounds: pd.DataFrame) -> str:
    """"Results": without graph splitting no all-reduce can start before the backward graph
    ends, so compiled DDP loses eager's overlap. Per configuration two parts on the per-round
    median ``first_allreduce_at`` (start of the first bucket's all-reduce as a fraction of
    backward compute): without DDPOptimizer it starts in the last tenth of backward or later
    (>= `BACKWARD_END`: the end within the measurement's resolution), eager's starts before
    (<= `BACKWARD_END`: overlap). The slowdown (the post's "up to 25 %", on more than one node)
    is reported beside it, not judged: one CPU is not 8 nodes."""
    raw = _configs(summary, "no_optimization")
    if not len(raw):
        return str(claims.Verdict(claims.NOT_MEASURABLE, math.nan, math.nan, 0,
                                  "no_optimization not run"))
    parts = []
    for r in raw.itertuples():
        parts.append((f"{r.config} without DDPOptimizer", _by_round(claims.verdict(
            _rounds(rounds, r, "no_optimization", "first_allreduce_at"), BACKWARD_END,
            what="first all-reduce at (fraction of backward compute)",
            origin=BACKWARD_END_ORIGIN))))
        parts.append((f"{r.config} eager", _by_round(claims.verdict(
            _rounds(rounds, r, "eager", "first_allreduce_at"), BACKWARD_END,
            higher_is_better=False,
            what="first all-reduce at (fraction of backward compute)",
            origin=BACKWARD_END_ORIGIN))))
    eager = summary[summary["mode"] == "eager"].set_index("config")
    exposed = (raw.set_index("config").exposed_comm_ms / eager.exposed_comm_ms).dropna()
    extra = (f" (mechanism, at reduced scale: without graph splitting the first all-reduce "
             f"starts only at {100 * raw.first_allreduce_at.min():.0f} % of backward compute or "
             f"later (eager: by {100 * eager.first_allreduce_at.max():.0f} %), communication "
             f"not hidden behind backward {exposed.min():.2f}x to {exposed.max():.2f}x eager's; "
             f"speed vs eager {raw.speed_vs_eager.min():.2f}x to "
             f"{raw.speed_vs_eager.max():.2f}x (worst "
             f"{(100 * (1 - raw.speed_vs_eager)).max():+.1f} % slower; source: up to 25 % on "
             "> 1 node))")
    return _joined(parts, extra)


def _worst(summary: pd.DataFrame, mode: str, sign: float) -> float:
    """Largest 100 * sign * (1 - speed) over the configurations of ``mode`` (NaN if none)."""
    d = summary[summary["mode"] == mode]
    return float((100 * sign * (1 - d.speed_vs_eager)).max()) if len(d) else math.nan


def summary_claims(summary: pd.DataFrame, steps: pd.DataFrame, *, mode: str,
                   world_sizes: Sequence[int], ddp_models: Sequence[str], compile_backend: str,
                   bucket_cap_mb: float, cores: int | None = None) -> list[dict]:
    """The post's "Summary" rows (keys of ``papers/dynamo_ddp_update/reported.csv``): the first
    all-reduce's start without DDPOptimizer (claim: the lost overlap, `mechanism_verdict`), max
    slowdown with it (claim: <= 1 %, `optimizer_verdict`), with TorchInductor the max speed-up
    (the post's "up to 15 %" on 64 GPUs: a value, no claim at this scale), and the max slowdown
    without DDPOptimizer (the post's 25 %: a value beside the source, not judged). ``summary``:
    `label_configs` of the benchmark's summary; ``steps``: its per-step rows; ``cores``: the
    machine's (`optimizer_verdict`)."""
    note = (f"{mode}: {'/'.join(map(str, world_sizes))} gloo CPU processes, 1 thread each, "
            f"models {', '.join(ddp_models)}, {compile_backend}, {bucket_cap_mb:g} MiB buckets; "
            "speed = eager median step / compiled median step over interleaved rounds; "
            "slowdown % = 100 (1 - speed) (throughput lost, the source's arithmetic for its "
            "25 %), speed-up % = 100 (speed - 1)")
    rounds = per_round(steps)
    raw = rounds[rounds["mode"] == "no_optimization"]
    earliest = (raw.groupby(_KEYS).first_allreduce_at.mean().min() if len(raw) else None)
    rows = [
        claims.claim_row(
            "Summary", "DDP + dynamo without DDPOptimizer vs DDP eager", "first all-reduce at",
            earliest, unit="x backward compute", note=note + "; value: the earliest "
            "configuration's mean over rounds of the first bucket's all-reduce start",
            claim="without graph splitting no all-reduce can start before backward ends, so "
                  "compiled DDP loses the overlap: up to 25 % slower than eager (more than one "
                  "node)", verdict=mechanism_verdict(summary, rounds)),
        claims.claim_row(
            "Summary", "DDP + dynamo + DDPOptimizer vs DDP eager", "max slowdown",
            _worst(summary, "ddp_optimizer", 1.0), unit="%", note=note,
            claim="with DDPOptimizer compiled DDP is never more than 1 % slower than eager",
            verdict=optimizer_verdict(summary, rounds, cores)),
    ]
    if compile_backend == "inductor":
        rows.append(claims.claim_row(
            "Summary", "DDP + dynamo + DDPOptimizer vs DDP eager; GPUs=64; backend=inductor",
            "max speed-up", _worst(summary, "ddp_optimizer", -1.0), unit="%",
            note=note + "; not 64 GPUs: the source's key, our reduced setting"))
    # the post's 25 % is a multi-node number: on one shared CPU the slowdown is noise around
    # whatever the processes' contention gives, so it is shown beside the source, never judged
    rows.append(claims.claim_row(
        "Summary", "DDP + dynamo without DDPOptimizer vs DDP eager", "max slowdown",
        _worst(summary, "no_optimization", 1.0), unit="%",
        note=note + "; not judged: one shared CPU is not 8 nodes (the claim is judged on the "
                    "mechanism, the first all-reduce's start)"))
    return rows


def step_split(summary: pd.DataFrame) -> pd.DataFrame:
    """Panel (b)'s table: per (config, mode), configs by size then processes, each part of the
    step (`SPLIT`) as a share of eager's median step; index "<config> | <mode>"."""
    configs = list(dict.fromkeys(summary.sort_values(["model_mib", "world"]).config))
    rows = {}
    for c in configs:
        for m in MODES:
            r = summary[(summary.config == c) & (summary["mode"] == m)]
            if len(r):
                rows[f"{c} | {m}"] = {col: r.iloc[0][col] / r.iloc[0]["eager_step_ms"]
                                      for col in SPLIT}
    return pd.DataFrame.from_dict(rows, orient="index", columns=list(SPLIT))


def bucket_timeline(summary: pd.DataFrame, events: pd.DataFrame, modes: Sequence[str]
                    ) -> tuple[pd.Series, pd.DataFrame]:
    """Panel (c)'s data: the largest model at the fewest processes (its summary row) and rank
    0's bucket all-reduces of one timed step per mode, each with ``row`` (the mode's index in
    ``modes``) and ``y`` (buckets spread over row +- 0.4)."""
    big = summary.sort_values(["model_mib", "world"], ascending=[False, True]).iloc[0]
    ev = events[(events.model == big.model) & (events.world == big.world)
                & (events["rank"] == 0)]
    out = []
    for i, m in enumerate(modes):
        e = ev[ev["mode"] == m].sort_values("ready_ms")
        out.append(e.assign(y=i + 0.8 * np.arange(len(e)) / max(len(e), 1) - 0.4, row=i))
    return big, pd.concat(out, ignore_index=True) if out else ev
