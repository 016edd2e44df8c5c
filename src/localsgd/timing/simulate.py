"""Wall-clock model of synchronous, local and hierarchical SGD, SlowMo and SGP with stragglers.

`simulate` predicts the wall-clock time of a list of `Scheme`s on one cluster (per-worker clocks;
a sync releases at its group's slowest member); `localsgd.timing.plan` ranks schedules with it
(``localsgd plan``).

`Scheme` and its per-step plan live in `localsgd.timing.scheme` and are importable from here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from localsgd.timing.cluster import Cluster
from localsgd.timing.scheme import Scheme
from localsgd.timing.stragglers import STRAGGLER_SALT, Stragglers, stall_draws

__all__ = ["FORMATS", "SPARSE_BYTES", "WIRE_BYTES", "check_int_arg", "run_clocks", "simulate",
           "wire_ratio"]

# No event queue: every worker has a clock, every step adds its compute (+ stall), and a
# synchronisation of a group sets the clocks of its members to the group's release time
# (the slowest member's arrival) plus the collective's cost. Between two syncs of a group its
# workers run ahead independently, so a stall is absorbed when the others stall later in the same
# period (the blog, "Why Can Hierarchical SGD Mitigate Stragglers?"). The loop runs over steps;
# each step is a handful of numpy operations over configurations × workers at once.


def _lognormal_compute(rng: np.random.Generator, mean: float, cv: float,
                       shape: tuple[int, ...]) -> np.ndarray:
    """Positive per-step compute times with the given mean and coefficient of variation."""
    if cv <= 0:
        return np.full(shape, mean)
    sigma2 = math.log1p(cv * cv)
    return rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2), size=shape)


class _GroupMax:
    """Segment max over contiguous groups of a flattened [configs × workers] array, one group
    size per configuration (np.maximum.reduceat); index arrays cached per size pattern."""

    def __init__(self, workers: int):
        self.workers = workers
        self._cache: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}

    def __call__(self, flat: np.ndarray, sizes: tuple[int, ...]) -> np.ndarray:
        got = self._cache.get(sizes)
        if got is None:
            starts = np.concatenate([c * self.workers + np.arange(0, self.workers, g)
                                     for c, g in enumerate(sizes)])
            counts = np.concatenate([np.full(self.workers // g, g) for g in sizes])
            got = self._cache[sizes] = (starts, counts)
        starts, counts = got
        return np.repeat(np.maximum.reduceat(flat, starts), counts)


def run_clocks(plans: list[dict[str, np.ndarray]], work: np.ndarray, grad_cost: np.ndarray,
               avg_cost: np.ndarray, gossip_cost: float, allgather_cost: float,
               steps: int, queue: tuple[np.ndarray, np.ndarray, float, np.ndarray] | None = None,
               fragment_cost: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Advance every configuration's worker clocks through ``steps`` steps: the simulator's
    core, also for callers with their own step times (`simulate` draws them).

    ``plans``: one `Scheme.plan` per configuration. ``work`` [steps, W]: compute + effective
    stall of each worker and step (shared by the configurations: common random numbers, so
    differences are the schemes', not the draws'). ``grad_cost[c, g]`` / ``avg_cost[c, g]``: exposed
    seconds of a gradient all-reduce / model average in groups of size g for configuration c.
    Returns per-configuration arrays ``clock`` (final per-worker time), ``wait`` and ``comm``
    (per-worker totals).

    ``queue = (compute, stall, q, Q[c])``: the host may have up to Q steps in flight
    (asynchronous CUDA queue; collectives block the device stream, not the host). Per step the
    host starts when its device has finished step t − Q, enqueues the forward (share q of the
    step's device work), stalls, then enqueues the rest; the device runs each part once both it
    and the host are there. ``clock`` is then the device's clock; Q <= 1 is ``work``'s model.

    Streamed fragments (plans' ``fragment`` / ``merge``; ``fragment_cost[c]``: seconds of one
    fragment's world average): a launch does not stop the workers; its average starts when the
    last of them launches and the link is free of the averages launched before it (one link:
    averages in flight take their turns), and is ready ``fragment_cost`` later; the merge (in
    launch order) waits until then. The part of that wait no longer than the average's cost
    counts as communication, the rest as waiting."""
    n_cfg, workers = len(plans), work.shape[1]
    clock = np.zeros(n_cfg * workers)
    wait = np.zeros_like(clock)
    comm = np.zeros_like(clock)
    gmax = _GroupMax(workers)
    grad = np.stack([p["grad"] for p in plans], axis=1)  # [steps, C]
    avg = np.stack([p["avg"] for p in plans], axis=1)
    goss = np.stack([p["gossip"] for p in plans], axis=1)
    gather = np.stack([p["allgather"] for p in plans], axis=1)
    cfg_idx = np.arange(n_cfg)
    gc = grad_cost[cfg_idx[None, :], grad]  # [steps, C] seconds per step and configuration
    ac = avg_cost[cfg_idx[None, :], avg] + gather * allgather_cost
    any_grad, any_avg, any_goss = (grad > 1).any(1), (avg > 1).any(1), (goss > 0).any(1)
    grad_keys, avg_keys = [tuple(r) for r in grad.tolist()], [tuple(r) for r in avg.tolist()]
    none = np.zeros(steps, dtype=np.int64)
    frag = np.stack([p.get("fragment", none) for p in plans], axis=1)
    merge = np.stack([p.get("merge", none) for p in plans], axis=1)
    streamed = (frag > 0).any(1) | (merge > 0).any(1)
    if streamed.any() and fragment_cost is None:
        raise ValueError("plans with streamed fragments need fragment_cost (seconds per config)")
    in_flight: list[list[float]] = [[] for _ in range(n_cfg)]  # ready times, launch order
    link_free = np.zeros(n_cfg)  # when each configuration's link has sent what it was given
    grid = clock.reshape(n_cfg, workers)  # a view: adding a step's work broadcasts over configs
    rows = np.arange(n_cfg)[:, None] * workers
    if queue is not None:
        q_compute, q_stall, q_frac, q_cfg = queue
        q_el = np.repeat(np.maximum(np.asarray(q_cfg, dtype=np.int64), 1), workers)
        depth = int(q_el.max())
        host = np.zeros_like(clock)
        done = np.zeros((depth, clock.size))  # device end of the last `depth` steps (ring)
        cols = np.arange(clock.size)
    for i in range(steps):
        if queue is None:
            grid += work[i]
        else:
            c_i, s_i = np.tile(q_compute[i], n_cfg), np.tile(q_stall[i], n_cfg)
            # blocked until the device has finished step t - Q (Q steps in flight)
            start = np.maximum(host, done[(i - q_el) % depth, cols] * (i >= q_el))
            clock[:] = np.maximum(np.maximum(clock, start) + q_frac * c_i, start + s_i) \
                + (1 - q_frac) * c_i
            host = start + s_i
        for active, sizes, cost in ((any_grad[i], grad_keys[i], gc[i]),
                                    (any_avg[i], avg_keys[i], ac[i])):
            if not active:
                continue
            release = gmax(clock, sizes)
            wait += release - clock
            c = np.repeat(cost, workers)
            comm += c
            np.add(release, c, out=clock)  # in place: `grid` views it
        if streamed[i]:
            for c in np.flatnonzero((frag[i] > 0) | (merge[i] > 0)):
                seg = slice(c * workers, (c + 1) * workers)
                if frag[i, c]:
                    start = max(float(clock[seg].max()), float(link_free[c]))
                    link_free[c] = start + float(fragment_cost[c])
                    in_flight[c].append(float(link_free[c]))
                if merge[i, c]:
                    exposed = np.maximum(in_flight[c].pop(0) - clock[seg], 0.0)
                    talk = np.minimum(exposed, fragment_cost[c])
                    comm[seg] += talk
                    wait[seg] += exposed - talk
                    clock[seg] += exposed
        if any_goss[i]:  # receive from (rank - offset): wait for that peer, then the message
            off = goss[i]
            ranks = (np.arange(workers)[None, :] - off[:, None]) % workers
            peer = clock[(rows + ranks).ravel()]
            has = np.repeat(off > 0, workers)
            release = np.where(has, np.maximum(clock, peer), clock)
            wait += release - clock
            c = has * gossip_cost
            comm += c
            np.add(release, c, out=clock)  # in place: `grid` views it
        if queue is not None:
            done[i % depth] = clock
    shape = (n_cfg, workers)
    return {"clock": clock.reshape(shape), "wait": wait.reshape(shape),
            "comm": comm.reshape(shape)}


