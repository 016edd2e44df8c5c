"""Claim rows and verdicts: the one rule by which a notebook says whether a source's claim held.

A claim compares a measured quantity with a threshold: "local SGD (H = 8) loses at most 1 point
against H = 1", "the speed-up is at least 1x", "the model predicts within 10 %". Per seed the
notebook computes the quantity (a paired difference where the claim compares two settings), and
`verdict` decides:

* **The rule.** A claim "quantity >= threshold" is *held* when the one-sided 95 % confidence
  bound of the per-seed mean (Student's t with n - 1 degrees of freedom: mean - t·sd/sqrt(n)) is
  above the threshold, *did not hold* when the other one-sided 95 % bound (mean + t·sd/sqrt(n))
  is below it, and *inconclusive* otherwise (and with one seed, which gives no interval). "<="
  claims mirror it. At n = 3 the bound is 2.92 standard errors from the mean (n = 2: 6.31).
* **Every threshold says where it comes from** (``origin``): the paper's own words or number
  (`paper`), or a tolerance of ours, with why (`ours`).
* Quantities that do not depend on a seed (arithmetic, a deterministic simulator or model, a
  measurement repeated until its median is stable) pass ``deterministic=True`` and are decided
  by the mean alone -- unless they are known only to a ``resolution`` (e.g. a stopping time
  checked every 5 % of the steps): a value within ``resolution`` of the threshold is
  inconclusive.
* **The regime check** (`regime`), before a verdict on trained runs: every configuration the
  claim compares must be in the regime the claim is about -- converged (its test accuracy moves
  by at most `REGIME_MOVE` points over the last tenth of training, and rises by at most
  `REGIME_SLOPE` points per tenth over the phase before its last lr decay, where the lr is
  still large enough for an unconverged run to move) and not underfit against what it is
  compared with (its training accuracy over its last full epoch not below the other's test
  accuracy by more than the `underfit_margin` of their measured noise).
  Otherwise the claim is ``not testable at this budget``, naming the configuration and number.
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

import hashlib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from localsgd.paper.confidence import bounds

HELD = "held"
NOT_HELD = "did not hold"
INCONCLUSIVE = "inconclusive at this scale"
UNAVAILABLE = "data unavailable"
NOT_MEASURABLE = "not measurable"
NOT_TESTABLE = "not testable at this scale"
NOT_IN_REGIME = "not testable at this budget"
MODEL_DISAGREES = "model disagrees with the source"
OUTCOMES = (HELD, NOT_HELD, INCONCLUSIVE, NOT_IN_REGIME, NOT_TESTABLE, MODEL_DISAGREES,
            UNAVAILABLE, NOT_MEASURABLE)
# the rule a verdict was judged by, carried by every claim row (`claim_row`): `localsgd report
# --check` flags a committed verdict without it (an older notebook's output)
RULE = "one-sided 95 % t bound, regime check"
MEANING = {
    HELD: "the one-sided 95 % confidence bound (t over seeds or rounds) of the tested quantity "
          "lies on the claim's side of its threshold",
    NOT_HELD: "the other one-sided 95 % bound lies on the other side of the threshold",
    INCONCLUSIVE: "the threshold lies within the 95 % bounds, or one seed gives no interval",
    NOT_IN_REGIME: "a compared configuration is not in the claim's regime at this training "
                   "length: its test accuracy still moves over the last tenth or still rises "
                   "before the last lr decay, or it is underfit against what it is compared "
                   "with beyond their noise (the verdict names it)",
    NOT_TESTABLE: "the mechanism the claim rests on is absent by construction at the scale that "
                  "ran (the verdict names it)",
    MODEL_DISAGREES: "the timing model's prediction for the source's own setting lies outside "
                     "the source's number: about the model, not an experiment",
    UNAVAILABLE: "the data set is not on this machine (never substituted)",
    NOT_MEASURABLE: "no finite value (e.g. no run reached the target)",
}


def paper(words: str) -> str:
    """A threshold the source states (``words``: where, or what it says)."""
    return f"the paper's: {words}"


def ours(why: str) -> str:
    """A threshold that is our tolerance, not the source's (``why`` it is this value)."""
    return f"our tolerance: {why}"


