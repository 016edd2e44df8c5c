"""Where files go: the data folders, the writable cache, and atomic writes.

One home for the folder helpers that ``data`` and ``results`` both need, so neither module has to
import the other.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def cache_dir() -> Path:
    """Writable cache folder: ``$LOCALSGD_CACHE`` or ``~/.cache/localsgd`` (created)."""
    path = Path(os.environ.get("LOCALSGD_CACHE") or Path.home() / ".cache" / "localsgd")
    path.mkdir(parents=True, exist_ok=True)
    return path


def data_dirs() -> list[Path]:
    """Folders searched for data files: ``$LOCALSGD_DATA`` first (if set), then ``cache_dir()``."""
    dirs = []
    if os.environ.get("LOCALSGD_DATA"):
        dirs.append(Path(os.environ["LOCALSGD_DATA"]).expanduser())
    dirs.append(cache_dir())
    return dirs


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only on success.

    A reader never sees a half-written file, and an interrupted run leaves the old file intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)
