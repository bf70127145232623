"""Autodiff references for the deep propagator's per-path sums (used by the tests as independent oracles).

:class:`dmftc.runtime.sensitivities.local_estimator.LocalEstimator` computes the Hessian of each layer's Monte Carlo ln Z_l from the
per-path derivatives of :mod:`dmftc.runtime.sensitivities.site_moments` (the implicit-function calculus of the single-site system
on the local derivatives of the spec's program).  This module computes the same quantities by JAX autodiff of the
whole single-site integrand of the standard two-field network, with no implicit-function calculus:

* ``local_logf``: ln F = hats . f(x) - ln det(I - J(x)) of one path, x the implicit solution of the single-site
  equations reproduced by two differentiable Newton steps (exact through third order at a causal base point);
* :class:`AutodiffEstimator` method 'struct': derivatives in the reduced variables (C, E, hats), only the
  anti-causal directions by Hessian-vector products, the Price block by reverse mode over second source
  derivatives; method 'full': ``jax.hessian`` of sum_n F_n over all local variables (brute force);
* ``_theta_map``: the coupling map's Jacobian and Hessian by autodiff (reference for ``_theta_jacobian``);
* ``gaussian_cubature5``: a degree-5 Gaussian cubature rule, on which the same code gives the exact propagator
  of a linear network.

The tests check fast = struct = full on the same paths to round-off.  Nothing on the user's path imports this
module (``deep_propagator(method='struct' | 'full')`` loads it for the tests).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from dmftc.runtime.sensitivities.local_estimator import JIT_CACHE, LocalEstimator, local_couplings
from dmftc.errors import ParameterError
from dmftc.runtime.sensitivities.site_moments import nilpotent_inverse
from dmftc.runtime.problem.activation import as_activation


def _act_jax(act):
    """(h, z) -> (phi(h), phi'(h), g, dg/dh, dg/dz) with the gradient field g = a(h) z + b(h) of an activation
    (anything dmftc.runtime.problem.activation.as_activation reads), in JAX; higher derivatives are JAX's own."""
    act = as_activation(act)

    def fields(h, z):
        p, p1 = act.fn(h)[:2]
        a, a1, _, _, b, b1, _, _ = act.gradient(h)
        return p, p1, a * z + b, a1 * z + b1, a

    return fields


__all__ = ["AutodiffEstimator", "autodiff_estimator", "local_logf", "gaussian_cubature5"]


def _solve_site(C, E, w, x0, *, T, activation, newton=2, order=3):
    """(x, ln|det(I - J(x))|) with x the implicit solution of x = w + F(x; C, E) from ``newton`` Newton steps
    started at x0 (a constant), exact through ``order`` derivatives at a causal base point (see local_logf)."""
    act = _act_jax(activation)
    zero = jnp.zeros((T, T))

    def system(x):
        p, p1, g, gh, gz = act(x[:T], x[T:])
        R = x - w - jnp.concatenate([C @ g, E @ p])
        Jm = jnp.block([[C * gh[None, :], C * gz[None, :]], [E * p1[None, :], zero]])
        return R, Jm

    J0 = jax.lax.stop_gradient(system(x0)[1])
    R0 = nilpotent_inverse(J0)

    def solve(Jm, r):                     # (I - Jm)^-1 r, Jm = J0 + delta, through O(delta^order)
        M = R0 @ (Jm - J0)
        y = R0 @ r
        out = y
        for _ in range(order):
            y = M @ y
            out = out + y
        return out

    x = x0
    for _ in range(newton):
        R, Jm = system(x)
        x = x - solve(Jm, R)
    M = R0 @ (system(x)[1] - J0)
    logdet, Mk = 0.0, jnp.eye(2 * T)
    for k in range(1, order + 1):
        Mk = Mk @ M
        logdet = logdet - jnp.trace(Mk) / k
    return x, logdet


def _features(x, *, T, activation, feature):
    """f(x) with -Q + (Delta_hat source) = hats . f:  (-phi(h(t)) phi(h(s)), t >= s; -g(t) g(s), t >= s;
    a z(t) phi(h(t)) + b z(0) phi(h(0))), (a, b) = ``feature`` (the readout's, DeepModel.features, in the last
    layer; 0 below it)."""
    fa, fb = feature
    act = _act_jax(activation)
    tril = np.tril_indices(T)
    hh, zz = x[:T], x[T:]
    p, _, g, _, _ = act(hh, zz)
    return jnp.concatenate([-jnp.outer(p, p)[tril], -jnp.outer(g, g)[tril], fa * (zz * p - zz[0] * p[0]) + (fa + fb) * zz[0] * p[0]])


def local_logf(v, w, x0, *, T, activation, model, feature, newton=2, order=3):
    """ln of the integrand F = exp(-Q(x)) / |det(I - J(x))| of one sample, x = the implicit solution of
    x = w + F(x) reproduced by ``newton`` differentiable Newton steps from x0 (treated as a constant).
    v: local variables in deep_action.log_z_local order; w = (u, r), x0 = (h, z), each (2T,).

    Exact through ``order`` (= 3) derivatives at a CAUSAL base point (v, w) with x0 its exact solution, which
    is all the estimator needs: there J0 = J(x0) is nilpotent (strictly lower triangular in the causal order),
    R0 = (I - J0)^-1 is a finite product, det(I - J0) = 1, and with delta = J(x) - J0 = O(eps) (eps the
    distance from the base point)
        (I - J)^-1 = sum_{k <= order} (R0 delta)^k R0 + O(eps^(order+1)),
        ln det(I - J) = -sum_{k=1..order} tr((R0 delta)^k) / k + O(eps^(order+1)).
    Only matrix products: no pivoting, no sequential loop, no batched LAPACK call (jnp.linalg.solve /
    slogdet under vmap deadlocked intermittently in jaxlib 0.10.2 on this machine: gdb showed
    lapack_dtrsm_ffi -> jax::ParallelBatchMap waiting in BlockingCounter::Wait with every pool worker idle).
    Newton: x_{k+1} = x_k - (I - J(x_k))^-1 (x_k - w - F(x_k)); x1 - x* = O(eps^2), x2 - x* = O(eps^4)."""
    C, E, hats = local_couplings(v, T, model)
    x, logdet = _solve_site(C, E, w, x0, T=T, activation=activation, newton=newton, order=order)
    return hats @ _features(x, T=T, activation=activation, feature=feature) - logdet


def _second(fn, w, a, b):
    """d^2 fn(w) / dw_a dw_b by forward-over-forward mode (fn may return a pytree)."""
    ea = jnp.zeros(w.shape[0]).at[a].set(1.0)
    eb = jnp.zeros(w.shape[0]).at[b].set(1.0)
    return jax.jvp(lambda w1: jax.jvp(fn, (w1,), (ea,))[1], (w,), (eb,))[1]


def _site_map(x, C, E, T, activation):
    """F(x) of the single-site equations x = w + F(x) (used for J0 = dF/dx at the base point)."""
    p, _, g, _, _ = _act_jax(activation)(x[:T], x[T:])
    return jnp.concatenate([C @ g, E @ p])


_THETA: dict = {}


def _theta_map(T, model):
    """jitted (v, m) -> (d theta/dv, Hessian of m . theta(v)) of a DeepModel by autodiff of the whole map (the
    reference for _theta_jacobian)."""
    key = (T, model.key)
    if key not in _THETA:
        def fn(v, m):
            theta = lambda vv: jnp.concatenate([q.reshape(-1) for q in local_couplings(vv, T, model)])  # noqa: E731
            return jax.jacfwd(theta)(v), jax.hessian(lambda vv: m @ theta(vv))(v)
        _THETA[key] = jax.jit(fn)
    return _THETA[key]


def gaussian_cubature5(d):
    """Points (2 d^2 + 1, d) and weights of a symmetric cubature rule exact for every polynomial of degree <= 5
    under the standard normal N(0, I_d) (the classical fully symmetric degree-5 rule: the origin,
    +- sqrt(d + 2) e_i and +- sqrt((d + 2) / 2) (e_i +- e_j); weights 2/(d+2), (4-d)/(2(d+2)^2), 1/(d+2)^2).
    For linear networks every sum of the propagator is a Gaussian moment of degree <= 4, so these points
    give the EXACT propagator (no sampling error)."""
    pts, wts = [np.zeros(d)], [2.0 / (d + 2)]
    r, s2 = math.sqrt(d + 2.0), math.sqrt((d + 2.0) / 2.0)
    for i in range(d):
        for sg in (1.0, -1.0):
            e = np.zeros(d)
            e[i] = sg * r
            pts.append(e)
            wts.append((4.0 - d) / (2.0 * (d + 2.0) ** 2))
    for i in range(d):
        for j in range(i + 1, d):
            for si in (1.0, -1.0):
                for sj in (1.0, -1.0):
                    e = np.zeros(d)
                    e[i], e[j] = si * s2, sj * s2
                    pts.append(e)
                    wts.append(1.0 / (d + 2.0) ** 2)
    return np.array(pts), np.array(wts)


class AutodiffEstimator(LocalEstimator):
    """:class:`~dmftc.runtime.sensitivities.local_estimator.LocalEstimator` with its per-path sums from autodiff (module doc):
    method 'struct' (at the saddle) or 'full' (brute force; any base point where local_logf is exact)."""

    price_tol = None                 # the references sum the Price blocks pathwise

    def __init__(self, *, T, activation, vary_u, vary_r, chunk=None, method="struct"):
        if method not in ("struct", "full"):
            raise ParameterError(f"method must be 'struct' or 'full', got {method!r}")
        self.method = method
        super().__init__(T=T, activation=activation, vary_u=vary_u, vary_r=vary_r, chunk=chunk)

    def _setup(self, vary_u, vary_r, chunk):
        T, method = self.T, self.method
        per_sample = (self.nv if method == "full" else len(self.anti) + len(self.pa) + 2) * 40 * (2 * T) ** 2
        self.chunk = chunk or int(max(16, min(1024, 4e7 / per_sample)))
        self._key = (T, self.activation, len(self.pa), self.chunk, method)   # layer kinds with as many pairs share it

    def _fn(self, model):
        key = self._key + (model.key,)
        if key not in JIT_CACHE:
            body = self._moments_full if self.method == "full" else self._moments_struct
            JIT_CACHE[key] = jax.jit(lambda *a: body(model, *a))
        return JIT_CACHE[key]

    def moments(self, v, W, X0, *, top, model, weights=None, stein=None):
        if weights is not None:
            raise ParameterError("path weights need method='fast'")
        if stein is not None:           # LocalEstimator.log_z passes stein=None here: price_tol is None
            raise ParameterError("the autodiff references sum the Price blocks pathwise (no Stein sums)")
        S, c = W.shape[0], self.chunk
        acc = None
        for i0 in range(0, S, c):
            Wc, Xc = W[i0:i0 + c], X0[i0:i0 + c]
            n = Wc.shape[0]
            mask = np.zeros(c)
            mask[:n] = 1.0
            if n < c:                                   # pad to the fixed chunk shape (one compilation)
                Wc = np.concatenate([Wc, np.repeat(Wc[:1], c - n, axis=0)])
                Xc = np.concatenate([Xc, np.repeat(Xc[:1], c - n, axis=0)])
            fa, fb = model.features() if top else (0.0, 0.0)
            out = [np.asarray(o) for o in self._fn(model)(jnp.asarray(v), jnp.asarray(Wc), jnp.asarray(Xc),
                                                          jnp.asarray(mask), fa, fb,
                                                          jnp.asarray(self.pa), jnp.asarray(self.pb))]
            acc = out if acc is None else [a + o for a, o in zip(acc, out)]
        return acc

    def log_z(self, v, W, X0, *, top, model, weights=None):
        if self.method == "full":
            return self._log_z_full(v, W, X0, top=top, model=model)
        return super().log_z(v, W, X0, top=top, model=model, weights=weights)

    def _moments_full(self, model, v, W, X0, mask, fa, fb, pa, pb):
        T, act = self.T, self.activation
        one = lambda vv, ww, xx: jnp.exp(local_logf(vv, ww, xx, T=T, activation=act, model=model,  # noqa: E731
                                                    feature=(fa, fb)))
        total = lambda vv: jnp.sum(mask * jax.vmap(one, in_axes=(None, 0, 0))(vv, W, X0))      # noqa: E731
        Z, g = jax.value_and_grad(total)(v)
        H = jax.jacfwd(jax.grad(total))(v)

        def d2(vv, a, b):          # sum_n d^2 F_n / dw_a dw_b
            return jnp.sum(mask * jax.vmap(lambda ww, xx: _second(lambda w2: one(vv, w2, xx), ww, a, b))(W, X0))

        if pa.shape[0]:
            p0, P = jax.vmap(jax.value_and_grad(d2), in_axes=(None, 0, 0))(v, pa, pb)
        else:
            p0, P = jnp.zeros(0), jnp.zeros((0, self.nv))
        return Z, g, H, p0, P

    def _moments_struct(self, model, v, W, X0, mask, fa, fb, pa, pb):
        T, act = self.T, self.activation
        T2 = T * T
        C0, E0, _ = local_couplings(v, T, model)
        c0 = jnp.concatenate([C0.reshape(-1), E0.reshape(-1)])
        feats = lambda x: _features(x, T=T, activation=act, feature=(fa, fb))  # noqa: E731
        anti = jnp.asarray(self.anti)

        def site(c, w, x0):
            return _solve_site(c[:T2].reshape(T, T), c[T2:].reshape(T, T), w, x0, T=T, activation=act)

        def ell(c, w, x0):
            return -site(c, w, x0)[1]

        def per(w, x0):
            l0, gl = jax.value_and_grad(ell)(c0, w, x0)
            Ha = jax.vmap(lambda i: jax.jvp(lambda c: jax.grad(ell)(c, w, x0), (c0,),
                                            (jnp.zeros(2 * T2).at[i].set(1.0),))[1])(anti)       # (T^2, 2T^2)
            hh, zz = x0[:T], x0[T:]
            p, _, g, _, _ = _act_jax(act)(hh, zz)
            # dx/dc at the base point: (I - J0)^-1 dF/dc with dF_h(t)/dC(t,s) = g(s), dF_z(t)/dE(t,s) = phi(h(s))
            J0 = jax.lax.stop_gradient(jax.jacfwd(lambda x: _site_map(x, C0, E0, T, act))(x0))
            R0 = nilpotent_inverse(J0)
            dx = jnp.concatenate([(R0[:, :T, None] * g[None, None, :]).reshape(2 * T, T2),
                                  (R0[:, T:, None] * p[None, None, :]).reshape(2 * T, T2)], axis=1)
            f0, Df = feats(x0), jax.jacfwd(feats)(x0)
            Jf = Df @ dx                                                                        # (nf, 2T^2)

            def price(a, b):
                def both(c):
                    def one(ww):
                        x, logdet = site(c, ww, x0)
                        return -logdet, feats(x)
                    return _second(one, w, a, b)
                (_, fe), gc = jax.value_and_grad(both, has_aux=True)(c0)
                return gc, fe

            if pa.shape[0]:
                Pc, Pe = jax.vmap(price)(pa, pb)
            else:
                Pc, Pe = jnp.zeros((0, 2 * T2)), jnp.zeros((0, self.nf))
            F = jnp.exp(l0)
            return (F, l0 ** 2, gl, f0, jnp.outer(f0, f0), Jf + jnp.outer(f0, gl), Ha + jnp.outer(gl[anti], gl),
                    Pc, Pe)

        out = jax.vmap(per)(W, X0)
        return tuple(jnp.tensordot(mask, o, axes=1) for o in out)

    def _log_z_full(self, v, W, X0, *, top, model):
        S = W.shape[0]
        Z, g, H, p0, P = self.moments(v, W, X0, top=top, model=model)
        grad = g / Z
        hess = H / Z - np.outer(g, g) / Z ** 2
        Pf = np.zeros((self.nv, self.nv))
        if len(self.pos):
            np.add.at(Pf, self.pos, self.fac[:, None] * (P / Z - np.outer(p0, g) / Z ** 2))
            np.add.at(grad, self.pos, self.fac * p0 / Z)
        hess = hess + Pf + Pf.T
        return math.log(Z / S), grad, hess


def autodiff_estimator(T, activation, vary_u, vary_r, *, method="struct", chunk=None) -> AutodiffEstimator:
    """The autodiff reference of :func:`dmftc.runtime.sensitivities.local_estimator.estimator` for a layer kind (one training
    point): ``method`` 'struct' (at the saddle) or 'full' (brute force); ``activation`` as the runtime takes it."""
    return AutodiffEstimator(T=T, activation=as_activation(activation), vary_u=vary_u, vary_r=vary_r, chunk=chunk,
                             method=method)
