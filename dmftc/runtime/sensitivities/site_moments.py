"""Per-path derivatives of one deep layer's single-site integrand at the saddle, summed over Monte Carlo paths.

The per-layer part of :mod:`dmftc.runtime.sensitivities.local_estimator`.  The layer's single-site system (one path, T steps)
is the spec's program (:mod:`dmftc.runtime.sensitivities.site_local`): x-fields x (nx of them, e.g. h and z; each x-field
carries one source of w = (u, r)) and, at every time, outputs y = Y(x(t)) (the path factors the fields' sums
read, e.g. g and phi(h)), with

    x = w + K y(x),     K: one block K_c per coupling kind c = (x-field i_c, output o_c), causal at the saddle

(deep_tanh: h(t) = u(t) + sum_s C(t, s) g(s), z(t) = r(t) + sum_s E(t, s) phi(h(s))).  The local derivatives
Y1 = dY/dx, Y2, Y3 (per time; nx x ny tensors) come from JAX applied to the generated program; the rest is the
implicit-function calculus of that system, the same for every spec.  A coupling c = K_c(t, s) acts like a source
on slot j = i_c(t) carrying the output o = o_c(s).  With Y1 block-diagonal in time, Ry = (I - Y1 K)^-1 (a finite
product: Y1 K is nilpotent at the saddle), the output responses Xi = dy/dw = Ry Y1 and dx/dw = X1 = I + K Xi,
source derivatives of every order follow from

    d^2 y = Ry Y2[dx, dx],     d^3 y = Ry (Y3[dx, dx, dx] + 3 sym. Y2[d^2 x, dx]),     dx = dw + K dy.

Per path, with lambda = -ln det(I - J) (zero on the causal subspace) and the features f of the hats (kernel
entries -a(t) b(s) of each kernel's two factors, and the readout observable in the last layer):

    d lambda / dc          = Xi[o_c, j_c]                       (the response; zero for causal c)
    d2 lambda / dc dc'     = Xi[o_c, j_c'] Xi[o_c', j_c] + y[o_c'] Xi2[o_c; j_c, j_c'] + y[o_c] Xi2[o_c'; j_c, j_c']
    d f / dc               = y[o_c] df/dw[j_c]
    d/dc  d2 F/dw_a dw_b   = Xi3[o_c; j_c, a, b]                (Price block of the couplings)
    d/dhat d2 F/dw_a dw_b  = d2 f / dw_a dw_b                   (Price block of the hats)

(derivation in the docstring of :mod:`dmftc.runtime.engines.deep_propagator`).  Xi3 is summed over paths and times in one
matrix product per pair of factors: a separable part sum_s Ry[o, (k, s)] X1[(i, s), j] U_ki[s, (a, b)] for every
(output k, x-field i) whose local derivatives are not zero, and the rest sum_s X2[(i, s), j, a] P_i[o, s, b].
Which local derivatives vanish is read off the paths themselves before compiling (a term that is zero on every
path of the sums contributes nothing), so a spec pays only for the terms its program has: deep_tanh has 3
separable and 2 other terms, the counts of the closed forms of that network.  The tests check every sum against
those closed forms (:mod:`dmftc.reference.site_moments_closed`) and against autodiff of the whole integrand
(:mod:`dmftc.reference.deep_autodiff`) on the same paths.
"""
from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from dmftc.jax_setup import long_run_options
from dmftc.runtime.sensitivities.site_drivers import equal_batches

__all__ = ["SiteMoments", "chunk_rows", "coupling_matrix", "path_features"]

# paths x path_size (n^2 max(n, m)) of one call of the sums above which their program counts as a long run
# (measured with the test suite's lowered XLA optimisation, P = 3 points, T = 5, 4000 paths: the propagator's warm
# time, mostly these sums, 25 s -> 12 s; compilation about 1 s longer per program)
LONG_RUN_WORK = 5e6


def coupling_matrix(local, C, E):
    """K (nx T, ny T) of x = w + K y(x): block (x-field i, output o) of each coupling kind, C then E."""
    T = C.shape[0]
    K = jnp.zeros((local.nx * T, local.ny * T))
    for (_, i, o), Kk in zip(local.kinds, (C, E)):
        K = K.at[i * T:(i + 1) * T, o * T:(o + 1) * T].set(Kk)
    return K


