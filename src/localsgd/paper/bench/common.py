"""What every benchmark shares: the machine it ran on and one way to print its result."""

from __future__ import annotations

import json
import os
import platform
from typing import Any

import numpy as np
import torch

__all__ = ["emit", "machine"]


def machine() -> dict[str, Any]:
    """What a benchmark ran on: CPU, cores, this process's torch threads, load, versions."""
    return {
        "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "load_avg_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(), "torch": torch.__version__,
        "numpy": np.__version__,
    }


def emit(out: dict[str, Any], as_json: bool, summary: str | None = None) -> None:
    """Print a benchmark's result: one JSON line with ``as_json``; otherwise ``summary`` (if
    given), then one ``key: value`` line per entry, nested dicts as ``outer.inner``."""
    if as_json:
        print(json.dumps(out, default=float))
        return
    if summary:
        print(summary)
    flat: dict[str, Any] = {}
    for key, value in out.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    width = max(map(len, flat), default=0)
    for key, value in flat.items():
        print(f"{key:>{width}}: {value}")
