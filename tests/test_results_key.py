"""Kept runs are keyed by what changes their numbers (`localsgd.training.results_key`), not by the
library's code: a docstring, a private name or a new config field with a default keeps every
kept run; a run is served only when its stored parameters are the asked run's."""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from localsgd.paper.experiments import grid
from localsgd.training import results_key
from localsgd.training.config import EXECUTION, RECIPE, TrainConfig
from localsgd.training.results_key import (
    NOT_IN_KEY,
    RESULTS_VERSION,
    UNUSED_WHEN,
    same_run,
)
from localsgd.training.results_key import results_key as key_of

REPO = Path(__file__).resolve().parents[1]
KEPT = REPO / "figures" / "converged" / "runs"
# a valid value other than the default, for the string fields
OTHER_STRING = {"dataset": "synthetic", "model": "mlp", "momentum_scheme": "none",
                "device": "cuda", "dtype": "float64", "precision": "fp32",
                "memory_format": "contiguous", "average_compression": "int8",
                "optimizer": "adamw", "churn_rejoin": "zero"}


def _other(field: dataclasses.Field, cfg: TrainConfig):
    value = getattr(cfg, field.name)
    if isinstance(value, bool):
        return not value
    if field.name in ("batched", "packed"):
        return True
    if field.name in ("world_size", "block_size"):  # K' must divide K
        return value * 2
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 0.5 if field.name not in ("slowmo_momentum",) else 0.25
    if field.name == "adam_betas":
        return (0.8, 0.99)
    if isinstance(value, tuple):
        return (0.6,)
    if value is None:
        return {"n_train": 100, "n_test": 100, "block_size": 2, "global_momentum": 0.5,
                "slowmo_frequency": 4, "worker_local_steps": (2, 1, 2, 1),
                "resolution": 16, "qsr_alpha": 0.5}[field.name]
    if field.name not in OTHER_STRING:
        pytest.fail(f"TrainConfig.{field.name}: add a valid non-default value to OTHER_STRING")
    return OTHER_STRING[field.name]


FLAT = {"block_size": None, "block_steps": 1}


def test_every_field_that_can_change_results_is_in_the_key():
    hierarchy = {"world_size": 4, "block_size": 2, "local_steps": 2, "block_steps": 2}
    base = TrainConfig(**hierarchy)
    # bases where the fields UNUSED_WHEN names are used
    using = {"global_momentum": {"momentum_scheme": "hybrid"},
             "global_lr": {"momentum_scheme": "hybrid"},
             "global_nesterov": {"momentum_scheme": "hybrid"},
             "slowmo_momentum": {"slowmo_frequency": 4}, "slowmo_lr": {"slowmo_frequency": 4},
             "compression_feedback": {"average_compression": "int8"},
             "compression_density": {"average_compression": "topk"},
             "churn_away_rounds": {"churn_rate": 0.5, **FLAT},
             "churn_rejoin": {"churn_rate": 0.5, **FLAT},
             "quorum_grace_steps": {"quorum": 3, **FLAT}, "quorum_stall_rate": {"quorum": 3, **FLAT},
             "quorum_stall_steps": {"quorum": 3, **FLAT},
             "adam_betas": {"optimizer": "adamw"},
             "overlap_steps": {"fragments": 1, **FLAT}, "fragment_mixing": {"fragments": 1, **FLAT}}
    assert set(using) == set(UNUSED_WHEN)
    # streaming fragments and per-worker H run on a flat topology only
    needs = {"fragments": FLAT, "worker_local_steps": FLAT, "qsr_alpha": FLAT,
             "churn_rate": FLAT, "quorum": FLAT, "outer_delay": {"momentum_scheme": "hybrid"}}
    for field in dataclasses.fields(TrainConfig):
        here = dataclasses.replace(base, **using.get(field.name, needs.get(field.name, {})))
        changed = dataclasses.replace(here, **{field.name: _other(field, here)})
        if field.name in NOT_IN_KEY:
            assert len(NOT_IN_KEY[field.name]) > 20, f"{field.name}: say why it is left out"
            assert key_of(changed) == key_of(here), field.name
        else:
            assert key_of(changed) != key_of(here), f"{field.name} is left out of the key " \
                "without a reason in results_key.NOT_IN_KEY"
        if field.name in UNUSED_WHEN:  # and where the run does not use it, it is not in the key
            unused = dataclasses.replace(changed, **{k: getattr(base, k)
                                                     for k in using[field.name]})
            assert UNUSED_WHEN[field.name][0](unused) and key_of(unused) == key_of(base)
    assert set(NOT_IN_KEY) <= {f.name for f in dataclasses.fields(TrainConfig)}
    assert set(NOT_IN_KEY) <= set(EXECUTION)  # the recipe is always in the key
    assert key_of(base) == {"results_version": RESULTS_VERSION, **hierarchy}
    assert key_of(TrainConfig()) == {"results_version": RESULTS_VERSION}


