"""Working interactively: quick-mode defaults, outputs outside the repository's tracked files,
one-line parameter errors, `make lab`.

The convention every notebook follows (checked here for every notebook in notebooks/):
its parameters cell holds the quick-mode values (so Run All in JupyterLab shows the committed
figure), ``out_dir = "build/interactive"``, and it calls ``localsgd.paper.notebook.check(...)`` with its
parameters before doing any work.
"""

import json
import os
import subprocess
import time
from pathlib import Path
from unittest import mock

import nbformat
import pytest
import yaml

from localsgd.paper import notebook, results
from localsgd.paper import reproduce as h

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
IDS = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))


def _parameters_cell(nb) -> nbformat.NotebookNode:
    (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    return cell


# ------------------------------------------------------------------ the convention, per notebook
@pytest.mark.parametrize("nb_id", IDS)
def test_parameters_cell_holds_the_quick_values(nb_id):
    defined = h.parameters_cell_names(NOTEBOOKS / f"{nb_id}.ipynb")
    assert defined["mode"] == "quick", "the parameters cell must be the quick configuration"
    assert defined["out_dir"] == results.INTERACTIVE_DIR, (
        f'set out_dir = "{results.INTERACTIVE_DIR}" (git-ignored; the harness injects figures/)')
    quick = yaml.safe_load((NOTEBOOKS / "params" / nb_id / "quick.yaml").read_text()) or {}
    differ = {k: (defined.get(k), v) for k, v in quick.items() if defined.get(k) != v}
    assert not differ, f"parameters cell vs quick.yaml (cell, yaml): {differ}"


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """One kernel for every notebook of the module (imports once: torch & co. take seconds)."""
    from nbclient import NotebookClient

    client = NotebookClient(nbformat.v4.new_notebook(), kernel_name="python3", timeout=120,
                            resources={"metadata": {"path": str(tmp_path_factory.mktemp("k"))}})
    with client.setup_kernel():
        yield client


@pytest.mark.parametrize("nb_id", IDS)
def test_bad_parameter_is_one_line_naming_it(nb_id, kernel):
    """What a person sees after a typo in the parameters cell: one line, not a traceback."""
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(NOTEBOOKS / f"{nb_id}.ipynb", as_version=4)
    cell = _parameters_cell(nb)
    cell.source = cell.source.replace('mode = "quick"', 'mode = "fast"', 1)
    assert 'mode = "fast"' in cell.source
    kernel.nb = nb
    kernel.execute_cell(nbformat.v4.new_code_cell("%reset -f"), 0)
    with pytest.raises(CellExecutionError):
        for i, c in enumerate(nb.cells):
            if c.cell_type == "code":
                kernel.execute_cell(c, i)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.output_type == "error"]
    assert len(errors) == 1, "the notebook must stop at its check(...) call"
    (err,) = errors
    assert err.ename == "ParameterError", f"{err.ename}: {err.evalue} (call check(mode=mode, ...))"
    assert len(err.traceback) == 1 and "\n" not in err.traceback[0], err.traceback
    assert "mode = 'fast'" in err.evalue and "'smoke', 'quick', 'paper'" in err.evalue


def _git_status() -> set[str]:
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    return set(out.splitlines())


def test_running_from_notebooks_dir_leaves_git_status_clean(tmp_path):
    """A notebook run by hand (its folder as working directory, no out_dir given) writes only to
    the git-ignored build/interactive/ of the repository."""
    import papermill as pm

    nb_id = "appB_comm_cost"  # analytic and fast; the path handling is the same in every notebook
    smoke = yaml.safe_load((NOTEBOOKS / "params" / nb_id / "smoke.yaml").read_text())
    before, t0 = _git_status(), time.time()
    pm.execute_notebook(str(NOTEBOOKS / f"{nb_id}.ipynb"), str(tmp_path / "out.ipynb"),
                        parameters={**smoke, "mode": "smoke"}, cwd=str(NOTEBOOKS),
                        kernel_name="python3", progress_bar=False)
    written = REPO / results.INTERACTIVE_DIR / f"{nb_id}.png"
    assert written.stat().st_mtime >= t0 - 1, "the default out_dir is build/interactive/"
    # other developers may change files meanwhile: only entries this run could have made count
    new = [line for line in _git_status() - before
           if nb_id in line or line[3:].startswith(("notebooks/", "figures/"))]
    assert not new, f"git status changed: {new}"


