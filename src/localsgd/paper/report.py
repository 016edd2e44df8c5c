"""``figures/REPORT.md``: each source's own numbers beside ours, and README's claims table.

Joins ``papers/<source>/reported.csv`` with every ``figures/<id>.compare.csv`` on
(artifact, setting, metric). Each source row is either a *result* (an outcome the source
measured or derived: an accuracy, a time, a speed-up, a count) or a *setting* (a configuration
value the source states: a batch size, a period, a number of GPUs); settings are counted apart
and never enter the result counts. A result no figure matches is "not yet", split by what it
needs (:func:`needs`); a matched result's status comes from the figure's scale: the source's
configuration ("full scale"), a reduced one ("reduced scale, indicative only") or the timing
model ("model prediction"). Smoke-mode output never counts as a result.

``localsgd report`` writes ``figures/REPORT.md`` and regenerates the table between
``<!-- results:begin -->`` and ``<!-- results:end -->`` in the README beside ``figures/``.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd

from localsgd.paper import ledger as ledger_mod
from localsgd.paper.experiments.claims import MEANING, OUTCOMES
from localsgd.paper.results import load_reported, write_text

KEY = ["artifact", "setting", "metric"]
STATUS_FULL = "reproduced at full scale"
STATUS_DIFFERS = "full scale, differs from the source"
STATUS_REDUCED = "reduced scale, indicative only"
STATUS_SMOKE = "smoke run only (not a result)"
STATUS_MODEL = "model prediction, not a measurement"
STATUS_QUALITATIVE = "full scale, qualitative (see note)"
STATUS_NONE = "not yet"
STATUS_SETTING = "setting"
STATUSES = (STATUS_FULL, STATUS_DIFFERS, STATUS_QUALITATIVE, STATUS_REDUCED, STATUS_MODEL,
            STATUS_SMOKE, STATUS_NONE)
# converged mode's runs (figures/converged/): a small proxy trained for a fraction of the
# paper's epochs with its protocol on a CPU; reported in their own section and rows, never
# joined with the quick or paper numbers of the same cell
CONVERGED_DIR = "converged"
CONVERGED_LABEL = ledger_mod.CONVERGED
# long mode's runs (figures/long/): the paper's 300 epochs and update counts on a CIFAR-10
# subset at 16x16 (docs/pilot/long_proxy.md); their own section and rows too
LONG_DIR = "long"
LONG_LABEL = ledger_mod.PROXY_SCALES[LONG_DIR]
# each proxy's folder, label and the one line its section opens with
PROXIES = {
    CONVERGED_DIR: (CONVERGED_LABEL, ("a small model trained for a fraction of the source's "
                                      "epochs on a CPU with its protocol (full training set, "
                                      "warm-up, step decays, three seeds; model width and "
                                      "epochs in each row's note)")),
    LONG_DIR: (LONG_LABEL, ("the source's epochs, schedule and update counts on a CPU, on a "
                            "class-balanced eighth of CIFAR-10 at 16x16 with every batch an "
                            "eighth, ResNet-20 at a quarter width, three seeds "
                            "(docs/pilot/long_proxy.md)")),
}
DEFAULT_REL_TOL = 0.05  # |ours / source − 1| up to which a full-scale number is reproduced
SIG_FIGS = 4  # numbers in the report and the README table

# A source row is a *result* when its metric names an outcome; every other row (a batch size,
# a period, a GPU count, a learning rate ...) is a setting the source states.
RESULT_METRIC = re.compile(
    r"speed-up|slowdown|top-1|acc|error|loss|training time|running time|time ratio|"
    r"time-to-accuracy|latency|^parameters$|flops|syncs|^best |scaling advantage|scaling ratio|"
    r"^f\*$|overcomes|threshold|bounds|^extra |models passing|new issues|all-reduce at",
    re.IGNORECASE)
SETTING_METRIC = re.compile(r"^target ", re.IGNORECASE)  # e.g. a time-to-accuracy target
# results that are arithmetic on the model or the schedule (parameter and FLOP counts, their
# ratio, synchronisation counts): a correct implementation gets them exactly, so a match is a
# check of the code, not of the source's experiments
COUNT_METRIC = re.compile(r"^parameters$|flops|multiply-adds|^syncs |scaling ratio",
                          re.IGNORECASE)

# what a result not yet compared needs, in order of precedence, and how it is recognised in
# the row's artifact, setting, metric or note (all matched case-insensitively)
NEED_CIFAR100 = "CIFAR-100"
NEED_IMAGENET = "ImageNet"
NEED_GPU = "GPUs"
NEED_GRID = "outside the quick grid"
NEED_NOTEBOOK = "no notebook yet"
NEEDS = (NEED_CIFAR100, NEED_IMAGENET, NEED_GPU, NEED_GRID, NEED_NOTEBOOK)
NEED_RULES = (
    (NEED_CIFAR100, re.compile(r"cifar-?100|^figure 10$", re.IGNORECASE)),
    (NEED_IMAGENET, re.compile(r"imagenet|^figure 8$|^section 4\.2\.2$", re.IGNORECASE)),
    (NEED_GPU, re.compile(r"latency|running time|training time|speed-up|slowdown factor|nccl|"
                          r"\bgpus?=", re.IGNORECASE)),
)
NEED_HOW = (
    f"**{NEED_CIFAR100}** when the row's artifact, setting or note names CIFAR-100 (Figure 10, "
    f"the CIFAR-100 cells of Tables 4-5), **{NEED_IMAGENET}** likewise for ImageNet (Figure 8, "
    f"Section 4.2.2), **{NEED_GPU}** when it is a timing of the source's GPU runs (a latency, "
    f"running or training time, speed-up or slowdown factor) or names NCCL or a GPU count; "
    f"otherwise **{NEED_GRID}** when a "
    f"notebook already compares other rows of the same artifact (the cell is in the paper "
    f"configuration but not in the reduced quick-mode grid), else **{NEED_NOTEBOOK}**."
)

SOURCE_LABELS = {"lin2020_local_sgd": "Lin et al.", "cruise_meta_hsgd_blog": "HSGD blog",
                 "fairscale_slowmo": "SlowMo doc", "dynamo_ddp_update": "Dynamo post"}
OWN_LABEL = "this project"

README_BEGIN = "<!-- results:begin -->"
README_END = "<!-- results:end -->"


# ----------------------------------------------------------------------------------------------
# Loading and joining
# ----------------------------------------------------------------------------------------------


def load_ours(figures_dir: Path) -> pd.DataFrame:
    """Every figure's comparison rows: ``<id>.compare.csv`` in ``figures_dir``, in its
    ``paper/`` subfolder (paper-mode runs) and in ``paper/campaign/<entry>/`` (a claim's
    paper-scale runs, `localsgd.paper.campaign`). When both hold a number, the paper-mode one
    is used."""
    paths = sorted(figures_dir.glob("*.compare.csv")) + sorted(
        (figures_dir / "paper").glob("*.compare.csv")) + sorted(
        (figures_dir / "paper" / "campaign").glob("*/*.compare.csv"))
    frames = [pd.read_csv(p, dtype={"setting": str, "metric": str}).assign(path=str(p))
              for p in paths]
    cols = [*KEY, "value", "unit", "mode", "scale", "rel_tol", "abs_tol", "figure", "claim",
            "verdict", "rule", "path"]
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


def is_setting(metric: object) -> bool:
    """True when a source row with this metric states a configuration value, not a result."""
    text = "" if pd.isna(metric) else str(metric)
    return bool(SETTING_METRIC.search(text)) or not RESULT_METRIC.search(text)


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
    return STATUS_FULL if agrees(ours, source, row.get("rel_tol"), row.get("abs_tol")) else \
        STATUS_DIFFERS


def agrees(ours: float, source: float, rel_tol: float | None = None,
           abs_tol: float | None = None) -> bool:
    """Whether a full-scale number reproduces the source's. A row's ``abs_tol`` (in the metric's
    unit) decides where given: a quantity near zero (a gap, a difference) has no meaningful
    ratio, so |ours − source| <= abs_tol even where the ratio is far from 1, and a larger gap
    differs even where the ratio is close. Otherwise |ours / source − 1| <= ``rel_tol``
    (`DEFAULT_REL_TOL` if unset)."""
    if ours == source:
        return True
    if abs_tol is not None and not pd.isna(abs_tol):
        return abs(ours - source) <= float(abs_tol)
    tol = DEFAULT_REL_TOL if rel_tol is None or pd.isna(rel_tol) else float(rel_tol)
    return source != 0 and abs(ours / source - 1) <= tol


def needs(row: pd.Series, compared_artifacts: set[tuple[str, str]]) -> str:
    """What a result row no figure matches needs (one of ``NEEDS``); see ``NEED_HOW``."""
    fields = [row.get(c) for c in ("artifact", "setting", "metric", "note")]
    for need, pattern in NEED_RULES:
        if any(isinstance(f, str) and pattern.search(f) for f in fields):
            return need
    if (row.get("source"), row.get("artifact")) in compared_artifacts:
        return NEED_GRID
    return NEED_NOTEBOOK


def joined(papers_dir: Path, figures_dir: Path) -> pd.DataFrame:
    """Every source row with ours beside it: ``status`` (one of ``STATUSES``), ``setting row``
    (a configuration value, not a result), ``needs`` (for results not yet compared) and
    ``ours / source`` (the plain ratio; the report shows it only where it means something)."""
    reported = load_reported(papers_dir)
    ours = load_ours(figures_dir).rename(columns={"value": "ours", "unit": "ours_unit"})
    for col in ("rel_tol", "abs_tol", "claim", "verdict"):
        if col not in ours.columns:
            ours[col] = float("nan")
    reported["value"] = pd.to_numeric(reported["value"], errors="coerce")
    table = reported.merge(ours, on=KEY, how="left")
    table["status"] = table.apply(_status, axis=1)
    table["setting row"] = table["metric"].map(is_setting)
    compared = {(s, a) for s, a, st, setting in
                table[["source", "artifact", "status", "setting row"]].itertuples(index=False)
                if st != STATUS_NONE and not setting}
    table["needs"] = [
        needs(row, compared) if (row["status"] == STATUS_NONE and not row["setting row"]) else ""
        for _, row in table.iterrows()]
    ratio = pd.to_numeric(table["ours"], errors="coerce") / pd.to_numeric(table["value"],
                                                                          errors="coerce")
    table["ours / source"] = ratio
    return table


# ----------------------------------------------------------------------------------------------
# Formatting
# ----------------------------------------------------------------------------------------------


def fmt_number(x: object, sig: int = SIG_FIGS) -> str:
    """A number rounded to ``sig`` significant figures (integers up to 10^sig kept whole);
    NaN and None are empty."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int | float):
        if float(x).is_integer() and abs(x) < 10 ** (sig + 2):
            return str(int(x))
        return f"{float(f'{x:.{sig}g}'):g}" if abs(x) >= 1e-4 else f"{x:.{sig - 1}e}"
    return str(x)


