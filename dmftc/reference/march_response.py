"""The deep propagator as the linear response of the saddle-point march: an oracle for small T.

The finite-width propagator of a deep network, Sigma = U^-1 Kd U^-T from the Hessian of the MSR action
(:mod:`dmftc.runtime.engines.deep_propagator`), can be written in terms of the one causal march of the single-site
processes alone.  Let the march compute every average q_i = <O_i> (kernels Phi[l](t, s), G[l](t, s), the
responses A[l](t, s) = <d phi(h[l](t)) / d r[l](s)>, B[l](t, s) = <d g[l](t) / d u[l](s)> as averages of
per-path tangents, and the readout average M(t) = <z[L](t) phi(h[L](t))>), and inject a perturbation
q_i = <O_i> + eps_i into each.  With the sources reparameterised through the kernels' causal Cholesky factors
(u[l] = chol(Phi[l-1]) xi), the march is a differentiable map eps -> q, and

    Sigma = J (kappa + H) J^T,   J = dq / d eps (= (1 - D)^-1, D the march's own sensitivities),
    kappa = Cov over paths of O (observables and per-path response tangents),
    H     = < d^2 l / dy dy >   over paths, at y = 0,

where l(y) = y . O(x*) - ln det(1 - dF/dx (x*)) is a path's log-weight in the duals y of the action: the hats
of the kernels and of the readout (entering through y . O) and the anti-causal entries of the couplings (h(s)
reading g(t) and z(s) reading phi(h(t)) at t > s), with x* = w + F(x*) the single-site equations solved with
them.  dl/dy = O at y = 0 (the responses are the derivatives of -ln det in the anti-causal couplings), so the
first term is the "N independent neurons" picture; H (the response duals' second derivatives: the change of
an observable under an anti-causal coupling, and the loop terms of -ln det) is what a deep network adds and
what that picture misses (measured: 5-15% of N Var at the later times for tanh, L = 2, T = 3).

This module computes all three by brute force on the standard network (one training point, the network of
:mod:`dmftc.runtime.march.deep_dmft`): the march unrolled in Python, J by forward-mode JAX over every eps, H by
``jax.hessian`` of l per path (x* by fixed-point iteration, exact to second order because the causal part is
nilpotent).  Cost grows fast with T; it is meant for T <= 4 in tests, as an independent check of the
propagator's estimator and as the specification of a reverse-mode engine (J^T by vector-Jacobian products of
the march, H along the outputs' directions).
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Layout", "march", "log_weight_hessian", "log_weight_gradient", "dual_indices", "propagator"]


@dataclass(frozen=True)
class Layout:
    """Index of every injected perturbation eps: per layer l = 1..L the kernels Phi[l](t, s <= t), G[l](t, s <= t),
    the responses A[l](t, s < t), B[l](t, s <= t); then the readout average M(t)."""
    L: int
    T: int

    @property
    def tri(self):
        return [(t, s) for t in range(self.T) for s in range(t + 1)]

    @property
    def stri(self):
        return [(t, s) for t in range(self.T) for s in range(t)]

    @property
    def per_layer(self) -> int:
        return 3 * len(self.tri) + len(self.stri)

    @property
    def n(self) -> int:
        return self.L * self.per_layer + self.T

    def offset(self, l: int, kind: str) -> int:
        """First index of family ``kind`` ('Phi', 'G', 'A', 'B') of layer l (1-based), or of 'M'."""
        if kind == "M":
            return self.L * self.per_layer
        nt, ns = len(self.tri), len(self.stri)
        return (l - 1) * self.per_layer + {"Phi": 0, "G": nt, "A": 2 * nt, "B": 2 * nt + ns}[kind]


def _derivatives(phi):
    d1 = jax.grad(phi)
    d2 = jax.grad(d1)
    return jnp.vectorize(phi), jnp.vectorize(d1), jnp.vectorize(d2)


def _source(K, t, xi):
    """Row t of the causal Cholesky reparameterisation of a GP with kernel K (entries s <= t used)."""
    Kt = K[: t + 1, : t + 1]
    Kt = jnp.tril(Kt) + jnp.tril(Kt, -1).T
    return jnp.linalg.cholesky(Kt)[t] @ xi[: t + 1]


def march(eps, xiu, xir, *, phi, L, T, gamma, eta, y, keep=False):
    """The discrete-time march of the standard deep network (module doc of :mod:`dmftc.runtime.march.deep_dmft`) with
    every average perturbed by ``eps`` (``Layout(L, T)``); sources u[l] = chol(Phi[l-1]) xiu[l-1], r[l] =
    chol(G[l+1]) xir[l-1], xiu, xir (L, T, S) standard normals (the boundary kernels 1 give constant sources).
    Returns the outputs (Delta(t), K(t), Phi[l](t, t), G[l](t, t) for l = 1..L, stacked, (2 + 2L) T); with
    ``keep`` also the per-path observables O (n, S) in the order of eps and the saddle's arrays."""
    lay = Layout(L, T)
    f, d1, d2 = _derivatives(phi)
    S = xiu.shape[2]
    Phi = [jnp.ones((T, T))] + [jnp.zeros((T, T)) for _ in range(L)] + [None]
    G = [None] + [jnp.zeros((T, T)) for _ in range(L)] + [jnp.ones((T, T))]
    A = [jnp.zeros((T, T)) for _ in range(L + 1)]          # A[0] = 0
    B = [jnp.zeros((T, T)) for _ in range(L + 2)]          # B[L+1] = 0
    h, z, u, r = (np.empty((L + 1, T), dtype=object) for _ in range(4))
    # per-path tangents of h, z wrt the sources r (..r) and u (..u) at every time: (L+1, T) of (S, T)
    dhr, dzr, dhu, dzu = (np.empty((L + 1, T), dtype=object) for _ in range(4))
    Delta, M = [], []
    obs = {}
    eye = jnp.eye(T)

    def put(X, l, kind, t, s, o, strict=False):
        pairs = lay.stri if strict else lay.tri
        k = lay.offset(l, kind) + pairs.index((t, s))
        obs[k] = o
        return X.at[t, s].set(jnp.mean(o) + eps[k])

    for t in range(T):
        dl = jnp.array(Delta + [0.0] * (T - t))              # Delta(s < t) known
        for l in range(1, L + 1):                             # forward sweep
            u[l, t] = xiu[l - 1, 0] if l == 1 else _source(Phi[l - 1], t, xiu[l - 1])
            ch = A[l - 1][t] + eta * gamma * dl * Phi[l - 1][t]
            gs = [d1(h[l, s]) * z[l, s] for s in range(t)]
            h[l, t] = u[l, t] + sum((ch[s] * gs[s] for s in range(t)), jnp.zeros(S))

            def dg(s, dh, dz):
                return d2(h[l, s])[:, None] * z[l, s][:, None] * dh + d1(h[l, s])[:, None] * dz
            dhr[l, t] = sum((ch[s] * dg(s, dhr[l, s], dzr[l, s]) for s in range(t)), jnp.zeros((S, T)))
            dhu[l, t] = eye[t][None, :] + sum((ch[s] * dg(s, dhu[l, s], dzu[l, s]) for s in range(t)),
                                              jnp.zeros((S, T)))
            for s in range(t + 1):
                Phi[l] = put(Phi[l], l, "Phi", t, s, f(h[l, t]) * f(h[l, s]))
            for s in range(t):
                A[l] = put(A[l], l, "A", t, s, d1(h[l, t]) * dhr[l, t][:, s], strict=True)
        for l in range(L, 0, -1):                             # backward sweep
            r[l, t] = xir[l - 1, 0] if l == L else _source(G[l + 1], t, xir[l - 1])
            cz = B[l + 1][t] + eta * gamma * dl * G[l + 1][t] * (jnp.arange(T) < t)
            z[l, t] = r[l, t] + sum((cz[s] * f(h[l, s]) for s in range(t + 1)), jnp.zeros(S))
            dzr[l, t] = eye[t][None, :] + sum((cz[s] * d1(h[l, s])[:, None] * dhr[l, s] for s in range(t + 1)),
                                              jnp.zeros((S, T)))
            dzu[l, t] = sum((cz[s] * d1(h[l, s])[:, None] * dhu[l, s] for s in range(t + 1)), jnp.zeros((S, T)))
            g = [d1(h[l, s]) * z[l, s] for s in range(t + 1)]
            for s in range(t + 1):
                G[l] = put(G[l], l, "G", t, s, g[t] * g[s])
            dgu = d2(h[l, t]) * z[l, t] * dhu[l, t].T + d1(h[l, t]) * dzu[l, t].T      # (T, S)
            for s in range(t + 1):
                B[l] = put(B[l], l, "B", t, s, dgu[s])
        k = lay.offset(L, "M") + t
        obs[k] = z[L, t] * f(h[L, t])
        M.append(jnp.mean(obs[k]) + eps[k])
        Delta.append(y - (M[t] - M[0]) / gamma)
    Delta = jnp.stack(Delta)
    K = sum(jnp.diagonal(G[l + 1]) * jnp.diagonal(Phi[l]) for l in range(L + 1))
    out = jnp.concatenate([Delta, K] + [jnp.diagonal(Phi[l]) for l in range(1, L + 1)]
                          + [jnp.diagonal(G[l]) for l in range(1, L + 1)])
    if not keep:
        return out
    saddle = dict(Phi=Phi, G=G, A=A, B=B, Delta=Delta,
                  u=[None] + [jnp.stack(list(u[l]), axis=1) for l in range(1, L + 1)],
                  r=[None] + [jnp.stack(list(r[l]), axis=1) for l in range(1, L + 1)])
    return out, jnp.stack([obs[i] for i in range(lay.n)]), saddle


