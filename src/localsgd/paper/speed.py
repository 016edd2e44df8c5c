"""How long `localsgd reproduce` will take here: a fixed small workload timed in a few seconds,
and the committed per-notebook times scaled by it.

The machine that writes the committed ``figures/`` also writes ``figures/machine_speed.json``:
its probe time (the faster of a probe before and one after that run), its CPU, and the
harness's seconds per notebook (a fresh clone: empty results cache). Before a long run,
`estimate` times the same probe here and scales those seconds by the ratio of the two probe
times. The probe is what the notebooks mostly do -- ResNet-20 forward,
backward and SGD steps on the CPU -- so CPUs that differ in vector units (AVX2 vs AVX-512) or
clock move it as they move the notebooks; it cannot see a warm results cache (then the run is
faster than estimated) or another process sharing the cores (slower).
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SPEED_FILE = "machine_speed.json"
PROBE_REPEATS = 9


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def probe(repeats: int = PROBE_REPEATS) -> float:
    """Seconds of a fixed workload shaped like the notebooks' training, the fastest of
    ``repeats``: two width-0.5 ResNet-20s (one on a one-core machine) side by side on host
    threads, every op single-threaded on channels-last inputs, as `localsgd.training.loop` runs
    replicas on a CPU; 4 SGD steps each on 64 random 32-px images (float32) per repeat, after one
    untimed warm-up step (~4 s in all). Two at once also measures what two busy cores cost each
    other (shared caches, SMT). The fastest repeat, not the median: other processes only ever slow a
    repeat down, and a median of five once read 29 % slow at the start of a run whose notebooks
    then ran at the reference's speed (docs/profile.md)."""
    import torch  # deferred: the estimate is printed before anything else imports torch

    from localsgd.engines.common import host_map
    from localsgd.models import build_model

    gen = torch.Generator().manual_seed(0)
    n = min(2, os.cpu_count() or 1)
    models = [build_model("resnet20", num_classes=10, width=0.5) for _ in range(n)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for m in models]
    x = torch.randn(64, 3, 32, 32, generator=gen).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (64,), generator=gen)

    def steps(count: int) -> None:
        def one(i: int) -> None:
            for _ in range(count):
                opts[i].zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(models[i](x), y).backward()
                opts[i].step()

        host_map(one, range(n), n)

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        steps(1)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            steps(4)
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(saved)
    return min(times)


@dataclass(frozen=True)
class Estimate:
    seconds: float  # expected harness seconds of the planned notebooks here
    factor: float  # probe here / probe on the reference machine
    reference_cpu: str
    missing: tuple[str, ...]  # planned notebooks without a committed time (not counted)
    jobs: int = 1  # notebooks at once in the planned run
    reference_jobs: int = 1  # ... and in the run that wrote the reference

    def format(self) -> str:
        minutes = self.seconds / 60
        shown = f"{minutes:.0f}" if minutes >= 10 else f"{minutes:.1f}"
        text = (f"expected time: ~{shown} min (committed per-notebook times x "
                f"{self.factor:.2f}, this machine's speed probe against the reference "
                f"machine's, {self.reference_cpu}")
        if self.jobs > 1:
            text += f"; {self.jobs} notebooks at once"
        if self.jobs != self.reference_jobs:
            text += f" (the reference ran {self.reference_jobs} at once: a rougher estimate)"
        text += "; an empty results cache assumed)"
        if self.missing:
            text += f"; no committed time for {', '.join(self.missing)}"
        return text


def write_reference(path: Path, probe_seconds: float, seconds: dict[str, float], *,
                    jobs: int = 1, wall_seconds: float | None = None) -> Path:
    """Record this machine's probe and per-notebook harness seconds (``figures/`` runs only),
    with how many notebooks ran at once and the whole run's wall time."""
    from localsgd.paper.results import write_json

    return write_json({"probe_seconds": probe_seconds, "cpu": cpu_model(),
                       "cpu_count": os.cpu_count(), "notebook_seconds": seconds,
                       "total_seconds": round(sum(seconds.values()), 1), "jobs": jobs,
                       "wall_seconds": wall_seconds}, path)


def makespan(seconds: Iterable[float], slots: int) -> float:
    """Wall time of tasks run ``slots`` at once, longest first, each on the least-loaded slot
    (the order `localsgd.paper.reproduce.run` starts them in)."""
    loads = [0.0] * max(1, slots)
    for s in sorted(seconds, reverse=True):
        loads[loads.index(min(loads))] += s
    return max(loads)


def estimate(reference: Path, notebooks: Iterable[str], probe_seconds: float, *,
             jobs: int = 1, timed: Iterable[str] = ()) -> Estimate | None:
    """The expected harness seconds of ``notebooks`` here, or None without a reference file.
    With ``jobs`` > 1 the ``timed`` notebooks run one after another, the rest ``jobs`` at once
    (`makespan`), as `localsgd.paper.reproduce.run` schedules them."""
    if not reference.is_file():
        return None
    ref = json.loads(reference.read_text())
    factor = probe_seconds / ref["probe_seconds"]
    known, names = ref["notebook_seconds"], list(notebooks)
    ids = [i for i in names if i in known]
    timed = set(timed) if jobs > 1 else set(ids)
    total = (sum(known[i] for i in ids if i in timed)
             + makespan([known[i] for i in ids if i not in timed], jobs)) * factor
    return Estimate(total, factor, ref.get("cpu", "unknown CPU"),
                    tuple(i for i in names if i not in known), jobs, ref.get("jobs", 1))
