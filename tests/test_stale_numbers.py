"""Numbers the README, docs/ and papers/*/notes.md quote from a committed figure equal the
figure's own CSV, rounded as quoted, so a re-run of the notebooks cannot leave them stale.

Each check is (file, a pattern whose groups are the quoted numbers, how to compute those numbers
from figures/); the file's line breaks count as spaces. A pattern that no longer matches fails too: rewording a sentence means updating
its check here. The README's results table is generated (tests/test_report.py checks it).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
FIG = ROOT / "figures"
MINUS = "−"  # the docs write U+2212


def csv(name: str) -> pd.DataFrame:
    return pd.read_csv(FIG / f"{name}.csv")


def compare(name: str, setting: str, metric: str | None = None) -> float:
    df = pd.read_csv(FIG / f"{name}.compare.csv", dtype={"setting": str})
    rows = df[(df["setting"] == setting) & ((df["metric"] == metric) if metric else True)]
    assert len(rows) == 1, f"{name}.compare.csv: {len(rows)} rows for {setting!r} {metric!r}"
    return float(rows["value"].iloc[0])


def verdict_number(name: str, artifact: str, pattern: str) -> float:
    df = pd.read_csv(FIG / f"{name}.compare.csv")
    text = " ".join(df.loc[df["artifact"] == artifact, "verdict"].dropna().astype(str))
    m = re.search(pattern, text)
    assert m, f"{name}.compare.csv: {pattern!r} not in the {artifact} verdict"
    return float(m.group(1))


def slowmo_vs_local() -> dict[str, tuple[float, float]]:
    """Final test top-1 of every variant minus local SGD alone, paired by seed: (mean, sd)."""
    runs = csv("slowmo")
    runs = runs[runs["kind"] == "train"].sort_values("epoch")
    final = runs.groupby(["variant", "seed"])["test_acc"].last().unstack()
    diff = final - final.loc["local SGD alone"]
    return {v: (diff.loc[v].mean(), diff.loc[v].std(ddof=1)) for v in diff.index}


def slowmo_best() -> tuple[float, float, float]:
    """(β, mean, sd) of the best SlowMo-over-local-SGD setting against local SGD alone."""
    d = {v: ms for v, ms in slowmo_vs_local().items() if v.startswith("local SGD + SlowMo")}
    best = max(d, key=lambda v: d[v][0])
    beta = float(re.search(r"β=([\d.]+)", best).group(1))
    return beta, *d[best]


def slowmo_mean_acc(variant: str) -> float:
    runs = csv("slowmo")
    runs = runs[runs["kind"] == "train"].sort_values("epoch")
    return runs.groupby(["variant", "seed"])["test_acc"].last().loc[variant].mean()


def blog_gap_pct() -> tuple[float, float]:
    """How far below the blog's speed-up ranges the model lands, in % (smallest, largest)."""
    ours = pd.read_csv(FIG / "blog_hsgd_stragglers.compare.csv")
    src = pd.read_csv(ROOT / "papers" / "cruise_meta_hsgd_blog" / "reported.csv")
    m = ours.merge(src, on=["artifact", "setting", "metric"], suffixes=("", "_src"))
    m = m[m["metric"].str.startswith("speed-up")]
    gap = 100 * (1 - m["value"] / m["value_src"].astype(float))
    return gap.min(), gap.max()


def dynamo_speed() -> tuple[float, float]:
    runs = csv("dynamo_ddp")
    s = runs.loc[runs["mode"] == "ddp_optimizer", "speed_vs_eager"]
    return s.min(), s.max()


def fig05(name: str, k: int, h: int) -> float:
    df = pd.read_csv(FIG / name)
    return float(df[(df["K"] == k) & (df["H"] == h) & df["optimal"]]["speedup"].iloc[0])


def table04_reproduced() -> tuple[int, int]:
    from localsgd.paper import report

    t = report.joined(ROOT / "papers", FIG)
    t = t[(t["artifact"] == "Table 4") & (t["status"] != report.STATUS_NONE)]
    return int((t["status"] == report.STATUS_FULL).sum()), len(t)


def table02_fit() -> tuple[float, float, float]:
    """(largest leave-one-out error on H <= 32 in %, smallest and largest shortfall beyond)."""
    fit = csv("table02_time_vs_H")
    fit = fit[fit["kind"] == "fit"]
    inside, beyond = fit[fit["H"] <= 32], fit[fit["H"] > 32]
    loo = (100 * (inside["loo_minutes"] / inside["minutes"] - 1)).abs().max()
    short = 100 * (1 - beyond["model_minutes"] / beyond["minutes"])
    return loo, short.min(), short.max()


