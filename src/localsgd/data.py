"""Data sets: where they live, how they are fetched, and how they are parsed.

Folders: ``$LOCALSGD_DATA`` (read-only copies a user or CI provides) is searched first, then the
writable cache ``cache_dir()`` (``$LOCALSGD_CACHE`` or ``~/.cache/localsgd``), where downloads
and parsed arrays go. ``$LOCALSGD_MIRROR`` (a folder or URL base holding the canonical file names:
``w8a``, ``cifar-10-python.tar.gz``, ``cifar-100-python.tar.gz``) replaces the original download
sites, e.g. on a cluster without internet; checksums are checked all the same (`mirror_url`).

Downloads are written by one process at a time: each holds an inter-process lock in the cache
(`localsgd.paths.file_lock`) and looks again once it has it, so processes started together (the
ranks of a torchrun job, two notebooks, nodes sharing a file system) fetch a file once.

Sections: checksums/downloads · LIBSVM (w8a, the convex experiments of §3.4 / Appendix E) · images (CIFAR-10/100
and ImageNet, §4.1) · the per-epoch data partition of §4.2.1 · batched augmentation on tensors.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import os
import shutil
import sys
import tarfile
import urllib.parse
import urllib.request
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from localsgd.paths import (  # data.cache_dir/data_dirs are public
    atomic_path,
    cache_dir,
    data_dirs,
    file_lock,
)

# ----------------------------------------------------------------------------------------------
# Checksums and downloads (the folders themselves live in paths.py)
# ----------------------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def mirror_url(filename: str) -> str | None:
    """Where ``$LOCALSGD_MIRROR`` serves ``filename`` (a ``file://`` URL for a folder), or None
    when it is unset. The mirror replaces the original download site, it is no fallback: a file
    it lacks is a download error naming the mirror."""
    base = os.environ.get("LOCALSGD_MIRROR", "").strip()
    if not base:
        return None
    if "://" in base:
        return base.rstrip("/") + "/" + filename
    return (Path(base).expanduser().resolve() / filename).as_uri()


def _download(url: str, dest: Path, sha256: str, timeout: float = 60.0) -> Path:
    """Download ``url`` to ``dest`` atomically, refusing content whose sha256 is not ``sha256``."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        payload = resp.read()
    got = hashlib.sha256(payload).hexdigest()
    if got != sha256:
        raise ValueError(f"download of {url} has sha256 {got}, expected {sha256}; not saved")
    with atomic_path(dest) as tmp:
        tmp.write_bytes(payload)
    return dest


# ----------------------------------------------------------------------------------------------
# LIBSVM format (w8a)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LibsvmSpec:
    """A named LIBSVM data set: its source URL, checksum and expected shape."""

    url: str
    sha256: str
    n_rows: int
    n_features: int


LIBSVM_DATASETS: dict[str, LibsvmSpec] = {
    # Appendix E / §3.4: w8a training set (d = 300, n = 49,749), labels ±1.
    "w8a": LibsvmSpec(
        url="https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary/w8a",
        sha256="b464b4f6ce6a5d9e181ffc793e19a04751036273722312398ef7673705014902",
        n_rows=49_749,
        n_features=300,
    ),
}


def parse_libsvm(path: str | Path, n_features: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Parse a LIBSVM text file (``label idx:val idx:val ...``, 1-based indices) into dense arrays.

    Returns ``A`` (n × d float64) and ``b`` (n float64). ``d`` is ``n_features`` if given, else the
    largest index seen. A malformed line raises ``ValueError`` naming the file and line number.
    """
    path = Path(path)
    labels: list[float] = []
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    with open(path, encoding="ascii", errors="replace") as fh:
        for lineno, line in enumerate(fh, start=1):
            tokens = line.split("#", 1)[0].split()
            if not tokens:
                continue  # blank lines carry no sample
            row = len(labels)
            try:
                labels.append(float(tokens[0]))
                last = 0
                for tok in tokens[1:]:
                    idx_s, sep, val_s = tok.partition(":")
                    if not sep:
                        raise ValueError(f"token {tok!r} is not of the form index:value")
                    idx = int(idx_s)
                    if idx < 1:
                        raise ValueError(f"feature index {idx} must be >= 1 (1-based)")
                    if idx <= last:
                        raise ValueError(f"feature index {idx} not increasing (after {last})")
                    last = idx
                    rows.append(row)
                    cols.append(idx - 1)
                    vals.append(float(val_s))
            except ValueError as err:
                raise ValueError(f"{path}: line {lineno}: malformed LIBSVM line: {err}") from None
    d = max(cols, default=-1) + 1
    if n_features is not None:
        if d > n_features:
            raise ValueError(f"{path}: feature index {d} exceeds n_features={n_features}")
        d = n_features
    A = np.zeros((len(labels), d), dtype=np.float64)
    A[np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)] = vals
    return A, np.asarray(labels, dtype=np.float64)


def _validate(name: str, spec: LibsvmSpec, A: np.ndarray, b: np.ndarray) -> None:
    if A.shape != (spec.n_rows, spec.n_features):
        raise ValueError(
            f"{name}: shape {A.shape}, expected ({spec.n_rows}, {spec.n_features})"
        )
    bad = set(np.unique(b).tolist()) - {-1.0, 1.0}
    if bad:
        raise ValueError(f"{name}: labels must be ±1, found {sorted(bad)}")


def _find_raw(name: str) -> Path | None:
    for folder in data_dirs():
        if (folder / name).is_file():
            return folder / name
    return None


def _npz_load(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path) as z:
        return z["A"], z["b"]


def _npz_save(path: Path, A: np.ndarray, b: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:  # a handle: savez would add ".npz"
        np.savez(fh, A=A, b=b)


def load_libsvm(name_or_path: str | Path, *,
                download: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Load a LIBSVM data set as dense ``(A, b)``: ``A`` n × d float64, ``b`` n float64.

    ``name_or_path`` is a built-in name (``"w8a"``) or a path to any LIBSVM file. A named set is
    looked up as ``$LOCALSGD_DATA/<name>``, then in ``cache_dir()``, else downloaded once from its
    source with the sha256 checked. Parsed arrays are cached as ``.npz`` next to the download.
    """
    name = str(name_or_path)
    if name not in LIBSVM_DATASETS:
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"LIBSVM file {path} not found; give a path or one of {sorted(LIBSVM_DATASETS)}"
            )
        st = path.stat()
        key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()
        npz = cache_dir() / "libsvm" / f"{path.name}-{key[:16]}.npz"
        if npz.is_file():
            return _npz_load(npz)
        A, b = parse_libsvm(path)
        _npz_save(npz, A, b)
        return A, b

    spec = LIBSVM_DATASETS[name]
    npz = cache_dir() / "libsvm" / f"{name}-{spec.sha256[:16]}.npz"
    if npz.is_file():
        A, b = _npz_load(npz)
        _validate(name, spec, A, b)
        return A, b
    raw = _find_raw(name)
    if raw is None:
        dest = cache_dir() / name
        if not download:
            raise FileNotFoundError(_missing_message(name, spec, "downloads are disabled"))
        url = mirror_url(spec.url.rsplit("/", 1)[-1]) or spec.url
        try:
            with file_lock(cache_dir() / f".{name}.lock", f"downloading {name}"):
                raw = _find_raw(name)  # another process may have fetched it meanwhile
                if raw is None:
                    raw = _download(url, dest, spec.sha256)
        except (OSError, ValueError) as err:  # URLError is an OSError
            why = f"download failed: {err}"
            raise FileNotFoundError(_missing_message(name, spec, why)) from err
    got = sha256_file(raw)
    if got != spec.sha256:
        raise ValueError(f"{raw}: sha256 {got} does not match {name}'s {spec.sha256}")
    A, b = parse_libsvm(raw, n_features=spec.n_features)
    _validate(name, spec, A, b)
    _npz_save(npz, A, b)
    return A, b


def _missing_message(name: str, spec: LibsvmSpec, why: str) -> str:
    where = ", ".join(str(d / name) for d in data_dirs())
    return (
        f"data file '{name}' not found (looked at {where}) and {why}. Download it from "
        f"{spec.url} (sha256 {spec.sha256}) and put it at $LOCALSGD_DATA/{name} "
        f"(set the LOCALSGD_DATA environment variable to that folder), or set LOCALSGD_MIRROR "
        f"to a folder or URL holding it."
    )


# ----------------------------------------------------------------------------------------------
# Images: CIFAR-10/100 (§4.1)
# ----------------------------------------------------------------------------------------------

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


def _mix_seed(seed: int, *parts: Any) -> int:
    """A 63-bit generator seed from ``seed`` and ``parts``: distinct inputs, unrelated streams."""
    blob = repr((int(seed), *parts)).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little") & (2**63 - 1)


def _balanced_indices(y: torch.Tensor, n: int | None, num_classes: int,
                      seed: int) -> torch.Tensor | None:
    if n is None:
        return None
    if not 0 <= n <= len(y):
        raise ValueError(f"cannot draw a subset of {n} from {len(y)} images")
    counts = torch.bincount(y, minlength=num_classes)
    g = torch.Generator().manual_seed(seed)
    per_class = torch.full((num_classes,), n // num_classes, dtype=torch.int64)
    per_class[torch.randperm(num_classes, generator=g)[: n % num_classes]] += 1
    short = (per_class > counts).nonzero().flatten()
    if len(short):
        c = int(short[0])
        raise ValueError(f"cannot draw a balanced subset of {n} from {len(y)} images: class {c} "
                         f"would need {int(per_class[c])} and has {int(counts[c])}")
    # shuffle, then group by class (stable): the first per_class[c] of each group are the pick
    perm = torch.randperm(len(y), generator=g)
    by_class = perm[torch.sort(y[perm], stable=True).indices]
    labels = y[by_class]
    start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(len(y)) - start[labels]
    return by_class[rank < per_class[labels]].sort().values


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


class _Source(NamedTuple):
    kind: str  # "jpeg": an image-folder copy (folder or tar); "pickle": torchvision's layout
    path: Path


def _cifar_candidates(name: str, folder: Path) -> list[Path]:
    """Paths under one data dir that may hold ``name``, in the order they are preferred."""
    spec = CIFAR_DATASETS[name]
    # canonical pickles first: the JPEG copies are re-encoded, so their pixels differ slightly
    return [folder / spec.torchvision_folder, folder / f"{name}-jpeg.tar.gz",
            folder / f"{name}-jpeg.tgz", folder / f"{name}-jpeg.tar", folder / f"{name}-jpeg",
            folder / name]


def _find_cifar(name: str) -> tuple[_Source | None, list[Path]]:
    looked: list[Path] = []
    for folder in data_dirs():
        for cand in _cifar_candidates(name, folder):
            looked.append(cand)
            if cand.name == CIFAR_DATASETS[name].torchvision_folder:
                if cand.is_dir():
                    return _Source("pickle", cand), looked
            elif cand.is_file() or ((cand / "train").is_dir() and (cand / "test").is_dir()):
                # a folder without train/ and test/ is something else (e.g. a torchvision root)
                return _Source("jpeg", cand), looked
    return None, looked


def _source_key(name: str, source: _Source) -> str:
    """Cache key: the archive's bytes, the folder's listing, or the canonical archive's md5."""
    h = hashlib.sha256(f"{name}|{source.kind}|".encode())
    if source.kind == "pickle":
        from torchvision import datasets  # deferred: torchvision is slow to import

        # torchvision md5-checks the pickles it reads: every valid copy has the same content
        h.update(getattr(datasets, CIFAR_DATASETS[name].torchvision_class).tgz_md5.encode())
    elif source.path.is_file():
        with open(source.path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    else:
        for f in sorted(p for p in source.path.rglob("*") if p.is_file()):
            st = f.stat()
            h.update(f"{f.relative_to(source.path)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def load_cifar(name: str = "cifar10", *, download: bool = True,
               expected_counts: tuple[int, int] | None = CIFAR_COUNTS) -> ImageDataset:
    """CIFAR-10 or CIFAR-100 (§4.1) as uint8 tensors, decoded once and cached.

    Search order:

    1. each data dir (``$LOCALSGD_DATA`` first, then ``cache_dir()``): torchvision's extracted
       pickles (``cifar-10-batches-py/``, ``cifar-100-python/``), else an image-folder copy laid out
       ``train/<class>/*.jpg`` and ``test/<class>/*.jpg``, packed as ``<name>-jpeg.tar.gz``
       (``.tgz``, ``.tar``) or as a folder ``<name>-jpeg/`` or ``<name>/``. Class folders sort into
       label order (CIFAR's canonical order is alphabetical). Tar members are read in place.
    2. a decoded cache ``cache_dir()/cifar/<name>-<jpeg|pickle>-<key>.npz`` plus
       ``.images.npy`` (uint8, written atomically, images checked by CRC-32). The key hashes the
       source (archive bytes, folder listing, or the canonical archive's md5), so a JPEG copy and
       the canonical pickles never share an entry. A corrupt or invalid entry is decoded again,
       not trusted.
    3. torchvision's canonical archive, md5-checked and extracted into ``cache_dir()``, only when
       ``download`` is true (`_torchvision_download`: once across processes, from
       ``$LOCALSGD_MIRROR`` when set).

    torchvision's pickles are md5-checked when decoded. A torn copy in ``cache_dir()`` (a file
    missing or failing its md5, e.g. left by an older, unlocked download) is removed and
    downloaded again; one in ``$LOCALSGD_DATA``, which is never written, is a ``ValueError``
    naming the file and the fix.

    Counts are validated: ``expected_counts`` (train, test) images, 10 or 100 classes, 3×32×32.
    ``expected_counts=None`` relaxes the count check (tests build tiny copies).

    Measured on the shared 2-core dev box (CI's 19 MB ``cifar10-jpeg.tar.gz``, one core): first
    load ~7 s (read the tar 2.6 s, decode 60,000 JPEGs with PIL 4.1 s, stats 0.15 s, cache
    write); a cached load ~0.1 s (0.3–0.5 s when the cache file is not in the page cache).
    """
    if name not in CIFAR_DATASETS:
        raise ValueError(f"unknown CIFAR data set {name!r}; valid names: {sorted(CIFAR_DATASETS)}")
    source, looked = _find_cifar(name)
    folder = cache_dir() / "cifar"
    if source is not None:
        npz = folder / f"{name}-{source.kind}-{_source_key(name, source)}.npz"
        ds = _load_cifar_cache(npz, name, expected_counts)
        if ds is None:
            try:
                ds = _decode_cifar(name, source)
            except _TornCopy:
                if not (download and source.path.parent.resolve() == cache_dir().resolve()):
                    raise  # $LOCALSGD_DATA is the user's: report, never delete
                _download_cifar(name, looked)  # removes the torn folder (a warning says so)
                ds = _decode_cifar(name, source)
            _validate_cifar(ds, name, expected_counts)
            _save_cifar_cache(npz, ds)
        return ds
    # no raw copy around: a cache decoded earlier still serves (canonical pickles preferred)
    entries = [*sorted(folder.glob(f"{name}-pickle-*.npz")),
               *sorted(folder.glob(f"{name}-jpeg-*.npz"))]
    for npz in entries:
        ds = _load_cifar_cache(npz, name, expected_counts)
        if ds is not None:
            return ds
    if not download:
        raise FileNotFoundError(_cifar_missing(name, looked, "downloads are disabled"))
    _download_cifar(name, looked)
    return load_cifar(name, download=False, expected_counts=expected_counts)


def _download_cifar(name: str, looked: list[Path]) -> None:
    """`_torchvision_download` into ``cache_dir()``; a failure is one ``FileNotFoundError``."""
    try:
        _torchvision_download(name, cache_dir())
    except (OSError, RuntimeError, ValueError) as err:  # URLError is an OSError
        why = f"download failed: {' '.join(str(err).split())}"
        raise FileNotFoundError(_cifar_missing(name, looked, why)) from err


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


def _remove_tree(path: Path) -> None:
    """Move ``path`` aside (one atomic rename: no reader sees it half deleted), then delete it."""
    if not path.exists():
        return
    aside = path.with_name(f".{path.name}.removing{os.getpid()}")
    shutil.rmtree(aside, ignore_errors=True)
    os.rename(path, aside)
    shutil.rmtree(aside, ignore_errors=True)


def _torchvision_download(name: str, root: Path) -> None:
    """torchvision's canonical archive of ``name`` (md5-checked; from ``$LOCALSGD_MIRROR`` when
    set), extracted into ``root/<torchvision folder>`` by one process at a time.

    Under the lock ``root/.<name>.lock`` (`localsgd.paths.file_lock`): a complete folder another
    process made while this one waited is kept (nothing is fetched); a torn folder (a file
    missing or failing its md5) is removed; a partial archive (left by a killed download: its md5
    does not match) is removed and fetched again. The archive is extracted into a staging
    folder, checked file by file and renamed into place, so a reader never sees a partial
    folder; the archive is deleted afterwards.
    """
    from torchvision.datasets import utils as tv_utils  # deferred: slow to import

    cls, spec, root = _tv_class(name), CIFAR_DATASETS[name], Path(root)
    final, archive = root / spec.torchvision_folder, root / cls.filename
    with file_lock(root / f".{name}.lock", f"downloading {name}"):
        if final.is_dir():
            torn = _torn_file(name, final)
            if torn is None:
                return  # another process finished it while this one waited
            warnings.warn(f"{torn}: missing or fails its md5 (a torn download); removing "
                          f"{final} and downloading {name} again", stacklevel=2)
            _remove_tree(final)
        if archive.is_file() and not tv_utils.check_integrity(str(archive), cls.tgz_md5):
            warnings.warn(f"{archive}: a partial or corrupt archive (its md5 is not "
                          f"{cls.tgz_md5}); removing it and downloading it again", stacklevel=2)
            archive.unlink()
        url = mirror_url(cls.filename) or cls.url
        if not archive.is_file():
            _fetch_archive(url, archive, cls.tgz_md5)
        staging = root / f".{spec.torchvision_folder}.partial"
        _remove_tree(staging)
        try:
            with tarfile.open(archive, mode="r:*") as tf:
                tf.extractall(staging, filter="data")
        except (tarfile.TarError, EOFError, zlib.error) as err:
            raise ValueError(f"{archive}: passes its md5 but cannot be extracted ({err})") from err
        torn = _torn_file(name, staging / spec.torchvision_folder)
        if torn is not None:
            raise ValueError(f"{archive}: passes its md5 but its {torn.name} does not")
        os.rename(staging / spec.torchvision_folder, final)
        _remove_tree(staging)
        archive.unlink()


def _fetch_archive(url: str, dest: Path, md5: str) -> None:
    """Fetch ``url`` to ``dest`` and check its md5: a ``file://`` URL (a mirror folder) is copied,
    anything else is torchvision's ``download_url`` (with its progress bar). A wrong md5 is a
    ``ValueError``; nothing partial is left behind (a killed fetch is caught by the md5 check
    before the next one)."""
    from torchvision.datasets import utils as tv_utils  # deferred: slow to import

    print(f"downloading {url} to {dest}", file=sys.stderr, flush=True)
    try:
        if url.startswith("file:"):
            source = Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))
            if not source.is_file():
                raise FileNotFoundError(f"{source} does not exist (LOCALSGD_MIRROR="
                                        f"{os.environ.get('LOCALSGD_MIRROR', '')})")
            with atomic_path(dest) as tmp:
                shutil.copyfile(source, tmp)
        else:
            tv_utils.download_url(url, str(dest.parent), dest.name, md5)
        if not tv_utils.check_integrity(str(dest), md5):
            raise RuntimeError("md5 mismatch")
    except RuntimeError as err:  # torchvision's "File not found or corrupted." after a fetch
        dest.unlink(missing_ok=True)
        raise ValueError(f"{url}: the fetched {dest.name} does not match torchvision's md5 "
                         f"{md5} (partial, or not the canonical file); removed it") from err
    except BaseException:
        dest.unlink(missing_ok=True)
        raise


def _cifar_missing(name: str, looked: list[Path], why: str) -> str:
    spec = CIFAR_DATASETS[name]
    return (
        f"{name} not found (looked for {', '.join(str(p) for p in looked)}, and decoded caches "
        f"{cache_dir() / 'cifar' / name}-*.npz) and {why}. Put an image-folder copy "
        f"({name}-jpeg.tar.gz, or a folder {name}-jpeg/ holding train/<class>/*.jpg and "
        f"test/<class>/*.jpg) or torchvision's {spec.torchvision_folder}/ into a folder and set "
        f"the LOCALSGD_DATA environment variable to it, or pass download=True to let torchvision "
        f"download it into {cache_dir()} (from $LOCALSGD_MIRROR, a folder or URL holding "
        f"torchvision's archive, when set)."
    )


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


# ----------------------------------------------------------------------------------------------
# ImageNet-1k (§4.1, §4.2.2; paper mode only)
# ----------------------------------------------------------------------------------------------

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # the usual per-channel statistics of ImageNet-1k train
IMAGENET_STD = (0.229, 0.224, 0.225)


class ImageFolders(NamedTuple):
    """A train/val pair of ``torchvision.datasets.ImageFolder`` data sets (or class-balanced
    ``Subset``s of them), streamed from disk by `localsgd.train` through ``DataLoader`` workers.
    Items are uint8 ``[3, H, W]`` tensors (`folder_transforms`); the training loop normalizes
    them with ``mean``/``std`` on its device, so a loader batch holds a quarter of the bytes."""

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


# ----------------------------------------------------------------------------------------------
# Data partition (§4.2.1)
# ----------------------------------------------------------------------------------------------


def partition(n: int, world_size: int, epoch: int, seed: int) -> torch.Tensor:
    """This epoch's data partition of §4.2.1: int64 indices of shape ``[K, n // K]``.

    "The data is partitioned among the GPUs and reshuffled globally every epoch": a permutation of
    ``range(n)`` from a generator seeded by a hash of ``(seed, epoch)`` — identical on every worker
    and process, so no communication is needed — split into K disjoint contiguous parts. The
    ``n % K`` samples at the end of the permutation sit out this epoch. Worker k reads row k in
    order, in local mini-batches.
    """
    if world_size < 1 or n < world_size or epoch < 0:
        raise ValueError(f"partition: need 1 <= world_size <= n and epoch >= 0; got n={n}, "
                         f"world_size={world_size}, epoch={epoch}")
    g = torch.Generator().manual_seed(_mix_seed(seed, "partition", epoch))
    per_worker = n // world_size
    return torch.randperm(n, generator=g)[: world_size * per_worker].view(world_size, per_worker)


# ----------------------------------------------------------------------------------------------
# Augmentation and normalization on tensors (§4.1)
# ----------------------------------------------------------------------------------------------


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
