"""Causal linear algebra: U is lower triangular in time-major order.

``U`` couples q(t) only to q(s <= t) (strict causality of every DMFT sum plus a
diagonal same-time block), so ``U^-1`` is applied by forward substitution and
never formed.  The Numba kernel below performs the substitution column by column
while skipping the structurally zero part of each row (entries after the
diagonal, and leading zeros of rows that start late), and is cross-checked
against LAPACK's triangular solve in the tests.
"""
from __future__ import annotations

import numba
import numpy as np
import scipy.linalg

from dmftc.errors import NumericalError


def _check_diagonal(U):
    d = np.abs(np.diag(U))
    scale = max(1.0, float(np.abs(U).max()))
    if d.min() <= 1e-13 * scale:
        i = int(np.argmin(d))
        raise NumericalError(f"U is singular: zero pivot at flattened row {i} (|U_ii| = {d[i]:.3g}); "
                             "a constraint coefficient vanishes")
    return d


def forward_substitute(U, B):
    """Solve U X = B for lower-triangular U (LAPACK trsm)."""
    _check_diagonal(U)
    return scipy.linalg.solve_triangular(U, B, lower=True, check_finite=False)


@numba.njit(cache=True, fastmath=False)
def forward_substitute_numba(U, B):  # pragma: no cover - compiled
    n, k = B.shape
    X = np.empty((n, k))
    first = np.zeros(n, dtype=np.int64)
    for i in range(n):
        j = 0
        while j < i and U[i, j] == 0.0:
            j += 1
        first[i] = j
    for c in range(k):
        for i in range(n):
            acc = B[i, c]
            for j in range(first[i], i):
                acc -= U[i, j] * X[j, c]
            X[i, c] = acc / U[i, i]
    return X


def condition_estimate(U) -> float:
    """1-norm condition number estimate of lower-triangular U (LAPACK trcon)."""
    rcond, info = scipy.linalg.lapack.dtrcon(np.asfortranarray(U), norm="1", uplo="L", diag="N")
    return float("inf") if info != 0 or rcond == 0 else 1.0 / rcond


MAX_CONDITION = 1e12


def causal_sandwich(U, kappa):
    """Sigma = U^-1 kappa U^-T by two forward substitutions; reports conditioning problems."""
    d = _check_diagonal(U)
    cond = condition_estimate(U)
    if not cond < MAX_CONDITION:
        raise NumericalError(f"U is ill-conditioned (condition estimate {cond:.3g} > {MAX_CONDITION:.0e}); "
                             "the linear response is unstable: the propagator would be meaningless")
    Y = forward_substitute(U, kappa)          # U^-1 kappa
    sigma = forward_substitute(U, Y.T)        # U^-1 (U^-1 kappa)^T = U^-1 kappa U^-T
    scale = max(float(np.abs(sigma).max()), 1e-300)
    asym = float(np.abs(sigma - sigma.T).max()) / scale
    if not np.all(np.isfinite(sigma)):
        raise NumericalError(f"the propagator is not finite; U has diagonal range [{d.min():.3g}, {d.max():.3g}] "
                             f"and condition estimate {cond:.3g}")
    if asym > 1e-6:
        raise NumericalError(f"the propagator is not symmetric (relative asymmetry {asym:.3g}) although kappa is; "
                             f"U (condition estimate {cond:.3g}) is too ill-conditioned for the solve")
    return 0.5 * (sigma + sigma.T), cond