def test_the_recipe_and_its_execution_split_every_field():
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    # the partition is by construction (RECIPE is every field not in EXECUTION): what is tested
    # is which fields are execution, and that each is a field
    assert set(EXECUTION) == {"batched", "packed", "compile_replicas", "device", "dtype",
                              "precision", "deterministic", "memory_format", "host_threads",
                              "loader_workers", "eval_batch", "check_consistency"}
    assert sorted(RECIPE + EXECUTION) == sorted(names)
    cfg = TrainConfig(world_size=4, local_steps=8, lr=0.2)
    assert {**cfg.recipe(), **cfg.execution()} == cfg.to_dict()
    on_gpu = cfg.run_as(device="cuda", precision="tf32", batched=True)
    assert on_gpu.recipe() == cfg.recipe() and on_gpu.device == "cuda"
    # a recipe field is refused in one line, naming it
    with pytest.raises(ValueError, match=r"\['lr'\] is a recipe field") as err:
        cfg.run_as(device="cuda", lr=0.4)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"\['epochs', 'seed'\] are recipe fields"):
        cfg.run_as(seed=1, epochs=3.0)
    # the execution choices that change numbers are in the key, the others are not
    assert key_of(on_gpu) != key_of(cfg)
    assert key_of(cfg.run_as(host_threads=2, eval_batch=10)) == key_of(cfg)


def test_a_new_field_with_a_default_keeps_old_keys_and_stored_parameters(monkeypatch):
    cfg = TrainConfig(local_steps=4, seed=2, epochs=20.0)
    before, stored = key_of(cfg), cfg.to_dict()
    newer = dataclasses.make_dataclass(
        "TrainConfig", [("outer_fragments", int, dataclasses.field(default=1))],
        bases=(TrainConfig,), frozen=True)
    monkeypatch.setattr(results_key, "TrainConfig", newer)
    asked = newer(local_steps=4, seed=2, epochs=20.0)
    assert key_of(asked) == before
    assert same_run(stored, asked)  # the stored .json lacks the field: it was at its default
    assert not same_run(stored, newer(local_steps=4, seed=2, epochs=20.0, outer_fragments=2))


def test_stored_parameters_decide_not_the_file_name():
    cfg = TrainConfig(local_steps=4, seed=2)
    assert same_run(cfg.to_dict(), cfg)
    assert same_run({**cfg.to_dict(), "eval_batch": 50, "host_threads": 2}, cfg)
    assert not same_run({**cfg.to_dict(), "seed": 3}, cfg)
    assert not same_run({**cfg.to_dict(), "removed_field": 1}, cfg)  # another library's run
    assert not same_run({**cfg.to_dict(), "local_steps": "four"}, cfg)


def test_one_value_has_one_key_however_it_is_spelled():
    # `--set epochs=20` or a cell edit `epochs = 20` is the run kept as epochs 20.0
    cfg = TrainConfig(epochs=20.0, decay_fractions=(0.5, 0.75))
    for spelled in ({"epochs": 20}, {"decay_fractions": [0.5, 0.75]}, {"lr": 0.1}):
        other = dataclasses.replace(cfg, **spelled)
        assert key_of(other) == key_of(cfg) and grid._entry(other) == grid._entry(cfg)
    assert key_of(dataclasses.replace(cfg, epochs=21)) != key_of(cfg)


@pytest.mark.filterwarnings("ignore:runs in")
def test_every_committed_kept_run_is_found_under_its_parameters(monkeypatch):
    monkeypatch.setenv(grid.RUNS_ENV, str(KEPT))
    jsons = sorted(KEPT.glob("*.json"))
    assert len(jsons) >= 12
    for js in jsons:
        meta = json.loads(js.read_text())
        cfg = TrainConfig.from_dict(meta["params"])
        assert meta["results_version"] == RESULTS_VERSION, js.name
        assert grid._kept(cfg) == js.with_suffix(".csv"), js.name


