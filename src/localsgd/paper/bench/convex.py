"""Benchmark: stochastic gradients per second, vectorized simulator vs the NumPy reference.

Both run the same work: T steps of local SGD (K workers, B_loc samples each, H local steps) for
S seeds × J step sizes on the *same* sampled indices; the reference does one (seed, step size)
run at a time and one worker at a time (``reference_local_sgd``), the simulator all at once
(``LocalSGDState.run``, which uses the sparsity of the rows: ~12 of 300 features on w8a; the
reference uses dense rows, as a straightforward implementation would). Evaluation of f is
excluded from both: this measures the SGD engine.
The reference is timed on ``--ref-runs`` of the S·J runs (its cost is linear in runs) and checked
to produce the simulator's models.

Dense-equivalent flops of one stochastic gradient: 4·d (a_iᵀw and the rank-1 accumulation, 2
flops per multiply-add), compared with a square ``torch.mm`` measured in the same process and
dtype. The simulator does only ~4·nnz(a_i) of them (sparse rows), so
``fraction_of_matmul_peak`` says how fast it is next to a dense engine at matmul peak, not how
busy the FPU is.
Prints the medians over ``--repeats`` (``--json``: one JSON line; `localsgd.paper.bench.common`).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from localsgd.convex.objective import LogisticProblem
from localsgd.convex.simulator import FAMILIES, LocalSGDState, TorchProblem, reference_local_sgd
from localsgd.data import load_libsvm
from localsgd.paper.bench.common import emit, machine
from localsgd.topology import Topology


def _problem(source: str) -> tuple[LogisticProblem, str]:
    if source in ("auto", "w8a"):
        try:
            A, b = load_libsvm("w8a", download=False)
            return LogisticProblem(A, b), "w8a"
        except FileNotFoundError:
            if source == "w8a":
                raise
    # w8a-like stand-in: same shape, ~4% binary features, ~3% positives
    rng = np.random.default_rng(0)
    A = (rng.random((49_749, 300)) < 0.039).astype(np.float64)
    b = np.where(rng.random(49_749) < 0.03, 1.0, -1.0)
    return LogisticProblem(A, b), "synthetic-w8a-shape"


def _matmul_flops(dtype: torch.dtype, repeats: int, n: int = 512) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(4):
            a @ b
        times.append((time.perf_counter() - t) / 4)
    return 2 * n**3 / statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="localsgd bench convex", description=__doc__.split("\n")[0])
    p.add_argument("--K", type=int, default=16, help="workers")
    p.add_argument("--B-loc", type=int, default=16, help="local mini-batch")
    p.add_argument("--H", type=int, default=4, help="local steps")
    p.add_argument("--step-sizes", type=int, default=10, help="J: step sizes (both families)")
    p.add_argument("--seeds", type=int, default=2, help="S: seeds")
    p.add_argument("--steps", type=int, default=100, help="T: steps per timed repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--ref-runs", type=int, default=2, help="(seed, step size) runs timed on the "
                   "reference")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                   help="both engines (float32 is what the figures use)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: per core)")
    p.add_argument("--data", choices=["auto", "w8a", "synthetic"], default="auto")
    p.add_argument("--json", action="store_true", help="print one JSON line only")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    problem, data_name = _problem(args.data)
    tp = TorchProblem(problem, dtype)
    topo = Topology.from_paper(world_size=args.K, local_steps=args.H)
    S, J, K, B, T = args.seeds, args.step_sizes, args.K, args.B_loc, args.steps
    fams = [FAMILIES[j % 2] for j in range(J)]
    cs = [2.0 ** (-6 - j // 2) if fams[j] == "decreasing" else 2.0 ** (-2 - j // 2)
          for j in range(J)]
    idx = torch.randint(problem.n, (T, S, K, B), generator=torch.Generator().manual_seed(0))

    runs = [(s, j) for s in range(S) for j in range(J)][: args.ref_runs]
    idx_np = idx.numpy()
    np_dtype = np.dtype(args.dtype).type
    ref_data = (problem.A.astype(np_dtype), problem.b.astype(np_dtype))  # cast once, untimed
    ours, ref = [], []
    for _ in range(args.repeats):  # interleaved, so a load change on the machine hits both
        state = LocalSGDState(tp, topo, S, fams, cs)
        t = time.perf_counter()
        state.run(idx)  # includes gathering the sampled sparse rows
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        for s, j in runs:
            W_ref = reference_local_sgd(problem, topo, fams[j], cs[j], idx_np[:, s],
                                        dtype=np_dtype, data=ref_data)
        ref.append(time.perf_counter() - t)
        tol = 1e-9 if dtype == torch.float64 else 1e-3  # float32: different summation order
        np.testing.assert_allclose(state.W[s, :, j].double().numpy(), W_ref, rtol=tol, atol=tol)
    grads_ours = T * S * J * K * B
    grads_ref = T * len(runs) * K * B

    ours_rate = grads_ours / statistics.median(ours)
    ref_rate = grads_ref / statistics.median(ref)
    mm = _matmul_flops(dtype, args.repeats)
    out = {
        "ours_grads_per_s": ours_rate,
        "reference_grads_per_s": ref_rate,
        "speedup": ours_rate / ref_rate,
        "matmul_flops_per_s": mm,
        "fraction_of_matmul_peak": ours_rate * 4 * problem.d / mm,
        "workload": {"K": K, "B_loc": B, "H": args.H, "step_sizes": J, "seeds": S, "steps": T,
                     "reference_runs": len(runs), "data": data_name, "dtype": args.dtype},
        "engines": {"ours": "sparse rows (CSR of b_i a_i, scipy kernels), all runs at once",
                    "reference": "dense rows, NumPy, one run and one worker at a time"},
        "repeats": args.repeats,
        "threads": args.threads,
        "machine": machine(),
    }
    emit(out, args.json, f"simulator {ours_rate:,.0f} grads/s vs reference {ref_rate:,.0f} "
         f"grads/s ({out['speedup']:.1f}x); {out['fraction_of_matmul_peak']:.1%} of matmul "
         f"{mm / 1e9:.1f} GFLOP/s ({args.dtype}, {args.threads} thread(s))")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
