"""Per-run progress of a notebook's training grid, shown on the harness's console.

A papermill kernel's output lands in the executed notebook, not on the console, so a converged
notebook of hours would show one notebook bar and nothing else. `experiments.grid.run_grid`
appends a line per run start and end (`record`) to the file named by ``LOCALSGD_RUN_PROGRESS``
(set by `localsgd.paper.reproduce.run_notebook`), and the harness prints each as it appears
(`Follower`): ``table05_models: run 4/6 (local_steps=8, seed=0) trained in 812 s, test top-1
79.3 %``.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Self

from localsgd.paths import append_event

ENV = "LOCALSGD_RUN_PROGRESS"

# training images per second of wall time (evaluation each epoch included) of converged mode's
# proxy: Table 5's ResNet-20 at width 0.5, K = 2, H = 1, B_loc = 128, all of CIFAR-10, two host
# threads: 999,936 images in 791 s on the project's 2-core AMD EPYC (AVX2), 2026-11-26
CONVERGED_IMAGES_PER_S = 1264.0
# a large local batch trains slower per image on the CPU: B_loc = 2,048 took 877 s against
# B_loc = 128's 471 s for the same 20 epochs of the proxy (Table 1's comparison, issue 31's
# measurement on the same AMD EPYC); between the two, log-linear in B_loc
LARGE_BATCH = 2048
LARGE_BATCH_SLOWDOWN = 877 / 471


def proxy_seconds(images: int, local_batch: int = 128) -> float:
    """About how many seconds ``images`` training images of converged mode's proxy take on 2
    CPU cores at local batch ``local_batch``."""
    share = math.log2(max(local_batch, 128) / 128) / math.log2(LARGE_BATCH / 128)
    return images * (1 + (LARGE_BATCH_SLOWDOWN - 1) * min(share, 1.0)) / CONVERGED_IMAGES_PER_S


def proxy_time(seconds: float) -> str:
    """``seconds`` of `proxy_seconds`, said with the rates they come from."""
    hours = seconds / 3600
    when = f"{hours:.1f} h" if hours >= 1 else f"{hours * 60:.0f} min"
    return (f"about {when} at {CONVERGED_IMAGES_PER_S:,.0f} images/s, {LARGE_BATCH_SLOWDOWN:.2f}x "
            f"longer per image at B_loc = {LARGE_BATCH:,} (the converged proxy on 2 CPU cores; a "
            "slower machine takes longer)")


def remaining(seconds_so_far: float, images_done: int, images_left: int) -> str:
    """The time the runs still to train take at the rate the trained ones had on this machine."""
    if images_done <= 0 or images_left <= 0:
        return ""
    minutes = images_left * seconds_so_far / images_done / 60
    return f"; the rest ({images_left:,} images) about {minutes:.0f} min at this machine's rate"


def record(kind: str, **fields: Any) -> None:
    """Append one event ("run" at a run's start, "run_done" at its end) to the progress file,
    if the harness named one."""
    path = os.environ.get(ENV)
    if path:
        append_event(path, kind, **fields)


def varying(configs: Sequence[Any]) -> list[str]:
    """The fields (of dataclass ``configs``) whose value differs between configs: what tells
    the runs of one grid apart."""
    if len(configs) < 2:
        return []
    names = list(configs[0].__dataclass_fields__)
    return [n for n in names if len({repr(getattr(c, n)) for c in configs}) > 1]


def describe(config: Any, fields: Sequence[str]) -> str:
    return ", ".join(f"{n}={getattr(config, n)}" for n in fields)


def format_event(notebook: str, event: dict) -> str:
    """One console line for a progress event."""
    head = f"{notebook}: run {event['index']}/{event['runs']}"
    what = f" ({event['what']})" if event.get("what") else ""
    if event["kind"] == "run":
        return f"{head}{what} {'cached' if event.get('cached') else 'training'}"
    acc = event.get("test_acc")
    acc_text = f", test top-1 {acc:.2f} %" if isinstance(acc, (int, float)) else ""
    how = "read from the cache" if event.get("cached") else f"trained in {event['seconds']:.0f} s"
    return f"{head}{what} {how}{acc_text}"


class Follower:
    """Print (``emit``) each event a kernel appends to ``path`` while the harness waits on it:
    a thread polling every ``every`` seconds; `stop` prints what is left and joins it."""

    def __init__(self, path: Path, notebook: str, emit: Callable[[str], None],
                 every: float = 2.0) -> None:
        self.path, self.notebook, self.emit, self.every = Path(path), notebook, emit, every
        self._offset = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self._read()

    def _loop(self) -> None:
        while not self._done.wait(self.every):
            self._read()

    def _read(self) -> None:
        if not self.path.is_file():
            return
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        complete = data[:data.rfind(b"\n") + 1]  # a line still being written waits
        self._offset += len(complete)
        for line in complete.decode("utf-8", errors="replace").splitlines():
            if line.strip():
                try:
                    self.emit(format_event(self.notebook, json.loads(line)))
                except (ValueError, KeyError):
                    continue  # not ours: skip the line, keep following
