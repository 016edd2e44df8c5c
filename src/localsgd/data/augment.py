"""Augmentation and normalization on tensors (§4.1): `normalize` (uint8 → float32 per
channel) and `Augment` (pad, random crop, flip: batched on the training device)."""

from __future__ import annotations

import functools
from typing import Any

import torch


def _channels(values: Any, device: torch.device | str) -> torch.Tensor:
    return _channels_cached(tuple(float(v) for v in values), torch.device(device))


@functools.lru_cache(maxsize=64)
def _channels_cached(values: tuple[float, ...], device: torch.device) -> torch.Tensor:
    # built once per (statistics, device): on a GPU a fresh constant is a host-to-device copy
    return torch.tensor(values, dtype=torch.float32, device=device).view(1, -1, 1, 1)


def normalize(x_uint8: torch.Tensor, mean: Any, std: Any) -> torch.Tensor:
    """Evaluation preprocessing (§4.1): uint8 ``[B, 3, H, W]`` → float32 ``(x / 255 - mean) / std``
    per channel, on ``x``'s device."""
    if x_uint8.dtype != torch.uint8:
        raise TypeError(f"normalize expects uint8 images (0-255), got {x_uint8.dtype}")
    dev = x_uint8.device
    return x_uint8.to(torch.float32).div_(255).sub_(_channels(mean, dev)).div_(_channels(std, dev))


class Augment:
    """The standard CIFAR training augmentation (§4.1, after He et al. 2016), batched on a device.

    Zero-pad each image by ``pad`` pixels, crop a random H×W window, flip it horizontally with
    probability 1/2, then ``normalize``. One gather does crop and flip for the whole batch: no
    per-image Python loop, no PIL. Randomness comes only from ``generator`` (row offsets, column
    offsets, then flips), so a worker's own generator makes its stream reproducible; a CPU
    generator may drive a GPU batch (draws are moved to ``device``).

    Measured on the 2-core dev box, one thread: 0.65 ms for a batch of 128 CIFAR images (0.14 ms
    of it ``normalize``), about 0.4 % of a half-width ResNet-20 training step there (0.18 s).
    """

    def __init__(self, mean: Any, std: Any, pad: int = 4, flip: bool = True,
                 device: torch.device | str = "cpu") -> None:
        if pad < 0:
            raise ValueError(f"Augment: pad must be >= 0, got {pad}")
        self.pad, self.flip, self.device = int(pad), bool(flip), torch.device(device)
        self.mean, self.std = tuple(float(m) for m in mean), tuple(float(s) for s in std)

    def __repr__(self) -> str:
        return (f"Augment(mean={self.mean}, std={self.std}, pad={self.pad}, flip={self.flip}, "
                f"device={str(self.device)!r})")

    def _draw(self, high: int, size: tuple[int, ...],
              generator: torch.Generator | None) -> torch.Tensor:
        where = generator.device if generator is not None else self.device
        drawn = torch.randint(0, high, size, generator=generator, device=where)
        if drawn.device.type == "cpu" and self.device.type == "cuda":
            # a CPU worker generator keeps the stream of a CPU run (and its resume); pinned
            # memory makes the copy asynchronous, so the draw never waits for the GPU
            drawn = drawn.pin_memory()
        return drawn.to(self.device, non_blocking=True)

    def __call__(self, x_uint8: torch.Tensor,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        if x_uint8.dtype != torch.uint8 or x_uint8.ndim != 4:
            raise TypeError(f"Augment expects uint8 [B, C, H, W] images, got {x_uint8.dtype} "
                            f"{tuple(x_uint8.shape)}")
        x = x_uint8.to(self.device, non_blocking=True)
        b, c, h, w = x.shape
        p = self.pad
        rows = torch.arange(h, device=self.device).expand(b, h)
        cols = torch.arange(w, device=self.device).expand(b, w)
        if p:
            offsets = self._draw(2 * p + 1, (2, b), generator)
            rows, cols = rows + offsets[0, :, None], cols + offsets[1, :, None]
            x = torch.nn.functional.pad(x, (p, p, p, p))  # zeros around the image, as He et al.
        if self.flip:
            flipped = self._draw(2, (b,), generator).bool()
            cols = torch.where(flipped[:, None], cols.flip(1), cols)
        if p or self.flip:
            index = (rows[:, :, None] * (w + 2 * p) + cols[:, None, :]).view(b, 1, h * w)
            x = x.reshape(b, c, -1).gather(2, index.expand(b, c, h * w)).view(b, c, h, w)
        return normalize(x, self.mean, self.std)
