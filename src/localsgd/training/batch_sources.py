"""Where the training loop's mini-batches and test sums come from.

`load_dataset` gives a configuration's data set; `MemoryBatches` (CIFAR held in memory, indexed
on the device) and `StreamedBatches` (ImageNet's input pipeline over image folders, §4.2.2)
hand `localsgd.training.loop.train` each worker's mini-batch of the §4.2.1 partition and sum the
loss and hits of the test set batch by batch (`EvalBatch`; under torchrun each process sums one
shard and `combine_eval` adds them up in batch order). ``cfg`` is a
`localsgd.training.config.TrainConfig` (not imported here: the loop imports this module).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from localsgd import data as data_mod
from localsgd.engines.common import host_map

__all__ = ["STREAMED", "EvalBatch", "MemoryBatches", "PendingEval", "StreamedBatches",
           "combine_eval", "downsampled", "eval_batches", "eval_sums", "evaluate", "load_dataset"]


STREAMED = ("imagenet", "cifar10_folder")  # data sets read from image folders while training


def downsampled(ds: data_mod.ImageDataset, side: int) -> data_mod.ImageDataset:
    """``ds`` with every image area-averaged to ``side`` × ``side`` (torch's area mode, adaptive
    average pooling: each block's mean where ``side`` divides the image's, overlapping windows
    otherwise, e.g. 24 from 32), rounded back to uint8; labels, classes and statistics kept."""
    if side > ds.train_x.shape[-1]:
        raise ValueError(f"resolution={side}: larger than {ds.name}'s "
                         f"{ds.train_x.shape[-1]}-pixel images (only downsampling)")

    def area(x: torch.Tensor) -> torch.Tensor:
        small = torch.nn.functional.interpolate(x.float(), size=(side, side), mode="area")
        return small.round_().clamp_(0, 255).to(torch.uint8)

    return dataclasses.replace(ds, train_x=area(ds.train_x), test_x=area(ds.test_x),
                               source=f"{ds.source} [area-downsampled to {side}x{side}]")


class MemoryBatches:
    """Mini-batches of an in-memory `ImageDataset` (CIFAR): index the uint8 tensors on the
    device, augment with worker k's generator (§4.1)."""

    def __init__(self, ds: data_mod.ImageDataset, cfg: Any, device: torch.device):
        side = getattr(cfg, "resolution", None)
        if side is not None and side != ds.train_x.shape[-1]:
            ds = downsampled(ds, side)
        self.ds, self.device, self.eval_batch = ds, device, cfg.eval_batch
        self.n_train, self.num_classes = len(ds.train_y), len(ds.classes)
        self.test_images = len(ds.test_y)
        self.train_x, self.train_y = ds.train_x.to(device), ds.train_y.to(device)
        self.test_x, self.test_y = ds.test_x.to(device), ds.test_y.to(device)
        pad = 4 if side is None else max(1, round(4 * side / 32))  # §4.1's 4 pixels at 32
        self.augment = (data_mod.Augment(ds.mean, ds.std, pad=pad, device=device)
                        if cfg.augment else None)
        self._parts: tuple[torch.Tensor, torch.Tensor] | None = None  # (epoch's CPU, device copy)

    def batches(self, parts: torch.Tensor, epoch: int, pos: int, ranks: list[int],
                generators: list[torch.Generator], b: int) -> list[tuple[torch.Tensor, ...]]:
        if self._parts is None or self._parts[0] is not parts:  # once per epoch, not per step
            self._parts = (parts, parts.to(self.device))
        on_device = self._parts[1]
        out = []
        for w, gen in zip(ranks, generators, strict=True):
            idx = on_device[w, pos * b:(pos + 1) * b]
            xb = self.train_x[idx]
            xb = (self.augment(xb, gen) if self.augment is not None
                  else data_mod.normalize(xb, self.ds.mean, self.ds.std))
            out.append((xb, self.train_y[idx]))
        return out

    eval_limit: int | None = None  # test images evaluated (a dry run's bound; None: all)

    def eval_sums(self, model: nn.Module, layout: torch.memory_format = torch.contiguous_format,
                  threads: int = 1, shard: tuple[int, int] = (0, 1)) -> PendingEval:
        n = self.eval_limit
        return eval_sums(model, self.test_x[:n], self.test_y[:n], self.ds.mean, self.ds.std,
                         self.eval_batch, layout, threads, shard)


