"""The straggler explorer (notebook ``explore_stragglers``): predicted speed-ups
of local and hierarchical SGD over synchronous SGD for one cluster, redrawn from
`localsgd.timing.simulate` whenever a slider moves.

`chart` is the one call: it simulates the schedules for the given cluster and stragglers (left
panel: speed-up per schedule at the chosen straggler rate; right panel: the same schedules over a
range of straggler rates, the chosen one marked) and returns the figure, the data and the seconds
the redraw took. The schedules are synchronous SGD (DDP), local SGD every H and every H·H^b
updates, and Lin et al.'s hierarchical local SGD (Algorithm 2: nodes of ``gpus_per_node`` average
every H updates, the world every H·H^b) — the question the PyTorch hierarchical-SGD blog answers
for its cluster: does the node level pay on this hardware?
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from localsgd.timing.cluster import Cluster
from localsgd.timing.scheme import Scheme
from localsgd.timing.simulate import simulate
from localsgd.timing.stragglers import Stragglers

__all__ = ["DEFAULT_RATES", "chart", "draw", "predict", "schemes"]

DEFAULT_RATES = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3)  # the right panel (log axis)


def schemes(workers: int, gpus_per_node: int, H: int, Hb: int) -> list[Scheme]:
    """sync, local:H, local:H·H^b and the hierarchy (nodes every H, world every H·H^b) when a
    node is a proper subgroup and H^b > 1; duplicates dropped (e.g. H^b = 1)."""
    out = [Scheme.sync(), Scheme.local(H, name=f"local H={H}")]
    if Hb > 1:
        out.append(Scheme.local(H * Hb, name=f"local H={H * Hb}"))
        if 1 < gpus_per_node < workers:
            out.append(Scheme.paper(H, gpus_per_node, Hb,
                                    name=f"hier: node every {H}, world every {H * Hb}"))
    return out


def predict(*, workers: int, gpus_per_node: int, H: int, Hb: int, straggler_rate: float,
            straggler_s: float, step_ms: float, model_mb: float, inter_gbps: float,
            intra_gbps: float, latency_s: float = 50e-6, steps: int = 300, jitter: float = 0.0,
            seed: int = 0, rates=DEFAULT_RATES, **model_options) -> pd.DataFrame:
    """`simulate` rows for the chosen straggler rate (``point=True``) and for each of ``rates``
    (the right panel), same compute draws throughout (``seed``)."""
    if workers % gpus_per_node and workers > gpus_per_node:
        raise ValueError(f"workers={workers} is not a multiple of gpus_per_node={gpus_per_node}")
    gpn = min(gpus_per_node, workers)
    cluster = Cluster(gpus_per_node=gpn, inter_gbps=inter_gbps, intra_gbps=intra_gbps,
                      latency_s=latency_s)
    chosen = schemes(workers, gpn, H, Hb)
    frames = []
    for rate, point in [(straggler_rate, True)] + [(r, False) for r in rates if r > 0]:
        df = simulate(chosen, workers=workers, steps=steps, cluster=cluster, compute_ms=step_ms,
                      jitter=jitter, stragglers=Stragglers(straggler_s, rate, seed=seed),
                      model_mb=model_mb, seed=seed, **model_options)
        frames.append(df.assign(point=point))
    return pd.concat(frames, ignore_index=True)


def draw(df: pd.DataFrame, title: str = "", fig=None):
    """The explorer's two panels from `predict` rows (a new figure unless ``fig`` is given)."""
    import matplotlib.pyplot as plt  # deferred: only drawing needs it (predict does not)

    if fig is None:
        from localsgd.paper.notebook import print_style

        print_style()
        fig = plt.figure(figsize=(7.5, 3.2))
    fig.clear()
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.15]})
    point = df[df.point]
    names = list(point.scheme)
    colors = dict(zip(names, plt.get_cmap("tab10").colors, strict=False))
    y = np.arange(len(point))[::-1]
    left.barh(y, point.speedup, color=[colors[n] for n in names])
    for yi, (s, ms) in enumerate(zip(point.speedup, point.step_ms, strict=True)):
        left.text(s, y[yi], f" {s:.2f}x ({ms:.0f} ms/step)", va="center", fontsize=7)
    left.axvline(1.0, color="black", lw=0.8)
    left.set_yticks(y, names, fontsize=7)
    left.set_xlim(0, max(1.2, float(point.speedup.max()) * 1.7))
    rate = float(point.straggler_rate.iloc[0])
    left.set(xlabel="predicted speed-up over synchronous SGD",
             title=f"at straggler rate {100 * rate:g} %")
    sweep = df[~df.point]
    for name, part in sweep.groupby("scheme", sort=False):
        right.plot(100 * part.straggler_rate, part.speedup, marker="o", ms=3,
                   color=colors.get(name), label=name)
    if rate > 0:  # a log axis has no 0
        right.scatter(100 * point.straggler_rate, point.speedup,
                      color=[colors[n] for n in names], edgecolor="black", zorder=3, s=45)
    right.axhline(1.0, color="black", lw=0.8)
    right.set_xscale("log")
    # colours as in the left panel (no legend: it would cover the curves)
    right.set(xlabel="straggler rate per worker and step (%)", ylabel="predicted speed-up",
              title="over straggler rates (colours as left; circled: chosen rate)")
    if title:
        fig.suptitle(title, fontsize=8, wrap=True)
    # fixed margins: tight_layout would measure every label again at each redraw (~0.1 s)
    fig.subplots_adjust(left=0.22, right=0.98, bottom=0.16, top=0.80, wspace=0.3)
    return fig


def chart(fig=None, label: str = "", **params):
    """`predict` + `draw`: (figure, data, seconds for both). ``params`` are `predict`'s;
    ``label`` ends the title (e.g. the notebook's mode)."""
    t0 = time.perf_counter()
    df = predict(**params)
    p = params
    title = (f"{p['workers']} workers, {p['gpus_per_node']} per node; step {p['step_ms']:g} ms, "
             f"model {p['model_mb']:g} MB; {p['inter_gbps']:g} Gbit/s between nodes, "
             f"{p['intra_gbps']:g} inside; stalls {p['straggler_s']:g} s at "
             f"{100 * p['straggler_rate']:g} %; H={p['H']}, H^b={p['Hb']}; "
             f"{p.get('steps', 300)} steps [timing model prediction{label}]")
    fig = draw(df, title, fig)
    return fig, df, time.perf_counter() - t0


def plotted(df: pd.DataFrame, params: dict) -> str:
    """One JSON line: ``params`` and each scheme's speed-up at the chosen point, as plotted --
    what the browser test compares with `predict` for the slider's new value."""
    import json

    point = df[df.point]
    return json.dumps({"params": params,
                       "speedup": {str(s): float(v) for s, v in zip(point.scheme, point.speedup)}})
