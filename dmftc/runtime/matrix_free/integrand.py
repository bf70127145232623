"""One path's log-integrand ln F of a deep layer's single-site problem, from the spec's own program.

ln F(v; w) = hats . f(x) - ln det(I - J(x)),   x = w + K y(x),   J = K dy/dx,

with (C, E, hats) = theta(v) of :func:`dmftc.runtime.sensitivities.local_estimator.local_couplings`, the outputs y and the
features f evaluated by :class:`dmftc.runtime.sensitivities.site_local.LocalMap` (the generated ``site_*`` functions), and
x reproduced from the march's field x0 by two differentiable Newton steps whose linear solves and ln det are
Neumann series around the causal resolvent R0 = (I - J(x0))^-1 truncated after third order: exact for every
derivative of order <= 3 at a causal base point (the argument of :mod:`dmftc.runtime.sensitivities.local_estimator`).  It is
the integrand whose derivatives :mod:`dmftc.runtime.sensitivities.site_moments` sums in closed form; here JAX differentiates
it along directions instead (:mod:`dmftc.runtime.matrix_free.products`).

Cost of one evaluation: dense (n x n) matrix products, n = nx T, i.e. O(T^3) per path.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dmftc.runtime.sensitivities.local_estimator import local_couplings
from dmftc.runtime.sensitivities.site_local import LocalMap
from dmftc.runtime.sensitivities.site_moments import nilpotent_inverse

__all__ = ["coupling_matrix", "log_integrand"]

ORDER = 3           # Neumann order of the perturbed solves and ln det (exact through third derivatives)
NEWTON = 2          # Newton steps from the march's field (x2 - x* = O(eps^4))


def coupling_matrix(lm: LocalMap, C, E, T):
    """K (nx T, ny T): the block K_c of each coupling kind c = (x-field i, output o) at (i, o)."""
    K = jnp.zeros((lm.nx * T, lm.ny * T))
    for (_, i, o), Kk in zip(lm.kinds, (C, E)):
        K = K.at[i * T:(i + 1) * T, o * T:(o + 1) * T].set(Kk)
    return K


def _system(lm: LocalMap, K, w, x, T, CV=None):
    """(residual x - w - K y(x), J = K dy/dx) of the single-site equations at x; ``CV`` (T, nc): the one-time
    coefficients at each step (None without any)."""
    X = x.reshape(lm.nx, T).T                                         # (T, nx)
    CV = jnp.zeros((T, 0)) if CV is None else CV
    y = jax.vmap(lambda xv, cv: lm.outputs_at(xv, cv if cv.shape[0] else None))(X, CV)              # (T, ny)
    Y1 = jax.vmap(jax.jacfwd(lambda xv, cv: lm.outputs_at(xv, cv if cv.shape[0] else None)))(X, CV)  # (T, ny, nx)
    Y1m = jnp.einsum("tki,ts->ktis", Y1, jnp.eye(T)).reshape(lm.ny * T, lm.nx * T)
    return x - w - K @ y.T.reshape(-1), K @ Y1m


def _features(lm: LocalMap, x, T, fa, fb, CV=None):
    """f(x): each kernel's entries -a(t) b(s) (t >= s), then the readout fa (r - r(0)) + (fa + fb) r(0)."""
    CV = jnp.zeros((T, 0)) if CV is None else CV
    a, b, r = jax.vmap(lambda xv, cv: lm.features_at(xv, cv if cv.shape[0] else None))(
        x.reshape(lm.nx, T).T, CV)                                    # (T, nk), (T, nk), (T,)
    t0, t1 = np.tril_indices(T)
    kern = [-(a[t0, k] * b[t1, k]) for k in range(len(lm.kernels))]
    return jnp.concatenate(kern + [fa * (r - r[0]) + (fa + fb) * r[0]])


def log_integrand(lm: LocalMap, model, v, w, x0, *, T, fa, fb):
    """ln F of one path (module doc): v the layer's local variables (deep_action.log_z_local order), w the
    sources (nx T,), x0 the march's fields (nx T,), (fa, fb) the readout coefficients (0 below the last layer)."""
    C, E, hats = local_couplings(v, T, model)
    K = coupling_matrix(lm, C, E, T)
    CV = model.one_time_rows(T)
    J0 = jax.lax.stop_gradient(_system(lm, K, w, x0, T, CV)[1])
    R0 = nilpotent_inverse(J0)

    def solve(Jm, r):                                  # (I - Jm)^-1 r through O(|Jm - J0|^ORDER)
        M = R0 @ (Jm - J0)
        y = R0 @ r
        out = y
        for _ in range(ORDER):
            y = M @ y
            out = out + y
        return out

    x = x0
    for _ in range(NEWTON):
        res, Jm = _system(lm, K, w, x, T, CV)
        x = x - solve(Jm, res)
    M = R0 @ (_system(lm, K, w, x, T, CV)[1] - J0)
    logdet, Mk = 0.0, jnp.eye(M.shape[0])
    for k in range(1, ORDER + 1):
        Mk = Mk @ M
        logdet = logdet - jnp.trace(Mk) / k
    return hats @ _features(lm, x, T, fa, fb, CV) - logdet
