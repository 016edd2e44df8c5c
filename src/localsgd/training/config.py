"""`TrainConfig`: one training run's configuration (§4.2.1's recipe by default), validated
when built, and its round trip through plain dicts (YAML configs, checkpoints, cache keys).

Its fields are of two kinds. The **recipe** is the source's experiment: data and model,
workers, topology and schedule, optimiser and learning-rate schedule, epochs, seed and what is
recorded; it is the same on every machine. The **execution** (`EXECUTION`) is how a machine
runs it: engine, device, numerics, threads, evaluation batch; `localsgd.training.plan` resolves
its 'auto' values. `TrainConfig.run_as` changes the execution and refuses to touch the recipe,
so one recipe runs unchanged on any engine and device; the results key
(`localsgd.training.results_key`) is the recipe plus the execution choices that change numbers.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

from localsgd import data as data_mod
from localsgd import numerics, schedule
from localsgd.outer import OuterUpdate
from localsgd.topology import Topology

__all__ = ["EXECUTION", "MOMENTUM_SCHEMES", "RECIPE", "TrainConfig"]

MOMENTUM_SCHEMES = ("local", "global", "hybrid", "none")
# `localsgd.compression.FORMATS`, named here: the config imports no torch
COMPRESSION_FORMATS = ("fp32", "bf16", "fp16", "fp8", "int8", "int4",
                       "topk", "chunk-topk", "randk", "sign")
SPARSE_DENSITY_FORMATS = ("topk", "chunk-topk", "randk")  # the ones compression_density sizes
INNER_OPTIMIZERS = ("sgd", "adamw")
# how a machine runs a recipe (the module docstring); every other field is the recipe's
EXECUTION = ("batched", "packed", "compile_replicas", "device", "dtype", "precision",
             "deterministic", "memory_format", "host_threads", "loader_workers", "eval_batch",
             "check_consistency")


@dataclass(frozen=True)
class TrainConfig:
    """One training run. Defaults are §4.2.1's ResNet-20 / CIFAR-10 recipe on 2×1 GPUs."""

    # -- data and model
    dataset: str = "cifar10"
    """'cifar10', 'cifar100', 'synthetic' (only when asked for by name) -- held in memory --, or
    streamed from image folders through ImageNet's input pipeline: 'imagenet' (§4.2.2) or
    'cifar10_folder' (CIFAR-10 written as PNG folders: ImageNet's code path at CPU size)."""
    model: str = "resnet20"
    """A `localsgd.models.build_model` name: resnet20, densenet40_12, wrn28_10, resnet50 (or
    mlp, `localsgd.models.timing_mlp`, for emulated-compute timing runs)."""
    width: float = 1.0
    """Channel-width multiplier (1.0 = the paper's model; < 1 for reduced-scale runs)."""
    n_train: int | None = None
    """Class-balanced subset of the training set (None: all 50,000 images)."""
    n_test: int | None = None
    """Class-balanced subset of the test set used for evaluation (None: all 10,000)."""
    resolution: int | None = None
    """In-memory data sets (CIFAR): the side every image is downsampled to by area averaging
    (16: each 2×2 block's mean), once when the run starts, with the padded crop's pad scaled to
    match (4 × side / 32, at least 1); the normalisation keeps the data set's statistics. None:
    the images as stored (32×32). The long CPU proxy's lever (docs/pilot/long_proxy_design.md)."""
    augment: bool = True
    """4-pixel padded random crop + horizontal flip (§4.1, He et al. 2016); streamed data sets
    always use ImageNet's random-resized crop + flip."""
    image_size: int = 224
    """Streamed data sets: crop size of the input pipeline (224 on ImageNet)."""
    loader_workers: int = 2
    """Streamed data sets: DataLoader worker processes decoding images (speed only: the crops
    are seeded per image, `localsgd.data.SeededItems`)."""

    # -- topology and schedule (Algorithms 1 and 2)
    world_size: int = 2
    """K, the number of workers."""
    local_batch: int = 128
    """B_loc, each worker's mini-batch."""
    local_steps: int = 1
    """H, local updates between averages (H = 1 is mini-batch SGD)."""
    block_size: int | None = None
    """K', workers per block (a node) for hierarchical local SGD; None: flat local SGD."""
    block_steps: int = 1
    """H^b, block averages between global averages (Eq. 5)."""
    post_local_warmup_epochs: float = 0.0
    """Post-local SGD: mini-batch SGD (global gradient all-reduce) for these first epochs."""
    local_step_warmup_epochs: int = 0
    """Exponential local-step warm-up (§4.2.2, footnote 4): H = 1, 2, 4, ... over these epochs."""
    block_gradient_allreduce: bool = False
    """After warm-up, blocks all-reduce gradients every update (the PyTorch hierarchical-SGD
    blog's intra-host gradient all-reduce); models are then averaged by the world only, every
    H·H^b updates. Needs a hierarchy (block_size < world_size, block_steps > 1)."""

    # -- optimisation (§4.2.1, App. C, App. D)
    epochs: float = 300.0
    """Training length in one worker's epochs: stop after epochs · N / (K · B_loc) updates."""
    lr: float = 0.1
    """Base learning rate gamma."""
    scale_lr: bool = False
    """App. C linear scaling: peak lr = lr · K · B_loc / base_batch."""
    base_batch: int = 128
    """The batch size `lr` is meant for (128 on CIFAR, 64 in Tables 6-7)."""
    warmup_epochs: float = 0.0
    """App. C gradual warm-up from lr to the peak lr over these epochs (5 in the paper)."""
    decay_fractions: tuple[float, ...] = (0.5, 0.75)
    """Divide the lr by 10 when these fractions of the samples are seen."""
    momentum: float = 0.9
    """Momentum factor m (no dampening), used as `momentum_scheme` says."""
    momentum_scheme: str = "local"
    """App. D: 'local' (each worker's SGD), 'global' (block momentum on the averaged model),
    'hybrid' (both), 'none'."""
    global_momentum: float | None = None
    """Momentum of the outer (global/block) step for 'global' and 'hybrid' (App. D.1.2-D.1.3,
    Tables 6-7); None: the same as `momentum`."""
    global_lr: float = 1.0
    """Outer learning rate α of the global step for 'global' and 'hybrid' (`localsgd.outer`;
    App. D.1.2 is α = 1; DiLoCo's outer step uses 0.7)."""
    global_nesterov: bool = False
    """Nesterov form of the global step (DiLoCo's outer optimizer, beyond the sources; scaled
    by the inner lr as App. D.1.2's block momentum is)."""
    nesterov: bool = False
    """Nesterov variant of the local momentum."""
    outer_delay: int = 0
    """1: the outer step (``momentum_scheme`` 'global' / 'hybrid', or SlowMo) applies the
    previous round's average change, this round's travelling meanwhile (beyond the sources;
    PCCL's and DiLoCoX's one-step-delayed outer update, `localsgd.outer`); 0: this round's (the
    sources'). A delayed plain average is 'global' with ``global_momentum`` 0. Not with
    ``fragments`` (streaming's own delay is ``overlap_steps``)."""
    optimizer: str = "sgd"
    """The inner optimizer: 'sgd' (the sources': SGD with ``momentum`` as ``momentum_scheme``
    says) or 'adamw' (beyond the sources: what DiLoCo and its 2025-26 peers run inside, with
    decoupled ``weight_decay`` off the BatchNorm coefficients and ``adam_betas``; its moments
    are the workers' own, like local momentum). Not with ``nesterov``, per-worker H or churn
    (an idle worker's Adam step count would move on)."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """With ``optimizer='adamw'``: Adam's (beta1, beta2)."""
    weight_decay: float = 1e-4
    """Weight decay, not applied to BatchNorm coefficients (§4.1): SGD's L2 term in the gradient,
    AdamW's decoupled decay with ``optimizer='adamw'``."""
    average_buffers: bool = False
    """Average BatchNorm running statistics at every sync (False: per worker, §4.1)."""
    broadcast_buffers: bool = False
    """At every sync each worker takes the BatchNorm running statistics of its group's first
    worker (a state-sync policy beyond the sources, like DDP's ``broadcast_buffers``; False: per
    worker, §4.1). Not with ``average_buffers``."""
    average_momentum: bool = False
    """Also average the inner optimizer's momentum buffers at every model average (a state-sync
    policy beyond the sources; False, the paper's: each worker keeps its own local momentum,
    Algorithm 1)."""
    average_compression: str = "fp32"
    """Format of model averages on the wire (beyond the sources; `localsgd.compression`):
    'fp32' (exact, the paper's), or 'bf16', 'fp16', 'fp8', 'int8', 'int4' codes of each
    worker's change since its group's last average, scaled per block of 256, or its sparse
    codes 'topk', 'chunk-topk', 'randk' (``compression_density`` of the entries) or 'sign'
    (`localsgd.sparse`). Not with SGP."""
    compression_feedback: bool = True
    """With a compressed ``average_compression``: each worker adds what its last codes left out
    to its next change (error feedback, `localsgd.compression.ErrorFeedback`)."""
    compression_density: float = 0.01
    """With 'topk', 'chunk-topk' or 'randk' averages: the share of entries sent, in (0, 1]
    (k = ceil(density n), per block for 'chunk-topk'; SparseLoCo and DeMo send 1-3 %)."""
    fragments: int = 0
    """Streaming fragment sync (beyond the sources; `localsgd.schedule.Streaming`, Douillard et
    al. 2025): 0 averages the whole model at once (the paper's); P >= 1 splits the parameters
    into P fragments of whole tensors, each averaged once every H updates at its own offset
    (through the outer step of ``momentum_scheme`` 'global' / 'hybrid', per fragment). A flat
    topology (no block_size), P <= H; not with SGP, SlowMo, the local-step warm-up or a
    buffer / momentum state-sync policy (there is no whole-model sync to apply them at)."""
    overlap_steps: int = 0
    """With ``fragments``: τ, the updates a fragment's average travels before it is merged
    (τ < H), the workers training on meanwhile."""
    fragment_mixing: float = 0.0
    """With ``fragments``: α, the share of its own fragment each worker keeps at a merge (0, the
    source's default, takes the global value)."""
    qsr_alpha: float | None = None
    """The quadratic synchronization rule (beyond the sources; Gu et al., ICLR 2024,
    `localsgd.schedule.qsr_rounds`): each round of flat local SGD lasts H = max(``local_steps``,
    floor((alpha / lr)^2)) updates, lr the learning rate at its start, so H grows as the lr
    decays. None: every round lasts ``local_steps``. Not with a hierarchy, gossip, SlowMo,
    fragments, per-worker H or the local-step warm-up."""
    churn_rate: float = 0.0
    """Workers leaving and rejoining (beyond the sources; `localsgd.schedule.churn_trace`, a trace
    drawn from ``seed``): at each round of flat local SGD every worker but worker 0 leaves with
    this probability; while away it is idle and left out of the world averages, and it rejoins
    from the group's average. 0: nobody leaves. Exact averages of the parameters alone, on a flat
    topology (not with compression, averaged or broadcast buffers or momentum, gossip, SlowMo,
    fragments, per-worker H, QSR or the local-step warm-up)."""
    churn_away_rounds: float = 2.0
    """With ``churn_rate``: the mean number of rounds a worker stays away (geometric, >= 1)."""
    churn_rejoin: str = "average"
    """With ``churn_rate``: 'average' (a returning worker trains from the group's average in its
    first round back) or 'zero' (prime's joiner: that round it sends a zero pseudo-gradient,
    idle and counted in the average with the model it started from)."""
    quorum: int = 0
    """A merge that proceeds without its late workers (beyond the sources; Decoupled DiLoCo,
    `localsgd.timing.quorum`): each round's world average waits for the ``quorum``-th worker
    present, then ``quorum_grace_steps`` more; a worker later than that has its change of the
    round dropped (left out of the average, which it takes). Arrivals are seeded by ``seed``:
    each update lasts one step time plus a stall of ``quorum_stall_steps`` with probability
    ``quorum_stall_rate``. 0: every average waits for everyone (the sources'). Flat, exact
    averages of the parameters, as ``churn_rate``."""
    quorum_grace_steps: float = 0.0
    """With ``quorum``: the grace window after the quorum-th arrival, in step times."""
    quorum_stall_rate: float = 0.0
    """With ``quorum``: a worker's chance to stall at an update (`Stragglers` semantics)."""
    quorum_stall_steps: float = 0.0
    """With ``quorum``: a stall's length, in step times."""
    worker_local_steps: tuple[int, ...] | None = None
    """Per-worker H for heterogeneous workers (beyond the sources; `SyncSchedule.worker_steps`):
    one H_k <= ``local_steps`` per worker; a round still ends with the global average every
    ``local_steps`` updates, but worker k applies only the first H_k updates of it, as a slower
    worker would (the rest it sits out: its batch is computed, its state kept). None: every
    worker makes all H (the paper's). A flat topology; not with SGP, SlowMo, the local-step
    warm-up or ``fragments``."""

    # -- SlowMo (Wang et al. 2020; fairscale's SlowMoDistributedDataParallel) over local SGD or SGP
    slowmo_frequency: int | None = None
    """Every this many updates: exact global average, then the slow-momentum outer step
    (`localsgd.outer`); None: no SlowMo. `local_steps` stays the base algorithm's averaging
    period (fairscale's localsgd_frequency)."""
    slowmo_momentum: float = 0.5
    """Slow momentum beta (fairscale's slowmo_momentum)."""
    slowmo_lr: float = 1.0
    """Slow learning rate alpha (fairscale's slowmo_lr)."""
    gossip: bool = False
    """SGP base (Assran et al. 2019): one push-sum round on a time-varying exponential graph after
    every update that does not average; with SlowMo set local_steps = slowmo_frequency so only the
    slow step averages exactly."""
    peers_per_step: int = 1
    """SGP peers per gossip round."""

    # -- engine and bookkeeping (the execution, `EXECUTION`, but seed and records_per_epoch)
    batched: bool | str = "auto"
    """Run the K replicas as one vmapped model (`BatchedReplicaEngine`). 'auto' (the default,
    `localsgd.training.plan.use_batched`): on CUDA for K >= 2 replicas in one process, where it
    computes what the sequential engine computes (every schedule kind of the paper's grids, float64:
    tests/test_batched_paper_kinds.py) 2.5-3x as fast (H200, figures/gpu/sweep.csv), unless its
    memory estimate does not fit; sequential elsewhere (on a CPU the sequential engine with
    host threads is faster). The records' ``batched`` column holds what ran."""
    packed: bool | str = "auto"
    """Inside the batched engine, run a CIFAR ResNet / WideResNet's K replicas packed into
    channel groups (grouped convolutions, `localsgd.engines.packed`; equal to the vmap in
    float64, tests/test_packed.py) instead of vmap. 'auto' (the default): packed on CUDA, where
    it is 1.5x the vmap's images/s (H100, figures/gpu/h100/packed.json); vmap elsewhere."""
    compile_replicas: bool = False
    """`torch.compile` the batched engine's packed forward (needs ``packed``): 1.17x the eager
    packed step's images/s on an H100 after 26 s of compiling (figures/gpu/h100/packed.json)."""
    seed: int = 0
    """Fixes model init, data order and worker k's stream (seed + k)."""
    device: str = "cpu"
    """Training device ('cpu', 'cuda', 'cuda:1', ...)."""
    eval_batch: int = 1000
    """Batch size for test-set evaluation."""
    records_per_epoch: int = 1
    """Records per epoch, evenly spaced in updates: each evaluates the averaged model on the
    test set and closes a training-accuracy window (finer curves for short runs)."""
    dtype: str = "float32"
    """Parameter dtype ('float32' or 'float64'; float64 for equivalence tests)."""
    precision: str = "auto"
    """Arithmetic of float32 runs (`localsgd.numerics`): 'auto' (the default: 'tf32' on CUDA,
    'fp32' elsewhere), 'fp32' (TF32 off: the paper's arithmetic), 'tf32' (TF32 matmuls and
    convolutions on recent GPUs) or 'bf16' (forward and loss under bfloat16 autocast; opt-in,
    for speed). Applied once per run; the records' ``precision`` column holds what ran."""
    deterministic: bool = False
    """Deterministic cuDNN / torch algorithms (slower on GPUs; CPU runs are deterministic
    either way)."""
    memory_format: str = "auto"
    """Layout of image batches (`localsgd.numerics.memory_format`): 'auto' (channels-last on a
    single-threaded CPU, where it trains faster; NCHW otherwise), 'contiguous' or
    'channels_last'. Changes float32 results at round-off only."""
    host_threads: int = 0
    """CPU threads the sequential replica engine spreads its K replicas over, each op then
    single-threaded (`localsgd.engines.common.host_map`). 0 (auto): as many as torch has
    intra-op threads when `train` starts, at most K, for K >= 2 replicas on a CPU (else
    torch's threads are left alone). Does not change results: a run computes the same bits on
    one core or several (tested); not part of the results-cache key."""
    check_consistency: bool = False
    """Check at run time that every worker starts from the same parameters and holds the same
    after every world-wide average (`localsgd.schedule.SyncDriver`, a digest per worker; under
    torchrun an all-gather): a skipped average or a worker started apart raises
    `localsgd.schedule.ConsistencyError` instead of training on. Does not change results."""

    def __post_init__(self) -> None:
        if self.momentum_scheme not in MOMENTUM_SCHEMES:
            raise ValueError(f"momentum_scheme={self.momentum_scheme!r}; valid: {MOMENTUM_SCHEMES}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype={self.dtype!r}; valid: 'float32', 'float64'")
        if self.precision not in (numerics.AUTO, *numerics.PRECISIONS):
            raise ValueError(f"precision={self.precision!r}; valid: "
                             f"{(numerics.AUTO, *numerics.PRECISIONS)}")
        if self.memory_format not in numerics.MEMORY_FORMATS:
            raise ValueError(f"memory_format={self.memory_format!r}; valid: "
                             f"{numerics.MEMORY_FORMATS}")
        if isinstance(self.host_threads, bool) or not isinstance(self.host_threads, int) \
                or self.host_threads < 0:
            raise ValueError(f"host_threads={self.host_threads!r}: must be an integer >= 0 "
                             "(0: one per torch thread, at most K)")
        for name in ("batched", "packed"):
            if not (isinstance(getattr(self, name), bool) or getattr(self, name) == "auto"):
                raise ValueError(f"{name}={getattr(self, name)!r}: must be true, false or 'auto'")
        if not isinstance(self.compile_replicas, bool):
            raise ValueError(f"compile_replicas={self.compile_replicas!r}: must be true or false")  # noqa: TRY004 -- config errors are ValueErrors
        if not isinstance(self.broadcast_buffers, bool):
            raise ValueError(f"broadcast_buffers={self.broadcast_buffers!r}: must be true or "  # noqa: TRY004
                             "false")
        if self.broadcast_buffers and self.average_buffers:
            raise ValueError("broadcast_buffers and average_buffers both set the BatchNorm "
                             "statistics at a sync: choose one")
        if self.average_compression not in COMPRESSION_FORMATS:
            raise ValueError(f"average_compression={self.average_compression!r}; valid: "
                             f"{', '.join(COMPRESSION_FORMATS)}")
        if self.average_compression != "fp32" and self.gossip:
            raise ValueError(f"average_compression={self.average_compression!r} needs a common "
                             "reference at each average, which SGP's gossip leaves none of: use "
                             "'fp32' with gossip")
        if isinstance(self.compression_density, bool) or not isinstance(
                self.compression_density, (int, float)) or not (
                0.0 < self.compression_density <= 1.0):
            raise ValueError(f"compression_density={self.compression_density!r}: must be a "
                             "fraction in (0, 1] (the share of entries a sparse average sends; "
                             "0 would send nothing)")
        if not isinstance(self.check_consistency, bool):
            raise ValueError(f"check_consistency={self.check_consistency!r}: must be true or "  # noqa: TRY004
                             "false")
        if not isinstance(self.compression_feedback, bool):
            raise ValueError(f"compression_feedback={self.compression_feedback!r}: must be "  # noqa: TRY004
                             "true or false")
        if not isinstance(self.global_nesterov, bool):
            raise ValueError(f"global_nesterov={self.global_nesterov!r}: must be true or "  # noqa: TRY004
                             "false")
        OuterUpdate(0.0, self.global_lr, delay=self.outer_delay)  # alpha > 0, delay 0 / 1
        if self.outer_delay and self.momentum_scheme not in ("global", "hybrid") \
                and self.slowmo_frequency is None:
            raise ValueError(f"outer_delay={self.outer_delay} delays the outer step, and "
                             f"momentum_scheme={self.momentum_scheme!r} has none: use 'global' "
                             "or 'hybrid' (global_momentum 0 for a delayed plain average) or "
                             "SlowMo")
        if self.outer_delay and self.fragments:
            raise ValueError(f"outer_delay={self.outer_delay} with fragments={self.fragments}: "
                             "streaming delays each fragment's merge by overlap_steps instead")
        if not isinstance(self.average_momentum, bool):
            raise ValueError(f"average_momentum={self.average_momentum!r}: must be true or "  # noqa: TRY004
                             "false")
        if not isinstance(self.deterministic, bool):
            raise ValueError(f"deterministic={self.deterministic!r}: must be true or false")  # noqa: TRY004 -- config errors are ValueErrors
        if not self.epochs > 0:
            raise ValueError(f"epochs={self.epochs}: must be > 0")
        for name in ("world_size", "local_batch", "local_steps", "block_steps", "base_batch",
                     "eval_batch", "peers_per_step", "image_size", "records_per_epoch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: must be an integer >= 1")
        if self.resolution is not None and (isinstance(self.resolution, bool) or not isinstance(
                self.resolution, int) or self.resolution < 8):
            raise ValueError(f"resolution={self.resolution!r}: must be null or an integer >= 8 "
                             "(the side in pixels in-memory images are downsampled to)")
        if self.resolution is not None and self.model == "mlp" and self.resolution != 32:
            raise ValueError(f"resolution={self.resolution}: model 'mlp' takes 3x32x32 images "
                             "(its first layer is 3,072 wide); use resnet20 or resolution null")
        if self.resolution is not None and self.dataset in ("imagenet", "cifar10_folder"):
            raise ValueError(f"resolution={self.resolution}: for in-memory data sets only; "
                             f"{self.dataset} is streamed (set image_size)")
        object.__setattr__(self, "decay_fractions", tuple(self.decay_fractions))
        if isinstance(self.loader_workers, bool) or not isinstance(self.loader_workers, int) \
                or self.loader_workers < 0:
            raise ValueError(f"loader_workers={self.loader_workers!r}: must be an integer >= 0")
        if self.dataset not in data_mod.IMAGE_DATASETS:
            raise ValueError(f"dataset={self.dataset!r}; valid: {data_mod.IMAGE_DATASETS}")
        if self.slowmo_frequency is not None:
            f = self.slowmo_frequency
            if isinstance(f, bool) or not isinstance(f, int) or f < 1:
                raise ValueError(f"slowmo_frequency={f!r}: must be an integer >= 1 or None")
            if self.momentum_scheme in ("global", "hybrid"):
                raise ValueError(
                    f"slowmo_frequency={f} and momentum_scheme={self.momentum_scheme!r} both "
                    "want the outer step: SlowMo's slow momentum is the outer momentum; use "
                    "momentum_scheme='local' (or 'none') with SlowMo")
        OuterUpdate(self.slowmo_momentum, self.slowmo_lr)  # validates beta in [0, 1), alpha > 0
        self.topology()  # validates K, K', H, H^b with the schedule's own messages
        self._check_streaming()
        if self.worker_local_steps is not None:
            steps = self.worker_local_steps
            if not isinstance(steps, tuple | list):
                raise ValueError(f"worker_local_steps={steps!r}: a list of one H per worker")
            object.__setattr__(self, "worker_local_steps", tuple(steps))
            clash = {name: getattr(self, name) for name in (
                "block_size", "gossip", "slowmo_frequency", "local_step_warmup_epochs",
                "fragments") if getattr(self, name) not in (None, False, 0)}
            if clash:
                name, value = next(iter(clash.items()))
                raise ValueError(f"worker_local_steps (per-worker H) runs rounds of flat local "
                                 f"SGD: not with {name}={value!r}")
            schedule.SyncSchedule(self.topology(), worker_steps=self.worker_local_steps)
        self._check_optimizer()
        if self.qsr_alpha is not None:
            a = self.qsr_alpha
            if isinstance(a, bool) or not isinstance(a, int | float) or not 0 < a < float("inf"):
                raise ValueError(f"qsr_alpha={a!r}: must be a number > 0 (H = (alpha / lr)^2) "
                                 "or None")
            clash = {name: getattr(self, name) for name in (
                "block_size", "gossip", "slowmo_frequency", "local_step_warmup_epochs",
                "fragments", "worker_local_steps") if getattr(self, name) not in (None, False, 0)}
            if clash:
                name, value = next(iter(clash.items()))
                raise ValueError(f"qsr_alpha (QSR's growing H) runs rounds of flat local SGD: "
                                 f"not with {name}={value!r}")
        self._check_churn()
        if self.block_gradient_allreduce and self.topology().num_levels < 2:
            raise ValueError(
                "block_gradient_allreduce=True needs a hierarchy: set block_size to a divisor of "
                f"world_size={self.world_size} below it and block_steps > 1 (got block_size="
                f"{self.block_size}, block_steps={self.block_steps})")

    def _check_optimizer(self) -> None:
        if self.optimizer not in INNER_OPTIMIZERS:
            raise ValueError(f"optimizer={self.optimizer!r}; valid: {', '.join(INNER_OPTIMIZERS)}")
        betas = self.adam_betas
        if not isinstance(betas, tuple | list) or len(betas) != 2 or not all(
                isinstance(b, int | float) and not isinstance(b, bool) and 0 <= b < 1
                for b in betas):
            raise ValueError(f"adam_betas={betas!r}: two numbers in [0, 1) (beta1, beta2)")
        object.__setattr__(self, "adam_betas", tuple(float(b) for b in betas))
        if self.optimizer == "adamw":
            clash = {name: getattr(self, name) for name in (
                "nesterov", "worker_local_steps", "churn_rate") if getattr(self, name)}
            if clash:
                name, value = next(iter(clash.items()))
                raise ValueError(f"optimizer='adamw' is not run with {name}={value!r}"
                                 + (" (an idle worker's Adam step count would move on)"
                                    if name != "nesterov" else " (Nesterov is SGD's)"))

    def _check_churn(self) -> None:
        for name, lo, what in (("churn_rate", 0.0, "a probability in [0, 1]"),
                               ("churn_away_rounds", 1.0, "a number of rounds >= 1"),
                               ("quorum_stall_rate", 0.0, "a probability in [0, 1]"),
                               ("quorum_grace_steps", 0.0, "a number of step times >= 0"),
                               ("quorum_stall_steps", 0.0, "a number of step times >= 0")):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v < float(
                    "inf") or (name.endswith("_rate") and v > 1):
                raise ValueError(f"{name}={v!r}: must be {what}")
        if self.churn_rejoin not in ("average", "zero"):
            raise ValueError(f"churn_rejoin={self.churn_rejoin!r}: 'average' or 'zero'")
        q = self.quorum
        if isinstance(q, bool) or not isinstance(q, int) or not 0 <= q <= self.world_size:
            raise ValueError(f"quorum={q!r}: a number of workers in 0 .. world_size="
                             f"{self.world_size} (0: every average waits for everyone)")
        clash = {name: getattr(self, name) for name in (
            "block_size", "gossip", "slowmo_frequency", "local_step_warmup_epochs", "fragments",
            "worker_local_steps", "qsr_alpha", "average_buffers", "broadcast_buffers",
            "average_momentum") if getattr(self, name) not in (None, False, 0)}
        if self.average_compression != "fp32":
            clash["average_compression"] = self.average_compression
        for on, what in (("churn_rate", "workers leaving and rejoining"),
                         ("quorum", "a quorum's merge")):
            if getattr(self, on) and clash:
                name, value = next(iter(clash.items()))
                raise ValueError(f"{on} ({what}) averages the parameters alone over a flat "
                                 f"topology: not with {name}={value!r}")

    def quorum_trace(self, steps_per_epoch: int, updates: int) -> tuple:
        """The run's seeded arrivals and late workers, round by round
        (`localsgd.timing.quorum.quorum_trace`, times in step times): the trace the run's
        `SyncSchedule` drops changes by and the timing model prices. Workers away (churn) or
        rejoining with a zero pseudo-gradient are not waited for."""
        from localsgd.timing.quorum import quorum_trace  # deferred: numpy
        from localsgd.timing.stragglers import Stragglers

        warmup = round(self.post_local_warmup_epochs * steps_per_epoch)
        n = max(0, -(-(updates - warmup) // self.local_steps))  # rounds of the local phase
        skip: dict[int, set[int]] = {}
        for w, first, last in self._churn(n):
            for r in range(first, last + 1 + (self.churn_rejoin == "zero")):
                skip.setdefault(r, set()).add(w)
        stalls = Stragglers(seconds=self.quorum_stall_steps, rate=self.quorum_stall_rate,
                            seed=self.seed)
        return quorum_trace(self.world_size, n, self.local_steps, self.quorum or self.world_size,
                            self.quorum_grace_steps, 1.0, stalls, warmup,
                            {r: tuple(sorted(v)) for r, v in skip.items()})

    def _churn(self, rounds: int) -> tuple[tuple[int, int, int], ...]:
        if not self.churn_rate:
            return ()
        return schedule.churn_trace(self.world_size, rounds, self.churn_rate,
                                    self.churn_away_rounds, self.seed)

    def _check_streaming(self) -> None:
        f = self.fragments
        if isinstance(f, bool) or not isinstance(f, int) or f < 0:
            raise ValueError(f"fragments={f!r}: must be an integer >= 0 (0: whole-model "
                             "averages)")
        if not f:
            return
        clash = {name: getattr(self, name) for name in (
            "block_size", "gossip", "slowmo_frequency", "local_step_warmup_epochs",
            "average_buffers", "broadcast_buffers", "average_momentum")
            if getattr(self, name) not in (None, False, 0)}
        if clash:
            name, value = next(iter(clash.items()))
            raise ValueError(f"fragments={f} (streaming fragment sync) cannot run with "
                             f"{name}={value!r}: fragments are merged one at a time on a flat "
                             "topology's period, never as a whole-model sync")
        streaming = schedule.Streaming(f, self.overlap_steps, self.fragment_mixing)
        schedule.SyncSchedule(self.topology(), streaming=streaming,
                              outer_period="global" if self.momentum_scheme in (
                                  "global", "hybrid") else None)

    def topology(self) -> Topology:
        return Topology.from_paper(self.world_size, self.local_steps, self.block_size,
                                   self.block_steps)

    def sync_schedule(self, steps_per_epoch: int, lr: Any = None,
                      updates: int | None = None) -> schedule.SyncSchedule:
        """The run's `SyncSchedule` (Algorithm 2 with the post-local and local-step warm-ups,
        the outer period of block momentum or SlowMo, SGP, streaming, per-worker H, QSR's
        rounds, churn's trace), the one construction every engine and the timing model read.
        ``lr`` (the run's learning rate by 0-based iteration) only QSR needs, ``updates`` (its
        total) QSR and churn."""
        warmup = round(self.post_local_warmup_epochs * steps_per_epoch)
        rounds = None
        if self.qsr_alpha is not None:
            if lr is None or updates is None:
                raise ValueError("qsr_alpha needs the run's learning-rate schedule and its "
                                 "number of updates to plan its rounds")
            rounds = schedule.qsr_rounds(lr, self.qsr_alpha, self.local_steps, updates, warmup,
                                         getattr(lr, "warmup_iters", 0))
        away = late = None
        if self.churn_rate or self.quorum:
            if updates is None:
                raise ValueError(f"{'churn_rate' if self.churn_rate else 'quorum'} needs the "
                                 "run's number of updates to draw its trace")
            n = max(0, -(-(updates - warmup) // self.local_steps))  # rounds of the local phase
            away = self._churn(n) or None
            if self.quorum:
                from localsgd.timing.quorum import late_pairs  # deferred: numpy

                late = late_pairs(self.quorum_trace(steps_per_epoch, updates)) or None
        return schedule.SyncSchedule(
            self.topology(), warmup_steps=warmup,
            local_step_warmup_epochs=self.local_step_warmup_epochs,
            steps_per_epoch=steps_per_epoch if self.local_step_warmup_epochs else None,
            outer_period=("global" if self.momentum_scheme in ("global", "hybrid")
                          else self.slowmo_frequency),
            post_local_gradient_allreduce=0 if self.block_gradient_allreduce else False,
            gossip=self.gossip,
            streaming=(schedule.Streaming(self.fragments, self.overlap_steps,
                                          self.fragment_mixing) if self.fragments else None),
            worker_steps=self.worker_local_steps, rounds=rounds, away=away,
            rejoin=self.churn_rejoin if away else "average", late=late)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def recipe(self) -> dict[str, Any]:
        """The recipe's fields (`RECIPE`): what the run is, on any machine."""
        return {name: getattr(self, name) for name in RECIPE}

    def execution(self) -> dict[str, Any]:
        """The execution's fields (`EXECUTION`): how a machine runs the recipe."""
        return {name: getattr(self, name) for name in EXECUTION}

    def run_as(self, **execution: Any) -> TrainConfig:
        """This recipe run another way: only `EXECUTION` fields may change (e.g. ``device``,
        ``batched``, ``precision``); a recipe field is one ValueError line naming it."""
        recipe = sorted(set(execution) - set(EXECUTION))
        if recipe:
            raise ValueError(f"run_as changes how a recipe runs, not the recipe: {recipe} "
                             f"{'is a recipe field' if len(recipe) == 1 else 'are recipe fields'}"
                             f" (execution fields: {', '.join(EXECUTION)}); use "
                             "dataclasses.replace for another recipe")
        return dataclasses.replace(self, **execution)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """Build from a dict (e.g. a YAML file); an unknown key is an error naming it."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            import difflib

            close = {k: difflib.get_close_matches(k, known, n=1) for k in unknown}
            hints = "; ".join(f"{k!r}: did you mean {c[0]!r}?" for k, c in close.items() if c)
            raise ValueError(f"unknown TrainConfig field(s) {unknown}"
                             + (f" ({hints})" if hints else "")
                             + f"; valid fields: {sorted(known)}")
        hints = typing.get_type_hints(cls)
        return cls(**{k: _typed(k, v, hints[k]) for k, v in values.items()})


# the source's experiment: every field not in EXECUTION, in declaration order
RECIPE = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.name not in EXECUTION)


def _typed(name: str, value: Any, hint: Any) -> Any:
    """``value`` checked against the field's annotation (a YAML file or a flag gives plain data):
    ints where an int is declared, numbers where a float is (an int or a numeric string such as
    YAML 1.1's ``1e-4``, which PyYAML reads as text, becomes a float), booleans, strings, None
    for optional fields, a list of numbers for a tuple. A wrong type is one ValueError line."""
    args = typing.get_args(hint)
    if set(args) == {bool, str}:  # a switch with 'auto' (`batched`)
        if isinstance(value, bool) or value == "auto":
            return value
        raise ValueError(f"{name}: {value!r} ({type(value).__name__}) is not true, false or "
                         "'auto'")
    if type(None) in args:
        if value is None:
            return None
        hint = next(a for a in args if a is not type(None))
    if hint is float and not isinstance(value, bool):
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif hint in (int, bool, str) and type(value) is hint:  # exact: True is not an int here
        return value
    elif typing.get_origin(hint) is tuple and isinstance(value, (list, tuple)) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        if typing.get_args(hint)[0] is not int:
            return tuple(float(v) for v in value)
        if all(type(v) is int for v in value):
            return tuple(value)
        raise ValueError(f"{name}: {value!r} is not a list of integers")
    expected = {float: "a number", int: "an integer", bool: "true or false",
                str: "a string"}.get(hint, "a list of numbers")
    optional = " or null" if type(None) in args else ""
    raise ValueError(f"{name}: {value!r} ({type(value).__name__}) is not {expected}{optional}")