def simulate(schemes: Sequence[Scheme | str], *, workers: int, steps: int = 1000,
             cluster: Cluster | None = None, compute_ms: float = 55.0, jitter: float = 0.0,
             stragglers: Stragglers | None = None, model_mb: float = 45.0,
             grad_overlap: float = 1.0, backward_fraction: float = 2 / 3,
             intra_host_grad_allreduce: bool = False, queued_fraction: float = 0.0,
             baseline: bool | str = True, seed: int = 0, runner_stalls: bool = False,
             stalls: np.ndarray | None = None, queue_steps: int = 0,
             sync_queue_steps: int | None = None,
             average_compression: str = "fp32",
             compression_density: float = 0.01) -> pd.DataFrame:
    """Predicted wall-clock time of each scheme on one cluster: one tidy row per scheme.

    Model (per worker clock, per step; no event queue):

    1. compute: ``compute_ms`` per step, lognormal jitter with coefficient of variation
       ``jitter`` (0: every step the same), drawn once and shared by every scheme;
    2. stall: `Stragglers` semantics (``rate`` per worker and step, ``seconds`` long; ranks in
       ``persistent`` stall every step), drawn once and shared; with ``runner_stalls`` exactly
       the draws of ``python -m localsgd.training.runner`` (`Stragglers.stall`; slow: pure-Python
       per draw); ``stalls`` ([steps, workers] seconds) replaces the draws, e.g. by the ``stall_s``
       a real run recorded in its timing.csv.
       ``queued_fraction`` q: the share of a step's device work already queued when the host
       stalls, which runs during the stall, so a stall costs ``max(0, s − q·compute)``.
       q = 0: the stall blocks (CPU compute, the runner's sleep); q ≈ 1/3: the blog's emulation
       (sleep after the loss, before backward: the forward's kernels are queued on the GPU —
       blog, "Experimental Setup" and its code snippet).
       ``queue_steps`` Q: how many steps a host may have in flight on its device. 0 or 1: the
       host waits for its device every step (a ``loss.item()`` per step; CPU/gloo, the runner).
       Q ≥ 2: PyTorch's asynchronous CUDA execution — NCCL collectives and DDP's all-reduce block
       the device stream, not the host, so a host keeps enqueueing while its GPU waits for a
       straggler elsewhere, and its own later stall is then hidden by that backlog; stalls of
       different workers overlap instead of adding up (how a stall interacts with queued device
       work; the blog's snippet does not show whether its loop synchronised).
       ``sync_queue_steps`` (None: = ``queue_steps``) sets it for the synchronous schemes alone
       (kind "sync"), e.g. a DDP baseline whose loop blocks the host every step beside averaging
       schemes whose hosts run ahead;
    3. gradient all-reduce (sync SGD; intra-host groups after warm-up): the group is released
       when its slowest member's backward ends, then the collective's cost minus what overlapped
       the backward: ``max(0, C − grad_overlap · backward_fraction · compute)`` (DDP overlaps
       the bucketed all-reduce with backward: blog "Algorithm Hyperparameters", point 2);
    4. model averaging (local / hierarchical / SlowMo): released at the slowest member's
       arrival, then the full collective cost — no overlap (blog, limitation 3); streamed
       fragments (kind "stream"): 1/P of the model's bytes per average, which travels while the
       workers compute and is waited for τ steps later (`run_clocks`);
    5. SGP: wait for the in-peer of the exponential graph, then one message of the model.

    A collective among g workers costs ``Cluster.allreduce_seconds`` (recursive-doubling
    latency + ring bytes ``2(g−1)/g · bytes / bandwidth``, intra-node bandwidth when the group
    fits in a node, inter-node otherwise). ``model_mb`` is in MB (10^6 bytes; the blog's
    ResNet-18 is 45 MB).

    ``average_compression``: the format model averages, gossip messages and the slow-momentum
    all-gather travel in (`localsgd.compression`: fp32, bf16, fp16, fp8, int8, int4, or the
    sparse topk, chunk-topk, randk with ``compression_density`` of the entries, and sign); their
    bytes scale by `wire_ratio` (codes plus per-block scales; sparse codes are all-gathered, so
    their ratio grows with the group), priced as a ring collective of that many bytes.
    Gradient all-reduces (synchronous SGD, DDP) stay fp32.

    ``intra_host_grad_allreduce``: local and hierarchical schemes also all-reduce gradients
    inside each host every step (PyTorch's default ``post_local_gradient_allreduce=True``, blog
    "Algorithm Hyperparameters"; the blog does not say whether it was on in its benchmark).

    Columns: scheme, kind, workers, gpus_per_node, steps, seconds, steps_per_s, step_ms,
    speedup (baseline seconds / this scheme's, same draws; the baseline is the first scheme of
    kind "sync", else an added `Scheme.sync()` (not returned); ``baseline="name"`` picks a given
    scheme by name, e.g. a runner's synchronous `Scheme.from_train_config`; False: NaN),
    compute_share, stall_share (time a worker's own stalls added, after any hiding),
    wait_share, comm_share (shares of the summed worker clocks; they add to 1), syncs_grad,
    syncs_avg (steps with a gradient / model sync; a streamed fragment's launch counts as one),
    bytes_mb (MB each worker sends: ring all-reduce 2(g−1)/g of the model, or of a fragment, 1/P
    of it; a gossip message one model), and the inputs
    (compute_ms, jitter, straggler_rate, straggler_s, persistent, model_mb, inter_gbps,
    intra_gbps, latency_s, grad_overlap, backward_fraction, intra_host_grad_allreduce,
    queued_fraction, queue_steps, sync_queue_steps, seed).

    Example (the blog's 256-GPU setting; ~0.2 s)::

        simulate(blog_schemes(256), workers=256, cluster=Cluster(gpus_per_node=4,
                 inter_gbps=32.0), compute_ms=55.0, model_mb=45.0,
                 stragglers=Stragglers(seconds=1.0, rate=0.01))

    A torchrun run (``python -m localsgd.training.runner``, gloo, ``--compute-ms M``, stragglers):
    one `Scheme.from_train_config` per run, ``compute_ms`` = M plus the measured per-step overhead,
    ``backward_fraction=0`` (the emulated compute sleeps in the forward), ``Stragglers`` as the
    runner's flags (``runner_stalls=True`` for its exact draws, or ``stalls=`` the recorded
    ``stall_s``), ``Cluster(gpus_per_node=procs_per_node, ...)``.
    """
    cluster = Cluster() if cluster is None else cluster
    stragglers = Stragglers() if stragglers is None else stragglers
    check_int_arg("workers", workers, 1)
    check_int_arg("steps", steps, 1)
    check_int_arg("queue_steps", queue_steps, 0)
    if sync_queue_steps is not None:
        check_int_arg("sync_queue_steps", sync_queue_steps, 0)
    for name, value, lo, hi in (("compute_ms", compute_ms, 0.0, None),
                                ("jitter", jitter, 0.0, None), ("model_mb", model_mb, 0.0, None),
                                ("grad_overlap", grad_overlap, 0.0, 1.0),
                                ("backward_fraction", backward_fraction, 0.0, 1.0),
                                ("queued_fraction", queued_fraction, 0.0, 1.0)):
        if not (isinstance(value, (int, float)) and not isinstance(value, bool)
                and math.isfinite(value) and value >= lo and (hi is None or value <= hi)):
            rng_txt = f"in [{lo:g}, {hi:g}]" if hi is not None else f">= {lo:g}"
            raise ValueError(f"{name}={value!r}: must be a number {rng_txt}")
    def ratio_at(group: int) -> float:  # sparse codes' all-gather grows with the group
        return wire_ratio(average_compression, density=compression_density, group=group)

    ratio = ratio_at(2)  # one rank's message: a gossip round, the slow-momentum all-gather
    fragment_ratio = ratio_at(workers)  # fragments: averaged by the world
    gpn = cluster.gpus_per_node
    if workers % gpn and workers > gpn:
        raise ValueError(f"workers={workers} is not a whole number of nodes of "
                         f"gpus_per_node={gpn}; use a multiple of {gpn}")
    parsed = [Scheme.parse(s) for s in schemes]
    if not parsed:
        raise ValueError("no schemes to simulate; e.g. ['sync', 'local:4', 'hsgd:2-8,8-64']")
    names = [s.name for s in parsed]
    if len(set(names)) != len(names):
        raise ValueError(f"scheme names must be unique, got {names}")
    run = list(parsed)
    has_sync = any(s.kind == "sync" for s in parsed)
    if isinstance(baseline, str) and baseline not in names:
        raise ValueError(f"baseline={baseline!r} is not one of the schemes {names}")
    if baseline is True and not has_sync:
        run.append(Scheme.sync(name="__baseline_sync__"))
    plans = [s.plan(workers, gpn, steps, intra_host_grad_allreduce) for s in run]

    rng = np.random.default_rng([seed, STRAGGLER_SALT, workers])
    compute = _lognormal_compute(rng, compute_ms / 1e3, jitter, (steps, workers))
    if stalls is not None:
        stall = np.asarray(stalls, dtype=float)
        if stall.shape != (steps, workers) or not np.isfinite(stall).all() or (stall < 0).any():
            raise ValueError(f"stalls: expected a [steps={steps}, workers={workers}] array of "
                             f"seconds >= 0, got shape {stall.shape}")
    else:
        stall = stall_draws(stragglers, workers, steps, rng, runner_stalls)
    eff_stall = np.maximum(stall - queued_fraction * compute, 0.0) * (stall > 0)
    work = compute + eff_stall

    nbytes = model_mb * 1e6
    sizes = np.arange(workers + 1)
    ar = np.array([0.0] + [cluster.allreduce_seconds(int(g), nbytes, workers)
                           for g in sizes[1:]])
    hidden = grad_overlap * backward_fraction * compute_ms / 1e3
    grad_cost = np.maximum(ar - hidden, 0.0)
    grad_cost = np.tile(grad_cost, (len(run), 1))
    # model averages travel compressed (average_compression); gradients do not
    avg_bytes = nbytes * ratio
    ar_avg = ar if average_compression == "fp32" else np.array(
        [0.0] + [cluster.allreduce_seconds(int(g), nbytes * ratio_at(int(g)), workers)
                 for g in sizes[1:]])
    avg_cost = np.tile(ar_avg, (len(run), 1))
    inter_bw = (cluster.intra_gbps if workers <= gpn else cluster.inter_gbps) * 1e9 / 8
    gossip_cost = cluster.latency_s + avg_bytes / inter_bw
    # sharded slow-momentum step: each node updates its shard, then an all-gather moves
    # (g-1)/g of the model (half a ring all-reduce's bytes; SlowMo document, "Zero-1 like")
    allgather_cost = (cluster.latency_s * math.ceil(math.log2(max(workers, 2)))
                      + (workers - 1) / workers * avg_bytes / inter_bw)
    sync_q = queue_steps if sync_queue_steps is None else sync_queue_steps
    depths = [sync_q if sc.kind == "sync" else queue_steps for sc in run]
    queue = (compute, stall, queued_fraction, depths) if max(depths) > 1 else None
    # a streamed fragment: 1/P of the model averaged by the world
    # a streamed fragment: 1/P of the model averaged by the world (P from the plan: a "stream"
    # scheme or a schedule, e.g. `Scheme.from_train_config`, alike)
    fragment_cost = np.array([cluster.allreduce_seconds(
        workers, nbytes * fragment_ratio / max(1, int(plan["fragment"].max())), workers)
        for plan in plans])
    res = run_clocks(plans, work, grad_cost, avg_cost, gossip_cost, allgather_cost, steps, queue,
                     fragment_cost)

    rows = []
    for c, (scheme, plan) in enumerate(zip(run, plans, strict=True)):
        clock = res["clock"][c]
        seconds = float(clock.max())
        total = float(clock.sum())
        # MB a worker sends: a ring all-reduce among g sends 2(g-1)/g of the model, a
        # gossip round one model, the slow-momentum all-gather (g-1)/g
        moved = float(sum((2 * (g - 1) / g) * model_mb * (ratio_at(g) if key == "avg" else 1.0)
                          for key in ("grad", "avg") for g in plan[key] if g > 1)
                      + model_mb * ratio * ((plan["gossip"] > 0).sum()
                                            + (workers - 1) / workers * plan["allgather"].sum())
                      + sum(2 * (workers - 1) / workers * model_mb * fragment_ratio / p
                            for p in plan["fragment"] if p > 0))
        rows.append({
            "scheme": scheme.name, "kind": scheme.kind, "workers": workers,
            "gpus_per_node": gpn, "steps": steps, "seconds": seconds,
            "steps_per_s": steps / seconds if seconds > 0 else float("inf"),
            "step_ms": 1e3 * seconds / steps,
            "compute_share": float(compute.sum()) / total if total else float("nan"),
            "stall_share": (1.0 - (float(compute.sum()) + float(res["wait"][c].sum())
                                   + float(res["comm"][c].sum())) / total) if total
            else float("nan"),
            "wait_share": float(res["wait"][c].sum()) / total if total else float("nan"),
            "comm_share": float(res["comm"][c].sum()) / total if total else float("nan"),
            "syncs_grad": int((plan["grad"] > 1).sum()),
            "syncs_avg": int((plan["avg"] > 1).sum() + (plan["fragment"] > 0).sum()),
            "bytes_mb": moved,
        })
    df = pd.DataFrame(rows)
    if isinstance(baseline, str):
        base = float(df.loc[df.scheme == baseline, "seconds"].iloc[0])
        df["speedup"] = base / df["seconds"]
    elif baseline:
        base = float(df.loc[df.kind == "sync", "seconds"].iloc[0])
        df["speedup"] = base / df["seconds"]
    else:
        df["speedup"] = float("nan")
    df = df[df.scheme != "__baseline_sync__"].reset_index(drop=True)
    inputs = {"compute_ms": compute_ms, "jitter": jitter,
              "straggler_rate": stragglers.rate, "straggler_s": stragglers.seconds,
              "persistent": ",".join(map(str, stragglers.persistent)), "model_mb": model_mb,
              "inter_gbps": cluster.inter_gbps, "intra_gbps": cluster.intra_gbps,
              "latency_s": cluster.latency_s, "grad_overlap": grad_overlap,
              "backward_fraction": backward_fraction,
              "intra_host_grad_allreduce": intra_host_grad_allreduce,
              "queued_fraction": queued_fraction, "queue_steps": queue_steps,
              "sync_queue_steps": sync_q, "average_compression": average_compression,
              "compression_density": compression_density,
              "seed": seed}
    for k, v in inputs.items():
        df[k] = v
    cols = ["scheme", "kind", "workers", "gpus_per_node", "steps", "seconds", "steps_per_s",
            "step_ms", "speedup", "compute_share", "stall_share", "wait_share", "comm_share",
            "syncs_grad", "syncs_avg", "bytes_mb", *inputs]
    return df[cols]


