"""The one-sided Student's t bounds of a per-seed mean: the interval every verdict reads
(`localsgd.paper.experiments.claims.verdict`) and every paired-difference panel draws
(`localsgd.paper.notebook.paired_differences`), kept apart so that both import it from below."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

CONFIDENCE = 0.95  # each one-sided bound's


def bounds(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The one-sided ``confidence`` bounds (lower, upper) of the mean of ``values`` by Student's
    t with n - 1 degrees of freedom; NaN for fewer than two values."""
    arr = np.asarray(values, dtype=float)
    if len(arr) < 2:
        return math.nan, math.nan
    half = float(stats.t.ppf(confidence, len(arr) - 1)) * float(arr.std(ddof=1)) / math.sqrt(
        len(arr))
    return float(arr.mean()) - half, float(arr.mean()) + half
