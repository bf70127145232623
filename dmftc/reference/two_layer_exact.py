"""Exact Gaussian backend for processes proven linear (``NONLINEAR is None`` in the module).

When every field is affine in the Gaussian sources x ~ N(0, I) (order parameters
given), the march needs only n + 1 "samples": x = 0 and the unit vectors e_i.
Fields evaluated there determine them exactly, F(x) = F(0) + A x.  Observables
are polynomials of degree <= 2 in x, Q(x) = c + b.x + x.H.x / 2, so

    <Q> = c + tr(H) / 2,        Cov(Q1, Q2) = b1.b2 + tr(H1 H2) / 2   (Isserlis),

with b and H from JAX autodiff at x = 0 (exact for polynomials), and D is the
exact derivative of <Q(t)> with respect to the driving order parameters
(``jax.jacfwd`` through the same march).  No Monte Carlo: results are
deterministic and need no ``samples`` or ``seed``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dmftc.runtime.numerics import kernels as _k
from dmftc.reference.two_layer_kernels import place_sources, single_site
from dmftc.reference.two_layer_kernels import tangent_shape as _tangent_shape
from dmftc.runtime.numerics.geometry import source_factors


def basis_sources(mod, p, sz):
    """Sources at x = 0 and x = e_i (i over all standard-normal coordinates), uniform layout."""
    factors = source_factors(mod, p, sz)
    n = sum(L.shape[1] for L in factors)
    xs, off = [], 0
    for L in factors:
        x = np.zeros((n + 1, L.shape[0]))
        x[1 + off:1 + off + L.shape[1]] = L.T       # point 1+off+i carries column i of the factor
        xs.append(x)
        off += L.shape[1]
    return place_sources(mod, xs), n


def _affine(values, x):
    """Evaluate affine functions known at 0 and e_i (leading axis of ``values``) at ``x``."""
    base = values[:1]
    slope = values[1:] - base
    return base + jnp.tensordot(x, slope, axes=(0, 0))[None]


def _quadratic_stats(mod, F, S, p, sz, n):
    """Constant, gradient and Hessian (in x at 0) of every observable; exact for degree <= 2."""
    def Q(x):
        Fx = {k: _affine(v, x) for k, v in F.items()}
        Sx = {k: _affine(v, x) for k, v in S.items()}
        return mod.observables(Fx, Sx, p, sz)

    x0 = jnp.zeros(n)
    return Q(x0), jax.jacfwd(Q)(x0), jax.jacfwd(jax.jacfwd(Q))(x0)


def _march(mod, geo, S, n, p, sz, T):
    """Exact march: saddle point, observable statistics and sensitivities D in one forward pass.

    The sensitivity state (running-sum tangents, one column per source time s) is carried on the
    same n + 1 points; the observable tangents are bilinear in (fields, tangents), hence
    quadratic in x, and averaged exactly like the observables.
    """
    eta = p[mod.TIME["step"]]
    R0 = {k: jnp.zeros(geo.shape(k, n + 1)) for k in mod.SAMPLE_SUMS}
    Rq0 = {k: jnp.zeros(geo.shape(k)) for k in mod.ORDER_SUMS}
    T0 = {d: {f"d{k}/d{d}": jnp.zeros(_tangent_shape(mod, geo, k, d, n + 1, T)) for k in mod.SAMPLE_SUMS}
          for d in mod.DRIVERS}
    qshape = {k: geo.shape(k) for k, _ in mod.ORDERS}

    def step(carry, t):
        R, Rq, Ts = carry
        F = mod.fields(S, R, p, sz)
        c, b, H = _quadratic_stats(mod, F, S, p, sz, n)
        mean = {k: c[k] + 0.5 * jnp.trace(H[k], axis1=-2, axis2=-1) for k in c}
        q = {k: jnp.broadcast_to(jnp.asarray(v, dtype=jnp.float64), qshape[k])
             for k, v in mod.saddle(mean, Rq, p, sz).items()}
        onehot = _k.onehot(t, T, mod.RANK)
        Tn, D = {}, {}
        for d in mod.DRIVERS:
            tangent = getattr(mod, f"tangents_{d}")
            _, inc, _ = tangent(Ts[d], F, q, p, sz, onehot)          # affine: exact on the points
            Tn[d] = {k: Ts[d][k] + eta * inc[k] for k in Ts[d]}

            def dQ(x, d=d, tangent=tangent):
                Tx = {k: _affine(v, x) for k, v in Ts[d].items()}
                Fx = {k: _affine(v, x) for k, v in F.items()}
                return tangent(Tx, Fx, q, p, sz, onehot)[2]

            x0 = jnp.zeros(n)
            c0, H0 = dQ(x0), jax.jacfwd(jax.jacfwd(dQ))(x0)
            for k in c0:
                D[(k, d)] = c0[k] + 0.5 * jnp.trace(H0[k], axis1=-2, axis2=-1)
        inc = mod.sample_increments(F, q, p, sz)
        R = {k: R[k] + eta * inc[k] for k in R}
        oinc = mod.order_increments(q, p, sz)
        return (R, {k: Rq[k] + eta * oinc[k] for k in Rq}, Tn), (q, Rq, b, H, D)

    _, out = jax.lax.scan(step, (R0, Rq0, T0), jnp.arange(T))
    return out


def exact_moments(mod, geo, p, sz, T):
    """(q, Rq, kappa over observables (time-major), D) computed without sampling."""
    S, n = basis_sources(mod, p, sz)
    pj = {k: jnp.asarray(v, dtype=jnp.float64) for k, v in p.items()}
    q, Rq, b, H, Dt = jax.jit(lambda S, p: _march(mod, geo, S, n, p, sz, T))(S, pj)
    obs = single_site(mod)
    # gradients (T, 1, axes, 1, n) and Hessians (..., n, n) -> rows ordered (t, observable components)
    Bs = [_k.canonical(np.asarray(b[k])[:, 0], mod.STORED_AXES[k] + (mod.RANK - 1,), keep_s=True)
          .reshape(T, geo.size(k), n) for k in obs]
    Hs = [_k.canonical(np.asarray(H[k])[:, 0], mod.STORED_AXES[k] + (mod.RANK - 1, mod.RANK), keep_s=True)
          .reshape(T, geo.size(k), n, n) for k in obs]
    m_obs = sum(geo.size(k) for k in obs)
    Bm = np.concatenate(Bs, axis=1).reshape(T * m_obs, n) if obs else np.zeros((0, n))
    Hm = np.concatenate(Hs, axis=1).reshape(T * m_obs, n, n) if obs else np.zeros((0, n, n))
    kappa = Bm @ Bm.T + 0.5 * np.einsum("aij,bji->ab", Hm, Hm)
    D = {}
    for (k, d), v in Dt.items():   # (T, 1, axes_k + primed axes_d, T_s)
        ak = tuple(a + 1 for a in mod.STORED_AXES[k]) + tuple(a + 1 for a in mod.PRIMED_AXES[d])
        D[(k, d)] = _k.canonical(np.asarray(v), ak, keep_s=True).reshape(T, geo.size(k), geo.size(d), T)
    return q, Rq, kappa, D