@dataclass(frozen=True)
class Verdict:
    """The outcome of a claim (one of `OUTCOMES`) and the numbers it rests on: the mean over
    seeds, their sd, n, and the one-sided 95 % bounds (``low``, ``high``; NaN below two seeds)."""

    outcome: str
    mean: float
    sd: float
    seeds: int
    reason: str
    low: float = math.nan
    high: float = math.nan

    def __str__(self) -> str:
        return f"{self.outcome}: {self.reason}"


def _fmt(x: float, unit: str) -> str:
    return f"{x:+.3g}{unit}" if unit in ("", " points", " pts") else f"{x:.3g}{unit}"


def verdict(values: Sequence[float] | float, threshold: float, *, origin: str,
            higher_is_better: bool = True, deterministic: bool = False, unit: str = "",
            data_available: bool = True, what: str = "value",
            resolution: float = 0.0, over: str = "seeds") -> Verdict:
    """Decide the claim "``what`` >= ``threshold``" (or <= with ``higher_is_better=False``) from
    per-seed ``values`` by the rule of the module docstring; ``origin`` says where the
    threshold comes from (`paper` or `ours`); ``over`` names the samples ("repeats" for
    timings)."""
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
    rel = ">=" if higher_is_better else "<="
    claim = f"claim {what} {rel} {threshold:g}{unit} ({origin})"
    if deterministic:
        ok = sign * (mean - threshold) >= 0
        if abs(mean - threshold) < resolution:
            return Verdict(INCONCLUSIVE, mean, sd, len(arr),
                           f"{what} {_fmt(mean, unit)}, {claim}: the threshold lies within "
                           f"the measurement's resolution (±{resolution:.2g}{unit})")
        return Verdict(HELD if ok else NOT_HELD, mean, sd, len(arr),
                       f"{what} {_fmt(mean, unit)}; {claim}")
    if len(arr) < 2:
        return Verdict(INCONCLUSIVE, mean, sd, 1,
                       f"{what} {_fmt(mean, unit)} (1 {over.rstrip('s')}), {claim}: one "
                       f"{over.rstrip('s')} gives no interval to judge by")
    low, high = bounds(arr)
    # the bound on the claim's side, and the one on the other
    near, far = (low, high) if higher_is_better else (high, low)
    spread = (f"{what} {_fmt(mean, unit)} ± {sd:.2g}{unit} sd over {len(arr)} {over}, one-sided "
              f"95 % bound {_fmt(near, unit)} (t)")
    if sign * (near - threshold) > 0:
        return Verdict(HELD, mean, sd, len(arr), f"{spread}; {claim}", low, high)
    if sign * (far - threshold) < 0:
        return Verdict(NOT_HELD, mean, sd, len(arr),
                       f"{what} {_fmt(mean, unit)} ± {sd:.2g}{unit} sd over {len(arr)} {over}, "
                       f"one-sided 95 % bound {_fmt(far, unit)} (t); {claim}", low, high)
    return Verdict(INCONCLUSIVE, mean, sd, len(arr),
                   f"{what} {_fmt(mean, unit)} ± {sd:.2g}{unit} sd over {len(arr)} {over}, 95 % "
                   f"bounds {_fmt(low, unit)} and {_fmt(high, unit)} (t), {claim}: the "
                   "threshold lies within them", low, high)


# --------------------------------------------------------------------------- the regime check
REGIME_TAIL = 0.1  # the last tenth of training
# Points of test top-1 a configuration may move over the last tenth of its training and still
# count as converged: our tolerance (REGIME_WHY).
REGIME_MOVE = 0.5
REGIME_WHY = ("half the 1-point tolerance of the accuracy claims, so a run still moving cannot "
              "alone carry a verdict across such a threshold")
