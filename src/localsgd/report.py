"""``figures/REPORT.md``: each source's own numbers beside ours.

Joins ``papers/<source>/reported.csv`` with every ``figures/<id>.compare.csv`` on
(artifact, setting, metric). A source row no figure matches is "not yet"; a matched row's
status comes from the figure's scale: the source's configuration ("full scale") or a reduced one
("reduced scale, indicative only"). Smoke-mode output never counts as a result.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from localsgd.results import write_text

REPORTED_COLUMNS = ["artifact", "setting", "metric", "value", "unit", "note"]
KEY = ["artifact", "setting", "metric"]
STATUS_FULL = "reproduced at full scale"
STATUS_DIFFERS = "full scale, differs from the source"
STATUS_REDUCED = "reduced scale, indicative only"
STATUS_SMOKE = "smoke run only (not a result)"
STATUS_MODEL = "model prediction, not a measurement"
STATUS_QUALITATIVE = "full scale, qualitative (see note)"
STATUS_NONE = "not yet"
DEFAULT_REL_TOL = 0.05  # |ours / source − 1| up to which a full-scale number is reproduced


def load_reported(papers_dir: Path) -> pd.DataFrame:
    """All sources' reported numbers, with a ``source`` column (the folder name)."""
    csvs = sorted(papers_dir.glob("*/reported.csv"))
    if not csvs:
        raise ValueError(f"no <source>/reported.csv under {papers_dir}; pass the repository's "
                         "papers/ folder (--papers)")
    frames = []
    for csv in csvs:
        df = pd.read_csv(csv, dtype={"setting": str, "metric": str, "unit": str, "note": str})
        missing = [c for c in REPORTED_COLUMNS if c not in df.columns]
        if missing:
            raise ValueError(f"{csv}: missing columns {missing}; expected {REPORTED_COLUMNS}")
        df.insert(0, "source", csv.parent.name)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def load_ours(figures_dir: Path) -> pd.DataFrame:
    """Every figure's comparison rows: ``<id>.compare.csv`` in ``figures_dir`` and in its
    ``paper/`` subfolder (paper-mode runs). When both hold a number, the paper-mode one is used.
    """
    paths = sorted(figures_dir.glob("*.compare.csv")) + sorted(
        (figures_dir / "paper").glob("*.compare.csv"))
    frames = [pd.read_csv(p, dtype={"setting": str, "metric": str}).assign(path=str(p))
              for p in paths]
    cols = [*KEY, "value", "mode", "scale", "rel_tol", "figure", "claim", "verdict", "path"]
    if not frames:
        return pd.DataFrame(columns=cols)
    ours = pd.concat(frames, ignore_index=True)
    ours = ours[[c for c in cols if c in ours.columns]]
    rank = ours["mode"].map({"paper": 0, "quick": 1, "smoke": 2}).fillna(3)
    ours = ours.assign(_rank=rank).sort_values("_rank", kind="stable")
    clash = ours[ours.duplicated([*KEY, "_rank"], keep=False)]
    if len(clash):
        raise ValueError("two figures report the same number in the same mode: "
                         + "; ".join(sorted(set(clash["path"]))) + " — rename one's setting")
    return ours.drop_duplicates(KEY).drop(columns="_rank")


def _status(row: pd.Series) -> str:
    if pd.isna(row.get("figure")):
        return STATUS_NONE
    if row.get("mode") == "smoke":
        return STATUS_SMOKE
    if row.get("scale") == "model":
        return STATUS_MODEL
    if row.get("scale") != "full":
        return STATUS_REDUCED
    ours, source = pd.to_numeric(row.get("ours"), errors="coerce"), row.get("value")
    if pd.isna(source) or pd.isna(ours):
        return STATUS_QUALITATIVE
    tol = row.get("rel_tol")
    tol = DEFAULT_REL_TOL if pd.isna(tol) else float(tol)
    agree = ours == source or (source != 0 and abs(ours / source - 1) <= tol)
    return STATUS_FULL if agree else STATUS_DIFFERS


def _fmt(x: object) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    if isinstance(x, float):
        return f"{x:.6g}"
    return str(x).replace("|", "\\|").replace("\n", " ")


def joined(papers_dir: Path, figures_dir: Path) -> pd.DataFrame:
    reported = load_reported(papers_dir)
    ours = load_ours(figures_dir).rename(columns={"value": "ours"})
    if "rel_tol" not in ours.columns:
        ours["rel_tol"] = float("nan")
    reported["value"] = pd.to_numeric(reported["value"], errors="coerce")
    table = reported.merge(ours, on=KEY, how="left")
    table["status"] = table.apply(_status, axis=1)
    ratio = pd.to_numeric(table["ours"], errors="coerce") / pd.to_numeric(table["value"],
                                                                          errors="coerce")
    table["ours / source"] = ratio
    return table