def _log_weight(saddle, l, *, phi, L, T, gamma, eta):
    """A layer's log-weight l(y) per path, with y = 0, the paths' sources and the duals' indices into eps."""
    lay = Layout(L, T)
    tri, stri = lay.tri, lay.stri
    f, d1, _ = _derivatives(phi)
    D = saddle["Delta"]
    causal = jnp.arange(T)[None, :] < jnp.arange(T)[:, None]
    Ch = jnp.where(causal, saddle["A"][l - 1] + eta * gamma * D[None, :] * saddle["Phi"][l - 1], 0.0)
    Cz = jnp.where(causal | jnp.eye(T, dtype=bool),
                   saddle["B"][l + 1] + jnp.where(causal, eta * gamma * D[None, :] * saddle["G"][l + 1], 0.0), 0.0)
    last = l == L
    nt, ns = len(tri), len(stri)
    ti, si = np.array([p[0] for p in tri]), np.array([p[1] for p in tri])
    tsi, ssi = np.array([p[0] for p in stri]), np.array([p[1] for p in stri])

    def ell(yv, w):
        yP, yG, yA, yB = yv[:nt], yv[nt:2 * nt], yv[2 * nt:2 * nt + ns], yv[2 * nt + ns:3 * nt + ns]
        yM = yv[3 * nt + ns:]
        Ea = jnp.zeros((T, T)).at[ssi, tsi].set(yA)          # z(s) reads phi(h(t)), s < t
        Ca = jnp.zeros((T, T)).at[si, ti].set(yB)            # h(s) reads g(t), s <= t

        def F(x):
            hh, zz = x[:T], x[T:]
            return jnp.concatenate([w[:T] + (Ch + Ca) @ (d1(hh) * zz), w[T:] + (Cz + Ea) @ f(hh)])
        x = w
        for _ in range(6 * T):                                # nilpotent causal part: exact to 2nd order
            x = F(x)
        logdet = jnp.linalg.slogdet(jnp.eye(2 * T) - jax.jacfwd(F)(x))[1]
        hh, zz = x[:T], x[T:]
        gg = d1(hh) * zz
        val = -logdet + yP @ (f(hh)[ti] * f(hh)[si]) + yG @ (gg[ti] * gg[si])
        if last:
            val = val + yM @ (zz * f(hh))
        return val

    idx = dual_indices(lay, l)
    w = jnp.concatenate([saddle["u"][l], saddle["r"][l]], axis=1)          # (S, 2T)
    return ell, jnp.zeros(len(idx)), w, idx


