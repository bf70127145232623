"""Closed-form derivatives of one layer's single-site integrand of the standard two-field network, summed over
Monte Carlo paths: an oracle for the tests.

The runtime (:mod:`dmftc.runtime.sensitivities.site_moments`) takes the same sums from the spec's own program (local
derivatives by JAX of the generated functions, :mod:`dmftc.runtime.sensitivities.site_local`); this module writes out the
derivatives of one process by hand, with the activation's derivatives phi' to phi(4) and the gradient field's
coefficients a, b and their derivatives as inputs (what the runtime computed before issue 12 moved its per-path
derivatives onto the program).  The tests check the runtime against it on the same paths, to round-off.

Single-site system of one layer (one path, T steps; x = (h, z), outputs y = (p, g) = (phi(h), a(h) z + b(h)),
with the gradient field's coefficients a, b from the spec; a = phi', b = 0 for gradient descent):

    x = w + K y(x),     K = [[0, C], [E, 0]]   (h(t) = u(t) + sum_s C(t,s) g(s),  z(t) = r(t) + sum_s E(t,s) p(s))

with causal C (s < t) and E (s <= t) at the saddle.  A coupling c = C(t,s) acts like a source on slot j = u(t)
carrying the output o = g(s); c = E(t,s) like a source on slot j = r(t) carrying o = p(s).  With
Y1 = dy/dx (local 2 x 2 blocks per time), Ry = (I - Y1 K)^-1 (finite product: Y1 K is nilpotent) and the
output responses Xi = dy/dw = Ry Y1, source derivatives of every order follow from

    d^2 y = Ry Y2[dx, dx],     d^3 y = Ry (Y3[dx, dx, dx] + 3 sym. Y2[d^2 x, dx]),     dx = dw + K dy.

Per path, with lambda = -ln det(I - J) (zero on the causal subspace) and the features f of the hats:

    d lambda / dc          = Xi[o_c, j_c]                       (the response; zero for causal c)
    d2 lambda / dc dc'     = Xi[o_c, j_c'] Xi[o_c', j_c] + y[o_c'] Xi2[o_c; j_c, j_c'] + y[o_c] Xi2[o_c'; j_c, j_c']
    d f / dc               = y[o_c] df/dw[j_c]
    d/dc  d2 F/dw_a dw_b   = Xi3[o_c; j_c, a, b]                (Price block of the couplings)
    d/dhat d2 F/dw_a dw_b  = d2 f / dw_a dw_b                   (Price block of the hats)

(derivation in the docstring of :mod:`dmftc.runtime.engines.deep_propagator`; the test suite checks every sum against the
autodiff reference on the same paths).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from dmftc.runtime.problem.activation import as_activation
from dmftc.runtime.sensitivities.site_local import local_map
from dmftc.runtime.sensitivities.site_moments import SiteMoments, MomentPattern, nilpotent_inverse


__all__ = ["ClosedFormMoments"]


class ClosedFormMoments(SiteMoments):
    """:class:`dmftc.runtime.sensitivities.site_moments.SiteMoments` with the per-path derivatives of the standard two-field
    network written out by hand (the module doc) instead of taken from a program: the same sums over paths (the
    runtime's), on the per-path quantities of ``_path`` below (outputs y = (p, g) in this order).  ``activation``:
    a :class:`dmftc.runtime.problem.activation.SiteActivation` (or text), whose phi to its fourth derivative and gradient-field
    coefficients the formulas read."""

    def __init__(self, *, T, activation, pa, pb, anti, chunk=None, points=1):
        self.activation = as_activation(activation)
        super().__init__(T=T, local=local_map(self.activation), pa=pa, pb=pb, anti=anti, chunk=chunk,
                         points=points)
        tt, ss = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
        # c -> (output o in y = (p, g), slot j in w = (u, r)):  C(t,s): (g(s), u(t));  E(t,s): (p(s), r(t))
        self.rows = {"C": slice(T, 2 * T), "E": slice(0, T)}
        self.oc = np.concatenate([(T + ss).ravel(), ss.ravel()])
        self.jc = np.concatenate([tt.ravel(), (T + tt).ravel()])

    def pattern(self, X0, CV=None):
        """Every term of the formulas (the runtime's sums read only which kernel factors coincide: all do); the
        closed forms have no one-time coefficients (``CV`` None)."""
        assert CV is None, "the closed-form moments have no one-time coefficients"
        return MomentPattern(y2=(), y3=(), same=(True, True), a_out=(0, 1), b_out=(0, 1), a2=((), ()), b2=((), ()),
                        r2=())

    # ------------------------------------------------------------------ one path
    def _path(self, C, E, w, x0, fa, fb, pat=None, CV=None):
        T, n = self.T, 2 * self.T
        h, z = x0[:T], x0[T:]
        p, p1, p2, p3, _ = self.activation.fn(h)        # phi and its derivatives
        a, a1, a2, a3, b, b1, b2, b3 = self.activation.gradient(h)
        # local derivatives of y = (p, g) in x = (h, z), g = a(h) z + b(h):  p_h = p1, p_hh = p2, p_hhh = p3;
        # g_z = a, g_hz = a1, g_hhz = a2 (g_zz = 0);  g_h = gh, g_hh = ghh, g_hhh = ghhh
        g = a * z + b
        gh, ghh, ghhh = a1 * z + b1, a2 * z + b2, a3 * z + b3
        y = jnp.concatenate([p, g])
        i = jnp.arange(T)
        Y1 = jnp.zeros((n, n)).at[i, i].set(p1).at[T + i, i].set(gh).at[T + i, T + i].set(a)
        zero = jnp.zeros((T, T))
        K = jnp.block([[zero, C], [E, zero]])
        Ry = nilpotent_inverse(Y1 @ K)
        Xi = Ry @ Y1                                    # dy/dw
        X1 = jnp.eye(n) + K @ Xi                        # dx/dw
        Xh, Xz = X1[:T], X1[T:]

        # second order, all pairs of slots: V2[k, i, i'] = Y2_k[X1_i, X1_i']
        hh = Xh[:, :, None] * Xh[:, None, :]
        hz = Xh[:, :, None] * Xz[:, None, :]
        V2 = jnp.concatenate([p2[:, None, None] * hh,
                              ghh[:, None, None] * hh + a1[:, None, None] * (hz + jnp.swapaxes(hz, 1, 2))])
        Xi2 = jnp.einsum("ok,kij->oij", Ry, V2)          # d2 y / dw dw
        X2 = jnp.einsum("xk,kij->xij", K, Xi2)           # d2 x / dw dw
        X2h, X2z = X2[:T], X2[T:]

        # features f and their source derivatives
        tr0, tr1 = self.tril
        # a zp(t) + b zp(0) as a (zp(t) - zp(0)) + (a + b) zp(0): exactly 0 at t = 0 when b = -a (network readout);
        # on P points zp(0) is that of the step's own point at time 0
        first = self.first
        zp = z * p
        top_f = fa * (zp - zp[first]) + (fa + fb) * zp[first]
        f = jnp.concatenate([-(p[tr0] * p[tr1]), -(g[tr0] * g[tr1]), top_f])
        Dp, Dg = Xi[:T], Xi[T:]
        Dzp = Xz * p[:, None] + z[:, None] * Dp
        d0 = Dzp[first]
        fa2, fb2 = fa[:, None], fb[:, None]           # the coefficients are per step (rows)
        Dtop = fa2 * (Dzp - d0) + (fa2 + fb2) * d0
        Df = jnp.concatenate([-(Dp[tr0] * p[tr1, None] + p[tr0, None] * Dp[tr1]),
                              -(Dg[tr0] * g[tr1, None] + g[tr0, None] * Dg[tr1]), Dtop])

        # third order on the varying pairs q = (a, b) (module doc): Xi3[o; j, a, b] for C-type (o = g, j = u)
        # and E-type (o = p, j = r) as four matrix products per type and varying source block
        Rp, Rg = Ry[:, :T], Ry[:, T:]                    # columns: p rows / g rows of V3
        Xi3 = {"C": [], "E": []}
        D2f = []
        for blk in self.blocks:                          # varying source blocks: slots vb, pair tril inside
            vb = jnp.asarray(blk)
            Ah, Az = Xh[:, vb], Xz[:, vb]                # (T_s, T_a)
            Bh, Bz = X2h[:, vb][:, :, vb], X2z[:, vb][:, :, vb]          # (T_s, T_a, T_b)
            hh = Ah[:, :, None] * Ah[:, None, :]
            hz = Ah[:, :, None] * Az[:, None, :] + Az[:, :, None] * Ah[:, None, :]
            U1 = p3[:, None, None] * hh + p2[:, None, None] * Bh                        # with Rp, j-factor Xh
            U2 = (ghhh[:, None, None] * hh + a2[:, None, None] * hz
                  + ghh[:, None, None] * Bh + a1[:, None, None] * Bz)                     # with Rg, j-factor Xh
            U3 = a2[:, None, None] * hh + a1[:, None, None] * Bh                          # with Rg, j-factor Xz
            P3h = (Rp[:, :, None] * (p2[:, None] * Ah)[None] + Rg[:, :, None] * (ghh[:, None] * Ah
                                                                                + a1[:, None] * Az)[None])
            P4 = Rg[:, :, None] * (a1[:, None] * Ah)[None]                                 # (o, s, b)
            for kind, orows, jslots in (("C", slice(T, n), slice(0, T)), ("E", slice(0, T), slice(T, n))):
                Ro_p, Ro_g = Rp[orows], Rg[orows]                                         # (T_o, T_s)
                # separable terms: sum_s R[o,s] X[s,j] U[s,q] -> factors (m, s, o, j) and (m, s, q)
                lsep = jnp.stack([Ro_p.T[:, :, None] * Xh[:, None, jslots], Ro_g.T[:, :, None] * Xh[:, None, jslots],
                                  Ro_g.T[:, :, None] * Xz[:, None, jslots]])
                rsep = jnp.stack([U1[:, self.tri0, self.tri1], U2[:, self.tri0, self.tri1],
                                  U3[:, self.tri0, self.tri1]])
                # the rest: sum_s X2[s,j,a] P[o,s,b] (+ a <-> b) -> factors (m, s, j, a) and (m, s, o, b)
                lns = jnp.stack([X2h[:, jslots][:, :, vb], X2z[:, jslots][:, :, vb]])
                rns = jnp.stack([jnp.swapaxes(P3h[orows], 0, 1), jnp.swapaxes(P4[orows], 0, 1)])
                Xi3[kind].append((lsep, rsep, lns, rns))
            # second source derivatives on this block's pairs, for d2 f / dw_a dw_b (summed in _chunk_sums)
            qa, qb = vb[self.tri0], vb[self.tri1]
            Dp2, Dg2 = Xi2[:T][:, qa, qb], Xi2[T:][:, qa, qb]                             # (T, q)
            zp2 = X2z[:, qa, qb] * p[:, None] + z[:, None] * Dp2 + Xz[:, qa] * Dp[:, qb] + Xz[:, qb] * Dp[:, qa]
            kern = [(Dp2, Dp2, Dp[:, vb], Dp[:, vb]), (Dg2, Dg2, Dg[:, vb], Dg[:, vb])]   # (a = b: p p, g g)
            D2f.append((kern, fa2 * (zp2 - zp2[first]) + (fa2 + fb2) * zp2[first]))
        res = x0 - w - K @ y                             # the path must solve the single-site equations
        return y, Xi, Xi2, Df, f, Xi3, D2f, res @ res, (jnp.stack([p, g], axis=1), jnp.stack([p, g], axis=1))
