"""ImageNet-1k (§4.1, §4.2.2; paper mode only) and image folders streamed from disk: the
ImageNet input pipeline, a CIFAR stand-in written as folders, seeded per-item augmentation, and
`load_image_dataset`, the by-name dispatch over every image data set."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import torch
from PIL import Image

from localsgd.data.cifar import load_cifar
from localsgd.data.cifar_files import CIFAR_DATASETS
from localsgd.data.images import ImageDataset, synthetic_image_dataset
from localsgd.data.sampling import _balanced_indices, _mix_seed
from localsgd.paths import cache_dir, data_dirs

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # the usual per-channel statistics of ImageNet-1k train
IMAGENET_STD = (0.229, 0.224, 0.225)


class ImageFolders(NamedTuple):
    """A train/val pair of ``torchvision.datasets.ImageFolder`` data sets (or class-balanced
    ``Subset``s of them), streamed from disk by `localsgd.training.loop` through ``DataLoader``
    workers. Items are uint8 ``[3, H, W]`` tensors (`folder_transforms`); the training loop
    normalizes them with ``mean``/``std`` on its device, so a loader batch holds a quarter of the
    bytes."""

    train: Any
    val: Any
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD

    @property
    def classes(self) -> list[str]:
        base = self.train.dataset if isinstance(self.train, torch.utils.data.Subset) else self.train
        return list(base.classes)


def folder_transforms(image_size: int, resize: int) -> tuple[Any, Any]:
    """The ImageNet input pipeline of §4.1 (He et al. 2016): train ``RandomResizedCrop(size)`` +
    random horizontal flip, val ``Resize(resize)`` + ``CenterCrop(size)``; both to uint8
    ``[3, size, size]`` tensors. Per-channel normalization (`normalize`, the same arithmetic as
    ``ToTensor`` + ``Normalize``) happens on the training device: loader workers, shared memory
    and the host-to-device copy move uint8, 4x fewer bytes than float32. The randomness draws
    from torch's RNG (see `SeededItems`)."""
    from torchvision import transforms  # deferred: torchvision is slow to import

    if image_size < 8 or resize < image_size:
        raise ValueError(f"image_size={image_size}, resize={resize}: need 8 <= image_size <= "
                         "resize")
    train = transforms.Compose([transforms.RandomResizedCrop(image_size),
                                transforms.RandomHorizontalFlip(), transforms.PILToTensor()])
    val = transforms.Compose([transforms.Resize(resize), transforms.CenterCrop(image_size),
                              transforms.PILToTensor()])
    return train, val


def imagenet_folders(root: str | Path | None = None, *, image_size: int = 224,
                     resize: int = 256) -> ImageFolders:
    """ImageNet-1k (§4.1) as torchvision ``ImageFolder`` data sets with `folder_transforms`
    (224 px crops, val resized to 256; uint8), to be normalized with ``IMAGENET_MEAN``/``_STD``
    on the training device.

    Expects ``<root>/train/<wnid>/*.JPEG`` and ``<root>/val/<wnid>/*.JPEG`` (val sorted into
    class folders); ``root`` defaults to the first ``<data dir>/imagenet`` holding both, i.e.
    ``$LOCALSGD_DATA/imagenet``. Images are decoded per item, in ``DataLoader`` workers.
    """
    from torchvision import datasets  # deferred: torchvision is slow to import

    roots = [Path(root).expanduser()] if root is not None else [d / "imagenet" for d in data_dirs()]
    found = next((r for r in roots if (r / "train").is_dir() and (r / "val").is_dir()), None)
    if found is None:
        raise FileNotFoundError(
            f"ImageNet not found (looked for train/ and val/ in {', '.join(map(str, roots))}). "
            "Lay it out as <root>/train/<wnid>/*.JPEG and <root>/val/<wnid>/*.JPEG (val images "
            "sorted into class folders) and pass root=, or put it at $LOCALSGD_DATA/imagenet "
            "(set the LOCALSGD_DATA environment variable)."
        )
    train_tf, val_tf = folder_transforms(image_size, resize)
    train = datasets.ImageFolder(found / "train", train_tf)
    val = datasets.ImageFolder(found / "val", val_tf)
    if train.classes != val.classes:
        raise ValueError(f"{found}: train/ has {len(train.classes)} class folders, val/ has "
                         f"{len(val.classes)} (or different names); they must match")
    return ImageFolders(train, val, IMAGENET_MEAN, IMAGENET_STD)


