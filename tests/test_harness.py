"""The papermill harness: validation before running, failures isolated, outputs complete."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from localsgd.paper import reproduce as h
from localsgd.paper.cli import main
from localsgd.paper.results import library_code_hash

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
IDS = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))


# ------------------------------------------------------------------ the committed notebooks
@pytest.mark.parametrize("nb_id", IDS)
def test_notebook_committed_clean_with_one_parameters_cell(nb_id):
    nb = nbformat.read(NOTEBOOKS / f"{nb_id}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "strip outputs"
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1
    defined = h.parameters_cell_names(NOTEBOOKS / f"{nb_id}.ipynb")
    assert {"mode", "out_dir", "seed"} <= set(defined)


@pytest.mark.parametrize("nb_id", IDS)
def test_papermill_parses_every_parameter(nb_id):
    # papermill only warns on a line it cannot parse (e.g. "=" or a quote in a comment)
    from papermill.translators import PythonTranslator

    nb = nbformat.read(NOTEBOOKS / f"{nb_id}.ipynb", as_version=4)
    (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    parsed = [p.name for p in PythonTranslator.inspect(cell)]
    assert parsed == list(h.parameters_cell_names(NOTEBOOKS / f"{nb_id}.ipynb"))


@pytest.mark.parametrize("mode", h.MODES)
def test_every_params_yaml_uses_only_defined_parameters(mode):
    specs = h.plan(NOTEBOOKS, mode)  # raises HarnessError naming any unknown key
    # a partial mode (converged) is in the notebooks that have its file
    assert [s.id for s in specs] == [i for i in IDS if mode not in h.PARTIAL_MODES
                                     or (NOTEBOOKS / "params" / i / f"{mode}.yaml").exists()]


def test_no_stray_params_folders():
    folders = {p.name for p in (NOTEBOOKS / "params").iterdir() if p.is_dir()}
    assert folders == set(IDS)


def _needs_missing_w8a(nb_id: str) -> bool:
    """True for a notebook that loads w8a when no local copy exists (offline runs skip it)."""
    from localsgd.data import data_dirs

    uses = "load_w8a" in (NOTEBOOKS / f"{nb_id}.ipynb").read_text()
    return uses and not any((d / "w8a").is_file() for d in data_dirs())


def _needs_missing_cifar(nb_id: str) -> bool:
    """True for a notebook that trains on CIFAR-10 when no local copy exists."""
    from localsgd.data import load_cifar

    if 'dataset = "cifar10"' not in (NOTEBOOKS / f"{nb_id}.ipynb").read_text():
        return False
    try:
        load_cifar("cifar10", download=False)
    except FileNotFoundError:
        return True
    return False


# Where the browser test is required (CI sets LOCALSGD_REQUIRE_BROWSER), it runs every notebook
# at smoke size in JupyterLab, with smoke.yaml's parameters (appB_comm_cost: typed into its
# cell; the documented commands run its smoke mode), and checks the same outputs
# (`check_smoke_outputs`), so the papermill run here would execute the same cells a second time.
# What papermill adds is the same for every notebook (parameters injected as a cell, executed
# copy, report), and other tests exercise it: a paper dry run of 15 notebooks
# (tests/test_dry_run.py), each converged file (tests/test_converged_mode.py), the harness tests
# below, and the documented reproduce commands (tests/test_doc_commands.py).
BROWSER_RUNS_SMOKE = bool(os.environ.get("LOCALSGD_REQUIRE_BROWSER"))


@pytest.mark.skipif(BROWSER_RUNS_SMOKE, reason="tests/browser/test_jupyterlab.py runs every "
                    "notebook at smoke size and checks its outputs (LOCALSGD_REQUIRE_BROWSER)")
@pytest.mark.parametrize("nb_id", IDS)
def test_notebook_runs_in_smoke_mode(nb_id, tmp_path, monkeypatch, capsys):
    if _needs_missing_w8a(nb_id):
        pytest.skip("w8a not available locally (set LOCALSGD_DATA); CI provides it")
    if _needs_missing_cifar(nb_id):
        pytest.skip("CIFAR-10 not available locally (set LOCALSGD_DATA); CI provides it")
    out = tmp_path / "figures"
    # a cell that does not finish within 10 min fails instead of hanging the suite (once, under
    # load, a kernel sat idle while papermill waited for its widget cell): retried once
    monkeypatch.setenv("LOCALSGD_CELL_TIMEOUT", "600")
    args = ["reproduce", "--mode", "smoke", "--only", nb_id, "--out-dir", str(out),
            "--build-dir", str(tmp_path / "build")]
    code = main(args)
    if code != 0 and "CellTimeoutError" in capsys.readouterr().out:
        code = main(args)
    assert code == 0
    check_smoke_outputs(nb_id, out)
    assert (out / "REPORT.md").exists()
    assert (tmp_path / "build" / f"{nb_id}.smoke.ipynb").exists()


def check_smoke_outputs(nb_id: str, out: Path) -> None:
    """What a notebook run at smoke size leaves in ``out``: its figure, data and provenance, and
    compare rows the report can join (also called by tests/browser/test_jupyterlab.py)."""
    for ext in ("png", "pdf", "csv", "json"):
        assert (out / f"{nb_id}.{ext}").stat().st_size > 0
    side = json.loads((out / f"{nb_id}.json").read_text())
    for key in ("git", "library_hash", "versions", "device", "params", "seed", "mode", "scale",
                "utc_time", "wall_seconds"):
        assert key in side, key
    assert side["mode"] == "smoke" and side["git"]["commit"] and "dirty" in side["git"]
    assert side["versions"]["torch"] and side["wall_seconds"] > 0
    assert side["library_hash"] == library_code_hash()  # the key its training runs read
    _check_compare_rows(nb_id, out)


def _check_compare_rows(nb_id: str, out) -> None:
    """The rows the report joins: columns present, values finite or empty, every verdict one
    of the rule's outcomes, and every row either keyed like a source's reported.csv row or a
    claim of this project's own."""
    import math

    import pandas as pd

    from localsgd.paper.experiments.claims import OUTCOMES
    from localsgd.paper.report import load_reported

    path = out / f"{nb_id}.compare.csv"
    if not path.exists():
        return
    rows = pd.read_csv(path)
    for col in ("artifact", "setting", "metric", "value", "unit", "note", "scale", "mode"):
        assert col in rows.columns, (nb_id, col)
    assert all(v is None or not isinstance(v, float) or math.isfinite(v) or math.isnan(v)
               for v in rows.value)  # nan here is an empty cell: no inf, no text
    assert pd.to_numeric(rows.value, errors="coerce").notna().sum() + rows.value.isna().sum() \
        == len(rows), rows.value
    if "verdict" in rows.columns:
        for text in rows.verdict.dropna():
            assert any(text.startswith(o) for o in OUTCOMES) or text.startswith(
                ("rule right", "best β")), (nb_id, text)
            assert "nan" not in text.replace("nanosec", ""), (nb_id, text)
    # smoke grids hold settings the sources never ran (B_glob = 32), so rows are checked by
    # artifact and metric: a source's artifact with a metric that source reports for it (a typo
    # would never join), or a claim of this project's own, e.g. Figure 10's, for which the
    # paper prints no number (the report lists those apart)
    reported = load_reported(REPO / "papers")
    metrics = reported.groupby("artifact").metric.agg(set).to_dict()
    claims = rows["claim"] if "claim" in rows.columns else pd.Series([None] * len(rows))
    for row, claim in zip(rows.itertuples(), claims, strict=True):
        if row.artifact in metrics and not isinstance(claim, str):
            assert row.metric in metrics[row.artifact], (nb_id, row.artifact, row.metric)


