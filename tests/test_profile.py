"""`localsgd reproduce --profile`: where each notebook's time goes (localsgd.paper.profile)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from localsgd.paper import profile
from localsgd.paper.cli import main

PHASES = [c for c in profile.COLUMNS if c not in ("notebook", "total", "runs", "updates")]


def _stamp(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat().replace("+00:00", "Z")


def _executed(path: Path, cells: list[tuple[list[str], float, float]]) -> Path:
    nb = {"cells": [{"cell_type": "code", "source": "", "metadata": {
        "tags": tags, "papermill": {"duration": end - start, "start_time": _stamp(start),
                                    "end_time": _stamp(end)}}} for tags, start, end in cells]}
    path.write_text(json.dumps(nb))
    return path


def test_phases_are_placed_and_sum_to_the_total(tmp_path):
    # cells: parameters 0.1 s, injected 0.1 s, setup 1000..1030 (imports + a run + a save),
    # a plotting cell 1030..1034; the harness took 40 s (6 s of kernel start)
    nb = _executed(tmp_path / "x.ipynb", [(["parameters"], 990.0, 990.1),
                                         (["injected-parameters"], 990.1, 990.2),
                                         ([], 1000.0, 1030.0), ([], 1030.0, 1034.0)])
    run = {"kind": "train", "first_rank": 0, "updates": 50, "end": 1028.0, "setup": 2.0,
           "data": 1.0, "compute": 15.0, "engine": 1.0, "evaluate": 1.0, "loop": 0.0}
    events = [run, {"kind": "save", "seconds": 1.5, "end": 1029.5},
              {"kind": "save", "seconds": 0.5, "end": 1033.9},  # in the plotting cell
              {**run, "first_rank": 1, "torchrun": True}]  # another rank: not counted
    row = profile.notebook_row("x", 40.0, nb, events)
    assert row["runs"] == 1 and row["updates"] == 50 and row["compute"] == 15.0
    assert row["imports"] == pytest.approx(30.0 - 20.0 - 1.5)  # the setup cell's remainder
    assert row["save"] == 2.0 and row["kernel_start"] == pytest.approx(40.0 - 34.2)
    assert row["other"] == pytest.approx(4.0 + 0.2 - 0.5)  # plotting + parameter cells
    assert sum(row[c] for c in PHASES) == pytest.approx(40.0)
    text = profile.table([row, {**row, "notebook": "y", "total": 80.0, "other": 43.7}])
    lines = text.splitlines()
    assert lines[2].startswith("| y | 80.0") and "| TOTAL | 120.0" in text
    assert lines[-1].startswith("| share of total | 100 %")


def test_a_torchrun_launch_counts_its_start_up_apart_from_its_rank0_run(tmp_path):
    nb = _executed(tmp_path / "x.ipynb", [(["injected-parameters"], 99.0, 99.5),
                                         ([], 100.0, 130.0)])
    events = [{"kind": "train", "first_rank": 0, "torchrun": True, "updates": 10, "end": 128.0,
               "setup": 1.0, "data": 0.0, "compute": 8.0, "engine": 1.0, "evaluate": 0.0,
               "loop": 0.0},
              {"kind": "launch", "seconds": 25.0, "end": 129.0, "compile": 3.0}]
    row = profile.notebook_row("x", 31.0, nb, events)
    assert row["launch"] == pytest.approx(25.0 - 3.0 - 10.0) and row["compile"] == 3.0
    assert row["imports"] == pytest.approx(5.0)
    assert sum(row[c] for c in PHASES) == pytest.approx(31.0)


def test_timed_records_the_outermost_call_only(tmp_path, monkeypatch):
    monkeypatch.setenv(profile.ENV, str(tmp_path / "events.jsonl"))

    @profile.timed("convex")
    def inner():
        return 1

    @profile.timed("convex")
    def outer():
        return inner() + inner()

    assert outer() == 2
    events = profile.read_events(tmp_path / "events.jsonl")
    assert [e["function"].rsplit(".", 1)[-1] for e in events] == ["outer"]
    monkeypatch.delenv(profile.ENV)
    assert inner() == 1 and len(profile.read_events(tmp_path / "events.jsonl")) == 1


def test_reproduce_profile_measures_a_real_notebook(tmp_path, capsys, monkeypatch,
                                                   fresh_cache):
    """A smoke notebook that trains: its runs, updates and compute appear, phases add up."""
    from localsgd import data

    if data._find_cifar("cifar10")[0] is None:
        pytest.skip("CIFAR-10 not available locally (set LOCALSGD_DATA); CI provides it")
    # a cache of its own, so the notebook trains even when an earlier test on this xdist
    # worker ran fig06 smoke and cached its runs; decoded data sets are shared (links)
    monkeypatch.setenv("LOCALSGD_CACHE", str(fresh_cache()))  # the kernel inherits it
    out = tmp_path / "profile.md"
    code = main(["reproduce", "--mode", "smoke", "--only", "fig06_cifar10_local_sgd",
                 "--out-dir", str(tmp_path / "out"), "--build-dir", str(tmp_path / "b"),
                 "--no-report", "--profile", str(out)])
    assert code == 0
    text = out.read_text()
    assert "mode smoke" in text and "| fig06_cifar10_local_sgd |" in text
    cells = next(line for line in text.splitlines() if line.startswith("| fig06")).split("|")
    row = dict(zip(profile.COLUMNS, (c.strip() for c in cells[1:-1]), strict=True))
    assert int(row["runs"]) >= 2 and int(row["updates"]) > 0 and float(row["compute"]) > 0
    assert float(row["save"]) > 0 and float(row["kernel_start"]) > 0
    total = sum(float(row[c]) for c in PHASES)
    assert total == pytest.approx(float(row["total"]), abs=0.1 * len(PHASES))


def test_the_profile_names_the_loops_phases():
    from localsgd.training.state import LOOP_PHASES

    assert profile.TRAIN_PHASES == LOOP_PHASES
