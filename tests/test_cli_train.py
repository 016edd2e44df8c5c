"""`localsgd train` end to end: both engines from one YAML, their records equal in float64, the
--resume guard, and a resume that ends where the uninterrupted run ended."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from localsgd.paper.cli import main as cli

TINY = {"dataset": "synthetic", "model": "resnet20", "width": 0.25, "n_train": 64,
        "n_test": 16, "local_batch": 8, "local_steps": 2, "epochs": 2.0, "lr": 0.1,
        "eval_batch": 16, "augment": False, "world_size": 2, "dtype": "float64"}
TIMED = ("compute_seconds", "data_seconds", "wall_seconds")  # wall-clock columns differ per run


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


def _records(out: Path) -> pd.DataFrame:
    df = pd.read_csv(out / "records.csv")
    return df[[c for c in df.columns if c not in TIMED]]


def test_train_replicas_resume_ends_where_the_uninterrupted_run_ended(tmp_path, capsys):
    cfg = _config(tmp_path)
    ref, run = tmp_path / "ref", tmp_path / "run"
    assert cli(["train", "--config", str(cfg), "--out", str(ref), "--no-progress"]) == 0
    # 64 images / 2 workers / B_loc 8 = 4 updates per epoch, 8 in all; a checkpoint every 3
    assert cli(["train", "--config", str(cfg), "--out", str(run), "--no-progress",
                "--checkpoint-every", "3"]) == 0
    assert (run / "checkpoints" / "run.pt").exists()
    capsys.readouterr()
    # the guard: an existing checkpoint is never overwritten silently
    assert cli(["train", "--config", str(cfg), "--out", str(run), "--no-progress",
                "--checkpoint-every", "3"]) == 2
    assert "holds checkpoints of an earlier run: pass --resume" in capsys.readouterr().err
    # a bare --resume where there is nothing to resume is an error, never a silent fresh start
    assert cli(["train", "--config", str(cfg), "--out", str(tmp_path / "none"),
                "--no-progress", "--resume"]) == 2
    assert "no checkpoint to resume from" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()
    # a resume continues from the last checkpoint (update 6), says so, and ends bitwise where
    # the uninterrupted run ended
    assert cli(["train", "--config", str(cfg), "--out", str(run), "--no-progress",
                "--resume"]) == 0
    assert "resumed from update 6 of 8" in capsys.readouterr().out
    pd.testing.assert_frame_equal(_records(run), _records(ref), check_exact=True)
    assert _records(ref).step.iloc[-1] == 8
    # --resume=auto (job scripts): a fresh start where there is no checkpoint, then a resume
    auto = tmp_path / "auto"
    assert cli(["train", "--config", str(cfg), "--out", str(auto), "--no-progress",
                "--resume=auto", "--checkpoint-every", "3"]) == 0
    assert "resumed" not in capsys.readouterr().out
    pd.testing.assert_frame_equal(_records(auto), _records(ref), check_exact=True)
    # --resume DIR: continue another run's checkpoints (update 6 of run/) into a new folder
    other = tmp_path / "other"
    assert cli(["train", "--config", str(cfg), "--out", str(other), "--no-progress",
                "--resume", str(run)]) == 0
    assert "resumed from update 6 of 8" in capsys.readouterr().out
    pd.testing.assert_frame_equal(_records(other), _records(ref), check_exact=True)


def test_train_ddp_engine_equals_replicas_engine(tmp_path):
    cfg = _config(tmp_path)
    assert cli(["train", "--config", str(cfg), "--out", str(tmp_path / "rep"),
                "--no-progress"]) == 0
    env = dict(os.environ, OMP_NUM_THREADS="1")
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "localsgd", "train", "--engine", "ddp", "--config", str(cfg),
           "--out", str(tmp_path / "ddp"), "--no-progress"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ddp engine, 2 workers" in r.stdout
    rep, ddp = _records(tmp_path / "rep"), _records(tmp_path / "ddp")
    assert len(rep) == len(ddp) > 0
    pd.testing.assert_frame_equal(ddp, rep, check_exact=False, atol=1e-9, rtol=0)
    assert rep.train_loss.iloc[-1] != pytest.approx(rep.train_loss.iloc[0])  # it trained


def test_the_front_door_is_the_library_s(tmp_path):
    # `localsgd train` runs from localsgd.training.cli: the reproduction is never imported, so
    # the base install trains; the reproduction's command hands `train` to the same main
    code = ("import sys; from localsgd.__main__ import main; sys.argv = ['localsgd', 'train', "
            f"'--config', {str(_config(tmp_path))!r}, '--out', {str(tmp_path / 'out')!r}, "
            "'--no-progress']; rc = main(); "
            "assert not [m for m in sys.modules if m.startswith('localsgd.paper')], 'paper'; "
            "sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "out" / "records.csv").is_file() and "replicas engine" in r.stdout
    # a bad flag is one line and exit code 2, from either command
    r = subprocess.run([sys.executable, "-m", "localsgd.training.cli", "--config",
                        str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "x")],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert r.stderr.startswith("error: ")
