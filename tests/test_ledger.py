"""The claim ledger (localsgd.paper.ledger): every source claim listed with its status, joined
with the notebooks' verdict rows at each scale; the README's five verdict lines from it."""

import csv
from pathlib import Path

import pandas as pd
import pytest

from localsgd.paper import ledger, report
from localsgd.paper.experiments import claims

ROOT = Path(__file__).resolve().parents[1]


def _ledger_file(folder: Path, rows: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "claims.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=ledger.COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in ledger.COLUMNS})


def _row(id_, claim, status="tested", artifact="Table 1", why="", value=""):
    return {"id": id_, "artifact": artifact, "claim": claim, "quantity": "q",
            "paper_value": value, "status": status, "why": why}


def _compare(path: Path, rows: list[dict], scale: str = "reduced", mode: str = "quick") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([{"artifact": "Table 1", "setting": "s", "metric": "m", "value": 1.5,
                   "unit": "points", "scale": scale, "mode": mode, **r} for r in rows]
                 ).to_csv(path, index=False)


@pytest.fixture()
def checkout(tmp_path):
    papers, figures = tmp_path / "papers", tmp_path / "figures"
    _ledger_file(papers / "lin2020_local_sgd", [
        _row("t1", "local SGD generalises better", value="3.2"),
        _row("t2", "H = 8 matches H = 1", artifact="Table 5"),
        _row("f8", "ImageNet speed-up", status="data unavailable", artifact="Figure 8",
             why="ImageNet is not here"),
        _row("f5", "something never run", status="never tested", artifact="Figure 5",
             why="no notebook")])
    (papers / "lin2020_local_sgd" / "reported.csv").write_text(
        "artifact,setting,metric,value,unit,note\nTable 1,s,m,3.2,points,\n")
    held = str(claims.verdict([2.0, 2.1, 2.2], 0.0, origin=claims.ours("x")))
    _compare(figures / "table01.compare.csv",
             [{"claim": "local SGD generalises better", "verdict": held,
               "rule": claims.RULE}])
    _compare(figures / "converged" / "table01.compare.csv",
             [{"claim": "local SGD generalises better", "verdict": "inconclusive at this "
               "scale: old words", "tested": "+0.5 to +1.2 points"}], scale="converged",
             mode="converged")
    return papers, figures


def test_ledger_joins_each_claim_at_each_scale_it_was_judged(checkout):
    table = ledger.ledger(*checkout).set_index(["id", "scale"])
    assert table.loc[("t1", "reduced"), "verdict"].startswith("held: ")
    assert table.loc[("t1", "converged proxy"), "verdict"].startswith("inconclusive")
    assert pd.isna(table.loc[("t1", "converged proxy"), "rule"])  # an older notebook's output
    assert table.loc[("t2", ""), "verdict"] == ledger.UNJOINED
    assert table.loc[("f8", ""), "verdict"] == ledger.UNAVAILABLE
    assert table.loc[("f5", ""), "verdict"] == ledger.NEVER


def test_report_lists_each_verdict_and_why_a_claim_was_not_judged(checkout):
    rows = report.ledger_rows(*checkout).set_index(["id", "scale"])
    assert rows.loc[("t1", "reduced"), "outcome"] == "held"
    assert rows.loc[("t1", "converged proxy"), "outcome"] == "inconclusive at this scale"
    assert rows.loc[("t1", "reduced"), "ours"] == "1.5 points"
    # a claim on a difference shows the difference, not the accuracy of the row it sits on
    assert rows.loc[("t1", "converged proxy"), "ours"] == "+0.5 to +1.2 points"
    section = "\n".join(report.ledger_section(*checkout))
    assert "## Claim ledger" in section and "ImageNet is not here" in section
    table = report.results_table(*checkout)
    assert list(table.columns) == ["claim", "the paper's value", "ours", "scale", "verdict"]
    first = table.iloc[0]
    assert first["claim"].startswith("Table 1: local SGD generalises better")
    assert first["the paper's value"] == "3.2"


def test_the_papers_value_at_the_setting_tested_replaces_the_ledgers(checkout):
    papers, figures = checkout
    held = str(claims.verdict([2.0, 2.1, 2.2], 0.0, origin=claims.ours("x")))
    _compare(figures / "table01.compare.csv",
             [{"claim": "local SGD generalises better", "verdict": held, "rule": claims.RULE,
               "source_value": "+3.17 to +48.9 points at B_glob = 2048"}])
    rows = report.ledger_rows(papers, figures).set_index(["id", "scale"])
    assert rows.loc[("t1", "reduced"), "paper_value"] == "+3.17 to +48.9 points at B_glob = 2048"
    assert rows.loc[("t1", "converged proxy"), "paper_value"] == "3.2"  # none named: the ledger's
    assert rows.loc[("f8", ""), "paper_value"] == ""


def test_a_speed_up_says_so_beside_its_ratio(checkout):
    papers, figures = checkout
    held = str(claims.verdict([2.0, 2.1, 2.2], 0.0, origin=claims.ours("x")))
    for metric, expected in (("training time speed-up", "0.795 x speed-up"),
                             ("time ratio", "0.795 x")):
        _compare(figures / "table05.compare.csv",
                 [{"artifact": "Table 5", "metric": metric, "value": 0.795, "unit": "x",
                   "claim": "H = 8 matches H = 1", "verdict": held, "rule": claims.RULE}])
        rows = report.ledger_rows(papers, figures).set_index(["id", "scale"])
        assert rows.loc[("t2", "reduced"), "ours"] == expected
    assert rows.loc[("t1", "reduced"), "ours"] == "1.5 points"  # other units as they were


def test_five_verdict_lines_of_at_most_40_words(checkout):
    lines = report.verdict_lines(*checkout)
    assert len(lines) == 5
    assert all(len(line.split()) <= report.MAX_WORDS for line in lines), lines
    assert lines[2].startswith("**Quick mode** (1 claim): held 1 (Table 1).")
    assert "1 claims never tested, 1 need data not here" in lines[4]
    assert "1 ran without a committed verdict yet" in lines[4]


def test_a_verdict_on_the_same_runs_is_counted_once(tmp_path):
    papers, figures = tmp_path / "papers", tmp_path / "figures"
    _ledger_file(papers / "lin2020_local_sgd", [
        _row("f6", "H = 8 keeps the accuracy", artifact="Figure 6"),
        _row("t5", "H = 8 matches H = 1 on every model", artifact="Table 5"),
        _row("t6", "momentum helps", artifact="Table 6")])
    rows = [{"claim": "H = 8 keeps the accuracy", "verdict": "held: x", "runs": "abc"},
            {"claim": "H = 8 matches H = 1 on every model", "verdict": "held: y", "runs": "abc"},
            {"claim": "momentum helps", "verdict": "held: z", "runs": "def"}]
    _compare(figures / "all.compare.csv", [{**r, "rule": claims.RULE} for r in rows])
    quick = report.verdict_lines(papers, figures)[2]
    assert quick == ("**Quick mode** (2 claims): held 2 (Fig. 6, Table 6); plus 1 on the same "
                     "runs as another (Table 5).")
    # other runs, or the same runs with another outcome: each counted
    rows[1]["runs"] = "xyz"
    _compare(figures / "all.compare.csv", [{**r, "rule": claims.RULE} for r in rows])
    assert report.verdict_lines(papers, figures)[2].startswith("**Quick mode** (3 claims): held 3")
    rows[1].update(runs="abc", verdict="inconclusive at this scale: w")
    _compare(figures / "all.compare.csv", [{**r, "rule": claims.RULE} for r in rows])
    assert "plus" not in report.verdict_lines(papers, figures)[2]


def test_a_long_line_drops_names_before_it_passes_40_words(tmp_path):
    papers, figures = tmp_path / "papers", tmp_path / "figures"
    names = [f"claim number {i}" for i in range(30)]
    _ledger_file(papers / "lin2020_local_sgd",
                 [_row(f"c{i}", n, artifact=f"Figure {i}") for i, n in enumerate(names)])
    _compare(figures / "all.compare.csv",
             [{"setting": str(i), "claim": n, "verdict": "held: x", "rule": claims.RULE}
              for i, n in enumerate(names)])
    quick = report.verdict_lines(papers, figures)[2]
    assert len(quick.split()) <= report.MAX_WORDS and quick == \
        "**Quick mode** (30 claims): held 30."


def test_shared_names_go_too_when_the_line_is_long(tmp_path):
    """The "plus N on the same runs" part loses its names with the others: the line stays
    within MAX_WORDS however many claims share runs."""
    papers, figures = tmp_path / "papers", tmp_path / "figures"
    names = [f"claim number {i}" for i in range(24)]
    _ledger_file(papers / "lin2020_local_sgd",
                 [_row(f"c{i}", n, artifact=f"Figure {i}") for i, n in enumerate(names)])
    _compare(figures / "all.compare.csv",
             [{"setting": str(i), "claim": n, "verdict": "held: x", "rule": claims.RULE,
               "runs": "same" if i % 2 else f"own{i}"} for i, n in enumerate(names)])
    quick = report.verdict_lines(papers, figures)[2]
    assert len(quick.split()) <= report.MAX_WORDS, quick
    assert quick == "**Quick mode** (13 claims): held 13; plus 11 on the same runs as another."


def test_bad_ledger_files_fail_in_one_line(tmp_path):
    _ledger_file(tmp_path / "a", [_row("x", "c", status="maybe")])
    with pytest.raises(ValueError, match=r"claims.csv: status \['maybe'\]"):
        ledger.load_ledger(tmp_path)
    _ledger_file(tmp_path / "a", [_row("x", "c"), _row("x", "d")])
    with pytest.raises(ValueError, match=r"id \['x'\] used twice"):
        ledger.load_ledger(tmp_path)
    (tmp_path / "a" / "claims.csv").write_text("id,claim\nx,c\n")
    with pytest.raises(ValueError, match="expected"):
        ledger.load_ledger(tmp_path)


def test_unregistered_claims_are_found(checkout):
    papers, figures = checkout
    _compare(figures / "new.compare.csv", [{"claim": "a claim nobody listed",
                                            "verdict": "held: x", "rule": claims.RULE},
                                           {"artifact": "Timing model vs runner",
                                            "claim": "our own", "verdict": "held: y",
                                            "rule": claims.RULE},
                                           {"claim": "an old claim", "verdict": "held: z"}])
    assert ledger.unregistered_claims(papers, figures) == ["a claim nobody listed"]
    # a verdict without the rule it was judged by is an older notebook's output
    assert [Path(p).relative_to(figures).as_posix() for p in ledger.unruled_verdicts(figures)] \
        == ["converged/table01.compare.csv", "new.compare.csv"]


def test_the_committed_ledgers_cover_every_judged_claim():
    assert ledger.unregistered_claims(ROOT / "papers", ROOT / "figures") == []
    table = ledger.ledger(ROOT / "papers", ROOT / "figures")
    sources = set(table["source"])
    assert sources == {"lin2020_local_sgd", "cruise_meta_hsgd_blog", "fairscale_slowmo",
                       "dynamo_ddp_update"}
    # every committed verdict says the rule it was judged by
    assert ledger.unruled_verdicts(ROOT / "figures") == []
    # a tested claim whose text no committed verdict carries is a typo or a stale ledger
    unjoined = table[table["verdict"] == ledger.UNJOINED]
    assert unjoined["claim"].tolist() == []
    untested = table[table["scale"] == ""]
    assert (untested["why"].str.len() > 3).all(), untested[untested["why"].str.len() <= 3]