def fmt_source(x: object) -> str:
    """A source's number as printed (up to 7 significant figures): never rounded further."""
    return fmt_number(x, 7)


def _cell(x: object) -> str:
    return fmt_number(x).replace("|", "\\|").replace("\n", " ")


_INTERNAL_NAMES = (
    (re.compile(r"\bhier(\d+)x(\d+)\b"), r"hierarchical \1×\2"),
    (re.compile(r"\blocal:(\d+)"), r"local SGD H = \1"),
    (re.compile(r"\bhsgd:([\d,\-]+)"), r"HSGD \1"),
    (re.compile(r"\s*\(Q=2\)"), ""),
    (re.compile(r"\bblog_hsgd_stragglers\b"), "the HSGD blog notebook"),
    (re.compile(r"\bQ=1\b"), "blocking host"),
    (re.compile(r"\bQ=2\b"), "host one step ahead"),
    (re.compile(r"\bresnet20 w([\d.]+) B(\d+)"), r"ResNet-20, batch \2"),
    (re.compile(r"\bmlp w(\d+) B(\d+)"), r"MLP of width \1, batch \2"),
    (re.compile(r"\bembedding w(\d+) B(\d+)"), r"embedding of \1 rows, batch \2"),
    (re.compile(r"\bnan\b"), "none"),
)
_LONG_FLOAT = re.compile(r"(?<![\w.])-?\d+\.\d{5,}")


