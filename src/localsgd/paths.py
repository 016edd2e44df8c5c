"""Where files go: the data folders, the writable cache, atomic writes and inter-process locks.

One home for the folder helpers that ``data`` and ``results`` both need, so neither module has to
import the other.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
import warnings
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


@contextlib.contextmanager
def file_lock(path: str | os.PathLike, what: str = "") -> Iterator[None]:
    """Hold an exclusive inter-process lock on the file ``path`` (created, and kept) while inside.

    ``fcntl.flock``: it serializes processes on one machine and, on a shared file system that
    supports locks (NFSv4, Lustre, GPFS), processes on different nodes; the kernel releases it
    when its holder dies, so a killed download never leaves a stale lock. A process that has to
    wait says so once on stderr, naming ``what`` it waits for and the lock file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: filelock (a torch dependency) picks the platform's lock
        from filelock import FileLock

        with FileLock(path):
            yield
        return
    with open(path, "a+b") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another process to finish {what or 'its work'} (lock {path})",
                  file=sys.stderr, flush=True)
            fcntl.flock(fh, fcntl.LOCK_EX)
        except OSError as err:  # a file system without locks (ENOLCK, EOPNOTSUPP): go on
            warnings.warn(f"{path}: this file system does not support file locks ({err}); "
                          "going on without one", stacklevel=3)
            yield
            return
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def append_event(path: str | os.PathLike, kind: str, **fields: object) -> None:
    """Append one JSON line ``{"kind", "pid", "end", **fields}`` to ``path`` in one short
    append-mode write, so processes sharing the file do not interleave lines (the runner's
    ``--phases`` and the reproduction's profiler write this format)."""
    line = json.dumps({"kind": kind, "pid": os.getpid(), "end": time.time(), **fields}) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
