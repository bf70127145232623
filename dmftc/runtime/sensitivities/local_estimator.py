"""ln Z_l of one layer kind of a deep network, estimated by Monte Carlo, with its gradient and Hessian over the
layer's local variables: the per-layer part of the deep propagator (:mod:`dmftc.runtime.engines.deep_propagator`, whose
docstring derives the single-site integrand F = exp(-Q(x*)) / |det(I - J(x*))|).

Estimator
---------
The per-path derivatives of :mod:`dmftc.runtime.sensitivities.site_moments` (first, second and third source derivatives
of the single-site fields from the local derivatives of the spec's own program, :mod:`dmftc.runtime.sensitivities.site_local`;
the Price block summed over paths and times in one matrix product).  It computes exactly the sums of the autodiff
estimator described below, which is kept as the reference (:mod:`dmftc.reference.deep_autodiff`: 'struct', and
'full' = brute force), and of the standard network's closed forms (:mod:`dmftc.reference.site_moments_closed`);
the tests check fast = struct = full = closed forms on the same paths.

* Derivatives in the couplings, hats and Delta ("theta"): pathwise.  x* at the saddle (causal C, E) is the
  march's field x0 (exact); off the saddle x*(theta, w) is reproduced by TWO Newton steps from the stopped x0,
  x_{k+1} = x_k - (I - J(x_k))^{-1} (x_k - w - F(x_k)), everything differentiable.  Newton's map N satisfies
  N(x*) = x*, N'(x*) = 0, so x1 - x* = O(|x0 - x*|^2) = O(|d theta|^2) and x2 - x* = O(|d theta|^4): the
  derivatives of x2 (and of F, det(I-J) built on it) agree with those of the implicit solution through THIRD
  order (one step would give first order only).  tests/test_deep_propagator.py checks this against finite
  differences of a converged solver.
* Derivatives in the source covariance Sw (the kernels Phi[l-1], G[l+1] in their source role): NOT by a
  reparametrisation w = sqrt(Sw) xi.  The saddle kernels are nearly singular (tanh, L = 2, T = 6, eta = 0.1:
  eigenvalues of Phi[1] from 2.4 down to 1.8e-9) and d sqrt(K) ~ dK / sqrt(lambda_min) makes that estimator's
  variance explode.  Instead Price's theorem (Gaussian integration by parts), exact for any PSD K:
  dE_K[F]/dK(t,s) = E_K[d^2 F / dw(t) dw(s)] (t > s; one half of it for t = s), so the mixed block
  d^2 Z / dK dtheta = E[d_theta d_w d_w F] (third order, still exact with two Newton steps), and the pure
  block d^2 Z / dK dK = 0 at the saddle because there F(w) = 1 for every w (hats 0, causal couplings).
  Default (``LocalEstimator.price_tol``): in the forward source u, one of the two w-derivatives is moved onto
  the Gaussian density along the leading eigen-directions of K, which removes phi''' and phi'''' from the
  samples there (:mod:`dmftc.runtime.sensitivities.price_by_parts`).
* The linear solves and ln det inside the Newton steps use R0 = (I - J(x0))^-1 at the base point (J(x0) is
  nilpotent there, so R0 is a finite product) and a Neumann series in J - J(x0) truncated after third order:
  exact for every derivative the estimator takes, matrix products only (no pivoting, no batched LAPACK, which
  deadlocked under vmap on this machine, see dmftc.reference.deep_autodiff.local_logf).
* ln Z_l = ln mean_n F_n with common random numbers: its Hessian is H_Z / Z - g_Z g_Z^T / Z^2 from chunked
  per-sample sums.  Default ('struct', LocalEstimator): derivatives in the reduced variables (C, E, hats),
  using that at the saddle ln F = hats . f(x) - ln det(I - J) vanishes identically on the causal subspace of
  (C, E), so only the T^2 anti-causal directions need Hessian-vector products; chain rule to the local
  variables.  'full': jax.hessian over all local variables (forward-over-reverse) and the Price block by
  reverse mode over second directional derivatives in w; the two agree to round-off (tests).
* Every Hessian entry is a plain sample mean of per-path derivatives: no division by kernel eigenvalues, no
  reweighting; the Monte Carlo error of the propagator comes from these means and from the group's own saddle.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import sparse

from dmftc.runtime.problem.activation import as_activation
from dmftc.errors import NumericalError, ParameterError
from dmftc.runtime.numerics.march_numerics import array_module
from dmftc.runtime.problem.deep_action import split_local, sym_from_tril, tril_matrix
from dmftc.runtime.problem.deep_model import DeepModel
from dmftc.runtime.sensitivities.held_paths import HeldPaths
from dmftc.runtime.sensitivities.price_by_parts import hybrid_price, stein_plan
from dmftc.runtime.sensitivities.site_local import local_map
from dmftc.runtime.sensitivities.site_moments import SiteMoments
from dmftc.runtime.solvers.local_hessian import LocalHessian

__all__ = ["LocalEstimator", "estimator"]


def local_couplings(v, T, model: DeepModel):
    """(C, E, hats) of the local vector v (deep_action.log_z_local order) under the model's couplings; hats =
    (Phi_hat, G_hat, Delta_hat) = (ph (nt), gh (nt), dh (T)), the coefficients of the features."""
    pp, gn, a, b, ph, gh, Delta, dh = split_local(v, T)
    C, E = model.couplings(sym_from_tril(tril_matrix(pp, T)), sym_from_tril(tril_matrix(gn, T)), a.reshape(T, T),
                           b.reshape(T, T), Delta)
    return C, E, array_module(v).concatenate([ph, gh, dh])


def _price_pairs(T, vary_u, vary_r):
    """Index pairs (a >= b) of the varying source blocks, their positions in v and the factors 1 (a > b), 1/2."""
    nt = T * (T + 1) // 2
    ti, si = np.tril_indices(T)
    pa, pb, pos, fac = [], [], [], []
    for off, vary, voff in ((0, vary_u, 0), (T, vary_r, nt)):        # (w offset, varies?, offset in v)
        if vary:
            pa.append(ti + off)
            pb.append(si + off)
            pos.append(voff + np.arange(nt))
            fac.append(np.where(ti == si, 0.5, 1.0))
    cat = lambda q, dt: np.concatenate(q).astype(dt) if q else np.zeros(0, dt)  # noqa: E731
    return cat(pa, int), cat(pb, int), cat(pos, int), cat(fac, float)




JIT_CACHE: dict = {}


class LocalEstimator:
    """Monte Carlo estimate of ln Z_l of one layer kind (T, activation, which source blocks vary) and its
    gradient and Hessian over the local variables v, from chunked per-path sums (common random numbers),
    valid at a causal base point with zero hats (the saddle).

    Derivatives in the reduced variables theta = (C, E (full T x T), hats).  There, per path, ln F = hats . f(x)
    + ell(C, E) with ell = -ln det(I - J(x)) and F = 1; ell = 0 on the whole causal subspace, so
        dF/dhats = f,  dF/dc = dell/dc (nonzero only for anti-causal c),  d2F/dhats2 = f f^T,
        d2F/dhats dc = df/dc + f dell/dc^T  (df/dc = f'(x) dx/dc, dx/dC(t,s) = R0[:, t] g(s),
                                             dx/dE(t,s) = R0[:, T+t] phi(h(s)), R0 = (I - J0)^-1),
        d2F/dc dc' = d2ell + dell dell^T, whose causal-causal block vanishes: only the T^2 anti-causal
        directions are needed.
    Price block: d/dtheta d2F/dw_a dw_b = (d2 ell/dw dw dc, d2 f/dw dw).  The map v -> theta is C = a +
    [s<t] eta gamma Delta(s) Phi(t,s) (and E alike): Hess_v = J^T Hess_theta J + sum_k <dF/dtheta_k> d2theta_k/dv2.
    The per-path sums come from :class:`dmftc.runtime.sensitivities.site_moments.SiteMoments` on the activation's program
    (:func:`dmftc.runtime.sensitivities.site_local.local_map`); the autodiff estimators they are tested against ('struct',
    'full') are in :mod:`dmftc.reference.deep_autodiff`."""

    method = "fast"
    # Price blocks: source directions whose eigenvalue is at least price_tol times the block's largest are
    # integrated by parts (Stein), the rest pathwise; None: all pathwise (see log_z)
    price_tol = 1e-2

    def __init__(self, *, T, activation, vary_u, vary_r, chunk=None, points=1):
        activation = as_activation(activation)
        self.T, self.activation, self.points = T, activation, int(points)
        self.vary_u = bool(vary_u)
        # on P training points the T steps are (time, point) pairs (dmftc.frontend.points_deep): causality, and
        # with it which couplings are anti-causal and when a column is determined, goes by the TIME of a step
        self.time = np.arange(T) // self.points
        tri = self.time[np.tril_indices(T)[0]]
        self.feature_time = np.concatenate([tri, tri, self.time])     # p p^T, g g^T (t >= s: time t), readout
        nt = T * (T + 1) // 2
        self.nt, self.nf = nt, 2 * nt + T
        self.nv = 4 * nt + 2 * T * T + 2 * T
        self.pa, self.pb, self.pos, self.fac = _price_pairs(T, vary_u, vary_r)
        tt, ss = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
        ts, ss_ = self.time[tt], self.time[ss]
        self.anti = np.concatenate([(tt * T + ss)[ss_ >= ts], T * T + (tt * T + ss)[ss_ > ts]])   # T^2 entries
        self._held = None
        self._setup(vary_u, vary_r, chunk)

    def _setup(self, vary_u, vary_r, chunk):
        key = ("fast", self.T, self.activation, bool(vary_u), bool(vary_r), chunk, self.points)
        if key not in JIT_CACHE:
            JIT_CACHE[key] = SiteMoments(T=self.T, local=local_map(self.activation), pa=self.pa, pb=self.pb,
                                    anti=self.anti, chunk=chunk, points=self.points)
        self._site = JIT_CACHE[key]

    def _at(self, v, top, model) -> dict:
        """What the layer's single-site system reads at the base point v: the couplings C, E, the readout's
        feature coefficients (zero below the last layer) and the one-time coefficients per step."""
        C0, E0, _ = local_couplings(np.asarray(v, np.float64), self.T, model)
        return dict(C=np.asarray(C0), E=np.asarray(E0), feature=model.features() if top else (0.0, 0.0),
                    coefficients=model.one_time_rows(self.T))

    def moments(self, v, W, X0, *, top, model, weights=None, stein=None):
        a = self._at(v, top, model)
        return self._site.moments(a["C"], a["E"], W, X0, feature=a["feature"], weights=weights, stein=stein,
                                  coefficients=a["coefficients"])

    def held_feature_sums(self, v, W, *, top, model):
        """(sum f, sum f f^T) over more paths of the layer at the base point v, source values W (S_e, 2 T)
        (:mod:`dmftc.runtime.sensitivities.held_paths`)."""
        a = self._at(v, top, model)
        return self.held().feature_sums(a["C"], a["E"], np.asarray(W), feature=a["feature"], CV=a["coefficients"])

    def held(self) -> HeldPaths:
        """The layer kind's single-site process at held order parameters (:mod:`dmftc.runtime.sensitivities.held_paths`)."""
        if self._held is None:
            self._held = HeldPaths(self._site)
        return self._held

    def log_z(self, v, W, X0, *, top, model, weights=None, extra=None, dense=True):
        """(ln Z, gradient, Hessian) of ln Z_l = ln mean_n F_n over v; the Price (source covariance) terms are
        folded into the kernel entries, the pure source-source block being 0 at the saddle (module doc).
        ``extra``: source values (S_e, 2 T) of more paths of the layer at this saddle, whose features join the
        hat-hat block (the features' covariance) and nothing else (:mod:`dmftc.runtime.sensitivities.held_paths`).
        ``dense``: the Hessian as an nv x nv array; else as its parts
        (:class:`dmftc.runtime.solvers.local_hessian.LocalHessian`, the same numbers to the bit)."""
        T, S, T2 = self.T, W.shape[0], self.T * self.T
        if extra is not None and weights is not None:
            raise ParameterError("extra feature paths go with equally weighted paths only")
        pp, gn, a, b, ph, gh, Delta, dh = split_local(np.asarray(v), T)
        later = self.time[None, :] >= self.time[:, None]              # (t, s): time of s >= time of t
        same = self.time[None, :] == self.time[:, None]
        if (np.abs(a.reshape(T, T)[later]).max() > 0 or np.abs(b.reshape(T, T)[later & ~same]).max() > 0
                or max(np.abs(ph).max(), np.abs(gh).max(), np.abs(dh).max()) > 0):
            raise ParameterError("the structured estimator needs a causal base point with zero hats (the saddle); "
                                 "elsewhere use the brute-force reference (dmftc.reference.deep_autodiff, "
                                 "method 'full')")
        by_parts = self.price_tol is not None and self.vary_u       # the forward source u varies: block 0
        Z, Pg = stein_plan(pp, T, self.price_tol) if by_parts else (None, None)
        out = self.moments(v, W, X0, top=top, model=model, weights=weights, stein=Z)
        Fs, l2, gl, f, ff, Jf, Ha, Pc, Pe = out[:9]
        if by_parts:
            Pc, Pe = hybrid_price(Pc, Pe, *out[9:], Pg, T=T, anti=self.anti, feature_time=self.feature_time,
                                  time=self.time)
        if l2 > 1e-16 * S:
            what = "residual of the single-site equations" if self.method == "fast" else "ln det(I - J)"
            raise NumericalError(f"{what} = {math.sqrt(l2 / S):.3g} (rms) at the base point: the couplings "
                                 "are not causal or x0 is not the solution of the single-site equations")
        Zb = Fs / S                                       # = 1 at the base point
        nc, nf = 2 * T2, self.nf
        m = np.concatenate([gl, f]) / S                   # <dF/dtheta>, theta = (c, hats)
        # theta-Hessian H_theta = E[d2F]/Z - m m^T / Z^2 (Z = 1).  Its causal-causal block vanishes (F = 1 on the
        # causal subspace; m = 0 there), so only the columns R = (anti-causal couplings, hats) are needed, and
        # each theta in R is a single entry of v (a, b or a hat): the chain rule is a placement plus the causal
        # rows, which depend on (a, Phi, Delta) or (b, G, Delta).
        caus = np.setdiff1d(np.arange(nc), self.anti)
        if np.abs(m[caus]).max() > 0:
            raise NumericalError("nonzero mean derivative along a causal coupling: not a causal base point")
        R = np.concatenate([self.anti, nc + np.arange(nf)])
        na = len(self.anti)
        HR = np.empty((nc + nf, len(R)))                  # H_theta[:, R]
        HR[:nc, :na] = Ha.T / S
        HR[self.anti, :na] = 0.5 * (Ha[:, self.anti] + Ha[:, self.anti].T) / S
        HR[:nc, na:] = Jf.T / S
        HR[nc:, :na] = Jf[:, self.anti] / S
        HR[nc:, na:] = ff / S
        mm = np.outer(m, m[R])                        # HR / Zb - m m_R^T / Zb^2, in place (HR: |theta| x |R|)
        mm /= Zb ** 2
        HR /= Zb
        HR -= mm
        del mm
        if extra is not None and len(extra):           # the features' covariance from every path at this saddle
            fe, ffe = self.held_feature_sums(v, extra, top=top, model=model)
            n = S + extra.shape[0]
            mf = (f + fe) / n
            HR[nc:, na:] = (ff + ffe) / n - np.outer(mf, mf)
        J, (si, sj, sv) = _theta_jacobian(np.asarray(v), m / Zb, T, model)
        JR = J[R]
        if not np.all(np.diff(JR.indptr) == 1) or not np.all(JR.data == 1.0):
            raise AssertionError("anti-causal couplings and hats must be plain entries of v")
        vR = JR.indices
        Jt = J.T.tocsr()                              # theta(v) is affine in most of v: J is very sparse
        HRR = HR[R]
        B = np.asarray(J[caus].T @ HR[caus])          # (nv, |R|): causal rows through the chain rule
        del HR
        grad = Jt @ m / Zb
        pos, Pv = self.pos, np.zeros((0, self.nv))
        if len(pos):                                  # pos: distinct entries of v
            Pv = self.fac[:, None] * np.asarray(Jt @ (np.concatenate([Pc, Pe], axis=1) / S / Zb).T).T
        # sum_k <dF/dtheta_k> d2 theta_k / dv2 (bilinear terms): the sparse triplets
        hess = LocalHessian(self.nv, vR, HRR, B, si, sj, sv, pos, Pv)
        return math.log(Zb), grad, (hess.dense() if dense else hess)