def _entry_names(package_parent: Path) -> list[str]:
    """The kept-run names of the committed runs' configs, computed by the package copy in
    ``package_parent`` (a fresh interpreter)."""
    code = ("import json, sys; from pathlib import Path\n"
            "from localsgd.training.config import TrainConfig\n"
            "from localsgd.paper.experiments import grid\n"
            "from localsgd.paper.results import library_code_hash\n"
            f"for js in sorted(Path({str(KEPT)!r}).glob('*.json')):\n"
            "    print(grid._entry(TrainConfig.from_dict(json.loads(js.read_text())['params']))"
            ".name)\n"
            "print(library_code_hash())\n")
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=120).stdout
    return out.split()


def test_docstrings_private_names_and_new_fields_leave_every_kept_run_found(tmp_path):
    package = tmp_path / "localsgd"
    shutil.copytree(REPO / "src" / "localsgd", package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    *names, code = _entry_names(tmp_path)
    assert names == sorted(js.with_suffix(".csv").name for js in KEPT.glob("*.json"))
    config = package / "training" / "config.py"
    text = config.read_text()
    text = text.replace('    """K, the number of workers."""',
                        '    """K, the number of workers (reworded)."""')
    text = text.replace('    seed: int = 0\n',
                        '    seed: int = 0\n    outer_fragments: int = 1\n'
                        '    """A new field at its default."""\n')
    config.write_text(text)
    loop = package / "training" / "loop.py"
    loop.write_text(re.sub(r"\b_deferred_interrupt\b", "_interrupt_between_updates",
                           loop.read_text()))
    *after, edited = _entry_names(tmp_path)
    assert "outer_fragments" in config.read_text()
    assert "_interrupt_between_updates" in loop.read_text()
    assert edited != code  # the code changed: the old key (code in it) orphaned every run
    assert after == names  # the key by meaning finds them all


def test_a_kept_run_with_other_parameters_under_the_right_name_is_not_used(tmp_path,
                                                                           monkeypatch, capsys):
    trained = []

    def fake_train(cfg, **_):
        trained.append(cfg.seed)
        return pd.DataFrame({"epoch": [1.0], "test_acc": [50.0 + cfg.seed]})

    monkeypatch.setattr(grid, "train", fake_train)
    monkeypatch.setenv(grid.RUNS_ENV, str(tmp_path / "runs"))
    monkeypatch.setenv("LOCALSGD_CACHE", str(tmp_path / "cache-a"))
    asked, other = TrainConfig(n_train=8, seed=3), TrainConfig(n_train=8, seed=4)
    grid.run_cached(other, progress=False)
    runs = tmp_path / "runs"
    theirs = runs / grid._entry(other).name
    mine = runs / grid._entry(asked).name
    for src, dst in ((theirs, mine), (theirs.with_suffix(".json"), mine.with_suffix(".json"))):
        shutil.copyfile(src, dst)  # the asked run's name, another run's parameters and records
    monkeypatch.setenv("LOCALSGD_CACHE", str(tmp_path / "cache-b"))
    assert not grid.is_cached(asked)
    assert grid.run_cached(asked, progress=False).test_acc.tolist() == [53.0]
    assert trained == [4, 3]
    assert f"{mine}: not used (its .json names other parameters); training the run" in \
        capsys.readouterr().out
    assert json.loads(mine.with_suffix(".json").read_text())["params"]["seed"] == 3  # repaired
    # a kept run of another results version is not used either
    meta = json.loads(mine.with_suffix(".json").read_text())
    mine.with_suffix(".json").write_text(json.dumps({**meta, "results_version": 0}))
    monkeypatch.setenv("LOCALSGD_CACHE", str(tmp_path / "cache-c"))
    assert not grid.is_cached(asked)


def test_a_kept_run_of_other_library_code_serves_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(grid, "train", lambda cfg, **_: pd.DataFrame({"test_acc": [61.0]}))
    monkeypatch.setenv(grid.RUNS_ENV, str(tmp_path / "runs"))
    monkeypatch.setenv("LOCALSGD_CACHE", str(tmp_path / "cache-a"))
    cfg = TrainConfig(n_train=8, seed=7)
    grid.run_cached(cfg, progress=False)
    kept = tmp_path / "runs" / grid._entry(cfg).with_suffix(".json").name
    kept.write_text(json.dumps({**json.loads(kept.read_text()), "library_hash": "0123abcd"}))
    monkeypatch.setattr(grid, "train", lambda *a, **k: pytest.fail("trained a kept run"))
    monkeypatch.setenv("LOCALSGD_CACHE", str(tmp_path / "cache-b"))
    with pytest.warns(UserWarning, match="computed by library code 0123abcd"):
        assert grid.run_cached(cfg, progress=False).test_acc.tolist() == [61.0]