# The last tenth passes by construction when its lr is 1 % of the peak (nothing moves there,
# converged or not), so the plateau is also tested where an unconverged run still moves: the
# phase before the last lr decay (lr at 10 % of the peak in the paper's schedule). Its test top-1
# may rise by at most this many points per tenth of training (least-squares slope over the
# phase's records): our tolerance (REGIME_SLOPE_WHY).
REGIME_SLOPE = 1.0
REGIME_SLOPE_WHY = ("the accuracy claims' 1-point tolerance: a run still gaining more than that "
                    "per tenth of training before its last decay had more to gain from updates "
                    "than the claims tolerate")
# One-sided 95 % normal quantile: the underfit test's margin is this many standard errors of
# the difference of the two sides' mean accuracies (`underfit_margin`).
UNDERFIT_Z = 1.645


def tail_move(records: pd.DataFrame, column: str = "test_acc") -> float:
    """How far ``column`` moves (max - min) over the last `REGIME_TAIL` of one run's
    ``records`` (by ``epoch``; the record at the tail's start included); NaN with fewer than two
    records there."""
    if records.empty or "epoch" not in records:
        return math.nan
    end = float(records["epoch"].max())
    tail = records[records["epoch"] >= (1 - REGIME_TAIL) * end - 1e-9][column]
    return float(tail.max() - tail.min()) if len(tail) >= 2 else math.nan


def phase_slope(records: pd.DataFrame, column: str = "test_acc") -> float:
    """The least-squares slope of ``column`` in points per tenth of training over one run's
    phase before its last learning-rate step decay (the records after the previous decay, or
    from the start, up to the decay; a decay is a record whose ``lr_last`` is under a fifth of
    the one before). NaN without an ``lr_last`` column, without a decay, or with fewer than
    three records in the phase: a schedule with no decay has no such phase, and the last tenth's
    move (`tail_move`) still judges it."""
    if records.empty or not {"epoch", "lr_last", column} <= set(records.columns):
        return math.nan
    ordered = records.sort_values("epoch", kind="stable")
    lr = ordered["lr_last"].astype(float).to_numpy()
    decays = [i for i in range(1, len(lr)) if lr[i] < lr[i - 1] / 5]
    if not decays:
        return math.nan
    start = decays[-2] + 1 if len(decays) >= 2 else 0
    phase = ordered.iloc[start:decays[-1]]
    if len(phase) < 3:
        return math.nan
    x = phase["epoch"].astype(float).to_numpy() / float(ordered["epoch"].max())
    y = phase[column].astype(float).to_numpy()
    return float(np.polyfit(x, y, 1)[0]) * REGIME_TAIL


def epoch_train_acc(records: pd.DataFrame) -> tuple[float, float]:
    """One run's training top-1 over its last full epoch and the images it counts: the records'
    ``train_acc`` (each the mean over its interval's mini-batches), weighted by their intervals'
    updates, from the last record back until the intervals span one epoch (``epoch`` column).
    The last record alone may count a few updates (a partial epoch: about 1,536 images at K = 2,
    a standard error near one point); an epoch counts all of them. Images are NaN without the
    ``world_size`` and ``local_batch`` columns; both values NaN without ``step``."""
    if records.empty or not {"epoch", "step", "train_acc"} <= set(records.columns):
        return math.nan, math.nan
    ordered = records.sort_values("step", kind="stable")
    steps = ordered["step"].astype(float).to_numpy()
    epochs = ordered["epoch"].astype(float).to_numpy()
    acc = ordered["train_acc"].astype(float).to_numpy()
    weights = np.diff(steps, prepend=0.0)
    span_start = np.concatenate([[0.0], epochs[:-1]])
    first = len(acc) - 1
    while first > 0 and epochs[-1] - span_start[first] < 1.0 - 1e-9:
        first -= 1
    w = weights[first:]
    value = float(np.average(acc[first:], weights=w)) if w.sum() > 0 else float(acc[-1])
    images = math.nan
    if {"world_size", "local_batch"} <= set(ordered.columns):
        images = float(w.sum() * ordered["world_size"].iloc[-1] * ordered["local_batch"].iloc[-1])
    return value, images


