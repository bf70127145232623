"""The causal linear algebra of every propagator: U is block lower triangular in time.

Every propagator dmftc computes is Sigma = U^-1 K U^-T (the paper's U^-1 kappa U^-T), seen through rows E of
observables: E Sigma E^T.  Order U's rows and columns by the time at which each variable first acts; an
average at time t depends only on variables of times <= t, so U is BLOCK LOWER TRIANGULAR with square diagonal
blocks, one per time, at ``edges`` (T + 1 increasing offsets):

* a two-layer spec (:mod:`dmftc.runtime.site_engine`): U = coeff - dF/dq, time-major over the m components of
  its order parameters (``edges = time_edges(T, m)``; within a time, a constraint reads only scalars declared
  before it, so the blocks are even triangular);
* a deep spec (:mod:`dmftc.runtime.causal_solve`): U is the dual x primal block of the action Hessian in causal
  order (kernels, responses and their conjugates; a block's size grows with its time), K the dual-dual block.

U^-1 is never formed for a few rows E: Y = E U^-1 by block back substitution (:func:`left_solve`, from the last
time to the first: one LU of a diagonal block and one matrix product per time), O(R n^2) for R rows; for the
whole propagator (E = I) only the lower triangle of Y = U^-1 is computed.  :func:`right_solve` applies U^-1 to
vectors (forward substitution by blocks).  Every solve checks each diagonal block and names the time of a
singular one; the whole propagator also reports U's 1-norm condition number ||U|| ||U^-1|| (exact, from Y) and
refuses an ill-conditioned U (an unstable linear response: the propagator would be meaningless).
"""
from __future__ import annotations

import warnings

import numpy as np
import scipy.linalg as sla

from dmftc.errors import NumericalError

__all__ = ["asymmetry", "time_edges", "time_major_edges", "factor", "left_solve", "right_solve", "sandwich",
           "BLOCK_CONDITION", "MAX_CONDITION"]

BLOCK_CONDITION = 1e13     # a diagonal block above this condition number is singular
MAX_CONDITION = 1e12       # the whole U above this 1-norm condition number is ill-conditioned


def time_edges(T: int, m: int) -> np.ndarray:
    """Diagonal blocks of a time-major U with m components per time."""
    return np.arange(int(T) + 1) * int(m)


