"""Compressed averaging: the averaged quantity (a model, a model delta, an outer gradient) sent
as bf16, fp16, fp8 (e4m3), int8 or 4-bit codes, or as the sparse codes of `localsgd.sparse`
(top-k, chunked top-k, random-k, scaled sign), for a tensor of any shape, with optional error
feedback.

Every tensor is flattened, so convolution (4-D), linear (2-D) and BatchNorm (1-D) tensors and
scalars are encoded alike (no "2-D only" restriction). All formats but ``fp32`` and ``bf16``
(which keeps fp32's range) scale each block of `BLOCK` values by its largest magnitude, so that
one large value costs precision in its block only. The error of one encode, per element x
with block scale s (tests/test_compression.py checks each bound):

* ``bf16``: |x' - x| <= 2^-8 |x| (8 significant bits, round to nearest);
* ``fp16``: the block's largest magnitude maps to 2^14; |x' - x| <= 2^-11 |x| + 2^-25 s;
* ``fp8`` (OCP e4m3, largest 448): |x' - x| <= 2^-4 |x| + 2^-10 s;
* ``int8``: codes -127 ... 127, s = max|x| / 127; |x' - x| <= s / 2;
* ``int4``: codes -7 ... 7, two to a byte, s = max|x| / 7; |x' - x| <= s / 2.

`ErrorFeedback` adds what the last encode of a tensor left out to its next value (Seide et al.
2014; Karimireddy et al. 2019, EF-SGD): the sum of what was sent then trails the sum of the
values by one residual only, instead of by an error that grows with the number of syncs. In
`compressed_average` it covers each rank's own codes; the second encode (of the averaged chunk,
shared by every rank) has no residual, so its error is not carried over.

A value that is not finite (inf, NaN) turns its whole block into NaN in the scaled formats, and
after an average on every rank: a diverged worker shows at once. Bounds hold for normal floats
(bf16's relative bound not for float32 subnormals).

In training (`Compression`, `TrainConfig.average_compression`) what travels is each worker's
change since its group's last average at that level (the reference, the same on every member:
the average it then took), as DiLoCo sends outer gradients; the new model is the reference plus
the averaged change, so a format's error touches the change, not the weights. The replica
engines compute it in one process (`mean_of_rows`) with the arithmetic of `compressed_average`
on a process group, so both engines give the same run (tests/test_ddp.py).

`compressed_average` averages tensors over a process group with the codes on the wire, never
dequantised before a collective: a reduce-scatter as an all-to-all of each rank's encoded
chunks (each rank decodes and averages its chunk), then an all-gather of the encoded averaged
chunks. Each rank sends 2 (P - 1) / P of the encoded bytes, against 2 (P - 1) / P of fp32's
4 bytes a value for a ring all-reduce: int8 sends 1/4 of fp32's bytes plus its scales (4 bytes a
block, 1/64 of the codes at blocks of 256). Every rank decodes the same gathered codes, so all
end with bitwise the same average. Sparse codes travel by one all-gather instead, with no second
encode (`localsgd.sparse`, its docstring says why and what that costs).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from localsgd.sparse import (
    DENSITY,
    SPARSE_FORMATS,
    SparseCodes,
    decode_sparse,
    encode_sparse,
    equivalent_bytes,
    keep_count,
    round_seed,
)

__all__ = ["BLOCK", "DENSE_FORMATS", "FORMATS", "Compression", "Encoded", "ErrorFeedback",
           "compressed_average", "decode", "encode", "mean_of_rows", "wire_bytes"]

DENSE_FORMATS = ("fp32", "bf16", "fp16", "fp8", "int8", "int4")
FORMATS = DENSE_FORMATS + SPARSE_FORMATS
BLOCK = 256  # values per scale: 4 bytes of scale per 256 codes
# the code a block's largest magnitude maps to, per scaled format
_TOP = {"fp16": 2.0 ** 14, "fp8": 448.0, "int8": 127.0, "int4": 7.0}
_CAST = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
         "fp8": torch.float8_e4m3fn}


@dataclass(frozen=True)
class Encoded:
    """One tensor's codes: ``payload`` (uint8 bytes as sent), per-block ``scales`` (float32;
    None for fp32 and bf16), the format, and the original shape and length."""

    fmt: str
    payload: torch.Tensor
    scales: torch.Tensor | None
    shape: tuple[int, ...]
    numel: int
    block: int

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: codes plus scales."""
        scales = 0 if self.scales is None else self.scales.numel() * 4
        return self.payload.numel() + scales


def _check(fmt: str, block: int, density: float = DENSITY) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}; valid: {', '.join(FORMATS)}")
    if isinstance(block, bool) or not isinstance(block, int) or block < 2 or block % 2:
        raise ValueError(f"block={block!r}: must be an even integer >= 2 (int4 packs two "
                         "codes to a byte)")
    if fmt in SPARSE_FORMATS:
        keep_count(1, density)  # one line if density is not in (0, 1]
        if block > 32768:
            raise ValueError(f"block={block}: sparse codes index within blocks of at most "
                             "32768 values (int16)")


