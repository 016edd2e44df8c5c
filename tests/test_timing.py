"""Eq. (6) of Appendix B and the Table 3 synchronization counts."""

import math

import pytest

from localsgd.timing.comm import ClusterShape, comm_cost_eq6, schedule_sync_counts, sync_rounds


def test_eq6_by_hand():
    shape = ClusterShape.parse("4x4")
    # N/(K B H) = 1024/(16*4*2) = 8 rounds, N/(K B H Hb) = 2 global ones, 6 inside servers
    cost = comm_cost_eq6(1024, shape, batch=4, local_steps=2, block_steps=4,
                         c_intra=1.0, c_inter=10.0)
    assert cost == pytest.approx(6 * 1.0 * 4 * math.log2(4) + 2 * 10.0 * math.log2(16))


def test_eq6_rounds_use_ceil_and_hb1_has_no_block_rounds():
    assert sync_rounds(1000, 16, 4, 2, 4) == (8 - 2, 2)  # ceil(7.8)=8, ceil(1.95)=2
    assert sync_rounds(1024, 16, 4, 2, 1)[0] == 0


@pytest.mark.parametrize("text", ["8x2", "4x4", "2x8"])
@pytest.mark.parametrize("h", [1, 2, 4, 8, 16])
def test_schedule_counts_match_table3_and_eq6(text, h):
    shape = ClusterShape.parse(text)
    hb = 16 // h
    counts = schedule_sync_counts(shape, h, hb, steps=16)
    assert counts == {"within_server": hb - 1, "global": 1}  # Table 3's "# of sync." rows
    # over a longer run the schedule's counts equal eq. (6)'s ceil-terms
    steps = 160
    block, glob = sync_rounds(steps * 16 * 8, 16, 8, h, hb)
    assert schedule_sync_counts(shape, h, hb, steps) == {"within_server": block,
                                                                 "global": glob}


def test_bad_shapes_raise_clearly():
    with pytest.raises(ValueError, match="SERVERSxGPUS"):
        ClusterShape.parse("eight-by-two")
    with pytest.raises(ValueError, match="servers=0"):
        ClusterShape(0, 2)
    with pytest.raises(ValueError, match="local_steps=0"):
        sync_rounds(10, 2, 1, 0, 1)
