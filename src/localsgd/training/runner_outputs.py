"""A run's output folder (`localsgd.training.runner`, ``localsgd train``): records.csv, timing.csv
(one row per step x worker, split into compute / waiting / communication by
`localsgd.timing.stragglers.split_waiting`) and summary.json, and the summary's printout."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from localsgd.timing.stragglers import split_waiting, timing_summary

__all__ = ["format_summary", "write_outputs"]


def write_outputs(out: Path, records, timeline_rows: list[dict] | None, group_sizes: list[int],
                  meta: dict) -> dict:
    """records.csv, timing.csv (one row per step x worker) and summary.json; returns the
    summary (steps/s, compute / waiting / communication shares, bytes per level)."""
    out.mkdir(parents=True, exist_ok=True)
    records.to_csv(out / "records.csv", index=False)
    summary = dict(meta)
    if timeline_rows:
        df = split_waiting(pd.DataFrame(timeline_rows), group_sizes)
        df.sort_values(["step", "rank"]).to_csv(out / "timing.csv", index=False)
        summary.update(timing_summary(df, group_sizes))
    summary["final_train_loss"] = float(records.train_loss.iloc[-1])
    summary["final_test_acc"] = float(records.test_acc.iloc[-1])
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def format_summary(s: dict) -> str:
    workers = s.get("workers", s.get("world_size"))
    lines = [f"{s.get('engine', '?')} engine, {workers} workers, {s.get('steps', '?')} steps"]
    if "steps_per_s" in s:
        lines.append(f"  {s['steps_per_s']:.2f} steps/s (median step {1e3 * s['median_step_s']:.1f}"
                     f" ms); worker time: compute "
                     f"{100 * s['compute_share']:.1f} %, waiting {100 * s['wait_share']:.1f} %, "
                     f"communication {100 * s['comm_share']:.1f} %; {s['stalls']} stalls "
                     f"({s['stall_seconds']:.1f} s)")
        levels = sorted(k for k in s if k.startswith("bytes_l"))
        lines.append("  bytes all-reduced per level (sum over workers): " + ", ".join(
            f"l{k[7:]} (groups of {s['group_l' + k[7:]]}) {s[k] / 1e6:.1f} MB" for k in levels))
    lines.append(f"  final train loss {s['final_train_loss']:.4f}, test acc "
                 f"{s['final_test_acc']:.1f} %")
    return "\n".join(lines)