def encode(x: torch.Tensor, fmt: str, block: int = BLOCK, *, density: float = DENSITY,
           seed: int = 0) -> Encoded | SparseCodes:
    """``x`` (any shape, any float dtype) as ``fmt`` codes, scaled per ``block`` values; the
    sparse formats keep ``density`` of the entries (random-k draws them from ``seed``)."""
    _check(fmt, block, density)
    if fmt in SPARSE_FORMATS:
        return encode_sparse(x, fmt, block, density, seed)
    flat = x.detach().reshape(-1).to(torch.float32)
    n = flat.numel()
    if fmt in ("fp32", "bf16"):
        codes = flat.to(_CAST[fmt]).contiguous()
        if codes.data_ptr() == x.data_ptr():  # fp32 of fp32: the codes must not alias x
            codes = codes.clone()
        return Encoded(fmt, codes.view(torch.uint8), None, tuple(x.shape), n, block)
    padded = torch.zeros(max(1, math.ceil(n / block)) * block, dtype=torch.float32,
                         device=flat.device)
    padded[:n] = flat
    blocks = padded.view(-1, block)
    scales = blocks.abs().amax(dim=1) / _TOP[fmt]
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))  # an all-zero block: codes 0
    scaled = blocks / safe[:, None]
    if fmt in ("fp16", "fp8"):
        payload = scaled.to(_CAST[fmt]).contiguous().view(torch.uint8).reshape(-1)
    else:
        top = int(_TOP[fmt])
        codes = scaled.round().clamp(-top, top).to(torch.int16)
        if fmt == "int8":
            payload = codes.to(torch.int8).view(torch.uint8).reshape(-1)
        else:  # int4: code + 8 in 1..15, two to a byte (low nibble first)
            nibbles = (codes + 8).to(torch.uint8).reshape(-1, 2)
            payload = nibbles[:, 0] | (nibbles[:, 1] << 4)
    return Encoded(fmt, payload, scales, tuple(x.shape), n, block)


def decode(e: Encoded | SparseCodes) -> torch.Tensor:
    """The float32 tensor ``e`` encodes, in its original shape."""
    if isinstance(e, SparseCodes):
        return decode_sparse(e)
    if e.fmt in ("fp32", "bf16"):
        values = e.payload.view(_CAST[e.fmt]).to(torch.float32)
    else:
        if e.fmt in ("fp16", "fp8"):
            scaled = e.payload.view(_CAST[e.fmt]).to(torch.float32)
        elif e.fmt == "int8":
            scaled = e.payload.view(torch.int8).to(torch.float32)
        else:
            low = (e.payload & 0x0F).to(torch.int16) - 8
            high = (e.payload >> 4).to(torch.int16) - 8
            scaled = torch.stack([low, high], dim=1).reshape(-1).to(torch.float32)
        values = (scaled.view(-1, e.block) * e.scales[:, None]).reshape(-1)
    return values[:e.numel].reshape(e.shape)


class ErrorFeedback:
    """Per-tensor residuals: `encode` sends value + residual and keeps what the codes left out
    (residual = sent value - its decode), so nothing is lost, only delayed. With ``carry``
    False it keeps no residual (plain codes) and only counts the rounds per key, which seed
    random-k's indices (`localsgd.sparse.round_seed`): one per worker, all in step."""

    def __init__(self, fmt: str, block: int = BLOCK, *, density: float = DENSITY,
                 carry: bool = True, salt: Hashable = None) -> None:
        _check(fmt, block, density)
        self.fmt, self.block, self.density, self.carry = fmt, block, density, carry
        self.salt = salt  # folded into random-k's seed: a run seed and level draw their own
        self.residuals: dict[Hashable, torch.Tensor] = {}
        self.rounds: dict[Hashable, int] = {}

    def encode(self, key: Hashable, x: torch.Tensor) -> Encoded | SparseCodes:
        value = x.detach().to(torch.float32)
        round_ = self.rounds.get(key, 0)
        self.rounds[key] = round_ + 1
        seed = round_seed(key if self.salt is None else (self.salt, key), round_)
        if not self.carry:
            return encode(value, self.fmt, self.block, density=self.density, seed=seed)
        if key in self.residuals:
            if self.residuals[key].shape != value.shape:
                raise ValueError(f"error feedback {key!r}: a value of shape {tuple(value.shape)} "
                                 f"after one of {tuple(self.residuals[key].shape)}; use one key "
                                 "per tensor")
            value = value + self.residuals[key]
        e = encode(value, self.fmt, self.block, density=self.density, seed=seed)
        self.residuals[key] = value - decode(e)
        return e

    def state(self) -> dict:
        """Residuals and round counts (a checkpoint's part)."""
        return {"residuals": dict(self.residuals), "rounds": dict(self.rounds)}

    def load(self, state: dict, device: torch.device | None = None) -> None:
        """Take `state`'s residuals and rounds (an older checkpoint has residuals only: its
        formats drew no random indices)."""
        self.residuals = {k: v.to(device) for k, v in state["residuals"].items()}
        self.rounds = dict(state.get("rounds", {}))


