"""An image-classification data set in memory (§4.1): `ImageDataset` (uint8 tensors, class
names, channel statistics) and the `synthetic_image_dataset` stand-in for tests."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from localsgd.data.sampling import _balanced_indices, _mix_seed


@dataclass(frozen=True, eq=False)  # == on tensors is ambiguous; identity is what is meant
class ImageDataset:
    """An image-classification data set held in memory as uint8 tensors (§4.1).

    uint8 keeps all of CIFAR in 184 MB, so it moves to the training device once; ``Augment`` and
    ``normalize`` turn mini-batches into float32 there.
    """

    name: str
    train_x: torch.Tensor
    """Training images, uint8 ``[N, 3, H, W]``."""
    train_y: torch.Tensor
    """Training labels, int64 ``[N]`` in ``range(len(classes))``."""
    test_x: torch.Tensor
    """Test images, uint8 ``[M, 3, H, W]``."""
    test_y: torch.Tensor
    """Test labels, int64 ``[M]``."""
    classes: list[str]
    """Class names in label order."""
    mean: tuple[float, float, float]
    """Per-channel mean of the training images scaled to [0, 1]."""
    std: tuple[float, float, float]
    """Per-channel standard deviation of the training images scaled to [0, 1]."""
    source: str
    """Where the images came from (file or folder, and the decoded cache if it was used)."""

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            x, y = getattr(self, f"{split}_x"), getattr(self, f"{split}_y")
            if x.dtype != torch.uint8 or x.ndim != 4 or x.shape[1] != 3:
                raise ValueError(f"{self.name}: {split}_x must be uint8 [N, 3, H, W], "
                                 f"got {x.dtype} {tuple(x.shape)}")
            if y.dtype != torch.int64 or y.shape != (x.shape[0],):
                raise ValueError(f"{self.name}: {split}_y must be int64 [{x.shape[0]}], "
                                 f"got {y.dtype} {tuple(y.shape)}")
            if len(y) and not 0 <= int(y.min()) <= int(y.max()) < len(self.classes):
                raise ValueError(f"{self.name}: {split} labels outside 0..{len(self.classes) - 1}")
        if self.train_x.shape[1:] != self.test_x.shape[1:]:
            raise ValueError(f"{self.name}: train images {tuple(self.train_x.shape[1:])} and test "
                             f"images {tuple(self.test_x.shape[1:])} differ in shape")

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __repr__(self) -> str:
        return (f"ImageDataset({self.name!r}, train={len(self.train_y)}, test={len(self.test_y)}, "
                f"classes={self.num_classes}, image={tuple(self.train_x.shape[1:])}, "
                f"source={self.source!r})")

    def subset(self, n_train: int | None, n_test: int | None, seed: int = 0) -> ImageDataset:
        """A class-balanced random subset (quick mode's reduced scale), deterministic in ``seed``.

        Each split keeps ``n // C`` images of every class, plus one more for ``n % C`` randomly
        chosen classes; ``None`` keeps a split whole. Indices stay in their original order.
        ``mean``/``std`` remain the full training set's: preprocessing belongs to the data set,
        not to how much of it a run uses.
        """
        tr = _balanced_indices(self.train_y, n_train, self.num_classes, _mix_seed(seed, "train"))
        te = _balanced_indices(self.test_y, n_test, self.num_classes, _mix_seed(seed, "test"))
        return dataclasses.replace(
            self,
            train_x=self.train_x if tr is None else self.train_x[tr],
            train_y=self.train_y if tr is None else self.train_y[tr],
            test_x=self.test_x if te is None else self.test_x[te],
            test_y=self.test_y if te is None else self.test_y[te],
            source=f"{self.source} [balanced subset n_train={n_train}, n_test={n_test}, "
                   f"seed={seed}]",
        )


def _channel_stats(x: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of uint8 images scaled to [0, 1], exact via 256-bin histograms."""
    values = torch.arange(256, dtype=torch.float64) / 255
    mean, std = [], []
    for c in range(x.shape[1]):
        hist = torch.bincount(x[:, c].reshape(-1), minlength=256).to(torch.float64)
        m = (hist * values).sum() / hist.sum()
        mean.append(float(m))
        std.append(float(((hist * (values - m) ** 2).sum() / hist.sum()).sqrt()))
    return tuple(mean), tuple(std)


def synthetic_image_dataset(n_train: int, n_test: int, num_classes: int = 10,
                            image_size: int = 32, seed: int = 0) -> ImageDataset:
    """A tiny learnable stand-in for tests and smoke runs; only ever used by name (``"synthetic"``).

    Each class has its own smooth colour pattern (a random 4×4 grid of colours, upsampled); an
    image is its class pattern plus pixel noise, so a model's loss falls within a few steps and
    crops/flips keep the class recognisable. Labels are balanced. Never a fallback for real data.
    """
    if min(n_train, n_test) < 0 or num_classes < 2 or image_size < 1:
        raise ValueError(f"synthetic_image_dataset: need n_train, n_test >= 0, num_classes >= 2, "
                         f"image_size >= 1; got {n_train}, {n_test}, {num_classes}, {image_size}")
    g = torch.Generator().manual_seed(_mix_seed(seed, "synthetic"))
    patterns = torch.nn.functional.interpolate(
        torch.rand(num_classes, 3, 4, 4, generator=g), size=(image_size, image_size),
        mode="bilinear", align_corners=False)

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = (torch.arange(n) % num_classes)[torch.randperm(n, generator=g)]
        noise = torch.randn(n, 3, image_size, image_size, generator=g)
        # 255 * (0.15 + 0.7 * pattern) + 40 * noise, in place: the same float ops in the same
        # order (bitwise the same images) with two buffers instead of five -- 16 processes
        # loading it at once on 2 cores spent seconds allocating temporaries
        x = patterns[y].mul_(0.7).add_(0.15).mul_(255).add_(noise.mul_(40))
        return x.round_().clamp_(0, 255).to(torch.uint8), y

    (train_x, train_y), (test_x, test_y) = draw(n_train), draw(n_test)
    mean, std = _channel_stats(train_x)
    return ImageDataset(name="synthetic", train_x=train_x, train_y=train_y, test_x=test_x,
                        test_y=test_y, classes=[f"class{c}" for c in range(num_classes)],
                        mean=mean, std=std, source=f"synthetic_image_dataset(seed={seed})")
