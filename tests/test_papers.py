"""Format and transcription checks for papers/*/reported.csv (see papers/README.md)."""

import math
import re
from pathlib import Path

import pandas as pd
import pytest

PAPERS = Path(__file__).resolve().parents[1] / "papers"
FOLDERS = ["lin2020_local_sgd", "cruise_meta_hsgd_blog", "fairscale_slowmo", "dynamo_ddp_update"]
COLUMNS = ["artifact", "setting", "metric", "value", "unit", "note"]
KEY = ["artifact", "setting", "metric"]


def load(folder: str) -> pd.DataFrame:
    # keep_default_na=False: an empty cell must stay "" so we can tell it from a typo like "n/a"
    return pd.read_csv(PAPERS / folder / "reported.csv", dtype=str, keep_default_na=False)


def numeric(df: pd.DataFrame) -> pd.DataFrame:
    """Rows with a value, value converted to float."""
    out = df[df["value"] != ""].copy()
    out["value"] = out["value"].astype(float)
    return out


def lookup(df: pd.DataFrame, artifact: str, setting: str, metric: str) -> float:
    row = df[(df.artifact == artifact) & (df.setting == setting) & (df.metric == metric)]
    assert len(row) == 1, f"missing or duplicate key {(artifact, setting, metric)}"
    return float(row["value"].iloc[0])


@pytest.mark.parametrize("folder", FOLDERS)
def test_folder_has_all_files(folder):
    for name in ["reported.csv", "notes.md", "citation.bib"]:
        path = PAPERS / folder / name
        assert path.is_file() and path.stat().st_size > 0, f"{path} missing or empty"


@pytest.mark.parametrize("folder", FOLDERS)
def test_reported_csv_format(folder):
    df = load(folder)
    assert list(df.columns) == COLUMNS
    assert len(df) > 0
    for col in KEY:
        assert (df[col].str.strip() != "").all(), f"empty {col} in {folder}"
    bad = [v for v in df["value"] if v != "" and not math.isfinite(float(v))]
    assert not bad, f"non-finite values in {folder}: {bad}"
    # every empty value must carry its claim in the note
    assert (df.loc[df["value"] == "", "note"].str.strip() != "").all()
    dups = df[df.duplicated(KEY, keep=False)]
    assert dups.empty, f"duplicate keys in {folder}:\n{dups[KEY]}"


@pytest.mark.parametrize("folder", FOLDERS)
def test_values_parse_as_numbers(folder):
    for v in load(folder)["value"]:
        if v != "":
            float(v)  # raises ValueError on anything that is not a plain number


@pytest.mark.parametrize("folder", FOLDERS)
def test_std_notes_are_well_formed(folder):
    notes = load(folder)["note"]
    for note in notes[notes.str.contains("std=")]:
        assert re.fullmatch(r"std=\d+\.\d+", note), (
            f"std note must be exactly 'std=<number>': {note}"
        )


def test_lin2020_table_cell_counts():
    df = load("lin2020_local_sgd")
    counts = df[(df.metric != "") & (df.setting != "setup")].groupby("artifact").size()
    assert counts["Table 1"] == 24  # 4 rows x 6 B_glob
    assert counts["Table 2"] == 11  # H = 1 .. 1024
    assert counts["Table 3"] == 10 + 13  # sync counts + 15 accuracy cells minus 2 empty
    assert counts["Table 4"] == 21  # 7 models x 3 columns
    assert counts["Table 5"] == 24 + 6  # 6 rows x 4 columns, + H=8 minus H=1 per row
    derived = df[df.note.str.startswith("derived:")]
    for _, row in derived.iterrows():  # each derived value is the difference it names
        a, b = map(float, re.search(r"\(([\d.]+) - ([\d.]+)\)", row.note).groups())
        assert float(row.value) == pytest.approx(a - b, abs=1e-9)
    assert (df.artifact == "Table 7").sum() == 6


def test_lin2020_table4_ratio_is_flops_over_params():
    df = numeric(load("lin2020_local_sgd"))
    t4 = df[df.artifact == "Table 4"].pivot(index="setting", columns="metric", values="value")
    ratio = 1000 * t4["flops per image"] / t4["parameters"]  # billion / million
    assert (ratio - t4["computation/communication scaling ratio"]).abs().max() < 0.006


