"""Checksums and downloads (the folders themselves live in `localsgd.paths`).

`sha256_file`, `mirror_url` (``$LOCALSGD_MIRROR`` in place of the original download sites), and
the two fetchers: `_download` (sha256-checked, for LIBSVM files) and `_fetch_archive`
(md5-checked, for torchvision's CIFAR archives).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import urllib.parse
import urllib.request
from pathlib import Path

from localsgd.paths import atomic_path


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