def plain(text: object) -> str:
    """A notebook's verdict or claim for readers: internal run names spelled out, no ``nan``,
    floats beyond 4 significant figures rounded."""
    if not isinstance(text, str):
        return ""
    for pattern, repl in _INTERNAL_NAMES:
        text = pattern.sub(repl, text)
    return _LONG_FLOAT.sub(lambda m: fmt_number(float(m.group())), text)


def short_verdict(verdict: object) -> str:
    """The verdict's outcome in a few words (``held``, ``did not hold``, ...)."""
    text = plain(verdict)
    low = text.lower()
    for outcome in OUTCOMES:  # the one verdict rule's words (localsgd.paper.experiments.claims)
        if low.startswith(outcome + ":") or low == outcome:
            return outcome
    for key, short in (("did not hold", "did not hold"), ("unexplained", "unexplained"),
                       ("outside the blog's range", "below the source's range"),
                       ("within the blog's range", "within the source's range")):
        if key in low:
            return short
    if low.startswith("held"):
        return "held (mechanism)" if "(mechanism)" in low else "held"
    m = re.match(r"(rule right in \d+ of \d+ settings)", low)
    if m:
        return m.group(1)
    head = re.split(r";| \(", text, maxsplit=1)[0].strip()
    return head if len(head) <= 48 else head[:47].rstrip() + "…"


def _merge_min_max(rows: pd.DataFrame) -> pd.DataFrame:
    """One row for a ``<m> min`` / ``<m> max`` pair of the same source, artifact and setting:
    metric ``<m> (min–max)``, source and ours as ranges."""
    rows = rows.copy()
    rows["_base"] = rows["metric"].str.replace(r" (min|max)$", "", regex=True)
    rows["_end"] = rows["metric"].str.extract(r" (min|max)$", expand=False)
    out = []
    for _, group in rows.groupby(["source", "artifact", "setting", "_base"], sort=False,
                                 dropna=False):
        ends = set(group["_end"].dropna())
        if ends != {"min", "max"} or len(group) != 2:
            out.extend(r for _, r in group.iterrows())
            continue
        lo, hi = (group[group["_end"] == e].iloc[0] for e in ("min", "max"))
        merged = lo.copy()
        merged["metric"] = f"{lo['_base']} (min–max)"
        merged["source value"] = f"{fmt_source(lo['value'])}–{fmt_source(hi['value'])}"
        merged["ours value"] = (f"{fmt_number(lo['ours'])}–{fmt_number(hi['ours'])}"
                                if not pd.isna(lo["ours"]) else "")
        merged["ratio"] = (f"{fmt_number(lo['ours / source'], 3)}–"
                           f"{fmt_number(hi['ours / source'], 3)}"
                           if lo["show ratio"] else "")
        out.append(merged)
    return pd.DataFrame(out).drop(columns=["_base", "_end"])


def _result_rows(part: pd.DataFrame) -> pd.DataFrame:
    """A source's compared results for the report: ratio only where it means something (full
    scale or a model prediction of the source's own setting), min/max pairs merged."""
    part = part.copy()
    part["show ratio"] = part["scale"].isin(["full", "model"])
    part["source value"] = part["value"].map(fmt_source)
    part["ours value"] = part["ours"].map(
        lambda v: fmt_number(pd.to_numeric(v, errors="coerce")) if not pd.isna(v) else "")
    part["ratio"] = [fmt_number(r, 3) if show else "" for r, show in
                     zip(part["ours / source"], part["show ratio"], strict=True)]
    return _merge_min_max(part)


def _md_table(df: pd.DataFrame) -> str:
    head = "| " + " | ".join(df.columns) + " |"
    sep = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, sep, *body])