def time_major_edges(n: int, T: int) -> np.ndarray:
    """Diagonal blocks of a time-major U of size n over T steps (the same number of components per time)."""
    if int(T) < 1 or int(n) % int(T):
        raise ValueError(f"a U of size {n} is not time-major over {T} steps (its size must be a multiple of T)")
    return time_edges(T, int(n) // int(T))


def _diagonal_block(U, edges, b, why: str):
    """The LU factors of U's diagonal block at time b and its 1-norm condition number (LAPACK getrf + gecon:
    an estimate, a few times cheaper than the SVD); NumericalError if it is singular or not finite."""
    lo, hi = edges[b], edges[b + 1]
    blk = U[lo:hi, lo:hi]
    if not np.all(np.isfinite(blk)):
        raise NumericalError(f"non-finite entries in the diagonal block of U at time {b}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sla.LinAlgWarning)
        lu = sla.lu_factor(blk, check_finite=False)
    rcond, info = sla.lapack.dgecon(lu[0], float(np.abs(blk).sum(axis=0).max()), norm="1")
    cond = 1.0 / rcond if info == 0 and rcond > 0 else np.inf
    if not cond < BLOCK_CONDITION:
        raise NumericalError(f"U is singular at time {b}: condition number {cond:.3g} of its {hi - lo} x {hi - lo} "
                             f"diagonal block (the propagator does not exist; {why})")
    return lu, cond


_WHY = "a constraint coefficient vanishes, too few samples, or dynamics at the edge of stability"


def factor(U, edges, *, why: str = _WHY) -> list:
    """The LU factors and condition number of each diagonal block of U, [(lu, cond)] by time, for several
    :func:`right_solve` calls with the same U (a singular block raises NumericalError naming its time)."""
    U = np.asarray(U)
    return [_diagonal_block(U, edges, b, why) for b in range(len(edges) - 1)]


def left_solve(U, edges, E=None, *, why: str = _WHY):
    """Y with Y U = E (block back substitution from the last time); ``E=None``: Y = U^-1, of which only the
    block lower triangle is computed (the rest is zero).  Returns (Y, the largest diagonal-block condition
    number); a singular block raises NumericalError naming its time."""
    U = np.asarray(U)
    edges = np.asarray(edges)
    n = U.shape[0]
    inverse = E is None
    Y = np.zeros((n if inverse else E.shape[0], n))
    worst = 1.0
    for b in range(len(edges) - 2, -1, -1):
        lo, hi = edges[b], edges[b + 1]
        lu, cond = _diagonal_block(U, edges, b, why)
        worst = max(worst, cond)
        if inverse:                               # rows of U^-1 before lo vanish in these columns
            rhs = -(Y[lo:, hi:] @ U[hi:, lo:hi])
            rhs[: hi - lo] += np.eye(hi - lo)
            Y[lo:, lo:hi] = sla.lu_solve(lu, rhs.T, trans=1, check_finite=False).T
        else:
            rhs = E[:, lo:hi] - Y[:, hi:] @ U[hi:, lo:hi]
            Y[:, lo:hi] = sla.lu_solve(lu, rhs.T, trans=1, check_finite=False).T
    return Y, worst


def right_solve(U, edges, B, *, why: str = _WHY, factors=None):
    """X with U X = B (forward substitution by blocks); B of shape (n,) or (n, k).  ``factors``: U's diagonal
    blocks factored by :func:`factor` (else factored here)."""
    U, B = np.asarray(U), np.asarray(B, dtype=float)
    X = np.zeros_like(B)
    for b in range(len(edges) - 1):
        lo, hi = edges[b], edges[b + 1]
        lu, _ = factors[b] if factors is not None else _diagonal_block(U, edges, b, why)
        X[lo:hi] = sla.lu_solve(lu, B[lo:hi] - U[lo:hi, :lo] @ X[:lo], check_finite=False)
    return X


def asymmetry(K, rows: int = 512) -> float:
    """max |K - K^T| / max |K|, by blocks of rows: no temporary of K's size (K is the largest array of a deep
    propagator)."""
    K = np.asarray(K)
    scale = max(float(K.max(initial=0.0)), -float(K.min(initial=0.0)), 1e-300)
    worst = 0.0
    for i0 in range(0, K.shape[0], rows):
        worst = max(worst, float(np.abs(K[i0:i0 + rows] - K[:, i0:i0 + rows].T).max(initial=0.0)))
    return worst / scale


def sandwich(U, K, edges, E=None, *, why: str = _WHY):
    """(S, info): S = E U^-1 K U^-T E^T (symmetrised; E=None: the whole U^-1 K U^-T) and info with 'block_cond'
    (the largest diagonal-block condition number), 'asymmetry' of K, and for the whole propagator 'cond' (U's
    1-norm condition number).  NumericalError for a singular block, an ill-conditioned U (whole propagator), or
    a non-finite result."""
    Y, worst = left_solve(U, edges, E, why=why)
    info = {"block_cond": worst}
    info["asymmetry"] = asymmetry(K)
    if E is None:
        cond = float(np.abs(U).sum(axis=0).max() * np.abs(Y).sum(axis=0).max())
        info["cond"] = cond
        if not cond < MAX_CONDITION:
            raise NumericalError(f"U is ill-conditioned (condition number {cond:.3g} > {MAX_CONDITION:.0e}); the "
                                 "linear response is unstable: the propagator would be meaningless")
    S = Y @ K @ Y.T
    S = 0.5 * (S + S.T)
    if not np.all(np.isfinite(S)):
        whole = "" if E is not None else f", U condition number {info['cond']:.3g}"
        raise NumericalError(f"the propagator is not finite (largest diagonal-block condition number of U "
                             f"{worst:.3g}{whole})")
    return S, info
