"""figures/REPORT.md and README's claims table on hand-made papers/ and figures/ folders:
statuses, settings counted apart, "not yet" split by need, rounding, min/max pairs merged, no
nan and no internal names in a verdict; and the committed README table is the generated one."""

from pathlib import Path

import pandas as pd
import pytest

from localsgd.paper import report
from localsgd.paper.experiments import claims

ROOT = Path(__file__).resolve().parents[1]


def _reported(papers: Path, rows: list[tuple]) -> None:
    (papers / "lin2020_local_sgd").mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=["artifact", "setting", "metric", "value", "unit", "note"]).to_csv(
        papers / "lin2020_local_sgd" / "reported.csv", index=False)


def _compare(figs: Path, name: str, rows: list[dict], mode="quick", scale="reduced") -> None:
    figs.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).assign(mode=mode, scale=scale, figure=name).to_csv(
        figs / f"{name}.compare.csv", index=False)


@pytest.fixture
def folders(tmp_path):
    papers, figs = tmp_path / "papers", tmp_path / "figures"
    _reported(papers, [
        ("Table 3", "H=1; Hb=16", "syncs within node per 16 updates", 15, "", ""),  # full
        ("Table 4", "model=ResNet-50", "parameters", 25, "million", ""),  # full, differs
        ("Table 1", "B_glob=1024", "test top-1", 92.08, "%", "std=0.07"),  # reduced
        ("Table 1", "B_glob=4096", "test top-1", 88.0, "%", ""),  # not yet: quick grid
        ("Table 1", "B_glob=1024", "B_loc", 128, "", ""),  # a setting
        ("Table 2", "8x2; H=1", "training time", 20.07, "min", ""),  # model
        ("Speedup chart", "GPUs=64", "speed-up min", 2.08, "x", ""),  # model, a pair
        ("Speedup chart", "GPUs=64", "speed-up max", 2.45, "x", ""),
        ("Table 5", "model=ResNet-20; dataset=CIFAR-100; H=1", "test top-1", 68.8, "%", ""),
        ("Figure 8", "local SGD H=8 vs mini-batch SGD", "training speed-up", 1.5, "x", ""),
        ("Latency chart", "model=timm_VIT", "latency", 1720, "ms", ""),  # needs GPUs
        ("Correctness", "6 OSS models", "models passing", 5, "", ""),  # no notebook yet
        ("Figure 9", "panel=c", "Hb that overcomes the delay", 16, "", ""),  # claim, nan
        ("Overview", "slow momentum step", "slowmo_frequency (typical)", 48, "iterations", ""),
    ])
    # the claim ledger: the claims the verdicts below judge
    pd.DataFrame([
        {"id": i, "artifact": a, "claim": c, "quantity": "q", "paper_value": v,
         "status": "tested", "why": "notebooks/x.ipynb"}
        for i, (a, c, v) in enumerate([
            ("Table 1", "local SGD generalises better", "3.2"),
            ("Figure 9", "H^b = 16 overcomes a 50 s delay", "16"),
            ("Overview", "SlowMo restores quality", ""),
            ("Speedup chart", "2.08-2.45x on 64 GPUs", "2.08-2.45")])]).to_csv(
        papers / "lin2020_local_sgd" / "claims.csv", index=False)
    _compare(figs, "full", [
        {"artifact": "Table 3", "setting": "H=1; Hb=16",
         "metric": "syncs within node per 16 updates", "value": 15},
        {"artifact": "Table 4", "setting": "model=ResNet-50", "metric": "parameters",
         "value": 25.557032, "rel_tol": 0.01}], scale="full")
    _compare(figs, "reduced", [
        {"artifact": "Table 1", "setting": "B_glob=1024", "metric": "test top-1",
         "value": 45.3456789, "claim": "local SGD generalises better",
         "verdict": "held at B_glob = 1024: +21.65"},
        {"artifact": "Figure 9", "setting": "panel=c", "metric": "Hb that overcomes the delay",
         "value": None, "claim": "H^b = 16 overcomes a 50 s delay",
         "verdict": "did not hold: smallest H^b meeting both: nan"},
        {"artifact": "Overview", "setting": "slow momentum step",
         "metric": "slowmo_frequency (typical)", "value": 12, "claim": "SlowMo restores quality",
         "verdict": "did not hold: best (hier2x4) -1.25 ± 0.21 points"}])
    _compare(figs, "model", [
        {"artifact": "Table 2", "setting": "8x2; H=1", "metric": "training time",
         "value": 19.8251234},
        {"artifact": "Speedup chart", "setting": "GPUs=64", "metric": "speed-up min",
         "value": 1.838, "claim": "2.08-2.45x on 64 GPUs",
         "verdict": "model 1.84-2.27x vs blog 2.08-2.45x; outside the blog's range"},
        {"artifact": "Speedup chart", "setting": "GPUs=64", "metric": "speed-up max",
         "value": 2.269, "claim": "2.08-2.45x on 64 GPUs",
         "verdict": "model 1.84-2.27x vs blog 2.08-2.45x; outside the blog's range"}],
        scale="model")
    return papers, figs