def test_lin2020_table3_sync_counts_follow_eq6():
    df = load("lin2020_local_sgd")
    for h in [1, 2, 4, 8, 16]:
        hb = 16 // h
        setting = f"H={h}; Hb={hb}"
        # eq. 6 over 16 updates: ceil(16/H) - ceil(16/(H*Hb)) within, ceil(16/(H*Hb)) across
        within = math.ceil(16 / h) - math.ceil(16 / (h * hb))
        assert lookup(df, "Table 3", setting, "syncs within node per 16 updates") == within
        assert lookup(df, "Table 3", setting, "syncs over nodes per 16 updates") == 1


def test_lin2020_keys_the_notebooks_join_on():
    df = load("lin2020_local_sgd")
    assert lookup(df, "Appendix E", "w8a; lambda=1/n", "f*") == 0.126433176216545
    assert lookup(df, "Figure 4", "K=16; B_loc=64; H=1 vs B_loc=16; H=16", "time ratio") == 2
    assert lookup(df, "Figure 4", "K=16; B_loc=256; H=1 vs B_loc=16; H=16", "time ratio") == 3
    assert lookup(df, "Figure 5", "B_loc=16; K=16", "best H") == 16
    assert lookup(df, "Table 2", "8x2; H=1", "training time") == 20.07
    assert lookup(df, "Table 1", "local SGD; w/o tricks; B_glob=128", "test top-1") == 91.84
    # with B_glob = B_loc = 128 local SGD is mini-batch SGD, so the paper's cells coincide
    for tricks in ["w/o tricks", "w/ tricks"]:
        a = lookup(df, "Table 1", f"local SGD; {tricks}; B_glob=128", "test top-1")
        b = lookup(df, "Table 1", f"mini-batch SGD; {tricks}; B_glob=128", "test top-1")
        assert a == b


def test_blog_speedup_ranges_are_ordered():
    df = load("cruise_meta_hsgd_blog")
    for gpus in [64, 128, 256]:
        setting = f"GPUs={gpus}; methods=HSGD"
        lo = lookup(df, "Speedup chart", setting, "speed-up min")
        hi = lookup(df, "Speedup chart", setting, "speed-up max")
        assert 1 < lo < hi


def test_blog_configurations_nest():
    """Each HSGD scheme: periods and group sizes grow, and the last group is the world."""
    df = numeric(load("cruise_meta_hsgd_blog"))
    conf = df[df.artifact == "Configurations"].copy()
    conf = conf[conf.setting.str.contains("scheme=")]
    conf["scheme"] = conf.setting.str.replace(r"; group=\d+$", "", regex=True)
    conf["group"] = conf.setting.str.extract(r"group=(\d+)$")[0].astype(int)
    for scheme, rows in conf.groupby("scheme"):
        wide = rows.pivot(index="group", columns="metric", values="value").sort_index()
        world = int(re.search(r"GPUs=(\d+)", scheme).group(1))
        periods, sizes = wide["period"].tolist(), wide["group size"].tolist()
        assert periods == sorted(periods) and sizes == sorted(sizes), scheme
        assert sizes[-1] == world, scheme
        assert all(world % s == 0 for s in sizes), scheme
        name = re.search(r"HSGD ([\d,-]+)", scheme).group(1)
        spelled = ",".join(f"{int(p)}-{int(s)}" for p, s in zip(periods, sizes))
        assert spelled == name, f"{scheme}: rows spell {spelled}"


def test_readers_texts_cite_sources_not_work_items_or_internal_files():
    # README, docs, notes, notebooks and their parameter files speak to readers: a source by
    # its title and section, never a work item ("issue 20") or a development file name
    root = Path(__file__).resolve().parents[1]
    bad = re.compile(r"\b[Ii]ssues? #?\d+\b|shared/seeds|\b\d{3}_[0-9a-f]{16}\.txt\b")
    files = [root / "README.md", *root.glob("docs/*.md"), *root.glob("papers/*/notes.md"),
             *root.glob("notebooks/*.ipynb"), *root.glob("notebooks/params/*/*.yaml")]
    found = [f"{p.relative_to(root)}: {m.group()}" for p in files
             for m in bad.finditer(p.read_text())]
    assert not found, found
