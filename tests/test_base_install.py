"""The README's library install, as written, in a fresh virtual environment: the base install
(`pip install -e .`, no extras) runs the README's library examples -- the torchrun script with
`LocalSGDOptimizer` and the in-process `ReplicaEngine` -- without pandas, seaborn or Jupyter,
and the `localsgd` command (the reproduction's) says in one line which extra it needs.

It installs torch into a new venv (about two minutes here, from the local wheel cache)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from test_doc_commands import DOCS, _copy_checkout
from test_readme import CONSENSUS_CHECK, EXPECTED_OUTPUT, blocks

SECTION = "Use it in your own training script"
PAPER_ONLY = ("pandas", "seaborn", "matplotlib", "papermill", "jupyterlab", "tqdm")


def _run(cmd: list[str] | str, cwd, env, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False, shell=isinstance(cmd, str))


def _base_venv(tmp_path):
    """A copy of the checkout with the README's install block run in it: (checkout, venv bin,
    environment)."""
    (block,) = [d for d in DOCS if d.page == "README.md" and d.kind == "script"
                and "python3 -m venv" in d.command]
    checkout = _copy_checkout(tmp_path / "checkout")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.environ["PATH"].replace(os.path.dirname(sys.executable) + ":", "")
    r = _run(["bash", "-c", f"set -e\n{block.command}"], checkout, env, timeout=900)
    assert r.returncode == 0, f"README.md:{block.line}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    bin_dir = checkout / ".venv" / "bin"
    env = {**env, "PATH": f"{bin_dir}:{env['PATH']}", "OMP_NUM_THREADS": "1"}
    return checkout, bin_dir, env


def _leaves_the_reproduction_out(checkout, bin_dir, env):
    for name in PAPER_ONLY:
        r = _run([str(bin_dir / "python"), "-c", f"import {name}"], checkout, env)
        assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr, f"{name} is installed"
    r = _run([str(bin_dir / "python"), "-c", "import localsgd, torch; print(torch.__version__)"],
             checkout, env)
    assert r.returncode == 0 and r.stdout.startswith("2.14.1"), r.stderr[-2000:]


def _runs_the_torchrun_script(bin_dir, env, tmp_path):
    (script,) = [b for b in blocks("py") if b.page == "README.md" and b.section == SECTION]
    body, destroy = script.code.rsplit("torch.distributed.destroy_process_group()", 1)
    path = tmp_path / "train_local_sgd.py"
    path.write_text(body + CONSENSUS_CHECK + "torch.distributed.destroy_process_group()" + destroy)
    nproc = int(re.search(r"--nproc-per-node (\d+)", script.code.splitlines()[0]).group(1))
    r = _run([str(bin_dir / "torchrun"), "--standalone", "--nproc-per-node", str(nproc),
              str(path)], tmp_path, env, timeout=300)
    assert r.stdout.count("rank ") == nproc, r.stdout + r.stderr[-4000:]
    assert "AssertionError" not in r.stderr and "ModuleNotFoundError" not in r.stderr, r.stderr
    # torch's gloo teardown may abort a rank after its last line (tests/test_readme.py)
    teardown = "terminate called without an active exception" in r.stderr
    assert r.returncode == 0 or teardown, r.stderr[-4000:]


def _runs_the_python_examples(bin_dir, env, tmp_path):
    # the section's library example is the torchrun script (`_runs_the_torchrun_script`); the
    # replica-engine example moved to docs/algorithms.md, whose setup needs the paper extra
    examples = [b for b in blocks("python") if b.page == "README.md" and b.section == SECTION]
    for example in examples:
        path = tmp_path / f"example_{example.line}.py"
        path.write_text(example.code)
        r = _run([str(bin_dir / "python"), str(path)], tmp_path, env, timeout=300)
        assert r.returncode == 0, f"README.md:{example.line}: {r.stderr[-3000:]}"
        for text in EXPECTED_OUTPUT.get(("README.md", SECTION), ()):
            assert text in r.stdout, f"README.md:{example.line} printed {r.stdout[-500:]!r}"


def _the_command_names_its_extra(checkout, bin_dir, env):
    r = _run([str(bin_dir / "localsgd"), "reproduce", "--list"], checkout, env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().count("\n") == 0 and "pip install 'localsgd[paper]'" in r.stderr, \
        r.stderr
    # the library's own command too: its records are a pandas table
    r = _run([str(bin_dir / "localsgd"), "train", "--config", "run", "--out",
              str(checkout / "runs" / "x")], checkout, env)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stdout + r.stderr
    assert "pip install 'localsgd[paper]'" in r.stderr and not (checkout / "runs").exists()


def test_the_readme_library_install_runs_its_examples_without_the_paper_extra(tmp_path):
    # one test, one venv: xdist would give split tests one install per worker
    checkout, bin_dir, env = _base_venv(tmp_path)
    _leaves_the_reproduction_out(checkout, bin_dir, env)
    _runs_the_torchrun_script(bin_dir, env, tmp_path)
    _runs_the_python_examples(bin_dir, env, tmp_path)
    _the_command_names_its_extra(checkout, bin_dir, env)