# ------------------------------------------------------------------ validation, on toy notebooks
def _toy(folder: Path, nb_id: str, body: str, params: dict | None = None,
         params_src: str = 'mode = "smoke"\nout_dir = "figures"\nseed = 0\nsize = 3\n') -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    cells = []
    if params_src is not None:
        cells.append(nbformat.v4.new_code_cell(params_src, metadata={"tags": ["parameters"]}))
    cells.append(nbformat.v4.new_code_cell(body))
    nb.cells = cells
    (folder / "notebooks").mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / "notebooks" / f"{nb_id}.ipynb")
    for mode in h.MODES:
        p = folder / "notebooks" / "params" / nb_id / f"{mode}.yaml"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(yaml.safe_dump(params if params is not None else {"size": 2}))


WRITE = ("from pathlib import Path\nPath(out_dir).mkdir(parents=True, exist_ok=True)\n"
         "Path(out_dir, 'toy_{name}.txt').write_text(str(size))\n")


def _cli(folder: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "localsgd", "reproduce", "--notebooks", str(folder / "notebooks"),
           "--out-dir", str(folder / "out"), "--build-dir", str(folder / "build"), *args]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)


def test_unknown_yaml_key_fails_before_running(tmp_path):
    _toy(tmp_path, "good", WRITE.format(name="good"))
    _toy(tmp_path, "typo", WRITE.format(name="typo"), params={"sise": 2})
    r = _cli(tmp_path, "--mode", "smoke")
    assert r.returncode == 2
    assert "sise" in r.stderr and "typo" in r.stderr
    assert not (tmp_path / "out").exists(), "nothing may run when validation fails"


def test_paper_mode_writes_below_figures_paper_by_default(tmp_path):
    # without --out-dir, paper mode must not overwrite the committed quick-mode files in figures/
    _toy(tmp_path, "a", WRITE.format(name="a"))
    cmd = [sys.executable, "-m", "localsgd", "reproduce", "--notebooks", str(tmp_path / "notebooks"),
           "--build-dir", str(tmp_path / "build"), "--mode", "paper", "--no-report"]
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "figures" / "paper" / "toy_a.txt").read_text() == "2"
    assert not (tmp_path / "figures" / "toy_a.txt").exists()


def test_unknown_mode_and_id_fail_with_their_name(tmp_path):
    _toy(tmp_path, "good", WRITE.format(name="good"))
    r = _cli(tmp_path, "--mode", "fast")
    assert r.returncode == 2 and "'fast'" in r.stderr and "smoke" in r.stderr
    r = _cli(tmp_path, "--mode", "smoke", "--only", "nope")
    assert r.returncode == 2 and "'nope'" in r.stderr and "good" in r.stderr