@dataclass(frozen=True)
class Compression:
    """How a run's model averages travel (the module docstring): ``fmt`` codes of each worker's
    change since its group's last average, scaled per ``block`` (sparse formats: ``density``
    of the entries), with `ErrorFeedback` per worker and level when ``feedback``."""

    fmt: str
    block: int = BLOCK
    feedback: bool = True
    density: float = DENSITY
    seed: int = 0  # the run's: random-k's indices differ from run to run

    def __post_init__(self) -> None:
        _check(self.fmt, self.block, self.density)

    def new_feedback(self, level: int) -> ErrorFeedback:
        """One worker's codec state at ``level``: residuals when ``feedback``, rounds always;
        random-k's indices are drawn from the run's seed, the level and the round."""
        return ErrorFeedback(self.fmt, self.block, density=self.density, carry=self.feedback,
                             salt=(self.seed, level))


def _padded(n: int, world: int, block: int) -> int:
    """Length of a vector of ``n`` values padded to ``world`` chunks of whole blocks."""
    return world * max(1, math.ceil(n / (world * block))) * block


def wire_bytes(n: int, fmt: str, world: int, block: int = BLOCK,
               density: float = DENSITY) -> int:
    """Bytes of the codes (and scales) of ``n`` values as `compressed_average` encodes them for
    ``world`` ranks: the vector padded to whole blocks per rank (`Encoded.nbytes`); for sparse
    codes the ring all-reduce payload their all-gather equals (`localsgd.sparse.equivalent_bytes`),
    so that every format is priced as an all-reduce of this many bytes."""
    _check(fmt, block, density)
    if fmt in SPARSE_FORMATS:
        return equivalent_bytes(n, fmt, world, block, density)
    length = _padded(n, world, block)
    width = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}.get(fmt)
    codes = length // 2 if fmt == "int4" else length * width
    return codes + (0 if fmt in ("fp32", "bf16") else 4 * (length // block))


def mean_of_rows(deltas: torch.Tensor, fmt: str, block: int = BLOCK,
                 feedbacks: Sequence[ErrorFeedback] | None = None,
                 key: Hashable = "average", *, density: float = DENSITY,
                 seed: int = 0) -> torch.Tensor:
    """The average of the rows of ``deltas`` ([g, n]) as `compressed_average` computes it over g
    ranks (row k = rank k's values, ``feedbacks[k]`` its error feedback, under ``key``): float32
    [n], the same numbers, for engines that hold every worker in one process."""
    g, n = deltas.shape
    if fmt in SPARSE_FORMATS:
        acc = torch.zeros(n, dtype=torch.float32, device=deltas.device)
        for k in range(g):  # in rank order, as every rank sums the gathered codes
            e = (feedbacks[k].encode(key, deltas[k]) if feedbacks else
                 encode(deltas[k], fmt, block, density=density, seed=seed))
            acc += decode(e)
        return acc / g
    length = _padded(n, g, block)
    acc = torch.zeros(length, dtype=torch.float32, device=deltas.device)
    for k in range(g):  # in rank order, as each rank sums its chunk
        padded = torch.zeros(length, dtype=torch.float32, device=deltas.device)
        padded[:n] = deltas[k]
        e = feedbacks[k].encode(key, padded) if feedbacks else encode(padded, fmt, block)
        acc += decode(e)
    acc /= g
    return decode(encode(acc, fmt, block))[:n]


def _split(e: Encoded, parts: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``e``'s payload and scales as ``parts`` equal chunks along the blocks (rows)."""
    payload = e.payload.view(parts, -1)
    scales = None if e.scales is None else e.scales.view(parts, -1)
    return payload, scales


def compressed_average(tensors: Sequence[torch.Tensor], fmt: str, *,
                       group: dist.ProcessGroup | None = None, block: int = BLOCK,
                       feedback: ErrorFeedback | None = None, key: Hashable = "average",
                       density: float = DENSITY, seed: int = 0) -> int:
    """Replace ``tensors`` (this rank's; the same shapes on every rank) by their average over
    ``group`` with ``fmt`` codes on the wire (the module docstring); returns the bytes this
    rank sent. ``feedback`` (an `ErrorFeedback` of the same format) carries this rank's
    residual from one call to the next, under ``key`` (one key per set of tensors). Sparse
    formats keep ``density`` of the entries; random-k draws them from ``seed`` without a
    ``feedback`` (with one, from its round count), the same seed on every rank. A group of one
    rank leaves the tensors as they are."""
    _check(fmt, block, density)
    if feedback is not None and ((feedback.fmt, feedback.block) != (fmt, block) or (
            fmt in SPARSE_FORMATS and feedback.density != density)):
        raise ValueError(f"feedback encodes {feedback.fmt} in blocks of {feedback.block} "
                         f"(density {feedback.density:g}), the average {fmt} in blocks of "
                         f"{block} (density {density:g})")
    if any(not t.is_floating_point() for t in tensors):
        raise ValueError("compressed_average averages floating-point tensors only; got "
                         f"{sorted({str(t.dtype) for t in tensors if not t.is_floating_point()})}")
    world = dist.get_world_size(group)
    if world == 1 or not tensors:
        return 0
    flat = torch.cat([t.detach().reshape(-1).to(torch.float32) for t in tensors])
    if fmt in SPARSE_FORMATS:
        mine = (feedback.encode(key, flat) if feedback is not None else
                encode(flat, fmt, block, density=density, seed=seed))
        full, sent = _gathered_average(mine, world, group)
    else:
        full, sent = _two_phase_average(flat, fmt, world, group, block, feedback, key)
    offset = 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(full[offset:offset + t.numel()].view_as(t).to(t.dtype))
            offset += t.numel()
    return sent


def _gathered_average(mine: SparseCodes, world: int,
                      group: dist.ProcessGroup | None) -> tuple[torch.Tensor, int]:
    """Every rank's sparse codes gathered, decoded and summed in rank order, over ``world``."""
    parts = {}
    for name in ("indices", "values", "scales"):
        t = getattr(mine, name)
        if t is not None:  # as bytes: gloo and NCCL gather no int16 (chunk-topk's wide blocks)
            raw = t.contiguous().view(torch.uint8)
            got = [torch.empty_like(raw) for _ in range(world)]
            dist.all_gather(got, raw, group=group)
            parts[name] = [g.view(t.dtype) for g in got]
    acc = torch.zeros(mine.numel, dtype=torch.float32, device=mine.values.device)
    for r in range(world):
        codes = {name: (parts[name][r] if name in parts else None)
                 for name in ("indices", "values", "scales")}
        acc += decode_sparse(SparseCodes(mine.fmt, codes["indices"], codes["values"],
                                         codes["scales"], (mine.numel,), mine.numel, mine.block,
                                         mine.density, mine.seed)).reshape(-1)
    return acc / world, (world - 1) * mine.nbytes  # a ring all-gather: P - 1 messages out


def _two_phase_average(flat: torch.Tensor, fmt: str, world: int, group, block: int,
                       feedback: ErrorFeedback | None, key: Hashable) -> tuple[torch.Tensor, int]:
    """The quantisers' reduce-scatter then all-gather of codes (the module docstring)."""
    n = flat.numel()
    # whole blocks per rank, so the chunks split the codes and scales alike (fp32 and bf16 too)
    chunk = _padded(n, world, block) // world
    padded = torch.zeros(world * chunk, dtype=torch.float32, device=flat.device)
    padded[:n] = flat
    mine = feedback.encode(key, padded) if feedback is not None else encode(padded, fmt, block)
    payload, scales = _split(mine, world)
    # 1. reduce-scatter: rank r gets every rank's chunk r, decodes and averages it
    got = torch.empty_like(payload)
    dist.all_to_all_single(got, payload.contiguous(), group=group)
    got_scales = None
    if scales is not None:
        got_scales = torch.empty_like(scales)
        dist.all_to_all_single(got_scales, scales.contiguous(), group=group)
    part = torch.zeros(chunk, dtype=torch.float32, device=flat.device)
    for r in range(world):  # in rank order: every rank sums alike
        part += decode(Encoded(fmt, got[r], None if got_scales is None else got_scales[r],
                               (chunk,), chunk, block))
    part /= world
    # 2. all-gather of the encoded averaged chunks; every rank decodes the same codes
    avg = encode(part, fmt, block)
    payloads = [torch.empty_like(avg.payload) for _ in range(world)]
    dist.all_gather(payloads, avg.payload, group=group)
    gathered_scales: list[torch.Tensor | None] = [None] * world
    if avg.scales is not None:
        gathered_scales = [torch.empty_like(avg.scales) for _ in range(world)]
        dist.all_gather(gathered_scales, avg.scales, group=group)
    full = torch.cat([decode(Encoded(fmt, p, s, (chunk,), chunk, block))
                      for p, s in zip(payloads, gathered_scales, strict=True)])
    return full[:n], 2 * (world - 1) * avg.nbytes  # (P - 1) chunks out in each phase
