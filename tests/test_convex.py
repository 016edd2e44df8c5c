"""Convex simulator (§3.4 / Appendix E): objective, f*, simulator vs reference, stopping, grid."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from localsgd.convex import gridsearch
from localsgd.convex.objective import PAPER_FSTAR, LogisticProblem, solve_fstar
from localsgd.convex.simulator import (
    FixedSampler,
    LocalSGDState,
    Sampler,
    TorchProblem,
    reference_local_sgd,
    simulate,
)
from localsgd.paper.experiments.convex import Config, time_units, tune
from localsgd.topology import Topology

torch.set_num_threads(1)


def synthetic(n=240, d=7, seed=0, dup=True) -> LogisticProblem:
    """Sparse binary features like w8a, noisy labels, some repeated and empty rows."""
    rng = np.random.default_rng(seed)
    A = (rng.random((n, d)) < 0.3).astype(np.float64)
    if dup:
        A[: n // 10] = A[n // 10 : 2 * (n // 10)]  # repeated rows
        A[-5:] = 0.0  # empty rows
    w = rng.normal(size=d) * 2
    b = np.where(A @ w + rng.normal(size=n) > 0.5, 1.0, -1.0)
    return LogisticProblem(A, b)


def test_gradient_and_hessian_match_finite_differences():
    p = synthetic()
    w = np.random.default_rng(1).normal(size=p.d)
    h = 1e-6
    fd = np.array([(p.value(w + h * e) - p.value(w - h * e)) / (2 * h) for e in np.eye(p.d)])
    np.testing.assert_allclose(p.grad(w), fd, rtol=1e-6, atol=1e-9)
    fdh = np.array([(p.grad(w + h * e) - p.grad(w - h * e)) / (2 * h) for e in np.eye(p.d)])
    np.testing.assert_allclose(p.hessian(w), fdh, rtol=1e-5, atol=1e-9)


def test_objective_stable_for_huge_margins():
    p = synthetic()
    w = np.full(p.d, 1e4)
    assert np.isfinite(p.value(w)) and np.all(np.isfinite(p.grad(w)))
    # batched evaluation agrees with one-at-a-time
    W = np.random.default_rng(2).normal(size=(3, p.d))
    np.testing.assert_allclose(p.value(W), [p.value(x) for x in W])


def test_torch_value_on_distinct_rows_equals_dense_objective():
    p = synthetic()
    tp = TorchProblem(p)
    W = np.random.default_rng(3).normal(size=(37, p.d))  # more than one block of 16 models
    np.testing.assert_allclose(tp.value(torch.from_numpy(W)).numpy(), p.value(W), rtol=1e-12)
    assert tp.value(torch.from_numpy(W[:0])).shape == (0,)


def test_fstar_newton_reaches_tolerance_and_is_reproducible():
    p = synthetic(n=400)
    f1, w1, info = solve_fstar(p)
    f2, w2, _ = solve_fstar(LogisticProblem(p.A.copy(), p.b.copy()))
    assert info["grad_norm"] <= 1e-10
    assert abs(f1 - f2) <= 1e-10 and np.array_equal(w1, w2)
    # it is a minimum: random perturbations only increase f
    rng = np.random.default_rng(4)
    assert all(p.value(w1 + 1e-3 * rng.normal(size=p.d)) > f1 for _ in range(5))


def _w8a():
    from localsgd.data import LIBSVM_DATASETS, cache_dir, data_dirs, load_libsvm

    spec = LIBSVM_DATASETS["w8a"]
    have = any((d / "w8a").is_file() for d in data_dirs()) or (
        cache_dir() / "libsvm" / f"w8a-{spec.sha256[:16]}.npz").is_file()
    if not have:
        pytest.skip("w8a not available (set LOCALSGD_DATA)")
    return load_libsvm("w8a")


def test_w8a_fstar_vs_paper():
    """Appendix E's f* is 2.5e-4 *above* the exact optimum of the stated objective (see notes):
    the solve is deterministic and lands there every time."""
    A, b = _w8a()
    p = LogisticProblem(A, b)
    f1, _, info = solve_fstar(p)
    f2, _, _ = solve_fstar(p)
    assert info["grad_norm"] <= 1e-10 and abs(f1 - f2) <= 1e-10
    assert 2.4e-4 < PAPER_FSTAR - f1 < 2.6e-4


@pytest.mark.parametrize(
    "topology",
    [Topology.from_paper(world_size=4, local_steps=3),
     Topology.from_paper(world_size=4, local_steps=2, block_size=2, block_steps=2)],
    ids=["flat-H3", "hier-H2-Hb2"],
)
def test_vectorized_equals_reference_step_for_step(topology):
    p = synthetic()
    tp = TorchProblem(p)
    S, K, B, T = 2, topology.world_size, 3, 13
    fams = ["decreasing", "constant", "decreasing"]
    cs = [2.0**-6, 2.0**-4, 2.0**-3]
    idx = np.random.default_rng(5).integers(p.n, size=(T, S, K, B))
    state = LocalSGDState(tp, topology, S, fams, cs)
    traj = []
    for t in range(T):
        state.step(torch.from_numpy(idx[t]))
        traj.append(state.W.clone())
    for s in range(S):
        for j, (fam, c) in enumerate(zip(fams, cs)):
            seen: list = []
            reference_local_sgd(p, topology, fam, c, idx[:, s],
                                callback=lambda t, W, out=seen: out.append(W.copy()))
            for t in range(T):
                np.testing.assert_allclose(traj[t][s, :, j].numpy(), seen[t], rtol=1e-12,
                                           atol=1e-14, err_msg=f"step {t + 1}")


def test_lazy_decay_folds_match_reference():
    """W = α V with α folded into V whenever it leaves ALPHA_RANGE: with a range so narrow that
    it folds every few steps (and blocks of steps of different lengths), still the reference."""
    p = synthetic()
    tp = TorchProblem(p)
    topology = Topology.from_paper(world_size=4, local_steps=2, block_size=2, block_steps=2)
    S, K, B, T = 2, 4, 3, 17
    fams, cs = ["decreasing", "constant"], [2.0**-2, 2.0**-3]
    idx = np.random.default_rng(7).integers(p.n, size=(T, S, K, B))
    state = LocalSGDState(tp, topology, S, fams, cs)
    state.ALPHA_RANGE = (0.9, 1.1)
    folds = []
    scales = state._scales

    def counting_scales(T, B):
        out = scales(T, B)
        folds.append(len(out[3]))
        return out

    state._scales = counting_scales
    for a, e in [(0, 1), (1, 6), (6, 7), (7, 17)]:
        state.run(idx[a:e])
    assert sum(folds) >= 3, folds
    for s in range(S):
        for j, (fam, c) in enumerate(zip(fams, cs)):
            W = reference_local_sgd(p, topology, fam, c, idx[:, s])
            np.testing.assert_allclose(state.W[s, :, j].numpy(), W, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(state.mean_model().numpy(), state.W.mean(1).numpy(), rtol=1e-12)


def test_h1_local_sgd_is_minibatch_sgd_with_batch_K_times_B():
    p = synthetic()
    tp = TorchProblem(p)
    K, B, T = 4, 2, 20
    idx = torch.randint(p.n, (T, 1, K, B), generator=torch.Generator().manual_seed(0))
    local = LocalSGDState(tp, Topology.from_paper(world_size=K, local_steps=1), 1,
                          ["constant"], [2.0**-4])
    mini = LocalSGDState(tp, Topology.from_paper(world_size=1, local_steps=1), 1,
                         ["constant"], [2.0**-4])
    for t in range(T):
        local.step(idx[t])
        mini.step(idx[t].reshape(1, 1, K * B))
        torch.testing.assert_close(local.W[0, :, 0], mini.W[0, 0, 0].expand(K, -1), rtol=1e-13,
                                   atol=1e-15)


def test_sampler_streams_depend_only_on_seed_and_runs_are_deterministic():
    a = Sampler(100, [3, 7], K=2, B=4).chunk(1, 5)
    b = Sampler(100, [7], K=2, B=4).chunk(1, 5)
    assert torch.equal(a[:, 1], b[:, 0])
    p = synthetic()
    tp = TorchProblem(p)
    topo = Topology.from_paper(world_size=2, local_steps=2)
    kw = {"max_steps": 400}
    r1 = simulate(tp, topo, 2, ["constant"], [2.0**-3], [0], 0.0, **kw)
    r2 = simulate(tp, topo, 2, ["constant"], [2.0**-3], [0], 0.0, **kw)
    assert r1.equals(r2)


def _reference_stop(p, topology, fam, c, idx, target, rel):
    """Independent re-implementation of the stopping rule on the reference trajectory."""
    P = topology.levels[-1].period
    state = {"avg": np.zeros(p.d), "next": P, "stop": None}

    def cb(t, W):
        wbar = W.mean(0)
        state["avg"] += 2.0 / (t + 1) * (wbar - state["avg"])
        if state["stop"] is None and t == state["next"]:
            state["next"] = t + max(P, P * math.floor(rel * t / P))
            if min(p.value(wbar), p.value(state["avg"])) <= target:
                state["stop"] = t

    reference_local_sgd(p, topology, fam, c, idx, callback=cb)
    return state["stop"]


def test_stopping_rule_matches_independent_check():
    p = synthetic(n=300)
    fstar = solve_fstar(p)[0]
    target = fstar + 0.02
    topo = Topology.from_paper(world_size=2, local_steps=4)
    T, B = 600, 2
    idx = np.random.default_rng(6).integers(p.n, size=(T, 1, 2, B))
    fams, cs = ["decreasing", "constant", "constant"], [2.0**-3, 2.0**-6, 2.0**-8]
    df = simulate(TorchProblem(p), topo, B, fams, cs, [0], target, max_steps=T,
                  rel_resolution=0.1, sampler=FixedSampler(idx))
    for row, fam, c in zip(df.itertuples(), fams, cs):
        expect = _reference_stop(p, topo, fam, c, idx[:, 0], target, 0.1)
        assert expect is not None, "test problem too hard for the step budget"
        assert row.status == "converged" and row.steps == expect
        assert row.steps % 4 == 0 and row.rounds_l0 == row.steps // 4


def test_divergence_and_cap_statuses():
    p = synthetic()
    tp = TorchProblem(p)
    topo = Topology.from_paper(world_size=2, local_steps=1)
    df = simulate(tp, topo, 1, ["constant", "constant"], [2.0**12, 2.0**-12], [0],
                  target=0.0, max_steps=200, cap_steps=100, diverge_factor=1.5)
    assert list(df.status) == ["diverged", "capped"]


def test_time_units_follow_section_3_4():
    # K=16, B_loc=16, H=16: 100 steps -> 1600 gradient units + 25 per round
    assert time_units(100, 16, [100 // 16], [16]) == 1600 + 25 * 6
    assert time_units(100, 16, [6], [1]) == 1600  # K = 1: nobody to talk to
    assert time_units(10, 1, [5, 2], [2, 4], comm_cost=[1, 10]) == 10 + 5 + 20
    with pytest.raises(ValueError, match="levels"):
        time_units(10, 1, [5, 2], [2, 4], comm_cost=[1])


# --------------------------------------------------------------------------- grid search


def _quadratic_evaluator(opt: int, calls: list):
    def evaluate(points):
        calls.append(list(points))
        return {(f, i): 10.0 + (i - opt) ** 2 + (5 if f == "constant" else 0) for f, i in points}

    return evaluate


def test_grid_extends_until_four_neighbours_are_worse():
    calls: list = []
    res = gridsearch.grid_search(_quadratic_evaluator(7, calls),
                                 {"decreasing": [-2, -1, 0, 1, 2], "constant": [7]})
    for fam in res:
        assert res[fam]["best"] == 7 and res[fam]["optimal"]
        assert {5, 6, 8, 9} <= set(res[fam]["scores"])
    assert len(calls) > 2  # it had to extend several times


def test_grid_extends_a_family_whose_whole_start_window_failed():
    """A family that missed the target everywhere in its first window is searched further even
    when the other family converged: its optimum may lie outside the window and win."""
    def evaluate(points):
        return {(f, i): (20.0 if f == "decreasing" else
                         math.inf if i < 5 else 10.0 + (i - 7) ** 2) for f, i in points}

    res = gridsearch.grid_search(evaluate, {"decreasing": [-2, -1, 0, 1, 2],
                                            "constant": [-2, -1, 0, 1, 2]})
    assert res["constant"]["best"] == 7 and res["constant"]["optimal"]
    assert res["constant"]["score"] < res["decreasing"]["score"]


def test_grid_rule_details():
    assert gridsearch.is_optimal({1: 5, 2: 3, 3: 4, 4: 6, 0: 9}, 2)
    assert not gridsearch.is_optimal({1: 5, 2: 3, 3: 4, 4: 6}, 2)  # 2^-2 c not evaluated
    assert not gridsearch.is_optimal({0: 1, 1: 5, 2: 3, 3: 4, 4: 6}, 2)  # 2^-2 c better
    assert gridsearch.missing_neighbours({0: 1.0, 1: 2.0}) == [-2, -1, 2]
    assert gridsearch.missing_neighbours({0: math.inf, 1: math.inf}) == [-2, -1, 2, 3]
    assert gridsearch.best_exponent({0: 2.0, 1: 2.0, 2: 3.0}) == 0  # tie -> smaller c


def test_grid_search_stops_on_a_plateau_of_large_c():
    """min(32, c n/(t+1)) is constant 32 for huge c: all large c tie; the search must stop."""
    def evaluate(points):
        return {(f, i): float(max(100 - 10 * i, 40)) for f, i in points}

    res = gridsearch.grid_search(evaluate, {"decreasing": [0, 1, 2]})["decreasing"]
    assert res["best"] == 6 and res["optimal"] and max(res["scores"]) == 8


def test_grid_search_on_simulated_problem_obeys_appendix_e_rule():
    p = synthetic(n=300)
    tp = TorchProblem(p)
    target = solve_fstar(p)[0] + 0.01
    row, trials = tune(tp, Config(K=2, B_loc=2, H=2), [0, 1], target, max_steps=3000,
                       centers={"decreasing": -12, "constant": -12})
    assert row["optimal"] and math.isfinite(row["steps"])
    fam = row["family"]
    mine = trials[trials.family == fam]
    score = {i: (g.steps.mean() if (g.status == "converged").all() else math.inf)
             for i, g in mine.groupby("exponent")}
    best = row["exponent"]
    assert best - 2 >= -14 or best + 2 <= -10  # the grid had to move away from its start
    for j in (-2, -1, 1, 2):
        assert score[best + j] >= score[best]
    assert row["time"] == row["steps"] * 2 + 25 * row["rounds"]


def test_fig_tables_on_synthetic_problem():
    from localsgd.paper.experiments.convex import fig4_table, fig5_table

    p = synthetic(n=300)
    tp = TorchProblem(p, torch.float32)
    target = solve_fstar(p)[0] + 0.02
    kw = {"seeds": [0], "target": target, "max_steps": 3000}
    f5 = fig5_table(tp, Ks=[1, 2], B_loc=2, Hs=[1, 2], **kw)
    assert list(f5.K) == [1, 2, 1, 2] and (f5[f5.K == 1].speedup == 1.0).all()
    assert np.allclose(f5.speedup, f5.time[f5.K == 1].iloc[0] / f5.time)
    f4 = fig4_table(tp, K=2, B_locs=[1, 4], Hs=[1, 2], **kw)
    assert len(f4) == 4 and f4.time_rel.min() == 1.0 and f4.optimal.all()


def test_bench_prints_one_json_line(capsys):
    import json

    from localsgd.paper.bench import convex as bench

    argv = ["--K", "2", "--B-loc", "2", "--step-sizes", "2", "--seeds", "1", "--steps", "3",
            "--repeats", "1", "--ref-runs", "1", "--data", "synthetic", "--json"]
    assert bench.main(argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("ours_grads_per_s", "reference_grads_per_s", "speedup", "matmul_flops_per_s",
                "fraction_of_matmul_peak"):
        assert out[key] > 0