def log_weight_hessian(saddle, l, *, phi, L, T, gamma, eta):
    """H of layer l: the path mean of d^2 l / dy dy at y = 0, l(y) = y . O(x*) - ln det(1 - dF/dx), over the duals
    of layer l in the order of ``Layout`` (Phi, G, A, B of layer l; M when l = L), the response duals being the
    anti-causal couplings (A[l](t, s) <-> z(s) reading phi(h(t)); B[l](t, s) <-> h(s) reading g(t)).
    Returns (H, indices into eps)."""
    ell, y0, w, idx = _log_weight(saddle, l, phi=phi, L=L, T=T, gamma=gamma, eta=eta)
    return jax.vmap(jax.hessian(ell), in_axes=(None, 0))(y0, w).mean(0), idx


def log_weight_gradient(saddle, l, *, phi, L, T, gamma, eta):
    """dl/dy at y = 0 per path, (S, duals of layer l): equal to the observables O (tested)."""
    ell, y0, w, _ = _log_weight(saddle, l, phi=phi, L=L, T=T, gamma=gamma, eta=eta)
    return jax.vmap(jax.grad(ell), in_axes=(None, 0))(y0, w)


def dual_indices(lay: Layout, l: int) -> np.ndarray:
    """Positions in eps of layer l's duals, in the order of :func:`log_weight_hessian`."""
    nt, ns = len(lay.tri), len(lay.stri)
    idx = list(range(lay.offset(l, "Phi"), lay.offset(l, "Phi") + 3 * nt + ns))
    if l == lay.L:
        idx += list(range(lay.offset(lay.L, "M"), lay.offset(lay.L, "M") + lay.T))
    return np.array(idx)