def _standard_error(values: pd.Series, images: pd.Series | None) -> float:
    """The standard error (points) of a side's mean accuracy: its seeds' measured spread
    (sd / sqrt(n)), floored by the binomial sampling error of the images each value counts
    (sqrt(p (1 - p) / N) / sqrt(n)); 0 where neither is known."""
    vals = values.astype(float).dropna()
    if vals.empty:
        return 0.0
    n = len(vals)
    spread = float(vals.std(ddof=1)) / math.sqrt(n) if n > 1 else 0.0
    sampling = 0.0
    if images is not None:
        counts = images.astype(float).dropna()
        if not counts.empty and counts.min() > 0:
            p = min(max(float(vals.mean()) / 100.0, 0.0), 1.0)
            sampling = 100.0 * math.sqrt(p * (1 - p) / float(counts.mean())) / math.sqrt(n)
    return max(spread, sampling)


def _train_column(side: pd.DataFrame) -> str:
    """The training accuracy a side is judged by: over its last epoch where `final_rows` gave
    it, else the last record's (hand-made or older final records)."""
    return "train_acc_epoch" if "train_acc_epoch" in side else "train_acc"


def underfit_margin(a: pd.DataFrame, b: pd.DataFrame) -> float:
    """Points by which side ``a``'s mean training top-1 must fall below side ``b``'s mean test
    top-1 before ``a`` counts as underfit: `UNDERFIT_Z` standard errors of the difference of the
    two means (`_standard_error`: the seeds' spread, floored by the binomial error of the
    images counted -- a's training images over its last epoch, b's test images)."""
    se_a = _standard_error(a[_train_column(a)], a.get("train_images_epoch"))
    se_b = _standard_error(b["test_acc"], b.get("test_images"))
    return UNDERFIT_Z * math.hypot(se_a, se_b)


def regime(sides: Mapping[str, pd.DataFrame], *, pairs: Sequence[tuple[str, str]] | None = None,
           bound: float = REGIME_MOVE, slope: float = REGIME_SLOPE) -> Verdict | None:
    """`NOT_IN_REGIME` when a compared configuration is outside the claim's regime, else None.

    ``sides``: each compared configuration's final records over seeds (`final_rows`: columns
    ``train_acc`` (or ``train_acc_epoch``, preferred), ``test_acc``, ``tail_move`` and, where
    the records allow, ``phase_slope``). A side is unconverged when any seed's ``tail_move``
    exceeds ``bound`` or is unknown (too few records in the last tenth), or any seed's
    ``phase_slope`` exceeds ``slope`` (still rising before its last decay); side a is underfit
    against side b (each ordered pair of ``pairs``, default all) when a's mean training accuracy
    over its last epoch is below b's mean final test accuracy by more than `underfit_margin`."""
    problems = []
    given = list(sides)
    # a side with no finite accuracy is judged by the verdict (not measurable), not here
    sides = {name: rows for name, rows in sides.items()
             if "test_acc" in rows and rows["test_acc"].astype(float).notna().any()}
    for name, rows in sides.items():
        moves = rows["tail_move"].astype(float) if "tail_move" in rows else pd.Series([math.nan])
        if moves.isna().any():
            problems.append(f"{name} has too few records in its last tenth to show it converged")
        elif (moves > bound).any():
            problems.append(f"{name}'s test top-1 still moves {moves.max():.2f} points over its "
                            f"last tenth (> {bound:g}, {ours(REGIME_WHY)})")
        rises = rows["phase_slope"].astype(float) if "phase_slope" in rows else None
        if rises is not None and (rises > slope).any():
            problems.append(f"{name}'s test top-1 still rises {rises.max():.2f} points per tenth "
                            f"of training before its last lr decay (> {slope:g}, "
                            f"{ours(REGIME_SLOPE_WHY)})")
    names = list(sides)
    for a, b in pairs if pairs is not None else [(a, b) for a in names for b in names if a != b]:
        unknown = {a, b} - set(given)
        if unknown:
            raise ValueError(f"regime: pairs name {sorted(unknown)}, not among the sides "
                             f"{sorted(given)}")
        if a not in sides or b not in sides:  # a side without accuracy: the verdict says so
            continue
        col = _train_column(sides[a])
        train = float(sides[a][col].astype(float).mean())
        test = float(sides[b]["test_acc"].astype(float).mean())
        margin = underfit_margin(sides[a], sides[b])
        if train + margin < test:
            over = " over its last epoch" if col == "train_acc_epoch" else ""
            problems.append(f"{a} underfits: its train top-1{over} {train:.1f} % < {b}'s test "
                            f"top-1 {test:.1f} %" + (f" by more than the {margin:.2f}-point "
                                                     "margin of their noise" if margin else ""))
    if not problems:
        return None
    return Verdict(NOT_IN_REGIME, math.nan, math.nan, 0,
                   "; ".join(problems) + ": the runs measure what each fits in this budget, "
                   "not the claim")


