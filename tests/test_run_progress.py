"""`localsgd.paper.run_progress`: the kernel's per-run events reach the harness's console whole,
one line each, in order, and a line still being written waits for its end."""

from __future__ import annotations

import dataclasses
import time

import pytest

from localsgd.paper import run_progress


def test_follower_prints_whole_lines_in_order_and_waits_for_a_partial_one(tmp_path, monkeypatch):
    events = tmp_path / "runs.jsonl"
    monkeypatch.setenv(run_progress.ENV, str(events))
    seen: list[str] = []
    with run_progress.Follower(events, "fig06", seen.append, every=0.01):
        run_progress.record("run", index=1, runs=2, cached=True, what="local_steps=1")
        run_progress.record("run_done", index=1, runs=2, cached=True, what="local_steps=1",
                            seconds=0.1, test_acc=79.456)
        run_progress.record("run", index=2, runs=2, cached=False, what="local_steps=16")
        with open(events, "a", encoding="utf-8") as f:
            f.write('{"kind": "run_done", "index": 2, "ru')  # the kernel is mid-write
            f.flush()
            time.sleep(0.1)
            assert len(seen) == 3  # the partial line is not printed
            f.write('ns": 2, "what": "local_steps=16", "seconds": 812.4, "test_acc": 78.9}\n')
    assert seen == ["fig06: run 1/2 (local_steps=1) cached",
                    "fig06: run 1/2 (local_steps=1) read from the cache, test top-1 79.46 %",
                    "fig06: run 2/2 (local_steps=16) training",
                    "fig06: run 2/2 (local_steps=16) trained in 812 s, test top-1 78.90 %"]


def test_a_run_is_named_by_what_tells_it_apart_from_the_others():
    @dataclasses.dataclass(frozen=True)
    class C:
        lr: float = 0.1
        local_steps: int = 1
        seed: int = 0

    grid = [C(local_steps=h, seed=s) for h in (1, 8) for s in (0, 1)]
    apart = run_progress.varying(grid)
    assert apart == ["local_steps", "seed"]
    assert run_progress.describe(grid[3], apart) == "local_steps=8, seed=1"
    assert run_progress.varying(grid[:1]) == []


def test_the_proxy_estimate_charges_a_large_local_batch_its_slower_images():
    # Table 1's mini-batch SGD (B_loc = 2,048) took 1.86x as long per image as B_loc = 128
    base = run_progress.proxy_seconds(1_000_000)
    assert base == pytest.approx(1_000_000 / run_progress.CONVERGED_IMAGES_PER_S)
    assert run_progress.proxy_seconds(1_000_000, 2048) == pytest.approx(base * 877 / 471)
    assert run_progress.proxy_seconds(1_000_000, 8192) == run_progress.proxy_seconds(1_000_000, 2048)
    assert run_progress.proxy_seconds(1_000_000, 32) == base
    assert base < run_progress.proxy_seconds(1_000_000, 512) < base * 877 / 471
    assert "about 1.0 h at 1,264 images/s, 1.86x longer per image at B_loc = 2,048" in \
        run_progress.proxy_time(3600)