def test_missing_parameters_cell_and_reserved_keys_fail(tmp_path):
    _toy(tmp_path, "untagged", "x = 1", params={}, params_src=None)
    with pytest.raises(h.HarnessError, match="no code cell tagged 'parameters'"):
        h.plan(tmp_path / "notebooks", "smoke")
    shutil.rmtree(tmp_path / "notebooks")
    _toy(tmp_path, "reserved", "x = 1", params={"mode": "paper"})
    with pytest.raises(h.HarnessError, match="injects"):
        h.plan(tmp_path / "notebooks", "smoke")


def test_raising_notebook_fails_command_but_others_run(tmp_path):
    _toy(tmp_path, "a_first", WRITE.format(name="a"))
    _toy(tmp_path, "b_broken", "x = 1\nraise RuntimeError('boom in cell')")
    _toy(tmp_path, "c_last", WRITE.format(name="c"))
    r = _cli(tmp_path, "--mode", "quick")
    assert r.returncode == 1
    out = r.stdout + r.stderr
    assert "b_broken" in out and "RuntimeError" in out and "boom in cell" in out
    assert "starting 'x = 1'" in out  # names the cell that raised
    assert (tmp_path / "out" / "toy_a.txt").read_text() == "2"
    assert (tmp_path / "out" / "toy_c.txt").read_text() == "2"  # ran after the failure


def test_list_shows_ids_and_modes(tmp_path, capsys):
    assert main(["reproduce", "--list"]) == 0
    listing = capsys.readouterr().out
    for nb_id in IDS:
        assert nb_id in listing


STAMP = ("import json, os, time\nfrom pathlib import Path\nstart = time.time()\n"
         "time.sleep(4)\nPath(out_dir).mkdir(parents=True, exist_ok=True)\n"
         "Path(out_dir, '{name}.json').write_text(json.dumps({{'start': start, "
         "'end': time.time(), 'omp': os.environ.get('OMP_NUM_THREADS'), "
         "'headless': os.environ.get('LOCALSGD_HEADLESS')}}))\n")


def test_jobs_run_untimed_notebooks_together_and_timed_ones_alone(tmp_path, monkeypatch):
    """--jobs 2: the two untimed notebooks overlap in time, with cpu_count // 2 threads each;
    the timed one runs alone first with the harness's own threads; results in plan order and
    each notebook's files are its own."""
    for name in ("a_untimed", "b_untimed", "c_timed"):
        _toy(tmp_path, name, STAMP.format(name=name))
    monkeypatch.setattr(h, "TIMED", frozenset({"c_timed"}))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    specs = h.plan(tmp_path / "notebooks", "smoke")
    out = tmp_path / "out"
    results = h.run(specs, "smoke", out_dir=out, build_dir=tmp_path / "build", cwd=tmp_path,
                    progress=False, jobs=2, expected={"a_untimed": 9.0, "b_untimed": 5.0})
    assert [r.id for r in results] == ["a_untimed", "b_untimed", "c_timed"]
    assert all(r.status == "ok" for r in results), [r.error for r in results]
    assert [r.files for r in results] == [[f"{r.id}.json"] for r in results]
    a, b, c = (json.loads((out / f"{r.id}.json").read_text()) for r in results)
    assert a["start"] < b["end"] and b["start"] < a["end"], "the untimed ones did not overlap"
    assert c["end"] < min(a["start"], b["start"]), "the timed one did not run alone first"
    assert a["omp"] == b["omp"] == str(h.job_threads(2)) and c["omp"] is None
    # every kernel the harness starts is headless (`notebook.headless()`); the harness's own
    # environment is left as it was
    assert a["headless"] == b["headless"] == c["headless"] == "1"
    assert "LOCALSGD_HEADLESS" not in os.environ


def test_source_value_reads_one_reported_number_and_refuses_a_missing_one():
    from localsgd.paper import notebook

    assert notebook.source_value("Figure 4", "K=16; B_loc=256; H=1 vs B_loc=16; H=16",
                                 "time ratio") == 3.0
    with pytest.raises(KeyError, match="0 rows for 'Figure 4'"):
        notebook.source_value("Figure 4", "no such setting", "time ratio")


def test_source_note_is_kept_by_the_saved_figure(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from localsgd.paper import notebook

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1])
    fig.savefig(tmp_path / "bare.png", dpi=50, bbox_inches="tight")
    notebook.source_note(fig, ["source: 3x", "here: 1.64x"])
    fig.savefig(tmp_path / "noted.png", dpi=50, bbox_inches="tight")
    plt.close(fig)
    height = {n: plt.imread(tmp_path / f"{n}.png").shape[0] for n in ("bare", "noted")}
    assert height["noted"] > height["bare"]  # the two lines below the axes are in the file
    assert notebook.ratio_text(1.6401) == "1.64x"
    assert notebook.ratio_text(float("nan")) == notebook.ratio_text(None) == "not measurable"
