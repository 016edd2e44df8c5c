"""LIBSVM files (w8a, the convex experiments of §3.4 / Appendix E): parsed into dense arrays,
cached as ``.npz``; a named set is downloaded once, its sha256 checked."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localsgd.data.downloads import _download, mirror_url, sha256_file
from localsgd.paths import atomic_path, cache_dir, data_dirs, file_lock


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