def timing_validation_errors() -> tuple[float, float]:
    """(largest, median) |predicted / measured speed-up - 1| in % over the runs with stalls."""
    df = pd.read_csv(FIG / "timing_validation.compare.csv", dtype={"setting": str})
    runs = df[df["setting"].str.startswith("workers=")]
    err = 100 * (runs["value"] - 1).abs()
    return err.max(), err.median()


def table03_gpu_cell() -> tuple[float, float]:
    """(ours, the paper's) final test top-1 of the Table 3 cell one H100 ran at full scale."""
    ours = pd.read_csv(FIG / "gpu" / "h100" / "table03_8x2_h1_hb16_seed0.csv")
    src = pd.read_csv(ROOT / "papers" / "lin2020_local_sgd" / "reported.csv", dtype=str)
    row = src[(src["artifact"] == "Table 3") & (src["setting"] == "8x2; H=1; Hb=16")
              & (src["metric"] == "test top-1")]
    return float(ours["test_acc"].iloc[-1]), float(row["value"].iloc[0])


def converged_finals(name: str) -> pd.DataFrame:
    """Each converged-mode run's final test top-1: a row per seed, a column per H."""
    df = pd.read_csv(FIG / "converged" / f"{name}.csv")
    return df.sort_values("step").groupby(["seed", "local_steps"])["test_acc"].last().unstack()


def converged_change(name: str, h: int) -> tuple[float, float]:
    """(mean, sd) over seeds of the final test top-1 of H = h minus H = 1, paired by seed."""
    finals = converged_finals(name)
    gap = finals[h] - finals[1]
    return float(gap.mean()), float(gap.std(ddof=1))


def converged_outcome(name: str, metric: str) -> str:
    """The verdict's outcome (its words before the colon) of a converged compare row."""
    df = pd.read_csv(FIG / "converged" / f"{name}.compare.csv")
    row = df[(df["metric"] == metric) & df["verdict"].notna()]
    return str(row["verdict"].iloc[0]).split(":")[0]


def blog_ranges() -> tuple[float, ...]:
    ours = pd.read_csv(FIG / "blog_hsgd_stragglers.compare.csv", dtype={"setting": str})
    out = []
    for gpus in (64, 128, 256):
        for end in ("min", "max"):
            row = ours[(ours["setting"] == f"GPUs={gpus}; methods=HSGD")
                       & (ours["metric"] == f"speed-up {end}")]
            out.append(float(row["value"].iloc[0]))
    return tuple(out)


FIG04 = "paper/fig04_convex_time"
FIG04_Q = "fig04_convex_time"
SET_64 = "K=16; B_loc=64; H=1 vs B_loc=16; H=16"
SET_256 = "K=16; B_loc=256; H=1 vs B_loc=16; H=16"
NUM = r"(−?\d+(?:\.\d+)?)"

