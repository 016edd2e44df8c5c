"""CIFAR-10/100's variants and files (§4.1): the names torchvision gives them, checking its
pickles (`_torn_file`), decoding a copy (torchvision's pickles, or an image-folder copy read
from a tar or a folder) and the decoded cache that `localsgd.data.cifar.load_cifar` keeps."""

from __future__ import annotations

import io
import tarfile
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from localsgd.data.downloads import sha256_file
from localsgd.data.images import ImageDataset, _channel_stats
from localsgd.paths import atomic_path

CIFAR_COUNTS = (50_000, 10_000)  # (train, test) images of CIFAR-10 and of CIFAR-100
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                   "ship", "truck")
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
_CACHE_FORMAT = 1  # bump when the decoded-cache layout changes; older entries are re-decoded


@dataclass(frozen=True)
class CifarSpec:
    """A CIFAR variant: its class count and the names torchvision gives its files."""

    num_classes: int
    torchvision_folder: str
    """Folder torchvision extracts the canonical pickles into (found in any data dir)."""
    torchvision_class: str
    """Class in ``torchvision.datasets`` that downloads and reads them."""


CIFAR_DATASETS: dict[str, CifarSpec] = {
    "cifar10": CifarSpec(10, "cifar-10-batches-py", "CIFAR10"),
    "cifar100": CifarSpec(100, "cifar-100-python", "CIFAR100"),
}


class _Source(NamedTuple):
    kind: str  # "jpeg": an image-folder copy (folder or tar); "pickle": torchvision's layout
    path: Path


def _tv_class(name: str) -> Any:
    from torchvision import datasets  # deferred: torchvision is slow to import

    return getattr(datasets, CIFAR_DATASETS[name].torchvision_class)


class _TornCopy(ValueError):
    """torchvision's pickles of a CIFAR variant with a file missing or failing its md5."""


def _torn_file(name: str, folder: Path) -> Path | None:
    """The first file of torchvision's ``folder`` that is missing or fails its md5, else None."""
    from torchvision.datasets.utils import check_integrity  # deferred: slow to import

    cls = _tv_class(name)
    for fname, md5 in [*cls.train_list, *cls.test_list, (cls.meta["filename"], cls.meta["md5"])]:
        if not check_integrity(str(folder / fname), md5):
            return folder / fname
    return None


def _validate_cifar(ds: ImageDataset, name: str, expected_counts: tuple[int, int] | None) -> None:
    spec, where = CIFAR_DATASETS[name], ds.source
    if ds.num_classes != spec.num_classes:
        raise ValueError(f"{where}: {ds.num_classes} classes, {name} has {spec.num_classes}")
    if name == "cifar10" and tuple(ds.classes) != CIFAR10_CLASSES:
        raise ValueError(f"{where}: classes {ds.classes} are not CIFAR-10's {CIFAR10_CLASSES} "
                         "(class folders must use these names so they sort into label order)")
    if ds.train_x.shape[1:] != (3, 32, 32):
        raise ValueError(f"{where}: images are {tuple(ds.train_x.shape[1:])}, CIFAR's are 3×32×32")
    counts = (len(ds.train_y), len(ds.test_y))
    if expected_counts is not None and counts != tuple(expected_counts):
        raise ValueError(f"{where}: {counts[0]} train / {counts[1]} test images, {name} has "
                         f"{expected_counts[0]} / {expected_counts[1]}; the copy is incomplete")
    missing = (torch.bincount(ds.train_y, minlength=spec.num_classes) == 0).nonzero().flatten()
    if len(missing):
        raise ValueError(f"{where}: no training images of class {ds.classes[int(missing[0])]}")


def _load_cifar_cache(npz: Path, name: str,
                      expected_counts: tuple[int, int] | None) -> ImageDataset | None:
    """The decoded cache entry, or ``None`` when absent or unusable (a warning says why)."""
    if not npz.is_file():
        return None
    try:
        with np.load(npz, allow_pickle=False) as z:
            meta = {k: z[k] for k in z.files}
        if int(meta["format"]) != _CACHE_FORMAT or str(meta["name"]) != name:
            raise ValueError(f"format {int(meta['format'])} of {meta['name']}, "
                             f"expected format {_CACHE_FORMAT} of {name}")
        images = np.load(_images_path(npz), allow_pickle=False)
        n_train, n_test = len(meta["train_y"]), len(meta["test_y"])
        if len(images) != n_train + n_test or zlib.crc32(images) != int(meta["images_crc32"]):
            raise ValueError(f"{_images_path(npz).name} does not match its checksum")
        x = torch.from_numpy(images)
        ds = ImageDataset(
            name=name, train_x=x[:n_train], train_y=torch.from_numpy(meta["train_y"]),
            test_x=x[n_train:], test_y=torch.from_numpy(meta["test_y"]),
            classes=[str(c) for c in meta["classes"]],
            mean=tuple(float(v) for v in meta["mean"]), std=tuple(float(v) for v in meta["std"]),
            source=f"{meta['source']} (decoded cache {npz})",
        )
        _validate_cifar(ds, name, expected_counts)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error) as err:
        warnings.warn(f"{npz}: ignoring a corrupt or invalid decoded cache "
                      f"({type(err).__name__}: {err}); it will be decoded again", stacklevel=3)
        return None
    return ds


def _images_path(npz: Path) -> Path:
    return npz.with_suffix(".images.npy")