def _theta_jacobian(v, m, T, model: DeepModel):
    """(d theta/dv as a sparse (n_theta, n_v) matrix, the Hessian of m . theta(v) as COO triplets (i, j, value)),
    theta = (C, E, hats) flattened (local_couplings): C(t,s) = a(t,s) + [s<t] k_h(Phi(t,s), Delta(s)), E alike with G,
    b and k_z, hats = (Phi_hat, G_hat, Delta_hat).  The couplings are elementwise, so every derivative is a
    partial derivative of k at one entry, taken by JAX from the model's own functions (DeepModel.partials);
    the second derivatives are those of the causal entries in (kernel entry, Delta(s)), the entries of the
    model's own strict mask (:meth:`DeepModel.strict`: s < t in time, on several points too)."""
    nt, T2 = T * (T + 1) // 2, T * T
    o_pp, o_gn, o_a, o_b = 0, nt, 2 * nt, 2 * nt + T2
    o_ph, o_D, o_dh = 2 * nt + 2 * T2, 4 * nt + 2 * T2, 4 * nt + 2 * T2 + T
    pp, gn = v[o_pp:o_pp + nt], v[o_gn:o_gn + nt]
    Delta = v[o_D:o_D + T]
    tri = np.zeros((T, T), int)
    ti, si = np.tril_indices(T)
    tri[ti, si] = np.arange(nt)
    tri[si, ti] = np.arange(nt)
    t, s = np.divmod(np.arange(T2), T)
    causal = np.asarray(model.strict(T))[t, s] > 0
    rows, cols, vals = [np.arange(2 * T2)], [np.concatenate([o_a + np.arange(T2), o_b + np.arange(T2)])], \
        [np.ones(2 * T2)]
    si_, sj_, sv_ = [], [], []
    for k, (o_k, ker, which) in enumerate(((o_pp, pp, "h"), (o_gn, gn, "z"))):   # C from (pp, a), E from (gn, b)
        r = k * T2 + np.flatnonzero(causal)
        ic, ds = tri[t[causal], s[causal]], s[causal]
        kq, kd, kqq, kqd, kdd = (x[t[causal], s[causal]] for x in model.partials(which, ker[tri], Delta))
        rows += [r, r]
        cols += [o_k + ic, o_D + ds]
        vals += [kq, kd]
        w = m[r]
        si_ += [o_k + ic, o_k + ic, o_D + ds, o_D + ds]
        sj_ += [o_k + ic, o_D + ds, o_k + ic, o_D + ds]
        sv_ += [w * kqq, w * kqd, w * kqd, w * kdd]
    nh = 2 * nt + T
    rows.append(2 * T2 + np.arange(nh))
    cols.append(np.concatenate([o_ph + np.arange(2 * nt), o_dh + np.arange(T)]))
    vals.append(np.ones(nh))
    nv = 4 * nt + 2 * T2 + 2 * T
    J = sparse.coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                          shape=(2 * T2 + nh, nv)).tocsr()
    return J, (np.concatenate(si_), np.concatenate(sj_), np.concatenate(sv_))


_EST: dict = {}


def estimator(T, activation, vary_u, vary_r, chunk=None, points=1):
    """The ln Z_l estimator of a layer kind (cached).  ``points``: P of a spec on several training points, whose T
    steps are the (time, point) pairs.  The autodiff references it is tested against are
    :class:`dmftc.reference.deep_autodiff.AutodiffEstimator` (tests only)."""
    activation = as_activation(activation)
    key = (T, activation, bool(vary_u), bool(vary_r), chunk, int(points))
    if key not in _EST:
        _EST[key] = LocalEstimator(T=T, activation=activation, vary_u=vary_u, vary_r=vary_r, chunk=chunk,
                                   points=points)
    return _EST[key]
