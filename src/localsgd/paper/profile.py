"""Where a notebook's time goes: ``localsgd reproduce --profile FILE``.

While a notebook runs under the profile, every `localsgd.training.loop.train` run (through its
``on_phases`` hook: `on_train_phases` for the results cache's runs, the runner's ``--phases
FILE`` for torchrun workers, which `experiments.timing_validation.launch` passes) and every saved
figure appends one JSON line to the file named by ``LOCALSGD_PROFILE`` (``record``). After the
notebook, `notebook_row` joins those lines with papermill's per-cell durations in the executed
notebook and the harness's wall time into one row of phases:

* ``kernel_start``: harness wall time not spent in any cell (kernel launch, papermill);
* ``imports``: the notebook's first code cell after its parameters (``notebook.params``, torch,
  the package, plotting libraries) less the training, launches and saving inside it;
* ``launch``: multi-process launches (torchrun in `experiments.timing_validation.launch`,
  spawned workers in `bench.ddp.run` and `experiments.timing_validation.queue_experiment`)
  less their rank-0 training and compilation: process start-up, imports, rendezvous, and the
  benchmark's or queue test's own timed steps;
* ``compile``: ``torch.compile`` time those launches report (the first compiled step);
* training, from `train` (in-process runs, plus rank 0 of each torchrun world): ``setup`` (data
  set load, engine build), ``data`` (batches: indexing, augmentation, loader waits),
  ``compute`` (forward + backward + optimizer step, summed over the process's workers; on
  CUDA the host's wait for the device), ``engine`` (the rest of each engine step: averaging,
  outer steps, Python; on CUDA the host's whole time in the steps), ``evaluate``
  (the averaged model on the test set), ``loop`` (records, checkpoints, progress);
* ``convex``: the convex simulator (w8a load, f*, Figure 4/5 grids: `profile.timed`);
* ``save``: figures, CSVs and provenance written by ``Session.save``;
* ``other``: cell time left over: tables, plots drawn inline, claims.

The phases are wall seconds on this machine and sum to the notebook's total.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from localsgd.paths import append_event

F = TypeVar("F", bound=Callable[..., Any])

ENV = "LOCALSGD_PROFILE"

# `localsgd.training.state.LOOP_PHASES` (named again here: importing the loop would import torch
# into every harness process; tests/test_profile.py checks the two agree)
TRAIN_PHASES = ("setup", "data", "compute", "engine", "evaluate", "loop")
COLUMNS = ("notebook", "total", "kernel_start", "imports", "launch", "compile", "convex", "runs",
           "updates", *TRAIN_PHASES, "save", "other")


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def record(kind: str, **fields: Any) -> None:
    """Append one event (``kind``: "train", "launch" or "save") to the profile file, if one is set;
    one short ``write`` in append mode, so processes sharing the file do not interleave lines."""
    path = os.environ.get(ENV)
    if path:
        append_event(path, kind, **fields)


def on_train_phases() -> Callable[[dict], None] | None:
    """`localsgd.training.loop.train`'s ``on_phases`` hook under a profile (records a "train"
    event), else None."""
    return (lambda phases: record("train", **phases)) if enabled() else None


_depth = 0  # `timed` functions running in this process: only the outermost one records


def timed(kind: str) -> Callable[[F], F]:
    """Decorator: each outermost call records a ``kind`` event with its seconds (the convex
    simulator's entry points, which notebooks call inside their setup cell)."""
    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            global _depth
            if not enabled():
                return fn(*args, **kwargs)
            t0, _depth = time.perf_counter(), _depth + 1
            try:
                return fn(*args, **kwargs)
            finally:
                _depth -= 1
                if _depth == 0:
                    record(kind, seconds=time.perf_counter() - t0, function=fn.__qualname__)
        return inner  # type: ignore[return-value]
    return wrap


def read_events(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _epoch(stamp: str | None) -> float | None:
    if not stamp:
        return None
    return datetime.datetime.fromisoformat(stamp).timestamp()  # Python >= 3.11 reads "Z"


def cell_seconds(executed: Path) -> tuple[list[float], tuple[float, float] | None]:
    """(duration of every code cell, (start, end) epoch seconds of the first code cell after
    the parameters: the notebook's setup cell) from papermill's metadata."""
    nb = json.loads(executed.read_text())
    durations, setup, after_params = [], None, False
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        meta = cell.get("metadata", {}).get("papermill", {}) or {}
        durations.append(float(meta.get("duration") or 0.0))
        tags = cell.get("metadata", {}).get("tags", [])
        if "parameters" in tags or "injected-parameters" in tags:
            after_params = True
        elif after_params:
            start, end = _epoch(meta.get("start_time")), _epoch(meta.get("end_time"))
            setup = (start, end) if start is not None and end is not None else None
            after_params = False
    return durations, setup


def _seconds(event: dict) -> float:
    return (sum(event[p] for p in TRAIN_PHASES) if event["kind"] == "train"
            else event["seconds"])


def notebook_row(nb_id: str, total: float, executed: Path, events: list[dict]) -> dict:
    """One notebook's phases (seconds; see the module docstring); they sum to ``total``.

    ``imports`` is the setup cell's time minus the training and saving that ran inside it
    (events are placed on the cell by their wall-clock end and duration)."""
    cells, setup = cell_seconds(executed) if executed.is_file() else ([], None)
    runs = [e for e in events if e["kind"] == "train" and e.get("first_rank", 0) == 0]
    launches = [e for e in events if e["kind"] == "launch"]
    # in-process time on the kernel's clock: a launch covers its workers' runs
    counted = ([e for e in runs if not e.get("torchrun")] + launches
               + [e for e in events if e["kind"] in ("save", "convex")])
    imports = 0.0
    if setup is not None:
        start, end = setup
        inside = sum(max(0.0, min(end, e["end"]) - max(start, e["end"] - _seconds(e)))
                     for e in counted)
        imports = max(end - start - inside, 0.0)
    row: dict[str, Any] = {"notebook": nb_id, "total": total,
                           "kernel_start": max(total - sum(cells), 0.0), "imports": imports,
                           "compile": sum(e.get("compile", 0.0) for e in launches),
                           "runs": len(runs), "updates": sum(e["updates"] for e in runs)}
    row["launch"] = max(sum(e["seconds"] for e in launches) - row["compile"]
                        - sum(_seconds(e) for e in runs if e.get("torchrun")), 0.0)
    for phase in TRAIN_PHASES:
        row[phase] = sum(e[phase] for e in runs)
    row["save"] = sum(e["seconds"] for e in events if e["kind"] == "save")
    row["convex"] = sum(e["seconds"] for e in events if e["kind"] == "convex")
    accounted = imports + row["launch"] + row["compile"] + row["convex"] + sum(row[p] for p in TRAIN_PHASES) + row["save"]
    row["other"] = max(sum(cells) - accounted, 0.0)
    return row


def table(rows: list[dict]) -> str:
    """A markdown table of `notebook_row`s, seconds rounded, a TOTAL row and each phase's
    share of the total."""
    if not rows:
        return "(no notebooks profiled)\n"
    num = [c for c in COLUMNS if c != "notebook"]
    total = {"notebook": "TOTAL", **{c: sum(r[c] for r in rows) for c in num}}
    share = {"notebook": "share of total", "runs": "", "updates": "",
             **{c: f"{100 * total[c] / max(total['total'], 1e-9):.0f} %" for c in num
                if c not in ("runs", "updates")}}

    def fmt(r: dict, c: str) -> str:
        v = r[c]
        return v if isinstance(v, str) else (f"{v:,.0f}" if c in ("runs", "updates")
                                             else f"{v:.1f}")

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in sorted(rows, key=lambda r: -r["total"]) + [total, share]:
        lines.append("| " + " | ".join(fmt(r, c) if c != "notebook" else r[c] for c in COLUMNS)
                     + " |")
    return "\n".join(lines) + "\n"