def test_statuses_settings_and_needs(folders):
    table = report.joined(*folders).set_index(["artifact", "setting", "metric"])
    status = table["status"].droplevel("setting").droplevel("metric")
    assert status["Table 3"] == report.STATUS_FULL
    assert status["Table 4"] == report.STATUS_DIFFERS
    assert status["Table 2"] == report.STATUS_MODEL
    assert table.loc[("Table 1", "B_glob=1024", "test top-1"), "status"] == report.STATUS_REDUCED
    assert table.loc[("Table 1", "B_glob=1024", "B_loc"), "setting row"]
    assert table.loc[("Overview", "slow momentum step", "slowmo_frequency (typical)"),
                     "setting row"]  # a setting even though a notebook sets its own beside it
    needs = table["needs"].droplevel("setting").droplevel("metric")
    assert needs["Table 5"] == report.NEED_CIFAR100
    assert needs["Figure 8"] == report.NEED_IMAGENET
    assert needs["Latency chart"] == report.NEED_GPU
    assert needs["Correctness"] == report.NEED_NOTEBOOK
    assert table.loc[("Table 1", "B_glob=4096", "test top-1"), "needs"] == report.NEED_GRID


def test_an_absolute_tolerance_decides_where_it_and_the_relative_one_disagree(tmp_path):
    papers, figs = tmp_path / "papers", tmp_path / "figures"
    _reported(papers, [
        ("Table 5", "H=8 vs H=1", "test top-1 gap", -0.02, "points", ""),
        ("Table 4", "model=ResNet-20", "parameters", 100.0, "thousand", ""),
        ("Table 4", "model=VGG-16", "parameters", 100.0, "thousand", "")])
    _compare(figs, "t", [
        # a gap near zero: 50 % off by ratio, 0.01 points by difference -> reproduced
        {"artifact": "Table 5", "setting": "H=8 vs H=1", "metric": "test top-1 gap",
         "value": -0.03, "abs_tol": 0.05},
        # 4 % off: within the default relative 5 %, outside an absolute 1 -> differs
        {"artifact": "Table 4", "setting": "model=ResNet-20", "metric": "parameters",
         "value": 104.0, "abs_tol": 1.0},
        # no absolute tolerance: the relative rule alone
        {"artifact": "Table 4", "setting": "model=VGG-16", "metric": "parameters",
         "value": 104.0}], scale="full")
    table = report.joined(papers, figs).set_index("setting")
    assert table.loc["H=8 vs H=1", "status"] == report.STATUS_FULL
    assert table.loc["model=ResNet-20", "status"] == report.STATUS_DIFFERS
    assert table.loc["model=VGG-16", "status"] == report.STATUS_FULL
    assert not report.agrees(0.0, 0.02) and report.agrees(0.0, 0.02, abs_tol=0.02)


def test_summary_counts_results_and_settings_apart(folders):
    counts = dict(report.summary(report.joined(*folders)).values.tolist())
    assert counts[report.STATUS_FULL] == 1 and counts[report.STATUS_DIFFERS] == 1
    # Table 3's sync count is arithmetic; Table 4's parameters too: no experiment reproduced
    assert counts["· counts reproduced (parameters, FLOPs, sync counts)"] == 1
    assert counts["· experiments reproduced"] == 0
    assert counts["· counts that differ (parameters, FLOPs, sync counts)"] == 1
    assert counts["· experiments that differ"] == 0
    assert counts[report.STATUS_MODEL] == 2  # Table 2, and the min/max pair counted once
    assert counts[report.STATUS_REDUCED] == 2  # Table 1 at 1024, Figure 9
    assert counts["not yet: needs CIFAR-100"] == 1 and counts["not yet: needs GPUs"] == 1
    assert counts["not yet: needs ImageNet"] == 1 and counts["not yet: no notebook yet"] == 1
    assert counts["not yet: outside the quick grid"] == 1
    assert counts["**results**"] == 11
    settings = next(v for k, v in counts.items() if k.startswith("settings"))
    assert settings == 2


