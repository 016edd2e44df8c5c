"""Sparse codes for averages: top-k, chunked top-k, random-k and scaled sign, for a tensor of any
shape (flattened), meant to be sent with error feedback (`localsgd.compression.ErrorFeedback`).

Beyond the sources: the 2025-26 low-communication peers send 1-3 % of an outer gradient's
entries (SparseLoCo: chunked top-k; DeMo: top-k of DCT chunks; SPARTA: random entries) and keep
what was not sent in an error-feedback buffer, as EF-SGD does for scaled sign (Karimireddy et
al. 2019, "Error Feedback Fixes SignSGD", Algorithm 1, with the l1 / d scale taken per block).

With ``n`` values, density ``d`` (0 < d <= 1) and blocks of ``block`` values:

* ``topk``: the k = ceil(d n) entries of largest magnitude, exact (fp32), int32 indices;
  8 bytes an entry. A dropped entry is at most the smallest kept magnitude.
* ``chunk-topk``: in every block the ceil(d block) entries of largest magnitude (the last,
  shorter block keeps as many, at most its length); indices within the block as uint8 (block
  <= 256) or int16; 5 or 6 bytes an entry.
* ``randk``: k = ceil(d n) entries drawn uniformly without replacement by a generator seeded
  from ``seed``: every rank that passes the same seed draws the same indices, so only the
  values travel (4 bytes an entry). No rescaling by n / k: with error feedback the rest is sent
  later instead of being estimated now.
* ``sign``: one bit per value (x >= 0) and a float32 scale per block, its mean magnitude (the
  l1 norm over the block's length); a value decodes to +-scale. n / 8 bytes plus 4 per block.

Ties among equal magnitudes go to the lower index (a stable sort), so every engine keeps the
same entries. Non-finite values stay visible: a NaN is kept by top-k (it sorts first) and turns
its block's sign scale into NaN.

Sparse codes are averaged by an all-gather of every rank's codes (each rank sums them in rank
order: every rank ends with bitwise the same average), not by the two-phase reduce-scatter the
quantisers use: the ranks' entries differ, and re-sparsifying a sum of P sparse vectors would
drop what no residual keeps. An all-gather of m bytes per rank over P ranks moves (P - 1) m
bytes per rank, what a ring all-reduce of P m / 2 bytes moves (`equivalent_bytes`).
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Hashable
from dataclasses import dataclass

import torch

__all__ = ["DENSITY", "SPARSE_FORMATS", "SparseCodes", "decode_sparse", "encode_sparse",
           "equivalent_bytes", "keep_count", "message_bytes", "round_seed"]

SPARSE_FORMATS = ("topk", "chunk-topk", "randk", "sign")
DENSITY = 0.01  # SparseLoCo and DeMo send 1-3 % of the entries


def keep_count(n: int, density: float) -> int:
    """k = ceil(density n): how many of ``n`` values a top-k or random-k code keeps."""
    if isinstance(density, bool) or not isinstance(density, (int, float)) or not (
            0.0 < density <= 1.0):
        raise ValueError(f"density={density!r}: must be a fraction in (0, 1] (the share of "
                         "entries sent; k = ceil(density n) >= 1)")
    return min(n, max(1, math.ceil(density * n - 1e-9)))  # 1e-9: 0.01 * 300 is 3.0000000000000004


def _index_dtype(block: int) -> torch.dtype:
    return torch.uint8 if block <= 256 else torch.int16


def round_seed(key: Hashable, round_: int) -> int:
    """The seed random-k draws its indices from at the ``round_``-th average under ``key``: the
    same on every rank and process (crc32 of the key's repr, not Python's salted hash)."""
    return (zlib.crc32(repr(key).encode()) << 24) + round_


@dataclass(frozen=True)
class SparseCodes:
    """One tensor's sparse codes: ``indices`` (None for randk, which rebuilds them from
    ``seed``, and for sign), ``values`` (float32 kept values; sign: the packed bits as uint8),
    ``scales`` (sign's per-block scales), the format, the original shape and length, block,
    density and seed."""

    fmt: str
    indices: torch.Tensor | None
    values: torch.Tensor
    scales: torch.Tensor | None
    shape: tuple[int, ...]
    numel: int
    block: int
    density: float
    seed: int

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: indices, values (or bits) and scales."""
        return sum(t.numel() * t.element_size() for t in (self.indices, self.values, self.scales)
                   if t is not None)


def message_bytes(n: int, fmt: str, block: int, density: float) -> int:
    """`SparseCodes.nbytes` of ``n`` values, without encoding them."""
    if fmt == "sign":
        return math.ceil(n / 8) + 4 * math.ceil(max(1, n) / block)
    if fmt == "chunk-topk":
        full, rest = divmod(n, block)
        per = keep_count(block, density)
        kept = full * per + (min(rest, per) if rest else 0)
        return kept * (4 + torch.empty(0, dtype=_index_dtype(block)).element_size())
    k = keep_count(n, density) if n else 0
    return k * (4 if fmt == "randk" else 8)


def equivalent_bytes(n: int, fmt: str, world: int, block: int, density: float) -> int:
    """The payload of a ring all-reduce that moves what the all-gather of ``world`` ranks'
    codes of ``n`` values moves: world m / 2 for m bytes a rank (the module docstring)."""
    return math.ceil(world * message_bytes(n, fmt, block, density) / 2)


def encode_sparse(x: torch.Tensor, fmt: str, block: int, density: float,
                  seed: int = 0) -> SparseCodes:
    """``x`` (any shape, any float dtype) as ``fmt`` codes (the module docstring)."""
    flat = x.detach().reshape(-1).to(torch.float32)
    n = flat.numel()
    shape = tuple(x.shape)
    if fmt == "sign":
        blocks = math.ceil(max(1, n) / block)
        padded = torch.zeros(blocks * block, dtype=torch.float32, device=flat.device)
        padded[:n] = flat
        lengths = torch.full((blocks,), float(block), device=flat.device)
        lengths[-1] = n - (blocks - 1) * block if n else block
        scales = padded.view(blocks, block).abs().sum(1) / lengths
        bits = torch.zeros(math.ceil(blocks * block / 8) * 8, dtype=torch.uint8,
                           device=flat.device)
        bits[:n] = (flat >= 0) | torch.isnan(flat)  # NaN: + (its scale is NaN anyway)
        weights = (2 ** torch.arange(8, device=flat.device)).to(torch.uint8)
        packed = (bits.view(-1, 8) * weights).sum(1, dtype=torch.uint8)[:math.ceil(n / 8)]
        return SparseCodes(fmt, None, packed, scales, shape, n, block, density, seed)
    if fmt == "chunk-topk":
        blocks = math.ceil(max(1, n) / block)
        per = keep_count(block, density)
        padded = torch.full((blocks * block,), -1.0, device=flat.device)  # padding: never kept
        mags = flat.abs().nan_to_num(nan=math.inf)
        padded[:n] = mags
        order = torch.argsort(padded.view(blocks, block), dim=1, descending=True, stable=True)
        idx = order[:, :per]
        pos = (idx + torch.arange(blocks, device=flat.device)[:, None] * block).reshape(-1)
        keep = pos < n  # a short last block keeps only its own entries
        pos, idx = pos[keep], idx.reshape(-1)[keep]
        return SparseCodes(fmt, idx.to(_index_dtype(block)), flat[pos].contiguous(), None,
                           shape, n, block, density, seed)
    k = keep_count(max(1, n), density)
    if n == 0:
        return SparseCodes(fmt, None if fmt == "randk" else torch.zeros(0, dtype=torch.int32),
                           flat.clone(), None, shape, n, block, density, seed)
    if fmt == "randk":
        pos = _random_positions(n, k, seed, flat.device)
        return SparseCodes(fmt, None, flat[pos].contiguous(), None, shape, n, block, density,
                           seed)
    mags = flat.abs().nan_to_num(nan=math.inf)
    pos = torch.argsort(mags, descending=True, stable=True)[:k].sort().values
    return SparseCodes(fmt, pos.to(torch.int32), flat[pos].contiguous(), None, shape, n, block,
                       density, seed)


def _random_positions(n: int, k: int, seed: int, device: torch.device) -> torch.Tensor:
    return _drawn(n, k, seed).to(device)


@functools.lru_cache(maxsize=8)  # an average decodes every rank's codes of one draw
def _drawn(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)  # on the CPU: the same draw on every device
    return torch.randperm(n, generator=g)[:k].sort().values


def decode_sparse(e: SparseCodes) -> torch.Tensor:
    """The float32 tensor ``e`` encodes, in its original shape (zeros where nothing was sent)."""
    device = e.values.device
    if e.fmt == "sign":
        weights = (2 ** torch.arange(8, device=device)).to(torch.uint8)
        bits = (e.values[:, None] & weights).ne(0).reshape(-1)[:e.numel]
        scale = e.scales.repeat_interleave(e.block)[:e.numel]
        return torch.where(bits, scale, -scale).reshape(e.shape)
    out = torch.zeros(e.numel, dtype=torch.float32, device=device)
    if e.numel == 0:
        return out.reshape(e.shape)
    if e.fmt == "randk":
        pos = _random_positions(e.numel, e.values.numel(), e.seed, device)
    elif e.fmt == "chunk-topk":
        per = keep_count(e.block, e.density)
        blocks = math.ceil(e.numel / e.block)
        starts = torch.arange(blocks, device=device).repeat_interleave(per) * e.block
        starts = starts[:e.indices.numel()]  # the short last block's missing entries are last
        pos = starts + e.indices.to(torch.int64)
    else:
        pos = e.indices.to(torch.int64)
    out[pos] = e.values
    return out.reshape(e.shape)
