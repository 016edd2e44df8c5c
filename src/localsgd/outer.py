"""Outer (slow) update on the globally averaged model: block/global momentum, hybrid momentum,
SlowMo and a Nesterov outer step -- one implementation.

Notation: anchor w_prev (the model right after the previous outer step), averaged model w_avg
(the global average of the local models that just finished a round), inner learning rate gamma,
outer momentum beta, outer learning rate alpha. The pseudo-gradient of the round is

    d = (w_prev - w_avg) / gamma          (= (1/gamma) * (1/K) sum_k Delta^k, App. D.1.2)

and the outer step is

    u = beta * u + d
    w = w_prev - alpha * gamma * u                  (heavy ball)
    w = w_prev - alpha * gamma * (d + beta * u)     (Nesterov)

* Global / block momentum (paper App. D.1.2, Chen & Huo's block momentum): beta = m, alpha = 1.
  beta = 0, alpha = 1 is plain model averaging (Eq. 4): w = w_prev - avg Delta. (Algorithm 1
  line 10 writes w_prev - gamma * avg Delta; we follow Eq. (4) and D.1.2, not that extra gamma.)
* Hybrid momentum (App. D.1.3): the same outer step over inner optimizers that keep their own
  local momentum (e.g. torch.optim.SGD(momentum=0.9) per worker).
* SlowMo (Wang et al. 2020; fairscale's SlowMoDistributedDataParallel): beta = slowmo_momentum
  (default 0.5), alpha = slowmo_lr (default 1.0), every slowmo_frequency (default 48) steps, over
  local SGD (localsgd_frequency default 3) or SGP. The 1/gamma and gamma scalings use the (fast)
  inner learning rate of the current step, as in fairscale.
* Nesterov outer step (DiLoCo family): ``nesterov=True``; DiLoCo does not scale by gamma, so use
  ``scale_by_lr=False`` (then d = w_prev - w_avg and w = w_prev - alpha * (...)), e.g.
  alpha = 0.7, beta = 0.9.
* One-step-delayed outer step (beyond the sources; PCCL's and DiLoCoX's overlap of the outer
  all-reduce with the next round): ``delay=1``. Round r's average delta d_r travels while round
  r + 1 computes, so the step that ends round r applies d_{r-1}:

      w_r = w_{r-1} - alpha * gamma_{r-1} * u(d_{r-1})      (w_r = w_{r-1} after round 1)

  and every worker starts round r + 1 from w_r. d_r is always measured from the round's own
  start w_{r-1}, so no round's work is lost; it lands one round late. gamma_{r-1} is the inner
  lr at the step that produced d_{r-1}. The last round's delta is still in flight when training
  stops and is not applied (as `localsgd.streaming` drops an unmerged average).

Works on flat tensors: ``[n]`` (one worker) or a ``[K, n]`` stack whose rows are equal after a
global average; the state (anchor, u) is ``[n]`` and the result is written into every row.
"""

from __future__ import annotations

import torch

__all__ = ["OuterUpdate", "block_momentum", "nesterov_outer", "slowmo"]


