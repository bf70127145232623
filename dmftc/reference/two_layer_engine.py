"""The two-layer engine (reference): saddle-point march, sensitivities, kappa and the propagator of a two-layer
spec through its two-layer kernels (``fields``, ``observables``, ``tangents_*``, ``past_factors``: the module of
:func:`dmftc.reference.two_layer_kernels.load`, not the generated one), independent of the single-site program
the solver marches (dmftc.runtime.engines.site_engine).  The tests use it as an
oracle: on the same source draws both give the same saddle and propagator to round-off.

For one group of samples: pass 1
marches the single-site process forward once: at each step the fields need only
the past (strict causality), their averages give the order parameters at that
step, and running sums advance.  Pass 2 re-runs the same samples in batches with
the order parameters fixed, propagating tangents (forward-mode field
sensitivities) to get D, and centred observables to get kappa.  The propagator
is Sigma = U^-1 kappa U^-T with U lower triangular in time (forward
substitution).  Proven-linear processes: :mod:`dmftc.reference.two_layer_exact`.
"""
from __future__ import annotations

import itertools

import os
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np

from dmftc.runtime.numerics import kernels as _k
from dmftc.errors import ParameterError
from dmftc.reference.two_layer_kernels import place_sources, single_site, tangent_shape
from dmftc.runtime.numerics.geometry import Geometry
from dmftc.runtime.problem.params import resolve_params
from dmftc.runtime.problem.spec_kernels import module_key


_WORKERS = max(1, min(2, os.cpu_count() or 1))


def _broadcast(d, shapes):
    return {k: jnp.broadcast_to(jnp.asarray(v, dtype=jnp.float64), shapes[k]) for k, v in d.items()}


_JIT_CACHE: dict = {}


def _compiled(kind, mod, geo, T, fn):
    """One jitted function per (module, sizes, steps): sweeps over parameter values reuse it."""
    key = (kind, module_key(mod), tuple(sorted(geo.sz.items())), T)
    if key not in _JIT_CACHE:
        _JIT_CACHE[key] = jax.jit(fn)
    return _JIT_CACHE[key]


def _saddle_march(mod, geo, S, p, sz, T):
    samples = next(iter(S.values())).shape[0]
    eta = p[mod.TIME["step"]]
    R0 = {n: jnp.zeros(geo.shape(n, samples)) for n in mod.SAMPLE_SUMS}
    Rq0 = {n: jnp.zeros(geo.shape(n)) for n in mod.ORDER_SUMS}
    qshape = {n: geo.shape(n) for n, _ in mod.ORDERS}

    def step(carry, t):
        R, Rq = carry
        F = mod.fields(S, R, p, sz)
        O = mod.observables(F, S, p, sz)
        avg = {k: jnp.mean(v, axis=0, keepdims=True) for k, v in O.items()}
        q = _broadcast(mod.saddle(avg, Rq, p, sz), qshape)
        inc = mod.sample_increments(F, q, p, sz)
        R = {k: R[k] + eta * inc[k] for k in R}
        oinc = mod.order_increments(q, p, sz)
        Rq_next = {k: Rq[k] + eta * oinc[k] for k in Rq}
        return (R, Rq_next), (q, Rq, {k: avg[k] for k in avg})

    _, (q, Rq, avg) = jax.lax.scan(step, (R0, Rq0), jnp.arange(T))
    return q, Rq, avg


_SEGMENTS = 8


