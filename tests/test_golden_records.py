"""Kept runs are keyed by meaning, not code (`localsgd.training.results_key`); this test is what
makes that safe. It trains the golden runs (tests/golden_records.py: every schedule kind on the
sequential, vmap and packed replica engines and on DDP under torchrun, float64) and compares
their records with the committed ones: numbers that change while RESULTS_VERSION stays fail."""

import json

import golden_records as golden
import pandas as pd
import pytest

from localsgd.training.results_key import RESULTS_VERSION


def test_golden_records_are_unchanged_or_the_results_version_was_bumped():
    meta = json.loads(golden.GOLDEN.with_suffix(".json").read_text())
    if meta["results_version"] != RESULTS_VERSION:
        pytest.fail(f"RESULTS_VERSION is {RESULTS_VERSION}, the golden records are of version "
                    f"{meta['results_version']}: write them again (python "
                    "tests/golden_records.py) and commit them with the bump", pytrace=False)
    problems = golden.differences(golden.compute(), pd.read_csv(golden.GOLDEN),
                                  same_machine=golden.machine() == {
                                      k: meta[k] for k in ("cpu", "torch")})
    if problems:
        pytest.fail(f"results changed but RESULTS_VERSION is still {RESULTS_VERSION}: bump it "
                    "in src/localsgd/training/results_key.py and run python "
                    "tests/golden_records.py "
                    f"(or undo the change); {len(problems)} differences, the first: "
                    f"{problems[0]}", pytrace=False)


def test_the_golden_runs_cover_every_schedule_kind_and_engine():
    cfgs = {name: golden.config(name) for name in golden.RUNS}
    engines = {engine for engine, _ in golden.RUNS.values()}
    assert engines == {"sequential", "vmap", "packed", "ddp"}
    kinds = {
        "local": lambda c: c.local_steps > 1 and c.block_size is None,
        "hierarchical + hybrid momentum": lambda c: c.block_steps > 1
        and c.momentum_scheme == "hybrid",
        "post-local": lambda c: c.post_local_warmup_epochs > 0,
        "local-step warm-up": lambda c: c.local_step_warmup_epochs > 0,
        "global momentum": lambda c: c.momentum_scheme == "global",
        "block gradient all-reduce": lambda c: c.block_gradient_allreduce,
        "slowmo": lambda c: c.slowmo_frequency is not None and not c.gossip,
        "sgp": lambda c: c.gossip,
        "lr tricks": lambda c: c.scale_lr and c.warmup_epochs > 0,
        "float32": lambda c: c.dtype == "float32",
    }
    for kind, has in kinds.items():
        assert any(has(c) for c in cfgs.values()), kind
    for kind in ("hierarchical + hybrid momentum", "slowmo", "sgp"):  # also under torchrun
        assert any(kinds[kind](cfgs[n]) for n, (e, _) in golden.RUNS.items() if e == "ddp"), kind


def test_a_changed_number_is_found_and_named():
    ref = pd.read_csv(golden.GOLDEN)
    assert golden.differences(ref, ref, same_machine=True) == []
    moved = ref.copy()
    i = moved.index[moved["run"] == "slowmo"][2]
    moved.loc[i, "test_loss"] *= 1 + 1e-7  # far below any plotted digit, far above round-off
    (line,) = golden.differences(moved, ref, same_machine=True)
    assert line.startswith("slowmo: test_loss at step")
    f32 = moved.index[moved["run"] == "float32_proxy"][1]
    moved.loc[f32, "train_loss"] *= 1.5
    assert len(golden.differences(moved, ref, same_machine=True)) == 2
    assert len(golden.differences(moved, ref, same_machine=False)) == 1  # float32: CPU-bound
