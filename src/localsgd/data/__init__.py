"""Data sets: where they live, how they are fetched, and how they are parsed.

Folders: ``$LOCALSGD_DATA`` (read-only copies a user or CI provides) is searched first, then the
writable cache ``cache_dir()`` (``$LOCALSGD_CACHE`` or ``~/.cache/localsgd``), where downloads
and parsed arrays go. ``$LOCALSGD_MIRROR`` (a folder or URL base holding the canonical file names:
``w8a``, ``cifar-10-python.tar.gz``, ``cifar-100-python.tar.gz``) replaces the original download
sites, e.g. on a cluster without internet; checksums are checked all the same (`mirror_url`).

Downloads are written by one process at a time: each holds an inter-process lock in the cache
(`localsgd.paths.file_lock`) and looks again once it has it, so processes started together (the
ranks of a torchrun job, two notebooks, nodes sharing a file system) fetch a file once.

One module per part, every public name re-exported here (``data.load_cifar``):

* `localsgd.data.downloads`: checksums and downloads (`sha256_file`, `mirror_url`).
* `localsgd.data.libsvm`: LIBSVM files (w8a, the convex experiments of §3.4 / Appendix E).
* `localsgd.data.images`: `ImageDataset` (images in memory, §4.1) and the synthetic stand-in.
* `localsgd.data.cifar`: `load_cifar` (CIFAR-10/100, §4.1); `localsgd.data.cifar_files` its
  variants, decoding and decoded cache.
* `localsgd.data.folders`: ImageNet and image folders streamed from disk (§4.1, §4.2.2), and
  `load_image_dataset`, the dispatch by name.
* `localsgd.data.sampling`: the per-epoch data partition of §4.2.1 and class-balanced subsets.
* `localsgd.data.augment`: batched augmentation and normalization on tensors (§4.1).

The modules of this package share their private helpers; a test that monkeypatches one patches
the module whose code calls it (``localsgd.data.cifar._fetch_archive``), not this package.
"""

from __future__ import annotations

from localsgd.data.augment import Augment, normalize
from localsgd.data.cifar import _cifar_candidates as _cifar_candidates
from localsgd.data.cifar import _find_cifar as _find_cifar
from localsgd.data.cifar import load_cifar
from localsgd.data.cifar_files import CIFAR10_CLASSES, CIFAR_COUNTS, CIFAR_DATASETS, CifarSpec
from localsgd.data.downloads import _download as _download
from localsgd.data.downloads import _fetch_archive as _fetch_archive
from localsgd.data.downloads import mirror_url, sha256_file
from localsgd.data.folders import (
    IMAGE_DATASETS,
    IMAGENET_MEAN,
    IMAGENET_STD,
    SYNTHETIC_COUNTS,
    ImageFolders,
    SeededItems,
    balanced_folder_subset,
    folder_transforms,
    imagenet_folders,
    load_image_dataset,
    standin_folders,
    write_image_folders,
)
from localsgd.data.images import ImageDataset, synthetic_image_dataset
from localsgd.data.libsvm import LIBSVM_DATASETS, LibsvmSpec, load_libsvm, parse_libsvm
from localsgd.data.sampling import partition
from localsgd.paths import cache_dir, data_dirs  # data.cache_dir/data_dirs are public

__all__ = [
    "CIFAR10_CLASSES",
    "CIFAR_COUNTS",
    "CIFAR_DATASETS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "IMAGE_DATASETS",
    "LIBSVM_DATASETS",
    "SYNTHETIC_COUNTS",
    "Augment",
    "CifarSpec",
    "ImageDataset",
    "ImageFolders",
    "LibsvmSpec",
    "SeededItems",
    "balanced_folder_subset",
    "cache_dir",
    "data_dirs",
    "folder_transforms",
    "imagenet_folders",
    "load_cifar",
    "load_image_dataset",
    "load_libsvm",
    "mirror_url",
    "normalize",
    "parse_libsvm",
    "partition",
    "sha256_file",
    "standin_folders",
    "synthetic_image_dataset",
    "write_image_folders",
]
