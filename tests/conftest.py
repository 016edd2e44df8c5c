"""Shared test fixtures: keep tests away from the committed figures/ and the user's cache."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


DECODED = ("cifar", "libsvm")  # the cache's decoded data sets (written atomically)


def _session_cache(tmp_path_factory) -> Path:
    """This worker's cache, whose decoded data sets are shared by every worker of the session:
    under pytest-xdist each worker has a base folder of its own inside the session's, and each
    would otherwise decode CIFAR-10's 60,000 JPEGs again (about 7 s of CPU)."""
    base = tmp_path_factory.getbasetemp()
    cache = base / "cache"
    if not cache.is_dir():
        session = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
        _link_decoded(cache, session / "decoded")
    return cache


def _link_decoded(cache: Path, shared: Path) -> Path:
    """A new cache folder whose decoded data sets are links into ``shared``."""
    cache.mkdir()
    for sub in DECODED:
        (shared / sub).mkdir(parents=True, exist_ok=True)
        (cache / sub).symlink_to(shared / sub, target_is_directory=True)
    return cache


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    # Decoded datasets are worth sharing between tests; result caches are not.
    monkeypatch.setenv("LOCALSGD_CACHE", str(_session_cache(tmp_path_factory)))
    # no test reads or writes the committed kept runs (figures/*/runs/) unless it sets its own
    # folder (grid.RUNS_ENV; empty: none), nor leaves one set for the tests after it
    monkeypatch.setenv("LOCALSGD_RUNS", "")


@pytest.fixture
def fresh_cache(tmp_path):
    """Makes an empty results cache of the test's own, ``tmp_path/<name>``, that shares the
    session's decoded data sets (links to its ``cifar/`` and ``libsvm/``): decoding CIFAR-10's
    60,000 JPEGs again would cost each such test about 7 s of CPU."""
    def make(name: str = "cache") -> Path:
        return _link_decoded(tmp_path / name, Path(os.environ["LOCALSGD_CACHE"]))
    return make


@pytest.fixture(scope="session")
def slowdown():
    """How much slower this machine runs the package's fixed speed probe (`localsgd.paper.speed`)
    than the machine that committed figures/machine_speed.json, at least 1: wall-clock bounds
    in tests are multiplied by it, so a slower CPU model or a loaded machine moves the bound
    with the code's own speed instead of failing (measured in the same run)."""
    import json

    from localsgd.paper import speed

    reference = json.loads((REPO / "figures" / speed.SPEED_FILE).read_text())["probe_seconds"]
    return max(1.0, speed.probe(repeats=3) / reference)
