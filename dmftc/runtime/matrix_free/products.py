"""Hessian-vector products of one layer's Monte Carlo ln Z_l, and of the whole action, without forming a Hessian.

ln Z_l = ln Z,  Z = sum_n F_n (v; w_n) (up to the constant 1/S), F_n = exp(ln F) of
:mod:`dmftc.runtime.matrix_free.integrand`.  The dense Hessian that
:class:`dmftc.runtime.sensitivities.local_estimator.LocalEstimator` assembles (with its Price blocks summed pathwise,
``price_tol = None``) is

    H = Hv / Z - g g^T / Z^2 + P + P^T,     g = sum_n dF_n/dv,   Hv = sum_n d2F_n/dv2,
    P[pos_q, :] = fac_q (sum_n d/dv d2F_n/dw_a dw_b / Z - p_q g^T / Z^2),   p_q = sum_n d2F_n/dw_a dw_b,

where q = (a >= b) runs over the entries of the varying source covariances (Phi[l-1], G[l+1]) at their places
pos_q in v, fac_q = 1 (a > b) or 1/2 (Price's theorem; the pure covariance-covariance block is 0 at the saddle,
where F = 1 on every path).  Applied to a direction u, with c_q = fac_q u[pos_q] and D_u F = dF/dv . u:

    H u = sum_n d/dv (D_u F_n) / Z - g (g.u) / Z^2                       forward over reverse, one pass
        + [at pos_q] fac_q (sum_n d2(D_u F_n)/dw_a dw_b / Z - p_q (g.u) / Z^2)
                                                 the source Hessian of D_u F: nx T passes (one per source a)
        + sum_n d/dv sum_q c_q d2F_n/dw_a dw_b / Z - (c.p) g / Z^2
                                                 a contraction of the source Hessian with c: nx T passes

Every sum is over the SAME paths as the dense estimator, so the product equals the dense Hessian times u to
round-off (tests/test_matrix_free.py).  Per path and direction the cost is O(nx T) passes of third-order
autodiff through the integrand, each O(T^3) (dense resolvent products): O(T^4), against the O(T^5) per path of
the dense Hessian; the source-Hessian terms dominate (measured in docs/how-it-works.md).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dmftc.runtime.problem.deep_action import Layout, bilinear_pairs, gather_local
from dmftc.runtime.sensitivities.local_estimator import estimator
from dmftc.runtime.matrix_free.integrand import log_integrand
from dmftc.runtime.sensitivities.site_local import local_map

__all__ = ["LayerProducts", "ActionProducts"]

_FNS: dict = {}


def _kernels(lm, model, T, pa, pb, fa, fb):
    """jitted per-chunk sums: (base sums of F, dF/dv, d2F/dw_a dw_b) and the products for a batch of directions."""
    key = (lm.key, model.key, T, tuple(pa), tuple(pb), float(fa), float(fb))
    if key in _FNS:
        return _FNS[key]
    pa_j, pb_j = jnp.asarray(pa), jnp.asarray(pb)

    def Fn(v, w, x0):
        return jnp.exp(log_integrand(lm, model, v, w, x0, T=T, fa=fa, fb=fb))

    def base(v, W, X0, mask):
        def one(w, x0):
            F, g = jax.value_and_grad(Fn)(v, w, x0)
            p = jax.hessian(Fn, argnums=1)(v, w, x0)[pa_j, pb_j]
            return F, g, p
        F, g, p = jax.vmap(one)(W, X0)
        return mask @ F, mask @ g, mask @ p

    def prod(v, U, Vt, W, X0, mask):
        n = W.shape[1]
        eye = jnp.eye(n)

        def one_path(w, x0):
            def one_dir(u, vt):
                DuF = lambda vv, ww: jax.jvp(lambda v_: Fn(v_, ww, x0), (vv,), (u,))[1]   # noqa: E731
                Hu = jax.jvp(lambda v_: jax.grad(Fn)(v_, w, x0), (v,), (u,))[1]
                rows = jax.hessian(lambda ww: DuF(v, ww))(w)[pa_j, pb_j]

                def contraction(vv):              # sum_a sum_b vt[a, b] d2F/dw_a dw_b
                    def d2(ea, va):
                        return jax.jvp(lambda w1: jax.jvp(lambda w2: Fn(vv, w2, x0), (w1,), (ea,))[1],
                                       (w,), (va,))[1]
                    return jnp.sum(jax.vmap(d2)(eye, vt))
                return Hu, rows, jax.grad(contraction)(v)
            return jax.vmap(one_dir)(U, Vt)
        Hu, rows, cols = jax.vmap(one_path)(W, X0)                 # (S, k, ...)
        return (jnp.tensordot(mask, Hu, axes=1), jnp.tensordot(mask, rows, axes=1),
                jnp.tensordot(mask, cols, axes=1))

    _FNS[key] = (jax.jit(base), jax.jit(prod))
    return _FNS[key]


class LayerProducts:
    """Products u -> H_l u of the Hessian of ln Z_l over the layer's local variables v (module doc), on the paths
    (W, X0) of one group, at a causal base point v with zero hats (the saddle).  ``chunk``: paths per call."""

    def __init__(self, *, T, activation, vary_u, vary_r, model, v, W, X0, top, chunk=64, batch=8):
        est = estimator(T, activation, vary_u, vary_r)         # its pair indices and places (one definition)
        self.T, self.nv, self.chunk, self.batch = T, est.nv, int(chunk), int(batch)
        self.pa, self.pb, self.pos, self.fac = est.pa, est.pb, est.pos, est.fac
        fa, fb = model.features() if top else (0.0, 0.0)
        self.lm = local_map(est.activation, pad=True)
        self._base, self._prod = _kernels(self.lm, model, T, self.pa, self.pb, float(fa), float(fb))
        self.v = jnp.asarray(v)
        self.W, self.X0 = np.asarray(W), np.asarray(X0)
        Z, g, p = 0.0, 0.0, 0.0
        for Wc, Xc, m in self._chunks():
            z1, g1, p1 = self._base(self.v, Wc, Xc, m)
            Z, g, p = Z + float(z1), g + np.asarray(g1), p + np.asarray(p1)
        self.Z, self.g, self.p = Z, g, p

    def _chunks(self):
        S, c = self.W.shape[0], self.chunk
        for i0 in range(0, S, c):
            Wc, Xc = self.W[i0:i0 + c], self.X0[i0:i0 + c]
            k = Wc.shape[0]
            m = np.zeros(c)
            m[:k] = 1.0
            if k < c:                                              # padded to one compiled shape
                Wc = np.concatenate([Wc, np.repeat(Wc[:1], c - k, axis=0)])
                Xc = np.concatenate([Xc, np.repeat(Xc[:1], c - k, axis=0)])
            yield jnp.asarray(Wc), jnp.asarray(Xc), jnp.asarray(m)

    def apply(self, U):
        """H_l U^T for directions U (k, nv): returns (k, nv), ``batch`` directions per compiled call."""
        U = np.atleast_2d(np.asarray(U, float))
        out = np.zeros_like(U)
        for i0 in range(0, U.shape[0], self.batch):
            Ub = U[i0:i0 + self.batch]
            k = Ub.shape[0]
            if k < self.batch:                                     # padded with zero directions
                Ub = np.concatenate([Ub, np.zeros((self.batch - k, U.shape[1]))])
            out[i0:i0 + k] = self._apply(Ub)[:k]
        return out

    def _apply(self, U):
        k, n = U.shape[0], self.W.shape[1]
        c = self.fac[None, :] * U[:, self.pos]                    # (k, pairs)
        Vt = np.zeros((k, n, n))
        Vt[:, self.pa, self.pb] = c
        Hu, rows, cols = 0.0, 0.0, 0.0
        for Wc, Xc, m in self._chunks():
            a, b, d = self._prod(self.v, jnp.asarray(U), jnp.asarray(Vt), Wc, Xc, m)
            Hu, rows, cols = Hu + np.asarray(a), rows + np.asarray(b), cols + np.asarray(d)
        Z, g = self.Z, self.g
        gu = U @ g
        out = Hu / Z - np.outer(gu, g) / Z ** 2 + cols / Z - np.outer(c @ self.p, g) / Z ** 2
        out[:, self.pos] += self.fac[None, :] * (rows / Z - np.outer(gu, self.p) / Z ** 2)
        return out


class ActionProducts:
    """Products of the whole action's Hessian (bilinear part plus every layer's ln Z_l, the matrix that
    :func:`dmftc.runtime.solvers.causal_solve.assemble_blocks` splits into U and Kd) with vectors over the Layout, at the
    saddle x0 of a group whose per-layer paths are ``W``, ``X`` (lists over layers)."""

    def __init__(self, *, x0, lay: Layout, activation, model, W, X, chunk=64, batch=8):
        self.lay = lay
        L, T = lay.L, lay.T
        self.ia, self.ib, self.val = bilinear_pairs(lay)
        self.layers, self.idx = [], []
        for l in range(1, L + 1):
            v, idx = gather_local(np.asarray(x0), lay, l, phi0=model.phi0, g_top=model.g_top)
            self.layers.append(LayerProducts(T=T, activation=activation, vary_u=l > 1, vary_r=l < L, model=model,
                                             v=np.asarray(v), W=W[l - 1], X0=X[l - 1], top=l == L, chunk=chunk,
                                             batch=batch))
            self.idx.append(idx)
        self.count = 0                                  # directions applied so far (each a pass over the paths)

    def apply(self, U, bilinear=True):
        """H U^T for directions U (k, n): (k, n); without the bilinear part if not ``bilinear``."""
        U = np.atleast_2d(np.asarray(U, float))
        self.count += U.shape[0]
        out = np.zeros_like(U)
        if bilinear:
            np.add.at(out.T, self.ia, (self.val[:, None] * U[:, self.ib].T))
            np.add.at(out.T, self.ib, (self.val[:, None] * U[:, self.ia].T))
        for lp, idx in zip(self.layers, self.idx):
            keep = idx >= 0
            ul = np.zeros((U.shape[0], len(idx)))
            ul[:, keep] = U[:, idx[keep]]
            hl = lp.apply(ul)
            np.add.at(out.T, idx[keep], hl[:, keep].T)
        return out
