"""LIBSVM loading: parsing, errors with line numbers, w8a lookup/download/caching."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from localsgd import data


def _shared_w8a() -> str | None:
    """A real w8a file on this machine (read before tests isolate the environment)."""
    found = [d / "w8a" for d in data.data_dirs() if (d / "w8a").is_file()]
    return str(found[0]) if found else None


SHARED_W8A = _shared_w8a()


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """Empty cache, no LOCALSGD_DATA: nothing can be found unless the test puts it there."""
    monkeypatch.setenv("LOCALSGD_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LOCALSGD_DATA", raising=False)
    return tmp_path


def test_cache_and_data_dirs(isolated, monkeypatch):
    assert data.cache_dir() == isolated / "cache" and data.cache_dir().is_dir()
    assert data.data_dirs() == [isolated / "cache"]
    monkeypatch.setenv("LOCALSGD_DATA", str(isolated / "shared"))
    assert data.data_dirs() == [isolated / "shared", isolated / "cache"]


def test_parse_libsvm_dense_values(isolated):
    f = isolated / "toy.svm"
    f.write_text("+1 1:0.5 3:2\n-1\n\n-1 2:1 # comment\n")
    A, b = data.parse_libsvm(f)
    np.testing.assert_array_equal(A, [[0.5, 0, 2], [0, 0, 0], [0, 1, 0]])
    np.testing.assert_array_equal(b, [1, -1, -1])
    A5, _ = data.parse_libsvm(f, n_features=5)
    assert A5.shape == (3, 5)


@pytest.mark.parametrize("bad", ["+1 1:0.5 3\n", "+1 0:1\n", "x 1:1\n", "+1 3:1 2:1\n",
                                 "+1 1:abc\n"])
def test_malformed_line_names_line_number(isolated, bad):
    f = isolated / "bad.svm"
    f.write_text("+1 1:1\n-1 2:1\n" + bad)
    with pytest.raises(ValueError, match=r"bad\.svm: line 3"):
        data.load_libsvm(f)


def test_any_path_loads_and_caches(isolated):
    f = isolated / "toy.svm"
    f.write_text("+1 1:1 2:1\n-1 2:3\n")
    A, b = data.load_libsvm(f)
    assert A.dtype == np.float64 and A.shape == (2, 2)
    cached = list((isolated / "cache" / "libsvm").glob("toy.svm-*.npz"))
    assert len(cached) == 1
    A2, b2 = data.load_libsvm(str(f))
    np.testing.assert_array_equal(A, A2)
    np.testing.assert_array_equal(b, b2)


def test_missing_w8a_offline_clear_error(isolated, monkeypatch):
    def offline(url, dest, sha256, timeout=60.0):
        raise OSError("network is unreachable")

    monkeypatch.setattr(data.libsvm, "_download", offline)  # where load_libsvm looks it up
    with pytest.raises(FileNotFoundError, match="w8a") as err:
        data.load_libsvm("w8a")
    assert "LOCALSGD_DATA" in str(err.value) and "network is unreachable" in str(err.value)


def test_download_checks_sha_and_writes_atomically(isolated, monkeypatch):
    payload = b"+1 1:1\n"

    class Resp:
        def __init__(self, body):
            self.body = body

        def read(self):
            return self.body

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    monkeypatch.setattr(data.downloads.urllib.request, "urlopen",
                        lambda url, timeout: Resp(payload))
    dest = isolated / "dl" / "file"
    good = hashlib.sha256(payload).hexdigest()
    with pytest.raises(ValueError, match="sha256"):
        data._download("https://example.invalid/x", dest, "0" * 64)
    assert not dest.exists()
    data._download("https://example.invalid/x", dest, good)
    assert dest.read_bytes() == payload


def test_w8a_downloaded_into_cache_when_missing(isolated, monkeypatch):
    """The downloader is asked for the LIBSVM URL and its file lands in the cache."""
    shared = SHARED_W8A
    if shared is None:
        pytest.skip("no local w8a copy to stand in for the download")
    calls = []

    def fake_download(url, dest, sha256, timeout=60.0):
        calls.append(url)
        assert sha256 == data.LIBSVM_DATASETS["w8a"].sha256
        Path(dest).write_bytes(Path(shared).read_bytes())
        return Path(dest)

    monkeypatch.setattr(data.libsvm, "_download", fake_download)
    A, b = data.load_libsvm("w8a")
    assert calls == [data.LIBSVM_DATASETS["w8a"].url]
    assert (isolated / "cache" / "w8a").is_file()
    assert A.shape == (49_749, 300) and set(np.unique(b)) == {-1.0, 1.0}
    assert int((b > 0).sum()) == 1_479
    # second load comes from the parsed cache, no download
    data.load_libsvm("w8a")
    assert len(calls) == 1


def test_wrong_w8a_file_rejected(isolated, monkeypatch):
    shared = isolated / "shared"
    shared.mkdir()
    (shared / "w8a").write_text("+1 1:1\n")
    monkeypatch.setenv("LOCALSGD_DATA", str(shared))
    with pytest.raises(ValueError, match="sha256"):
        data.load_libsvm("w8a")
