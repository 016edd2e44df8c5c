"""Benchmark: the SlowMo page's break-even rule against steps measured here (gloo, CPU).

`breakeven_benchmark` starts ``world_size`` gloo processes (`localsgd.distributed.spawn`) and
times, per model, a backward pass, an all-reduce of the model's bytes, a DDP step and a local SGD
step; `localsgd.paper.experiments.slowmo` holds the quality grid it is set beside.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from localsgd.distributed import spawn
from localsgd.models import BagOfTokens, build_model, wide_mlp
from localsgd.paper import dry_run

__all__ = ["BENCH_MODELS", "bench_model", "breakeven_benchmark"]

BENCH_MODELS = ("resnet20", "mlp", "embedding")


def bench_model(spec: dict) -> nn.Module:
    """The model of one spec: ``{"model": "resnet20" | "mlp" | "embedding", "width", ...}``."""
    if spec["model"] == "mlp":
        return wide_mlp(int(spec["width"]))
    if spec["model"] == "embedding":
        torch.manual_seed(0)
        return BagOfTokens(int(spec["width"]))
    return build_model(spec["model"], width=float(spec.get("width", 1.0)))


def _worker(rank: int, world: int, specs: list[dict], frequency: int, repeats: int
            ) -> list[dict]:
    """One gloo process of `breakeven_benchmark` (`localsgd.distributed.spawn`: one thread, the
    process group is up): times every phase with barriers around it; the rows (max over ranks
    of the per-rank medians)."""
    rows = []
    for spec in specs:
        torch.manual_seed(0)
        model = bench_model(spec)
        local = bench_model(spec)
        local.load_state_dict(model.state_dict())
        ddp = DDP(model)
        opt_ddp = torch.optim.SGD(ddp.parameters(), lr=0.01)
        opt_loc = torch.optim.SGD(local.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(rank)
        x = torch.randn(int(spec["batch"]), 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (int(spec["batch"]),), generator=g)
        loss_fn = nn.CrossEntropyLoss()
        params = [p for p in local.parameters()]
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        t = {k: [] for k in ("fwd", "bwd", "allreduce", "ddp_step", "local_step")}
        for rep in range(repeats + 1):  # the first repeat warms up (allocations, DDP buckets)
            dist.barrier()
            t0 = time.perf_counter()
            loss = loss_fn(local(x), y)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            opt_loc.zero_grad(set_to_none=True)
            dist.barrier()
            t3 = time.perf_counter()
            dist.all_reduce(flat)  # the model's bytes, one flat buffer
            t4 = time.perf_counter()
            dist.barrier()
            t5 = time.perf_counter()  # synchronous SGD: DDP overlaps bucketed all-reduce + bwd
            loss_fn(ddp(x), y).backward()
            opt_ddp.step()
            opt_ddp.zero_grad(set_to_none=True)
            t6 = time.perf_counter()
            dist.barrier()
            t7 = time.perf_counter()  # local SGD: f local updates, then average the parameters
            for _ in range(frequency):
                loss_fn(local(x), y).backward()
                opt_loc.step()
                opt_loc.zero_grad(set_to_none=True)
            with torch.no_grad():
                vec = torch.cat([p.reshape(-1) for p in params])
                dist.all_reduce(vec)
                vec /= world
                torch.nn.utils.vector_to_parameters(vec, params)
            t8 = time.perf_counter()
            if rep:
                for k, v in (("fwd", t1 - t0), ("bwd", t2 - t1), ("allreduce", t4 - t3),
                             ("ddp_step", t6 - t5), ("local_step", (t8 - t7) / frequency)):
                    t[k].append(v)
        med = {f"{k}_s": statistics.median(v) for k, v in t.items()}
        # the slowest rank decides a synchronous step: take the max of the medians over ranks
        vals = torch.tensor([med[k] for k in sorted(med)], dtype=torch.float64)
        dist.all_reduce(vals, op=dist.ReduceOp.MAX)
        med = dict(zip(sorted(med), vals.tolist(), strict=True))
        rows.append({**spec, "param_bytes": int(flat.numel() * flat.element_size()), **med})
    return rows


def breakeven_benchmark(specs: Sequence[dict], *, world_size: int = 2, frequency: int = 3,
                        repeats: int = 8) -> pd.DataFrame:
    """Check the SlowMo page's break-even rule against steps measured here (gloo, CPU).

    The page (fairscale's SlowMo documentation, "Best practices"): SlowMo over local SGD pays when
    ``t_allreduce · (1 − 1/localsgd_frequency) > t_backward``, from DDP's step being bound by
    max(t_backward, t_allreduce) (overlapped) and local SGD's by t_backward + t_allreduce/f
    (not overlapped). ``specs`` are dicts ``{"model": "resnet20"|"mlp"|"embedding", "width", "batch"}``
    (the MLP moves many bytes for moderate compute; "embedding" — a bag-of-tokens embedding
    table of ``width`` rows × 256 — many bytes for almost no compute). ``world_size`` processes
    each time, with barriers around every phase and medians over ``repeats``: a backward pass,
    an all-reduce of the model's bytes, a DDP step (gradient all-reduce overlapped with
    backward) and a local SGD step (f updates + one parameter all-reduce, per update). Returns
    one row per spec with the rule's prediction and the measured answer (``local_pays``: local
    step < DDP step), and the rule's own step models (``ddp_rule_model_s`` = fwd + max(bwd,
    all-reduce), ``local_rule_model_s`` = fwd + bwd + all-reduce/f) to set beside the measured
    steps.
    """
    if world_size < 2:
        raise ValueError(f"world_size={world_size}: the rule needs >= 2 processes to all-reduce")
    for spec in specs:
        if spec.get("model") not in BENCH_MODELS or int(spec.get("batch", 0)) < 1:
            raise ValueError(f"spec {spec}: need model in {BENCH_MODELS}, width and batch >= 1")
    if (n := dry_run.updates()) is not None:  # a dry run checks that it runs, not its timings
        repeats = min(repeats, n)
    df = pd.DataFrame(spawn(_worker, world_size, list(specs), frequency, repeats)[0])
    df["world_size"], df["frequency"] = world_size, frequency
    df["rule_lhs_s"] = df.allreduce_s * (1 - 1 / frequency)
    df["rule_predicts_pays"] = df.rule_lhs_s > df.bwd_s
    df["local_pays"] = df.local_step_s < df.ddp_step_s
    df["rule_right"] = df.rule_predicts_pays == df.local_pays
    df["speedup_local"] = df.ddp_step_s / df.local_step_s
    # the rule's own step models (optimizer step left out, as the page does): how far off here
    df["ddp_rule_model_s"] = df.fwd_s + np.maximum(df.bwd_s, df.allreduce_s)
    df["local_rule_model_s"] = df.fwd_s + df.bwd_s + df.allreduce_s / frequency
    return df
