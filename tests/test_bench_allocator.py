"""The harness's allocator setting: kernels inherit it unless the caller set it, and
`localsgd bench allocator` measures it in fresh processes with and without it."""

from __future__ import annotations

import json
import subprocess
import sys

from localsgd.paper.bench import allocator


def test_the_harness_sets_the_allocator_for_its_kernels_unless_the_caller_did(monkeypatch):
    for var in allocator.ALLOCATOR_ENV:
        monkeypatch.delenv(var, raising=False)
    assert allocator.allocator_env() == allocator.ALLOCATOR_ENV
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")  # the caller's choice wins
    assert allocator.allocator_env()["MALLOC_MMAP_THRESHOLD_"] == "131072"


def test_bench_allocator_runs_both_allocators_in_fresh_processes():
    out = subprocess.run([sys.executable, "-m", "localsgd", "bench", "allocator", "--width",
                          "0.25", "--batch", "4", "--steps", "1", "--pairs", "1", "--json"],
                         capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["images_per_s_default"] > 0 and result["images_per_s_kept"] > 0
    assert result["ratios"] == [result["images_per_s_kept"] / result["images_per_s_default"]]
    assert result["allocator_env"] == allocator.ALLOCATOR_ENV