def path_features(a, b, r, fa, fb, tril, first):
    """The features f of one path (nf,): each kernel's -a(t) b(s) over t >= s (``tril``), then the readout
    fa r(t) + fb r(first(t)) (written fa (r - r0) + (fa + fb) r0); a, b (T, nk) are the kernels' factors at t and
    at s, r (T,) the readout observable, ``first`` each step's step at time 0."""
    tr0, tr1 = tril
    top = fa * (r - r[first]) + (fa + fb) * r[first]
    return jnp.concatenate([-(a[tr0, k] * b[tr1, k]) for k in range(a.shape[-1])] + [top])


def _total(xs, shape):
    """The sum of the arrays xs (zeros of ``shape`` if there are none), without a zero array to start from."""
    return functools.reduce(operator.add, xs) if xs else jnp.zeros(shape)


def nilpotent_inverse(N):
    """(I - N)^-1 = prod_j (I + N^(2^j)) for nilpotent N (N^n = 0)."""
    n = N.shape[-1]
    R, P = jnp.eye(n) + N, N
    for _ in range(max(0, math.ceil(math.log2(n)) - 1)):
        P = P @ P
        R = R + R @ P
    return R


_SCANS: dict = {}
_SCAN_POINTS = 8192                 # field values per call of the pattern scan (one compiled shape)


def chunk_rows(S: int, most: int) -> int:
    """Rows per chunk of the per-path sums for S paths in chunks of at most ``most`` rows: S split into equal
    chunks (:func:`dmftc.runtime.sensitivities.site_drivers.equal_batches`), rounded up to a power of two (neighbouring group sizes share one compiled program), never above
    ``most``.  The rows beyond S are padding with zero weight: at most a factor 2 of the work, where a fixed chunk
    of ``most`` rows cost most / S (a group of 250 paths in a chunk of 512 rows: twice the work; at T = 30,
    where ``most`` is 232 rows, 2 chunks of 128 rows instead of 2 of 232)."""
    per = equal_batches(S, most)[0]
    return int(min(most, 1 << max(0, per - 1).bit_length()))


@dataclass(frozen=True)
class MomentPattern:
    """The local derivatives that are not zero on the paths (module doc): the entries (k, i, j) of Y2 and
    (k, i, j, l) of Y3 (output k, x-fields i, j, l); per kernel whether its two factors coincide (a = b: one
    product instead of two), which output each factor is (its source derivatives are then rows of Xi and Xi2;
    -1: none), and the nonzero entries (i, j) of the second derivatives of each factor and of the readout."""
    y2: tuple
    y3: tuple
    same: tuple
    a_out: tuple
    b_out: tuple
    a2: tuple
    b2: tuple
    r2: tuple

    @property
    def sep(self):
        """(k, i) of the separable Price terms: U_ki = Y3[k, i][X1, X1] + Y2[k, i][X2] not zero."""
        return tuple(sorted({e[:2] for e in self.y2 + self.y3}))

    @property
    def ns(self):
        """The x-fields i of the other Price terms, Y2[:, i, :] not zero."""
        return tuple(sorted({i for _, i, _ in self.y2}))

    @property
    def v2(self):
        """The pairs (i, j) of x-fields with a second derivative Y2[k, i, j] of some output."""
        return tuple(sorted({(i, j) for _, i, j in self.y2}))


