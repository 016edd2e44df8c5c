"""Benchmark: per-step time of eager DDP vs ``torch.compile``'d DDP, with and without DDPOptimizer.

Source: "TorchDynamo Update 9: Making DDP Work with TorchDynamo" (PyTorch dev-discuss;
numbers in ``papers/dynamo_ddp_update/reported.csv``). Eager DDP starts
each gradient bucket's all-reduce as soon as the bucket is ready, overlapping communication with
the rest of backward (section "Background"). A Dynamo graph without breaks produces all gradients
at the end of one compiled backward, so no all-reduce can start before backward ends; DDPOptimizer
(``torch._dynamo.config.optimize_ddp = "ddp_optimizer"``) splits the graph at bucket-sized
parameter boundaries so each piece's backward releases its bucket. The post reports compiled DDP
up to 25 % slower than eager without the splitting, and with it "never more than 1 % slower" and
"up to 15 % faster" (64 A100s, 8 nodes, NCCL over EFA, TorchInductor).

``localsgd bench ddp --world 2 4 --models ffn_s ffn_m --json`` starts ``max(world)`` gloo CPU
processes (`localsgd.distributed.spawn`, one thread each); for every world size the first
``world`` of them form a process group (the others wait) and build one DDP model per mode from the
same seed:

* ``eager``: DDP as is;
* ``ddp_optimizer``: ``torch.compile(ddp)`` with graph splitting at bucket boundaries;
* ``no_optimization``: ``torch.compile(ddp)`` as one graph (the post's "without DDPOptimizer").

(``python_reducer`` is refused: it replaces DDP's bucketed C++ reducer, and with it the comm hook
that timestamps the buckets, by compiled autograd.) Each mode first runs ``--warmup`` untimed
steps (the first one compiles; its time is reported as ``compile_s``), then the modes take turns
in ``--rounds`` windows of ``--steps`` steps, the order rotated every round, so all modes share
the machine's noise. A barrier starts every window. Reported per (model, world, mode): medians
over the timed steps (each step's time is the mean over ranks) and ratios to eager.

The timing split (per step, per rank, from `time.perf_counter`):
``forward`` (call to loss), ``backward compute`` (loss to the end of the last autograd node that
computes, found by a post-hook on every node of the step's graph except the AccumulateGrad
leaves; a compiled graph's whole backward is one such node), ``exposed communication`` (from
then until ``loss.backward()`` returns: DDP copying the last gradients into buckets, all-reduce
not hidden behind backward compute, and waiting for slower ranks), ``optimizer``.
``first_allreduce_at`` = when the first bucket's all-reduce starts, as a fraction of backward
compute: < 1 means communication started while backward was still computing (overlap); >= 1 means
it could only start after (the post's "without graph breaks DDP cannot overlap"). The hook is DDP's default (average by all-reduce), in
Python so it can record when each bucket is launched and finished; every mode runs the same hook.

The model is a stack of residual feed-forward blocks (``x + W2 relu(W1 x)``, hidden 2x width, a
transformer's MLP half; the post's models are mostly transformers) on random inputs and labels:
a speed benchmark. Compiled losses are compared step by step with eager's (same seed, same
batches): ``loss_max_rel_diff``. Inductor's on-disk cache is a fresh temporary folder per call
(removed afterwards), so nothing compiled by an earlier run is reused; world sizes after the first
may reuse graphs the same call compiled (their ``compile_s`` says so by being small).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field

import pandas as pd
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from localsgd.distributed import spawn
from localsgd.models import FFNStack
from localsgd.paper import profile
from localsgd.paper.bench.common import machine

__all__ = ["MODELS", "MODES", "SOURCE_MODELS", "BenchConfig", "BenchResult", "main", "run"]

MODES = ("eager", "ddp_optimizer", "no_optimization")
COMPILED = ("ddp_optimizer", "no_optimization")
# name -> (width, residual blocks): 4 * width^2 + 3 * width floats per block (4 MiB at 512).
# One width: the sizes share their generated kernels, so inductor compiles them once.
MODELS = {"ffn_s": (512, 1), "ffn_m": (512, 4), "ffn_l": (512, 8)}
# the source's six torchbench models ("Benchmark configuration"): paper mode only, needs GPUs
SOURCE_MODELS = ("resnet50", "hf_T5", "hf_T5_large", "timm_vision_transformer_large",
                 "hf_GPT2_large", "hf_Bert")
REFUSED = {
    "python_reducer": "python_reducer replaces DDP's bucketed C++ reducer (and its comm hooks) by "
                      "compiled autograd, so the per-bucket timestamps this benchmark splits "
                      "backward with do not exist there",
    "python_reducer_without_compiled_forward": "same as python_reducer (compiled autograd "
                                               "instead of DDP's C++ reducer)",
}
CLASSES = 10


def build_model(name: str) -> FFNStack:
    if name not in MODELS:
        raise ValueError(f"model {name!r} is not known; choose from {', '.join(MODELS)} "
                         "(the source's torchbench models need GPUs and torchbench)")
    width, blocks = MODELS[name]
    return FFNStack(width, blocks)


def model_mib(name: str) -> float:
    """MiB of float32 parameters (what DDP all-reduces per step)."""
    width, blocks = MODELS[name]
    n = blocks * (4 * width * width + 3 * width) + width * CLASSES + CLASSES
    return n * 4 / 2**20


@dataclass
class BenchConfig:
    """One benchmark call. Validated by `check` (every bad value raises ValueError)."""

    models: list[str] = field(default_factory=lambda: ["ffn_s", "ffn_m"])
    world_sizes: list[int] = field(default_factory=lambda: [2])
    modes: list[str] = field(default_factory=lambda: list(MODES))
    batch: int | list[int] = 32  # per process; a list gives one per model
    steps: int = 5  # timed steps per window
    rounds: int = 3  # windows per mode (interleaved)
    warmup: int = 2  # untimed steps per mode first (the first compiles)
    bucket_cap_mb: float = 1.0  # DDP's bucket size; DDPOptimizer splits at the same size
    compile_backend: str = "inductor"
    lr: float = 0.05
    seed: int = 0
    threads: int = 1  # torch threads per process

    def batches(self) -> list[int]:
        """The batch size per process of each model."""
        if isinstance(self.batch, (list, tuple)):
            return [int(b) for b in self.batch]
        return [int(self.batch)] * len(self.models)

    def check(self) -> None:
        # torch._dynamo: a heavy import (seconds), paid only when a benchmark is configured
        from torch._dynamo.backends.registry import list_backends

        bad_modes = [m for m in self.modes if m not in MODES]
        for m in bad_modes:
            if m in REFUSED:
                raise ValueError(f"mode {m!r} is not benchmarked: {REFUSED[m]}; use "
                                 f"{', '.join(MODES)}")
        if bad_modes or not self.modes:
            raise ValueError(f"modes {self.modes!r}: each must be one of {', '.join(MODES)}")
        if len(set(self.modes)) != len(self.modes):
            raise ValueError(f"modes {self.modes!r} repeat a mode")
        if not self.models:
            raise ValueError(f"models: give at least one of {', '.join(MODELS)}")
        unknown = [m for m in self.models if m not in MODELS]
        if unknown:
            raise ValueError(f"models {unknown} are not known; choose from {', '.join(MODELS)} "
                             "(the source's torchbench models need GPUs and torchbench)")
        for name in ("steps", "rounds", "threads"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if isinstance(self.batch, (list, tuple)) and len(self.batch) != len(self.models):
            raise ValueError(f"batch={self.batch}: give one batch size per model "
                             f"({len(self.models)}) or a single number")
        if any(int(b) < 1 for b in self.batches()):
            raise ValueError(f"batch={self.batch}: must be >= 1")
        if self.warmup < 1 and any(m in COMPILED for m in self.modes):
            raise ValueError(f"warmup={self.warmup}: compiled modes need >= 1 warm-up step (the "
                             "first step compiles and must not be timed)")
        if not self.world_sizes or any(int(w) < 2 for w in self.world_sizes):
            raise ValueError(f"world_sizes={self.world_sizes}: each must be >= 2 (DDP "
                             "all-reduces between processes)")
        if self.bucket_cap_mb < 1.0:
            # DDPOptimizer asserts its first bucket (DDP's 1 MiB default) <= the bucket cap
            raise ValueError(f"bucket_cap_mb={self.bucket_cap_mb}: must be >= 1 (DDPOptimizer "
                             "needs buckets at least as large as DDP's 1 MiB first bucket)")
        backends = set(list_backends(exclude_tags=())) | {"inductor", "aot_eager", "eager"}
        if self.compile_backend not in backends:
            raise ValueError(f"compile_backend={self.compile_backend!r}; use inductor (code "
                             "generation) or aot_eager (traces, no code generation)")


class _BucketLog:
    """State of the timestamping comm hook: per bucket (index, bytes, ready, done)."""

    def __init__(self, world: int, group=None):
        self.world, self.group = world, group
        self.events: list[list] = []


def _timed_allreduce_hook(state, bucket):  # DDP compares annotations: leave them out
    """DDP's default gradient averaging (all-reduce of the bucket / world size), timestamped."""
    buf = bucket.buffer()
    rec = [bucket.index(), buf.numel() * buf.element_size(), time.perf_counter(), None]
    state.events.append(rec)
    buf.div_(state.world)
    fut = dist.all_reduce(buf, group=state.group, async_op=True).get_future()

    def done(f):
        rec[3] = time.perf_counter()
        return f.value()[0]

    return fut.then(done)


