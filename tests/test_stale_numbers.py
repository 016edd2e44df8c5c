"""No result is quoted by hand in README, docs/ or papers/*/notes.md: outside the blocks
`localsgd report` writes, prose says in words what was measured and where its number lives
(`localsgd.paper.prose_numbers.unlinked` finds any copy), so a re-run of the notebooks cannot leave
it stale. The README's claims table is generated (tests/test_report.py checks it).
"""

from __future__ import annotations

import re

import pandas as pd

from localsgd.paper import prose_numbers as pn
from localsgd.paper.prose_numbers import FIG, ROOT


def test_committed_figures_name_no_machine_folders():
    """A committed CSV carries nothing of the machine (the JSON sidecar holds provenance)."""
    machine = re.compile(r"(?<![\w$])(/work/|/tmp/|/home/|/root/|/Users/|[A-Z]:\\\\)")
    bad = [p.relative_to(ROOT).as_posix() for p in sorted(FIG.rglob("*.csv"))
           if machine.search(p.read_text())]
    assert not bad, f"figures CSVs naming this machine's folders: {bad}"


def test_no_result_number_is_copied_outside_a_generated_block():
    # README, docs/ and notes: every figures/ result they show is in a generated block
    assert pn.unlinked() == []


def _a_result() -> str:
    """A real result of figures/ as prose would round it: Appendix E's f* of our Newton solve."""
    df = pd.read_csv(FIG / "fig04_convex_time.compare.csv", dtype={"setting": str})
    row = df[(df["setting"] == "w8a; lambda=1/n") & (df["metric"] == "f*")]
    assert len(row) == 1
    return f"{float(row['value'].iloc[0]):.7f}"


def _prose_root(tmp_path, text):
    """A checkout with the real figures/ and papers/ and one docs page holding ``text``."""
    for name in ("figures", "papers"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(text, encoding="utf-8")
    return tmp_path


def test_the_search_finds_a_copied_result_and_where_it_is(tmp_path):
    f_star = _a_result()
    root = _prose_root(tmp_path, f"intro\n\nOur solve gives {f_star} here.\n")
    [line] = pn.unlinked(root)
    assert line.startswith(f"docs/page.md:3: {f_star} equals a result in figures/ outside a "
                           "generated block")


def test_the_search_skips_generated_blocks_code_source_values_and_short_numbers(tmp_path):
    f_star = _a_result()
    text = (f"<!-- results:begin -->\n{f_star}\n<!-- results:end -->\n"
            f"`--set x={f_star}` and\n```bash\necho {f_star}\n```\n"
            "the paper prints 0.126433176216545 (a source value); width 0.25; torch 2.14.1\n")
    assert pn.unlinked(_prose_root(tmp_path, text)) == []


def test_report_check_exits_nonzero_on_a_problem(monkeypatch, capsys):
    from localsgd.paper import cli, ledger

    monkeypatch.setattr(ledger, "unruled_verdicts", lambda *_: [])  # the committed figures'
    monkeypatch.setattr(ledger, "unregistered_claims", lambda *_: [])
    monkeypatch.setattr(pn, "unlinked", lambda: ["docs/page.md:3: 1.234 equals a result"])
    assert cli.main(["report", "--check"]) == 1
    assert "docs/page.md:3: 1.234" in capsys.readouterr().out
    monkeypatch.setattr(pn, "unlinked", list)
    assert cli.main(["report", "--check"]) == 0
    # a claim a notebook judges that no source's ledger lists is a problem too
    monkeypatch.setattr(ledger, "unregistered_claims", lambda *_: ["a new claim"])
    assert cli.main(["report", "--check"]) == 1
    assert "claim not in any papers/*/claims.csv: 'a new claim'" in capsys.readouterr().out
    # and so is a verdict without the rule it was judged by
    monkeypatch.setattr(ledger, "unregistered_claims", lambda *_: [])
    monkeypatch.setattr(ledger, "unruled_verdicts", lambda *_: ["figures/old.compare.csv"])
    assert cli.main(["report", "--check"]) == 1
    assert "figures/old.compare.csv: a verdict without the rule" in capsys.readouterr().out
