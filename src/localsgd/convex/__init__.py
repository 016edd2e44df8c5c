"""The convex simulator of §3.4 / Appendix E: logistic regression on w8a, simulated local SGD.

* ``objective``   — f(w), gradient, Hessian, the Newton solve for f*.
* ``simulator``   — the vectorized local SGD simulator (seeds × step sizes × workers) and a plain
  NumPy reference implementation.
* ``gridsearch``  — Appendix E's self-extending step-size grid.

The §3.4 time model and the Figure 4 / 5 sweeps are the reproduction's
(`localsgd.paper.experiments.convex`); the simulator's throughput benchmark is `localsgd.paper.bench.convex`.
"""

from localsgd.convex.objective import PAPER_FSTAR, LogisticProblem, solve_fstar

__all__ = ["PAPER_FSTAR", "LogisticProblem", "solve_fstar"]