CHECKS: list[tuple[str, str, Callable[[], tuple[float, ...]]]] = [
    # README's verdict
    ("README.md", rf"\"3× faster\" holds \({NUM}×\), its \"more than 2×\" does not \({NUM}×\)",
     lambda: (compare(FIG04, SET_256), compare(FIG04, SET_64))),
    ("README.md", rf"and {NUM} of {NUM} Table 4 numbers reproduce", table04_reproduced),
    ("README.md", rf"H = 1 ends at {NUM}–{NUM} %",
     lambda: tuple(converged_finals("table05_models")[1].agg(["min", "max"]))),
    ("README.md", rf"H = 8 moves test top-1 by {NUM} ± {NUM} points",
     lambda: converged_change("table05_models", 8)),
    ("README.md", rf"H = 16 by {NUM} ± {NUM} \(Fig", lambda: converged_change("fig06_cifar10_local_sgd", 16)),
    ("README.md", rf"communication is {NUM} % of an update",
     lambda: (float(re.search(r"communication is ([\d.]+) %", pd.read_csv(
         FIG / "converged" / "fig06_cifar10_local_sgd.compare.csv")["verdict"].iloc[0])[1]),)),
    ("README.md", rf"predicts real multi-process runs within {NUM} %",
     lambda: (compare("timing_validation", "all runs", "max speed-up error"),)),
    ("README.md", rf"hierarchical SGD {NUM}–{NUM} % below the blog", blog_gap_pct),
    ("README.md", rf"best β = {NUM}: {NUM} ± {NUM} points vs local SGD alone", slowmo_best),
    ("README.md", rf"compiled DDP ran at {NUM}–{NUM}× eager", dynamo_speed),
    ("README.md", rf"on an H100 \(one seed\) ended at {NUM} % against the paper's {NUM} %",
     table03_gpu_cell),
    # docs/systems.md
    ("docs/systems.md", rf"speed-up was {NUM} % \(median {NUM} %;", timing_validation_errors),
    ("docs/systems.md", (rf"speed-ups are {NUM}–{NUM}× \(64 GPUs\), {NUM}–{NUM}× \(128\) and "
                        rf"{NUM}–{NUM}× \(256\)"), blog_ranges),
    ("docs/systems.md", rf"break-even at {NUM} % here",
     lambda: (compare("blog_hsgd_stragglers", "mild stragglers", "slowdown threshold"),)),
    ("docs/systems.md", rf"predicted from the other five within {NUM} %",
     lambda: table02_fit()[:1]),
    ("docs/systems.md", rf"\({NUM}–{NUM} % low\), and", lambda: table02_fit()[1:]),
    ("docs/systems.md", rf"compiled DDP ran at {NUM}–{NUM}× eager's speed", dynamo_speed),
    ("docs/systems.md", r"within (\d\.\d)e-5 relative",
     lambda: (csv("dynamo_ddp")["loss_max_rel_diff"].max() / 1e-5,)),
    # SlowMo, wherever it is quoted
    ("docs/systems.md", rf"best, β = {NUM}: {NUM} ± {NUM} points", slowmo_best),
    ("docs/systems.md", rf"H = 1 minus local SGD: {NUM} ± {NUM} points",
     lambda: slowmo_vs_local()["H = 1 (average every update)"]),
    ("docs/systems.md", (rf"β = 0.2:\s+{NUM}, β = 0.4: {NUM}, β = 0.6: {NUM}, β = 0 with slow lr "
                        rf"2: {NUM}\)"),
     lambda: tuple(slowmo_vs_local()[f"local SGD + SlowMo β={b}"][0]
                   for b in ("0.2, α=1", "0.4, α=1", "0.6, α=1", "0, α=2"))),
    ("docs/systems.md", rf"SGP alone reached {NUM} %, SGP \+ SlowMo \(β = 0.4\) {NUM} %",
     lambda: (slowmo_mean_acc("SGP alone"), slowmo_mean_acc("SGP + SlowMo β=0.4, α=1"))),
    ("papers/fairscale_slowmo/notes.md", rf"best, β = {NUM}: {NUM} ± {NUM} points", slowmo_best),
    ("papers/fairscale_slowmo/notes.md", rf"H = 1 minus local SGD: {NUM} ± {NUM} points",
     lambda: slowmo_vs_local()["H = 1 (average every update)"]),
    ("papers/fairscale_slowmo/notes.md",
     rf"β = 0.2: {NUM}; β = 0.4: {NUM};\s+β = 0.6: {NUM}; β = 0 with slow lr 2: {NUM}\)",
     lambda: tuple(slowmo_vs_local()[f"local SGD + SlowMo β={b}"][0]
                   for b in ("0.2, α=1", "0.4, α=1", "0.6, α=1", "0, α=2"))),
    ("papers/fairscale_slowmo/notes.md", rf"momentum; {NUM} % test top-1",
     lambda: (slowmo_mean_acc("local SGD alone"),)),
    ("papers/fairscale_slowmo/notes.md", rf"SGP alone {NUM} %,\s+SGP \+ SlowMo \(β = 0.4\) {NUM} %",
     lambda: (slowmo_mean_acc("SGP alone"), slowmo_mean_acc("SGP + SlowMo β=0.4, α=1"))),
    ("papers/dynamo_ddp_update/notes.md", rf"compiled DDP ran at {NUM}–{NUM}× eager",
     dynamo_speed),
    ("papers/dynamo_ddp_update/notes.md", r"compiled losses within (\d\.\d)e-5 relative",
     lambda: (csv("dynamo_ddp")["loss_max_rel_diff"].max() / 1e-5,)),
    ("papers/lin2020_local_sgd/notes.md", rf"Reaching {NUM} % \(H = 1\) and {NUM} %",
     lambda: tuple(csv("fig08_imagenet").sort_values("epoch").groupby("local_steps")["test_acc"]
                   .last().loc[[1, 8]])),
    ("papers/cruise_meta_hsgd_blog/notes.md", rf"speed-ups come out {NUM}–{NUM} % below",
     blog_gap_pct),
    # Lin et al.'s notes
    ("papers/lin2020_local_sgd/notes.md",
     (rf"\(64,1\)/\(16,16\) = {NUM} vs the paper's > 2, \(256,1\)/\(16,16\) = {NUM} vs 3; quick "
     rf"mode \(1 seed\): {NUM} and {NUM}"),
     lambda: (compare(FIG04, SET_64), compare(FIG04, SET_256), compare(FIG04_Q, SET_64),
              compare(FIG04_Q, SET_256))),
    ("papers/lin2020_local_sgd/notes.md",
     (rf"H = 8 and 16 tie at K = 16 \({NUM}× / {NUM}×\), H = 1 best at K = 64 \({NUM}×\); quick "
     rf"mode \(1 seed\): H = 16 best at K = 16 \({NUM}×\), at K = 64 H = 8 leads \({NUM}×\)"),
     lambda: (fig05("paper/fig05_convex_speedup.csv", 16, 8),
              fig05("paper/fig05_convex_speedup.csv", 16, 16),
              fig05("paper/fig05_convex_speedup.csv", 64, 1),
              fig05("fig05_convex_speedup.csv", 16, 16), fig05("fig05_convex_speedup.csv", 64, 8))),
    ("papers/lin2020_local_sgd/notes.md",
     (rf"each row predicted from the other five within {NUM} %\); the rise beyond H = 32 \(model "
     rf"{NUM}–{NUM} % low\)"), table02_fit),
    ("papers/lin2020_local_sgd/notes.md", rf"reduced scale \({NUM}× in the committed quick run;",
     lambda: (verdict_number("fig09_hierarchical", "Figure 9", r"by ([\d.]+)x"),)),
    ("papers/lin2020_local_sgd/notes.md", rf"hurt \(by {NUM} points in the",
     lambda: (compare("table06_07_momentum", "local momentum=0.9; global momentum=0.0; H=1")
              - compare("table06_07_momentum", "local momentum=0.9; global momentum=0.3; H=1"),)),
    ("papers/lin2020_local_sgd/notes.md", (rf"done at full scale \(exact counts, every mode\): "
                                          rf"{NUM} of {NUM} numbers reproduced"),
     table04_reproduced),
]


