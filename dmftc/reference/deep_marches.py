"""The deep saddle marches written out in numpy: independent oracles for the one march of
:mod:`dmftc.runtime.march.deep_dmft`.  Not on the user's path.

* ``numpy_mc_saddle``: path by path on given sources, the per-path tangents stored as (S, T, T) arrays (the
  one march's ``march_paths``, which :func:`dmftc.runtime.engines.deep_propagator.mc_saddle` uses);
* ``numpy_linear_saddle``: the exact march of a linear network on the fields' coefficient rows over the
  sources (the one march's ``march_exact``, which :func:`dmftc.runtime.engines.deep_linear.deep_linear_saddle` uses).

Every coupling is read from the DeepModel directly; the tests check each against the one march.
"""
from __future__ import annotations

import math

import numpy as np
import scipy.linalg as sla

from dmftc.runtime.problem.activation import as_activation
from dmftc.errors import NumericalError
from dmftc.runtime.problem.deep_action import Saddle, make_saddle
from dmftc.runtime.problem.standard_spec import as_model
from dmftc.runtime.engines.deep_propagator import MarchFields

__all__ = ["numpy_mc_saddle", "numpy_linear_saddle"]

_PIVOT_TOL = 1e-10


def _extend_cholesky(Cf, krow, t):
    """Row t of the causal Cholesky factor Cf of a PSD kernel with row t (s <= t) ``krow``; zero pivots
    (residual variance below _PIVOT_TOL K(t,t)) are kept as zero columns (rank-deficient kernels)."""
    live = np.diagonal(Cf)[:t] > 0
    x = np.zeros(t)
    if live.any():
        x[live] = sla.solve_triangular(Cf[:t, :t][np.ix_(live, live)], krow[:t][live], lower=True)
    d = krow[t] - x @ x
    Cf[t, :t] = x
    Cf[t, t] = math.sqrt(d) if d > _PIVOT_TOL * max(krow[t], 0.0) else 0.0


