"""The propagator of the requested outputs from Hessian-vector products alone (no U or Kd assembled).

With the causal split of :mod:`dmftc.runtime.solvers.causal_solve`, Hess S = [[0, U^T], [U, Kd]] (primal, dual) and
E Sigma E^T = W Kd W^T with W = E U^-1, E the output rows over the primal variables.  Write U = B + U_l, B the
bilinear part (a signed pairing of each dual with one primal: a sparse permutation) and U_l the layers' ln Z_l.
N = B^-1 U_l is NILPOTENT: U is block lower triangular in time, and within a time block the layers' dependences
form a chain (Phi up the layers, G down, then the responses), so the Neumann series of

    U^T W^T = E^T:    W^T = B^-T sum_k (-U_l^T B^-T)^k E^T

ends after the nilpotency index of N (measured: 2 T + 1 at L = 2, 4 T + 1 at L = 3, i.e. about 2 (L - 1) T + 1
terms; the loop stops when a term is zero to round-off).  Each term is one product U_l^T z for every output
row: a Hessian-vector product of the ln Z_l along a dual direction, read on the primal rows
(:class:`dmftc.runtime.matrix_free.products.ActionProducts`); Kd W^T is one more product per row, read on the
dual rows.  The result equals the causal solve of the assembled blocks on the same paths to round-off
(tests/test_matrix_free.py).

Cost: R (2 (L - 1) T + 2) products for R = (2 L + 2) T outputs, i.e. O(L^2 T^2) products, each O(T^4) per path
(:mod:`.products`): this exact route is NOT cheaper than the dense Hessian (O(T^5) per path); see
docs/how-it-works.md, "A matrix-free propagator".
"""
from __future__ import annotations

import time as _time

import numpy as np
from scipy import sparse
from scipy.sparse.linalg import splu

from dmftc.errors import NumericalError
from dmftc.runtime.solvers.causal_solve import causal_order
from dmftc.runtime.problem.deep_action import Layout, Propagator, bilinear_pairs, observable_map, saddle_point_vector
from dmftc.runtime.matrix_free.products import ActionProducts

__all__ = ["neumann_solve", "matrix_free_propagator"]


def _bilinear_matrix(lay: Layout, co):
    """B (dual x primal, causal order) of the bilinear part, sparse."""
    ia, ib, val = bilinear_pairs(lay)
    r, c, x = [], [], []
    for a, b in ((ia, ib), (ib, ia)):
        sel = ~co.is_primal[a]
        r.append(co.pos[a[sel]])
        c.append(co.pos[b[sel]])
        x.append(val[sel])
    n = len(co.primal)
    return sparse.csc_matrix((np.concatenate(x), (np.concatenate(r), np.concatenate(c))), shape=(n, n))


def neumann_solve(prod: ActionProducts, E, *, tol=1e-14, max_terms=None):
    """(W^T (dual, R), Kd W^T (dual, R), terms): W = E U^-1 for output rows E (R, primal, causal order) by the
    terminating Neumann series of the module doc, from products only."""
    lay = prod.lay
    co = causal_order(lay)
    n = len(co.primal)
    BT = splu(_bilinear_matrix(lay, co).T.tocsc())

    def local_T(Z):                        # U_l^T Z: products along dual directions, read on the primal rows
        D = np.zeros((Z.shape[1], lay.n))
        D[:, co.dual] = Z.T
        return prod.apply(D, bilinear=False)[:, co.primal].T

    Y = np.asarray(E, float).T.copy()
    S = Y.copy()
    terms = 0
    limit = max_terms or n + 1
    while True:
        Y = -local_T(BT.solve(Y))
        terms += 1
        if np.abs(Y).max() <= tol * max(np.abs(S).max(), 1e-300):
            break
        if terms >= limit:
            raise NumericalError(f"the Neumann series of the matrix-free solve did not end after {terms} terms: "
                                 "the layers' part of U is not nilpotent (not a causal saddle?)")
        S += Y
    WT = BT.solve(S)
    D = np.zeros((WT.shape[1], lay.n))
    D[:, co.dual] = WT.T
    KdWT = prod.apply(D, bilinear=False)[:, co.dual].T
    return WT, KdWT, terms


def matrix_free_propagator(sad, fields, *, activation, model=None, chunk=64, batch=8, observables=None):
    """deep_action.Propagator of the time-diagonal observables of one group (its saddle ``sad`` and the paths
    ``fields`` of :func:`dmftc.runtime.engines.deep_propagator.mc_saddle`), from products only (module doc)."""
    model = sad.model if model is None else model
    lay = Layout(sad.L, sad.T)
    co = causal_order(lay)
    t0 = _time.perf_counter()
    prod = ActionProducts(x0=saddle_point_vector(sad), lay=lay, activation=activation, model=model, W=fields.w,
                          X=fields.x, chunk=chunk, batch=batch)
    names, rows, J = observable_map(sad, lay, model) if observables is None else observables(sad, lay)
    E = np.zeros((J.shape[0], len(co.primal)))
    E[:, co.pos[np.arange(J.shape[1])]] = J
    WT, KdWT, terms = neumann_solve(prod, E)
    So = WT.T @ KdWT
    So = 0.5 * (So + So.T)
    if not np.all(np.isfinite(So)):
        raise NumericalError("non-finite propagator in the matrix-free solve")
    sigma = {a: {b: So[np.ix_(rows[a], rows[b])] for b in names} for a in names}
    diag = {"n_vars": lay.n, "neumann_terms": terms, "products": prod.count,
            "time_solve": _time.perf_counter() - t0}
    return Propagator(sad, lay, sigma, None, diag)