def _decimals(text: str) -> int:
    return len(text.split(".", 1)[1]) if "." in text else 0


@pytest.mark.parametrize(("path", "pattern", "compute"), CHECKS,
                         ids=[f"{p}:{i}" for i, (p, _, _) in enumerate(CHECKS)])
def test_quoted_number_equals_the_figure(path, pattern, compute):
    text = " ".join((ROOT / path).read_text().split())  # line breaks are spaces
    matches = list(re.finditer(pattern, text))
    assert matches, f"{path}: the quoted text {pattern!r} is gone; update tests/test_stale_numbers"
    want = compute()
    for m in matches:
        quoted = m.groups()
        assert len(quoted) == len(want), (quoted, want)
        for q, w in zip(quoted, want, strict=True):
            value = float(q.replace(MINUS, "-"))
            tol = 0.5 * 10 ** -_decimals(q) + 1e-9
            assert abs(value - float(w)) <= tol, (
                f"{path} quotes {q} but figures/ gives {float(w):.6g}: rerun the numbers "
                f"(pattern {pattern!r})")


def test_committed_figures_name_no_machine_folders():
    """A committed CSV carries nothing of the machine (the JSON sidecar holds provenance)."""
    machine = re.compile(r"(?<![\w$])(/work/|/tmp/|/home/|/root/|/Users/|[A-Z]:\\\\)")
    bad = [p.relative_to(ROOT).as_posix() for p in sorted(FIG.rglob("*.csv"))
           if machine.search(p.read_text())]
    assert not bad, f"figures CSVs naming this machine's folders: {bad}"


def test_the_readme_names_the_converged_verdicts_the_figures_give():
    text = " ".join((ROOT / "README.md").read_text().split())
    t5 = converged_outcome("table05_models", "test top-1 change")
    fig6 = converged_outcome("fig06_cifar10_local_sgd", "test top-1 change")
    speed = converged_outcome("fig06_cifar10_local_sgd", "training time speed-up")
    assert f"(Table 5's match *{t5}*)" in text
    assert f"(Fig. 6c's *{fig6}*)" in text
    assert speed.startswith("not testable") and "3× speed-up is *not testable* on a CPU" in text
