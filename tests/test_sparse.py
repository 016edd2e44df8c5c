"""Sparse averages (localsgd.sparse through localsgd.compression): what each code keeps, its
bytes, error feedback sending the rest later, the all-gather over four gloo processes equal to
the replica engines' one-process arithmetic, training runs that resume bitwise, and bad input."""

from __future__ import annotations

import math

import pytest
import torch
from test_compression import _records, _tiny  # the same tiny hierarchical run

from localsgd import compression as cp
from localsgd import sparse as sp
from localsgd.distributed import spawn

SHAPES = {"conv 4-D": (16, 3, 3, 3), "linear 2-D": (10, 70), "batchnorm 1-D": (13,),
          "scalar": (), "empty": (0,)}


def _x(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    # magnitudes over six decades, and a tie (two equal magnitudes) where the tensor is large
    x = torch.randn(shape, generator=g) * 10.0 ** torch.randint(-4, 2, shape, generator=g)
    if x.numel() > 4:
        x.view(-1)[3] = -x.view(-1)[1]
    return x


@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_topk_keeps_the_largest_magnitudes_exactly(shape):
    x = _x(shape)
    for fmt, block, density in (("topk", 32, 0.1), ("chunk-topk", 32, 0.1),
                                ("chunk-topk", 8, 0.3)):
        e = cp.encode(x, fmt, block, density=density)
        out = cp.decode(e)
        assert out.shape == x.shape and out.dtype == torch.float32
        flat, got = x.reshape(-1), out.reshape(-1)
        n = flat.numel()
        groups = [(0, n)] if fmt == "topk" else [(s, min(n, s + block))
                                                for s in range(0, n, block)]
        for lo, hi in groups:
            part, sent = flat[lo:hi], got[lo:hi]
            k = min(hi - lo, math.ceil(density * (n if fmt == "topk" else block) - 1e-9))
            kept = sent != 0
            assert int(kept.sum()) == k or (part == 0).any()
            assert torch.equal(sent[kept], part[kept])  # kept entries travel exact
            if kept.any() and (~kept).any():  # nothing dropped outweighs what was kept
                assert part[~kept].abs().max() <= part[kept].abs().min()
        assert e.nbytes == sp.message_bytes(n, fmt, block, density)


@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_randk_sends_the_seeded_entries_and_sign_the_block_means(shape):
    x = _x(shape)
    n = x.numel()
    a = cp.decode(cp.encode(x, "randk", density=0.2, seed=7)).reshape(-1)
    b = cp.decode(cp.encode(x + 1.0, "randk", density=0.2, seed=7)).reshape(-1)
    kept = a != 0
    assert int(kept.sum()) == (math.ceil(0.2 * n - 1e-9) if n else 0)
    assert torch.equal(a[kept], x.reshape(-1)[kept])
    assert torch.equal(b != 0, (x.reshape(-1) + 1.0 != 0) & kept) or n == 0  # same seed: same
    if n > 20:  # entries; another seed draws others
        c = cp.decode(cp.encode(x, "randk", density=0.2, seed=8)).reshape(-1)
        assert not torch.equal(c != 0, kept)
    e = cp.encode(x, "sign", 8)
    out = cp.decode(e).reshape(-1)
    flat = x.reshape(-1)
    for lo in range(0, n, 8):
        part = flat[lo:lo + 8]
        mean = part.abs().mean()
        assert torch.allclose(out[lo:lo + 8].abs(), mean.expand_as(part), rtol=1e-6)
        assert ((out[lo:lo + 8] >= 0) == (part >= 0)).all()
    assert e.nbytes == sp.message_bytes(n, "sign", 8, 0.01) == math.ceil(n / 8) + 4 * max(
        1, math.ceil(n / 8))


def test_a_nan_stays_visible():
    x = torch.ones(64)
    x[5] = float("nan")
    assert cp.decode(cp.encode(x, "topk", density=0.02)).isnan().any()
    assert cp.decode(cp.encode(x, "chunk-topk", 16, density=0.1)).isnan().any()
    assert cp.decode(cp.encode(x, "sign", 16))[:16].isnan().all()


@pytest.mark.parametrize("fmt", sp.SPARSE_FORMATS)
def test_error_feedback_sends_everything_later(fmt):
    # the same change every round: 2 % of the entries a round cannot carry it, but with feedback
    # the sum sent trails the sum of the values by the last residual only
    g = torch.Generator().manual_seed(1)
    delta = torch.linspace(0.01, 1.0, 500)
    ef = cp.ErrorFeedback(fmt, block=50, density=0.02)
    plain = cp.ErrorFeedback(fmt, block=50, density=0.02, carry=False)
    sent_ef, sent_plain, exact = torch.zeros(500), torch.zeros(500), torch.zeros(500)
    rounds = 300
    for _ in range(rounds):
        x = delta + 1e-3 * torch.randn(500, generator=g)
        exact += x
        sent_ef += cp.decode(ef.encode("w", x))
        sent_plain += cp.decode(plain.encode("w", x))
    assert torch.allclose(sent_ef + ef.residuals["w"], exact, atol=1e-3)
    assert ef.rounds == plain.rounds == {"w": rounds} and not plain.residuals
    if fmt == "randk":  # an entry's residual is what it gathered since it was last drawn
        last = cp.decode(cp.encode(torch.ones(500), fmt, 50, density=0.02,
                                   seed=sp.round_seed("w", rounds - 1))) != 0
        assert (ef.residuals["w"][last] == 0).all() and (ef.residuals["w"][~last] != 0).all()
    else:  # the residual stays bounded (what is left out is sent later, not piled up) ...
        assert float(ef.residuals["w"].abs().max()) < 0.2 * rounds * float(delta.max())
    # ... and without it the error grows with the rounds
    assert float((sent_plain - exact).abs().max()) > 0.5 * rounds * 0.01


# every sparse format in blocks of 64, and chunk-topk in blocks of 512 (int16 indices)
GATHERED = [(fmt, 64) for fmt in sp.SPARSE_FORMATS] + [("chunk-topk", 512)]


def _gathered(rank: int, world: int):
    out = {}
    for fmt, block in GATHERED:  # one process group for all: a spawn costs seconds
        g = torch.Generator().manual_seed(100 + rank)  # every rank its own values
        values = [torch.randn(1000, generator=g) for _ in range(3)]
        ef = cp.ErrorFeedback(fmt, block=block, density=0.03)
        avgs, sent = [], []
        for x in values:  # three rounds: random-k's indices and the residuals move on
            y = [x[:600].reshape(20, 30).clone(), x[600:].clone()]
            sent.append(cp.compressed_average(y, fmt, block=block, density=0.03, feedback=ef))
            avgs.append(torch.cat([t.reshape(-1) for t in y]))
        out[fmt, block] = (values, avgs, sent)
    return out


def test_the_all_gather_over_four_processes_is_the_replica_engines_average():
    ranks = spawn(_gathered, 4)
    for fmt, block in GATHERED:
        res = [r[fmt, block] for r in ranks]
        for _, out, sent in res[1:]:  # every rank ends with bitwise the same average
            assert all(torch.equal(a, b) for a, b in zip(out, res[0][1], strict=True)), fmt
            assert sent == res[0][2]
        # mean_of_rows, what the replica engines compute in one process, gives the same bits
        fbs = [cp.ErrorFeedback(fmt, block=block, density=0.03) for _ in range(4)]
        for i in range(3):
            rows = torch.stack([r[0][i] for r in res])
            assert torch.equal(cp.mean_of_rows(rows, fmt, block, fbs), res[0][1][i]), (fmt, i)
        # bytes: P - 1 messages out, what wire_bytes prices as an all-reduce of P m / 2 bytes
        m = sp.message_bytes(1000, fmt, block, 0.03)
        assert res[0][2] == [3 * m] * 3, fmt
        assert cp.wire_bytes(1000, fmt, 4, block, 0.03) == 2 * m


def test_the_timing_model_prices_the_all_gather():
    from localsgd.timing.cluster import Cluster
    from localsgd.timing.simulate import simulate, wire_ratio

    x = torch.randn(256 * 400)
    for fmt in sp.SPARSE_FORMATS:  # two ranks: the message itself; more: a growing share
        e = cp.encode(x, fmt, density=0.02)
        assert wire_ratio(fmt, density=0.02) == pytest.approx(e.nbytes / (4 * x.numel()),
                                                              rel=1e-3), fmt
        assert wire_ratio(fmt, density=0.02, group=16) == pytest.approx(
            8 * wire_ratio(fmt, density=0.02))
    args = {"workers": 16, "cluster": Cluster(gpus_per_node=4, inter_gbps=1.0), "steps": 64,
            "model_mb": 45.0}
    runs = {f: simulate(["local:4", "hsgd:2-4,4-16"], average_compression=f,
                        compression_density=0.01, **args).set_index("scheme")
            for f in ("fp32", "int8", "topk")}
    # top-1 %: 8 bytes a kept entry, all-gathered by 16 = 0.16 of fp32's ring all-reduce
    assert runs["topk"].loc["local:4", "bytes_mb"] == pytest.approx(
        runs["fp32"].loc["local:4", "bytes_mb"] * 0.16, rel=1e-6)
    assert (runs["topk"]["seconds"] < runs["int8"]["seconds"]).all()
    with pytest.raises(ValueError, match=r"compression_density=0: must be a fraction in \(0, 1\]"):
        wire_ratio("topk", density=0)


def test_bad_sparse_settings_are_one_line():
    from localsgd.training.config import TrainConfig

    for bad in (0, 0.0, 1.5, -0.1, True):
        with pytest.raises(ValueError, match=r"density=.*: must be a fraction in \(0, 1\]"):
            cp.encode(torch.ones(4), "topk", density=bad)
        with pytest.raises(ValueError, match=r"compression_density=.*: must be a fraction"):
            TrainConfig(average_compression="topk", compression_density=bad)
    # random-k's indices come from the run's seed and the level: another seed, other entries
    draws = [cp.Compression("randk", density=0.1, seed=s).new_feedback(lv).encode("a",
             torch.ones(500)) for s, lv in ((0, 0), (0, 1), (1, 0), (0, 0))]
    picked = [cp.decode(d) != 0 for d in draws]
    assert torch.equal(picked[0], picked[3]) and not torch.equal(picked[0], picked[1])
    assert not torch.equal(picked[0], picked[2])
    with pytest.raises(ValueError, match="block=65536: sparse codes index within blocks"):
        cp.Compression("chunk-topk", block=65536)
    with pytest.raises(ValueError, match=r"feedback encodes topk .*density 0.01.*density 0.5"):
        cp.compressed_average([torch.ones(4)], "topk", density=0.5,
                              feedback=cp.ErrorFeedback("topk"))
    assert TrainConfig(average_compression="sign").average_compression == "sign"


# ---- in training: TrainConfig.average_compression = topk / randk / sign ----------------------

def test_a_random_k_run_resumes_bitwise_and_the_engines_agree(tmp_path):
    from localsgd.training.loop import RunLimit

    cfg = _tiny(average_compression="randk", compression_density=0.05)
    whole = _records(cfg)
    ckpt = tmp_path / "run.pt"
    # 8 updates, averages at 2, 4, 6, 8; cut at 5: the rounds that seed the indices and the
    # residuals are in the checkpoint, so the resumed run draws the same entries
    _records(cfg, checkpoint_path=ckpt, checkpoint_every_steps=3, limit=RunLimit(updates=5))
    assert _records(cfg, checkpoint_path=ckpt).equals(whole)
    batched = _records(_tiny(average_compression="randk", compression_density=0.05,
                             batched=True, packed=False))
    for c in (c for c in whole.columns if c not in ("batched", "packed")):
        if whole[c].dtype.kind == "f":
            assert ((whole[c] - batched[c]).abs() <= 1e-9 * (1 + batched[c].abs())).all(), c
        else:
            assert whole[c].equals(batched[c]), c
    # each format is another run, and the density is part of it
    others = [_records(_tiny(average_compression=f)).test_loss for f in ("topk", "sign")]
    assert not any(o.equals(whole.test_loss) for o in others)
    assert not others[0].equals(_records(_tiny(average_compression="topk",
                                               compression_density=0.5)).test_loss)
