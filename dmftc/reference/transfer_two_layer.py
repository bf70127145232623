"""The Jacobian dF/dDelta of ``specs/two_layer.dmft`` by per-path transfer matrices and BLAS products, written by
hand for that network: an oracle for the tests and the measured design of a faster tangent pass.

The site engine (:mod:`dmftc.runtime.sensitivities.site_tangents`) carries each path's tangents along all T driving directions
through the march: O(S T^2) elementwise updates.  But a two-layer path's memory is a handful of running sums x
(here k = 2: I1 = sum eta Delta g, I2 = sum eta Delta phi(h)); the fields at step t are functions of x(t) and the
sources.  Linearised, one step is x(t + 1) = M_t x(t) + b_t dDelta(t) with per-path M_t (k x k) and b_t (k),
and an average's integrand at t changes by c_t . x(t).  So, with Phi(t, s) = M_{t-1} ... M_s,

    dF_a(t) / dDelta(s) = sum_paths w c_a(t)^T Phi(t, s + 1) b_s,      s < t,

a sum over the paths of products of per-path factors: matrix products over (paths x k).  Phi is never formed
across the whole march (its two factors could grow like exp(eta T |M'|) and lose digits); the march is cut into
segments of ``segment`` steps with A(t) = Phi(t, start of t's segment):

* within a segment: c_a(t)^T A(t) times A(s + 1)^-1 b_s (a well-conditioned k x k inverse over a short segment);
* across segments: the right factors Z(s) = Phi(start of the current segment, s + 1) b_s of all earlier steps are
  carried forward one segment at a time (Z <- A(end) Z), and the block of rows t of the segment is one product
  (4 segment, S k) @ (S k, earlier steps).

Costs per path: O(T k^2) for the march and the factors, O(T^2 k^2 / segment) to carry Z, and 4 k T^2 for the
products, which run at BLAS speed; paths in chunks of ``chunk`` keep Z (k x chunk x T floats) small.  Agreement
with the engine's tangent march on the same paths: tests/test_transfer_two_layer.py; time:
benchmarks/bench_transfer_two_layer.py.
"""
from __future__ import annotations

import numpy as np

__all__ = ["AVERAGES", "delta_jacobian"]

AVERAGES = ("Delta", "f_star", "K", "K_star")


def _march(u, u_star, r, w, Delta, gamma: float, kx: float, eta: float):
    """The per-path factors: M (T, k, k, S), b (T, k, S) and c (4, T, k, S), c weighted by the paths' weights."""
    S, T = u.shape[0], Delta.shape[0]
    I1, I2 = np.zeros(S), np.zeros(S)
    M, b, c = np.empty((T, 2, 2, S)), np.empty((T, 2, S)), np.empty((4, T, 2, S))
    for t in range(T):
        h, hs, z = u + gamma * I1, u_star + gamma * kx * I1, r + gamma * I2
        th, ths = np.tanh(h), np.tanh(hs)
        d1, d1s = 1 - th ** 2, 1 - ths ** 2                   # phi'
        g, gs = d1 * z, d1s * z
        dh, dhs, dz = (gamma, 0.0), (gamma * kx, 0.0), (0.0, gamma)       # d(field) / d(I1, I2)
        dg = (-2 * th * d1 * z * gamma, d1 * gamma)
        dgs = (-2 * ths * d1s * z * gamma * kx, d1s * gamma)
        for k in range(2):
            c[0, t, k] = -(dz[k] * th + z * d1 * dh[k]) / gamma * w                 # (r phi(u) - z phi(h)) / gamma
            c[1, t, k] = (dz[k] * ths + z * d1s * dhs[k]) / gamma * w               # (z phi(h*) - r phi(u*)) / gamma
            c[2, t, k] = (2 * g * dg[k] + 2 * th * d1 * dh[k]) * w                  # phi(h)^2 + g^2
            c[3, t, k] = (th * d1s * dhs[k] + ths * d1 * dh[k] + kx * (dg[k] * gs + g * dgs[k])) * w
        M[t, 0, 0], M[t, 0, 1] = 1 + eta * Delta[t] * dg[0], eta * Delta[t] * dg[1]
        M[t, 1, 0], M[t, 1, 1] = eta * Delta[t] * d1 * dh[0], 1.0
        b[t, 0], b[t, 1] = eta * g, eta * th
        I1, I2 = I1 + eta * Delta[t] * g, I2 + eta * Delta[t] * th
    return M, b, c


def _contract(M, b, c, segment: int):
    """(4, T, T): sum over the paths of c_a(t)^T Phi(t, s + 1) b_s for s < t (module doc)."""
    T, S = b.shape[0], b.shape[-1]
    G = np.zeros((4, T, T))
    Z = np.zeros((2, S, 0))
    for a0 in range(0, T, segment):
        a1 = min(T, a0 + segment)
        n = a1 - a0
        A = np.zeros((n + 1, 2, 2, S))
        A[0, 0, 0] = A[0, 1, 1] = 1.0
        for k in range(n):
            A[k + 1] = M[a0 + k][:, 0, None] * A[k][None, 0] + M[a0 + k][:, 1, None] * A[k][None, 1]
        cs = c[:, a0:a1]
        left = (cs[:, :, 0, None] * A[None, :n, 0] + cs[:, :, 1, None] * A[None, :n, 1]).reshape(4 * n, 2 * S)
        A1, bb = A[1:], b[a0:a1]
        det = A1[:, 0, 0] * A1[:, 1, 1] - A1[:, 0, 1] * A1[:, 1, 0]
        right = np.stack([(A1[:, 1, 1] * bb[:, 0] - A1[:, 0, 1] * bb[:, 1]) / det,
                          (A1[:, 0, 0] * bb[:, 1] - A1[:, 1, 0] * bb[:, 0]) / det], axis=0)     # (2, n, S)
        right = np.ascontiguousarray(right.transpose(0, 2, 1))                                    # (2, S, n)
        if a0:
            G[:, a0:a1, :a0] = (left @ Z.reshape(2 * S, a0)).reshape(4, n, a0)
        G[:, a0:a1, a0:a1] = np.tril((left @ right.reshape(2 * S, n)).reshape(4, n, n), -1)
        Z = np.concatenate([Z, right], axis=2)
        Z = A[n][:, 0, :, None] * Z[None, 0] + A[n][:, 1, :, None] * Z[None, 1]
    return G


def delta_jacobian(u, u_star, r, Delta, *, gamma: float, kx: float, eta: float, weights=None,
                   segment: int = 25, chunk: int = 2500) -> np.ndarray:
    """(4, T, T): d <average_a>(t) / d Delta(s) of ``specs/two_layer.dmft`` (tanh) at the order parameter
    ``Delta`` (T,) held fixed, averaged over the paths with sources ``u, u_star, r`` (S,) and ``weights`` (S,;
    default 1 / S), for a in :data:`AVERAGES`.  Zero for s >= t (causality: Delta(s) moves the fields from s + 1)."""
    u, u_star, r = (np.asarray(x, np.float64).reshape(-1) for x in (u, u_star, r))
    Delta = np.asarray(Delta, np.float64).reshape(-1)
    S = u.shape[0]
    w = np.full(S, 1.0 / S) if weights is None else np.asarray(weights, np.float64)
    G = np.zeros((4, Delta.shape[0], Delta.shape[0]))
    for a in range(0, S, chunk):
        sl = slice(a, min(S, a + chunk))
        G += _contract(*_march(u[sl], u_star[sl], r[sl], w[sl], Delta, gamma, kx, eta), segment)
    return G
