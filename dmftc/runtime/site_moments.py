"""Closed-form derivatives of one layer's single-site integrand at the saddle, summed over Monte Carlo paths.

This is the fast path behind :mod:`dmftc.runtime.deep_propagator`: the same sums as its autodiff reference
(``LocalEstimator`` with method 'struct'), but from explicit first, second and third source derivatives of
the single-site fields, so that the cost is a handful of batched matrix products per path instead of one
Hessian-vector product per anti-causal coupling and one reverse pass per source-covariance entry.

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

(derivation in the docstring of :mod:`dmftc.runtime.deep_propagator`; the test suite checks every sum against the
autodiff reference on the same paths).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from dmftc.derive.activation import as_activation


__all__ = ["SiteMoments"]

def _nilpotent_inverse(N):
    """(I - N)^-1 = prod_j (I + N^(2^j)) for nilpotent N (N^n = 0)."""
    n = N.shape[-1]
    R, P = jnp.eye(n) + N, N
    for _ in range(max(0, math.ceil(math.log2(n)) - 1)):
        P = P @ P
        R = R + R @ P
    return R


class SiteMoments:
    """Sums over paths of the per-path derivatives of one layer kind (T steps, activation (a
    :class:`dmftc.derive.activation.SiteActivation`), which source blocks
    carry a varying covariance: ``pairs`` = (pa, pb) indices into w = (u, r), a >= b).

    ``moments(C, E, W, X0, feature=(a, b))`` returns (F, lambda^2, g_lambda, f, f f^T, Jf, Ha, Pc, Pe), the same
    tuple (and conventions) as the autodiff reference ``AutodiffEstimator._moments_struct``; the Delta_hat
    feature of the layer is a z(t) phi(h(t)) + b z(0) phi(h(0)) (0, 0 below the last layer; the readout's
    coefficients, :meth:`dmftc.runtime.deep_model.DeepModel.features`, in the last):

      F        sum_n F_n (= S at the saddle)          resid      sum_n |x - w - K y(x)|^2 (= 0: x0 solves the equations)
      g        sum_n d lambda/dc          (2T^2)       f          sum_n f_n                  (nf)
      ff       sum_n f f^T                (nf, nf)     Jf         sum_n (df/dc + f dlambda/dc^T)   (nf, 2T^2)
      Ha       sum_n (d2 lambda/dc_a dc + dlambda/dc_a dlambda/dc^T), rows the anti-causal c_a   (T^2, 2T^2)
      Pc, Pe   sum_n d/dc d2F/dw_a dw_b (npairs, 2T^2) and d/dhat d2F/dw_a dw_b (npairs, nf)
    """

    def __init__(self, *, T, activation, pa, pb, anti, chunk=None, points=1):
        self.T, self.activation, self.points = T, as_activation(activation), int(points)
        if T % self.points:
            raise ValueError("the steps must be whole times of every point")
        self.first = np.arange(T) % self.points          # each step's point at time 0 (its readout's fixed term)
        n = 2 * T
        self.pa, self.pb = np.asarray(pa, int), np.asarray(pb, int)
        self.anti = np.asarray(anti, int)
        tt, ss = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
        # c -> (output o in y = (p, g), slot j in w = (u, r)):  C(t,s): (g(s), u(t));  E(t,s): (p(s), r(t))
        self.oc = np.concatenate([(T + ss).ravel(), ss.ravel()])
        self.jc = np.concatenate([tt.ravel(), (T + tt).ravel()])
        self.tril = np.tril_indices(T)
        self.tri0, self.tri1 = self.tril
        # blocks of the time s summed over in the Price products: a block [s0, s1) only involves outputs
        # o >= s0 and sources j, a, b < s1 (causality), about 1.3-1.4 times the exact triangular work.  On P
        # points the steps are (time, point) pairs whose outputs also read other points at the same time, so
        # the blocks are whole times (edges at multiples of P)
        times = T // self.points
        nb = max(1, min(times, 12))
        edges = sorted({self.points * round(times * i / nb) for i in range(nb + 1)})
        self.s_blocks = [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]
        # anti-causal couplings by kind, as (t, s): C rows of anti first, then E (the order of ``anti``)
        isC = self.anti < T * T
        self.anti_ts = {"C": np.divmod(self.anti[isC], T), "E": np.divmod(self.anti[~isC] - T * T, T)}
        if not np.all(np.diff(isC.astype(int)) <= 0):
            raise ValueError("anti must list the C couplings before the E couplings")
        # varying source blocks (u: slots 0..T-1, r: T..2T-1); pairs must be their lower triangles in order
        self.blocks = []
        for off in (0, T):
            sel = (self.pa >= off) & (self.pa < off + T)
            if sel.any():
                self.blocks.append(np.arange(off, off + T))
        want = np.concatenate([np.stack([b[self.tri0], b[self.tri1]]) for b in self.blocks], axis=1) \
            if self.blocks else np.zeros((2, 0), int)
        if not (want.shape[1] == len(self.pa) and np.array_equal(want, np.stack([self.pa, self.pb]))):
            raise ValueError("pairs must be the lower triangles (a >= b) of whole source blocks, u before r")
        per_path = 8 * 5 * n ** 3                       # bytes of the largest per-path arrays (second order)
        self.chunk = chunk or int(max(4, min(512, 2e9 / per_path)))
        self._fn = jax.jit(self._chunk_sums)

    # ------------------------------------------------------------------ one path
    def _path(self, C, E, w, x0, fa, fb):
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
        Ry = _nilpotent_inverse(Y1 @ K)
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
            D2f.append((Dp2, Dg2, fa2 * (zp2 - zp2[first]) + (fa2 + fb2) * zp2[first]))
        res = x0 - w - K @ y                             # the path must solve the single-site equations
        return y, Xi, Xi2, Df, f, Xi3, D2f, res @ res

    # ------------------------------------------------------------------ sums over a chunk of paths
    def _chunk_sums(self, C, E, W, X0, mask, fa, fb, Z=None):
        T, n = self.T, 2 * self.T
        y, Xi, Xi2, Df, f, Xi3, D2f, res = jax.vmap(lambda w, x: self._path(C, E, w, x, fa, fb))(W, X0)
        m = mask
        oc, jc, anti = self.oc, self.jc, self.anti
        lam = Xi[:, oc, jc]                                                   # (S, 2T^2)
        # Ha by (row type, column type): only entries with o, j of the coupling's own kinds are ever needed
        rows = {"C": slice(T, n), "E": slice(0, T)}                            # outputs: g for C, p for E
        slots = {"C": slice(0, T), "E": slice(T, n)}                           # sources: u for C, r for E
        ym = y * m[:, None]
        Ha = []
        for k in ("C", "E"):
            ta, sa = self.anti_ts[k]                                            # anti-causal c = (t_a, s_a)
            blocks = []
            for k2 in ("C", "E"):
                # each term as one product over the paths for all (o_c, j_c), then the anti-causal c picked
                M1 = jnp.einsum("nsj,nbt->stjb", Xi[:, rows[k], slots[k2]] * m[:, None, None],
                                Xi[:, rows[k2], slots[k]])                       # Xi[o_c, j'] Xi[o', j_c]
                t1 = M1[sa, ta]
                X2a = Xi2[:, rows[k], slots[k], slots[k2]][:, sa, ta, :]        # Xi2[o_c; j_c, j'], (S, a, T)
                t2 = jnp.einsum("naj,nb->ajb", X2a * m[:, None, None], y[:, rows[k2]])
                M3 = jnp.einsum("ns,nbtj->stjb", ym[:, rows[k]], Xi2[:, rows[k2], slots[k], slots[k2]])
                t3 = M3[sa, ta]                                                  # y[o_c] Xi2[o'; j_c, j']
                blocks.append((t1 + t2 + t3).reshape(len(ta), T * T))            # columns c' = (t', s')
            Ha.append(jnp.concatenate(blocks, axis=1))
        lam_a = lam[:, anti]
        Ha = jnp.concatenate(Ha, axis=0) + (lam_a * m[:, None]).T @ lam          # + dlam_a dlam^T
        fm = f * m[:, None]
        ff = fm.T @ f
        Jf = (jnp.concatenate([jnp.einsum("ns,nkt->kts", ym[:, rows[k]], Df[:, :, slots[k]]).reshape(-1, T * T)
                               for k in ("C", "E")], axis=1)                   # y[o_c] df_k/dw[j_c]
              + fm.T @ lam)
        # Price block of the couplings: sum over paths AND times in one matrix product per factor pair and
        # block of times s; a block [s0, s1) contributes to outputs o >= s0 and sources j, a, b < s1 only
        cols = {"C": [], "E": []}
        nq = lambda k: k * (k + 1) // 2                                                 # noqa: E731
        mm = m[:, None, None, None]
        for kind in ("C", "E"):
            for lsep, rsep, lns, rns in Xi3[kind]:
                acc = jnp.zeros((nq(T), T, T))
                for s0, s1 in self.s_blocks:
                    sep = jnp.einsum("nmsoj,nmsq->qoj", lsep[:, :, s0:s1, s0:, :s1], rsep[:, :, s0:s1, :nq(s1)] * mm)
                    ns = jnp.einsum("nmsja,nmsob->ojab", lns[:, :, s0:s1, :s1, :s1] * mm[..., None],
                                    rns[:, :, s0:s1, s0:, :s1])
                    t0, t1 = self.tri0[:nq(s1)], self.tri1[:nq(s1)]
                    ns = ns[:, :, t0, t1] + ns[:, :, t1, t0]
                    acc = acc.at[:nq(s1), s0:, :s1].add(sep + jnp.moveaxis(ns, 2, 0))           # (q, o, j)
                cols[kind].append(acc)
        if self.blocks:
            C3, E3 = (jnp.concatenate(cols[k], axis=0) for k in ("C", "E"))
            Pc = jnp.concatenate([jnp.swapaxes(C3, 1, 2).reshape(-1, T * T),
                                  jnp.swapaxes(E3, 1, 2).reshape(-1, T * T)], axis=1)
        else:
            Pc = jnp.zeros((0, 2 * T * T))
        # Price block of the hats, d2 f / dw_a dw_b summed over paths: matrix products over the paths
        tr0, tr1 = self.tril
        Pe = []
        for bi, blk in enumerate(self.blocks):
            Dp2, Dg2, top2 = D2f[bi]
            vb = jnp.asarray(blk)
            qa, qb = self.tri0, self.tri1                                       # pairs inside the block
            parts = []
            for v2, v, dv in ((Dp2, y[:, :T], Xi[:, :T][:, :, vb]), (Dg2, y[:, T:], Xi[:, T:][:, :, vb])):
                A1 = jnp.einsum("ntq,ns->tsq", v2 * m[:, None, None], v)          # sum_n v2(t; q) v(s)
                B1 = jnp.einsum("nta,nsb->tsab", dv * m[:, None, None], dv)       # sum_n dv(t, a) dv(s, b)
                parts.append(-(A1[tr0, tr1] + A1[tr1, tr0] + B1[tr0, tr1][:, qa, qb] + B1[tr0, tr1][:, qb, qa]))
            parts.append(jnp.einsum("n,ntq->tq", m, top2))
            Pe.append(jnp.concatenate(parts).T)                                 # (q, nf)
        Pe = jnp.concatenate(Pe) if self.blocks else jnp.zeros((0, f.shape[1]))
        out = (jnp.sum(m), m @ res, m @ lam, m @ f, ff, Jf, Ha, Pc, Pe)
        if Z is None:
            return out
        # Stein sums of the first varying source block (LocalEstimator.log_z): zeta = Z w over its sources,
        # sum_n zeta(a) d f / dw_b and sum_n zeta(a) d lambda_c / dw_b for the anti-causal c (Xi2[o_c; j_c, b])
        vb = jnp.asarray(self.blocks[0])
        zeta = (W[:, vb] @ Z.T) * m[:, None]                                      # (S, T)
        Sf = jnp.einsum("na,nfb->afb", zeta, Df[:, :, vb])
        Sc = jnp.einsum("na,ncb->acb", zeta, Xi2[:, oc[anti], jc[anti]][:, :, vb])   # Xi2 part (S, T^2, T)
        return out + (Sf, Sc)

    def moments(self, C, E, W, X0, *, feature, weights=None, stein=None):
        """Sums over the paths (rows of W, X0), each weighted by ``weights`` (default 1; e.g. the weights of a
        cubature rule, normalised by the caller).  ``stein``: a (T, T) matrix Z over the first varying source block
        (u when it varies); then two more sums follow the tuple, Sf (T, nf, T) = sum_n (Z w)(a) df/dw_b and Sc
        (T, T^2, T) = sum_n (Z w)(a) d^2 y_o / dw_j dw_b over that block, for the anti-causal couplings (o, j)
        (Gaussian integration by parts of the Price blocks, :mod:`dmftc.runtime.price_by_parts`)."""
        S, c = W.shape[0], self.chunk
        wts = np.ones(S) if weights is None else np.asarray(weights, float)
        acc = None
        fixed = (jnp.asarray(C), jnp.asarray(E))          # the same for every chunk: converted once
        fa, fb = (jnp.broadcast_to(jnp.asarray(f, jnp.float64), (self.T,)) for f in feature)   # one per step
        Z = None if stein is None else jnp.asarray(stein)
        for i0 in range(0, S, c):
            Wc, Xc = W[i0:i0 + c], X0[i0:i0 + c]
            k = Wc.shape[0]
            mask = np.zeros(c)
            mask[:k] = wts[i0:i0 + c]
            if k < c:                                   # pad to the fixed chunk shape (one compilation)
                Wc = np.concatenate([Wc, np.repeat(Wc[:1], c - k, axis=0)])
                Xc = np.concatenate([Xc, np.repeat(Xc[:1], c - k, axis=0)])
            out = self._fn(*fixed, jnp.asarray(Wc), jnp.asarray(Xc), jnp.asarray(mask), fa, fb, Z)
            if acc is None:
                acc = [np.array(o) for o in out]
            else:
                for a, o in zip(acc, out):
                    a += np.asarray(o)
        return acc