# bytes a value takes on the wire per format (`localsgd.compression`), and whether the format
# adds a float32 scale per block; kept here (numbers only) so the timing model imports no torch
WIRE_BYTES = {"fp32": (4.0, False), "bf16": (2.0, False), "fp16": (2.0, True),
              "fp8": (1.0, True), "int8": (1.0, True), "int4": (0.5, True)}


# sparse codes (`localsgd.sparse`): bytes per kept entry (index + value), or for sign per value
SPARSE_BYTES = {"topk": 8.0, "chunk-topk": 5.0, "randk": 4.0, "sign": 1 / 8}
FORMATS = (*WIRE_BYTES, *SPARSE_BYTES)


def wire_ratio(fmt: str, block: int = 256, density: float = 0.01, group: int = 2) -> float:
    """Bytes on the wire of ``fmt`` over fp32's, for a long tensor: codes plus a 4-byte scale
    per ``block`` values where the format scales (`localsgd.compression.Encoded.nbytes`). Sparse
    codes are all-gathered among ``group`` ranks, which moves what an all-reduce of group / 2
    messages moves (`localsgd.sparse.equivalent_bytes`); chunk-topk keeps ceil(density block)
    per block (uint8 indices: block <= 256)."""
    if fmt in SPARSE_BYTES:
        if not 0.0 < density <= 1.0:
            raise ValueError(f"compression_density={density!r}: must be a fraction in (0, 1]")
        if fmt == "sign":
            per_value = 1 / 8 + 4.0 / block
        elif fmt == "chunk-topk":
            per_value = math.ceil(density * block - 1e-9) / block * (4 + (1 if block <= 256 else 2))
        else:
            per_value = density * SPARSE_BYTES[fmt]
        return group / 2 * per_value / 4.0
    if fmt not in WIRE_BYTES:
        raise ValueError(f"average_compression={fmt!r}; valid: {', '.join(FORMATS)}")
    width, scaled = WIRE_BYTES[fmt]
    return (width + (4.0 / block if scaled else 0.0)) / 4.0


def check_int_arg(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}={value!r}: must be an integer >= {minimum}")
