"""The import contracts of pyproject.toml's ``[tool.importlinter]``, checked by import-linter:
the library wing imports nothing of the reproduction wing, and no package's modules import each
other in a cycle (docs/layout.md). A planted import must break them, so the check is real."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(src: Path) -> subprocess.CompletedProcess:
    """lint-imports over the package under ``src`` (first on PYTHONPATH, ahead of the install)."""
    return subprocess.run([str(LINT), str(ROOT / "pyproject.toml"), "--no-cache", "--no-logo"],
                          cwd=src, env={**os.environ, "PYTHONPATH": str(src)},
                          capture_output=True, text=True, timeout=300, check=False)


def test_the_contracts_hold():
    r = _lint(ROOT / "src")
    assert r.returncode == 0 and "2 kept, 0 broken" in r.stdout, r.stdout[-4000:] + r.stderr


LIBRARY_RULE = "the library imports nothing of the reproduction BROKEN"
NO_CYCLES = "no import cycles between the modules of a package BROKEN"


@pytest.mark.parametrize(("module", "planted", "says"), [
    ("schedule.py", "import localsgd.report",
     (LIBRARY_RULE, "localsgd.schedule is not allowed to import localsgd.report")),
    ("train.py", "from localsgd import dry_run",
     (LIBRARY_RULE, "localsgd.train is not allowed to import localsgd.dry_run")),
    ("engines/common.py", "import localsgd.experiments.grid",  # deeper down, a subpackage
     (LIBRARY_RULE, "localsgd.engines.common -> localsgd.experiments.grid")),
    ("schedule.py", "import localsgd.engines",  # the engines import the schedule: a cycle
     (NO_CYCLES, ".schedule -> .engines")),
])
def test_a_planted_import_breaks_a_contract(tmp_path, module, planted, says):
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "localsgd", src / "localsgd",
                    ignore=shutil.ignore_patterns("__pycache__"))
    target = src / "localsgd" / module
    target.write_text(target.read_text() + f"\n{planted}  # planted by the test\n")
    r = _lint(src)
    assert r.returncode != 0, r.stdout[-4000:] + r.stderr
    for text in says:
        assert text in r.stdout, r.stdout[-4000:]