class _Runner:
    """One mode's DDP model, optimizer and compiled forward in this process."""

    def __init__(self, mode: str, model_name: str, cfg: BenchConfig, world: int, group=None):
        from torch._dynamo.backends.registry import lookup_backend  # heavy: see check()

        self.mode = mode
        torch.manual_seed(cfg.seed)  # every mode and rank starts from the same weights
        self.model = build_model(model_name)
        self.ddp = DistributedDataParallel(self.model, bucket_cap_mb=cfg.bucket_cap_mb,
                                           process_group=group)
        self.log = _BucketLog(world, group)
        self.ddp.register_comm_hook(self.log, _timed_allreduce_hook)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=cfg.lr, momentum=0.9)
        self.graphs: list[int] = []  # nodes per compiled (sub)graph
        self.forward = self.ddp
        if mode in COMPILED:
            inner = lookup_backend(cfg.compile_backend)

            def counting_backend(gm, example_inputs):
                self.graphs.append(len(gm.graph.nodes))
                return inner(gm, example_inputs)

            self.forward = torch.compile(self.ddp, backend=counting_backend)
        self.steps_done = 0

    def step(self, batches) -> dict:
        x, y = batches[self.steps_done % len(batches)]
        self.log.events.clear()
        # optimize_ddp is read when Dynamo compiles a frame; patch it around every call so a
        # recompile (and the first compile) sees this runner's mode
        ctx = (torch._dynamo.config.patch(optimize_ddp=self.mode) if self.mode in COMPILED
               else contextlib.nullcontext())
        with ctx:
            t0 = time.perf_counter()
            self.opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(self.forward(x), y)
            tw = time.perf_counter()
            computed: list[float] = []  # when each backward compute node finished
            for node in _compute_nodes(loss.grad_fn):
                node.register_hook(lambda gi, go: computed.append(time.perf_counter()))
            t1 = time.perf_counter()
            walk = t1 - tw  # bookkeeping of this benchmark, taken out of the step time
            loss.backward()
            t2 = time.perf_counter()
            self.opt.step()
            t3 = time.perf_counter()
        self.steps_done += 1
        ev = self.log.events
        first_ready = min(e[2] for e in ev)
        last_done = max(e[3] for e in ev)
        compute_end = max(computed)
        backward = compute_end - t1
        return {
            "step": self.steps_done, "loss": float(loss.detach()),
            "step_ms": 1e3 * (t3 - t0 - walk), "forward_ms": 1e3 * (tw - t0),
            "backward_compute_ms": 1e3 * (compute_end - t1),
            "exposed_comm_ms": 1e3 * (t2 - compute_end), "optimizer_ms": 1e3 * (t3 - t2),
            "comm_window_ms": 1e3 * (last_done - first_ready),
            "first_allreduce_at": (first_ready - t1) / backward if backward > 0 else 1.0,
            "buckets": len(ev), "bucket_mib": sum(e[1] for e in ev) / 2**20,
            "_events": [(e[0], e[1], 1e3 * (e[2] - t1), 1e3 * (e[3] - t1)) for e in ev],
            "_backward_return_ms": 1e3 * (t2 - t1), "_compute_end_ms": 1e3 * (compute_end - t1),
        }


