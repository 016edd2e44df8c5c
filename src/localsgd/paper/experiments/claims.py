"""Claim rows and verdicts: the one rule by which a notebook says whether a source's claim held.

A claim compares a measured quantity with a threshold: "local SGD (H = 8) loses at most 1 point
against H = 1", "the speed-up is at least 1x", "the model predicts within 10 %". Per seed the
notebook computes the quantity (a paired difference where the claim compares two settings), and
`verdict` decides:

* **The seed-spread rule.** A verdict rests on seeds: with one seed it is *inconclusive at this
  scale* (one run says nothing about the spread a different seed -- or a different CPU, whose
  float32 rounding sends a chaotic training run elsewhere -- would give). With two or more
  seeds the claim is decided only when every seed lies on the same side of the threshold *and*
  the mean lies at least one standard deviation (over seeds) away from it; otherwise the
  difference is within the seed spread and the verdict is inconclusive.
* Quantities that do not depend on a seed (arithmetic, a deterministic simulator or model, a
  measurement repeated until its median is stable) pass ``deterministic=True`` and are decided
  by the mean alone -- unless they are known only to a ``resolution`` (e.g. a stopping time
  checked every 5 % of the steps): a value within ``resolution`` of the threshold is
  inconclusive, as a seed spread straddling it would be.
* ``data unavailable`` when the data set is not on this machine (never replaced by another);
  ``not measurable`` when no value is finite (e.g. no run reached the target accuracy).
* ``not testable at this scale`` (`not_testable`) when the mechanism the claim rests on is
  absent by construction at the scale that ran (named in the reason), whatever the numbers;
  ``model disagrees with the source`` (`model_disagrees`) when the timing model, predicting the
  source's own setting, lands outside the source's number or range: a statement about the
  model, not a failed experiment.

`MEANING` says each outcome in one line (REPORT's legend).

`claim_row` builds the comparison row a notebook hands to `localsgd.paper.results.save_figure`, so
that every row of every notebook has the same columns and no ``nan`` reaches a verdict.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

HELD = "held"
NOT_HELD = "did not hold"
INCONCLUSIVE = "inconclusive at this scale"
UNAVAILABLE = "data unavailable"
NOT_MEASURABLE = "not measurable"
NOT_TESTABLE = "not testable at this scale"
MODEL_DISAGREES = "model disagrees with the source"
OUTCOMES = (HELD, NOT_HELD, INCONCLUSIVE, NOT_TESTABLE, MODEL_DISAGREES, UNAVAILABLE,
            NOT_MEASURABLE)
MEANING = {
    HELD: "the tested quantity lies on the claim's side of its threshold, outside the spread "
          "over seeds (or rounds)",
    NOT_HELD: "the tested quantity lies on the other side, outside the spread",
    INCONCLUSIVE: "the threshold lies within the spread, or one seed gives no spread to judge by",
    NOT_TESTABLE: "the mechanism the claim rests on is absent by construction at the scale that "
                  "ran (the verdict names it)",
    MODEL_DISAGREES: "the timing model's prediction for the source's own setting lies outside "
                     "the source's number: about the model, not an experiment",
    UNAVAILABLE: "the data set is not on this machine (never substituted)",
    NOT_MEASURABLE: "no finite value (e.g. no run reached the target)",
}


@dataclass(frozen=True)
class Verdict:
    """The outcome of a claim (one of `OUTCOMES`) and the numbers it rests on."""

    outcome: str
    mean: float
    sd: float
    seeds: int
    reason: str

    def __str__(self) -> str:
        return f"{self.outcome}: {self.reason}"


def _fmt(x: float, unit: str) -> str:
    return f"{x:+.3g}{unit}" if unit in ("", " points", " pts") else f"{x:.3g}{unit}"


def verdict(values: Sequence[float] | float, threshold: float, *, higher_is_better: bool = True,
            deterministic: bool = False, unit: str = "", data_available: bool = True,
            what: str = "value", resolution: float = 0.0) -> Verdict:
    """Decide the claim "``what`` >= ``threshold``" (or <= with ``higher_is_better=False``) from
    per-seed ``values`` by the seed-spread rule of the module docstring."""
    if not data_available:
        return Verdict(UNAVAILABLE, math.nan, math.nan, 0,
                       "the data set is not on this machine (not substituted)")
    seq = [values] if isinstance(values, (int, float, np.floating)) else list(values)
    arr = np.asarray([float(v) for v in seq if v is not None and math.isfinite(float(v))])
    if not len(arr):
        return Verdict(NOT_MEASURABLE, math.nan, math.nan, 0,
                       f"no finite {what} (e.g. no run reached the target)")
    mean = float(arr.mean())
    sd = float(arr.std(ddof=1)) if len(arr) > 1 else 0.0
    sign = 1.0 if higher_is_better else -1.0
    ok = sign * (mean - threshold) >= 0
    rel = ">=" if higher_is_better else "<="
    spread = f"{_fmt(mean, unit)} ± {sd:.2g}{unit} over {len(arr)} seeds" if len(arr) > 1 \
        else f"{_fmt(mean, unit)} (1 seed)"
    claim = f"{what} {rel} {threshold:g}{unit}"
    if deterministic:
        if abs(mean - threshold) < resolution:
            return Verdict(INCONCLUSIVE, mean, sd, len(arr),
                           f"{what} {_fmt(mean, unit)}, claim {claim}: the threshold lies within "
                           f"the measurement's resolution (±{resolution:.2g}{unit})")
        return Verdict(HELD if ok else NOT_HELD, mean, sd, len(arr),
                       f"{what} {_fmt(mean, unit)}; claim {claim}")
    if len(arr) < 2:
        return Verdict(INCONCLUSIVE, mean, sd, 1,
                       f"{spread}, claim {claim}: one seed gives no spread to judge by")
    same_side = bool(np.all(sign * (arr - threshold) >= 0) or np.all(sign * (arr - threshold) < 0))
    if same_side and abs(mean - threshold) >= sd:
        return Verdict(HELD if ok else NOT_HELD, mean, sd, len(arr), f"{spread}; claim {claim}")
    return Verdict(INCONCLUSIVE, mean, sd, len(arr),
                   f"{spread}, claim {claim}: the threshold lies within the seed spread")


def not_testable(mechanism: str, *, what: str = "value") -> Verdict:
    """The claim cannot be tested at the scale that ran: ``mechanism`` says what is absent
    (e.g. "no 300-epoch tail: the runs stop at 2 epochs")."""
    return Verdict(NOT_TESTABLE, math.nan, math.nan, 0, f"{what}: {mechanism}")


def model_disagrees(predicted: float, low: float, high: float | None = None, *,
                    what: str = "value", unit: str = "") -> Verdict | None:
    """``model disagrees with the source`` when the model's ``predicted`` value for the
    source's own setting lies outside the source's ``[low, high]`` (``high`` defaults to
    ``low``: one number); None when it lies inside (the caller's own verdict stands)."""
    high = low if high is None else high
    if low <= predicted <= high:
        return None
    side = "below" if predicted < low else "above"
    source = f"{low:g}{unit}" if high == low else f"{low:g}-{high:g}{unit}"
    return Verdict(MODEL_DISAGREES, float(predicted), 0.0, 0,
                   f"{what} predicted {predicted:.3g}{unit}, {side} the source's {source}")


def model_outcome(outcome: str) -> str:
    """The outcome of a claim judged on a model's prediction for the source's own setting: where
    the prediction lands on the wrong side, that is the model disagreeing with the source
    (`MODEL_DISAGREES`), not the source's claim failing; every other outcome stands."""
    return MODEL_DISAGREES if outcome == NOT_HELD else outcome


def combine(verdicts: Sequence[Verdict]) -> str:
    """One outcome for a claim made of several parts (e.g. one per model): held only if every
    decided part held; did not hold if any part did not; the model disagrees if any part's
    model does; otherwise inconclusive (or not testable / unavailable / not measurable when no
    part could be judged)."""
    outcomes = [v.outcome for v in verdicts]
    if NOT_HELD in outcomes:
        return NOT_HELD
    if outcomes and all(o == HELD for o in outcomes):
        return HELD
    if MODEL_DISAGREES in outcomes:
        return MODEL_DISAGREES
    if INCONCLUSIVE in outcomes or HELD in outcomes:
        return INCONCLUSIVE
    if outcomes and all(o == NOT_TESTABLE for o in outcomes):
        return NOT_TESTABLE
    if outcomes and all(o == UNAVAILABLE for o in outcomes):
        return UNAVAILABLE
    return NOT_MEASURABLE if outcomes else UNAVAILABLE


def claim_row(artifact: str, setting: str, metric: str, value: float | None, *, unit: str = "",
              note: str = "", claim: str | None = None,
              verdict: Verdict | str | None = None, **extra: Any) -> dict[str, Any]:
    """One comparison row for ``papers/*/reported.csv`` keys (artifact, setting, metric) with our
    ``value``; with ``claim`` also the claim's text and its verdict ("<outcome>: <reason>").
    A missing or non-finite value is written as empty (None), never as ``nan``."""
    if claim is not None and verdict is None:
        raise ValueError(f"claim {claim!r} needs a verdict (localsgd.paper.experiments.claims.verdict)")
    if verdict is not None and claim is None:
        raise ValueError("a verdict needs the claim it judges (claim=...)")
    v = None if value is None or not math.isfinite(float(value)) else float(value)
    row: dict[str, Any] = {"artifact": artifact, "setting": setting, "metric": metric,
                           "value": v, "unit": unit, "note": note, **extra}
    if claim is not None:
        text = str(verdict)
        if text.split(":", 1)[0] not in OUTCOMES:
            raise ValueError(f"verdict {text!r} does not start with one of {OUTCOMES}")
        if re.search(r"\bnan\b", text, re.IGNORECASE):
            raise ValueError(f"verdict {text!r} contains nan")
        row["claim"], row["verdict"] = claim, text
    return row