@pytest.mark.parametrize(("x", "text"), [(0.641209, "0.6412"), (150.344, "150.3"),
                                         (25.557032, "25.56"), (15.0, "15"), (7324, "7324"),
                                         (float("nan"), ""), (-10.1947, "-10.19")])
def test_numbers_are_rounded(x, text):
    assert report.fmt_number(x) == text


def test_rendered_report(folders):
    text = report.render(*folders)
    assert "| status | rows |" in text  # the summary is a table, not a sentence
    assert "nan" not in text.replace("Nan", "")
    assert "hier2x4" not in text and "hierarchical 2×4" in text
    # the blog's min and max are one row; full-scale ratio shown, reduced-scale ratio not
    assert "| Speedup chart | GPUs=64 | speed-up (min–max) | 2.08–2.45 | x | 1.838–2.269 |" in text
    assert "speed-up min" not in text
    assert "| Table 4 | model=ResNet-50 | parameters | 25 | million | 25.56 | 1.02 |" in text
    assert "| Table 1 | B_glob=1024 | test top-1 | 92.08 | % | 45.35 |  |" in text
    assert "| Table 2 | 8x2; H=1 | training time | 20.07 | min | 19.83 | 0.988 |" in text
    assert "outside the quick grid: Table 1 (1)" in text
    assert "Settings a notebook sets beside its own value" in text


def test_readme_table_is_short_and_plain(folders, tmp_path):
    table = report.results_table(*folders)
    assert list(table.columns) == ["claim", "the paper's value", "ours", "scale", "verdict"]
    assert table.map(lambda c: len(str(c))).to_numpy().max() <= 160
    assert set(table["verdict"]) >= {"held", "did not hold", "below the source's range"}
    assert not table.map(lambda c: "nan" in str(c)).to_numpy().any()
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{report.README_BEGIN}\nOLDTABLE\n{report.README_END}\n\nafter\n")
    report.write_report(*folders, out=tmp_path / "REPORT.md", readme=readme)
    text = readme.read_text()
    assert "OLDTABLE" not in text and text.endswith("\n\nafter\n")
    assert "| claim | the paper's value | ours |" in text
    assert not report.update_readme(readme, *folders)  # already current


def test_committed_readme_table_is_the_generated_one():
    text = (ROOT / "README.md").read_text()
    assert report.README_BEGIN in text, "README has no generated claims table"
    block = report.README_BEGIN + text.split(report.README_BEGIN, 1)[1].split(
        report.README_END, 1)[0] + report.README_END
    assert block == report.readme_block(ROOT / "papers", ROOT / "figures"), (
        "README's claims table is stale: run `localsgd report`")


def test_committed_report_is_current():
    assert (ROOT / "figures" / "REPORT.md").read_text() == report.render(
        ROOT / "papers", ROOT / "figures"), "figures/REPORT.md is stale: run `localsgd report`"


def test_a_converged_claim_on_a_setting_the_source_lacks_still_shows(tmp_path):
    # Table 3's converged claim reads 2x2 (the smallest K that keeps its shape); the source
    # prints 4x4 only: the row joins no source number and still reaches the claims
    folder = tmp_path / "figures" / report.CONVERGED_DIR
    folder.mkdir(parents=True)
    pd.DataFrame([{"artifact": "Table 3", "setting": "2x2; H=16; Hb=1", "metric": "test top-1",
                   "value": 72.78, "unit": "%", "note": "n", "claim": "on 2x2, H^b > 1 wins",
                   "verdict": "held: gains +2.04 and +1.56 points", "scale": "converged",
                   "mode": "converged", "figure": "table03_topologies",
                   "rule": claims.RULE}]).to_csv(
        folder / "table03_topologies.compare.csv", index=False)
    papers = Path(__file__).resolve().parents[1] / "papers"
    rows = report.converged_claims(papers, tmp_path / "figures")
    row = rows[rows["artifact"] == "Table 3"]
    assert len(row) == 1 and row["verdict"].iloc[0] == "held"
    assert row["ours"].iloc[0] == "72.8 % top-1 at 2x2; H=16; Hb=1"  # no source beside it
    assert row["source"].iloc[0] == report.SOURCE_LABELS.get("lin2020_local_sgd",
                                                              row["source"].iloc[0])