def figure_index(figures_dir: Path) -> pd.DataFrame:
    rows = []
    for side in sorted(figures_dir.glob("*.json")) + sorted((figures_dir / "paper").glob("*.json")):
        try:
            meta = json.loads(side.read_text())
        except json.JSONDecodeError:
            continue
        if "figure" not in meta:
            continue
        git = meta.get("git") or {}
        commit = (git.get("commit") or "")[:10] + (" (dirty)" if git.get("dirty") else "")
        rows.append({"figure": meta["figure"], "mode": meta.get("mode"),
                     "scale": meta.get("scale"), "wall s": meta.get("wall_seconds"),
                     "commit": commit, "utc": meta.get("utc_time")})
    return pd.DataFrame(rows, columns=["figure", "mode", "scale", "wall s", "commit", "utc"])


def _md_table(df: pd.DataFrame) -> str:
    head = "| " + " | ".join(df.columns) + " |"
    sep = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, sep, *body])


def render(papers_dir: Path, figures_dir: Path) -> str:
    table = joined(papers_dir, figures_dir)
    figs = figure_index(figures_dir)
    counts = table["status"].value_counts()
    lines = [
        "# Paper vs reproduced",
        "",
        ("Generated by `localsgd report` (run at the end of `make reproduce`) from "
         "`papers/*/reported.csv` and `figures/*.compare.csv`. Do not edit by hand."),
        "",
        ("Status: **" + STATUS_FULL + "** — our run used the source's configuration and "
         f"agrees within {DEFAULT_REL_TOL:.0%} (or the row's own tolerance); **" + STATUS_DIFFERS
         + "** — same configuration, different number: a result, discussed in "
         "`papers/<source>/notes.md`; **" + STATUS_REDUCED + "** — the same experiment at "
         "reduced scale (fewer seeds, steps or a smaller grid), a sanity check, not a "
         "reproduction; **" + STATUS_MODEL + "** — the timing model's prediction for the "
         "source's setting (systems results this machine cannot run), not a measurement; **"
         + STATUS_NONE + "** — no notebook produces this number yet."),
        "",
        "Summary: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in
                                (STATUS_FULL, STATUS_DIFFERS, STATUS_QUALITATIVE,
                                 STATUS_REDUCED, STATUS_MODEL, STATUS_SMOKE, STATUS_NONE)) + ".",
        "",
        "## Figures",
        "",
        _md_table(figs) if len(figs) else "(no figures yet)",
        "",
    ]
    claims = _claims(table)
    if len(claims):
        lines += ["## Claims", "",
                  ("A source's claim tested by a notebook, with the notebook's verdict at the "
                   "scale it ran (a reduced-scale verdict is indicative only)."), "",
                  _md_table(claims), ""]
    own = own_claims(papers_dir, figures_dir)
    if len(own):
        lines += ["## This project's own claims", "",
                  ("Checks a notebook states about this project's tools (e.g. the timing model "
                   "against real runs); no source number stands beside them."), "",
                  _md_table(own), ""]
    for source, part in table.groupby("source", sort=True):
        lines += [f"## {source}", ""]
        done = part[part["status"] != STATUS_NONE]
        if len(done):
            show = done[["artifact", "setting", "metric", "value", "unit", "ours", "ours / source",
                         "mode", "scale", "status", "note"]].rename(columns={"value": "source"})
            lines += [_md_table(show), ""]
        todo = part[part["status"] == STATUS_NONE].groupby("artifact", sort=False).size()
        if len(todo):
            # set-up numbers and results no notebook produces yet: counted, not listed
            lines += ["Not yet compared (numbers per artifact; see `reported.csv`): "
                      + ", ".join(f"{a} ({n})" for a, n in todo.items()) + ".", ""]
    return "\n".join(lines)


def _claims(table: pd.DataFrame) -> pd.DataFrame:
    """Rows whose figure stated a claim and a verdict (compare columns ``claim``/``verdict``)."""
    cols = ["artifact", "claim", "verdict", "ours", "unit", "mode", "scale"]
    if "verdict" not in table.columns:
        return pd.DataFrame(columns=cols)
    rows = table[table["verdict"].notna() & (table["verdict"].astype(str) != "")]
    return rows[cols]


def own_claims(papers_dir: Path, figures_dir: Path) -> pd.DataFrame:
    """Compare rows with a claim and verdict that match no source's number (keyed by artifact,
    setting, metric): the project's own checks."""
    cols = ["artifact", "setting", "metric", "claim", "verdict", "value", "mode", "scale"]
    ours = load_ours(figures_dir)
    if "verdict" not in ours.columns or not len(ours):
        return pd.DataFrame(columns=cols)
    keys = load_reported(papers_dir)[KEY].drop_duplicates()
    merged = ours.merge(keys.assign(_src=True), on=KEY, how="left")
    rows = merged[merged["_src"].isna() & merged["verdict"].notna()
                  & (merged["verdict"].astype(str) != "")]
    return rows[[c for c in cols if c in rows.columns]].rename(columns={"value": "ours"})


def write_report(papers_dir: Path, figures_dir: Path, out: Path | None = None) -> Path:
    out = out or figures_dir / "REPORT.md"
    return write_text(out, render(papers_dir, figures_dir))
