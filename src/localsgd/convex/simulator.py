"""Vectorized simulator of (hierarchical) local SGD on the logistic regression of Appendix E.

One tensor program advances every run of a batch at once: runs are indexed by (seed s, step size
j, worker k) and the model stack is ``W[s, k, j, :]``. A Python loop runs over time steps only.

Algorithm (Eq. (3)-(5), Algorithm 1/2): at step t every worker k takes one SGD step on its own
mini-batch of ``B_loc`` samples, ``w^k ← w^k − γ_t/B_loc Σ_{i∈I_t^k} ∇f_i(w^k)`` with
``f_i(w) = log(1 + exp(−b_i a_iᵀw)) + λ/2‖w‖²``; then ``SyncSchedule(topology).action(t).level``
says which groups (if any) replace their models by the group mean. H = 1 on a flat topology is
mini-batch SGD with batch K·B_loc (tested).

Choices (Appendix E leaves them open; stated here and in the figure CSVs):

* **Sampling**: i.i.d. uniform *with replacement* from the full data set, independently per worker
  and step (the iid setting: every worker sees the whole data). All step sizes of one seed see
  the same samples (common random numbers: comparisons between step sizes are less noisy).
  Seed s draws ``[steps, K, B_loc]`` indices from ``torch.Generator().manual_seed(seed)``.
* **Step sizes**: ``γ_t = min(32, c·n/(t+1))`` ("decreasing") or ``γ_t = 32c`` ("constant"),
  with t = 1, 2, … the number of local steps taken so far (a worker's sequential step count).
* **Averaged iterate**: ``x̄_t = Σ_τ τ·w̄_τ / Σ_τ τ`` over the worker-mean ``w̄_τ`` of every step τ
  (weights ∝ τ, as in Lacoste-Julien et al. 2012 cited in §3.3: optimal O(1/t) averaging for
  strongly convex SGD with decreasing steps; with constant steps it also forgets the start
  faster than the uniform average, which only helps the "best of" test).
* **Stopping**: a run stops at the first *evaluation* step where
  ``min(f(w̄_t), f(x̄_t)) ≤ target`` (target = f* + ε). Evaluations happen only at steps that are
  multiples of the world-averaging period P (so ``w̄_t`` is the model every worker holds) and,
  to save full-data passes, every ``max(P, P·⌊rel_resolution·t/P⌋)`` steps: the measured
  stopping step is exact to within ``rel_resolution`` (relative) or P steps, whichever is larger.
* **Divergence**: a run whose f is not finite or exceeds ``diverge_factor·f(w0)`` stops as failed.
* **Pruning** (for the grid search): a run still above target at step ``> cap_steps`` (one
  number or one per step-size column) stops as "capped"; with ``cap_factor`` set, the caps
  shrink during the run to ``cap_factor ×`` the best mean stopping step of any step size (of
  either family: Appendix E reports the better family) that converged for every seed.

Precision: the SGD state may be float32 or float64 (``TorchProblem(dtype=...)``); f is always
evaluated in float64. The figures use float32: the stopping test needs f to ~1e-4 absolute
(ε = 0.005), SGD noise dwarfs float32 round-off, and float32 halves the bytes the sparse
kernels move. Checked on w8a: for (K, B_loc, H) = (16, 16, 16), (16, 1, 4), (16, 256, 1),
3 step sizes × 2 seeds, float32 and float64 give the same stopping step in every run and f
within 6e-5 (earlier dense engine); for (16, 16, 16) and (16, 1, 4) the sparse engine gives
the dense engine's stopping steps in both dtypes. Tests use float64, where the simulator
matches the NumPy reference to round-off.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import scipy.sparse
import torch
from scipy.special import expit

from localsgd.convex.objective import LogisticProblem
from localsgd.schedule import SyncSchedule
from localsgd.topology import Topology

FAMILIES = ("decreasing", "constant")
STEP_CAP = 32.0  # Appendix E: γ_t = min(32, c n/(t+1)) and γ_t = 32 c


def step_size(family: str, c: float, t: int, n: int) -> float:
    """Appendix E step size γ_t for one run (scalar; used by the reference implementation)."""
    if family == "decreasing":
        return min(STEP_CAP, c * n / (t + 1))
    if family == "constant":
        return STEP_CAP * c
    raise ValueError(f"step-size family {family!r} unknown; valid: {FAMILIES}")


try:  # scipy's compiled CSR kernels, called directly: the public wrappers cost more than the
    # ~20 µs product itself at these sizes; the fallback below computes the same thing
    from scipy.sparse._sparsetools import csc_matvecs as _csc_kernel
    from scipy.sparse._sparsetools import csr_matvecs as _csr_kernel
    from scipy.sparse._sparsetools import csr_row_index as _row_index
except ImportError:  # pragma: no cover - depends on the scipy build
    _csc_kernel = _csr_kernel = _row_index = None


def _csr_matvecs(n_row, n_col, n_vec, p, cols, vals, x, y) -> None:
    """y (n_row × n_vec) += X x for X in CSR (``p`` absolute offsets into cols/vals)."""
    if _csr_kernel is not None:
        _csr_kernel(n_row, n_col, n_vec, p, cols, vals, x, y)
        return
    a, e = int(p[0]), int(p[-1])
    X = scipy.sparse.csr_array((vals[a:e], cols[a:e], p - a), shape=(n_row, n_col))
    y += (X @ x.reshape(n_col, n_vec)).reshape(-1)


def _csc_matvecs(n_row, n_col, n_vec, p, rows, vals, x, y) -> None:
    """y (n_row × n_vec) += Xᵀ x for the CSR matrix X (n_col × n_row) of ``_csr_matvecs``."""
    if _csc_kernel is not None:
        _csc_kernel(n_row, n_col, n_vec, p, rows, vals, x, y)
        return
    a, e = int(p[0]), int(p[-1])
    X = scipy.sparse.csr_array((vals[a:e], rows[a:e], p - a), shape=(n_col, n_row))
    y += (X.T @ x.reshape(n_col, n_vec)).reshape(-1)


class SparseRows:
    """The signed rows b_i a_i in CSR and a gather of sampled rows.

    Indices are int32 (half the bytes of int64: the gather of random rows is bound by memory
    latency, ~2x faster on w8a) unless a gathered block would not fit, then int64.
    """

    def __init__(self, Ab: np.ndarray, dtype: torch.dtype):
        X = scipy.sparse.csr_array(Ab.astype(torch.empty(0, dtype=dtype).numpy().dtype))
        self.d = Ab.shape[1]
        self._csr = {np.int32: (X.indptr.astype(np.int32), X.indices.astype(np.int32)),
                     np.int64: (X.indptr.astype(np.int64), X.indices.astype(np.int64))}
        self.data = X.data
        self.nnz_row = np.diff(self._csr[np.int32][0])

    def gather(self, rows: np.ndarray, group: int, groups: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """CSR (indptr, cols, vals) of the rows ``rows``; consecutive runs of ``group`` rows
        belong to block g = (position // group) mod ``groups`` and get columns g·d + j, so that
        one product with the stacked blocks ``[groups·d, J]`` serves every (seed, worker)."""
        lens = self.nnz_row[rows]
        big = max(int(lens.sum(dtype=np.int64)), groups * self.d) >= np.iinfo(np.int32).max
        it = np.int64 if big else np.int32
        indptr, indices = self._csr[it]
        rows = np.ascontiguousarray(rows, dtype=it)
        ptr = np.zeros(len(rows) + 1, dtype=it)
        np.cumsum(lens, out=ptr[1:])
        cols = np.empty(ptr[-1], dtype=it)
        vals = np.empty(ptr[-1], dtype=self.data.dtype)
        if _row_index is not None:
            _row_index(len(rows), rows, indptr, indices, self.data, cols, vals)
        else:  # pragma: no cover
            pos = np.arange(ptr[-1]) + np.repeat(indptr[rows] - ptr[:-1], lens)
            cols[:], vals[:] = indices[pos], self.data[pos]
        block = ((np.arange(len(rows), dtype=it) // group) % groups) * it(self.d)
        cols += np.repeat(block, lens)
        return ptr, cols, vals

class TorchProblem:
    """The logistic problem as torch tensors, plus a fast exact full-data objective.

    ``f`` is evaluated on the *distinct* signed rows b_i a_i weighted by their multiplicity, as
    a sparse CSR product: w8a has 14,969 repeated rows (4,203 of them empty), so this is exact
    and ~8× faster than the dense n × d product.
    """

    def __init__(self, problem: LogisticProblem, dtype: torch.dtype = torch.float64):
        self.problem = problem
        self.n, self.d, self.lam = problem.n, problem.d, float(problem.lam)
        self.dtype = dtype
        # signed rows b_i a_i: the label then never needs its own gather or multiply (no dense
        # copy is kept: on w8a one is 60 MB in float32 and the SGD steps read the sparse rows)
        signed = np.ascontiguousarray(problem.A * problem.b[:, None])
        self.rows = SparseRows(signed, dtype)
        # an example enters f only through b_i a_i: one loss per distinct signed row; rows as
        # opaque byte strings (a 1-D unique is ~10x faster than unique(axis=0))
        keys = signed.view(np.dtype((np.void, signed.dtype.itemsize * self.d))).ravel()
        _, first, counts = np.unique(keys, return_index=True, return_counts=True)
        with warnings.catch_warnings():  # CSR support is labelled beta; it is exact here
            warnings.simplefilter("ignore")
            # rows −b_u a_u: the product gives the softplus arguments −b aᵀw directly
            self._U = torch.from_numpy(-signed[first]).to_sparse_csr()
        self._uw = torch.from_numpy(counts.astype(np.float64)) / self.n

    def value(self, w: torch.Tensor) -> torch.Tensor:
        """f(w) in float64 for ``w`` of shape (m, d) → (m,)."""
        w = w.to(torch.float64)
        # at most 16 models per sparse product: on w8a 40 at once took 3.7x as long as 20
        loss = torch.cat([self._loss(part) for part in w.split(16)]) if len(w) else w.sum(1)
        return loss + 0.5 * self.lam * (w * w).sum(1)

    def _loss(self, w: torch.Tensor) -> torch.Tensor:
        z = self._U @ w.T  # (u, m): −b aᵀw on the distinct rows
        # the row-weighted sum as one matrix-vector product: faster than scaling the (u, m)
        # losses and reducing over their first axis
        return self._uw @ torch.nn.functional.softplus(z)


@dataclass
class Sampler:
    """Uniform with-replacement indices, one ``torch.Generator`` per seed, drawn in chunks.

    ``chunk(t0, steps)`` returns a LongTensor ``[steps, S, K, B]`` for steps t0 … t0+steps−1;
    chunks must be requested in order (the generators are sequential streams).
    """

    n: int
    seeds: Sequence[int]
    K: int
    B: int

    def __post_init__(self) -> None:
        self._gens = [torch.Generator().manual_seed(int(s)) for s in self.seeds]

    def chunk(self, t0: int, steps: int) -> torch.Tensor:
        draws = [torch.randint(self.n, (steps, self.K, self.B), generator=g) for g in self._gens]
        return torch.stack(draws, dim=1)


class FixedSampler:
    """Replays given indices ``[T, S, K, B]`` (tests, reference comparisons, benchmarks)."""

    def __init__(self, idx: torch.Tensor | np.ndarray):
        self.idx = torch.as_tensor(np.asarray(idx), dtype=torch.long)

    def chunk(self, t0: int, steps: int) -> torch.Tensor:
        if t0 - 1 + steps > self.idx.shape[0]:
            raise ValueError(f"FixedSampler holds {self.idx.shape[0]} steps, asked up to "
                             f"{t0 - 1 + steps}")
        return self.idx[t0 - 1 : t0 - 1 + steps]


class LocalSGDState:
    """The model stack of a batch of runs and its one-step update, on sparse rows.

    Models are stored as ``W[s, k, :, j] = α_j · V[s, k, :, j]`` with V of shape ``[S, K, d, J]``
    (seed, worker, coordinate, step size) and one scale α_j per step-size column:

    * a sampled row a_i with nnz nonzeros touches nnz contiguous J-vectors of its worker's
      block of V, so both products of a step are sparse-times-dense kernels costing nnz·J,
      not d·J (w8a: ~12 of 300 features are nonzero);
    * the weight decay (1 − γ_t λ) of the regularizer is the same for every seed and worker,
      so it multiplies α_j instead of all of W (folded back into V when α leaves [1e-6, 1e6]);
    * averaging is linear and α is shared by all workers, so groups average V directly.

    ``W`` returns the ``[S, K, J, d]`` models. ``families``/``cs`` (length J) give each step-size
    column; all seeds share them.
    """

    ALPHA_RANGE = (1e-6, 1e6)  # |α| outside: fold α into V (keeps V's magnitude sane)

    def __init__(self, tp: TorchProblem, topology: Topology, n_seeds: int,
                 families: Sequence[str], cs: Sequence[float]):
        for fam in families:
            if fam not in FAMILIES:
                raise ValueError(f"step-size family {fam!r} unknown; valid: {FAMILIES}")
        if len(families) != len(cs):
            raise ValueError(f"{len(families)} families but {len(cs)} values of c")
        self.tp, self.topology = tp, topology
        self.schedule = SyncSchedule(topology)
        self.K = topology.world_size
        self.S, self.J = n_seeds, len(cs)
        dt = tp.dtype
        self.V = torch.zeros(self.S, self.K, tp.d, self.J, dtype=dt)  # Appendix E: w0 = 0
        self.alpha = np.ones(self.J)  # float64: products of many decays stay exact enough
        # x̄_t of the worker-mean model; the worker mean of a step is all the average needs
        self.avg_mean = torch.zeros(self.S, tp.d, self.J, dtype=dt)
        self.c = np.array([float(c) for c in cs])
        self.is_dec = np.array([f == "decreasing" for f in families])
        self.group_sizes = [lv.group_size for lv in topology.levels]
        self.rounds = [0] * topology.num_levels
        self.t = 0

    @property
    def W(self) -> torch.Tensor:
        """The models as ``[S, K, J, d]``."""
        return (self.V * torch.from_numpy(self.alpha).to(self.tp.dtype)).transpose(2, 3)

    def gammas(self, t: int | np.ndarray) -> np.ndarray:
        """γ_t for every step-size column: (J,) for scalar t, (T, J) for an array of t."""
        t = np.asarray(t, dtype=np.float64)[..., None]
        dec = np.minimum(self.c * (self.tp.n / (t + 1)), STEP_CAP)
        return np.where(self.is_dec, dec, STEP_CAP * self.c)

    def _scales(self, T: int, B: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        """For the next T steps: −α before each step (scales the margins), γ/(Bα) and α after
        it (each (T, J)), and {step: factor} where α is folded into V (α leaves ALPHA_RANGE)."""
        gamma = self.gammas(np.arange(self.t + 1, self.t + T + 1))
        decay = 1.0 - gamma * self.tp.lam
        before, after, folds = np.empty((T, self.J)), np.empty((T, self.J)), {}
        lo, hi = self.ALPHA_RANGE
        alpha, i = self.alpha, 0
        while i < T:
            with np.errstate(over="ignore", invalid="ignore"):
                seg = alpha * np.cumprod(decay[i:], axis=0)
            mag = np.abs(seg)
            bad = ~((mag.min(1) > lo) & (mag.max(1) < hi))
            k = int(bad.argmax()) if bad.any() else len(seg)
            after[i : i + k] = seg[:k]
            before[i] = alpha
            before[i + 1 : i + k + 1] = seg[: min(k, T - i - 1)]
            if k == len(seg):
                alpha = seg[-1]
                break
            # fold at step i + k: V ← (α before it)·(1 − γλ)·V, then α = 1
            fold = (seg[k - 1] if k else alpha) * decay[i + k]
            folds[i + k] = torch.from_numpy(fold).to(self.tp.dtype)
            after[i + k] = 1.0
            alpha, i = np.ones(self.J), i + k + 1
            if i < T:
                before[i] = alpha
        self.alpha = after[-1].copy()
        dt = self.tp.dtype
        return (torch.from_numpy(-before).to(dt), torch.from_numpy(gamma / B / after).to(dt),
                torch.from_numpy(after).to(dt), folds)

    def step(self, idx: torch.Tensor) -> int | None:
        """One local step on indices ``idx[S, K, B]``, then the schedule's averaging."""
        return self.run(idx.unsqueeze(0))

    def run(self, idx: torch.Tensor | np.ndarray) -> int | None:
        """Local steps on indices ``idx[T, S, K, B]`` (T consecutive steps, each followed by the
        schedule's averaging); returns the averaging level of the last step.

        Each step is ``w ← (1 − γλ) w + γ/B Σ_i σ(−b_i a_iᵀw) b_i a_i`` (the SGD step on
        f_i = logistic + λ/2‖w‖²). With W = α V: margins = α · (one CSR × dense product over
        the signed rows b_i a_i of all (seed, worker) blocks of V); α ← α(1 − γλ); then
        ``V += γ/(B α) Xᵀ σ(−margins)`` (the transposed product, in place). The rows of all T
        steps are gathered once (sparse index lists), outside the step loop.
        """
        tp, S, K, J = self.tp, self.S, self.K, self.J
        idx = np.asarray(idx, dtype=np.int64)
        T, B = idx.shape[0], idx.shape[-1]
        if idx.shape[1:3] != (S, K):
            raise ValueError(f"indices must be [T, S={S}, K={K}, B]; got {idx.shape}")
        R, SKd = S * K * B, S * K * tp.d
        rowptr, cols, vals = tp.rows.gather(idx.reshape(-1), group=B, groups=S * K)
        margin = torch.empty(R, J, dtype=tp.dtype)
        m_np, V_np = margin.numpy().reshape(-1), self.V.numpy().reshape(-1)
        m_scale, u_scale, alpha, folds = self._scales(T, B)
        # per-step rows as views made once (indexing a tensor costs ~1 µs per call)
        m_scale, u_scale, alpha = m_scale.unbind(0), u_scale.unbind(0), alpha.unbind(0)
        levels = [self.schedule.action(t).level for t in range(self.t + 1, self.t + T + 1)]
        # worker mean by a (1 × K) product: cheaper than a reduction over a middle dimension
        mean_k = torch.full((S, 1, K), 1.0 / K, dtype=tp.dtype)
        V3 = self.V.view(S, K, -1)
        level = None
        for i in range(T):
            self.t += 1
            p = rowptr[i * R : (i + 1) * R + 1]  # absolute offsets into cols/vals
            m_np.fill(0.0)
            _csr_matvecs(R, SKd, J, p, cols, vals, V_np, m_np)  # b aᵀv, (R, J)
            if i in folds:
                self.V.mul_(folds[i])  # W = V from here (α = 1)
            margin.mul_(m_scale[i]).sigmoid_().mul_(u_scale[i])  # γ/(Bα) σ(−b aᵀw)
            _csc_matvecs(SKd, R, J, p, cols, vals, m_np, V_np)  # V += Xᵀ coef
            mv = torch.bmm(mean_k, V3)  # (S, 1, d·J); averaging does not change it
            level = levels[i]
            if level is not None:
                g = self.group_sizes[level]
                if g == K:
                    V3.copy_(mv.expand_as(V3))
                else:
                    Vg = self.V.view(S, K // g, g, -1)  # groups are contiguous ranks
                    Vg.copy_(Vg.mean(2, keepdim=True).expand_as(Vg))
                self.rounds[level] += 1
            # weights ∝ t; averaging is linear, so x̄ of the worker mean = mean of per-worker x̄
            self.avg_mean.lerp_(mv.view(S, tp.d, J).mul_(alpha[i]), 2.0 / (self.t + 1))
        return level

    def mean_model(self) -> torch.Tensor:
        """Worker-mean model w̄ as ``[S, J, d]``."""
        return (self.V.mean(1) * torch.from_numpy(self.alpha).to(self.tp.dtype)).transpose(1, 2)

    @property
    def avg(self) -> torch.Tensor:
        """Weighted average of the iterates x̄_t (weights ∝ t) as ``[S, J, d]``."""
        return self.avg_mean.transpose(1, 2)


def simulate(
    tp: TorchProblem,
    topology: Topology,
    B_loc: int,
    families: Sequence[str],
    cs: Sequence[float],
    seeds: Sequence[int],
    target: float,
    *,
    max_steps: int = 100_000,
    rel_resolution: float = 0.05,
    cap_steps: int | Sequence[int] | None = None,
    cap_factor: float | None = None,
    diverge_factor: float = 10.0,
    sampler=None,
    chunk: int = 256,
) -> pd.DataFrame:
    """Run all (seed, step size) pairs of one (topology, B_loc) configuration to the target.

    Returns one row per (seed, family, c) with ``steps`` (local steps until the stopping test
    passed, NaN if not), ``status`` (converged / diverged / capped / max_steps), the evaluation
    ``resolution`` in steps at the stopping point, ``rounds_l<level>`` (averaging rounds per
    level up to the stop) and ``f_best`` (last evaluated min(f(w̄), f(x̄))).
    """
    if B_loc < 1:
        raise ValueError(f"B_loc must be >= 1, got {B_loc}")
    S, J = len(seeds), len(cs)
    state = LocalSGDState(tp, topology, S, families, cs)
    sampler = sampler or Sampler(tp.n, seeds, topology.world_size, B_loc)
    period = topology.levels[-1].period  # world period: evaluations only where models agree
    f0 = float(tp.value(torch.zeros(1, tp.d, dtype=tp.dtype))[0])
    # per-column step cap; a column's family shares the in-run tightening (see docstring)
    cap = np.broadcast_to(np.asarray(max_steps if cap_steps is None else cap_steps,
                                     dtype=np.float64), (J,)).copy()
    active = torch.ones(S, J, dtype=torch.bool)
    stop_step = torch.full((S, J), float("nan"), dtype=torch.float64)
    status = np.full((S, J), "max_steps", dtype=object)
    f_best = torch.full((S, J), float("nan"), dtype=torch.float64)
    resolution = torch.full((S, J), float("nan"), dtype=torch.float64)
    rounds = np.zeros((S, J, topology.num_levels), dtype=np.int64)
    next_eval, idx_buf, buf_t0 = period, None, 1
    t = 0
    while t < max_steps and bool(active.any()):
        if idx_buf is None or t + 1 >= buf_t0 + idx_buf.shape[0]:
            buf_t0 = t + 1
            idx_buf = sampler.chunk(buf_t0, min(chunk, max_steps - t))
        # every step up to the next evaluation (or the end of the buffer) in one call
        stop = min(next_eval, buf_t0 + idx_buf.shape[0] - 1)
        state.run(idx_buf[t + 1 - buf_t0 : stop + 1 - buf_t0])
        t = state.t
        if t < next_eval:
            continue
        step_res = max(period, period * math.floor(rel_resolution * t / period))
        next_eval = t + step_res
        sj = active.nonzero()
        models = torch.cat([state.mean_model()[sj[:, 0], sj[:, 1]], state.avg[sj[:, 0], sj[:, 1]]])
        fv = tp.value(models)
        m = len(sj)
        best = torch.minimum(fv[:m], fv[m:])
        f_best[sj[:, 0], sj[:, 1]] = best
        for (s, j), fb in zip(sj.tolist(), best.tolist()):
            if fb <= target:
                status[s, j], stop_step[s, j] = "converged", t
            elif not math.isfinite(fb) or fb > diverge_factor * f0:
                status[s, j] = "diverged"
            else:
                continue
            active[s, j] = False
            resolution[s, j] = step_res
            rounds[s, j] = state.rounds
        if cap_factor is not None:
            done = (~torch.isnan(stop_step).any(0)).numpy()  # converged for every seed
            if done.any():
                best_mean = stop_step.mean(0).numpy()[done].min()
                cap = np.minimum(cap, math.ceil(cap_factor * best_mean))
        for s, j in active.nonzero().tolist():
            if t > cap[j]:
                status[s, j] = "capped"
                rounds[s, j] = state.rounds
                active[s, j] = False
    for s, j in active.nonzero().tolist():
        rounds[s, j] = state.rounds
    rows = []
    for s in range(S):
        for j in range(J):
            row = {"seed": seeds[s], "family": families[j], "c": float(cs[j]),
                   "steps": float(stop_step[s, j]), "status": status[s, j],
                   "resolution": float(resolution[s, j]), "f_best": float(f_best[s, j])}
            for lv in range(topology.num_levels):
                row[f"rounds_l{lv}"] = int(rounds[s, j, lv])
            rows.append(row)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------
# Reference: one worker and one step size at a time, plain NumPy, same arithmetic
# ----------------------------------------------------------------------------------------------


def reference_local_sgd(
    problem: LogisticProblem,
    topology: Topology,
    family: str,
    c: float,
    idx: np.ndarray,
    callback: Callable[[int, np.ndarray], None] | None = None,
    dtype: type = np.float64,
    data: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """Straightforward local SGD for one seed and one step size on indices ``idx[T, K, B]``.

    Returns the final worker models (K × d). ``callback(t, W)`` sees the models after each step.
    ``data`` = (A, b) already in ``dtype`` avoids re-casting the data set on every call.
    """
    A, b = data if data is not None else (problem.A.astype(dtype), problem.b.astype(dtype))
    lam, n = float(problem.lam), problem.n
    T, K, B = idx.shape
    schedule = SyncSchedule(topology)
    groups = [topology.groups(level) for level in range(topology.num_levels)]
    W = np.zeros((K, problem.d), dtype=dtype)
    for t in range(1, T + 1):
        gamma = step_size(family, c, t, n)
        for k in range(K):
            rows = idx[t - 1, k]
            x, y = A[rows], b[rows]
            coef = y * expit(-y * (x @ W[k]))  # b σ(−b aᵀw) = −∂ℓ/∂(aᵀw), overflow-free
            W[k] = (1.0 - gamma * lam) * W[k] + (gamma / B) * (coef @ x)
        level = schedule.action(t).level
        if level is not None:
            for group in groups[level]:
                W[group] = W[group].mean(axis=0)
        if callback is not None:
            callback(t, W)
    return W