def final_rows(records: pd.DataFrame, by: str = "run") -> pd.DataFrame:
    """Each run's last record (``records`` grouped by ``by``, in step order) with its
    `tail_move`, `phase_slope`, and its training top-1 over the last full epoch with the images
    it counts (`epoch_train_acc`: ``train_acc_epoch``, ``train_images_epoch``)."""
    ordered = records.sort_values("step", kind="stable") if "step" in records else records
    groups = ordered.groupby(by, sort=False)
    last = groups.tail(1).set_index(by)
    last["tail_move"] = groups.apply(tail_move, include_groups=False)
    last["phase_slope"] = groups.apply(phase_slope, include_groups=False)
    if "step" in ordered:
        fits = groups.apply(lambda g: pd.Series(epoch_train_acc(g),
                                                index=["train_acc_epoch", "train_images_epoch"]),
                            include_groups=False)
        last = last.join(fits)
    return last.reset_index()


def runs_digest(*sides: pd.DataFrame) -> str:
    """A short name for the set of runs a verdict rests on (their ``run_key``, `grid.run_grid`),
    written beside the verdict as ``runs`` so the README's summary counts two claims judged on
    the same runs once (Table 5's ResNet-20 cells are Figure 6's H = 1 and 8); empty where the
    records carry no key."""
    keys = sorted({str(k) for side in sides if "run_key" in side
                   for k in side["run_key"].dropna()})
    return hashlib.sha256(",".join(keys).encode()).hexdigest()[:12] if keys else ""


