"""`localsgd reproduce` from the shell: `--set NAME=VALUE`, paper mode's skipped notebooks
(with the commands to run instead) and a console free of kernel and torch noise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from localsgd.paper import reproduce
from localsgd.paper.cli import main

REPO = Path(__file__).resolve().parents[1]
LOCALSGD = Path(sys.executable).parent / "localsgd"


def _reproduce(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["reproduce", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ------------------------------------------------------------------ --set, checked before a run
@pytest.mark.parametrize(("args", "expected"), [
    # a typo: one line naming the valid names, with the closest one
    (["--only", "appB_comm_cost", "--set", "c_intr=2"],
     ["not a parameter of appB_comm_cost", "did you mean c_intra", "defines: seed, topologies"]),
    # several notebooks: every one must define it, and the error says which do not
    (["--only", "appB_comm_cost", "fig04_convex_time", "--set", "Hs=[1, 2]"],
     ["every selected notebook", "Hs is not defined by appB_comm_cost",
      "the names all 2 define: seed"]),
    (["--only", "fig04_convex_time", "--set", "seeds=1"], ["did you mean", "n_seeds"]),
    (["--only", "appB_comm_cost", "--set", "mode=paper"], ["--mode"]),  # reserved
    (["--only", "appB_comm_cost", "--set", "c_inter"], ["expected NAME=VALUE"]),
    (["--only", "appB_comm_cost", "--set", "c_inter=[1"], ["not valid YAML"]),
])
def test_bad_set_is_one_line_and_nothing_runs(args, expected, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(reproduce, "run", lambda *a, **k: pytest.fail("a notebook started"))
    code, out, err = _reproduce(capsys, "--mode", "smoke", *args, "--out-dir",
                                str(tmp_path / "out"), "--build-dir", str(tmp_path / "b"))
    assert code == 2 and out == ""
    assert err.startswith("error: --set ") and err.count("\n") == 1, err
    for text in expected:
        assert text in err


def test_set_never_writes_into_figures(capsys, monkeypatch):
    # figures/ holds what the mode's parameter files give: a changed parameter needs --out-dir
    monkeypatch.setattr(reproduce, "run", lambda *a, **k: pytest.fail("a notebook started"))
    code, _, err = _reproduce(capsys, "--mode", "smoke", "--only", "appB_comm_cost", "--set",
                                "c_inter=20")
    assert code == 2 and "give --out-dir" in err and err.count("\n") == 1, err


def test_set_values_are_yaml_and_the_last_wins():
    assert reproduce.parse_sets(["n_seeds=1", "Hs=[1, 2]", "runs_dir=RUNS", "x=null",
                                 "n_seeds=2"]) == {"n_seeds": 2, "Hs": [1, 2],
                                                   "runs_dir": "RUNS", "x": None}
    specs = reproduce.plan(REPO / "notebooks", "smoke", ["fig04_convex_time"])
    assert reproduce.load_params(specs[0], "smoke", {"Hs": [1, 2]})["Hs"] == [1, 2]


def test_set_reaches_the_notebook_and_the_console_stays_clean(tmp_path):
    """One smoke notebook with a changed parameter, as a user runs it: the value is in the
    executed notebook and in the figure's provenance; the output holds the progress bar, the
    table and the harness's lines, not the kernel's start-up warning."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [str(LOCALSGD), "reproduce", "--mode", "smoke", "--only", "appB_comm_cost",
         "--set", "c_inter=20", "--out-dir", str(tmp_path / "out"),
         "--build-dir", str(tmp_path / "build"), "--no-report"],
        capture_output=True, text=True, env=env, timeout=600, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "--set (every selected notebook): c_inter=20" in proc.stdout
    assert "Kernel is running over TCP without encryption" not in output
    assert "KeyboardInterrupt" not in output
    assert "[IPKernelApp]" not in output
    executed = nbformat.read(tmp_path / "build" / "appB_comm_cost.smoke.ipynb", as_version=4)
    injected = [c for c in executed.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert "c_inter = 20" in injected[0].source
    side = json.loads((tmp_path / "out" / "appB_comm_cost.json").read_text())
    assert side["params"]["c_inter"] == 20


# ------------------------------------------------------------------ paper mode's skips
def test_paper_dry_run_skips_cluster_notebooks_with_their_commands(tmp_path, capsys):
    code, out, err = _reproduce(
        capsys, "--mode", "paper", "--dry-run", "2", "--only", "fig08_imagenet", "dynamo_ddp",
        "appB_comm_cost", "--out-dir", str(tmp_path / "out"), "--build-dir", str(tmp_path / "b"))
    assert code == 0, out + err
    table = out.split("skipped fig08_imagenet:")[0]
    for nb_id, status in [("fig08_imagenet", "skipped"), ("dynamo_ddp", "skipped"),
                          ("appB_comm_cost", "ok")]:
        assert any(line.split()[:3] == [nb_id, "paper", status] for line in table.splitlines())
    fig08 = out.split("skipped fig08_imagenet:")[1].split("skipped dynamo_ddp:")[0]
    assert "run these commands instead:" in fig08
    commands = [line.strip() for line in fig08.splitlines() if line.startswith("  ")]
    assert len(commands) == 3 and all(c.startswith("torchrun --nnodes 15 --nproc-per-node 2 ")
                                       for c in commands[:2])
    configs = [c.split("--config ")[1].split()[0] for c in commands[:2]]
    assert all(Path(c).is_file() and str(tmp_path) in c for c in configs)  # written, in tmp
    assert "--set runs_dir=RUNS" in commands[2]
    assert "skipped dynamo_ddp:" in out and "run this command instead:" in out
    assert not (tmp_path / "out" / "fig08_imagenet.json").exists()


def test_paper_mode_skips_without_starting_a_kernel(tmp_path, capsys, monkeypatch):
    def no_kernel(spec, *args, **kwargs):
        pytest.fail(f"{spec.id} was executed")

    monkeypatch.setattr(reproduce, "run_notebook", no_kernel)
    code, out, _ = _reproduce(capsys, "--mode", "paper", "--only", "fig08_imagenet",
                              "dynamo_ddp", "--out-dir", str(tmp_path / "out"),
                              "--build-dir", str(tmp_path / "b"), "--no-report")
    assert code == 0
    assert "skipped fig08_imagenet: paper mode trains ResNet-50" in out
    assert "localsgd reproduce --mode quick --only dynamo_ddp" in out


def test_fig08_runs_when_given_its_torchrun_outputs(tmp_path):
    """With ``runs_dir`` set (the follow-up command printed with the skip) Figure 8's notebook
    plots the torchrun outputs, so paper mode runs it."""
    (spec,) = reproduce.plan(REPO / "notebooks", "paper", ["fig08_imagenet"])
    assert reproduce.skipped(spec, "paper", build_dir=tmp_path)
    assert reproduce.skipped(spec, "paper", {"runs_dir": "RUNS"}, build_dir=tmp_path) is None
    assert reproduce.skipped(spec, "quick", build_dir=tmp_path) is None


def test_plan_still_prints_with_a_set(capsys):
    code, out, _ = _reproduce(capsys, "--mode", "paper", "--plan", "--only", "fig08_imagenet")
    assert code == 0 and "TOTAL" in out
    code, two_seeds, _ = _reproduce(capsys, "--mode", "paper", "--plan", "--only",
                                    "fig08_imagenet", "--set", "n_seeds=2")
    assert code == 0
    runs = [next(ln for ln in text.splitlines() if ln.startswith("fig08_imagenet")).split()[1]
            for text in (out, two_seeds)]
    assert runs == ["2", "4"]  # mini-batch and local SGD, per seed