def propagator(*, phi=jnp.tanh, L=2, T=3, gamma=1.0, eta=0.2, y=1.0, paths=20000, groups=4, seed=0,
               second_order=True):
    """N Var of Delta, K, Phi[l](t, t), G[l](t, t) of the standard deep network: dict name -> (mean over groups
    (T,), standard error (T,)).  Each group marches its own pseudo-random paths.  ``second_order=False`` drops H
    (the independent-neurons picture, which is not the deep propagator)."""
    lay = Layout(L, T)
    kw = dict(phi=phi, L=L, T=T, gamma=gamma, eta=eta, y=y)
    jac = jax.jit(jax.jacfwd(lambda e, a, b: march(e, a, b, **kw)))
    full = jax.jit(lambda e, a, b: march(e, a, b, keep=True, **kw))
    hess = [jax.jit(lambda sd, l=l: log_weight_hessian(sd, l, phi=phi, L=L, T=T, gamma=gamma, eta=eta)[0])
            for l in range(1, L + 1)]
    values = []
    for g in range(groups):
        ku, kr = jax.random.split(jax.random.PRNGKey(seed + g))
        xiu, xir = jax.random.normal(ku, (L, T, paths)), jax.random.normal(kr, (L, T, paths))
        e0 = jnp.zeros(lay.n)
        J = jac(e0, xiu, xir)
        _, O, sd = full(e0, xiu, xir)
        Oc = O - O.mean(1, keepdims=True)
        Kd = Oc @ Oc.T / paths
        if second_order:
            for l in range(1, L + 1):
                ix = dual_indices(lay, l)
                Kd = Kd.at[ix[:, None], ix[None, :]].add(hess[l - 1](sd))
        values.append(np.diagonal(np.asarray(J @ Kd @ J.T)))
    values = np.array(values)
    mean, se = values.mean(0), values.std(0, ddof=1) / np.sqrt(groups)
    names = ["Delta", "K"] + [f"Phi[{l}]" for l in range(1, L + 1)] + [f"G[{l}]" for l in range(1, L + 1)]
    return {nm: (mean[k * T:(k + 1) * T], se[k * T:(k + 1) * T]) for k, nm in enumerate(names)}