# ----------------------------------------------------------------------------------------------
# The summary, the claims, the README table
# ----------------------------------------------------------------------------------------------


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Counts by status (results only, a min/max pair counted once), "not yet" split by need,
    then the settings, counted apart."""
    results = table[~table["setting row"]]
    results = results.assign(_pair=results["metric"].str.replace(r" (min|max)$", "", regex=True))
    results = results.drop_duplicates(["source", "artifact", "setting", "_pair"])
    rows = []
    for status in STATUSES:
        part = results[results["status"] == status]
        if status == STATUS_NONE:
            for need in NEEDS:
                n = int((part["needs"] == need).sum())
                rows.append({"status": f"not yet: needs {need}" if need not in
                             (NEED_GRID, NEED_NOTEBOOK) else f"not yet: {need}", "rows": n})
        elif len(part) or status not in (STATUS_SMOKE, STATUS_QUALITATIVE):
            rows.append({"status": status, "rows": len(part)})
            if status in (STATUS_FULL, STATUS_DIFFERS):  # counts and experiments apart
                counts = int(part["metric"].astype(str).str.contains(COUNT_METRIC).sum())
                how = "reproduced" if status == STATUS_FULL else "that differ"
                rows.append({"status": f"· counts {how} (parameters, FLOPs, sync counts)",
                             "rows": counts})
                rows.append({"status": f"· experiments {how}", "rows": len(part) - counts})
    rows.append({"status": "**results**", "rows": len(results)})
    settings = table[table["setting row"]]
    compared = int((settings["status"] != STATUS_NONE).sum())
    rows.append({"status": f"settings (configuration values the sources state; {compared} "
                           "set beside ours)", "rows": len(settings)})
    return pd.DataFrame(rows)


def claims(table: pd.DataFrame) -> pd.DataFrame:
    """One row per claim a notebook tested: artifact, claim, ours, scale, short verdict and the
    verdict in full (plain words). Rows of one claim (a min/max pair) are merged."""
    cols = ["source", "artifact", "claim", "ours", "scale", "verdict", "detail"]
    if "verdict" not in table.columns:
        return pd.DataFrame(columns=cols)
    rows = table[table["verdict"].notna() & (table["verdict"].astype(str) != "")]
    out = []
    for (source, artifact, claim), group in rows.groupby(["source", "artifact", "claim"],
                                                         sort=False):
        vals = [] if group["setting row"].all() else [
            v for v in pd.to_numeric(group.loc[~group["setting row"], "ours"], errors="coerce")
            if not pd.isna(v)]
        unit = next((u for u in group["unit"] if isinstance(u, str) and u), "")
        metric = re.sub(r" (min|max)$", "", str(group["metric"].iloc[0]))
        signed = metric.endswith(" change")  # a difference: its sign is the result
        ours = "–".join(("+" if signed and v > 0 else "") + fmt_number(v, 3)
                        for v in sorted(vals)) if vals else ""
        if ours and unit:
            ours += {"%": " %", "x": "×"}.get(unit, f" {unit}")
        if ours and "top-1" in metric and len(vals) == 1 and not signed:
            cell = re.sub(r"\b(model|dataset)=", "", str(group["setting"].iloc[0]))
            ours += f" top-1 at {cell}"  # which cell the number is
        elif ours:
            ours += f" ({metric})"  # what the number measures
        source_values = pd.to_numeric(group.loc[~group["setting row"], "value"], errors="coerce")
        if ours and len(vals) == 1 and len(source_values) == 1 and source_values.notna().all():
            ours += f" · source {fmt_source(source_values.iloc[0])}" + (
                {"%": " %", "x": "×"}.get(unit, f" {unit}") if unit else "")
        out.append({"source": SOURCE_LABELS.get(source, source), "artifact": artifact,
                    "claim": plain(claim), "ours": ours or "—",
                    "scale": _scale_label(group.iloc[0]),
                    "verdict": short_verdict(group["verdict"].iloc[0]),
                    "detail": plain(group["verdict"].iloc[0])})
    return pd.DataFrame(out, columns=cols)


def _scale_label(row: pd.Series) -> str:
    scale, mode = row.get("scale"), row.get("mode")
    label = {"full": "full", "reduced": "reduced", "model": "model", **SCALE_WORDS,
             **ledger_mod.PROXY_SCALES}.get(scale, str(scale))
    return f"{label} ({mode} mode)" if mode == "paper" else label


def _unjoined_claims(papers_dir: Path, ours: pd.DataFrame) -> pd.DataFrame:
    """``ours`` rows with a claim and verdict that match no source's number (keyed by
    artifact, setting, metric), all their columns."""
    if "verdict" not in ours.columns or not len(ours):
        return ours.iloc[0:0]
    keys = load_reported(papers_dir)[KEY].drop_duplicates()
    merged = ours.merge(keys.assign(_src=True), on=KEY, how="left")
    return merged[merged["_src"].isna() & merged["verdict"].notna()
                  & (merged["verdict"].astype(str) != "")].drop(columns="_src")


def own_claims(papers_dir: Path, figures_dir: Path) -> pd.DataFrame:
    """Compare rows with a claim and verdict that match no source's number (keyed by artifact,
    setting, metric) nor a ledger claim: the project's own checks, at every scale they ran
    (``figures/`` and converged mode's ``figures/converged/``)."""
    cols = ["artifact", "setting", "metric", "claim", "verdict", "value", "unit", "mode",
            "scale"]
    # the proxies' own artifacts too (a source's artifact there is `proxy_claims`')
    sourced = set(load_reported(papers_dir)["artifact"])
    proxies = [p[~p["artifact"].isin(sourced)] for p in
               (_unjoined_claims(papers_dir, load_ours(Path(figures_dir) / name))
                for name in PROXIES)]
    rows = pd.concat([_unjoined_claims(papers_dir, load_ours(figures_dir)), *proxies],
                     ignore_index=True)
    if not len(rows):
        return pd.DataFrame(columns=cols)
    first = {c: i for i, c in enumerate(dict.fromkeys(rows["claim"]))}  # a claim's scales together
    rows = rows.sort_values("claim", key=lambda c: c.map(first), kind="stable")
    # a claim the ledger lists is shown once, as the ledger's (`ledger_rows`)
    rows = rows[~rows["claim"].isin(set(ledger_mod.load_ledger(papers_dir)["claim"]))]
    return rows[[c for c in cols if c in rows.columns]].rename(columns={"value": "ours"})


def converged_claims(papers_dir: Path, figures_dir: Path) -> pd.DataFrame:
    """`claims` of converged mode's runs alone (``figures/converged/``; empty without them)."""
    return proxy_claims(papers_dir, figures_dir, CONVERGED_DIR)


def proxy_claims(papers_dir: Path, figures_dir: Path, name: str) -> pd.DataFrame:
    """`claims` of one CPU proxy's runs alone (``figures/<name>/``, `PROXIES`; empty without
    them)."""
    folder = Path(figures_dir) / name
    if not any(folder.glob("*.compare.csv")):
        return claims(pd.DataFrame())
    # a claim read on a setting the source has no number for (Table 3 on 2x2, the smallest K
    # that keeps the claim's shape) joins no source row: it is added as it is, under the
    # source of its artifact
    extra = _unjoined_claims(papers_dir, load_ours(folder))
    sources = load_reported(papers_dir).groupby("artifact")["source"].unique()
    source_of = {a: s[0] for a, s in sources.items() if len(s) == 1}
    extra = extra.rename(columns={"value": "ours"}).assign(
        source=extra["artifact"].map(source_of), value=float("nan"), **{"setting row": False})
    return claims(pd.concat([joined(papers_dir, folder), extra[extra["source"].notna()]],
                            ignore_index=True))


def _label(source: str, artifact: str) -> str:
    """A claim's short name in the README: "Fig. 6" for Lin et al., else "<source> <artifact>"."""
    label = SOURCE_LABELS.get(source, source)
    art = re.sub(r"^Figure ", "Fig. ", str(artifact))
    return art if label == "Lin et al." else f"{label} {art}"


def ledger_rows(papers_dir: Path, figures_dir: Path) -> pd.DataFrame:
    """`localsgd.paper.ledger.ledger` with the short ``outcome``, our value as text and the
    paper's value at the setting we tested where the verdict row names it (``source_value``:
    like beside like, e.g. Table 1's gap at our largest B_glob, not at the paper's)."""
    table = ledger_mod.ledger(papers_dir, figures_dir)
    table["paper_value"] = [r["source_value"] if r["scale"] and r["source_value"] else
                            r["paper_value"] for _, r in table.iterrows()]
    outcome = [(short_verdict(r["verdict"]) if r["scale"] else r["verdict"])
               for _, r in table.iterrows()]
    # the claim's tested quantity where the row carries it apart from its value (a difference
    # on one configuration's accuracy row), else the row's value; a speed-up says so, as a
    # ratio below 1 beside a claim of "cuts the time" is otherwise read as a time ratio
    ours = [r["tested"] if r["scale"] and r["tested"] else
            (fmt_number(r["value"], 3) + (f" {r['unit']}" if r["unit"] else "")
             + (" speed-up" if r["unit"] == "x" and "speed-up" in str(r["metric"]) else ""))
            if r["scale"] and pd.notna(r["value"]) else "" for _, r in table.iterrows()]
    return table.assign(outcome=outcome, ours=ours)


def results_table(papers_dir: Path, figures_dir: Path) -> pd.DataFrame:
    """README's claims table: claim · the paper's value · ours · scale · verdict, short cells.
    Every ledger claim at each scale a notebook judged it (`ledger_rows`; the untested ones are
    counted in the verdict lines and listed in REPORT), every artifact whose numbers are
    compared at full scale without a claim, and the project's own checks."""
    table = joined(papers_dir, figures_dir)
    rows = []
    led = ledger_rows(papers_dir, figures_dir)
    for _, c in led[led["scale"] != ""].iterrows():
        rows.append({"claim": f"{_label(c['source'], c['artifact'])}: {_short(plain(c['claim']))}",
                     "the paper's value": c["paper_value"] or "—", "ours": c["ours"] or "—",
                     "scale": SCALE_WORDS.get(c["scale"], c["scale"]), "verdict": c["outcome"]})
    for source, part in table.groupby("source", sort=False):
        for artifact, group in part.groupby("artifact", sort=False):
            done = group[group["status"].isin([STATUS_FULL, STATUS_DIFFERS])
                         & ~group["setting row"]
                         & (group["verdict"].isna() | (group["verdict"].astype(str) == ""))]
            if not len(done):
                continue
            same = int((done["status"] == STATUS_FULL).sum())
            name = _label(source, artifact)
            if len(done) <= 2:  # a number or two: one row each
                for _, r in done.iterrows():
                    rows.append({
                        "claim": f"{name}: {r['metric']} at {r['setting']}",
                        "the paper's value": fmt_source(r["value"]),
                        "ours": fmt_number(pd.to_numeric(r["ours"], errors="coerce")),
                        "scale": _scale_label(r),
                        "verdict": "reproduced" if r["status"] == STATUS_FULL
                        else f"differs (see papers/{source}/notes.md)"})
                continue
            rows.append({"claim": f"{name}: the source's counted numbers (no training)",
                         "the paper's value": f"{len(done)} numbers",
                         "ours": f"{same} of {len(done)} within tolerance",
                         "scale": _scale_label(done.iloc[0]),
                         "verdict": "reproduced" if same == len(done)
                         else f"{len(done) - same} of {len(done)} differ (see "
                         f"papers/{source}/notes.md)"})
    for _, c in own_claims(papers_dir, figures_dir).iterrows():
        ours = fmt_number(pd.to_numeric(c["ours"], errors="coerce"), 3)
        unit = c["unit"] if isinstance(c.get("unit"), str) and c["unit"] else ""
        unit = unit or ("%" if "error" in str(c["metric"]) else "")
        rows.append({"claim": f"{OWN_LABEL}, {c['artifact']}: {_short(plain(c['claim']))}",
                     "the paper's value": "—",
                     # like beside like: the unit the row was measured in, as the ledger's rows
                     "ours": f"{ours} {unit}" if unit and ours else ours,
                     "scale": _scale_label(c), "verdict": short_verdict(c["verdict"])})
    out = pd.DataFrame(rows, columns=["claim", "the paper's value", "ours", "scale", "verdict"])
    # the README defines its scales once (full, paper configuration, converged proxy, quick)
    out["scale"] = out["scale"].replace({"reduced": "quick"})
    return out


MAX_WORDS = 40  # a README verdict line's
_RANK = {o: i for i, o in enumerate(("held", "did not hold", "model disagrees with the source",
                                     "not testable at this budget", "inconclusive at this scale",
                                     "not testable at this scale"))}
VERDICT_SCALES = {"full": "Full scale", "converged proxy": "Converged proxy",
                  LONG_LABEL: "Long proxy", ledger_mod.CLUSTER: "Emulated cluster",
                  "reduced": "Quick mode", "model": "Timing model"}
# a ledger scale as the README's claims table words it (the others are their own words)
SCALE_WORDS = {ledger_mod.CLUSTER: ledger_mod.CLUSTER_LABEL}
# lines shown only once their scale has judged a claim
OPTIONAL_SCALES = (LONG_LABEL, ledger_mod.CLUSTER)


def verdict_lines(papers_dir: Path, figures_dir: Path) -> list[str]:
    """The README's verdict in five lines (six once the long proxy judged a claim) of at most
    `MAX_WORDS` words each: per scale the
    ledger's claims judged there, by outcome (with their artifacts while the line stays short),
    a claim judged on the same runs with the same outcome as one before it named apart, not
    counted again (Table 5's ResNet-20 cells are Figure 6's H = 1 and 8); then how many
    claims were not judged, and why."""
    led = ledger_rows(papers_dir, figures_dir)
    lines = []
    for scale, name in VERDICT_SCALES.items():
        part = led[led["scale"] == scale]
        if not len(part) and scale in OPTIONAL_SCALES:
            continue  # the long proxy's and the cluster's lines only once they judged
        if not len(part):
            lines.append(f"**{name}**: no claim judged.")
            continue
        runs = part["runs"].fillna("").astype(str)
        # the same runs, outcome and number: one verdict (two quantities of the same runs count twice)
        same = ["_r", "outcome", *(["ours"] if "ours" in part else [])]
        again = (runs != "") & part.assign(_r=runs).duplicated(same)
        shared = list(dict.fromkeys(_label(r["source"], r["artifact"])
                                    for _, r in part[again].iterrows()))
        part = part[~again]
        groups = {o: [_label(r["source"], r["artifact"]) for _, r in g.iterrows()]
                  for o, g in part.groupby("outcome", sort=False)}
        # decisive outcomes first, and the last to lose their names when the line is long
        order = sorted(groups, key=lambda o: (_RANK.get(o.split(" (")[0], len(_RANK)), o))
        line = ""
        for named in range(len(order), -1, -1):  # drop names from the least decisive first
            parts = [f"{o} {len(groups[o])}" + (
                f" ({', '.join(dict.fromkeys(groups[o]))})" if i < named else "")
                for i, o in enumerate(order)]
            if shared:  # its names go last, with the others'
                parts.append(f"plus {int(again.sum())} on the same runs as another"
                             + (f" ({', '.join(shared)})" if named else ""))
            line = (f"**{name}** ({len(part)} claim{'s' if len(part) != 1 else ''}): "
                    + "; ".join(parts) + ".")
            if len(line.split()) <= MAX_WORDS:
                break
        lines.append(line)
    untested = led[led["scale"] == ""]["outcome"].value_counts()
    waiting = int(untested.get(ledger_mod.UNJOINED, 0))
    lines.append(
        f"**Not judged**: {int(untested.get(ledger_mod.NEVER, 0))} claims never tested, "
        f"{int(untested.get(ledger_mod.UNAVAILABLE, 0))} need data not here (ImageNet, "
        "CIFAR-100)" + (f", {waiting} ran without a committed verdict yet" if waiting else "")
        + "; " + ("no claim is judged at the paper's own GPU scale yet." if not any(
            (Path(figures_dir) / "paper" / "campaign").glob("*/*.compare.csv"))
           else "the campaign's paper-scale GPU runs are counted under full scale."))
    return lines


def ledger_section(papers_dir: Path, figures_dir: Path) -> list[str]:
    """REPORT's claim ledger: every claim of every source, where it was judged and how."""
    led = ledger_rows(papers_dir, figures_dir)
    if not len(led):
        return []
    show = pd.DataFrame({
        "source": led["source"].map(lambda s: SOURCE_LABELS.get(s, s)),
        "artifact": led["artifact"], "claim": led["claim"].map(plain),
        "the paper's value": led["paper_value"].replace("", "—"),
        "scale": led["scale"].replace("", "—"), "ours": led["ours"].replace("", "—"),
        "outcome": led["outcome"],
        "why": [w if not s else "" for w, s in zip(led["why"], led["scale"], strict=True)]})
    return ["## Claim ledger", "",
            ("Every claim of the four sources (`papers/<source>/claims.csv`), each at every "
             "scale a notebook judged it; a claim never judged says why."), "",
            _md_table(show), ""]


def _short(text: str, limit: int = 90) -> str:
    """The longest prefix of ``text`` up to ``limit`` characters that ends at a clause break
    (``; ``, ``: ``, ``, `` or before `` (``) outside parentheses; else cut at a word."""
    if len(text) <= limit:
        return text
    best = ""
    for m in re.finditer(r"; |: |, | \(", text):
        head = text[: m.start()]
        if len(head) > limit:
            break
        if head.count("(") == head.count(")") and len(head) >= 20:
            best = head
    return best or text[: limit - 1].rsplit(" ", 1)[0] + "…"


VERDICT_BEGIN, VERDICT_END = "<!-- verdict:begin -->", "<!-- verdict:end -->"
GENERATED = ("<!-- generated by `localsgd report` from papers/*/claims.csv and "
             "figures/*.compare.csv; do not edit -->")


def readme_block(papers_dir: Path, figures_dir: Path) -> str:
    """The README's claims table with its markers (generated; do not edit by hand)."""
    return "\n".join([README_BEGIN, GENERATED,
                      _md_table(results_table(papers_dir, figures_dir)), README_END])


def verdict_block(papers_dir: Path, figures_dir: Path) -> str:
    """The README's five-line verdict with its markers (generated; do not edit by hand)."""
    lines = verdict_lines(papers_dir, figures_dir)
    return "\n".join([VERDICT_BEGIN, GENERATED,
                      *[f"{i}. {line}" for i, line in enumerate(lines, 1)], VERDICT_END])


def update_readme(readme: Path, papers_dir: Path, figures_dir: Path) -> bool:
    """Replace the README's marked blocks (the verdict lines, the claims table); False (and
    nothing written) when the README has none of the markers or already holds them current."""
    text = original = readme.read_text()
    for (begin, end), block in (((VERDICT_BEGIN, VERDICT_END), verdict_block),
                                ((README_BEGIN, README_END), readme_block)):
        if begin not in text or end not in text:
            continue
        head, rest = text.split(begin, 1)
        text = head + block(papers_dir, figures_dir) + rest.split(end, 1)[1]
    if text == original:
        return False
    write_text(readme, text)
    return True


# ----------------------------------------------------------------------------------------------
# REPORT.md
# ----------------------------------------------------------------------------------------------


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
        wall = meta.get("wall_seconds")
        rows.append({"figure": meta["figure"], "mode": meta.get("mode"),
                     "scale": meta.get("scale"),
                     "wall s": round(wall, 1) if isinstance(wall, int | float) else wall,
                     "commit": commit, "utc": meta.get("utc_time")})
    return pd.DataFrame(rows, columns=["figure", "mode", "scale", "wall s", "commit", "utc"])


def render(papers_dir: Path, figures_dir: Path) -> str:
    table = joined(papers_dir, figures_dir)
    figs = figure_index(figures_dir)
    lines = [
        "# Paper vs reproduced",
        "",
        ("Generated by `localsgd report` (run at the end of `make reproduce`) from "
         "`papers/*/reported.csv` and `figures/*.compare.csv`. Do not edit by hand."),
        "",
        "## Summary",
        "",
        _md_table(summary(table)),
        "",
        "What the statuses mean:",
        "",
        (f"- **{STATUS_FULL}**: our run used the source's configuration and agrees within "
        f"{DEFAULT_REL_TOL:.0%} (or the row's own tolerance; a row's absolute tolerance, for a "
        "quantity near zero such as a gap, decides where it has one)."),
        (f"- **{STATUS_DIFFERS}**: same configuration, different number; a result, discussed in "
        "`papers/<source>/notes.md`."),
        ("- **counts** and **experiments** split both: a count is arithmetic on the model or the "
         "schedule (parameters, FLOPs and their ratio, synchronisations per period) that correct "
         "code gets exactly, so it checks our code, not the source's experiments; an experiment "
         "is a measured result (a time, an accuracy, a best H)."),
        (f"- **{STATUS_REDUCED}**: the same experiment at reduced scale (fewer seeds, steps, "
        "images or a narrower model); a sanity check, not a reproduction. No ratio to the "
        "source is shown: a reduced-scale accuracy is not comparable with a full-scale one."),
        (f"- **{STATUS_MODEL}**: the timing model's prediction for the source's setting (systems "
        "results this machine cannot run)."),
        f"- **{STATUS_NONE}**: no notebook produces this number yet, split by what it needs: "
        + NEED_HOW,
        ("- **settings**: configuration values a source states (batch sizes, periods, GPU "
        "counts, learning rates). They are not results and are not counted as such; the few "
        "a notebook sets beside its own value are listed under each source."),
        "",
        (f"Our numbers are rounded to {SIG_FIGS} significant figures (the sources' as "
         "printed); a min/max pair of the same setting is one row (and one result)."),
        "",
        ("What a claim's verdict says (one rule for every notebook: "
         "`localsgd.paper.experiments.claims`):"),
        "",
        *[f"- **{outcome}**: {MEANING[outcome]}." for outcome in OUTCOMES],
        "",
        "## Figures",
        "",
        _md_table(figs) if len(figs) else "(no figures yet)",
        "",
    ]
    tested = claims(table)
    if len(tested):
        lines += ["## Claims", "",
                  ("A source's claim tested by a notebook, with the outcome at the scale it ran "
                   "(a reduced-scale outcome is indicative only); each verdict in full below."),
                  "", _md_table(tested[["source", "artifact", "claim", "ours", "scale",
                                        "verdict"]].rename(columns={"verdict": "outcome"})),
                  "", "Verdicts in full:", ""]
        lines += [f"- **{c.source}, {c.artifact}** ({c.claim}): {c.detail}"
                  for c in tested.itertuples(index=False)]
        lines += [""]
    for name, (label, what) in PROXIES.items():
        conv = proxy_claims(papers_dir, figures_dir, name)
        if not len(conv):
            continue
        lines += [f"## Claims tested by the {label} ({name} mode)", "",
                  (f"`localsgd reproduce --mode {name}`: {what}, `figures/{name}/`. Kept apart "
                   "from the rows above: a proxy's verdict speaks about the proxy."), "",
                  _md_table(conv[["source", "artifact", "claim", "ours", "verdict"]].rename(
                      columns={"verdict": "outcome"})), "", "Verdicts in full:", ""]
        lines += [f"- **{c.source}, {c.artifact}** ({c.claim}): {c.detail}"
                  for c in conv.itertuples(index=False)]
        lines += [""]
    lines += ledger_section(papers_dir, figures_dir)
    own = own_claims(papers_dir, figures_dir)
    if len(own):
        own = own.assign(claim=own["claim"].map(plain), verdict=own["verdict"].map(plain))
        lines += ["## This project's own claims", "",
                  ("Checks a notebook states about this project's tools (e.g. the timing model "
                   "against real runs); no source number stands beside them."), "",
                  _md_table(own.assign(outcome=own["verdict"].map(short_verdict))[
                      ["artifact", "setting", "metric", "claim", "ours", "mode", "scale",
                       "outcome"]]), "", "Verdicts in full:", ""]
        lines += [f"- **{c.artifact}, {c.setting}**: {c.verdict}"
                  for c in own.itertuples(index=False)]
        lines += [""]
    for source, part in table.groupby("source", sort=True):
        lines += [f"## {source}", ""]
        done = part[(part["status"] != STATUS_NONE) & ~part["setting row"]]
        if len(done):
            show = _result_rows(done)[["artifact", "setting", "metric", "source value", "unit",
                                       "ours value", "ratio", "mode", "scale", "status",
                                       "note"]]
            show = show.rename(columns={"source value": "source", "ours value": "ours",
                                        "ratio": "ours / source"})
            show["note"] = show["note"].map(plain)
            lines += [_md_table(show), ""]
        set_beside = part[(part["status"] != STATUS_NONE) & part["setting row"]]
        if len(set_beside):
            show = set_beside.assign(
                source_v=set_beside["value"].map(fmt_source),
                ours_v=pd.to_numeric(set_beside["ours"], errors="coerce").map(fmt_number),
                note=set_beside["note"].map(plain))
            show = show[["artifact", "setting", "metric", "source_v", "unit", "ours_v", "mode",
                         "note"]].rename(columns={"source_v": "source", "ours_v": "ours"})
            lines += ["Settings a notebook sets beside its own value (not results):", "",
                      _md_table(show), ""]
        todo = part[(part["status"] == STATUS_NONE) & ~part["setting row"]]
        if len(todo):
            by_need = todo.groupby("needs", sort=False)
            parts = []
            for need in NEEDS:
                if need not in by_need.groups:
                    continue
                arts = by_need.get_group(need).groupby("artifact", sort=False).size()
                parts.append(f"{need}: " + ", ".join(f"{a} ({n})" for a, n in arts.items()))
            lines += [("Results not yet compared, by what they need (rows per artifact; see "
                      "`reported.csv`):"), "", *[f"- {p}" for p in parts], ""]
        n_settings = int(part["setting row"].sum())
        if n_settings:
            lines += [f"Settings stated by this source: {n_settings} (not results).", ""]
    return "\n".join(lines)


def write_report(papers_dir: Path, figures_dir: Path, out: Path | None = None,
                 readme: Path | None = None) -> Path:
    """Write REPORT.md; also refresh the README's claims table (``readme``, or the
    ``README.md`` beside a folder named ``figures``) when that README has the markers. Prose
    quotes no result outside these generated blocks (`localsgd.paper.prose_numbers` checks)."""
    out = out or figures_dir / "REPORT.md"
    path = write_text(out, render(papers_dir, figures_dir))
    if readme is None and Path(figures_dir).name == "figures":
        readme = Path(figures_dir).parent / "README.md"
    if readme is not None and Path(readme).is_file():
        update_readme(Path(readme), papers_dir, figures_dir)
    return path