def _save_cifar_cache(npz: Path, ds: ImageDataset) -> None:
    """Images as one plain ``.npy`` (a single read: ~0.1 s for CIFAR, vs ~0.5 s from inside a
    zip), then labels, names, stats and the images' CRC-32 in a small ``.npz`` written last, so
    an entry counts only once both files are complete."""
    images = torch.cat([ds.train_x, ds.test_x]).numpy()
    with atomic_path(_images_path(npz)) as tmp, open(tmp, "wb") as fh:  # a handle: no suffix added
        np.save(fh, images)
    with atomic_path(npz) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, format=np.int64(_CACHE_FORMAT), name=np.str_(ds.name),
                 source=np.str_(ds.source), classes=np.array(ds.classes), mean=np.array(ds.mean),
                 std=np.array(ds.std), train_y=ds.train_y.numpy(), test_y=ds.test_y.numpy(),
                 images_crc32=np.int64(zlib.crc32(images)))


def _decode_cifar(name: str, source: _Source) -> ImageDataset:
    if source.kind == "pickle":
        from torchvision import datasets  # deferred: torchvision is slow to import

        cls = getattr(datasets, CIFAR_DATASETS[name].torchvision_class)
        try:
            train = cls(root=str(source.path.parent), train=True, download=False)
            test = cls(root=str(source.path.parent), train=False, download=False)
        except RuntimeError as err:  # torchvision's md5 check failed
            bad = _torn_file(name, source.path) or source.path
            raise _TornCopy(f"{bad}: missing or fails torchvision's md5 check, so {source.path} is "
                            f"a torn or partial copy of {name}; replace the folder with a complete "
                            f"copy, or delete it to let localsgd download {name} again") from err
        xs = [torch.from_numpy(d.data).permute(0, 3, 1, 2).contiguous() for d in (train, test)]
        ys = [torch.as_tensor(d.targets, dtype=torch.int64) for d in (train, test)]
        classes, where = list(train.classes), f"torchvision pickles {source.path}"
    else:
        records = (_read_image_tar(source.path) if source.path.is_file()
                   else _read_image_folder(source.path))
        where = f"image-folder copy {source.path}"
        classes, (xs, ys) = _decode_records(records, where)
    mean, std = _channel_stats(xs[0])
    return ImageDataset(name=name, train_x=xs[0], train_y=ys[0], test_x=xs[1], test_y=ys[1],
                        classes=classes, mean=mean, std=std, source=where)


_Records = dict[str, list[tuple[str, str, bytes]]]  # split -> [(class, file name, encoded bytes)]


def _read_image_tar(path: Path) -> _Records:
    """Members ``[prefix/]<split>/<class>/<file>`` of a tar, read in place (nothing extracted)."""
    records: _Records = {"train": [], "test": []}
    try:
        # random-access mode on purpose: its gzip reader rejects a truncated stream (the
        # streaming mode may stop silently at a member boundary); members are still read in order
        with tarfile.open(path, mode="r:*") as tf:
            for member in tf:
                parts = member.name.split("/")
                if (member.isfile() and len(parts) >= 3 and parts[-3] in records
                        and _is_image_name(parts[-1])):
                    records[parts[-3]].append((parts[-2], parts[-1], tf.extractfile(member).read()))
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        raise ValueError(f"{path}: corrupt or truncated archive ({type(err).__name__}: {err}); "
                         f"replace it with a good copy (sha256 now {sha256_file(path)})") from err
    return records


def _read_image_folder(root: Path) -> _Records:
    records: _Records = {}
    for split in ("train", "test"):
        records[split] = [(cls.name, f.name, f.read_bytes())
                          for cls in sorted((root / split).iterdir()) if cls.is_dir()
                          for f in sorted(cls.iterdir()) if f.is_file() and _is_image_name(f.name)]
    return records


def _is_image_name(name: str) -> bool:
    return not name.startswith(".") and name.lower().endswith(_IMAGE_SUFFIXES)


def _decode_records(records: _Records,
                    where: str) -> tuple[list[str], tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """Decode every image (PIL, one core) into ``[N, 3, H, W]`` uint8, class-major."""
    classes = sorted({c for c, _, _ in records["train"]})
    extra = sorted({c for c, _, _ in records["test"]} - set(classes))
    if not classes or extra:
        raise ValueError(f"{where}: " + (f"test classes {extra} have no train/ folder" if extra
                                          else "no images under train/<class>/"))
    label = {c: i for i, c in enumerate(classes)}
    xs, ys = [], []
    for split in ("train", "test"):
        recs = sorted(records[split], key=lambda r: (label[r[0]], r[1]))
        if not recs:
            raise ValueError(f"{where}: no images under {split}/<class>/")
        size = None
        for i, (cls, fname, blob) in enumerate(recs):
            try:
                img = Image.open(io.BytesIO(blob), formats=("JPEG", "PNG"))
                pixels = (img if img.mode == "RGB" else img.convert("RGB")).tobytes()
            except (OSError, UnidentifiedImageError) as err:
                raise ValueError(f"{where}: {split}/{cls}/{fname} is not a readable image "
                                 f"({err})") from err
            if size is None:
                size = img.size
                x = np.empty((len(recs), size[1], size[0], 3), dtype=np.uint8)
            if img.size != size:
                raise ValueError(f"{where}: {split}/{cls}/{fname} is {img.size[0]}×{img.size[1]} "
                                 f"pixels, other images are {size[0]}×{size[1]}")
            x[i] = np.frombuffer(pixels, dtype=np.uint8).reshape(x.shape[1:])
        xs.append(torch.from_numpy(x).permute(0, 3, 1, 2).contiguous())  # HWC -> CHW
        ys.append(torch.tensor([label[c] for c, _, _ in recs], dtype=torch.int64))
    return classes, (xs, ys)
