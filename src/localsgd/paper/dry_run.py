"""Dry runs of paper mode: ``localsgd reproduce --mode paper --dry-run N``.

Every notebook's paper configuration is executed on the CPU -- its real grid of runs, each with
the paper's model at full size, the real K, B_loc, H, H^b, schedule, learning-rate rule and outer
step -- for N updates per run and one evaluation, then through the notebook's tables, plots and
claim code. Each configuration runs for one seed (`SEEDS`; ``--only`` notebooks that define
``n_seeds`` and ``--set n_seeds=K`` run K): another seed runs the same code on other random
numbers, and nothing a dry run computes is a result. With one seed the claims read
inconclusive; their multi-seed path runs in the converged files' tests at two seeds and in the
claims' unit tests. So a paper configuration that no longer builds, or a notebook that breaks on
the paper grid, fails on a machine without GPUs. What a dry run does not check: speed, and memory at
B_loc -- each worker's batch is cut to `BATCH` samples and the evaluation to `EVAL_IMAGES`
images (and timings such as SlowMo's break-even steps repeated at most N times) so that every
run of the grid fits a CI budget (`localsgd.memory` estimates memory at B_loc;
`localsgd.training.plan.check_replica_memory` stops a GPU run that would not fit). Nothing is
cached and nothing is written to ``figures/``.

Paper mode never executes the notebooks that need several nodes or a torchrun launch
(`localsgd.paper.reproduce.CLUSTER_ONLY`: they are reported as skipped with the commands to run
instead), in a dry run as in a real one. A dry run also skips `SKIP`'s notebooks, with the
reason: their paper mode is a CPU job too long for a dry run.
"""

from __future__ import annotations

import os

ENV = "LOCALSGD_DRY_RUN"
BATCH = 2  # samples per worker and update in a dry run
EVAL_IMAGES = 16  # test images of the one evaluation per run
SEEDS = 1  # n_seeds of every notebook that defines it, unless --set gives n_seeds

# Skipped by dry runs only (paper mode's own skips: `localsgd.paper.reproduce.CLUSTER_ONLY`).
SKIP = {
    "timing_validation": "paper mode launches 16 torchrun processes for 3 x 104 updates of "
                         "emulated compute (11 min on 2 cores); its quick mode is the same code",
    "fig04_convex_time": "the convex simulator's paper grid runs at full scale on a CPU and is "
                         "committed (figures/paper/, 10.7 min with Figure 5)",
    "fig05_convex_speedup": "as fig04_convex_time: committed at full scale in figures/paper/",
}


def updates() -> int | None:
    """N when this process runs inside a dry run (``LOCALSGD_DRY_RUN=N``), else None."""
    value = os.environ.get(ENV, "")
    if not value:
        return None
    n = int(value)
    if n < 1:
        raise ValueError(f"{ENV}={value!r}: a dry run needs at least 1 update per run")
    return n


def limit():
    """The `localsgd.training.loop.RunLimit` of a dry run (N updates, `BATCH` samples per worker and
    update, `EVAL_IMAGES` test images), or None outside one."""
    n = updates()
    if n is None:
        return None
    from localsgd.training.loop import (
        RunLimit,  # here: the harness imports this module without torch
    )

    return RunLimit(updates=n, batch=BATCH, eval_images=EVAL_IMAGES)
