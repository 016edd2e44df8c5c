"""Data prepared once before the ranks read it, and torn downloads detected by checksum.

There is no internet here: a tiny fake CIFAR-10 in torchvision's pickle format is packed as
``cifar-10-python.tar.gz`` and served by ``$LOCALSGD_MIRROR``: a folder in-process (fetches
counted at ``data.cifar._fetch_archive``), a local HTTP server for the child processes (fetches
counted at torchvision's ``_urlretrieve``, which the code before this fix used too, and slowed
down so that ranks downloading at once overlap). torchvision's md5s are patched to the fake's.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import subprocess
import sys
import tarfile
import textwrap
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch

from localsgd import data

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
SRC = str(Path(__file__).resolve().parents[1] / "src")
ARCHIVE = "cifar-10-python.tar.gz"
FOLDER = "cifar-10-batches-py"
TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]


def _md5(blob: bytes) -> str:
    return hashlib.md5(blob, usedforsecurity=False).hexdigest()


def _fake_cifar10(folder: Path) -> dict:
    """``folder/cifar-10-python.tar.gz``: 5 x 10 training and 10 test images in torchvision's
    layout; returns the CIFAR10 class attributes (md5s) that make torchvision accept it."""
    rng = np.random.default_rng(0)
    files = {}
    for name in [*TRAIN_FILES, "test_batch"]:
        files[name] = pickle.dumps({"data": rng.integers(0, 256, (10, 3072), dtype=np.uint8),
                                    "labels": list(range(10))})
    files["batches.meta"] = pickle.dumps({"label_names": list(data.CIFAR10_CLASSES)})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, blob in files.items():
            info = tarfile.TarInfo(f"{FOLDER}/{name}")
            info.size = len(blob)
            tf.addfile(info, io.BytesIO(blob))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ARCHIVE).write_bytes(buf.getvalue())
    return {"tgz_md5": _md5(buf.getvalue()),
            "train_list": [[n, _md5(files[n])] for n in TRAIN_FILES],
            "test_list": [["test_batch", _md5(files["test_batch"])]],
            "meta": {"filename": "batches.meta", "key": "label_names",
                     "md5": _md5(files["batches.meta"])}}


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Empty ``$LOCALSGD_DATA`` and cache, the fake archive in ``$LOCALSGD_MIRROR``, torchvision
    patched to accept it, and ``fetches``: the URLs actually fetched."""
    import torchvision.datasets.cifar as tv_cifar

    attrs = _fake_cifar10(tmp_path / "mirror")
    for key, value in attrs.items():
        monkeypatch.setattr(tv_cifar.CIFAR10, key, value)
    monkeypatch.setenv("LOCALSGD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("LOCALSGD_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("LOCALSGD_MIRROR", str(tmp_path / "mirror"))
    (tmp_path / "data").mkdir()
    fetches: list[str] = []
    real = data._fetch_archive

    def counted(url, *args, **kwargs):
        fetches.append(url)
        return real(url, *args, **kwargs)

    monkeypatch.setattr(data.cifar, "_fetch_archive", counted)  # where its caller looks it up
    return {"root": tmp_path, "attrs": attrs, "fetches": fetches}


@pytest.fixture
def http_base(fake):
    """A local HTTP server for ``fake["root"]``; its base URL."""
    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(fake["root"])))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _load() -> data.ImageDataset:
    return data.load_cifar("cifar10", expected_counts=None)


# ---------------------------------------------------------------------------------- in-process
def test_mirror_download_extracts_atomically_and_removes_the_archive(fake):
    ds = _load()
    cache = fake["root"] / "cache"
    assert fake["fetches"] == [(fake["root"] / "mirror" / ARCHIVE).as_uri()]
    assert ds.source == f"torchvision pickles {cache / FOLDER}"
    assert (len(ds.train_y), len(ds.test_y)) == (50, 10)
    assert not (cache / ARCHIVE).exists() and not (cache / f".{FOLDER}.partial").exists()
    assert "decoded cache" in _load().source and len(fake["fetches"]) == 1


