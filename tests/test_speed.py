"""The time estimate before a long run: probe, reference file and the scaling arithmetic."""

from __future__ import annotations

import json

import pytest

from localsgd.paper import speed


def test_estimate_scales_the_committed_times_by_the_probe_ratio(tmp_path):
    ref = speed.write_reference(tmp_path / speed.SPEED_FILE, 2.0,
                                {"fig04": 100.0, "table01": 300.0, "appB": 5.0})
    data = json.loads(ref.read_text())
    assert data["total_seconds"] == 405.0 and data["cpu"] == speed.cpu_model()
    est = speed.estimate(ref, ["fig04", "table01", "new_nb"], probe_seconds=3.0)
    assert est.factor == pytest.approx(1.5)
    assert est.seconds == pytest.approx(1.5 * 400.0)  # appB not planned, new_nb unknown
    assert est.missing == ("new_nb",)
    text = est.format()
    assert "~10 min" in text and "x 1.50" in text and "new_nb" in text
    assert speed.estimate(tmp_path / "absent.json", ["fig04"], 1.0) is None


def test_estimate_with_jobs_runs_timed_notebooks_alone_and_the_rest_together(tmp_path):
    assert speed.makespan([100.0, 60.0, 50.0], 2) == 110.0  # 100 | 60 + 50
    assert speed.makespan([100.0, 60.0, 50.0], 1) == 210.0
    ref = speed.write_reference(tmp_path / speed.SPEED_FILE, 2.0,
                                {"a": 100.0, "b": 60.0, "c": 50.0, "t": 30.0},
                                jobs=2, wall_seconds=150.0)
    assert json.loads(ref.read_text())["jobs"] == 2
    est = speed.estimate(ref, ["a", "b", "c", "t"], 1.0, jobs=2, timed={"t"})
    assert est.seconds == pytest.approx(0.5 * (30.0 + 110.0))  # probe here: half the reference's
    assert "2 notebooks at once" in est.format() and "rougher" not in est.format()
    serial = speed.estimate(ref, ["a", "b", "c", "t"], 1.0, timed={"t"})
    assert serial.seconds == pytest.approx(0.5 * 240.0) and "rougher" in serial.format()


def test_probe_times_a_real_workload():
    seconds = speed.probe(repeats=1)
    assert 0.0 < seconds < 60.0