def numpy_mc_saddle(*, activation, L, T, xiu, xir, weights=None, model=None, gamma=None, y=None, eta=None):
    """Discrete-time DMFT march of the model's single-site processes on given standard normals xiu, xir
    (L, S, T) (sources u^l = chol(Phi[l-1]) xi, r^l = chol(G[l+1]) xi, extended causally).  Returns
    (deep_action.Saddle, MarchFields).  All averages are sample means over these S paths, the readout's included:
    Delta(t) = y0 + c_t <z^L phi(h^L)>(t) + c_0 <z^L phi(h^L)>(0) (module deep_model), f = y0 - Delta."""
    model = as_model(model, gamma, y, eta, L=L)
    site = as_activation(activation)
    act = lambda h: site.numpy(h)[:3]                                  # noqa: E731
    S = xiu.shape[1]
    wt = np.ones(S) if weights is None else np.asarray(weights, float) * (S / np.sum(weights))
    kh = lambda q, d: np.asarray(model.k_h(q, d), float)               # noqa: E731
    kz = lambda q, d: np.asarray(model.k_z(q, d), float)               # noqa: E731
    Phi = [model.phi0 * np.ones((T, T))] + [np.zeros((T, T)) for _ in range(L)]        # index 0..L
    G = [None] + [np.zeros((T, T)) for _ in range(L)] + [model.g_top * np.ones((T, T))]  # index 1..L+1
    Rphi = [np.zeros((T, T)) for _ in range(L + 1)]                    # index 0..L (0: zero)
    Rg = [np.zeros((T, T)) for _ in range(L + 2)]                      # index 1..L+1 (L+1: zero)
    Cu = [None] + [np.zeros((T, T)) for _ in range(L)]
    Cr = [None] + [np.zeros((T, T)) for _ in range(L)]
    new = lambda: [None] + [np.zeros((S, T)) for _ in range(L)]        # noqa: E731
    u, r, h, z, P, D1, D2, g = (new() for _ in range(8))
    tan = lambda: [None] + [np.zeros((S, T, T)) for _ in range(L)]     # noqa: E731  [n, t, s]
    Dhu, Dhr, Dpu, Dpr, Dgu, Dgr = (tan() for _ in range(6))
    Delta, f, fz = np.zeros(T), np.zeros(T), np.zeros(T)
    for t in range(T):
        for l in range(1, L + 1):                                      # forward sweep
            _extend_cholesky(Cu[l], Phi[l - 1][t], t)
            u[l][:, t] = xiu[l - 1][:, : t + 1] @ Cu[l][t, : t + 1]
            c = Rphi[l - 1][t, :t] + kh(Phi[l - 1][t, :t], Delta[:t])
            h[l][:, t] = u[l][:, t] + g[l][:, :t] @ c
            Dhu[l][:, t] = np.einsum("nsk,s->nk", Dgu[l][:, :t], c)
            Dhu[l][:, t, t] += 1.0
            Dhr[l][:, t] = np.einsum("nsk,s->nk", Dgr[l][:, :t], c)
            p, d1, d2 = act(h[l][:, t])
            P[l][:, t], D1[l][:, t], D2[l][:, t] = p, d1, d2
            Dpu[l][:, t] = d1[:, None] * Dhu[l][:, t]
            Dpr[l][:, t] = d1[:, None] * Dhr[l][:, t]
            row = (wt * p) @ P[l][:, : t + 1] / S
            Phi[l][t, : t + 1] = row
            Phi[l][: t + 1, t] = row
            Rphi[l][t, :t] = wt @ Dpr[l][:, t, :t] / S
        for l in range(L, 0, -1):                                      # backward sweep
            _extend_cholesky(Cr[l], G[l + 1][t], t)
            r[l][:, t] = xir[l - 1][:, : t + 1] @ Cr[l][t, : t + 1]
            e = Rg[l + 1][t, : t + 1].copy()
            e[:t] += kz(G[l + 1][t, :t], Delta[:t])
            z[l][:, t] = r[l][:, t] + P[l][:, : t + 1] @ e
            dzu = np.einsum("nsk,s->nk", Dpu[l][:, : t + 1], e)
            dzr = np.einsum("nsk,s->nk", Dpr[l][:, : t + 1], e)
            dzr[:, t] += 1.0
            d1, d2 = D1[l][:, t], D2[l][:, t]
            g[l][:, t] = d1 * z[l][:, t]
            Dgu[l][:, t] = (d2 * z[l][:, t])[:, None] * Dhu[l][:, t] + d1[:, None] * dzu
            Dgr[l][:, t] = (d2 * z[l][:, t])[:, None] * Dhr[l][:, t] + d1[:, None] * dzr
            row = (wt * g[l][:, t]) @ g[l][:, : t + 1] / S
            G[l][t, : t + 1] = row
            G[l][: t + 1, t] = row
            Rg[l][t, : t + 1] = wt @ Dgu[l][:, t, : t + 1] / S
        fz[t] = np.mean(wt * z[L][:, t] * P[L][:, t])
        Delta[t] = model.error_signal(fz[t], fz[0])
        f[t] = model.y0 - Delta[t]
        rows = [Phi[l][t] for l in range(1, L + 1)] + [G[l][t] for l in range(1, L + 1)] + [Delta[t:t + 1]]
        if not all(np.all(np.isfinite(r)) for r in rows) or max(np.abs(r).max() for r in rows) > 1e150:
            raise NumericalError(f"the Monte Carlo DMFT march diverges at step t={t} (non-finite or > 1e150 order "
                                 "parameters); reduce the learning rate or the feature strength")
    K = np.asarray(model.k_of([np.diag(Phi[l]) for l in range(L + 1)], [np.diag(G[l]) for l in range(1, L + 2)]),
                   float)
    sad = make_saddle(model, L, T, Delta, f, K, Phi[1:], G[1:L + 1], Rphi[1:], Rg[1:L + 1])
    fields = MarchFields([np.concatenate([u[l], r[l]], axis=1) for l in range(1, L + 1)],
                     [np.concatenate([h[l], z[l]], axis=1) for l in range(1, L + 1)])
    return sad, fields