def _pattern_scan(local, X, CV=None):
    """Largest |.| over the field values X (points, nx) of every entry of Y2 and Y3, of each kernel's two factors'
    differences (with their derivatives) from each other and from each output, and of the factors' and the
    readout's second derivatives (:class:`MomentPattern`)."""
    y, Y1, Y2, Y3 = local.output_tensors(X, CV)
    y2, y3 = jnp.max(jnp.abs(Y2), axis=0), jnp.max(jnp.abs(Y3), axis=0)
    (a, A1, A2), (b, B1, B2), (_, _, R2) = local.feature_tensors(X, CV)

    def dist(f, F1, F2, g, G1, G2):             # max |f - g| with the first and second derivatives
        return (jnp.max(jnp.abs(f - g), axis=0) + jnp.max(jnp.abs(F1 - G1), axis=(0, -1))
                + jnp.max(jnp.abs(F2 - G2), axis=(0, -2, -1)))

    same = dist(a, A1, A2, b, B1, B2)
    as_out = [dist(f[:, :, None], F1[:, :, None], F2[:, :, None], y[:, None], Y1[:, None], Y2[:, None])
              for f, F1, F2 in ((a, A1, A2), (b, B1, B2))]                                # (nk, ny) each
    nz2 = [jnp.max(jnp.abs(F2), axis=0) for F2 in (A2, B2, R2)]
    return y2, y3, same, as_out[0], as_out[1], *nz2