def _fluctuation_pass(mod, geo, S, q, avg, p, sz, T, w):
    """One batch: centred observables X (T, B, ...) and summed sensitivities dO/dq (T, ..., s); ``w`` (B,) is 1
    on the batch's real rows and 0 on the rows that pad it to the common batch shape (one compilation).

    Causality: at step t only sensitivities to q(s < t) are non-zero, so time is cut
    into segments and during segment k the tangents carry only the source times
    s < end_k (about 9/16 of the work of carrying all T columns throughout).
    """
    eta = p[mod.TIME["step"]]
    B = next(iter(S.values())).shape[0]
    R = {n: jnp.zeros(geo.shape(n, B)) for n in mod.SAMPLE_SUMS}
    Ts = {d: {f"d{n}/d{d}": jnp.zeros(tangent_shape(mod, geo, n, d, B, 0)) for n in mod.SAMPLE_SUMS}
          for d in mod.DRIVERS}
    ends = sorted({-(-(k + 1) * T // _SEGMENTS) for k in range(_SEGMENTS)})
    Xs, Ds, start = [], [], 0

    for end in ends:
        width = end
        Ts = {d: {k: _pad_last(v, width) for k, v in Td.items()} for d, Td in Ts.items()}

        def step(carry, t, width=width):
            R, Ts = carry
            qt = {k: v[t] for k, v in q.items()}
            F = mod.fields(S, R, p, sz)
            O = mod.observables(F, S, p, sz)
            X = {k: _rows(w, O[k] - avg[k][t], B) for k in O}
            onehot = _k.onehot(t, width, mod.RANK)
            Dt, Tn = {}, {}
            for d in mod.DRIVERS:
                tangent = getattr(mod, f"tangents_{d}")
                _, inc, dO = tangent(Ts[d], F, qt, p, sz, onehot)
                Tn[d] = {k: Ts[d][k] + eta * inc[k] for k in Ts[d]}
                for k, v in dO.items():
                    Dt[(k, d)] = jnp.sum(_rows(w, jnp.broadcast_to(v, v.shape[:-1] + (width,)), B), axis=0,
                                         keepdims=True)
            inc = mod.sample_increments(F, qt, p, sz)
            R = {k: R[k] + eta * inc[k] for k in R}
            return (R, Tn), (X, Dt)

        (R, Ts), (X, D) = jax.lax.scan(step, (R, Ts), jnp.arange(start, end))
        Xs.append(X)
        Ds.append({k: _pad_last(v, T) for k, v in D.items()})
        start = end
    X = {k: jnp.concatenate([x[k] for x in Xs]) for k in Xs[0]}
    D = {k: jnp.concatenate([d[k] for d in Ds]) for k in Ds[0]}
    return X, D


def _rows(w, x, B):
    """x with its per-sample rows (leading axis of length B) weighted by w; other arrays unchanged."""
    return x * w.reshape((B,) + (1,) * (x.ndim - 1)) if x.ndim and x.shape[0] == B else x


def _pad_last(x, width):
    """Zero-pad the trailing source-time axis to ``width`` columns."""
    extra = width - x.shape[-1]
    return x if extra == 0 else jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)])


def _pad_rows(x, n):
    """x with its leading (sample) axis zero-padded to n rows."""
    extra = n - x.shape[0]
    return x if extra == 0 else jnp.pad(x, [(0, extra)] + [(0, 0)] * (x.ndim - 1))