class OuterUpdate:
    """Outer update ``u = beta*u + d; w = w_prev - alpha*gamma*u`` (see module docstring)."""

    def __init__(
        self,
        momentum: float = 0.0,
        lr: float = 1.0,
        nesterov: bool = False,
        scale_by_lr: bool = True,
        delay: int = 0,
    ):
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"outer momentum must be in [0, 1), got {momentum}")
        if not lr > 0.0:
            raise ValueError(f"outer lr must be > 0, got {lr}")
        if isinstance(delay, bool) or delay not in (0, 1):
            raise ValueError(f"outer delay must be 0 (the step applies this round's average) or "
                             f"1 (the previous round's), got {delay!r}")
        self.momentum, self.lr = float(momentum), float(lr)
        self.nesterov, self.scale_by_lr = bool(nesterov), bool(scale_by_lr)
        self.delay = int(delay)
        self.anchor: torch.Tensor | None = None  # w_prev, shape [n]
        self.buf: torch.Tensor | None = None  # u, shape [n]
        self.pending: tuple[torch.Tensor, float] | None = None  # delay 1: (d_{r-1}, gamma_{r-1})
        self.num_steps = 0

    @staticmethod
    def _row(params: torch.Tensor) -> torch.Tensor:
        if params.dim() == 1:
            return params
        if params.dim() == 2:
            # rows are bitwise equal right after a global average; a mean would add rounding
            return params[0]
        raise ValueError(f"params must be a flat [n] or stacked [K, n] tensor, got {params.shape}")

    @torch.no_grad()
    def reset(self, params: torch.Tensor) -> None:
        """Start a new anchor at the current (averaged) model; keeps the momentum buffer."""
        self.anchor = self._row(params).detach().clone()
        self.pending = None  # a delta from before the new anchor is not a step from it
        if self.buf is None or self.buf.shape != self.anchor.shape:
            self.buf = torch.zeros_like(self.anchor)

    @torch.no_grad()
    def step(self, params: torch.Tensor, lr: float = 1.0) -> None:
        """Apply the outer step in place to `params` (the globally averaged model).

        `lr` is the inner learning rate gamma of the step (ignored if ``scale_by_lr=False``).
        """
        if self.anchor is None:
            raise ValueError("OuterUpdate.step before reset(params): no anchor w_prev yet")
        row = self._row(params)
        if row.shape != self.anchor.shape:
            raise ValueError(
                f"params have {row.numel()} entries per worker but the anchor from reset() has "
                f"{self.anchor.numel()}; call reset() with the same parameters"
            )
        delta = self.anchor - row
        if self.delay:  # apply the delta that arrived (none after round 1); send this one
            arrived, self.pending = self.pending, (delta, float(lr))
            if arrived is not None:
                self.step_delta(*arrived)
        else:
            self.step_delta(delta, lr)
        params.copy_(self.anchor.expand_as(params))

    @torch.no_grad()
    def step_delta(self, delta: torch.Tensor, lr: float = 1.0) -> torch.Tensor:
        """The outer step from the averaged change ``delta`` = w_prev - w_avg itself (what a
        streamed fragment's average brings, `localsgd.streaming`); returns the new anchor."""
        if self.anchor is None:
            raise ValueError("OuterUpdate.step before reset(params): no anchor w_prev yet")
        if self.scale_by_lr and not lr > 0.0:
            raise ValueError(f"inner lr gamma must be > 0 to scale the outer step, got {lr}")
        gamma = float(lr) if self.scale_by_lr else 1.0
        d = delta / gamma  # App. D.1.2: (1/gamma) avg Delta
        self.buf.mul_(self.momentum).add_(d)
        direction = d.add(self.buf, alpha=self.momentum) if self.nesterov else self.buf
        self.anchor.add_(direction, alpha=-self.lr * gamma)
        self.num_steps += 1
        return self.anchor

    def state_dict(self) -> dict:
        return {
            "momentum": self.momentum,
            "lr": self.lr,
            "nesterov": self.nesterov,
            "scale_by_lr": self.scale_by_lr,
            "delay": self.delay,
            "pending": None if self.pending is None else (self.pending[0].clone(),
                                                          self.pending[1]),
            "anchor": None if self.anchor is None else self.anchor.clone(),
            "buf": None if self.buf is None else self.buf.clone(),
            "num_steps": self.num_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        state = {"delay": 0, "pending": None, **state}  # checkpoints from before the delay
        for key in ("momentum", "lr", "nesterov", "scale_by_lr", "delay"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"state_dict has {key}={state[key]!r} but this OuterUpdate has "
                    f"{key}={getattr(self, key)!r}; construct it with the saved hyper-parameters"
                )
        self.anchor = None if state["anchor"] is None else state["anchor"].clone()
        self.buf = None if state["buf"] is None else state["buf"].clone()
        pending = state["pending"]
        self.pending = None if pending is None else (pending[0].clone(), float(pending[1]))
        self.num_steps = int(state["num_steps"])

    def __repr__(self) -> str:
        return (
            f"OuterUpdate(momentum={self.momentum}, lr={self.lr}, nesterov={self.nesterov}, "
            f"scale_by_lr={self.scale_by_lr}" + (f", delay={self.delay})" if self.delay else ")")
        )


def block_momentum(m: float) -> OuterUpdate:
    """Global/block momentum of App. D.1.2: u = m u + (1/gamma) avg Delta; w = w_prev - gamma u."""
    return OuterUpdate(momentum=m, lr=1.0)


def slowmo(slowmo_momentum: float = 0.5, slowmo_lr: float = 1.0) -> OuterUpdate:
    """SlowMo with fairscale's defaults (beta = 0.5, alpha = 1.0)."""
    return OuterUpdate(momentum=slowmo_momentum, lr=slowmo_lr)


def nesterov_outer(lr: float = 0.7, momentum: float = 0.9) -> OuterUpdate:
    """DiLoCo-style Nesterov outer step on the raw model delta (no 1/gamma scaling)."""
    return OuterUpdate(momentum=momentum, lr=lr, nesterov=True, scale_by_lr=False)
