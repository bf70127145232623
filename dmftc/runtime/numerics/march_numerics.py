"""The numerics shared by the deep march and the site march (:mod:`dmftc.runtime.march.deep_dmft`,
:mod:`dmftc.runtime.march.site_march`): pivot tolerances of the causal Cholesky factors, row extension of a factor,
history-buffer updates, symmetric kernels from causal rows, the pseudo-random standard normals of a march's
sample groups, and the array module of host-or-traced helpers."""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular

__all__ = ["PIVOT_TOL", "PIVOT_TOL_EXACT", "MEMORY_BUDGET", "array_module", "at_index", "extend_cholesky",
           "group_normals", "set_col", "set_index", "traced", "symmetric"]

# Residual variance below this fraction of K(t,t) counts as zero.  (tanh, L=2, T=40: 1e-6 and 1e-10 agree
# to 1e-4 relative; at 1e-13 the cancellation in K(t,t) - |x|^2 starts to amplify round-off.)
PIVOT_TOL = 1e-10
# On the exact backend the kernels carry no sampling noise: only round-off (~1e-16 K(t,t)) counts as zero there.
# (Linear L = 2, T = 6: with 1e-10 a true residual of ~1e-10 K(t,t) was dropped and the saddle's stationarity
# fell to 5e-10; with 1e-14 it equals the numpy coefficient-row march to 1e-14.)
PIVOT_TOL_EXACT = 1e-14
MEMORY_BUDGET = 2.5e8     # floats of tangent storage per group (2 GB in float64)


def array_module(*xs):
    """numpy when every argument is a host value, jax.numpy when one is a JAX array or tracer: helpers that serve
    traced code and the host alike stay numpy on the host (in JAX each eager operation on a new shape would be a
    compiled program of its own)."""
    return jnp if any(isinstance(x, jax.Array) for x in xs) else np


def at_index(x, t, axis: int = 0):
    """``x[t]`` along ``axis`` for a step t in range (traced or not), as one dynamic slice.  Equal to NumPy-style
    indexing, which also checks and wraps negative indices: several operations per read to trace, and the march
    reads hundreds of values at t."""
    return jax.lax.dynamic_index_in_dim(x, t, axis % jnp.ndim(x), keepdims=False)


def set_index(x, v, t, axis: int = 0):
    """``x.at[t].set(v)`` along ``axis`` for a step t in range, as one dynamic update (not a scatter)."""
    axis = axis % x.ndim
    v = jnp.broadcast_to(jnp.asarray(v, x.dtype), x.shape[:axis] + x.shape[axis + 1:])
    return jax.lax.dynamic_update_index_in_dim(x, v, t, axis)


def extend_cholesky(C, krow, t, tol=PIVOT_TOL):
    """Row t of the causal Cholesky factor of a kernel whose row t (entries s <= t) is ``krow``; residual
    variances below ``tol`` K(t,t) are zero pivots."""
    T = C.shape[0]
    idx = jnp.arange(T)
    live = (idx < t) & (jnp.diagonal(C) > 0)
    A = jnp.where(live[:, None], C, 0.0) + jnp.diag(jnp.where(live, 0.0, 1.0))
    x = jnp.where(live, solve_triangular(A, jnp.where(live, krow, 0.0), lower=True), 0.0)
    kt = at_index(krow, t)
    d = kt - x @ x
    live_t = d > tol * jnp.maximum(kt, 0.0)
    piv = jnp.where(live_t, jnp.sqrt(jnp.where(live_t, d, 1.0)), 0.0)     # no infinite slope at a zero pivot
    return set_index(C, x + piv * (idx == t), t)


def set_col(X, v, t):
    """X[:, t] = v (column t = time t of a history buffer), v of any shape with X.shape[0] entries (the march's
    tangents (directions, paths) fill a column of (directions x paths) rows): :func:`set_index` on axis 1."""
    return set_index(X, jnp.reshape(v, X.shape[:1]), t, 1)


def traced(prm: dict) -> dict:
    """Parameter values as the march's traced float64 scalars (arrays: the parameters with point indices of a
    spec on several training points)."""
    return {k: jnp.asarray(v if np.ndim(v) else float(v), dtype=jnp.float64) for k, v in prm.items()}


def symmetric(rows):
    """Symmetric kernel(s) from causal rows (lower triangle, diagonal once)."""
    rows = np.asarray(rows)
    return np.tril(rows) + np.swapaxes(np.tril(rows, -1), -1, -2)


def group_normals(seed: int, group: int, shape: tuple) -> tuple:
    """The standard normals of sample group ``group``: ``jax.random.normal(fold_in(PRNGKey(seed), group), shape)``
    in float64, unstacked along the first axis (a tuple of ``shape[0]`` device arrays).  One compiled program per
    shape, whatever the seed and group (drawn eagerly, the key, the draw and each slice would be programs of
    their own)."""
    return _group_normals(jnp.asarray(seed, jnp.int64), jnp.asarray(group, jnp.int64), tuple(int(n) for n in shape))


@partial(jax.jit, static_argnums=2)
def _group_normals(seed, group, shape):
    xi = jax.random.normal(jax.random.fold_in(jax.random.PRNGKey(seed), group), shape, dtype=jnp.float64)
    return tuple(xi[k] for k in range(shape[0]))
