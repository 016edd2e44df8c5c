"""The PyTorch hierarchical-SGD blog's benchmark (seed 000, "Experimental Setup"): its scheme
names per GPU count and the HSGD speed-up ranges its text reports, for the wall-clock model
(`localsgd.timing.simulate`)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from localsgd.timing.simulate import Scheme, simulate

__all__ = ["BLOG_HSGD", "BLOG_LOCAL", "BLOG_RANGES", "blog_schemes", "simulate_seeds"]

BLOG_LOCAL = ("local:2", "local:4", "local:8")
BLOG_HSGD = {  # "HSGD p1-g1,p2-g2,..." configurations per GPU count, as the blog names them
    64: ("hsgd:2-8,4-32,8-64", "hsgd:4-32,8-64"),
    128: ("hsgd:2-8,4-32,8-128", "hsgd:4-32,8-128"),
    256: ("hsgd:1-4,2-16,4-64,8-256", "hsgd:2-8,4-64,8-256", "hsgd:4-16,8-256"),
}
BLOG_RANGES = {64: (2.08, 2.45), 128: (2.57, 2.68), 256: (2.63, 3.25)}  # HSGD speed-ups (text)


def blog_schemes(workers: int) -> list[str]:
    """sync, local SGD every 2/4/8 steps and the blog's HSGD configurations for ``workers``
    (other counts: the 256-GPU hierarchy's shape scaled to ``workers``)."""
    hsgd = BLOG_HSGD.get(workers)
    if hsgd is None:
        raise ValueError(f"the blog lists HSGD configurations for {sorted(BLOG_HSGD)} GPUs, "
                         f"not {workers}")
    return ["sync", *BLOG_LOCAL, *hsgd]


def simulate_seeds(schemes: Sequence[Scheme | str], seeds: Sequence[int], **kwargs
                   ) -> pd.DataFrame:
    """`simulate` once per seed (new compute and stall draws), rows concatenated."""
    if not seeds:
        raise ValueError("seeds must not be empty")
    return pd.concat([simulate(schemes, seed=int(s), **kwargs) for s in seeds],
                     ignore_index=True)