def _compute_nodes(root) -> list:
    """The autograd graph's nodes below ``root`` that compute (not the AccumulateGrad leaves,
    whose hooks are DDP's bucketing); a compiled graph's backward is one such node."""
    seen, stack, out = set(), [root], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ != "AccumulateGrad":
            out.append(node)
        stack.extend(n for n, _ in node.next_functions)
    return out


# torch's notes that every rank would log straight to the terminal, harmless here: (logger, start
# of the message). DDP's forward opens a `record_function` range, which a compiled graph leaves
# out (only a profiler trace would miss it); inductor's C++ build on a machine with a CUDA
# toolkit but no GPU says which CUDA_HOME it would use (for CUDA code, which a CPU run never has).
_QUIET = {"torch._dynamo.variables.ctx_manager": "Profiler record function",
          "torch.utils.cpp_extension": "No CUDA runtime is found"}


def _quiet_torch_notes() -> None:
    """Drop `_QUIET`'s messages, and only those, in this process."""
    for name, start in _QUIET.items():
        logging.getLogger(name).addFilter(
            lambda record, start=start: not str(record.msg).startswith(start))


def _worker(rank: int, procs: int, cfg_dict: dict) -> dict:
    """One process of ``max(world_sizes)``: for every world size the first ``world`` ranks run
    every model and mode in a subgroup while the others wait at a barrier (one start-up and one
    inductor initialisation per process for all world sizes)."""
    _quiet_torch_notes()
    cfg = BenchConfig(**cfg_dict)
    torch.set_num_threads(cfg.threads)
    out: dict[str, list] = {"rows": [], "events": [], "meta": []}
    for world in sorted({int(w) for w in cfg.world_sizes}):
        group = None if world == procs else dist.new_group(list(range(world)))  # collective
        if rank < world:
            _run_world(rank, world, group, cfg, out)
        dist.barrier()
    return out