def write_image_folders(ds: ImageDataset, root: str | Path) -> Path:
    """Write ``ds`` as lossless PNG files ``<root>/{train,val}/<class>/<index>.png`` (once; a
    complete folder is reused), so the in-memory data set can be streamed like ImageNet. The
    folder appears atomically: an interrupted write leaves nothing that looks complete."""
    root = Path(root)
    if (root / "COMPLETE").is_file():
        return root
    tmp = root.with_name(root.name + f".tmp{os.getpid()}")
    for split, xs, ys in (("train", ds.train_x, ds.train_y), ("val", ds.test_x, ds.test_y)):
        for c in ds.classes:
            (tmp / split / c).mkdir(parents=True, exist_ok=True)
        arr = xs.permute(0, 2, 3, 1).contiguous().numpy()
        for i, (img, label) in enumerate(zip(arr, ys.tolist(), strict=True)):
            Image.fromarray(img).save(tmp / split / ds.classes[label] / f"{i:06d}.png")
    (tmp / "COMPLETE").write_text(ds.source + "\n")
    try:
        tmp.rename(root)
    except OSError:  # another process finished first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
        if not (root / "COMPLETE").is_file():
            raise
    return root


def standin_folders(name: str = "cifar10", n_train: int | None = None, n_test: int | None = None,
                    *, image_size: int = 32, resize: int | None = None) -> ImageFolders:
    """A small labelled stand-in for ImageNet: CIFAR images (a class-balanced subset, seed 0)
    written once as PNG folders under the cache and streamed through ImageNet's input pipeline
    (`folder_transforms` with the data set's own channel statistics). It exercises exactly the
    code path of ImageNet training at a size a CPU can run; its numbers are not ImageNet's."""
    from torchvision import datasets  # deferred: torchvision is slow to import

    ds = load_cifar(name)
    if n_train is not None or n_test is not None:
        ds = ds.subset(n_train, n_test, seed=0)
    key = hashlib.sha256(ds.source.encode()).hexdigest()[:12]
    root = write_image_folders(ds, cache_dir() / "folders" / f"{name}-{len(ds.train_y)}-"
                               f"{len(ds.test_y)}-{key}")
    resize = resize or round(image_size * 256 / 224)  # ImageNet's 256/224 ratio
    train_tf, val_tf = folder_transforms(image_size, resize)
    return ImageFolders(datasets.ImageFolder(root / "train", train_tf),
                        datasets.ImageFolder(root / "val", val_tf), ds.mean, ds.std)


def balanced_folder_subset(folders: ImageFolders, n_train: int | None, n_test: int | None,
                           seed: int = 0) -> ImageFolders:
    """Class-balanced subsets of an `ImageFolders` pair (as ``ImageDataset.subset`` does)."""
    def pick(folder: Any, n: int | None, part: str) -> Any:
        y = torch.as_tensor(folder.targets, dtype=torch.int64)
        idx = _balanced_indices(y, n, len(folder.classes), _mix_seed(seed, part))
        return folder if idx is None else torch.utils.data.Subset(folder, idx.tolist())

    return folders._replace(train=pick(folders.train, n_train, "train"),
                            val=pick(folders.val, n_test, "test"))


class SeededItems(torch.utils.data.Dataset):
    """Item ``i`` of ``base`` with torch's RNG seeded by ``(seed, epoch, i)``: the random
    crops/flips of a streamed image are a pure function of the run's seed, the epoch and the
    image, whatever the number of loader workers or the update a run resumed at."""

    def __init__(self, base: Any, seed: int, epoch: int):
        self.base, self.seed, self.epoch = base, int(seed), int(epoch)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> Any:
        seed = _mix_seed(self.seed, "augment", self.epoch, int(i))
        if torch.utils.data.get_worker_info() is not None:  # a loader worker owns its RNG
            torch.manual_seed(seed)
            return self.base[i]
        with torch.random.fork_rng(devices=[]):  # in the training process: leave its RNG alone
            torch.manual_seed(seed)
            return self.base[i]


IMAGE_DATASETS = ("cifar10", "cifar100", "synthetic", "imagenet", "cifar10_folder")
SYNTHETIC_COUNTS = (5_000, 1_000)  # (train, test) when "synthetic" is loaded by name alone


def load_image_dataset(name: str, **kwargs: Any) -> ImageDataset | ImageFolders:
    """Dispatch by name: ``cifar10``/``cifar100`` → ``load_cifar``, ``synthetic`` →
    ``synthetic_image_dataset`` (``n_train``/``n_test`` default to ``SYNTHETIC_COUNTS``, a
    CIFAR-10-shaped set a tenth the size), ``imagenet`` → ``imagenet_folders``,
    ``cifar10_folder`` → ``standin_folders`` (CIFAR-10 streamed like ImageNet). ``kwargs`` go to
    that function."""
    if name in CIFAR_DATASETS:
        return load_cifar(name, **kwargs)
    if name == "synthetic":
        kwargs.setdefault("n_train", SYNTHETIC_COUNTS[0])
        kwargs.setdefault("n_test", SYNTHETIC_COUNTS[1])
        return synthetic_image_dataset(**kwargs)
    if name == "imagenet":
        return imagenet_folders(**kwargs)
    if name == "cifar10_folder":
        return standin_folders("cifar10", **kwargs)
    raise ValueError(f"unknown image data set {name!r}; valid names: {', '.join(IMAGE_DATASETS)}")