class SiteMoments:
    """Sums over paths of the per-path derivatives of one layer kind (T steps; ``local``: the program's
    :class:`dmftc.runtime.sensitivities.site_local.LocalMap`; which source blocks carry a varying covariance: ``pairs`` =
    (pa, pb) indices into w, a >= b).

    ``moments(C, E, W, X0, feature=(a, b))`` returns (F, resid, g_lambda, f, f f^T, Jf, Ha, Pc, Pe), the same
    tuple (and conventions) as the autodiff reference ``AutodiffEstimator._moments_struct``; the Delta_hat
    feature of the layer is a r(t) + b r(0) of the readout observable r (z phi for deep_tanh; (0, 0) below the
    last layer; the readout's coefficients, :meth:`dmftc.runtime.problem.deep_model.DeepModel.features`, in the last):

      F        sum_n F_n (= S at the saddle)          resid      sum_n |x - w - K y(x)|^2 (= 0: x0 solves the equations)
      g        sum_n d lambda/dc          (2T^2)       f          sum_n f_n                  (nf)
      ff       sum_n f f^T                (nf, nf)     Jf         sum_n (df/dc + f dlambda/dc^T)   (nf, 2T^2)
      Ha       sum_n (d2 lambda/dc_a dc + dlambda/dc_a dlambda/dc^T), rows the anti-causal c_a   (T^2, 2T^2)
      Pc, Pe   sum_n d/dc d2F/dw_a dw_b (npairs, 2T^2) and d/dhat d2F/dw_a dw_b (npairs, nf)
    """

    def __init__(self, *, T, local, pa, pb, anti, chunk=None, points=1):
        self.T, self.local, self.points = T, local, int(points)
        if T % self.points:
            raise ValueError("the steps must be whole times of every point")
        if [k[0] for k in local.kinds] != ["C", "E"]:
            raise ValueError("the layer's couplings must be the kinds C and E")
        self.first = np.arange(T) % self.points          # each step's point at time 0 (its readout's fixed term)
        nx, ny = local.nx, local.ny
        n, m = nx * T, ny * T
        self.n, self.m = n, m
        self.pa, self.pb = np.asarray(pa, int), np.asarray(pb, int)
        self.anti = np.asarray(anti, int)
        tt, ss = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
        # coupling c = K_k(t, s) -> (output o_k(s) in y, slot i_k(t) in w)
        self.rows = {k: slice(o * T, (o + 1) * T) for k, _, o in local.kinds}     # outputs of kind k
        self.slots = {k: slice(i * T, (i + 1) * T) for k, i, _ in local.kinds}    # sources of kind k
        self.oc = np.concatenate([(o * T + ss).ravel() for _, _, o in local.kinds])
        self.jc = np.concatenate([(i * T + tt).ravel() for _, i, _ in local.kinds])
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
        isC = self.anti < T * T
        self.anti_ts = {"C": np.divmod(self.anti[isC], T), "E": np.divmod(self.anti[~isC] - T * T, T)}
        if not np.all(np.diff(isC.astype(int)) <= 0):
            raise ValueError("anti must list the C couplings before the E couplings")
        # varying source blocks (slots of one x-field's source); pairs must be their lower triangles in order
        self.blocks = []
        for off in range(0, n, T):
            sel = (self.pa >= off) & (self.pa < off + T)
            if sel.any():
                self.blocks.append(np.arange(off, off + T))
        want = np.concatenate([np.stack([b[self.tri0], b[self.tri1]]) for b in self.blocks], axis=1) \
            if self.blocks else np.zeros((2, 0), int)
        if not (want.shape[1] == len(self.pa) and np.array_equal(want, np.stack([self.pa, self.pb]))):
            raise ValueError("pairs must be the lower triangles (a >= b) of whole source blocks, in slot order")
        self.path_size = max(n, m) * n * n                # elements of the largest per-path arrays (second order)
        self.chunk = chunk or int(max(4, min(512, 2e9 / (8 * 5 * self.path_size))))    # the most rows per chunk
        self.fit = chunk is None                 # fit the chunks to the paths (chunk_rows) unless one was given
        self._fns = {}
        if local.key not in _SCANS:                          # one compiled scan per program, any T
            _SCANS[local.key] = jax.jit(lambda X, CV=None: _pattern_scan(local, X, CV))
        self._scan = _SCANS[local.key]

    # ------------------------------------------------------------------ which local derivatives vanish
    def pattern(self, X0, CV=None) -> MomentPattern:
        """Which local derivatives are nonzero on the paths X0 (rows (nx T,)): scanned at every time of every path,
        _SCAN_POINTS field values per call."""
        acc, nx = None, self.local.nx
        pts = np.swapaxes(np.asarray(X0).reshape(X0.shape[0], nx, self.T), 1, 2).reshape(-1, nx)
        cvs = None if CV is None else np.tile(np.asarray(CV), (X0.shape[0], 1))       # rows (path, t)
        for i0 in range(0, pts.shape[0], _SCAN_POINTS):
            Xc = pts[i0:i0 + _SCAN_POINTS]
            Cc = None if cvs is None else cvs[i0:i0 + _SCAN_POINTS]
            if Xc.shape[0] < _SCAN_POINTS:            # padded with a point already there (maxima unchanged)
                Xc = np.concatenate([Xc, np.repeat(Xc[:1], _SCAN_POINTS - Xc.shape[0], axis=0)])
                Cc = None if Cc is None else np.concatenate([Cc, np.repeat(Cc[:1], _SCAN_POINTS - Cc.shape[0], axis=0)])
            out = [np.asarray(o) for o in (self._scan(jnp.asarray(Xc)) if Cc is None
                                           else self._scan(jnp.asarray(Xc), jnp.asarray(Cc)))]
            acc = out if acc is None else [np.maximum(a, o) for a, o in zip(acc, out)]
        y2, y3, same, a_out, b_out, a2, b2, r2 = acc
        nz = lambda a: tuple(tuple(int(i) for i in e) for e in zip(*np.nonzero(a)))     # noqa: E731
        out = lambda d: tuple(int(np.flatnonzero(row == 0)[0]) if np.any(row == 0) else -1 for row in d)  # noqa: E731
        return MomentPattern(y2=nz(y2), y3=nz(y3), same=tuple(bool(v == 0) for v in same), a_out=out(a_out),
                        b_out=out(b_out), a2=tuple(nz(x) for x in a2), b2=tuple(nz(x) for x in b2), r2=nz(r2))

    # ------------------------------------------------------------------ one path
    def _path(self, C, E, w, x0, fa, fb, pat: MomentPattern, CV=None):
        T, lm = self.T, self.local
        nx, ny, n, m = lm.nx, lm.ny, self.n, self.m
        X = x0.reshape(nx, T)
        y, Y1, Y2, Y3 = lm.output_tensors(X.T, CV)                 # (T, ny), (T, ny, nx), ...
        (a, A1, A2), (b, B1, B2), (r, R1, R2) = lm.feature_tensors(X.T, CV)
        yv = y.T.reshape(m)
        K = coupling_matrix(lm, C, E)
        Y1m = jnp.einsum("tki,ts->ktis", Y1, jnp.eye(T)).reshape(m, n)
        Ry = nilpotent_inverse(Y1m @ K)
        Xi = Ry @ Y1m                                   # dy/dw (m, n)
        X1 = jnp.eye(n) + K @ Xi                        # dx/dw (n, n)
        X1r = X1.reshape(nx, T, n)
        # the small x-field and output indices are loops of elementwise products (a multi-operand einsum with
        # the time as a batch index lowers to tiny batched matrix products, several times slower on the CPU)
        outer = {}                                       # X1[(i, t), a] X1[(j, t), b]
        for i, j in pat.v2:
            outer[i, j] = X1r[i][:, :, None] * X1r[j][:, None, :]
        V2 = jnp.concatenate([_total([Y2[:, k, i, j, None, None] * outer[i, j] for k2, i, j in pat.y2 if k2 == k],
                                     (T, n, n)) for k in range(ny)])       # Y2[X1, X1], (m, n, n)
        Xi2 = jnp.einsum("ok,kab->oab", Ry, V2)         # d2 y / dw dw (dense: a product blocked by causality,
        # d2 x / dw dw  was slower on the CPU, measured); X2 = K Xi2 by the blocks of K, one per coupling kind
        X2r = [_total([jnp.einsum("ts,sab->tab", Kk, Xi2[o * T:(o + 1) * T])
                       for (_, i2, o), Kk in zip(lm.kinds, (C, E)) if i2 == i], (T, n, n))
               for i in range(nx)]                      # per x-field (T, n, n): no stacked copy

        # features f and their source derivatives: kernels -a(t) b(s) over t >= s, then the readout
        tr0, tr1 = self.tril
        first = self.first
        d1 = lambda F1: _total([F1[:, i, None] * X1r[i] for i in range(nx)], (T, n))     # noqa: E731
        Dr = d1(R1)
        d0 = Dr[first]
        fa2, fb2 = fa[:, None], fb[:, None]           # the coefficients are per step (rows)
        Dtop = fa2 * (Dr - d0) + (fa2 + fb2) * d0
        nk = len(lm.kernels)
        rows_of = lambda o: slice(o * T, (o + 1) * T)                          # noqa: E731
        Da = [Xi[rows_of(o)] if o >= 0 else d1(A1[:, k]) for k, o in enumerate(pat.a_out)]
        Db = [Da[k] if pat.same[k] else Xi[rows_of(o)] if o >= 0 else d1(B1[:, k]) for k, o in enumerate(pat.b_out)]
        f = path_features(a, b, r, fa, fb, self.tril, first)
        Df = jnp.concatenate([-(Da[k][tr0] * b[tr1, k, None] + a[tr0, k, None] * Db[k][tr1]) for k in range(nk)]
                             + [Dtop])

        # third order on the varying pairs q = (a, b) (module doc): Xi3[o; j, a, b] for each coupling kind as
        # matrix products per varying source block
        Rk = Ry.reshape(m, ny, T)                        # columns (output k, time s)
        Xi3 = {kind: [] for kind, _, _ in lm.kinds}
        D2f = []
        for blk in self.blocks:                          # varying source blocks: slots vb, pair tril inside
            vb = jnp.asarray(blk)
            Ax = X1r[:, :, vb]                           # (nx, T_s, T_a)
            Bx = [X2i[:, vb][:, :, vb] for X2i in X2r]   # nx of (T_s, T_a, T_b)
            AA = {(j, l): Ax[j][:, :, None] * Ax[l][:, None, :] for j in range(nx) for l in range(nx)}
            U = {(k, i): _total([Y3[:, k, i, j, l, None, None] * AA[j, l] for k3, i3, j, l in pat.y3
                                 if (k3, i3) == (k, i)]
                                + [Y2[:, k, i, j, None, None] * Bx[j] for k2, i2, j in pat.y2 if (k2, i2) == (k, i)],
                                None) for k, i in pat.sep}
            P = {i: _total([Rk[:, k, :, None] * _total([Y2[:, k, i, j, None] * Ax[j] for k2, i2, j in pat.y2
                                                        if (k2, i2) == (k, i)], None)[None]
                            for k in sorted({k2 for k2, i2, _ in pat.y2 if i2 == i})], None) for i in pat.ns}
            for kind, ic, oc in lm.kinds:
                orows, jslots = self.rows[kind], self.slots[kind]
                # separable terms: sum_s R[o,(k,s)] X[(i,s),j] U_ki[s,q] -> factors (m, s, o, j) and (m, s, q)
                lsep = [Rk[orows, k].T[:, :, None] * X1r[i][:, None, jslots] for k, i in pat.sep]
                rsep = [U[(k, i)][:, self.tri0, self.tri1] for k, i in pat.sep]
                # the rest: sum_s X2[(i,s),j,a] P_i[o,s,b] (+ a <-> b) -> factors (m, s, j, a) and (m, s, o, b)
                lns = [X2r[i][:, jslots][:, :, vb] for i in pat.ns]
                rns = [jnp.swapaxes(P[i][orows], 0, 1) for i in pat.ns]
                stack = lambda xs: jnp.stack(xs) if xs else None          # noqa: E731
                Xi3[kind].append((stack(lsep), stack(rsep), stack(lns), stack(rns)))
            # second source derivatives of the features on this block's pairs (summed in _chunk_sums)
            qa, qb = vb[self.tri0], vb[self.tri1]
            X1a, X1b = X1r[:, :, qa], X1r[:, :, qb]                                          # (nx, T, q)
            X2q = [X2i[:, qa, qb] for X2i in X2r]
            pairs = {(i, j): X1a[i] * X1b[j] for i in range(nx) for j in range(nx)}

            def d2(F1, F2, nz, o=-1):                    # second source derivatives on the pairs, (T, q)
                if o >= 0:
                    return Xi2[rows_of(o)][:, qa, qb]
                return _total([F2[:, i, j, None] * pairs[i, j] for i, j in nz]
                              + [F1[:, i, None] * X2q[i] for i in range(nx)], None)
            kern = []
            for k in range(nk):
                D2a = d2(A1[:, k], A2[:, k], pat.a2[k], pat.a_out[k])
                D2b = D2a if pat.same[k] else d2(B1[:, k], B2[:, k], pat.b2[k], pat.b_out[k])
                kern.append((D2a, D2b, Da[k][:, vb], Db[k][:, vb]))
            r2 = d2(R1, R2, pat.r2)
            D2f.append((kern, fa2 * (r2 - r2[first]) + (fa2 + fb2) * r2[first]))
        res = x0 - w - K @ yv                            # the path must solve the single-site equations
        return yv, Xi, Xi2, Df, f, Xi3, D2f, res @ res, (a, b)

    # ------------------------------------------------------------------ sums over a chunk of paths
    def _chunk_sums(self, C, E, W, X0, mask, fa, fb, Z=None, CV=None, *, pat):
        T = self.T
        y, Xi, Xi2, Df, f, Xi3, D2f, res, (ka, kb) = jax.vmap(
            lambda w, x: self._path(C, E, w, x, fa, fb, pat, CV))(W, X0)
        m = mask
        oc, jc, anti = self.oc, self.jc, self.anti
        lam = Xi[:, oc, jc]                                                   # (S, 2T^2)
        # Ha by (row type, column type): only entries with o, j of the coupling's own kinds are ever needed
        rows, slots = self.rows, self.slots
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
                    part = 0.0
                    if lsep is not None:
                        part = jnp.einsum("nmsoj,nmsq->qoj", lsep[:, :, s0:s1, s0:, :s1],
                                          rsep[:, :, s0:s1, :nq(s1)] * mm)
                    if lns is not None:
                        ns = jnp.einsum("nmsja,nmsob->ojab", lns[:, :, s0:s1, :s1, :s1] * mm[..., None],
                                        rns[:, :, s0:s1, s0:, :s1])
                        t0, t1 = self.tri0[:nq(s1)], self.tri1[:nq(s1)]
                        ns = ns[:, :, t0, t1] + ns[:, :, t1, t0]
                        part = part + jnp.moveaxis(ns, 2, 0)
                    acc = acc.at[:nq(s1), s0:, :s1].add(part)                                   # (q, o, j)
                cols[kind].append(acc)
        if self.blocks:
            C3, E3 = (jnp.concatenate(cols[k], axis=0) for k in ("C", "E"))
            Pc = jnp.concatenate([jnp.swapaxes(C3, 1, 2).reshape(-1, T * T),
                                  jnp.swapaxes(E3, 1, 2).reshape(-1, T * T)], axis=1)
        else:
            Pc = jnp.zeros((0, 2 * T * T))
        # Price block of the hats, d2 f / dw_a dw_b summed over paths: matrix products over the paths
        tr0, tr1 = self.tril
        qa, qb = self.tri0, self.tri1                                           # pairs inside a block
        mq = m[:, None, None]
        Pe = []
        for kern, top2 in D2f:
            parts = []
            for k, (D2a, D2b, da, db) in enumerate(kern):
                A1 = jnp.einsum("ntq,ns->tsq", D2a * mq, kb[:, :, k])             # sum_n a''(t; q) b(s)
                A1b = A1[tr1, tr0] if pat.same[k] else \
                    jnp.einsum("nt,nsq->tsq", ka[:, :, k] * m[:, None], D2b)[tr0, tr1]   # sum_n a(t) b''(s; q)
                B1 = jnp.einsum("nta,nsb->tsab", da * mq, db)                     # sum_n a'(t, a) b'(s, b)
                parts.append(-(A1[tr0, tr1] + A1b + B1[tr0, tr1][:, qa, qb] + B1[tr0, tr1][:, qb, qa]))
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

    def moments(self, C, E, W, X0, *, feature, weights=None, stein=None, coefficients=None):
        """Sums over the paths (rows of W, X0), each weighted by ``weights`` (default 1; e.g. the weights of a
        cubature rule, normalised by the caller).  ``stein``: a (T, T) matrix Z over the first varying source block
        (u when it varies); then two more sums follow the tuple, Sf (T, nf, T) = sum_n (Z w)(a) df/dw_b and Sc
        (T, T^2, T) = sum_n (Z w)(a) d^2 y_o / dw_j dw_b over that block, for the anti-causal couplings (o, j)
        (Gaussian integration by parts of the Price blocks, :mod:`dmftc.runtime.sensitivities.price_by_parts`)."""
        S = W.shape[0]
        c = chunk_rows(S, self.chunk) if self.fit else self.chunk
        wts = np.ones(S) if weights is None else np.asarray(weights, float)
        CV = None if coefficients is None else jnp.asarray(coefficients, jnp.float64)    # (T, nc)
        pat = self.pattern(X0, CV)
        # a long run (many paths of a long system) is compiled at XLA's full optimisation whatever XLA_FLAGS asks
        # (the test suite lowers it for its many short programs; these sums then ran twice as long)
        long_run = S * self.path_size >= LONG_RUN_WORK
        if (pat, long_run) not in self._fns:
            self._fns[pat, long_run] = jax.jit(lambda *args: self._chunk_sums(*args, pat=pat),
                                               compiler_options=long_run_options() if long_run else None)
        fn = self._fns[pat, long_run]
        acc = None
        fixed = (jnp.asarray(C), jnp.asarray(E))          # the same for every chunk: converted once
        fa, fb = (np.broadcast_to(np.asarray(f, np.float64), (self.T,)) for f in feature)      # one per step
        Z = None if stein is None else jnp.asarray(stein)
        for i0 in range(0, S, c):
            Wc, Xc = W[i0:i0 + c], X0[i0:i0 + c]
            k = Wc.shape[0]
            mask = np.zeros(c)
            mask[:k] = wts[i0:i0 + c]
            if k < c:                                   # pad to the fixed chunk shape (one compilation)
                Wc = np.concatenate([Wc, np.repeat(Wc[:1], c - k, axis=0)])
                Xc = np.concatenate([Xc, np.repeat(Xc[:1], c - k, axis=0)])
            out = fn(*fixed, jnp.asarray(Wc), jnp.asarray(Xc), jnp.asarray(mask), fa, fb, Z, CV)
            if acc is None:
                acc = [np.array(o) for o in out]
            else:
                for a, o in zip(acc, out):
                    a += np.asarray(o)
        return acc