class StreamedBatches:
    """Mini-batches streamed from image folders (ImageNet, §4.2.2): one DataLoader per epoch
    whose batch sampler yields, for update ``pos``, each of this process's workers' mini-batch
    of the §4.2.1 partition in turn; images are decoded and augmented in loader worker
    processes, seeded per image (`data.SeededItems`), and reach the device as uint8, where they
    are normalized.

    Host memory is bounded by construction (the paper's ImageNet: 224 px, B_loc = 128, 8 loader
    workers): a loader batch is one worker's B_loc uint8 images (19 MB), not K·B_loc float32
    ones (K = 30: 2.3 GB); at most ``loader_workers × PREFETCH`` of them are in flight; an
    evaluation batch holds at most ``EVAL_BATCH_BYTES`` of float32 input (`eval_batch_size`).
    """

    PREFETCH = 2  # loader batches in flight per loader worker
    EVAL_BATCH_BYTES = 256 * 2**20  # float32 input of one evaluation batch on the device

    eval_limit: int | None = None  # validation images evaluated (a dry run's bound; None: all)

    def __init__(self, folders: data_mod.ImageFolders, cfg: Any, device: torch.device):
        self.folders, self.cfg, self.device = folders, cfg, device
        self.n_train, self.num_classes = len(folders.train), len(folders.classes)
        self.test_images = len(folders.val)
        self._it, self._at = None, None  # the epoch's batch iterator and the (epoch, pos) it serves

    def eval_batch_size(self) -> int:
        """``cfg.eval_batch`` capped so one batch's float32 input fits ``EVAL_BATCH_BYTES``
        (1,000 images at 224 px would be 600 MB; the cap is 445 there, no cap at 32 px)."""
        per_image = 3 * self.cfg.image_size ** 2 * 4
        return max(1, min(self.cfg.eval_batch, self.EVAL_BATCH_BYTES // per_image))

    def loader(self, dataset: Any, batch_sampler: Any) -> torch.utils.data.DataLoader:
        workers = self.cfg.loader_workers
        return torch.utils.data.DataLoader(
            dataset, batch_sampler=batch_sampler, num_workers=workers,
            pin_memory=self.device.type == "cuda", persistent_workers=False,
            prefetch_factor=self.PREFETCH if workers else None)

    def _normalized(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.device, non_blocking=True)
        return data_mod.normalize(x, self.folders.mean, self.folders.std)

    def batches(self, parts: torch.Tensor, epoch: int, pos: int, ranks: list[int],
                generators: list[torch.Generator], b: int) -> list[tuple[torch.Tensor, ...]]:
        if self._at != (epoch, pos):  # a new epoch, or a resumed run: start where we are
            rows = parts[ranks]
            plan = [rows[w, p * b:(p + 1) * b].tolist()
                    for p in range(pos, rows.shape[1] // b) for w in range(len(ranks))]
            self._it = iter(self.loader(data_mod.SeededItems(self.folders.train, self.cfg.seed,
                                                              epoch), plan))
        out = []
        for _ in ranks:
            x, y = next(self._it)
            out.append((self._normalized(x), y.to(self.device, non_blocking=True)))
        self._at = (epoch, pos + 1)
        return out

    @torch.no_grad()
    def eval_sums(self, model: nn.Module, layout: torch.memory_format = torch.contiguous_format,
                  threads: int = 1, shard: tuple[int, int] = (0, 1)) -> PendingEval:
        # one batch at a time: the loader's worker processes are the parallelism here
        model.eval()
        dtype = next(model.parameters()).dtype
        n, e = len(self.folders.val), self.eval_batch_size()
        n = min(n, self.eval_limit or n)
        starts = list(range(0, n, e))[shard[0]::shard[1]]
        loader = self.loader(self.folders.val, [list(range(i, min(i + e, n))) for i in starts])
        sums, images = [], []
        for x, y in loader:
            out = model(self._normalized(x).to(dtype, memory_format=layout))
            y = y.to(self.device)
            sums.append(torch.stack([nn.functional.cross_entropy(out.float(), y, reduction="sum"),
                                     (out.argmax(1) == y).sum().float()]))
            images.append(len(y))
        return PendingEval(starts, images, torch.stack(sums) if sums else None)


class EvalBatch(NamedTuple):
    """One evaluation batch's sums: where it starts in the test set, its images, summed
    cross-entropy and hits."""

    start: int
    images: int
    loss: float
    hits: int


class PendingEval(NamedTuple):
    """Evaluation sums still on the device: each batch's start and images, and a ``[batches, 2]``
    tensor of summed cross-entropy and hits (None: no batch). `read` turns them into
    `EvalBatch` rows; ``localsgd.training.loop`` reads them with the training sums, in one host
    read."""

    starts: list[int]
    images: list[int]
    sums: torch.Tensor | None

    def read(self, values: Sequence[float] | None = None) -> list[EvalBatch]:
        """The rows, from ``values`` (``sums`` flattened, already read) or one read of ``sums``."""
        if values is None:
            values = self.sums.flatten().tolist() if self.sums is not None else []
        return [EvalBatch(start, n, values[2 * j], int(values[2 * j + 1]))
                for j, (start, n) in enumerate(zip(self.starts, self.images, strict=True))]


@torch.no_grad()
def eval_sums(model: nn.Module, x: torch.Tensor, y: torch.Tensor, mean: Any, std: Any,
              batch: int = 1000, layout: torch.memory_format = torch.contiguous_format,
              threads: int = 1, shard: tuple[int, int] = (0, 1)) -> PendingEval:
    """The sums of ``model`` on uint8 images ``x`` batch by batch (``batch`` images, handed to
    the model in ``layout``, spread over ``threads`` host threads), for the batches of shard
    ``shard = (i, n)``: batches i, i + n, i + 2n, ... (under torchrun each process evaluates
    one shard; `combine_eval` adds the shards up in batch order), left on the device."""
    model.eval()
    dtype = next(model.parameters()).dtype

    def one(i: int) -> torch.Tensor:
        xb = data_mod.normalize(x[i:i + batch], mean, std).to(dtype, memory_format=layout)
        out = model(xb)
        return torch.stack([nn.functional.cross_entropy(out, y[i:i + batch], reduction="sum"),
                            (out.argmax(1) == y[i:i + batch]).sum().to(out.dtype)])

    starts = list(range(0, len(x), batch))[shard[0]::shard[1]]
    sums = host_map(one, starts, threads)
    return PendingEval(starts, [len(y[i:i + batch]) for i in starts],
                       torch.stack(sums) if sums else None)


def eval_batches(model: nn.Module, x: torch.Tensor, y: torch.Tensor, mean: Any, std: Any,
                 batch: int = 1000, layout: torch.memory_format = torch.contiguous_format,
                 threads: int = 1, shard: tuple[int, int] = (0, 1)) -> list[EvalBatch]:
    """`eval_sums`' rows, read at once (one host read for all the batches)."""
    return eval_sums(model, x, y, mean, std, batch, layout, threads, shard).read()


def combine_eval(shards: Sequence[Sequence[EvalBatch]]) -> tuple[float, float]:
    """(top-1 accuracy in %, mean cross-entropy) from every shard's `EvalBatch` rows, summed in
    batch order: bitwise what one process evaluating every batch computes."""
    rows = sorted((r for shard in shards for r in shard), key=lambda r: r.start)
    n = sum(r.images for r in rows)
    loss, correct = 0.0, 0
    for r in rows:
        loss += r.loss
        correct += r.hits
    return 100.0 * correct / max(n, 1), loss / max(n, 1)


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, mean: Any, std: Any,
             batch: int = 1000, layout: torch.memory_format = torch.contiguous_format,
             threads: int = 1) -> tuple[float, float]:
    """(top-1 accuracy in %, mean cross-entropy) of ``model`` on uint8 images ``x``: every
    batch of `eval_batches`, added up by `combine_eval`."""
    return combine_eval([eval_batches(model, x, y, mean, std, batch, layout, threads)])


def load_dataset(cfg: Any) -> data_mod.ImageDataset | data_mod.ImageFolders:
    if cfg.dataset == "imagenet":
        folders = data_mod.imagenet_folders(image_size=cfg.image_size,
                                            resize=round(cfg.image_size * 256 / 224))
        return data_mod.balanced_folder_subset(folders, cfg.n_train, cfg.n_test)
    if cfg.dataset in STREAMED:
        return data_mod.load_image_dataset(cfg.dataset, n_train=cfg.n_train, n_test=cfg.n_test,
                                           image_size=cfg.image_size)
    ds = data_mod.load_image_dataset(cfg.dataset)
    if cfg.n_train is not None or cfg.n_test is not None:
        ds = ds.subset(cfg.n_train, cfg.n_test, seed=0)  # the subset is fixed, not per-seed
    return ds
