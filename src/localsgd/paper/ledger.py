"""The claim ledger: every claim of the four sources (``papers/<source>/claims.csv``, written by
hand from the sources) joined with the verdict rows the notebooks write (``figures/*.compare.csv``,
``figures/converged/``, ``figures/paper/``).

A ledger row is ``tested`` (its ``claim`` is the exact claim text a notebook emits, so its
verdicts join), ``never tested`` or ``data unavailable`` (each with why). `ledger` joins them;
`localsgd.paper.report` writes them into REPORT and the README (the five-line verdict and the
claims table between markers: nothing in them is typed by hand).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

__all__ = ["COLUMNS", "NEVER", "STATUSES", "TESTED", "UNAVAILABLE", "UNJOINED",
           "ledger", "load_ledger", "unregistered_claims", "unruled_verdicts", "verdict_rows"]

COLUMNS = ["id", "artifact", "claim", "quantity", "paper_value", "status", "why"]
TESTED, NEVER, UNAVAILABLE = "tested", "never tested", "data unavailable"
STATUSES = (TESTED, NEVER, UNAVAILABLE)
UNJOINED = "tested, no verdict committed"
CONVERGED = "converged proxy"
LONG = "long proxy"  # long mode's runs (figures/long/): the paper's updates on a subset
# each CPU proxy's folder under figures/ and the scale its rows get
PROXY_SCALES = {"converged": CONVERGED, "long": LONG}
CLUSTER, CLUSTER_LABEL = "cluster", "emulated cluster"  # results' scale, the README's word
OWN_ARTIFACTS = {"Timing model vs runner", "Communication vs quality"}  # this project's own claims: no source to list them


def load_ledger(papers_dir: Path) -> pd.DataFrame:
    """Every source's ``claims.csv`` with a ``source`` column (the folder); a bad file is one
    ValueError line naming it."""
    frames = []
    for path in sorted(Path(papers_dir).glob("*/claims.csv")):
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
        if list(df.columns) != COLUMNS:
            raise ValueError(f"{path}: columns {list(df.columns)}, expected {COLUMNS}")
        bad = sorted(set(df["status"]) - set(STATUSES))
        if bad:
            raise ValueError(f"{path}: status {bad}; valid: {list(STATUSES)}")
        twice = df.loc[df["id"].duplicated(), "id"].tolist()
        if twice:
            raise ValueError(f"{path}: id {twice} used twice")
        frames.append(df.assign(source=path.parent.name))
    return (pd.concat(frames, ignore_index=True) if frames
            else pd.DataFrame(columns=[*COLUMNS, "source"]))


def verdict_rows(figures_dir: Path, converged_dir: str = "converged") -> pd.DataFrame:
    """Every compare row with a claim and verdict under ``figures_dir``, its ``converged_dir``
    and ``paper/`` subfolders and the campaign's renders (``paper/campaign/<entry>/``);
    converged rows get the scale `CONVERGED`, long mode's (``figures/long/``) `LONG`. A
    paper-mode row comes before a quick-mode row of the same claim and scale."""
    frames = []
    scales = {**PROXY_SCALES, converged_dir: CONVERGED}
    folders = [figures_dir, *(figures_dir / name for name in scales), figures_dir / "paper",
               *sorted((figures_dir / "paper" / "campaign").glob("*/"))]
    for folder in folders:
        for path in sorted(Path(folder).glob("*.compare.csv")):
            # a runs digest of 12 hex digits can read as a number: kept as text
            df = pd.read_csv(path, dtype={"setting": str, "metric": str, "runs": str,
                                          "source_value": str, "tested": str})
            if "claim" not in df or "verdict" not in df:
                continue
            df = df[df["claim"].notna() & df["verdict"].notna()].copy()
            if folder.parent == figures_dir and folder.name in scales:
                df["scale"] = scales[folder.name]
            frames.append(df.assign(path=str(path)))
    cols = ["artifact", "setting", "metric", "claim", "scale", "mode", "verdict", "value", "unit",
            "tested", "rule", "runs", "source_value", "path"]
    if not frames:
        return pd.DataFrame(columns=cols)
    rows = pd.concat(frames, ignore_index=True)
    for col in cols:
        if col not in rows:
            rows[col] = float("nan")
    rank = rows["mode"].map({"paper": 0}).fillna(1)
    return rows.assign(_rank=rank).sort_values("_rank", kind="stable").drop(columns="_rank")


def ledger(papers_dir: Path, figures_dir: Path) -> pd.DataFrame:
    """One row per ledger claim and scale it was judged at (its first verdict row there:
    ``scale``, ``verdict``, ``rule``, ``value``, ``unit``, ``metric``, the ``tested`` quantity
    where the row's value is not it, the ``runs`` it rests on, `claims.runs_digest`, and the
    ``source_value`` at the setting tested where it differs from the ledger's), or one row with ``scale`` empty and
    ``verdict`` the ledger's status when no verdict joins it."""
    claims = load_ledger(papers_dir)
    verdicts = verdict_rows(Path(figures_dir))
    out = []
    for _, c in claims.iterrows():
        found = verdicts[verdicts["claim"] == c["claim"]] if c["status"] == TESTED else \
            verdicts.iloc[0:0]
        if not len(found):
            out.append({**c.to_dict(), "scale": "", "verdict": c["status"] if c["status"] !=
                        TESTED else UNJOINED, "rule": "", "value": float("nan"), "unit": "",
                        "tested": "", "metric": "", "runs": "", "source_value": ""})
            continue
        for scale, group in found.groupby("scale", sort=False):
            first = group.iloc[0]
            out.append({**c.to_dict(), "scale": str(scale), "verdict": first["verdict"],
                        "rule": first["rule"], "value": first["value"],
                        "unit": first["unit"] if isinstance(first["unit"], str) else "",
                        "tested": first["tested"] if isinstance(first["tested"], str) else "",
                        "metric": first["metric"] if isinstance(first["metric"], str) else "",
                        "runs": first["runs"] if isinstance(first["runs"], str) else "",
                        "source_value": (first["source_value"]
                                         if isinstance(first["source_value"], str) else "")})
    return pd.DataFrame(out, columns=[*COLUMNS, "source", "scale", "verdict", "rule", "value",
                                      "unit", "tested", "metric", "runs", "source_value"])


def unregistered_claims(papers_dir: Path, figures_dir: Path) -> list[str]:
    """Claims a notebook judges that no source's ledger lists (this project's own checks,
    `OWN_ARTIFACTS`, have no source and are left out, and so are verdicts without a rule:
    `unruled_verdicts` names their files)."""
    rows = verdict_rows(Path(figures_dir))
    rows = rows[rows["rule"].notna()]
    known = set(load_ledger(papers_dir)["claim"])
    return sorted({c for c, a in zip(rows["claim"], rows["artifact"], strict=True)
                   if c not in known and a not in OWN_ARTIFACTS})


def unruled_verdicts(figures_dir: Path) -> list[str]:
    """The compare files holding a verdict without the rule it was judged by
    (`localsgd.paper.experiments.claims.RULE`, which every claim row carries): an older
    notebook's output, to be run again."""
    rows = verdict_rows(Path(figures_dir))
    return sorted(set(rows.loc[rows["rule"].isna(), "path"]))
