"""DistributedCommunicator.gossip posts its sends and receives together (batch_isend_irecv) and
still equals the replica engine's gossip (ReplicaCommunicator / gossip.mix_) round for round.

One spawn of 4 gloo CPU processes; 1 and 2 peers per round, starting from unequal push-sum
weights (the uniform exponential graph keeps equal weights equal, so unequal ones exercise the
de-biasing), then a push-sum average -- float64, so the two layouts agree to rounding.
"""

import torch
from torch import nn

from localsgd.distributed import spawn
from localsgd.engines.replica_stack import ReplicaCommunicator
from localsgd.topology import Topology

K, ROUNDS = 4, 6


def model_fn(rank: int) -> nn.Module:
    torch.manual_seed(100 + rank)  # every worker starts elsewhere: gossip has something to mix
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()


def weight0(rank: int) -> float:
    return 0.5 + 0.25 * rank


def _distributed(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from localsgd.averaging import DistributedCommunicator

    calls = {"batch": 0}
    original = dist.batch_isend_irecv

    def counting(ops):
        calls["batch"] += 1
        assert all(isinstance(op, dist.P2POp) for op in ops)
        return original(ops)

    dist.batch_isend_irecv = counting
    out = {}
    try:
        for peers in (1, 2):
            comm = DistributedCommunicator(Topology.from_paper(world, local_steps=2),
                                           model_fn(rank), peers_per_step=peers)
            comm.ps_weight = weight0(rank)
            rounds = []
            for step in range(1, ROUNDS + 1):
                comm.gossip(step)
                rounds.append((comm.flat_params().clone(), comm.ps_weight))
            comm.average(0)
            out[peers] = {"rounds": rounds, "averaged": comm.flat_params().clone(),
                          "ps_weight": comm.ps_weight}
    finally:
        dist.batch_isend_irecv = original
    out["batch_calls"] = calls["batch"]
    return out


def test_distributed_gossip_matches_replica_gossip():
    got = spawn(_distributed, K)
    for rank in range(K):
        # one batched post per round, for each of the two peer counts
        assert got[rank]["batch_calls"] == 2 * ROUNDS
    for peers in (1, 2):
        comm = ReplicaCommunicator(Topology.from_paper(K, local_steps=2),
                                   [model_fn(r) for r in range(K)], peers_per_step=peers)
        comm.ps_weight.copy_(torch.tensor([weight0(r) for r in range(K)]))
        for step in range(1, ROUNDS + 1):
            comm.gossip(step)
            for rank in range(K):
                flat, w = got[rank][peers]["rounds"][step - 1]
                torch.testing.assert_close(flat, comm.packed()[rank], rtol=0, atol=1e-12)
                assert abs(w - float(comm.ps_weight[rank])) < 1e-12
        # push-sum preserves the total weight
        total = sum(got[r][peers]["rounds"][-1][1] for r in range(K))
        assert abs(total - sum(weight0(r) for r in range(K))) < 1e-12
        comm.average(0)
        for rank in range(K):
            torch.testing.assert_close(got[rank][peers]["averaged"], comm.packed()[rank], rtol=0,
                                       atol=1e-12)
            assert abs(got[rank][peers]["ps_weight"] - float(comm.ps_weight[rank])) < 1e-12
