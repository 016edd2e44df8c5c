"""CIFAR-10/100 (§4.1): `load_cifar` finds a copy (or a decoded cache), decodes it once, and
downloads torchvision's canonical archive when there is none (once across processes)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import warnings
import zlib
from pathlib import Path

from localsgd.data.cifar_files import (
    CIFAR_COUNTS,
    CIFAR_DATASETS,
    _decode_cifar,
    _load_cifar_cache,
    _save_cifar_cache,
    _Source,
    _torn_file,
    _TornCopy,
    _tv_class,
    _validate_cifar,
)
from localsgd.data.downloads import _fetch_archive, mirror_url
from localsgd.data.images import ImageDataset
from localsgd.paths import cache_dir, data_dirs, file_lock


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
