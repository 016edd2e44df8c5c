"""SGP push-sum gossip on the time-varying exponential graph."""

import pytest
import torch

from localsgd.gossip import mix_, mixing_matrix, num_phases, plan


def test_one_peer_exponential_graph():
    assert num_phases(8) == 3 and num_phases(6) == 3 and num_phases(2) == 1 and num_phases(1) == 0
    # node i sends to (i + 2^(t mod log2 K)) mod K
    for t in range(6):
        p = plan(t, 8)
        assert p.offsets == (2 ** (t % 3),) and p.weight == 0.5
        assert p.send_to(7) == [(7 + 2 ** (t % 3)) % 8]
        assert all(i in p.recv_from(j) for i in range(8) for j in p.send_to(i))
    assert plan(1, 8, peers_per_step=2).offsets == (4, 1)
    assert plan(1, 8, peers_per_step=2).weight == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match=r"peers_per_step=4 exceeds .* valid values are 1..3"):
        plan(0, 8, peers_per_step=4)


@pytest.mark.parametrize(("k", "peers"), [(8, 1), (6, 1), (6, 2), (5, 3)])
def test_push_sum_preserves_mass_and_matches_matrix(k, peers):
    gen = torch.Generator().manual_seed(k)
    z = torch.randn(k, 7, generator=gen, dtype=torch.float64)
    w = torch.ones(k, dtype=torch.float64)
    total = (z * w[:, None]).sum(0)
    for t in range(10):
        p = plan(t, k, peers)
        m = mixing_matrix(p)
        assert torch.allclose(m.sum(0), torch.ones(k, dtype=torch.float64))  # column stochastic
        expected = m @ (z * w[:, None])
        mix_(z, w, p)
        assert torch.allclose(z * w[:, None], expected)
        assert w.sum().item() == pytest.approx(k)  # push-sum weights sum to K
        assert torch.allclose((z * w[:, None]).sum(0), total)  # the average of x is preserved


def test_power_of_two_reaches_exact_consensus_in_log2_k_rounds():
    z = torch.arange(8, dtype=torch.float64)[:, None].repeat(1, 3)
    w = torch.ones(8, dtype=torch.float64)
    for t in range(3):
        mix_(z, w, plan(t, 8))
    assert torch.allclose(z, torch.full_like(z, 3.5))


def test_repeated_gossip_converges_with_unequal_weights():
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    w = torch.rand(6, generator=gen, dtype=torch.float64) + 0.5
    target = (z * w[:, None]).sum(0) / w.sum()  # push-sum de-biased consensus
    for t in range(80):
        mix_(z, w, plan(t, 6))
    assert torch.allclose(z, target.expand_as(z), atol=1e-9)
