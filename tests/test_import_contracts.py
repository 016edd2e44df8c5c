"""The import contracts of pyproject.toml's ``[tool.importlinter]``, checked by import-linter:
the library wing imports nothing of the reproduction wing, and no package's modules import each
other in a cycle (docs/layout.md). A planted import must break them, so the check is real."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
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


def test_every_library_module_is_under_the_contract():
    # a new module of the library wing must be listed, or the rule would not cover it
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (rule,) = [c for c in config["contracts"] if c["type"] == "forbidden"]
    package = ROOT / "src" / "localsgd"
    library = {f"localsgd.{p.stem}" for p in package.iterdir()
               if (p.suffix == ".py" or (p / "__init__.py").is_file())
               and p.stem not in ("__init__", "__main__", "paper")}
    assert library == set(rule["source_modules"])
    assert rule["forbidden_modules"] == ["localsgd.paper", "localsgd.__main__"]


LIBRARY_RULE = "the library imports nothing of the reproduction BROKEN"
NO_CYCLES = "no import cycles between the modules of a package BROKEN"


@pytest.mark.parametrize(("module", "planted", "says"), [
    ("schedule.py", "import localsgd.paper.report",
     (LIBRARY_RULE, "localsgd.schedule -> localsgd.paper.report")),
    ("training/loop.py", "from localsgd.paper import dry_run",
     (LIBRARY_RULE, "localsgd.training.loop -> localsgd.paper.dry_run")),
    ("engines/common.py", "import localsgd.paper.experiments.grid",  # deeper down, a subpackage
     (LIBRARY_RULE, "localsgd.engines.common -> localsgd.paper.experiments.grid")),
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