def numpy_linear_saddle(*, L: int, T: int, model=None, gamma: float | None = None, y: float | None = None,
                       eta: float | None = None) -> Saddle:
    """Exact infinite-width solution of the discrete-time DMFT of an L-hidden-layer linear network whose action
    is ``model``'s (a :class:`dmftc.runtime.problem.deep_model.DeepModel`; default the standard network with gamma, y, eta).

    Every field of layer l is linear in that layer's sources w = (u^l(0..T-1), r^l(0..T-1)),
    Cov(w) = diag(Phi[l-1], G[l+1]); we march the coefficient rows of h^l(t), z^l(t) causally
    (forward sweep over layers for h, then f(t), then backward sweep for z), so all averages are exact
    quadratic forms.  Responses are coefficients: Rphi[l](t,s) = dh^l(t)/dr^l(s), Rg[l](t,s) = dz^l(t)/du^l(s).
    """
    L, T = int(L), int(T)
    if L < 1 or T < 1:
        raise ValueError("need L >= 1 and T >= 1")
    model = as_model(model, gamma, y, eta, L=L)
    kh = lambda q, d: np.asarray(model.k_h(q, d), float)               # noqa: E731
    kz = lambda q, d: np.asarray(model.k_z(q, d), float)               # noqa: E731
    ones = np.ones((T, T))
    Phi = [model.phi0 * ones] + [np.zeros((T, T)) for _ in range(L)]          # index 0..L
    G = [None] + [np.zeros((T, T)) for _ in range(L)] + [model.g_top * ones]   # index 1..L+1
    H = [None] + [np.zeros((T, 2 * T)) for _ in range(L)]
    Z = [None] + [np.zeros((T, 2 * T)) for _ in range(L)]
    Delta = np.zeros(T)
    f = np.zeros(T)
    fz = np.zeros(T)

    def cov(l, a, b):        # a Sw_l b^T for coefficient rows a (m,2T), b (n,2T)
        return a[:, :T] @ Phi[l - 1] @ b[:, :T].T + a[:, T:] @ G[l + 1] @ b[:, T:].T

    for t in range(T):
        past = np.arange(t)
        for l in range(1, L + 1):                                # forward sweep: h^l(t)
            Rphi_prev = H[l - 1][t, T + past] if l > 1 else np.zeros(t)
            c = Rphi_prev + kh(Phi[l - 1][t, past], Delta[past])
            row = c @ Z[l][past]
            row[t] += 1.0                                        # u^l(t)
            H[l][t] = row
            v = cov(l, H[l][t:t + 1], H[l][: t + 1])[0]
            Phi[l][t, : t + 1] = v
            Phi[l][: t + 1, t] = v
        for l in range(L, 0, -1):                                # backward sweep: z^l(t)
            upto = np.arange(t + 1)
            Rg_next = Z[l + 1][t, upto] if l < L else np.zeros(t + 1)
            e = Rg_next.copy()
            e[:t] += kz(G[l + 1][t, past], Delta[past])
            row = e @ H[l][upto]
            row[T + t] += 1.0                                    # r^l(t)
            Z[l][t] = row
            v = cov(l, Z[l][t:t + 1], Z[l][: t + 1])[0]
            G[l][t, : t + 1] = v
            G[l][: t + 1, t] = v
            if l == L:                                           # readout: Delta = y0 + c_t E_t + c_0 E_0
                fz[t] = cov(L, Z[L][t:t + 1], H[L][t:t + 1])[0, 0]
                Delta[t] = model.error_signal(fz[t], fz[0])
                f[t] = model.y0 - Delta[t]
    K = np.asarray(model.k_of([np.diag(Phi[l]) for l in range(L + 1)], [np.diag(G[l]) for l in range(1, L + 2)]),
                   float)
    Rphi = [np.ascontiguousarray(H[l][:, T:]) for l in range(1, L + 1)]
    Rg = [np.ascontiguousarray(Z[l][:, :T]) for l in range(1, L + 1)]
    return make_saddle(model, L, T, Delta, f, K, Phi[1:], G[1:L + 1], Rphi, Rg, [(H[l], Z[l]) for l in range(1, L + 1)])