def _run_world(rank: int, world: int, group, cfg: BenchConfig, out: dict) -> None:
    """Every model and mode on ``world`` ranks (see module docstring); appends to ``out``."""
    rows, events, meta = out["rows"], out["events"], out["meta"]
    for model_name, batch in zip(cfg.models, cfg.batches(), strict=True):
        runners = {m: _Runner(m, model_name, cfg, world, group) for m in cfg.modes}
        g = torch.Generator().manual_seed(1000 * cfg.seed + rank)  # this rank's data
        width = MODELS[model_name][0]
        batches = [(torch.randn(batch, width, generator=g),
                    torch.randint(0, CLASSES, (batch,), generator=g)) for _ in range(4)]
        for mode, r in runners.items():
            dist.barrier(group=group)
            for i in range(cfg.warmup):
                out = r.step(batches)
                rows.append({"model": model_name, "world": world, "rank": rank, "mode": mode,
                             "round": -1, "warmup": True, **_public(out)})
                if i == 0:
                    compile_s = out["step_ms"] / 1e3
            meta.append({"model": model_name, "world": world, "rank": rank, "mode": mode,
                         "compile_s": compile_s if cfg.warmup else float("nan"),
                         "graphs": len(r.graphs), "graph_nodes": list(r.graphs)})
        order = list(cfg.modes)
        for rnd in range(cfg.rounds):
            k = rnd % len(order)
            for mode in order[k:] + order[:k]:  # rotate: no mode always follows another
                dist.barrier(group=group)
                for _ in range(cfg.steps):
                    out = runners[mode].step(batches)
                    rows.append({"model": model_name, "world": world, "rank": rank,
                                 "mode": mode, "round": rnd, "warmup": False, **_public(out)})
                # one step's bucket timeline per mode (the last timed step of the last round)
                if rnd == cfg.rounds - 1:
                    for idx, nbytes, ready, done in out["_events"]:
                        events.append({"model": model_name, "world": world, "rank": rank,
                                       "mode": mode, "step": out["step"], "bucket": idx,
                                       "mib": nbytes / 2**20, "ready_ms": ready,
                                       "done_ms": done,
                                       "backward_return_ms": out["_backward_return_ms"],
                                       "compute_end_ms": out["_compute_end_ms"]})
        del runners
        torch._dynamo.reset()  # the next model compiles from scratch, not as a recompile


