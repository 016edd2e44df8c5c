"""Figures 4 and 5 (§3.4): time to ε-accuracy per (K, H, B_loc), best step size per Appendix E.

Time model (§3.4: "count the number of stochastic gradient computations and communication rounds,
and assume that communication of the weights is 25× more expensive than a gradient
computation"). One time unit = one stochastic gradient computation *on one worker*. Workers
compute in parallel, so a local step costs B_loc units of wall time whatever K is, and every
averaging round costs ``comm_cost`` units (25 by default) during which no worker computes:

    time = steps · B_loc + comm_cost · (averaging rounds),   rounds = steps / H for flat local SGD.

With K = 1 there is nobody to talk to, so rounds cost nothing (a group of one does not
communicate). Hierarchical runs may give one cost per level. The total work, K · steps · B_loc
gradients, is reported too.

`fig4_claims` and `fig5_claims` build the figures' compare rows and verdicts (§3.4's claims);
their section comment says why the verdicts are the simulator's (``deterministic=True``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from localsgd.convex import objective
from localsgd.convex.gridsearch import grid_search
from localsgd.convex.objective import PAPER_FSTAR, LogisticProblem
from localsgd.convex.simulator import FAMILIES, TorchProblem, simulate
from localsgd.data import load_libsvm
from localsgd.paper import profile
from localsgd.paper.experiments.claims import claim_row, combine, verdict
from localsgd.topology import Topology

EPSILON = 0.005  # Appendix E target accuracy
# f* by Newton (the library's `objective.solve_fstar`), timed as convex work under a profile
solve_fstar = profile.timed("convex")(objective.solve_fstar)
COMM_COST = 25.0  # §3.4: one communication = 25 gradient computations


@dataclass(frozen=True)
class Config:
    """One point of the figures: K workers, local batch B_loc, H local steps (+ optional blocks)."""

    K: int
    B_loc: int
    H: int
    block_size: int | None = None
    block_steps: int = 1

    def topology(self) -> Topology:
        return Topology.from_paper(world_size=self.K, local_steps=self.H,
                                   block_size=self.block_size, block_steps=self.block_steps)


def time_units(steps: float, B_loc: int, rounds: Sequence[int], group_sizes: Sequence[int],
               comm_cost: float | Sequence[float] = COMM_COST) -> float:
    """§3.4 time: steps·B_loc gradient units + comm_cost per round of every level whose groups
    have more than one worker. ``comm_cost`` is one number or one per level."""
    costs = [comm_cost] * len(rounds) if np.isscalar(comm_cost) else list(comm_cost)
    if len(costs) != len(rounds):
        raise ValueError(f"comm_cost has {len(costs)} entries for {len(rounds)} levels")
    comm = sum(c * r for c, r, g in zip(costs, rounds, group_sizes) if g > 1)
    return steps * B_loc + comm


@profile.timed("convex")
def stopping_target(problem: LogisticProblem, fstar_source: str = "paper",
                    epsilon: float = EPSILON) -> tuple[float, float]:
    """(target f value, f* used). ``fstar_source``: "paper" uses Appendix E's printed f*
    (0.126433176216545, what the paper's runs stopped on); "computed" solves for the optimum."""
    if fstar_source == "paper":
        return PAPER_FSTAR + epsilon, PAPER_FSTAR
    if fstar_source == "computed":
        fstar = solve_fstar(problem)[0]
        return fstar + epsilon, fstar
    raise ValueError(f"fstar_source must be 'paper' or 'computed', got {fstar_source!r}")


def tune(tp: TorchProblem, config: Config, seeds: Sequence[int], target: float, *,
         centers: dict[str, int] | None = None, families: Sequence[str] = FAMILIES,
         max_steps: int = 100_000, rel_resolution: float = 0.05, cap_factor: float = 2.0,
         comm_cost: float | Sequence[float] = COMM_COST) -> tuple[dict, pd.DataFrame]:
    """Grid-search c for every family on one config; return (best row, all trials).

    A step size's score is the mean over seeds of the stopping step (inf if any seed fails).
    Runs are pruned once they pass ``cap_factor`` × the best score so far over both families
    (they cannot be the reported best: exact for one seed; with several seeds a pruned c could
    in principle still have had a better mean, which ``cap_factor`` = 2 makes unlikely). Within
    one batch the cap also tightens per family as its step sizes converge (``simulate``).
    """
    centers = centers or {"decreasing": -6, "constant": -2}
    topo = config.topology()
    trials: list[pd.DataFrame] = []
    best = [math.inf]  # best score over both families: Appendix E reports the better one

    def evaluate(points: list[tuple[str, int]]) -> dict[tuple[str, int], float]:
        cap = min(max_steps, cap_factor * best[0])
        df = simulate(tp, topo, config.B_loc, [p[0] for p in points],
                      [2.0 ** p[1] for p in points], seeds, target, max_steps=max_steps,
                      rel_resolution=rel_resolution, cap_steps=cap, cap_factor=cap_factor)
        df["exponent"] = [p[1] for p in points] * len(seeds)
        trials.append(df)
        out = {}
        for (fam, i), g in df.groupby(["family", "exponent"]):
            ok = (g["status"] == "converged").all()
            out[(fam, int(i))] = float(g["steps"].mean()) if ok else math.inf
        best[0] = min([best[0], *out.values()])
        return out

    initial = {fam: range(centers[fam] - 2, centers[fam] + 3) for fam in families}
    result = grid_search(evaluate, initial)
    trials_df = pd.concat(trials, ignore_index=True)
    fam = min(result, key=lambda f: result[f]["score"])
    row = {"K": config.K, "B_loc": config.B_loc, "H": config.H,
           "block_size": config.block_size, "block_steps": config.block_steps,
           "family": fam, "exponent": result[fam]["best"], "c": 2.0 ** result[fam]["best"],
           "steps": result[fam]["score"], "optimal": result[fam]["optimal"]}
    for f in families:
        row[f"best_exponent_{f}"] = result[f]["best"]
        row[f"steps_{f}"] = result[f]["score"]
        row[f"optimal_{f}"] = result[f]["optimal"]
    if math.isfinite(row["steps"]):
        win = trials_df[(trials_df.family == fam) & (trials_df.exponent == row["exponent"])
                        & (trials_df.status == "converged")]
        levels = range(topo.num_levels)
        rounds = [win[f"rounds_l{lv}"].mean() for lv in levels]
        sizes = [topo.levels[lv].group_size for lv in levels]
        row["rounds"] = float(sum(r for r, g in zip(rounds, sizes) if g > 1))
        row["resolution_steps"] = float(win["resolution"].max())
        row["time"] = time_units(row["steps"], config.B_loc, rounds, sizes, comm_cost)
    else:
        row.update(rounds=math.nan, resolution_steps=math.nan, time=math.inf)
    row["grads_per_worker"] = row["steps"] * config.B_loc
    row["total_grads"] = row["grads_per_worker"] * config.K
    row["n_trials"] = len(trials_df)
    return row, trials_df


def run_configs(tp: TorchProblem, configs: Sequence[Config], seeds: Sequence[int],
                target: float, *, progress: bool = True, **kw) -> pd.DataFrame:
    """Tune every config in order, warm-starting each grid at the previous config's optimum.

    ``progress`` shows a tqdm bar (a widget in Jupyter) that disappears when done."""
    rows, centers = [], None
    for cfg in tqdm(configs, desc="configs", leave=False, disable=not progress):
        row, _ = tune(tp, cfg, seeds, target, centers=centers, **kw)
        rows.append(row)
        centers = {f: int(row[f"best_exponent_{f}"]) for f in FAMILIES if f"best_exponent_{f}" in row}
    return pd.DataFrame(rows)


@profile.timed("convex")
def load_w8a_problem(dtype=None) -> tuple[LogisticProblem, TorchProblem]:
    """w8a as the Appendix E problem (λ = 1/n) and its torch twin (float32 SGD state by
    default, see ``simulator``'s note on precision; f is always evaluated in float64)."""
    A, b = load_libsvm("w8a")
    problem = LogisticProblem(A, b)
    return problem, TorchProblem(problem, dtype or torch.float32)


@profile.timed("convex")
def fig4_table(tp: TorchProblem, *, K: int, B_locs: Sequence[int], Hs: Sequence[int],
               seeds: Sequence[int], target: float, **kw) -> pd.DataFrame:
    """Figure 4: best time per (B_loc, H) at fixed K, and time relative to the best cell."""
    configs = [Config(K, B, H) for H in Hs for B in B_locs]
    df = run_configs(tp, configs, seeds, target, **kw)
    df["time_rel"] = df["time"] / df["time"].min()
    return df


@profile.timed("convex")
def fig5_table(tp: TorchProblem, *, Ks: Sequence[int], B_loc: int, Hs: Sequence[int],
               seeds: Sequence[int], target: float, **kw) -> pd.DataFrame:
    """Figure 5: speed-up time(K=1) / time(K, H) at fixed B_loc.

    With K = 1 averaging is a no-op and costs nothing, so every H is the same run; it is
    simulated once (H = 1) and shared by all H as the baseline.
    """
    base = run_configs(tp, [Config(1, B_loc, 1)], seeds, target, **kw).iloc[0]
    rows = []
    for H in Hs:
        configs = [Config(K, B_loc, H) for K in Ks if K > 1]
        df = run_configs(tp, configs, seeds, target, **kw) if configs else pd.DataFrame()
        if 1 in Ks:
            df = pd.concat([pd.DataFrame([{**base.to_dict(), "H": H}]), df], ignore_index=True)
        rows.append(df)
    out = pd.concat(rows, ignore_index=True)
    out["speedup"] = base["time"] / out["time"]
    return out


# --------------------------------------------------------------------------------------- claims
# Figures 4 and 5's compare rows and verdicts (`localsgd.paper.experiments.claims`). Seeds and spread:
# every cell of a table is the mean stopping step over the notebook's seeds at the step size
# that mean selects (Appendix E's grid search scores a c by it), so the tables hold no per-seed
# values to spread; the simulator is reproducible given its seeds and the problem is convex (no
# chaotic divergence between CPUs). Verdicts are therefore the simulator's (deterministic=True);
# the measurement's precision is the stopping resolution (f checked every rel_resolution of the
# elapsed steps, ~5 %), which each note states.

FIG4_THRESHOLDS = {64: 2.0, 256: 3.0}  # §3.4: (16, 16) "more than 2x" vs (64, 1), "3x" vs (256, 1)


def _cell(table: pd.DataFrame, **where) -> float | None:
    hit = table
    for col, val in where.items():
        hit = hit[hit[col] == val]
    return float(hit["time"].iloc[0]) if len(hit) else None


def fig4_claims(table: pd.DataFrame, fstar_computed: float, *, K: int, epsilon: float,
                n_seeds: int, rel_resolution: float) -> list[dict]:
    """Compare rows of Figure 4 (§3.4) and Appendix E's f*.

    ``table`` is `fig4_table`'s (one row per (B_loc, H) with ``time``: seed-averaged, tuned,
    see the section comment). Rows: f* (exact Newton solve, full scale, 1e-9 relative), and per
    B_loc ∈ {64, 256} with an H = 1 cell the time ratio (B_loc, 1) / (16, 16), judged against
    §3.4's "more than 2×" (64) and "3×" (256) as a deterministic simulator output. When either
    cell never reached the target (infinite time) the ratio is "not measurable"; a cell outside
    the grid gives no row (as the notebook always did).
    """
    rows = [claim_row("Appendix E", "w8a; lambda=1/n", "f*", fstar_computed,
                      note="Newton, ||grad f|| <= 1e-10, float64", scale="full", rel_tol=1e-9)]
    ref = _cell(table, B_loc=16, H=16)
    for B, threshold in FIG4_THRESHOLDS.items():
        other = _cell(table, B_loc=B, H=1)
        if ref is None or other is None:
            continue
        # a cell that missed the target has no time (inf: the step cap), hence no ratio
        ratio = other / ref if math.isfinite(other) and math.isfinite(ref) and ref > 0 \
            else math.nan
        claim = (f"(B_loc, H) = (16, 16) reaches epsilon at least {threshold:g}x faster than "
                 f"({B}, 1) at K = {K}")
        # each time is known to rel_resolution, so their ratio to about twice that
        v = verdict(ratio, threshold, deterministic=True, unit="x",
                    origin="the paper's: §4.1's round speed-ups read off its text",
                    what=f"time ({B}, 1) / time (16, 16)",
                    resolution=2 * rel_resolution * threshold)
        # the paper's numbers are round values read off its text; times carry the stopping
        # resolution (~rel_resolution), so the report's reproduction check allows 10 %
        rows.append(claim_row(
            "Figure 4", f"K={K}; B_loc={B}; H=1 vs B_loc=16; H=16", "time ratio", ratio,
            unit="x", rel_tol=0.1, claim=claim, verdict=v,
            note=f"epsilon={epsilon}; seeds={n_seeds}; stopping resolution {rel_resolution:.0%}"))
    return rows


def fig5_claims(table: pd.DataFrame, *, B_loc: int, Hs: Sequence[int], epsilon: float,
                n_seeds: int, K_small: int = 16, rel_resolution: float = 0.05) -> list[dict]:
    """Compare row of Figure 5 (§3.4): the best H at K = ``K_small`` (16, the key the paper's
    row joins on) with the claim "the largest H gives the best speed-up on a small number of
    workers, and its advantage fades for very large K".

    Two parts, both deterministic simulator outputs (see the section comment), combined with
    `claims.combine`: (1) at K_small, speed-up of the largest H / best speed-up of the other
    H's >= 1; (2) the largest H's advantage over the smallest H (ratio of speed-ups) is lower
    at the largest K than at the smallest K > 1. A part without finite speed-ups (a cell that
    missed the target, or a grid with one H or one K > 1) is "not measurable". No row when the
    grid has no K = K_small (as the notebook always did).

    Each stopping time is known to ``rel_resolution`` (the section comment), so part (1)'s ratio
    is known to about twice that: within it, H's that tie are not told apart (inconclusive).
    The row's value, "best H", is likewise the H whose speed-up lies alone within that band of
    the best; where several do (a tie), the value is empty (nothing to set beside the source's
    single H) and the note lists them.
    """
    at = table[table.K == K_small]
    if not len(at):
        return []
    h_max, h_min = max(Hs), min(Hs)

    def speedup(frame: pd.DataFrame, h: int) -> float:
        hit = frame[frame.H == h]["speedup"]
        return float(hit.iloc[0]) if len(hit) and np.isfinite(hit.iloc[0]) else math.nan

    others = [speedup(at, h) for h in Hs if h != h_max]
    others = [s for s in others if math.isfinite(s)]
    lead = speedup(at, h_max) / max(others) if others and max(others) > 0 else math.nan
    finite = at[np.isfinite(at.speedup)]
    # two speed-ups each known to rel_resolution differ by up to about twice that
    tied = finite[finite.speedup >= finite.speedup.max() * (1 - 2 * rel_resolution)] \
        if len(finite) else finite
    best_h = int(tied.H.iloc[0]) if len(tied) == 1 else None  # a tie names no single best H
    best_s = (f"{finite.speedup.max():.2f}; H within twice the {rel_resolution:.0%} stopping "
              "resolution of the best speed-up: " + ", ".join(
                  f"{int(r.H)} ({r.speedup:.2f}x)" for r in tied.sort_values("H").itertuples())
              if len(finite) else "none finite")
    v_best = verdict(lead, 1.0, deterministic=True, unit="x",
                     origin="the paper's: Fig. 5, the largest H is best at small K",
                     what=f"speed-up H={h_max} / best other H at K={K_small}",
                     resolution=2 * rel_resolution)
    ks = sorted(k for k in table.K.unique() if k > 1)

    def advantage(k: int) -> float:
        part = table[table.K == k]
        return speedup(part, h_max) / speedup(part, h_min)

    fade = advantage(ks[-1]) - advantage(ks[0]) if len(ks) > 1 and h_max != h_min else math.nan
    v_fade = verdict(fade, 0.0, higher_is_better=False, deterministic=True,
                     origin="the paper's: Fig. 5, the advantage shrinks as K grows",
                     what=f"(speed-up H={h_max} / H={h_min}) at K={ks[-1] if ks else '?'} minus "
                          f"at K={ks[0] if ks else '?'}")
    claim = (f"H = {h_max} gives the best speed-up on a small number of workers (K = {K_small}) "
             f"and its advantage over H = {h_min} fades for large K")
    text = f"{combine([v_best, v_fade])}: {v_best.reason}; {v_fade.reason}"
    return [claim_row("Figure 5", f"B_loc={B_loc}; K={K_small}", "best H", best_h,
                      claim=claim, verdict=text,
                      note=f"H grid {list(Hs)}; speed-up {best_s}; "
                           f"epsilon={epsilon}; seeds={n_seeds}")]
