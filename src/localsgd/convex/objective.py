"""The convex problem of §3.4 / Appendix E: ℓ2-regularized logistic regression.

    f(w) = 1/n Σ_i log(1 + exp(−b_i a_iᵀw)) + λ/2 ‖w‖²,   λ = 1/n,   w0 = 0.

All functions take NumPy float64 arrays; ``w`` may carry leading batch dimensions (..., d).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAPER_FSTAR = 0.126433176216545  # Appendix E, for w8a with λ = 1/n


def _sigmoid(z: np.ndarray) -> np.ndarray:
    # exp of a non-positive number never overflows: split on the sign.
    out = np.empty_like(z)
    pos = z >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-z[pos]))
    ez = np.exp(z[~pos])
    out[~pos] = ez / (1.0 + ez)
    return out


@dataclass
class LogisticProblem:
    """Data ``A`` (n × d), labels ``b`` (±1) and regularization ``lam`` (default 1/n)."""

    A: np.ndarray
    b: np.ndarray
    lam: float | None = None

    def __post_init__(self) -> None:
        self.A = np.ascontiguousarray(self.A, dtype=np.float64)
        self.b = np.ascontiguousarray(self.b, dtype=np.float64)
        if self.A.ndim != 2 or self.b.shape != (self.A.shape[0],):
            raise ValueError(f"A must be n×d and b length n; got {self.A.shape}, {self.b.shape}")
        if self.lam is None:
            self.lam = 1.0 / self.A.shape[0]

    @property
    def n(self) -> int:
        return self.A.shape[0]

    @property
    def d(self) -> int:
        return self.A.shape[1]

    def value(self, w: np.ndarray) -> np.ndarray:
        """f(w), stable via logaddexp(0, −b aᵀw); batched over leading dims of ``w``."""
        z = -(w @ self.A.T) * self.b  # (..., n)
        return np.logaddexp(0.0, z).mean(axis=-1) + 0.5 * self.lam * (w * w).sum(axis=-1)

    def grad(self, w: np.ndarray) -> np.ndarray:
        """∇f(w) = −1/n Σ b_i σ(−b_i a_iᵀw) a_i + λ w."""
        z = -(w @ self.A.T) * self.b
        coef = -self.b * _sigmoid(z) / self.n
        return coef @ self.A + self.lam * w

    def hessian(self, w: np.ndarray) -> np.ndarray:
        """∇²f(w) = 1/n Aᵀ diag(σ(z)σ(−z)) A + λ I for a single ``w`` (d,)."""
        z = -(self.A @ w) * self.b
        s = _sigmoid(z)
        D = s * (1.0 - s) / self.n
        return (self.A * D[:, None]).T @ self.A + self.lam * np.eye(self.d)


def solve_fstar(
    problem: LogisticProblem, tol: float = 1e-10, max_iter: int = 100
) -> tuple[float, np.ndarray, dict]:
    """Minimize f with damped Newton (Armijo backtracking) from w0 = 0 until ‖∇f‖ ≤ ``tol``.

    Deterministic (no randomness, fixed linear algebra). Returns (f*, w*, info) where info holds
    ``grad_norm`` and ``iterations``.
    """
    w = np.zeros(problem.d)
    f = float(problem.value(w))
    for it in range(max_iter):
        g = problem.grad(w)
        gnorm = float(np.linalg.norm(g))
        if gnorm <= tol:
            return f, w, {"grad_norm": gnorm, "iterations": it}
        step = np.linalg.solve(problem.hessian(w), -g)
        t = 1.0
        while True:  # Armijo backtracking; Newton's unit step is accepted near the optimum
            w_new = w + t * step
            f_new = float(problem.value(w_new))
            if f_new <= f + 1e-4 * t * float(g @ step) or t < 1e-12:
                break
            t *= 0.5
        w, f = w_new, f_new
    gnorm = float(np.linalg.norm(problem.grad(w)))
    if gnorm > tol:
        raise RuntimeError(f"Newton did not reach ‖∇f‖ ≤ {tol} in {max_iter} iterations ({gnorm})")
    return f, w, {"grad_norm": gnorm, "iterations": max_iter}