def _moments(mod, geo, S, q, avg, p, sz, T, batch):
    """kappa (time-major over observables) and D from one group of samples, in batches."""
    obs = single_site(mod)
    m_obs = sum(geo.size(n) for n in obs)
    run_all = _compiled("fluctuations", mod, geo, T,
                        lambda Sb, q, avg, p, w: _fluctuation_pass(mod, geo, Sb, q, avg, p, geo.sz, T, w))
    samples = next(iter(S.values())).shape[0]
    # equal batches (the last one padded with zero-weight rows), so that one compilation serves them all
    n_batches = -(-samples // batch)
    batch = -(-samples // n_batches)
    starts = range(0, samples, batch)
    batches = [({k: _pad_rows(v[a:a + batch], batch) for k, v in S.items()}, min(batch, samples - a)) for a in starts]
    xtx = np.zeros((T * m_obs, T * m_obs))
    dsum: dict = {}

    def run(item):
        Sb, n = item
        return run_all(Sb, q, avg, p, jnp.asarray(np.arange(batch) < n, dtype=jnp.float64))

    # the first batch on this thread: it compiles the kernel and writes JAX's persistent cache once (two threads
    # compiling and writing the cache at once crashed a CI worker with a segfault inside jax compilation_cache);
    # then two batches in flight: XLA runs each on its own core while Python accumulates
    first = run(batches[0])
    with ThreadPoolExecutor(max_workers=_WORKERS) as pool:
        for (_, Bn), (X, Dt) in zip(batches, itertools.chain([first], pool.map(run, batches[1:]))):
            X = {k: v[:, :Bn] for k, v in X.items()}
            cols = [_k.canonical(X[n], (1,) + tuple(a + 1 for a in mod.STORED_AXES[n])).reshape(T, Bn, -1)
                    for n in obs]
            Xm = np.concatenate(cols, axis=2) if cols else np.zeros((T, Bn, 0))
            Xm = np.transpose(Xm, (1, 0, 2)).reshape(Bn, T * m_obs)
            xtx += Xm.T @ Xm
            for (k, d), v in Dt.items():
                ak = tuple(a + 1 for a in mod.STORED_AXES[k]) + tuple(a + 1 for a in mod.PRIMED_AXES[d])
                c = _k.canonical(np.asarray(v), ak, keep_s=True).reshape(T, geo.size(k), geo.size(d), T)
                dsum[(k, d)] = dsum.get((k, d), 0) + c
    return xtx / (samples - 1), {k: v / samples for k, v in dsum.items()}


def explicit_jacobian(mod, geo, q, Rq, p, sz, T):
    """dC/dq over the whole trajectory as a dense (T*m, T*m) lower-triangular matrix."""
    m = geo.m
    eta = float(p[mod.TIME["step"]])
    U = np.zeros((T, m, T, m))
    coeff = mod.coefficients(p, sz)
    for n, _ in mod.ORDERS:
        o, k = geo.offset[n], geo.size(n)
        c = np.broadcast_to(np.asarray(coeff[n], dtype=float), (k,)) if np.ndim(coeff[n]) == 0 \
            else _k.canonical(np.asarray(coeff[n]), mod.STORED_AXES[n], keep_batch=False).reshape(k)
        for t in range(T):
            U[t, o:o + k, t, o:o + k] += np.diag(c)
    qT = {k: np.asarray(v)[:, 0] for k, v in q.items()}     # time as batch axis
    RqT = {k: np.asarray(v)[:, 0] for k, v in Rq.items()}
    factors = mod.past_factors(qT, RqT, p, sz)
    mask = np.tril(np.ones((T, T)), -1)
    for (row, col, row_axes, dummy_axes, col_axes), (a_t, a_s) in zip(mod.PAST_TERMS, factors):
        full = (T,) + (1,) * (mod.RANK - 1)
        A = _k.canonical(np.broadcast_to(np.asarray(a_t, dtype=float), np.broadcast_shapes(np.shape(a_t), full)),
                         (0,) + row_axes + dummy_axes, keep_batch=False)
        Bm = _k.canonical(np.broadcast_to(np.asarray(a_s, dtype=float), np.broadcast_shapes(np.shape(a_s), full)),
                          (0,) + dummy_axes + col_axes, keep_batch=False)
        A = _expand(A, mod, geo.sz, (0,) + row_axes + dummy_axes).reshape(T, geo.size(row), -1)
        Bm = _expand(Bm, mod, geo.sz, (0,) + dummy_axes + col_axes).reshape(T, -1, geo.size(col))
        block = eta * np.einsum("trd,sdc->trsc", A, Bm) * mask[:, None, :, None]
        ro, co = geo.offset[row], geo.offset[col]
        U[:, ro:ro + geo.size(row), :, co:co + geo.size(col)] += block
    tt = np.arange(T)
    for row, col in getattr(mod, "SAME_TIME", ()):    # d rest_row / d col(t) at the same time (scalars)
        if geo.size(row) != 1 or geo.size(col) != 1:
            raise NotImplementedError(f"the reference engine's same-time partials are for scalar order parameters; "
                                      f"{row} reads {col}: use the site engine (dmftc.runtime.engines.site_engine)")
        def part(x, qt, rt, row=row, col=col):
            return jnp.sum(jnp.asarray(mod.rest({**qt, col: x}, rt, p, sz)[row]))
        qj = {k: jnp.asarray(v) for k, v in q.items()}
        g = jax.vmap(jax.grad(part))(qj[col], qj, {k: jnp.asarray(v) for k, v in Rq.items()})
        U[tt, geo.offset[row], tt, geo.offset[col]] += np.asarray(g, dtype=float).reshape(T)
    return U


def _expand(x, mod, sz, axes):
    """Broadcast singleton index dimensions of a canonical array to their full sizes."""
    dims = [x.shape[0]] + [sz[mod.AXIS_SIZE[mod.AXES[a - 1]]] for a in axes[1:]]
    return np.broadcast_to(x, dims)


def saddle_on_draws(mod, draws, *, dirac_width=0.1, **params):
    """The saddle-point march on given source draws: ``draws[k]`` is a (S, n_k) array for the k-th jointly
    Gaussian source group of the spec (``mod.SOURCES``, in declaration order).  With the S draws of the
    neurons of finite-width networks this is the order-parameter trajectory of a width-S system on exactly
    those neurons: the common-random-number reference for measuring O(1/N) effects.  Returns
    ``{name: (*index dims, T)}``."""
    if len(draws) != len(mod.SOURCES):
        raise ParameterError(f"{mod.MODEL} has {len(mod.SOURCES)} source groups, got {len(draws)} arrays of draws")
    S0 = int(np.shape(draws[0])[0])
    p, sz, T = resolve_params(mod, params, dirac_width=dirac_width)
    geo = Geometry(mod, sz)
    S = place_sources(mod, [jnp.asarray(np.asarray(x, dtype=float).reshape(S0, -1)) for x in draws])
    pj = {k: jnp.asarray(v, dtype=jnp.float64) for k, v in p.items()}
    march = _compiled("saddle", mod, geo, T, lambda S, p: _saddle_march(mod, geo, S, p, geo.sz, T))
    q, _, _ = march(S, pj)
    return {k: np.moveaxis(_k.canonical(np.asarray(q[k]), tuple(a + 1 for a in mod.STORED_AXES[k])), 0, -1)
            for k, _ in mod.ORDERS}


def propagator(U0, kappa_obs, D, geo, T, obs_names=None):
    """Sigma = U^-1 kappa U^-T with U = (explicit Jacobian) - D."""
    U = U0.copy()
    for (k, d), Dk in D.items():
        ko, do = geo.offset[k], geo.offset[d]
        U[:, ko:ko + geo.size(k), :, do:do + geo.size(d)] -= np.transpose(Dk, (0, 1, 3, 2))
    n = T * geo.m
    U = U.reshape(n, n)
    kappa = _embed_kappa(kappa_obs, geo, T)
    sigma, cond = triangular_sandwich(U, kappa)
    return sigma, U, kappa, cond


def triangular_sandwich(U, kappa):
    """(U^-1 kappa U^-T, U's 1-norm condition number) by two dense triangular solves (LAPACK trsm): the oracle of
    the runtime's block solve (:func:`dmftc.runtime.solvers.linalg.sandwich`)."""
    import scipy.linalg as sla

    Y = sla.solve_triangular(U, kappa, lower=True, check_finite=False)
    sigma = sla.solve_triangular(U, Y.T, lower=True, check_finite=False)
    return 0.5 * (sigma + sigma.T), float(np.linalg.cond(U, 1))


def _embed_kappa(kappa_obs, geo, T):
    m = geo.m
    full = np.zeros((T, m, T, m))
    idx = np.concatenate([np.arange(geo.offset[n], geo.offset[n] + geo.size(n)) for n in single_site(geo.mod)]) \
        if single_site(geo.mod) else np.zeros(0, dtype=int)
    k = kappa_obs.reshape(T, len(idx), T, len(idx))
    full[np.ix_(range(T), idx, range(T), idx)] = k
    return full.reshape(T * m, T * m)
