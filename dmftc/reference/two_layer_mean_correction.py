"""The O(1/N) correction to the mean order parameters of a two-layer spec: E[q]_N = q_inf + m1 / N + O(N^-2).

At width N a two-layer network is exactly N independent neurons coupled only through the order parameters:
every order parameter q solves ``C(q) = a_N(q)``, where ``C(q) = coeff q + rest(q)`` is the deterministic part
of its defining equation (the IR's constraint; ``rest`` holds the running sums of order parameters) and
``a_N(q) = (1/N) sum_i O(xi_i; q)`` is the neuron average of the single-site observable (zero for
constraints), each neuron's fields being the spec's causal process driven by the trajectory q.  With
``abar(q) = E_xi O(xi; q)``, the infinite-width point q* solves ``C(q*) = abar(q*)``.  Write
``q = q* + delta``, ``eps(q) = a_N(q) - abar(q)`` and ``U = C'(q*) - abar'(q*)`` (the propagator's U).
Expanding to second order,

    U delta = eps + eps' delta + 1/2 (abar'' - C'')[delta, delta] + O(N^-3/2).

To first order ``delta = U^-1 eps = (1/N) sum_i v(xi_i)`` with the per-neuron direction
``v(xi) = U^-1 (O(xi; q*) - abar)`` (so Sigma = E[v v^T]).  Taking expectations, only equal-neuron terms
survive at O(1/N):

    m1 = U^-1 ( E_xi[ J(xi) v(xi) ] + 1/2 E_{xi, xi'}[ O''(xi')[v(xi), v(xi)] ] - 1/2 E_xi[ C''[v(xi), v(xi)] ] )

where ``J(xi) v`` is the derivative of the neuron's observable trajectory along v (the covariance of the
per-neuron sensitivities with the fluctuation) and ``O''(xi')[v, v]`` the second derivative of an
*independent* neuron's observable along v (``abar''`` contracted with Sigma, estimated without forming it).
Both are forward-mode derivatives of the one causal march of the single-site process (``jax.jvp``, nested
for the second order): no T x T x T tensor is formed; the cost is about four marches per source path.

Per sample group (the same groups as the propagator), the paths give v, the three averages and m1; the group
spread gives the standard error.  The correction assumes the spec's process is the network's exact
discrete-time dynamics (a spec that approximates the network, e.g. by writing the error update to first
order in the step size, carries that approximation into q_inf and m1 alike).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from scipy.linalg import solve_triangular

from dmftc.runtime.numerics import kernels as _k
from dmftc.runtime.problem.spec_kernels import module_key


def _to_flat(mod, geo, arrays, T, B):
    """Uniform-layout arrays ``name -> (T, B, axes..., 1)`` (missing names: zero) -> (B, T * m), time-major."""
    out = np.zeros((B, T, geo.m))
    for n, _ in mod.ORDERS:
        if n not in arrays:
            continue
        x = np.broadcast_to(np.asarray(arrays[n]), (T,) + geo.shape(n, B))
        c = _k.canonical(np.moveaxis(x, 0, 1), (1,) + tuple(a + 1 for a in mod.STORED_AXES[n]))
        out[:, :, geo.offset[n]:geo.offset[n] + geo.size(n)] = c.reshape(B, T, geo.size(n))
    return out.reshape(B, T * geo.m)


def _from_flat(mod, geo, flat, T):
    """(B, T * m) time-major -> uniform-layout arrays ``name -> (T, B, axes..., 1)`` of every order parameter."""
    B = flat.shape[0]
    x = flat.reshape(B, T, geo.m)
    out = {}
    for n, _ in mod.ORDERS:
        stored = mod.STORED_AXES[n]
        dims = [geo.sz[mod.AXIS_SIZE[mod.AXES[a - 1]]] for a in stored]
        block = x[:, :, geo.offset[n]:geo.offset[n] + geo.size(n)].reshape([B, T] + dims)
        order = np.argsort(stored)                         # stored axes in ascending axis order
        block = np.transpose(block, [0, 1] + [2 + int(i) for i in order])
        shape = [B, T] + [geo.sz[mod.AXIS_SIZE[a]] if (i + 1) in stored else 1 for i, a in enumerate(mod.AXES)] + [1]
        out[n] = jnp.asarray(np.moveaxis(block.reshape(shape), 0, 1))      # (T, B, axes..., 1)
    return out


def _march(mod, geo, sz, T):
    """Observable trajectories of a batch of neurons driven by per-neuron order-parameter trajectories."""

    def run(S, q, p):
        eta = p[mod.TIME["step"]]
        B = next(iter(S.values())).shape[0]
        R0 = {n: jnp.zeros(geo.shape(n, B)) for n in mod.SAMPLE_SUMS}

        def step(R, t):
            F = mod.fields(S, R, p, sz)
            O = mod.observables(F, S, p, sz)
            qt = {k: v[t] for k, v in q.items()}
            inc = mod.sample_increments(F, qt, p, sz)
            return {k: R[k] + eta * inc[k] for k in R}, O

        return jax.lax.scan(step, R0, jnp.arange(T))[1]
    return run


def _constraint(mod, sz):
    """C(q) = coeff q + rest(q) over a trajectory (time leading, then the uniform layout)."""

    def C(q, p):
        eta = p[mod.TIME["step"]]
        coeff = mod.coefficients(p, sz)
        inc = jax.vmap(lambda qt: mod.order_increments(qt, p, sz))(q)
        Rq = {k: eta * (jnp.cumsum(v, axis=0) - v) for k, v in inc.items()}        # sum over s < t
        def rest_t(qt, r):                           # reads q(t) and Rq(t); shaped like q(t)
            out = mod.rest(qt, r, p, sz)
            return {k: jnp.zeros_like(qt[k]) + out[k] for k in qt}
        rest = jax.vmap(rest_t)(q, Rq)
        return {k: coeff[k] * q[k] + rest[k] for k in q}
    return C


_KERNELS: dict = {}


def _kernels(mod, geo, sz, T):
    """Jitted march, its first and second directional derivatives, and C's second derivative, once per
    (module, sizes, steps)."""
    key = (module_key(mod), tuple(sorted(sz.items())), T)
    if key not in _KERNELS:
        run, C = _march(mod, geo, sz, T), _constraint(mod, sz)
        first = jax.jit(lambda S, q, v, p: jax.jvp(lambda x: run(S, x, p), (q,), (v,))[1])
        second = jax.jit(lambda S, q, w, p: jax.jvp(lambda x: jax.jvp(lambda y: run(S, y, p), (x,), (w,))[1],
                                                    (q,), (w,))[1])
        c2 = jax.jit(lambda q, w, p: jax.jvp(lambda x: jax.jvp(lambda y: C(y, p), (x,), (w,))[1], (q,), (w,))[1])
        _KERNELS[key] = (jax.jit(run), first, second, c2)
    return _KERNELS[key]


def mean_correction_group(mod, geo, S, q, U, p, sz, T, batch: int = 2048):
    """m1 (time-major, T * m) from one group of source paths ``S`` at its saddle point ``q`` (uniform layout,
    (T, 1, axes..., 1)) and its U (T * m square, lower triangular)."""
    pj = {k: jnp.asarray(v, dtype=jnp.float64) for k, v in p.items()}
    run, first, second, c2 = _kernels(mod, geo, sz, T)
    n = next(iter(S.values())).shape[0]
    qj = {k: jnp.asarray(v) for k, v in q.items()}
    # equal batches, the last one zero-padded and its padding rows dropped: one compilation serves them all
    batch = -(-n // -(-n // batch))
    starts = range(0, n, batch)
    pad = lambda x: x if x.shape[0] == batch else np.concatenate(                     # noqa: E731
        [x, np.zeros((batch - x.shape[0],) + x.shape[1:])])
    rows = lambda a: {k: jnp.asarray(pad(np.asarray(v[a:a + batch]))) for k, v in S.items()}  # noqa: E731
    qb = {k: jnp.broadcast_to(v, (T, batch) + v.shape[2:]) for k, v in qj.items()}

    # pass 1: centred observables of every path -> directions v = U^-1 X
    X = np.concatenate([_to_flat(mod, geo, run(rows(a), qb, pj), T, batch)[:min(batch, n - a)] for a in starts])
    X -= X.mean(axis=0)
    V = solve_triangular(U, X.T, lower=True, check_finite=False).T            # (n, T * m)
    Vpair = np.roll(V, 1, axis=0)                                               # an independent path's direction

    total = np.zeros(V.shape[1])
    for a in starts:
        Sb, B = rows(a), min(batch, n - a)
        v = _from_flat(mod, geo, pad(V[a:a + B]), T)
        w = _from_flat(mod, geo, pad(Vpair[a:a + B]), T)
        jv = _to_flat(mod, geo, first(Sb, qb, v, pj), T, batch)[:B]
        ow = _to_flat(mod, geo, second(Sb, qb, w, pj), T, batch)[:B]
        cv = _to_flat(mod, geo, c2(qb, v, pj), T, batch)[:B]
        total += (jv + 0.5 * ow - 0.5 * cv).sum(axis=0)
    return solve_triangular(U, total / n, lower=True, check_finite=False)