# ------------------------------------------------------------------ the helpers
def test_resolve_out_dir_is_repository_relative(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert results.resolve_out_dir(None) == REPO / "build" / "interactive"
    assert results.resolve_out_dir("build/interactive") == REPO / "build" / "interactive"
    assert results.resolve_out_dir(tmp_path / "x") == tmp_path / "x"
    results.save_figure("toy", None, __import__("pandas").DataFrame({"v": [1]}),
                        out_dir=tmp_path / "figs", params={}, mode="smoke", scale="reduced")
    assert (tmp_path / "figs" / "toy.csv").exists()


def test_check_names_the_parameter_and_the_allowed_values():
    notebook.check(mode="paper", Hs=[1, 16], n_train=None, models=["resnet20"], device="cuda:1",
                   topologies=["8x2"], refresh=True)
    with pytest.raises(notebook.ParameterError) as exc:
        notebook.check(mode="quick", fstar_source="papr", K=0)
    msg = str(exc.value)
    assert "fstar_source = 'papr'" in msg and "'paper', 'computed'" in msg
    assert "K = 0" in msg and "integer >= 1" in msg and "mode" not in msg
    (line,) = exc.value._render_traceback_()
    assert "ParameterError" in line and "\n" not in line
    with pytest.raises(notebook.ParameterError, match="one of 'resnet20'"):
        notebook.check(model="resnet21")
    with pytest.raises(notebook.ParameterError, match="True or False"):
        notebook.check(refresh="no")
    with pytest.raises(TypeError, match="no rule for colour"):
        notebook.check(colour="red")
    notebook.check(rules={"colour": notebook.one_of("red", "blue")}, colour="red")
    # an empty list only where it means something: converged mode runs Table 6 without Table 7
    notebook.check(table6_momenta=[[0.9, 0.0]], table7_momenta=[])
    with pytest.raises(notebook.ParameterError, match=r"table6_momenta = \[\].*non-empty"):
        notebook.check(table6_momenta=[])
    with pytest.raises(notebook.ParameterError, match=r"Table 7 not run"):
        notebook.check(table7_momenta=[[0.9, 1.5]])


def test_make_lab_serves_on_loopback_with_the_venv_kernel():
    out = subprocess.run(["make", "-n", "lab"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    assert "jupyter lab" in out and "--ip=127.0.0.1" in out and "MPLBACKEND" in out
    assert "ipykernel install --sys-prefix --name python3" in (REPO / "Makefile").read_text()


def test_params_takes_the_parameters_cell_and_checks_it():
    ns = {"__name__": "__main__", "_i1": "x", "In": ["mode = 'quick'"], "Out": {},
          "notebook": notebook, "get_ipython": print, "mode": "quick", "K": 2, "Hs": [1, 16],
          "n_train": None}
    P = notebook.params(dict(ns))  # a copy: params() marks the namespace it reads
    assert P.as_dict() == {"mode": "quick", "K": 2, "Hs": [1, 16], "n_train": None}
    assert P.K == 2 and P.as_dict(seeds=[0, 1])["seeds"] == [0, 1]
    with pytest.raises(AttributeError, match="read-only"):
        P.K = 3
    # a bad value and an unknown name (a typo papermill would inject silently) both stop here
    with pytest.raises(notebook.ParameterError, match=r"K = 0 is not allowed; expected an integer"):
        notebook.params({**ns, "K": 0})
    with pytest.raises(notebook.ParameterError, match=r"unknown parameter 'Hss' \(did you mean 'Hs'"):
        notebook.params({**ns, "Hss": [1]})
    # a notebook-specific parameter passes its own rule
    rule = {"colour": notebook.one_of("red", "blue")}
    assert notebook.params({**ns, "colour": "red"}, rules=rule).colour == "red"
    with pytest.raises(notebook.ParameterError, match="colour = 'green'"):
        notebook.params({**ns, "colour": "green"}, rules=rule)


def test_params_again_in_the_same_kernel_takes_the_same_names():
    # Run All twice without a restart: the notebook's own results (plain data too) are globals
    # by then; the second call takes the first call's names, with their values re-read
    ns = {"mode": "quick", "K": 2}
    assert notebook.params(ns).as_dict() == {"mode": "quick", "K": 2}
    ns.update(compare=[{"a": 1}], cases=3, K=4)  # results of the first run; K edited and re-run
    assert notebook.params(ns).as_dict() == {"mode": "quick", "K": 4}
    ns["K"] = 0
    with pytest.raises(notebook.ParameterError, match="K = 0"):
        notebook.params(ns)


# ------------------------------------------------------------------ one line to change mode
def _cell_namespace(nb_id: str, **edits) -> dict:
    """A kernel's globals after running ``nb_id``'s parameters cell with ``edits`` typed in."""
    from localsgd.paper.notebook import cell_defaults

    return {**cell_defaults(NOTEBOOKS / f"{nb_id}.ipynb"), **edits}


@pytest.mark.parametrize("nb_id", sorted(p.parent.name for p in
                                         (NOTEBOOKS / "params").glob("*/converged.yaml")))
def test_setting_mode_in_the_cell_takes_that_modes_file(nb_id, monkeypatch):
    import yaml

    from localsgd.paper import notebook

    monkeypatch.delenv(notebook.HEADLESS_ENV, raising=False)
    file = yaml.safe_load((NOTEBOOKS / "params" / nb_id / "converged.yaml").read_text())
    namespace = _cell_namespace(nb_id, mode="converged")
    with mock.patch.dict(os.environ):  # params sets the kept runs' folder: not for later tests
        os.environ.pop(notebook.RUNS_ENV, None)
        P = notebook.params(namespace, notebook=nb_id)
        runs = os.environ[notebook.RUNS_ENV]
    for name, value in file.items():
        assert getattr(P, name) == value, name
        assert namespace[name] == value, name  # a later cell reading the bare name sees it too
    # converged mode reads the committed kept runs, as `localsgd reproduce` does
    assert runs.endswith("figures/converged/runs")


def test_the_users_edits_win_over_the_mode_file(monkeypatch):
    from localsgd.paper import notebook

    monkeypatch.delenv(notebook.HEADLESS_ENV, raising=False)
    nb_id = "table05_models"
    defaults = notebook.cell_defaults(NOTEBOOKS / f"{nb_id}.ipynb")
    with mock.patch.dict(os.environ):  # params sets the kept runs' folder: not for later tests
        P = notebook.params(_cell_namespace(nb_id, mode="converged", n_seeds=2), notebook=nb_id)
    assert P.n_seeds == 2 and P.epochs == 20.0  # the edit, then the file's epochs
    assert defaults["epochs"] != 20.0
    # the cell's own mode takes no file; a mode without one is one line naming those with one
    P = notebook.params(_cell_namespace(nb_id), notebook=nb_id)
    assert P.epochs == defaults["epochs"]
    with pytest.raises(notebook.ParameterError, match="mode = 'fast' is not allowed"):
        notebook.params(_cell_namespace(nb_id, mode="fast"), notebook=nb_id)
    # under `localsgd reproduce` (which injects the file itself) the cell's values stand
    monkeypatch.setenv(notebook.HEADLESS_ENV, "1")
    P = notebook.params(_cell_namespace(nb_id, mode="converged"), notebook=nb_id)
    assert P.epochs == defaults["epochs"]


def test_a_mode_without_a_file_names_the_modes_that_have_one(tmp_path):
    from localsgd.paper import notebook

    nb = {"cells": [{"cell_type": "code", "metadata": {"tags": ["parameters"]},
                     "source": 'mode = "quick"\nepochs = 2.0\n'}]}
    (tmp_path / "x.ipynb").write_text(json.dumps(nb))
    (tmp_path / "params" / "x").mkdir(parents=True)
    (tmp_path / "params" / "x" / "smoke.yaml").write_text("epochs: 1.0\n")
    with pytest.raises(notebook.ParameterError, match=r"x has no paper.yaml \(modes with a "
                                                       r"file: smoke\)"):
        notebook.mode_values({"mode": "paper", "epochs": 2.0}, "x", folder=tmp_path)
    assert notebook.mode_values({"mode": "smoke", "epochs": 2.0}, "x", folder=tmp_path) == \
        {"mode": "smoke", "epochs": 1.0}
    assert notebook.mode_values({"mode": "smoke", "epochs": 3.0}, "x", folder=tmp_path) == \
        {"mode": "smoke", "epochs": 3.0}


def test_a_notebook_saved_in_another_mode_still_takes_that_modes_file(tmp_path):
    # JupyterLab saved the cell after `mode = "converged"` was typed: the cell on disk is no
    # baseline, the quick file is
    from localsgd.paper import notebook

    nb = {"cells": [{"cell_type": "code", "metadata": {"tags": ["parameters"]},
                     "source": 'mode = "converged"\nepochs = 2.0\nK = 4\nn_seeds = 1\n'}]}
    (tmp_path / "x.ipynb").write_text(json.dumps(nb))
    (tmp_path / "params" / "x").mkdir(parents=True)
    (tmp_path / "params" / "x" / "quick.yaml").write_text("epochs: 2.0\nK: 2\nn_seeds: 1\n")
    (tmp_path / "params" / "x" / "converged.yaml").write_text("epochs: 20.0\nK: 2\n")
    cell = {"mode": "converged", "epochs": 2.0, "K": 4, "n_seeds": 1}
    # epochs as quick has it: the file's; K = 4 was the user's edit saved before: it wins
    assert notebook.mode_values(cell, "x", folder=tmp_path) == {**cell, "epochs": 20.0}
    # back to quick: the quick file, the edit still winning
    assert notebook.mode_values({**cell, "mode": "quick", "epochs": 20.0}, "x",
                                folder=tmp_path) == {**cell, "mode": "quick", "epochs": 20.0}


def test_every_name_a_mode_file_sets_has_its_base_value_in_the_quick_file():
    import yaml

    from localsgd.paper import notebook

    for folder in sorted((NOTEBOOKS / "params").iterdir()):
        files = {p.stem: yaml.safe_load(p.read_text()) or {} for p in folder.glob("*.yaml")}
        base = files[notebook.BASE_MODE]
        cell = notebook.cell_defaults(NOTEBOOKS / f"{folder.name}.ipynb")
        for mode, values in files.items():
            assert set(values) <= set(base), (folder.name, mode, set(values) - set(base))
        # names the cell holds keep the cell's values there unless quick trims them on purpose
        assert set(base) <= set(cell), folder.name


def test_a_quick_run_after_a_converged_one_stops_writing_to_the_kept_runs(monkeypatch):
    from localsgd.paper import notebook

    monkeypatch.delenv(notebook.HEADLESS_ENV, raising=False)
    nb_id = "table05_models"
    with mock.patch.dict(os.environ):
        os.environ.pop(notebook.RUNS_ENV, None)
        notebook.params(_cell_namespace(nb_id, mode="converged"), notebook=nb_id)
        assert os.environ[notebook.RUNS_ENV].endswith("figures/converged/runs")
        notebook.params(_cell_namespace(nb_id, mode="quick"), notebook=nb_id)
        assert notebook.RUNS_ENV not in os.environ
        # a folder the user set is theirs: left alone in every mode
        os.environ[notebook.RUNS_ENV] = "mine"
        notebook.params(_cell_namespace(nb_id, mode="converged"), notebook=nb_id)
        notebook.params(_cell_namespace(nb_id, mode="quick"), notebook=nb_id)
        assert os.environ[notebook.RUNS_ENV] == "mine"
