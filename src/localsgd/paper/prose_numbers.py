"""No result is quoted by hand: README, docs/ and papers/*/notes.md say in words what was measured
and where its number lives (`figures/REPORT.md`, the README's generated claims table, a committed
CSV under figures/), so a re-run of the notebooks cannot leave prose stale. `unlinked` is the
check (tests/test_stale_numbers.py, `localsgd report --check`): any number in that prose which
equals a result in figures/ and sits outside a block `localsgd report` writes and outside code is
a copy, a problem. `NOT_RESULTS` lists the numbers it finds that are not copies, each with why.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from localsgd.paper.results import repo_root

__all__ = ["MEASUREMENT_LOGS", "NOT_RESULTS", "unlinked"]

ROOT = repo_root()
FIG = ROOT / "figures"
MINUS = "−"  # the docs write U+2212


def _decimals(text: str) -> int:
    return len(text.split(".", 1)[1]) if "." in text else 0


def _equal(quoted: str, value: float) -> bool:
    """``quoted`` (as written) is ``value`` rounded to its decimals."""
    return abs(float(quoted.replace(MINUS, "-")) - float(value)) <= 0.5 * 10 ** -_decimals(
        quoted) + 1e-9


# ----------------------------------------------------------------------------------------------
# The search for results copied into prose
# ----------------------------------------------------------------------------------------------

PROSE = ("README.md", "docs/*.md", "papers/*/notes.md")
_BLOCK = re.compile(r"<!-- ([\w-]+):begin -->.*?<!-- \1:end -->", re.DOTALL)  # report-written
_CODE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)  # commands and code: values, not results
# a decimal number, not part of a version (2.14.1), a name or a power of ten (2.5e-4)
_DECIMAL = re.compile(r"(?<![\w./])\d+\.\d+(?![\d.]*\d|e[-+]?\d)")

# (file, number) pairs the search finds that are not copies of a result, each with why
_STUDY = "a one-off variant study described in the text, not a figure's result"
NOT_RESULTS: dict[tuple[str, str], str] = {
    ("papers/lin2020_local_sgd/notes.md", "1.57"): _STUDY + " (three 3-seed groups)",
    ("papers/lin2020_local_sgd/notes.md", "1.69"): _STUDY + " (three 3-seed groups)",
    ("papers/lin2020_local_sgd/notes.md", "1.66"): _STUDY + " (the variants' step ratios)",
    ("papers/lin2020_local_sgd/notes.md", "3.75"): _STUDY + " (sampling without replacement)",
    ("papers/lin2020_local_sgd/notes.md", "1.02"): "DenseNet's count with a 16-channel stem",
    ("papers/lin2020_local_sgd/notes.md", "1.64"): "arithmetic on the source's Table 5 times",
    ("papers/lin2020_local_sgd/notes.md", "1.31"): _STUDY + " (f evaluated every round)",
    ("papers/lin2020_local_sgd/notes.md", "1.24"): _STUDY + " (communication-free time)",
    ("papers/lin2020_local_sgd/notes.md", "1.62"): _STUDY + " (stop at our exact f*)",
    ("papers/lin2020_local_sgd/notes.md", "1.26"): _STUDY + " (K B_loc gradients + 25 per round)",
    ("docs/deep_learning.md", "21.7"): "a past regeneration's Table 6 cell, quoted as an example "
                                       "of cross-CPU rounding",
    ("docs/systems.md", "1.83"): "an uncommitted paper-mode timing run's largest ratio",
    ("papers/lin2020_local_sgd/notes.md", "2.04"): _STUDY + " (iterations + 25 per round)",
    ("papers/lin2020_local_sgd/notes.md", "3.16"): _STUDY + " (f evaluated every round)",
    ("papers/lin2020_local_sgd/notes.md", "3.30"): _STUDY + " (t counted in samples)",
    ("papers/lin2020_local_sgd/notes.md", "3.08"): _STUDY + " (stopping at our exact f*)",
    ("papers/lin2020_local_sgd/notes.md", "1.47"): _STUDY + " (three 3-seed groups)",
    ("papers/lin2020_local_sgd/notes.md", "3.14"): _STUDY + " (iterations + 25 per round)",
    ("papers/lin2020_local_sgd/notes.md", "1.61"): _STUDY + " (t counted in samples)",
    ("docs/systems.md", "3.75"): "a fit to the source's Table 2 (deterministic, no run)",
    ("docs/systems.md", "24.8"): "a fit to the source's Table 2 (deterministic, no run)",
    ("docs/notebooks.md", "13.5"): "how long `make test` took (minutes), not a figure's result",
    ("docs/notebooks.md", "1.34"): "a speed probe's ratio in the log of CI timings",
    ("docs/systems.md", "1.08"): "ResNet-20's bytes (MB), a model size",
    ("docs/systems.md", "16.4"): "a superseded version's error, history",
    ("papers/fairscale_slowmo/notes.md", "37.7"): "a one-off run by hand (not a mode), described there",
}
# developer measurements, each dated with its command (speed of this code, not of a claim)
MEASUREMENT_LOGS = ("docs/benchmarks.md", "docs/profile.md", "docs/runner.md")


def _significant(token: str) -> int:
    return len(token.replace(".", "").lstrip("0"))


def _our_numbers(root: Path) -> list[float]:
    """Every result figures/ holds in a comparable form: the compare rows' values and the
    numbers their verdicts quote (figures/, figures/paper/, figures/converged/)."""
    out: list[float] = []
    for path in sorted((root / "figures").glob("**/*.compare.csv")):
        df = pd.read_csv(path, dtype=str)
        out += [abs(float(v)) for v in df.get("value", pd.Series(dtype=str)).dropna()
                if _is_float(v)]
        for text in df.get("verdict", pd.Series(dtype=str)).dropna():
            out += [float(t) for t in _DECIMAL.findall(text.replace(MINUS, "-"))]
    return [v for v in out if math.isfinite(v)]


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _source_numbers(root: Path) -> list[float]:
    vals = []
    for path in sorted((root / "papers").glob("*/reported.csv")):
        vals += [abs(float(v)) for v in pd.read_csv(path, dtype=str)["value"].dropna()
                 if _is_float(v)]
    return vals


def unlinked(root: Path = ROOT) -> list[str]:
    """One line per number in README, docs/ and papers/*/notes.md that equals a result in
    figures/ (rounded as written) but sits outside a block `localsgd report` writes and outside
    code: a copy that would go stale on the next run. Prose names where the number lives instead.

    A number counts when it has a decimal point and at least three significant digits (fewer
    match some result by chance); a number equal to one the sources report, or listed in
    `NOT_RESULTS` with its reason, is not a copy of ours; `MEASUREMENT_LOGS` (dated speed
    measurements with their commands) are not searched. A heuristic, stated as one: a result
    quoted as an integer or with two digits ("5.5 %") is not found."""
    ours, source = _our_numbers(root), _source_numbers(root)
    out = []
    files = sorted({p.relative_to(root).as_posix() for g in PROSE for p in root.glob(g)}
                   - set(MEASUREMENT_LOGS))
    for path in files:
        text = (root / path).read_text(encoding="utf-8")
        spans = [m.span() for rx in (_BLOCK, _CODE) for m in rx.finditer(text)]
        for m in _DECIMAL.finditer(text):
            token = m.group()
            if any(a <= m.start() < b for a, b in spans) or (path, token) in NOT_RESULTS:
                continue
            if _significant(token) < 3:
                continue
            if any(_equal(token, v) for v in source):
                continue
            if any(_equal(token, v) for v in ours):
                line = text.count("\n", 0, m.start()) + 1
                out.append(f"{path}:{line}: {token} equals a result in figures/ outside a "
                           "generated block: name where it lives (figures/REPORT.md, a figures/ "
                           "CSV) instead, or list it in prose_numbers.NOT_RESULTS with why")
    return out
