"""`localsgd reproduce --mode paper --dry-run N`: every paper configuration runs on the CPU for N
updates per run (full-size models, real K, B_loc, H, schedule), through the notebooks' plots and
claims; nothing cached, nothing in figures/ (localsgd.paper.dry_run)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from localsgd.paper import dry_run, reproduce
from localsgd.paper.cli import main

REPO = Path(__file__).resolve().parents[1]
PAPER = sorted(nb for nb in reproduce.discover(REPO / "notebooks")
               if nb not in dry_run.SKIP and nb not in reproduce.CLUSTER_ONLY)


def test_dry_run_needs_paper_mode_and_never_writes_figures(capsys):
    assert main(["reproduce", "--mode", "quick", "--dry-run", "2", "--only", "appB_comm_cost"]) == 2
    assert "use --mode paper" in capsys.readouterr().err
    assert main(["reproduce", "--mode", "paper", "--dry-run", "2", "--only", "appB_comm_cost",
                 "--out-dir", str(REPO / "figures")]) == 2
    assert "never writes into figures/" in capsys.readouterr().err
    assert main(["reproduce", "--mode", "paper", "--dry-run", "2", "--only", "appB_comm_cost",
                 "--out-dir", str(REPO / "figures" / "paper")]) == 2
    assert "never writes into figures/" in capsys.readouterr().err


def test_one_seed_per_configuration_unless_a_set_asks_for_more(tmp_path, monkeypatch, capsys):
    asked = []

    def run(specs, mode, **kw):
        asked.append(kw["overrides"])
        return []

    monkeypatch.setattr(reproduce, "run", run)
    for sets in ([], ["--set", "n_seeds=3"]):
        assert main(["reproduce", "--mode", "paper", "--dry-run", "2", "--only", "slowmo",
                     *sets, "--out-dir", str(tmp_path / "out")]) == 0
    assert [o["n_seeds"] for o in asked] == [1, 3]
    assert "2 updates per run, 3 seed(s) per configuration" in capsys.readouterr().out


def test_skipped_notebooks_say_why(tmp_path, capsys):
    code = main(["reproduce", "--mode", "paper", "--dry-run", "1", "--only", "dynamo_ddp",
                 "--out-dir", str(tmp_path / "out"), "--build-dir", str(tmp_path / "b")])
    out = capsys.readouterr().out
    assert code == 0 and "skipped dynamo_ddp: paper mode is six torchbench models" in out
    assert "run this command instead:\n  localsgd reproduce --mode quick --only dynamo_ddp" in out


@pytest.mark.parametrize("nb_id", PAPER)
def test_paper_configuration_runs_dry(nb_id, tmp_path, monkeypatch):
    from localsgd import paths

    monkeypatch.setenv("LOCALSGD_CELL_TIMEOUT", "900")
    results = paths.cache_dir() / "results"
    before = set(results.glob("*")) if results.exists() else set()
    out = tmp_path / "out"
    code = main(["reproduce", "--mode", "paper", "--dry-run", "2", "--only", nb_id,
                 "--out-dir", str(out), "--build-dir", str(tmp_path / "build")])
    assert code == 0
    side = json.loads((out / f"{nb_id}.json").read_text())
    assert side["mode"] == "paper" and side["dry_run_updates"] == 2  # labelled as a dry run
    assert len(side["params"].get("seeds", [0])) == 1  # one seed per configuration
    after = set(results.glob("*")) if results.exists() else set()
    assert after == before  # nothing cached
    data = pd.read_csv(out / f"{nb_id}.csv")
    if "step" in data.columns and "local_steps" in data.columns:  # trained runs: 2 updates each
        assert set(data.step.dropna()) <= {2}
