"""Numbers the README, docs/ and papers/*/notes.md quote from a committed figure equal the
figure's own CSV, rounded as quoted (`localsgd.paper.prose_numbers`: the registry, and the
rewrite `localsgd report` does), so a re-run of the notebooks cannot leave them stale. A pattern
that no longer matches fails too: rewording a sentence means updating its pattern there. The
README's claims table is generated (tests/test_report.py checks it).
"""

from __future__ import annotations

import re
import shutil

import pytest

from localsgd.paper import prose_numbers as pn
from localsgd.paper.prose_numbers import CHECKS, FIG, MINUS, ROOT


@pytest.mark.parametrize(("path", "pattern", "compute"), CHECKS,
                         ids=[f"{p}:{i}" for i, (p, _, _) in enumerate(CHECKS)])
def test_quoted_number_equals_the_figure(path, pattern, compute):
    text = " ".join((ROOT / path).read_text().split())  # line breaks are spaces
    matches = list(re.finditer(pattern, text))
    assert matches, f"{path}: the quoted text {pattern!r} is gone; update prose_numbers.CHECKS"
    want = compute()
    for m in matches:
        quoted = m.groups()
        assert len(quoted) == len(want), (quoted, want)
        for q, w in zip(quoted, want, strict=True):
            value = float(q.replace(MINUS, "-"))
            tol = 0.5 * 10 ** -pn._decimals(q) + 1e-9
            assert abs(value - float(w)) <= tol, (
                f"{path} quotes {q} but figures/ gives {float(w):.6g}: run `localsgd report` "
                f"(pattern {pattern!r})")


def test_refresh_rewrites_a_stale_number_as_the_text_rounds_it(tmp_path):
    # a copy of the quoting files with one number made stale across a line break
    path, pattern, _ = next(c for c in CHECKS if "speed-up was" in c[1])
    for p in dict.fromkeys(c[0] for c in CHECKS):
        (tmp_path / p).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / p, tmp_path / p)
    text = (tmp_path / path).read_text()
    m = pn._raw_pattern(pattern).search(text)
    q = m.group(1)
    stale_text = text[:m.start(1)] + "99." + "9" * pn._decimals(q) + text[m.end(1):]
    (tmp_path / path).write_text(stale_text.replace("speed-up was", "speed-up\nwas"))
    assert any(line.startswith(f"{path} quotes 99.") for line in pn.stale(tmp_path))
    changed = pn.refresh(tmp_path)
    assert changed == [f"{path}: 99.{'9' * pn._decimals(q)} -> {q}"]
    assert pn.stale(tmp_path) == []
    assert "speed-up\nwas" in (tmp_path / path).read_text()  # the line break kept


def test_refresh_leaves_a_number_it_cannot_compute_and_says_why(tmp_path, monkeypatch):
    path, pattern, _ = CHECKS[0]
    (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / path, tmp_path / path)
    before = (tmp_path / path).read_text(encoding="utf-8")
    monkeypatch.setattr(pn, "CHECKS", [(path, pattern, lambda: (float("nan"),) * 2),
                                       (path, pattern, lambda: (1.0,))])
    lines = pn.refresh(tmp_path)
    assert [line.split(":")[0] for line in lines] == ["not refreshed", "not refreshed"]
    assert "non-finite" in lines[0] and "has 2 numbers, figures/ gave 1" in lines[1]
    assert (tmp_path / path).read_text(encoding="utf-8") == before


def test_refresh_writes_minus_signs_as_the_docs_do():
    assert pn._fmt(-0.493333, "0.30") == f"{MINUS}0.49"
    assert pn._fmt(-0.001, "0.30") == "0.00"  # no negative zero
    assert pn._fmt(7.789, "5.0") == "7.8"


def test_a_quote_in_scientific_notation_refreshes_its_exponent_too(tmp_path, monkeypatch):
    # a run can move a tiny difference by decades (7.9e-7 on one CPU, 8.8e-5 on another): the
    # refresher once wrote "883.2e-7", keeping the exponent of the text
    assert pn.scientific(8.832e-5) == (8.8, 5)
    assert pn.scientific(7.9e-7) == (7.9, 7)
    assert pn.scientific(9.96e-5) == (1.0, 4)  # rounds up into the next decade
    path = "docs/systems.md"
    (tmp_path / "docs").mkdir()
    (tmp_path / path).write_text("losses match within 7.9e-7 relative.\n", encoding="utf-8")
    monkeypatch.setattr(pn, "CHECKS", [(path, r"within (\d\.\d)e-(\d+) relative",
                                        lambda: pn.scientific(8.832e-5))])
    assert pn.refresh(tmp_path) == [f"{path}: 7 -> 5", f"{path}: 7.9 -> 8.8"]
    assert (tmp_path / path).read_text(encoding="utf-8") == "losses match within 8.8e-5 relative.\n"


def test_committed_figures_name_no_machine_folders():
    """A committed CSV carries nothing of the machine (the JSON sidecar holds provenance)."""
    machine = re.compile(r"(?<![\w$])(/work/|/tmp/|/home/|/root/|/Users/|[A-Z]:\\\\)")
    bad = [p.relative_to(ROOT).as_posix() for p in sorted(FIG.rglob("*.csv"))
           if machine.search(p.read_text())]
    assert not bad, f"figures CSVs naming this machine's folders: {bad}"


def test_no_result_number_is_copied_outside_a_generated_block():
    # README, docs/ and notes: every copy of a figures/ result is generated or registered
    assert pn.unlinked() == []


def _prose_root(tmp_path, text):
    """A checkout with the real figures/ and papers/ and one docs page holding ``text``."""
    for name in ("figures", "papers"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(text, encoding="utf-8")
    return tmp_path


def test_the_search_finds_a_copied_result_and_where_it_is(tmp_path):
    f_star = f"{pn.fstar()[0]:.7f}"  # a result: our exact f*, rounded as prose would
    root = _prose_root(tmp_path, f"intro\n\nOur solve gives {f_star} here.\n")
    assert pn.unlinked(root) == [
        (f"docs/page.md:3: {f_star} equals a result in figures/ but is neither generated nor "
         "registered in prose_numbers.CHECKS")]


def test_the_search_skips_generated_blocks_code_source_values_and_short_numbers(tmp_path):
    f_star = f"{pn.fstar()[0]:.7f}"
    text = (f"<!-- results:begin -->\n{f_star}\n<!-- results:end -->\n"
            f"`--set x={f_star}` and\n```bash\necho {f_star}\n```\n"
            "the paper prints 0.126433176216545 (a source value); width 0.25; torch 2.14.1\n")
    assert pn.unlinked(_prose_root(tmp_path, text)) == []


def test_report_check_exits_nonzero_on_a_problem(monkeypatch, capsys):
    from localsgd.paper import cli

    monkeypatch.setattr(pn, "unlinked", lambda: ["docs/page.md:3: 1.234 equals a result"])
    assert cli.main(["report", "--check"]) == 1
    assert "docs/page.md:3: 1.234" in capsys.readouterr().out
    monkeypatch.setattr(pn, "unlinked", list)
    assert cli.main(["report", "--check"]) == 0
    # a claim a notebook judges that no source's ledger lists is a problem too
    from localsgd.paper import ledger

    monkeypatch.setattr(ledger, "unregistered_claims", lambda *_: ["a new claim"])
    assert cli.main(["report", "--check"]) == 1
    assert "claim not in any papers/*/claims.csv: 'a new claim'" in capsys.readouterr().out
