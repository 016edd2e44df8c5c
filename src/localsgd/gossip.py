"""Stochastic gradient push (SGP, Assran et al. 2019): push-sum gossip on a time-varying directed
exponential graph -- the base algorithm of SlowMo that replaces exact averaging.

Each node keeps a biased numerator x_i and a push-sum weight w_i (initially 1); the model used
for gradients is the de-biased z_i = x_i / w_i. One gossip round at step t:

* node i sends to the peers ``(i + 2^j) mod K`` with ``j = (t * p + r) mod J`` for r = 0..p-1,
  p = peers per step, J = number of powers of two below K (log2 K when K is a power of two). With
  p = 1 this is the classic one-peer exponential graph ``(i + 2^(t mod log2 K)) mod K``;
* uniform mixing: a node keeps ``1/(p+1)`` of (x_i, w_i) and pushes ``1/(p+1)`` to each peer;
  every node receives from exactly p nodes, so the mixing matrix is column stochastic (sum of w
  and sum of x are preserved: the average is invariant) and here also row stochastic;
* z_i = x_i / w_i.

`plan(step, K)` is what the distributed engine needs for point-to-point ops; `mix_` applies a
round to a ``[K, n]`` stack of de-biased parameters in place (replica engine).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["GossipPlan", "mix_", "mixing_matrix", "num_phases", "plan"]


def num_phases(world_size: int) -> int:
    """Number of distinct exponential-graph offsets 2^j < K (log2 K for powers of two)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return max(world_size - 1, 0).bit_length()


@dataclass(frozen=True)
class GossipPlan:
    """Who talks to whom at one gossip round. `offsets` are the 2^j used; node i sends to
    ``(i + o) % K`` and receives from ``(i - o) % K`` for each offset o, with weight `weight`
    (also the fraction of (x, w) it keeps)."""

    step: int
    world_size: int
    offsets: tuple[int, ...]
    weight: float

    def send_to(self, rank: int) -> list[int]:
        return [(rank + o) % self.world_size for o in self.offsets]

    def recv_from(self, rank: int) -> list[int]:
        return [(rank - o) % self.world_size for o in self.offsets]


def plan(step: int, world_size: int, peers_per_step: int = 1) -> GossipPlan:
    """The directed exponential graph of round `step` with uniform push-sum weights."""
    phases = num_phases(world_size)
    if peers_per_step < 1:
        raise ValueError(f"peers_per_step must be >= 1, got {peers_per_step}")
    if phases == 0:  # a single node has nobody to talk to
        return GossipPlan(step, world_size, (), 1.0)
    if peers_per_step > phases:
        raise ValueError(
            f"peers_per_step={peers_per_step} exceeds the {phases} distinct exponential-graph "
            f"peers of world_size {world_size}; valid values are 1..{phases}"
        )
    offsets = tuple(2 ** ((step * peers_per_step + r) % phases) for r in range(peers_per_step))
    return GossipPlan(step, world_size, offsets, 1.0 / (peers_per_step + 1))


def mixing_matrix(p: GossipPlan, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Column-stochastic P with x_new = P @ x: P[i, i] = weight, P[(j+o) % K, j] = weight."""
    k = p.world_size
    m = torch.zeros(k, k, dtype=dtype)
    idx = torch.arange(k)
    m[idx, idx] = p.weight
    for o in p.offsets:
        m[(idx + o) % k, idx] += p.weight
    return m


@torch.no_grad()
def mix_(z: torch.Tensor, ps_weight: torch.Tensor, p: GossipPlan) -> None:
    """One push-sum round in place on a stack z [K, n] of de-biased parameters and the push-sum
    weights ps_weight [K]: x = z * w, mix x and w with the plan, z = x / w."""
    if z.dim() != 2 or z.shape[0] != p.world_size or ps_weight.shape != (p.world_size,):
        raise ValueError(
            f"expected z of shape [{p.world_size}, n] and ps_weight of shape [{p.world_size}], "
            f"got {tuple(z.shape)} and {tuple(ps_weight.shape)}"
        )
    if not p.offsets:
        return
    x = z * ps_weight[:, None]
    new_x = x * p.weight
    new_w = ps_weight * p.weight
    for o in p.offsets:
        # node i receives from i - o: rolling by +o moves row i - o to row i
        new_x += torch.roll(x, shifts=o, dims=0) * p.weight
        new_w += torch.roll(ps_weight, shifts=o, dims=0) * p.weight
    ps_weight.copy_(new_w)
    z.copy_(new_x / new_w[:, None])
