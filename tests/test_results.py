"""Provenance sidecars, atomic writes, the parameter cache and the report join."""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import pytest

from localsgd.paper import report, results


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    target = tmp_path / "x.csv"
    target.write_text("old")
    with pytest.raises(RuntimeError), results.atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("interrupted")
    assert target.read_text() == "old"
    assert list(tmp_path.iterdir()) == [target], "no temp file left behind"


def test_cache_reuses_and_refreshes(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return pd.DataFrame({"a": [len(calls)]})

    p = {"lr": 0.1, "H": 4}
    assert results.cached("exp", p, compute, cache_dir=tmp_path)["a"][0] == 1
    assert results.cached("exp", {"H": 4, "lr": 0.1}, compute, cache_dir=tmp_path)["a"][0] == 1
    assert len(calls) == 1, "same parameters (any key order) must hit the cache"
    assert results.cached("exp", {**p, "H": 8}, compute, cache_dir=tmp_path)["a"][0] == 2
    assert results.cached("exp", p, compute, cache_dir=tmp_path, refresh=True)["a"][0] == 3


def test_cache_recomputes_corrupt_entry(tmp_path):
    p = {"k": 1}
    results.cached("exp", p, lambda: pd.DataFrame({"a": [1]}), cache_dir=tmp_path)
    (entry,) = tmp_path.glob("exp-*.csv")
    entry.write_bytes(b"\xff\xfe\x00garbage")
    df = results.cached("exp", p, lambda: pd.DataFrame({"a": [7]}), cache_dir=tmp_path)
    assert df["a"][0] == 7


def test_save_figure_writes_everything_and_checks_compare(tmp_path):
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    data = pd.DataFrame({"x": [1, 2], "y": [3, 4]})
    cmp = pd.DataFrame({"artifact": ["Table 9"], "setting": ["H=2"], "metric": ["acc"],
                        "value": [0.5]})
    written = results.save_figure("toy", fig, data, out_dir=tmp_path, params={"H": 2},
                                  mode="quick", scale="reduced", seed=3, wall_seconds=1.5,
                                  compare=cmp)
    names = sorted(p.name for p in written)
    assert names == ["toy.compare.csv", "toy.csv", "toy.json", "toy.pdf", "toy.png"]
    side = json.loads((tmp_path / "toy.json").read_text())
    assert side["params"] == {"H": 2} and side["seed"] == 3 and side["scale"] == "reduced"
    assert pd.read_csv(tmp_path / "toy.csv").equals(data)
    with pytest.raises(ValueError, match="lack columns"):
        results.save_figure("bad", None, data, out_dir=tmp_path, params={}, mode="quick",
                            scale="full", compare=cmp.drop(columns="metric"))
    with pytest.raises(ValueError, match="scale"):
        results.save_figure("bad", None, data, out_dir=tmp_path, params={}, mode="quick",
                            scale="tiny")


def test_report_joins_on_artifact_setting_metric(tmp_path):
    papers, figs = tmp_path / "papers", tmp_path / "figures"
    (papers / "src1").mkdir(parents=True)
    pd.DataFrame({"artifact": ["Table 3", "Table 3", "Table 3", "Figure 9", "Figure 9"],
                  "setting": ["H=1", "H=2", "H=3", "x", "y"],
                  "metric": ["syncs", "syncs", "syncs", "acc", "acc"],
                  "value": [15, 7, 3, 90.0, 91.0], "unit": ["", "", "", "%", "%"],
                  "note": [""] * 5}
                 ).to_csv(papers / "src1" / "reported.csv", index=False)
    for scale, setting, value in (("full", "H=1", 15), ("reduced", "H=2", 6), ("model", "H=3", 3)):
        results.save_figure(f"f_{setting[-1]}", None, pd.DataFrame({"v": [1]}), out_dir=figs,
                            params={}, mode="quick", scale=scale,
                            compare=pd.DataFrame({"artifact": ["Table 3"], "setting": [setting],
                                                  "metric": ["syncs"], "value": [value]}))
    results.save_figure("exact", None, pd.DataFrame({"v": [1]}), out_dir=figs, params={},
                        mode="quick", scale="reduced",
                        compare=pd.DataFrame({"artifact": ["Figure 9"], "setting": ["x"],
                                              "metric": ["acc"], "value": [89.0],
                                              "scale": ["full"], "rel_tol": [0.001]}))
    table = report.joined(papers, figs).set_index("setting")
    assert table.loc["x", "status"] == report.STATUS_DIFFERS  # per-row scale and tolerance
    assert table.loc["H=1", "status"] == report.STATUS_FULL
    assert table.loc["H=2", "status"] == report.STATUS_REDUCED
    assert table.loc["H=3", "status"] == report.STATUS_MODEL  # a timing-model prediction
    assert table.loc["H=2", "ours / source"] == pytest.approx(6 / 7)
    assert table.loc["y", "status"] == report.STATUS_NONE
    text = report.write_report(papers, figs).read_text()
    assert "## src1" in text and "| Table 3 | H=1 | syncs | 15 |" in text
    assert "own claims" not in text  # no claim without a source number yet

    def save_claim(name, out_dir, artifact, setting, value, claim, verdict, mode="quick"):
        results.save_figure(name, None, pd.DataFrame({"v": [1]}), out_dir=out_dir, params={},
                            mode=mode, scale="converged" if mode == "converged" else "reduced",
                            compare=pd.DataFrame({"artifact": [artifact], "setting": [setting],
                                                  "metric": ["max error"], "value": [value],
                                                  "claim": [claim], "verdict": [verdict]}))

    save_claim("own", figs, "Timing model vs runner", "8 procs", 4.2, "within 10 %", "held: 4.2 %")
    own = report.own_claims(papers, figs)
    assert own[["artifact", "verdict", "ours"]].values.tolist() == [
        ["Timing model vs runner", "held: 4.2 %", 4.2]]
    assert "## This project's own claims" in report.write_report(papers, figs).read_text()
    # converged mode's own claims join them, beside the same claim's quick row (not after a
    # second claim's); a source's artifact there is the converged section's, not the project's
    save_claim("own2", figs, "Timing model vs runner", "2 procs", 1.0, "a second claim",
               "held: 1 %")
    for name, artifact in (("own", "Timing model vs runner"), ("t3", "Table 3")):
        save_claim(name, figs / "converged", artifact, "2x2", 3.0, "within 10 %", "held: 3 %",
                   mode="converged")
    own = report.own_claims(papers, figs)
    assert own[["claim", "scale", "ours"]].values.tolist() == [
        ["within 10 %", "reduced", 4.2], ["within 10 %", "converged", 3.0],
        ["a second claim", "reduced", 1.0]]
    # a claim a source's ledger lists is the ledger's, not shown again as the project's own
    pd.DataFrame({"id": ["c1"], "artifact": ["Timing model vs runner"], "claim": ["within 10 %"],
                  "quantity": ["max error"], "paper_value": [""], "status": ["tested"],
                  "why": [""]}).to_csv(papers / "src1" / "claims.csv", index=False)
    assert report.own_claims(papers, figs)["claim"].tolist() == ["a second claim"]


def test_report_prefers_paper_mode_and_rejects_same_mode_clashes(tmp_path):
    papers, figs = tmp_path / "papers", tmp_path / "figures"
    (papers / "s").mkdir(parents=True)
    pd.DataFrame({"artifact": ["Figure 4"], "setting": ["a"], "metric": ["ratio"], "value": [2.0],
                  "unit": ["x"], "note": [""]}).to_csv(papers / "s" / "reported.csv", index=False)
    row = {"artifact": ["Figure 4"], "setting": ["a"], "metric": ["ratio"]}
    results.save_figure("f", None, pd.DataFrame({"v": [1]}), out_dir=figs, params={},
                        mode="quick", scale="reduced", compare=pd.DataFrame({**row, "value": [1.9]}))
    results.save_figure("f", None, pd.DataFrame({"v": [1]}), out_dir=figs / "paper", params={},
                        mode="paper", scale="full", compare=pd.DataFrame({**row, "value": [1.5]}))
    table = report.joined(papers, figs)
    assert len(table) == 1 and table["ours"].iloc[0] == 1.5
    assert table["status"].iloc[0] == report.STATUS_DIFFERS
    results.save_figure("g", None, pd.DataFrame({"v": [1]}), out_dir=figs, params={},
                        mode="quick", scale="reduced", compare=pd.DataFrame({**row, "value": [1.8]}))
    with pytest.raises(ValueError, match="same number in the same mode"):
        report.joined(papers, figs)
    with pytest.raises(ValueError, match="no <source>/reported.csv"):
        report.load_reported(tmp_path / "nowhere")


def test_code_hash_changes_with_any_source_file(tmp_path):
    import shutil

    package = tmp_path / "localsgd"
    installed = Path(results.__file__).parents[1]  # the whole package, both wings
    shutil.copytree(installed, package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    code_hash = results.code_hash.__wrapped__  # uncached: the files change within this test
    before = code_hash(package)
    assert before == code_hash(installed) == code_hash()  # same files, same hash
    nested = package / "convex" / "objective.py"
    nested.write_text(nested.read_text() + "\n# one more line\n")
    edited = code_hash(package)
    assert edited != before  # a change in a sub-package counts
    nested.rename(package / "convex" / "objective2.py")
    assert code_hash(package) not in (before, edited)  # so does a rename


def test_library_code_hash_reads_the_library_wings_definitions(tmp_path):
    # the provenance of every training run, and the base of the convex grids' key
    import shutil

    package = tmp_path / "localsgd"
    shutil.copytree(Path(results.__file__).parents[1], package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    library_hash = results.library_code_hash.__wrapped__  # uncached: the files change here
    whole, library = results.code_hash.__wrapped__(package), library_hash(package)
    assert library == results.library_code_hash()
    plot = package / "paper" / "report.py"  # the reproduction wing: plots, claims, harness
    plot.write_text(plot.read_text() + "\nLABEL = 'a new label'\n")
    assert results.code_hash.__wrapped__(package) != whole  # its own (convex) results recompute
    assert library_hash(package) == library  # the reproduction wing is not in it
    # a comment, a docstring, or a definition moved to another module: the same definitions
    lr = package / "lr.py"
    text = lr.read_text()
    first_doc = text.index('"""', text.index("def "))
    lr.write_text(text[:first_doc + 3] + "Reworded. " + text[first_doc + 3:] + "\n# a comment\n")
    assert library_hash(package) == library
    moved = "\n\ndef _moved_helper(x):\n    return x + 1\n"
    (package / "optim.py").write_text((package / "optim.py").read_text() + moved)
    changed = library_hash(package)
    assert changed != library  # a new definition
    (package / "optim.py").write_text((package / "optim.py").read_text().replace(moved, ""))
    (package / "gossip.py").write_text((package / "gossip.py").read_text() + moved)
    assert library_hash(package) == changed  # the same definition elsewhere
    loop = package / "training" / "loop.py"  # a change to the loop's code
    loop.write_text(loop.read_text().replace("math.floor(", "math.ceil(", 1))
    assert library_hash(package) != changed


def test_convex_grids_are_keyed_by_the_library_and_their_own_module(tmp_path):
    # fig04/fig05's grids (about 40 minutes in paper mode) survive a change to a plot or a claim
    import shutil

    package = tmp_path / "localsgd"
    shutil.copytree(Path(results.__file__).parents[1], package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    results.library_code_hash.cache_clear()  # keyed by package: the copy is read afresh
    module = package / "paper" / "experiments" / "convex.py"
    key = results.experiment_code_hash(module, package=package)
    assert key != results.library_code_hash(package)
    report = package / "paper" / "report.py"
    report.write_text(report.read_text() + "\nLABEL = 'a new label'\n")
    claims = package / "paper" / "experiments" / "claims.py"
    claims.write_text(claims.read_text() + "\nNOTE = 'reworded'\n")
    assert results.experiment_code_hash(module, package=package) == key
    module.write_text(module.read_text() + "\nSTEP = 2\n")  # the module's own code
    changed = results.experiment_code_hash(module, package=package)
    assert changed != key
    lib = package / "convex" / "simulator.py"  # the library under it
    lib.write_text(lib.read_text() + "\nSTEP = 3\n")
    results.library_code_hash.cache_clear()
    assert results.experiment_code_hash(module, package=package) != changed
    results.library_code_hash.cache_clear()


def test_a_code_change_recomputes_the_cache(tmp_path, monkeypatch):
    calls = []

    def compute():
        calls.append(1)
        return pd.DataFrame({"run": [len(calls)]})

    monkeypatch.setattr(results, "code_hash", lambda: "code-a")
    assert results.cached("exp", {"p": 1}, compute, cache_dir=tmp_path).run[0] == 1
    assert results.cached("exp", {"p": 1}, compute, cache_dir=tmp_path).run[0] == 1
    assert len(calls) == 1  # the same code and parameters: served from the cache
    monkeypatch.setattr(results, "code_hash", lambda: "code-b")  # the package changed
    assert results.cached("exp", {"p": 1}, compute, cache_dir=tmp_path).run[0] == 2
    assert len(calls) == 2


def test_figure_csv_bytes_do_not_carry_cpu_dependent_last_digits(tmp_path):
    # Table 2's fit on two CPUs: equal to 1e-15, different in the 16th digit
    a = pd.DataFrame({"H": [8, 16], "log_term_minutes": [9.137940844265156, 8.703144494985766]})
    b = a.assign(log_term_minutes=[9.137940844265154, 8.703144494985764])
    for name, df in (("a", a), ("b", b)):
        results.save_figure("t", None, df, out_dir=tmp_path / name, params={}, mode="smoke",
                            scale="model", compare=df.assign(artifact="x", setting="s",
                                                             metric="m", value=df.H * 0.1))
    for f in ("t.csv", "t.compare.csv"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    back = pd.read_csv(tmp_path / "a" / "t.csv")
    assert back.H.dtype.kind == "i"  # integers stay integers
    assert abs(back.log_term_minutes[0] - 9.137940844265156) < 1e-9