def _public(out: dict) -> dict:
    return {k: v for k, v in out.items() if not k.startswith("_")}


@dataclass
class BenchResult:
    """``steps``: one row per (model, world, mode, rank, step); ``events``: bucket timelines;
    ``summary``: medians and ratios per (model, world, mode); ``meta``: what it ran on."""

    steps: pd.DataFrame
    events: pd.DataFrame
    summary: pd.DataFrame
    meta: dict

    def to_json(self) -> dict:
        return {"meta": self.meta, "summary": self.summary.to_dict(orient="records")}


SPLIT = ["forward_ms", "backward_compute_ms", "exposed_comm_ms", "optimizer_ms"]


def summarize(steps: pd.DataFrame, meta_rows: pd.DataFrame) -> pd.DataFrame:
    """Medians over timed steps (each step: mean over ranks) and ratios to eager."""
    timed = steps[~steps.warmup]
    cols = ["step_ms", *SPLIT, "comm_window_ms", "first_allreduce_at", "buckets"]
    per_step = timed.groupby(["model", "world", "mode", "step"])[cols].mean()
    med = per_step.groupby(["model", "world", "mode"]).median()
    n = per_step.groupby(["model", "world", "mode"]).size().rename("timed_steps")
    # losses: rank 0's, step by step, against eager's at the same step (warm-up steps included:
    # the compiled step must compute the same loss too)
    loss = steps[steps["rank"] == 0].pivot_table(index=["model", "world", "step"],
                                                  columns="mode", values="loss")
    out = med.join(n).reset_index()
    # noise: the ratio to eager within each round (modes interleaved), its lowest and highest
    per_round = timed.groupby(["model", "world", "mode", "round", "step"]).step_ms.mean() \
        .groupby(["model", "world", "mode", "round"]).median().unstack("mode")
    if "eager" in per_round.columns:
        ratios = per_round.rdiv(per_round["eager"], axis=0).stack().rename("r").reset_index()
        spread = ratios.groupby(["model", "world", "mode"]).r.agg(
            speed_lo="min", speed_hi="max").reset_index()
        out = out.merge(spread, on=["model", "world", "mode"], how="left")
    comp = meta_rows.groupby(["model", "world", "mode"]).agg(
        compile_s=("compile_s", "max"), graphs=("graphs", "max")).reset_index()
    out = out.merge(comp, on=["model", "world", "mode"], how="left")
    out["model_mib"] = out.model.map(model_mib)
    eager = out[out["mode"] == "eager"].set_index(["model", "world"])["step_ms"]
    key = list(zip(out.model, out.world, strict=True))
    out["eager_step_ms"] = [eager.get(k, float("nan")) for k in key]
    # speed relative to eager: > 1 is faster; (1 - speed) is the throughput lost. With rounds,
    # the mean of the per-round ratios (modes interleaved within a round: the paired estimate
    # the verdicts use, so it lies inside speed_lo..speed_hi); else the medians' ratio
    out["speed_vs_eager"] = out["eager_step_ms"] / out["step_ms"]
    if "eager" in per_round.columns:
        paired = ratios.groupby(["model", "world", "mode"]).r.mean()
        key3 = list(zip(out.model, out.world, out["mode"], strict=True))
        out["speed_vs_eager"] = [paired.get(k, v) for k, v in zip(key3, out.speed_vs_eager,
                                                                   strict=True)]
    rel = []
    for m, w, mode in zip(out.model, out.world, out["mode"], strict=True):
        if "eager" not in loss.columns or mode not in loss.columns:
            rel.append(float("nan"))
            continue
        part = loss.loc[(m, w)]
        rel.append(float(((part[mode] - part["eager"]).abs() / part["eager"].abs()).max()))
    out["loss_max_rel_diff"] = rel
    # the losses compared must move (the model trains), or equal losses would prove nothing
    first_last = loss.groupby(level=["model", "world"]).agg(["first", "last"])
    out["loss_first"] = [first_last.loc[(m, w), (mode, "first")] if mode in loss.columns
                         else float("nan") for m, w, mode in zip(out.model, out.world,
                                                                  out["mode"], strict=True)]
    out["loss_last"] = [first_last.loc[(m, w), (mode, "last")] if mode in loss.columns
                        else float("nan") for m, w, mode in zip(out.model, out.world,
                                                                 out["mode"], strict=True)]
    return out


