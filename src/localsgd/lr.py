"""Learning-rate schedules of the paper: large-batch tricks (App. C, Goyal et al. 2017) and step
decay (Sec. 4: /10 at 50% and 75% of training on CIFAR; at epochs 30, 60, 80 on ImageNet).

Convention: `it` = number of completed updates (0 for the first update), the same argument
``torch.optim.lr_scheduler.LambdaLR`` passes to its lambda.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "LRSchedule",
    "gradual_warmup",
    "milestones_from_epochs",
    "milestones_from_fractions",
    "scaled_lr",
    "step_decay",
    "warmup_iterations",
]


def scaled_lr(
    base_lr: float,
    world_size: int | None = None,
    *,
    global_batch: int | None = None,
    base_batch: int | None = None,
) -> float:
    """Linear scaling rule (App. C): multiply the lr by K, or by global_batch / base_batch
    (ImageNet in Sec. 4: 0.1 per 256 samples, i.e. ``scaled_lr(0.1, global_batch=K*128,
    base_batch=256)``)."""
    if base_lr <= 0:
        raise ValueError(f"base_lr must be > 0, got {base_lr}")
    if (world_size is None) == (global_batch is None):
        raise ValueError(
            "give exactly one of world_size or global_batch (with base_batch), got "
            f"world_size={world_size}, global_batch={global_batch}"
        )
    if world_size is not None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        return base_lr * world_size
    if base_batch is None or base_batch < 1 or global_batch < 1:
        raise ValueError(
            f"global_batch and base_batch must be >= 1, got {global_batch} and {base_batch}"
        )
    return base_lr * global_batch / base_batch


def warmup_iterations(
    num_samples: int, world_size: int, local_batch: int, epochs: float = 5.0
) -> int:
    """Iterations of the gradual warm-up, 5N / (K B_loc) in App. C (rounded up)."""
    if num_samples < 1 or world_size < 1 or local_batch < 1 or epochs < 0:
        raise ValueError(
            "num_samples, world_size, local_batch must be >= 1 and epochs >= 0, got "
            f"{num_samples}, {world_size}, {local_batch}, {epochs}"
        )
    return -(-round(epochs * num_samples) // (world_size * local_batch))


def gradual_warmup(it: int, start_lr: float, target_lr: float, warmup_iters: int) -> float:
    """Linear ramp of App. C: start at gamma, add (gamma_hat - gamma) / warmup_iters per
    iteration, reach gamma_hat = K gamma after warmup_iters iterations and stay there."""
    if warmup_iters < 0:
        raise ValueError(f"warmup_iters must be >= 0, got {warmup_iters}")
    if it < 0:
        raise ValueError(f"iteration must be >= 0, got {it}")
    if it >= warmup_iters:
        return target_lr
    return start_lr + (target_lr - start_lr) * it / warmup_iters


def step_decay(it: int, lr: float, milestones: Sequence[int], factor: float = 0.1) -> float:
    """lr * factor^(number of milestones <= it): /10 at each milestone iteration."""
    return lr * factor ** bisect.bisect_right(sorted(milestones), it)


def milestones_from_fractions(
    total_iters: int, fractions: Iterable[float] = (0.5, 0.75)
) -> list[int]:
    """Iterations at which a fraction of training is done (CIFAR: 50% and 75%)."""
    out = []
    for f in fractions:
        if not 0.0 < f < 1.0:
            raise ValueError(f"decay fractions must be in (0, 1), got {f}")
        out.append(round(f * total_iters))
    return sorted(out)


def milestones_from_epochs(epochs: Iterable[float], iters_per_epoch: int) -> list[int]:
    """Iterations at given epochs (ImageNet: 30, 60, 80)."""
    if iters_per_epoch < 1:
        raise ValueError(f"iters_per_epoch must be >= 1, got {iters_per_epoch}")
    return sorted(round(e * iters_per_epoch) for e in epochs)


@dataclass(frozen=True)
class LRSchedule:
    """Warm-up from `start_lr` to `peak_lr` over `warmup_iters`, then step decay by `factor` at
    `milestones` (iterations). ``start_lr`` None means no warm-up (constant peak until decay)."""

    peak_lr: float
    warmup_iters: int = 0
    start_lr: float | None = None
    milestones: tuple[int, ...] = field(default_factory=tuple)
    factor: float = 0.1

    def __post_init__(self):
        if self.peak_lr <= 0:
            raise ValueError(f"peak_lr must be > 0, got {self.peak_lr}")
        if self.warmup_iters < 0:
            raise ValueError(f"warmup_iters must be >= 0, got {self.warmup_iters}")
        if self.start_lr is not None and self.start_lr <= 0:
            raise ValueError(f"start_lr must be > 0 (or None for no warm-up), got {self.start_lr}")
        if not 0 < self.factor <= 1:
            raise ValueError(f"decay factor must be in (0, 1], got {self.factor}")
        if any(m < 0 for m in self.milestones):
            raise ValueError(f"milestones must be iterations >= 0, got {list(self.milestones)}")
        object.__setattr__(self, "milestones", tuple(sorted(self.milestones)))

    def __call__(self, it: int) -> float:
        start = self.peak_lr if self.start_lr is None else self.start_lr
        lr = gradual_warmup(it, start, self.peak_lr, self.warmup_iters)
        return step_decay(it, lr, self.milestones, self.factor)

    def multiplier(self, base_lr: float | None = None) -> Callable[[int], float]:
        """LambdaLR lambda: lr(it) / base_lr, where base_lr is the optimizer's initial lr
        (default: `peak_lr`). ``LambdaLR(opt, sched.multiplier(opt_lr))``."""
        base = self.peak_lr if base_lr is None else base_lr
        if base <= 0:
            raise ValueError(f"base_lr must be > 0, got {base}")
        return lambda it: self(it) / base

    @classmethod
    def paper(
        cls,
        base_lr: float,
        world_size: int,
        iters_per_epoch: int,
        decay_epochs: Iterable[float] = (),
        warmup_epochs: float = 5.0,
        total_iters: int | None = None,
        decay_fractions: Iterable[float] = (),
    ) -> LRSchedule:
        """Large-batch tricks: warm-up gamma -> K gamma over `warmup_epochs`, then /10 at
        `decay_epochs` (or `decay_fractions` of `total_iters`)."""
        milestones = milestones_from_epochs(decay_epochs, iters_per_epoch)
        fractions = list(decay_fractions)
        if fractions:
            if total_iters is None:
                raise ValueError("decay_fractions need total_iters")
            milestones += milestones_from_fractions(total_iters, fractions)
        return cls(
            peak_lr=scaled_lr(base_lr, world_size),
            warmup_iters=round(warmup_epochs * iters_per_epoch),
            start_lr=base_lr,
            milestones=tuple(milestones),
        )