def test_partial_archive_in_cache_is_fetched_again(fake):
    cache = fake["root"] / "cache"
    cache.mkdir()
    good = (fake["root"] / "mirror" / ARCHIVE).read_bytes()
    (cache / ARCHIVE).write_bytes(good[: len(good) // 2])  # a killed download
    with pytest.warns(UserWarning, match="partial or corrupt archive"):
        ds = _load()
    assert len(fake["fetches"]) == 1 and (len(ds.train_y), len(ds.test_y)) == (50, 10)
    assert not (cache / ARCHIVE).exists()


def test_torn_folder_in_cache_is_fetched_again(fake):
    ds = _load()
    cache = fake["root"] / "cache"
    for f in (cache / "cifar").iterdir():  # no decoded cache: the pickles are read again
        f.unlink()
    torn = cache / FOLDER / "data_batch_3"
    torn.write_bytes(torn.read_bytes()[:100])
    with pytest.warns(UserWarning, match="data_batch_3: missing or fails its md5"):
        again = _load()
    assert len(fake["fetches"]) == 2
    assert torch.equal(again.train_x, ds.train_x) and torch.equal(again.test_y, ds.test_y)


def test_torn_folder_in_localsgd_data_is_reported_in_one_line(fake):
    _load()  # a good copy, moved into $LOCALSGD_DATA, then torn
    root = fake["root"]
    for f in (root / "cache" / "cifar").iterdir():
        f.unlink()
    os.rename(root / "cache" / FOLDER, root / "data" / FOLDER)
    torn = root / "data" / FOLDER / "test_batch"
    torn.unlink()
    with pytest.raises(ValueError) as err:
        _load()
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{torn}: missing or fails torchvision's md5")
    assert "replace the folder with a complete copy" in msg
    assert len(fake["fetches"]) == 1 and (root / "data" / FOLDER).is_dir()  # never deleted


def test_bad_mirror_is_a_one_line_error(fake):
    mirror = fake["root"] / "mirror" / ARCHIVE
    mirror.write_bytes(mirror.read_bytes()[:-10])  # md5 no longer matches
    with pytest.raises(FileNotFoundError) as err:
        _load()
    msg = str(err.value)
    assert "\n" not in msg and "does not match torchvision's md5" in msg
    assert not (fake["root"] / "cache" / ARCHIVE).exists()  # nothing partial kept
    mirror.unlink()
    with pytest.raises(FileNotFoundError, match=f"download failed: .*{ARCHIVE} does not exist "
                       r"\(LOCALSGD_MIRROR=") as err:
        _load()
    assert "\n" not in str(err.value)


def test_libsvm_download_comes_from_the_mirror(fake, monkeypatch):
    text = b"1 1:0.5 3:1\n-1 2:1\n"
    (fake["root"] / "mirror" / "tiny").write_bytes(text)
    spec = data.LibsvmSpec(url="https://example.invalid/libsvm/tiny",
                           sha256=hashlib.sha256(text).hexdigest(), n_rows=2, n_features=3)
    monkeypatch.setitem(data.LIBSVM_DATASETS, "tiny", spec)
    A, b = data.load_libsvm("tiny")
    assert A.tolist() == [[0.5, 0, 1], [0, 1, 0]] and b.tolist() == [1, -1]
    assert (fake["root"] / "cache" / "tiny").read_bytes() == text


# ---------------------------------------------------------------------------------- processes
DRIVER = '''
import json, os, sys, time
import torchvision.datasets.cifar as tv_cifar
import torchvision.datasets.utils as tv_utils

for key, value in json.loads(os.environ["FAKE_CIFAR10"]).items():
    setattr(tv_cifar.CIFAR10, key, value)
real = tv_utils._urlretrieve

def counted(url, filename, *args, **kwargs):
    with open(os.environ["FETCH_LOG"], "a") as fh:
        fh.write(json.dumps([os.environ.get("RANK"), url]) + "\\n")
    time.sleep(3.0)  # a slow network: downloads started together overlap
    return real(url, filename, *args, **kwargs)

tv_utils._urlretrieve = counted
from localsgd import data

data.load_cifar.__kwdefaults__["expected_counts"] = None  # the fake is tiny
load_cifar, depth = data.load_cifar, [0]

def logged(*args, **kwargs):  # logs the outermost call (load_cifar calls itself once)
    depth[0] += 1
    try:
        ds = load_cifar(*args, **kwargs)
    finally:
        depth[0] -= 1
    if depth[0] == 0:
        with open(os.environ["LOAD_LOG"], "a") as fh:
            fh.write(json.dumps([os.environ.get("RANK"), ds.source]) + "\\n")
    return ds

data.load_cifar = data.folders.load_cifar = logged  # load_image_dataset calls the latter
if sys.argv[1] == "load":
    logged("cifar10")
else:
    from localsgd.training import runner

    sys.exit(runner.main(sys.argv[2:]))
'''


def _log(path: Path) -> list[list]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _driver(fake: dict, http_base: str) -> tuple[Path, dict]:
    """The driver script and its environment: the mirror is served over HTTP, and torchvision's
    own URL points at a second copy of the fake (``origin/``), so a download that ignores the
    mirror (the code before the fix) is seen too."""
    root = fake["root"]
    (root / "driver.py").write_text(textwrap.dedent(DRIVER))
    _fake_cifar10(root / "origin")
    attrs = dict(fake["attrs"], url=f"{http_base}/origin/{ARCHIVE}")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", NO_PROXY="127.0.0.1",
               no_proxy="127.0.0.1", LOCALSGD_MIRROR=f"{http_base}/mirror",
               PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
               FAKE_CIFAR10=json.dumps(attrs), FETCH_LOG=str(root / "fetches.jsonl"),
               LOAD_LOG=str(root / "loads.jsonl"))
    return root / "driver.py", env


def _tiny_config(root: Path) -> Path:
    path = root / "run.yaml"
    path.write_text(json.dumps({"dataset": "cifar10", "model": "resnet20", "width": 0.25,
                                "local_batch": 5, "epochs": 1.0, "eval_batch": 10,
                                "augment": False, "device": "cpu"}))
    return path


def test_torchrun_ranks_download_once_and_both_load(fake, http_base):
    # an empty data folder and cache, two ranks started together: LOCAL_RANK 0 downloads (once)
    # and decodes, rank 1 waits and then loads the prepared cache. Before the fix both ranks
    # downloaded into one folder at once (two fetches of the origin URL, 3 s each, overlapping).
    driver, env = _driver(fake, http_base)
    root = fake["root"]
    cfg = _tiny_config(root)
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node", "2", str(driver), "runner",
           "--config", str(cfg), "--out", str(root / "out"), "--no-progress"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    fetches = _log(root / "fetches.jsonl")
    assert fetches == [["0", f"{http_base}/mirror/{ARCHIVE}"]], fetches
    loads = _log(root / "loads.jsonl")
    assert sorted(rank for rank, _ in loads) == ["0", "1"], loads
    loads = dict(loads)
    assert loads["0"] == f"torchvision pickles {root / 'cache' / FOLDER}"
    assert loads["1"].startswith(loads["0"]) and "decoded cache" in loads["1"]
    assert (root / "out" / "records.csv").is_file()


def test_independent_processes_download_once(fake, http_base):
    # two processes that know nothing of each other (two notebooks, two nodes sharing the
    # cache) load at once: the lock in the cache lets one fetch; the other finds its copy
    driver, env = _driver(fake, http_base)
    root = fake["root"]
    procs = [subprocess.Popen([sys.executable, str(driver), "load"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=90) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    assert len(_log(root / "fetches.jsonl")) == 1, _log(root / "fetches.jsonl")
    assert len(_log(root / "loads.jsonl")) == 2


def test_torchrun_preparation_error_is_one_line_on_every_rank(fake, http_base):
    # the mirror lacks the archive: LOCAL_RANK 0 fails, rank 1 (waiting) gets its message
    # instead of waiting for ever; rank 0 prints it once, and nothing trains
    driver, env = _driver(fake, http_base)
    root = fake["root"]
    (root / "mirror" / ARCHIVE).unlink()
    cfg = _tiny_config(root)
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node", "2", str(driver), "runner",
           "--config", str(cfg), "--out", str(root / "out"), "--no-progress"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if "error: cifar10 not found" in line]
    assert len(errors) == 1 and "download failed" in errors[0], r.stderr[-3000:]
    assert errors[0].startswith("error: cifar10 not found") and "LOCALSGD_MIRROR" in errors[0]
    assert all(rank == "0" for rank, _ in _log(root / "fetches.jsonl"))  # rank 1 never tries
    assert not (root / "out" / "records.csv").exists()
