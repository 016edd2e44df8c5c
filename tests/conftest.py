"""Shared test fixtures: keep tests away from the committed figures/ and the user's cache."""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    # Decoded datasets are worth sharing between tests; result caches are not.
    monkeypatch.setenv("LOCALSGD_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
