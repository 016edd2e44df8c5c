"""The straggler explorer (`localsgd.paper.explore`, notebook explore_stragglers): the redraw behind
its sliders works at the sliders' extremes, fast enough to follow a slider, and says what the
timing model says (free communication and no stragglers: nothing beats synchronous SGD)."""

from __future__ import annotations

import itertools
import time

import matplotlib.pyplot as plt
import pytest

from localsgd.paper import explore

BLOG = {"workers": 256, "gpus_per_node": 4, "H": 2, "Hb": 4, "straggler_rate": 0.01,
        "straggler_s": 1.0, "step_ms": 55.0, "model_mb": 45.0, "inter_gbps": 32.0,
        "intra_gbps": 100.0, "steps": 300}
# the notebook's slider ranges (explore_stragglers.ipynb, last cell)
EXTREMES = {"straggler_rate": (0.0, 0.3), "straggler_s": (1e-3, 10.0), "H": (1, 32),
            "Hb": (1, 16), "gpus_per_node": (1, 64), "inter_gbps": (0.1, 1000.0),
            "intra_gbps": (1.0, 3162.0), "step_ms": (1.0, 1000.0), "model_mb": (0.1, 3162.0)}


@pytest.mark.parametrize("low", [True, False])
def test_redraw_at_every_slider_extreme(low):
    fig = None
    for name, (lo, hi) in EXTREMES.items():
        fig, df, _ = explore.chart(fig=fig, **{**BLOG, "steps": 50, name: lo if low else hi})
        point = df[df.point]
        assert point.speedup.notna().all() and (point.speedup > 0).all(), (name, point)
        assert len(fig.axes) == 2 and fig.axes[0].patches  # bars drawn
        fig.canvas.draw()  # renders without error (log axes, labels, empty sweeps)
    plt.close(fig)


def test_all_extremes_together_and_the_schedules_offered():
    for combo in itertools.product(*[(lo, hi) for lo, hi in EXTREMES.values()]):
        if combo[0] == 0.0 or combo[2] == 1:  # keep the product small: 2^7 cases
            continue
        values = dict(zip(EXTREMES, combo, strict=True))
        names = [s.name for s in explore.schemes(256, values["gpus_per_node"], values["H"],
                                                 values["Hb"])]
        assert names[0] == "sync" and len(names) == len(set(names))
        assert any(n.startswith("hier") for n in names) == (
            values["Hb"] > 1 and 1 < values["gpus_per_node"] < 256)
    df = explore.predict(**{**BLOG, "steps": 30, "Hb": 1})
    assert set(df.scheme) == {"sync", "local H=2"}


def test_redraw_is_fast_and_free_communication_does_not_beat_sync(slowdown):
    explore.chart(**BLOG)  # warm caches (schedule plans, fonts)
    t0 = time.perf_counter()
    fig, df, _ = explore.chart(**BLOG)
    fig.canvas.draw()
    total = time.perf_counter() - t0
    plt.close(fig)
    # ~0.3-0.5 s idle; the bound moves with this machine's measured speed (conftest.slowdown)
    assert total < 2.0 * slowdown, (total, slowdown)
    calm = explore.predict(**{**BLOG, "straggler_rate": 0.0, "inter_gbps": 1e6,
                              "intra_gbps": 1e6, "latency_s": 0.0, "rates": ()})
    assert calm.speedup.max() == pytest.approx(1.0)
    # the blog's setting: stalls make every averaging schedule beat synchronous SGD
    point = df[df.point].set_index("scheme").speedup
    assert (point.drop("sync") > 1.2).all(), point
