"""§4.3 of Lin et al. (2020): synchronising inside nodes first makes synchronisation over a
heterogeneous cluster easier, and the gain grows with the cluster. Measured on the emulated
cluster (`localsgd.netcluster`; ``localsgd bench cluster --figure hierarchy``): flat local SGD
(the world averages every H = 2 updates) against hierarchical local SGD (nodes every 2, the
world every H · H^b = 8), nodes of 2 processes with a free loopback inside and a capped link
between them, 2, 4 and 8 nodes. The gain is flat's seconds per update over hierarchical's; the
claim is judged on its growth, the gain on the most nodes over the gain on 2, per repeat."""

from __future__ import annotations

import numpy as np
import pandas as pd

from localsgd.paper.experiments.claims import (
    check_measured,
    claim_row,
    link_key,
    measured_link,
    ours,
    verdict,
)

# the paper: synchronising inside nodes first makes synchronisation over a heterogeneous
# cluster easier, and the gain grows with its size (short, for the README's claims table)
CLAIM = "inner-node syncs first ease synchronisation over a heterogeneous cluster, more as it grows"


def table(measured: pd.DataFrame) -> pd.DataFrame:
    """Per node count and repeat: flat's and hierarchical's seconds per update and the gain."""
    check_measured(measured, {"nodes", "run", "repeat", "seconds_per_update"},
                   "§4.3's measurements", "hierarchy")
    wide = measured.pivot_table(index=["nodes", "repeat"], columns="run",
                                values="seconds_per_update").reset_index()
    if not {"flat", "hier"} <= set(wide.columns):
        raise ValueError("§4.3's measurements need both runs, flat and hier")
    return wide.assign(gain=wide["flat"] / wide["hier"])


def rows(measured: pd.DataFrame) -> list[dict]:
    """One value row per node count (the mean gain) and the claim's row on the growth."""
    tab = table(measured)
    link = measured_link(measured)
    out = [claim_row("Section 4.3", f"{n} nodes x 2, {link_key(link)}", "flat / hierarchical "
                     "time per update", float(g.gain.mean()), unit="x",
                     note="emulated cluster: H = 2 flat vs H = 2, H^b = 4; 50 ms emulated compute")
           for n, g in tab.groupby("nodes")]
    nodes = sorted(tab.nodes.unique())
    if len(nodes) < 2:
        return out
    small = tab[tab.nodes == nodes[0]].set_index("repeat").gain
    big = tab[tab.nodes == nodes[-1]].set_index("repeat").gain
    growth = (big / small).dropna().tolist()
    v = verdict(growth, 1.0, unit="x", over="repeats",
                what=f"gain on {nodes[-1]} nodes / gain on {nodes[0]}",
                origin=ours("'the gain grows': any growth, a ratio above 1"))
    out.append(claim_row(
        "Section 4.3", f"{nodes[-1]} vs {nodes[0]} nodes x 2, {link_key(link)}",
        "growth of the hierarchical gain", float(np.mean(growth)) if growth else None,
        unit="x", claim=CLAIM, verdict=v,
        note="emulated cluster: the gain is flat local SGD's (H = 2) seconds per update over "
             "hierarchical's (H = 2, H^b = 4); heterogeneous = a free loopback inside a node, "
             "a capped link between nodes; time only (no accuracy)"))
    return out