def run(cfg: BenchConfig | None = None, *, timeout: float = 600.0, **overrides) -> BenchResult:
    """Run the benchmark (see module docstring); ``overrides`` are `BenchConfig` fields."""
    cfg = cfg or BenchConfig()
    if overrides:
        cfg = BenchConfig(**{**asdict(cfg), **overrides})
    cfg.check()
    t_start = time.perf_counter()
    cache = tempfile.mkdtemp(prefix="localsgd-bench-ddp-inductor-")
    env = {"TORCHINDUCTOR_CACHE_DIR": cache,  # the spawned workers inherit these
           # compile in the process itself: a pool of compile workers per rank would only
           # compete for the same cores
           "TORCHINDUCTOR_COMPILE_THREADS": "1", "OMP_NUM_THREADS": str(cfg.threads)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    rows, events, metas = [], [], []
    try:
        for res in spawn(_worker, max(int(w) for w in cfg.world_sizes), asdict(cfg),
                         threads=cfg.threads, timeout=timeout):
            rows += res["rows"]
            events += res["events"]
            metas += res["meta"]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(cache, ignore_errors=True)
    steps = pd.DataFrame(rows)
    meta_rows = pd.DataFrame(metas)
    summary = summarize(steps, meta_rows)
    meta = {
        "config": asdict(cfg),
        "device": "cpu", "process_group": "gloo", **machine(),
        "inductor_cache": "fresh temporary folder for this call, removed afterwards",
        "wall_s": round(time.perf_counter() - t_start, 2),
    }
    profile.record("launch", seconds=time.perf_counter() - t_start, workers=max(cfg.world_sizes),
                   compile=float(summary["compile_s"].sum()) if len(summary) else 0.0)
    return BenchResult(steps, pd.DataFrame(events), summary, meta)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="localsgd bench ddp", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    d = BenchConfig()
    ap.add_argument("--models", nargs="+", default=d.models, metavar="NAME",
                    help=f"of {', '.join(f'{k} ({model_mib(k):.1f} MiB)' for k in MODELS)}")
    ap.add_argument("--world", nargs="+", type=int, default=d.world_sizes, dest="world_sizes",
                    help="process counts, one process group each (default 2)")
    ap.add_argument("--modes", nargs="+", default=d.modes, help=f"of {', '.join(MODES)}")
    ap.add_argument("--batch", type=int, nargs="+", default=[d.batch],
                    help="samples per process and step (one number, or one per model)")
    ap.add_argument("--steps", type=int, default=d.steps, help="timed steps per window")
    ap.add_argument("--rounds", type=int, default=d.rounds, help="windows per mode")
    ap.add_argument("--warmup", type=int, default=d.warmup,
                    help="untimed steps per mode first (the first compiles)")
    ap.add_argument("--bucket-cap-mb", type=float, default=d.bucket_cap_mb,
                    help="DDP bucket size in MiB (>= 1; the source's default is 25)")
    ap.add_argument("--compile-backend", default=d.compile_backend,
                    help="inductor (default) or aot_eager (graphs and splitting, no codegen)")
    ap.add_argument("--threads", type=int, default=d.threads, help="torch threads per process")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--json", action="store_true",
                    help="print one JSON object: what it ran on and the medians")
    args = ap.parse_args(argv)
    values = {k: v for k, v in vars(args).items() if k != "json"}
    if len(values["batch"]) == 1:
        values["batch"] = values["batch"][0]
    cfg = BenchConfig(**values)
    try:
        result = run(cfg)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    if args.json:
        print(json.dumps(result.to_json(), default=float))
        return 0
    s = result.summary
    print(f"{result.meta['cpu']}, {result.meta['cores']} cores, torch {result.meta['torch']}, "
          f"gloo, {cfg.threads} thread(s)/process; medians of {cfg.rounds} x {cfg.steps} steps "
          f"after {cfg.warmup} warm-up; {result.meta['wall_s']} s")
    cols = ["model", "model_mib", "world", "mode", "graphs", "compile_s", "step_ms",
            *SPLIT, "first_allreduce_at", "speed_vs_eager", "speed_lo", "speed_hi", "loss_max_rel_diff"]
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(s[cols].round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
