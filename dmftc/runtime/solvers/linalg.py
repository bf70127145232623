"""The causal linear algebra of every propagator: U is block lower triangular in time.

Every propagator dmftc computes is Sigma = U^-1 K U^-T (the paper's U^-1 kappa U^-T), seen through rows E of
observables: E Sigma E^T.  Order U's rows and columns by the time at which each variable first acts; an
average at time t depends only on variables of times <= t, so U is BLOCK LOWER TRIANGULAR with square diagonal
blocks, one per time, at ``edges`` (T + 1 increasing offsets):

* a two-layer spec (:mod:`dmftc.runtime.engines.site_engine`): U = coeff - dF/dq, time-major over the m components of
  its order parameters (``edges = time_edges(T, m)``; within a time, a constraint reads only scalars declared
  before it, so the blocks are even triangular);
* a deep spec (:mod:`dmftc.runtime.solvers.causal_solve`): U is the dual x primal block of the action Hessian in causal
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
from dmftc.runtime.numerics.devices import one_blas_thread

__all__ = ["asymmetry", "block_inverses", "congruence", "coupled_sandwich", "cross_components", "kernel_back",
           "time_edges", "time_major_edges", "factor", "left_solve", "lower_inverse", "right_solve", "sandwich",
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


def block_inverses(U, edges, why: str = _WHY):
    """[(inverse, 1-norm condition number)] of U's diagonal blocks by time: batched (one LAPACK call) when the
    blocks have one size, else block by block; a singular or non-finite block raises NumericalError naming its
    time (:func:`_diagonal_block`)."""
    sizes = np.diff(edges)
    T = len(sizes)
    if T and np.all(sizes == sizes[0]) and edges[0] == 0:
        m = int(sizes[0])
        t = np.arange(T)
        blk = U[: T * m, : T * m].reshape(T, m, T, m)[t, :, t, :]              # (T, m, m)
        if np.all(np.isfinite(blk)):
            try:
                inv = np.linalg.inv(blk)
            except np.linalg.LinAlgError:
                inv = None
            if inv is not None:
                cond = np.abs(blk).sum(axis=1).max(axis=1) * np.abs(inv).sum(axis=1).max(axis=1)
                if np.all(cond < BLOCK_CONDITION):
                    return [(inv[b], float(cond[b])) for b in range(T)]
    out = []                                      # one size or not, name the first bad time
    for b in range(T):
        lu, cond = _diagonal_block(U, edges, b, why)
        out.append((sla.lu_solve(lu, np.eye(edges[b + 1] - edges[b]), check_finite=False), cond))
    return out


def lower_inverse(U, edges, *, why: str = _WHY):
    """(U^-1, the largest diagonal-block condition number) for a block lower triangular U: the inverse of each
    diagonal block, then recursively on halves of the times, inv([[A, 0], [C, D]]) = [[A^-1, 0],
    [-D^-1 C A^-1, D^-1]]: about n^3 / 3 multiply-adds in matrix products (a third of one n x n matmul)."""
    U = np.asarray(U, dtype=float)
    edges = np.asarray(edges)
    n = U.shape[0]
    inv = block_inverses(U, edges, why)
    X = np.zeros((n, n))

    def fill(b0, b1):
        if b1 - b0 == 1:
            X[edges[b0]:edges[b1], edges[b0]:edges[b1]] = inv[b0][0]
            return
        mid = (b0 + b1) // 2
        fill(b0, mid)
        fill(mid, b1)
        a0, a1, a2 = edges[b0], edges[mid], edges[b1]
        X[a1:a2, a0:a1] = -(X[a1:a2, a1:a2] @ (U[a1:a2, a0:a1] @ X[a0:a1, a0:a1]))

    if len(edges) > 1:
        fill(0, len(edges) - 1)
    return X, max([1.0] + [c for _, c in inv])


def kernel_back(back, U, edges, E, why: str = _WHY):
    """(Y, the largest diagonal-block condition number) with Y U = E (``E=None``: U^-1) by a generated Numba
    kernel ``back(U, E, edges) -> (Y, cond by time)`` (:mod:`dmftc.codegen.solve_kernels`); the diagonal blocks are
    checked as by :func:`left_solve` (the first singular one from the last time is named)."""
    U = np.ascontiguousarray(U, dtype=float)
    edges = np.ascontiguousarray(edges, dtype=np.int64)
    E = np.eye(U.shape[0]) if E is None else np.ascontiguousarray(E, dtype=float)
    Y, cond = back(U, E, edges)
    bad = np.flatnonzero(~(cond < BLOCK_CONDITION))
    if len(bad):
        b = int(bad.max())
        lo, hi = edges[b], edges[b + 1]
        if not np.all(np.isfinite(U[lo:hi, lo:hi])):
            raise NumericalError(f"non-finite entries in the diagonal block of U at time {b}")
        m = hi - lo
        raise NumericalError(f"U is singular at time {b}: condition number {cond[b]:.3g} of its {m} x {m} diagonal "
                             f"block (the propagator does not exist; {why})")
    return Y, max(1.0, float(cond.max(initial=1.0)))


def left_solve(U, edges, E=None, *, why: str = _WHY, back=None):
    """Y with Y U = E (block back substitution from the last time); ``E=None``: Y = U^-1 (:func:`lower_inverse`,
    the block upper triangle zero).  Returns (Y, the largest diagonal-block condition number); a singular block
    raises NumericalError naming its time.  ``back``: a generated kernel that does it (:func:`kernel_back`)."""
    if back is not None:
        return kernel_back(back, U, edges, E, why)
    if E is None:
        return lower_inverse(U, edges, why=why)
    U = np.asarray(U)
    edges = np.asarray(edges)
    n = U.shape[0]
    Y = np.zeros((E.shape[0], n))
    worst = 1.0
    # one BLAS thread: a chain of small products and LU solves, between which a multithreaded BLAS's threads wait
    # (measured on 2 cores, deep L = 3, T = 10, n = 540, 80 rows: 70 ms on two threads, 2.5-3.3 ms on one)
    with one_blas_thread():
        for b in range(len(edges) - 2, -1, -1):
            lo, hi = edges[b], edges[b + 1]
            lu, cond = _diagonal_block(U, edges, b, why)
            worst = max(worst, cond)
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
    """max |K - K^T| / max |K| of a square K, by square tiles of ``rows`` on and below the diagonal, each against
    its mirror: no temporary of K's size (K is the largest array of a deep propagator), every pair compared
    once, and a tile's transpose read within the cache (L = 2, T = 50: 0.19 s where whole row blocks against
    column blocks took 0.66 s)."""
    K = np.asarray(K)
    scale = max(float(K.max(initial=0.0)), -float(K.min(initial=0.0)), 1e-300)
    worst = 0.0
    for i0 in range(0, K.shape[0], rows):
        for j0 in range(0, i0 + 1, rows):
            tile, mirror = K[i0:i0 + rows, j0:j0 + rows], K[j0:j0 + rows, i0:i0 + rows]
            worst = max(worst, float(np.abs(tile - mirror.T).max(initial=0.0)))
    return worst / scale


def congruence(Y, K):
    """Y K Y^T (with K symmetric): by two triangular products (BLAS trmm, half the multiply-adds of two matmuls)
    when Y is lower triangular, else by two matrix products."""
    if np.any(np.triu(Y, 1)):
        return Y @ K @ Y.T
    Z = sla.blas.dtrmm(1.0, Y, K, lower=1)                 # Y K
    return sla.blas.dtrmm(1.0, Y, Z.T, lower=1)            # Y (Y K)^T = Y K^T Y^T


def cross_components(U, T: int) -> np.ndarray:
    """(m,) bool for a time-major U of T steps (m components per time): the components whose columns of U reach
    later times (nonzero below the diagonal blocks).  A two-layer U couples times only through the order
    parameters the fields and running sums read (the drivers); every other column stays in its diagonal block."""
    n = U.shape[0]
    m = n // T
    nz = np.asarray(U).reshape(T, m, T, m).any(axis=1)                    # (T, T, m): [t, s, component]
    return np.any(nz & np.tril(np.ones((T, T), dtype=bool), -1)[:, :, None], axis=(0, 1))


def _coupled_inverse(U, T: int, cross, why: str):
    """U^-1 = (I + B E^T) D^-1, with D U's block diagonal and E^T picking the ``cross`` components: (D^-1 as
    (T, m, m), B (n, T c), the flat indices of the cross components, the worst block condition number).
    U = D - A E^T with A the columns of the cross components below the diagonal blocks; by Woodbury U^-1 =
    (I + A' W E^T) D^-1, A' = D^-1 A, W = (I - E^T A')^-1 (T c x T c, unit lower triangular): O(n (T c)^2)."""
    n = U.shape[0]
    m = n // T
    inv = block_inverses(U, time_edges(T, m), why)
    Dinv = np.stack([x for x, _ in inv])                                   # (T, m, m)
    ci = (np.arange(T)[:, None] * m + np.flatnonzero(cross)[None, :]).ravel()
    c = int(np.count_nonzero(cross))
    A = -U[:, ci].reshape(T, m, T, c)
    A[np.arange(T), :, np.arange(T), :] = 0.0                               # the diagonal blocks are in D
    A = A.reshape(n, T * c)
    if not np.all(Dinv == np.eye(m)):
        A = np.matmul(Dinv, A.reshape(T, m, T * c)).reshape(n, T * c)     # A' = D^-1 A
    # B = A' W = A' (I - E^T A')^-1: B^T by one triangular solve with n right-hand sides
    B = sla.solve_triangular(np.eye(T * c) - A[ci], A.T, trans="T", lower=True, unit_diagonal=True,
                             check_finite=False).T
    return Dinv, B, ci, max([1.0] + [k for _, k in inv])


def coupled_sandwich(U, K, T: int, cross, *, why: str = _WHY, half: bool = False):
    """(U^-1 K U^-T, ||U^-1||_1, the worst diagonal-block condition number) for a time-major U whose columns
    reach later times only at the ``cross`` components (:func:`cross_components`) and a symmetric K.  With
    X = U^-1 = (I + B E^T) D^-1 (:func:`_coupled_inverse`) and K' = D^-1 K D^-T: X K X^T = K' + H + H^T,
    H = B (E^T K' + K'_cc B^T / 2): one product of n x T c by T c x n, n^2 T c multiply-adds (T c / n of one
    n x n matmul) instead of the n^3 of a dense solve.  ``half``: H' = H + K' / 2 instead, the propagator
    being H' + H'^T (for a caller that sums propagators and symmetrises the sum once)."""
    U = np.asarray(U, dtype=float)
    n = U.shape[0]
    m = n // T
    Dinv, B, ci, worst = _coupled_inverse(U, T, cross, why)
    identity = bool(np.all(Dinv == np.eye(m)))
    K = np.asarray(K, dtype=float)
    if not identity:                                                       # K' = D^-1 K D^-T
        K4 = np.matmul(Dinv[:, None], K.reshape(T, m, T, m).transpose(0, 2, 1, 3))          # (T, T, m, m)
        K = np.matmul(K4, np.swapaxes(Dinv, 1, 2)[None]).transpose(0, 2, 1, 3).reshape(n, n)
    G = K[ci, :]
    G += 0.5 * (G[:, ci] @ B.T)
    S = B @ G
    S += 0.5 * K                         # H' = B G + K / 2
    if not half:
        S += S.T                        # H' + H'^T: exactly symmetric
    if identity:                         # the columns of X: unit vectors, and 1 + |B| at the cross components
        norm = 1.0 + float(np.abs(B).sum(axis=0).max(initial=0.0))
    else:
        sel = np.flatnonzero(cross)
        X = np.einsum("nsc,scj->nsj", B.reshape(n, T, -1), Dinv[:, sel, :]).reshape(n, n)
        X.reshape(T, m, T, m)[np.arange(T), :, np.arange(T), :] += Dinv
        norm = float(np.abs(X).sum(axis=0).max())
    return S, norm, worst


def sandwich(U, K, edges, E=None, *, why: str = _WHY, check_asymmetry: bool = True, half: bool = False,
             back=None):
    """(S, info): S = E U^-1 K U^-T E^T (symmetrised; E=None: the whole U^-1 K U^-T) and info with 'block_cond'
    (the largest diagonal-block condition number), 'asymmetry' of K (unless ``check_asymmetry`` is false: a K
    symmetric by construction), and for the whole propagator 'cond' (U's 1-norm condition number).  ``half``:
    S is a matrix H with E U^-1 K U^-T E^T = H + H^T, not symmetrised (a caller summing several propagators
    symmetrises the sum once: saves one n x n transposed addition each).
    NumericalError for a singular block, an ill-conditioned U (whole propagator), or a non-finite result.
    ``back``: a generated Numba kernel for the block back substitution (:func:`kernel_back`; not for the
    time-major U of a two-layer spec, which the cross-column solve takes)."""
    S = None
    T = len(edges) - 1
    n = np.shape(U)[0]
    coupled = E is None and T > 1 and n % T == 0 and np.array_equal(edges, time_edges(T, n // T))
    if coupled and back is None:
        cross = cross_components(np.asarray(U), T)
        coupled = 2 * np.count_nonzero(cross) <= n // T          # cheaper than the dense inverse
    if coupled and back is None:
        S, inv_norm, worst = coupled_sandwich(U, K, T, cross, why=why, half=half)
    else:
        Y, worst = left_solve(U, edges, E, why=why, back=back)
        inv_norm = float(np.abs(Y).sum(axis=0).max()) if E is None else None
    info = {"block_cond": worst}
    if check_asymmetry:
        info["asymmetry"] = asymmetry(K)
    if E is None:
        cond = float(np.abs(U).sum(axis=0).max()) * inv_norm
        info["cond"] = cond
        if not cond < MAX_CONDITION:
            raise NumericalError(f"U is ill-conditioned (condition number {cond:.3g} > {MAX_CONDITION:.0e}); the "
                                 "linear response is unstable: the propagator would be meaningless")
    if S is None:
        S = congruence(Y, K) if E is None else Y @ K @ Y.T
        S = (0.25 if half else 0.5) * (S + S.T)
    if not np.all(np.isfinite(S)):
        whole = "" if E is not None else f", U condition number {info['cond']:.3g}"
        raise NumericalError(f"the propagator is not finite (largest diagonal-block condition number of U "
                             f"{worst:.3g}{whole})")
    return S, info