def overlap_premise(processes: int, cores: int | None, *, what: str = "value") -> Verdict | None:
    """*Not testable at this scale* when a claim that rests on communication overlapping
    compute (DDP's bucketed all-reduce during backward: the Dynamo post's 1 %, SlowMo's
    break-even rule) is timed with ``processes`` single-threaded workers on ``cores`` cores or
    fewer: every core computes, so gloo's communication waits for one and no overlap can be had.
    None where it can (more cores than processes), or where ``cores`` is not given."""
    if cores is None or processes < cores:
        return None
    return not_testable(f"{processes} single-threaded processes fill the {cores} cores, so "
                        "communication cannot overlap compute, the premise of the claim (the "
                        "emulated cluster of issue 63 or a GPU can give it)", what=what)


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
    model does; not testable at this budget if any part's runs are outside the claim's regime;
    otherwise inconclusive (or not testable / unavailable / not measurable when no part could
    be judged)."""
    outcomes = [v.outcome for v in verdicts]
    if NOT_HELD in outcomes:
        return NOT_HELD
    if outcomes and all(o == HELD for o in outcomes):
        return HELD
    if MODEL_DISAGREES in outcomes:
        return MODEL_DISAGREES
    if NOT_IN_REGIME in outcomes:  # a part the runs cannot carry: the claim cannot be decided
        return NOT_IN_REGIME
    if INCONCLUSIVE in outcomes or HELD in outcomes:
        return INCONCLUSIVE
    if outcomes and all(o == NOT_TESTABLE for o in outcomes):
        return NOT_TESTABLE
    if outcomes and all(o == UNAVAILABLE for o in outcomes):
        return UNAVAILABLE
    return NOT_MEASURABLE if outcomes else UNAVAILABLE


def combine_some(verdicts: Sequence[Verdict]) -> str:
    """One outcome for a claim that *some* part holds (Table 6's "some factors of global
    momentum could further slightly improve"): held if any part held; did not hold only if every
    part did not; otherwise as `combine` would judge the undecided parts (outside the regime,
    inconclusive, ...)."""
    outcomes = [v.outcome for v in verdicts]
    if HELD in outcomes:
        return HELD
    if outcomes and all(o == NOT_HELD for o in outcomes):
        return NOT_HELD
    return combine([v for v in verdicts if v.outcome != NOT_HELD])


def tested_text(means: Sequence[float], unit: str = "") -> str:
    """Our value of a claim's tested quantity, as the README shows it beside the source's: the
    mean over seeds, or for a claim of several parts (models, trick settings, momenta) the
    range of their means, finite ones only; "" when none was measured."""
    finite = sorted({round(float(m), 2) for m in means if m is not None and math.isfinite(m)})
    if not finite:
        return ""
    if len(finite) == 1:
        return _fmt(finite[0], unit)
    return f"{_fmt(finite[0], '')} to {_fmt(finite[-1], unit)}"


def check_measured(measured: pd.DataFrame, need: Iterable[str], what: str,
                   figure: str | None = None) -> pd.DataFrame:
    """``measured`` (an emulated-cluster CSV of ``localsgd bench cluster [--figure figure]``)
    with the columns ``need``, or one ValueError line naming those missing and the command."""
    missing = sorted(set(need) - set(measured))
    if missing:
        again = "localsgd bench cluster" + (f" --figure {figure}" if figure else "")
        raise ValueError(f"{what} lack columns {missing}: re-run `{again}` (as root)")
    return measured


def measured_link(measured: pd.DataFrame) -> float:
    """The link rate an emulated-cluster CSV measured (its first row's), NaN without one."""
    return float(measured["link_mbit"].iloc[0]) if "link_mbit" in measured else math.nan


def link_key(measured_mbit: float) -> str:
    """An emulated link's rate as a compare row's key: the measured rate to the nearest ten
    (96.4 measured for 100 asked reads "~100 Mbit/s"), so a re-measurement keeps the key."""
    if not math.isfinite(measured_mbit):
        return "unshaped links"
    return f"~{round(measured_mbit, -1):.0f} Mbit/s"


def claim_row(artifact: str, setting: str, metric: str, value: float | None, *, unit: str = "",
              note: str = "", claim: str | None = None,
              verdict: Verdict | str | None = None, tested: str = "",
              **extra: Any) -> dict[str, Any]:
    """One comparison row for ``papers/*/reported.csv`` keys (artifact, setting, metric) with our
    ``value``; with ``claim`` also the claim's text and its verdict ("<outcome>: <reason>"), and
    ``tested`` (`tested_text`) where the row's value is not the claim's tested quantity (a
    claim on a difference placed on one configuration's accuracy row).
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
        # "None" case-sensitive: the word "none" is prose
        if re.search(r"\bnan\b", text, re.IGNORECASE) or re.search(r"\bNone\b", text):
            raise ValueError(f"verdict {text!r} contains nan or None")
        row["claim"], row["verdict"], row["rule"] = claim, text, RULE
        if tested:
            row["tested"] = tested
    return row
