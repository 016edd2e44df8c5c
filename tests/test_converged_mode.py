"""`localsgd reproduce --mode converged` at smoke size, so the mode cannot rot: the same notebook
code and parameter file with tiny data (``--set``), the estimate printed first, results in their
own folder with scale "converged", and the report's converged section and README rows built from
them, apart from the quick rows of the same cell."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from localsgd.paper import cli, gpu_plan, report
from localsgd.paper import reproduce as h

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
LOCALSGD = Path(sys.executable).parent / "localsgd"


def _outputs(executed: Path) -> str:
    """Every stream output of an executed notebook, joined."""
    cells = json.loads(executed.read_text())["cells"]
    return "".join("".join(o.get("text", "")) for c in cells for o in c.get("outputs", []))


def test_without_only_the_mode_selects_the_notebooks_that_have_it():
    ids = [s.id for s in h.plan(NOTEBOOKS, "converged")]
    assert "table05_models" in ids
    assert ids == [i for i in h.discover(NOTEBOOKS)
                   if (NOTEBOOKS / "params" / i / "converged.yaml").exists()]


def test_the_mode_runs_at_smoke_size_and_the_report_keeps_it_apart(tmp_path, fresh_cache):
    out = tmp_path / "figures" / "converged"  # --out-dir figures: the mode writes below it
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LOCALSGD_CACHE": str(fresh_cache())}
    command = [str(LOCALSGD), "reproduce", "--mode", "converged", "--only", "table05_models",
               *[a for kv in ("n_train=64", "n_test=32", "B_loc=8", "epochs=1.0",
                              "widths=[0.25]", "n_seeds=2", "warmup_epochs=0.1")
                 for a in ("--set", kv)],
               "--out-dir", str(out.parent), "--build-dir", str(tmp_path / "build"),
               "--no-report"]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("converged mode: "))
    assert lines[first].startswith("converged mode: 4 runs (0 more shared between notebooks), "
                                   "0 of them cached; 4 to train, 256 training images"), lines
    assert not any("table05_models" in line for line in lines[:first])  # printed before a run
    # progress per run on the console, from inside the kernel
    assert "table05_models: run 1/4 (local_steps=1, seed=0) training" in lines, lines
    done = [line for line in lines if " trained in " in line]
    assert len(done) == 4 and done[-1].startswith("table05_models: run 4/4 (local_steps=8, "
                                                  "seed=1) trained in "), lines
    assert "test top-1" in done[-1]
    # the notebook itself says what it will train, and then how long the rest takes here
    executed = tmp_path / "build" / "table05_models.converged.ipynb"
    said = _outputs(executed)
    assert "4 of 4 runs to train (256 training images)" in said, said
    assert "run 1 of 4 trained in " in said and "; the rest (192 images) about " in said
    # each finished run is kept beside the figures too (committed: it travels to a new machine)
    kept = sorted(p.name for p in (out / "runs").iterdir())
    assert len(kept) == 8 and all(n.startswith("train-") for n in kept), kept

    # interrupted and run again: the cache holds every run, none is trained twice
    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900,
                           check=False)
    assert again.returncode == 0, again.stdout + again.stderr
    lines = again.stdout.splitlines()
    assert any(line.startswith("converged mode: 4 runs (0 more shared between notebooks), 4 of "
                               "them cached; nothing to train") for line in lines)
    assert sum(" read from the cache" in line for line in lines) == 4, lines
    assert not any(" trained in " in line for line in lines)
    assert "runs to train" not in _outputs(executed)
    side = json.loads((out / "table05_models.json").read_text())
    assert side["mode"] == "converged" and side["scale"] == "converged"
    compare = pd.read_csv(out / "table05_models.compare.csv")
    assert set(compare["scale"]) == {"converged"}
    assert compare["verdict"].notna().any()  # H = 8 vs H = 1 over 2 seeds

    # the report: a section of its own, and the README row below the quick one of the claim
    figures = tmp_path / "figures"
    for f in REPO.glob("figures/table05_models.*"):
        shutil.copy(f, figures / f.name)
    text = report.render(REPO / "papers", figures)
    assert "## Claims tested by the converged proxy (converged mode)" in text
    table = report.results_table(REPO / "papers", figures)
    table5 = table[table["claim"].str.contains("Table 5:")]
    assert list(table5["scale"]) == ["quick", report.CONVERGED_LABEL]
    # the main tables never see the converged rows
    assert (report.load_ours(figures)["mode"] != "converged").all()


def test_the_estimate_counts_a_run_two_notebooks_share_once(tmp_path, monkeypatch):
    # Figure 6's converged H = 1 and H = 8 runs are Table 5's (the same TrainConfig): 9 runs
    monkeypatch.setenv("LOCALSGD_CACHE", str(tmp_path))
    args = argparse.Namespace(notebooks=NOTEBOOKS)
    ids = ["fig06_cifar10_local_sgd", "table05_models"]
    text = cli._converged_estimate(args, ids, {})
    assert text.startswith("converged mode: 9 runs (6 more shared between notebooks), 0 of them "
                           "cached; 9 to train, 8,999,424 training images"), text
    # Figure 7's K = 2 runs are not Table 5's (a 5-epoch warm-up against 1): 6 + 18, none shared
    text = cli._converged_estimate(args, ["fig07_scaling", "table05_models"], {})
    assert text.startswith("converged mode: 24 runs (0 more shared between notebooks)"), text
    # a run cut off mid-way left its checkpoint: it is still to train, from there
    from localsgd.paper.experiments import grid

    key = next(iter({i.key for i in gpu_plan.paper_items(NOTEBOOKS, ids, "converged", {})}))
    grid.checkpoint_path(key).parent.mkdir(parents=True, exist_ok=True)
    grid.checkpoint_path(key).write_bytes(b"a checkpoint")
    text = cli._converged_estimate(args, ids, {})
    assert text.startswith("converged mode: 9 runs (6 more shared between notebooks), 0 of them "
                           "cached; 9 to train (1 from a checkpoint), 8,999,424"), text


# Each other converged parameter file at smoke size: the file's own K, topology, grid and
# tricks, with tiny data (n_train large enough for K = 16 workers of B_loc 8) and one epoch.
# Table 1's B_globs shrink with B_loc (its mini-batch SGD runs take B_loc = B_glob).
_SMOKE_SETS = {"table01_large_batch": ["B_globs=[8, 16]"]}
_CONVERGED = [i for i in h.discover(NOTEBOOKS) if i != "table05_models"
              and (NOTEBOOKS / "params" / i / "converged.yaml").exists()]


@pytest.mark.parametrize("nb_id", _CONVERGED)
def test_every_converged_file_runs_at_smoke_size(nb_id, tmp_path, fresh_cache):
    defined = h.parameters_cell_names(NOTEBOOKS / f"{nb_id}.ipynb")
    sets = ["n_train=256", "n_test=32", "B_loc=8", "epochs=1.0", "n_seeds=2",
            *(["warmup_epochs=0.1"] if "warmup_epochs" in defined else []),
            *_SMOKE_SETS.get(nb_id, [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LOCALSGD_CACHE": str(fresh_cache())}
    proc = subprocess.run(
        [str(LOCALSGD), "reproduce", "--mode", "converged", "--only", nb_id,
         *[a for kv in sets for a in ("--set", kv)], "--out-dir", str(tmp_path / "figures"),
         "--build-dir", str(tmp_path / "build"), "--no-report"],
        capture_output=True, text=True, env=env, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    compare = pd.read_csv(tmp_path / "figures" / "converged" / f"{nb_id}.compare.csv")
    assert set(compare["scale"]) == {"converged"} and compare["verdict"].notna().any()


def test_kept_runs_serve_a_machine_whose_cache_is_empty(tmp_path, monkeypatch):
    # `reproduce --mode converged` keeps each finished run in <out>/converged/runs/ (committed);
    # on another machine (an empty results cache) those runs are read back, not trained again
    from localsgd.paper.experiments import grid
    from localsgd.training.config import TrainConfig

    trained = []

    def fake_train(cfg, **_):
        trained.append(cfg.seed)
        return pd.DataFrame({"epoch": [1.0], "test_acc": [50.0 + cfg.seed]})

    monkeypatch.setattr(grid, "train", fake_train)
    monkeypatch.setenv(grid.RUNS_ENV, str(tmp_path / "runs"))
    monkeypatch.setenv("LOCALSGD_CACHE", str(tmp_path / "cache-a"))
    cfg = TrainConfig(n_train=8, seed=3)
    assert not grid.is_cached(cfg)
    assert grid.run_cached(cfg, progress=False).test_acc.tolist() == [53.0]
    assert trained == [3]
    name = grid.checkpoint_path(cfg).with_suffix("").with_suffix(".csv").name
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted(
        [name, name.replace(".csv", ".json")])
    monkeypatch.setenv("LOCALSGD_CACHE", str(tmp_path / "cache-b"))  # another machine
    assert grid.is_cached(cfg)
    assert grid.run_cached(cfg, progress=False).test_acc.tolist() == [53.0]
    assert trained == [3]  # read back, not trained
    assert grid.checkpoint_path(cfg).with_suffix("").with_suffix(".csv").is_file()  # now cached
    # a kept run that is not whole (a merge conflict, a lost .json) is not trusted: the run is
    # trained and the kept copy repaired
    kept = tmp_path / "runs" / name
    good = kept.read_bytes()
    for spoil in ("conflict", "no json"):
        monkeypatch.setenv("LOCALSGD_CACHE", str(tmp_path / f"cache-{spoil}"))
        if spoil == "conflict":
            kept.write_text("<<<<<<< HEAD\n" + good.decode())
        else:
            kept.with_suffix(".json").unlink()
        assert not grid.is_cached(cfg)
        assert grid.run_cached(cfg, progress=False).test_acc.tolist() == [53.0]
        assert kept.read_bytes() == good and kept.with_suffix(".json").is_file()
    assert trained == [3, 3, 3]
    # another configuration is not served by it; without the folder nothing is kept
    assert not grid.is_cached(TrainConfig(n_train=8, seed=4))
    monkeypatch.delenv(grid.RUNS_ENV)
    monkeypatch.setenv("LOCALSGD_CACHE", str(tmp_path / "cache-c"))
    assert not grid.is_cached(cfg)
    grid.run_cached(TrainConfig(n_train=8, seed=5), progress=False)
    assert trained == [3, 3, 3, 5] and len(list((tmp_path / "runs").iterdir())) == 2


def test_run_grid_names_each_run_by_its_cache_key(tmp_path, monkeypatch):
    # equal configurations (Table 5's ResNet-20 cells and Figure 6's H = 1, 8) get equal keys,
    # which `claims.runs_digest` turns into the ``runs`` a verdict rests on
    from localsgd.paper.experiments import claims, grid
    from localsgd.training.config import TrainConfig

    monkeypatch.setattr(grid, "train", lambda cfg, **_: pd.DataFrame(
        {"epoch": [1.0], "step": [1], "test_acc": [50.0 + cfg.seed]}))
    monkeypatch.setenv("LOCALSGD_CACHE", str(tmp_path / "cache"))
    a, b = TrainConfig(n_train=8, seed=1), TrainConfig(n_train=8, seed=2)
    one = grid.run_grid([a, b], progress=False)
    again = grid.run_grid([b, a], progress=False)
    assert one.run_key.tolist() == [grid.checkpoint_path(c).name.split(".")[0].removeprefix(
        "train-") for c in (a, b)]
    assert set(one.run_key) == set(again.run_key) and one.run_key.nunique() == 2
    assert claims.runs_digest(one) == claims.runs_digest(again) != claims.runs_digest(one[:1])
    assert claims.runs_digest(one.drop(columns="run_key")) == ""


def test_the_kept_runs_folder_is_set_for_converged_mode_alone_and_restored(tmp_path,
                                                                         monkeypatch):
    from localsgd.paper.experiments import grid

    monkeypatch.setenv(grid.RUNS_ENV, "before")
    with pytest.raises(RuntimeError), cli._kept_runs(tmp_path / "runs"):
        assert grid.runs_dir() == tmp_path / "runs"
        with cli._kept_runs(None):
            assert grid.runs_dir() == tmp_path / "runs"  # another mode leaves it as it is
        raise RuntimeError("a failed estimate")
    assert os.environ[grid.RUNS_ENV] == "before"
    monkeypatch.delenv(grid.RUNS_ENV)
    with cli._kept_runs(tmp_path / "runs"):
        pass
    assert grid.runs_dir() is None
