"""Runtime: saddle-point march, sensitivities, kappa and the propagator for a generated module.

Monte Carlo backend, for each of G independent groups of samples: pass 1
marches the single-site process forward once: at each step the fields need only
the past (strict causality), their averages give the order parameters at that
step, and running sums advance.  Pass 2 re-runs the same samples in batches with
the order parameters fixed, propagating tangents (forward-mode field
sensitivities) to get D, and centred observables to get kappa.  The propagator
is Sigma = U^-1 kappa U^-T with U lower triangular in time (forward
substitution); group results are averaged and their spread gives standard
errors.  Proven-linear processes use the exact backend (:mod:`dmftc.runtime.exact`).
"""
from __future__ import annotations

import itertools

import os
import time as _time
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np

from dmftc.runtime import kernels as _k
from dmftc.errors import NumericalError, ParameterError
from dmftc.runtime.exact import exact_moments
from dmftc.runtime.geometry import Geometry, place_sources, source_factors, tangent_shape
from dmftc.runtime.linalg import causal_sandwich
from dmftc.runtime.mean_correction import mean_correction_group
from dmftc.runtime.params import resolve_params
from dmftc.runtime.sampling import block_normals, check_sampler


_WORKERS = max(1, min(2, os.cpu_count() or 1))
_MEMORY_BUDGET = 1.0e8  # floats per batch of tangents (~1.6 GB in float64)


def _sample_sources(mod, p, sz, samples, seed, sampler="random", edges=None):
    """Source draws of every sample: 'random', JAX normals (one stream per source group); 'sobol', randomised QMC
    with an independent scrambled set per sample group rows edges[g]:edges[g+1] (:mod:`dmftc.runtime.sampling`)."""
    factors = source_factors(mod, p, sz)
    if check_sampler(sampler) == "sobol":
        zs = block_normals(seed, [L.shape[0] for L in factors], edges)
        return place_sources(mod, [jnp.asarray(z) @ jnp.asarray(L.T) for z, L in zip(zs, factors)])
    key = jax.random.PRNGKey(seed)
    xs = [jax.random.normal(jax.random.fold_in(key, gi), (samples, L.shape[0]), dtype=jnp.float64)
          @ jnp.asarray(L.T) for gi, L in enumerate(factors)]
    return place_sources(mod, xs)


def _broadcast(d, shapes):
    return {k: jnp.broadcast_to(jnp.asarray(v, dtype=jnp.float64), shapes[k]) for k, v in d.items()}


_JIT_CACHE: dict = {}


def _compiled(kind, mod, geo, T, fn):
    """One jitted function per (module, sizes, steps): sweeps over parameter values reuse it."""
    key = (kind, id(mod), tuple(sorted(geo.sz.items())), T)
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
    obs = geo.single_site
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


def solve_module(mod, *, samples=20000, seed=0, batch=None, groups=8, dirac_width=0.1, backend="auto",
                 progress=False, correction=False, sampler=None, **kwargs):
    """Solve the saddle point and the propagator of a generated module; returns a Solution.

    ``correction``: also compute the O(1/N) correction m1 to the mean (:mod:`dmftc.runtime.mean_correction`),
    from the same source paths and groups (the exact backend draws ``samples`` paths for it).

    ``backend``: "mc" (Monte Carlo over the single-site process), "exact" (Gaussian
    moments, only for processes proven linear) or "auto" (exact when proven).
    ``progress``: draw a progress bar on stderr (saddle march, moments, propagator per group).
    """
    from dmftc.progress import Progress
    from dmftc.runtime.blocks import DenseBlocks
    from dmftc.runtime.solution import Solution

    sampler = "random" if sampler is None else sampler
    if backend == "exact" and mod.NONLINEAR is not None:
        raise ParameterError(f"the exact backend needs a Gaussian single-site process, but {mod.NONLINEAR}")
    exact = backend == "exact" or (backend == "auto" and mod.NONLINEAR is None)
    p, sz, T = resolve_params(mod, kwargs, dirac_width=dirac_width)
    geo = Geometry(mod, sz)
    timings = {}
    t0 = _time.perf_counter()
    if exact:
        bar = Progress(f"{mod.MODEL} exact", 2, enabled=progress)
        n_paths, seed_used = samples, seed
        q, Rq, kappa_obs, D = exact_moments(mod, geo, p, sz, T)
        bar.advance(note="moments")
        q = {k: np.asarray(v) for k, v in q.items()}
        _check_finite(mod, geo, q, "saddle-point march")
        timings["exact moments"] = _time.perf_counter() - t0
        t0 = _time.perf_counter()
        U0 = explicit_jacobian(mod, geo, q, {k: np.asarray(v) for k, v in Rq.items()}, p, sz, T)
        sigma, U, kappa, cond = propagator(U0, kappa_obs, D, geo, T)
        timings["propagator"] = _time.perf_counter() - t0
        bar.advance(note="propagator")
        bar.close()
        var_se = np.zeros(len(sigma))     # no sampling error
        if correction:
            t0 = _time.perf_counter()
            G = max(1, min(groups, samples // 2))
            edges = np.linspace(0, samples, G + 1).astype(int)
            S = _sample_sources(mod, p, sz, samples, seed, sampler, edges)
            m1 = [mean_correction_group(mod, geo, {k: v[a:b] for k, v in S.items()}, q, U, p, sz, T)
                  for a, b in zip(edges[:-1], edges[1:])]
            timings["mean correction"] = _time.perf_counter() - t0
        samples = seed = batch = None
    else:
        # Independent groups, each a complete pipeline (its own saddle point, kappa, D, propagator):
        # the spread of the group results is an honest Monte Carlo error, including that of q itself.
        G = max(1, min(groups, samples // 2))
        edges = np.linspace(0, samples, G + 1).astype(int)
        S = _sample_sources(mod, p, sz, samples, seed, sampler, edges)
        pj = {k: jnp.asarray(v, dtype=jnp.float64) for k, v in p.items()}
        march = _compiled("saddle", mod, geo, T, lambda S, p: _saddle_march(mod, geo, S, p, geo.sz, T))
        if batch is None:
            per_sample = max(1, T * geo.m * max(1, len(mod.DRIVERS)) * max(1, len(mod.SAMPLE_SUMS)) * T)
            batch = int(max(1, _MEMORY_BUDGET // per_sample))
        batch = max(1, min(batch, int(np.diff(edges).max())))
        results, m1, kink_shift, chatter = [], [], None, None
        timings.update(saddle=0.0, moments=0.0, propagator=0.0)
        if correction:
            timings["mean correction"] = 0.0
        bar = Progress(f"{mod.MODEL} mc", 3 * G, enabled=progress)
        for g, (a, b) in enumerate(zip(edges[:-1], edges[1:])):
            t0 = _time.perf_counter()
            Sg = {k: v[a:b] for k, v in S.items()}
            q, Rq, avg = march(Sg, pj)
            q = {k: np.asarray(v) for k, v in q.items()}
            _check_finite(mod, geo, q, "saddle-point march")
            bar.advance(note=f"group {g + 1}/{G}: saddle march")
            t1 = _time.perf_counter()
            kappa_obs, D = _moments(mod, geo, Sg, {k: jnp.asarray(v) for k, v in q.items()}, avg, pj, sz, T, batch)
            t2 = _time.perf_counter()
            bar.advance(note=f"group {g + 1}/{G}: kappa and D")
            U0 = explicit_jacobian(mod, geo, q, {k: np.asarray(v) for k, v in Rq.items()}, p, sz, T)
            results.append((q, *propagator(U0, kappa_obs, D, geo, T)))
            if g == 0 and mod.SINGULAR and p["dirac width"] > 0:
                # kink check: the same group's propagator with the delta functions at half the width
                ph = {**pj, "dirac width": jnp.asarray(p["dirac width"] / 2, dtype=jnp.float64)}
                _, Dh = _moments(mod, geo, Sg, {k: jnp.asarray(v) for k, v in q.items()}, avg, ph, sz, T, batch)
                half = propagator(U0, kappa_obs, Dh, geo, T)[0]
                kink_shift = np.diag(half) - np.diag(results[-1][1])
                chatter = _kink_crossings(mod, geo, Sg, q, pj, sz, T)
            bar.advance(note=f"group {g + 1}/{G}: propagator")
            timings["saddle"] += t1 - t0
            timings["moments"] += t2 - t1
            timings["propagator"] += _time.perf_counter() - t2
            if correction:
                t3 = _time.perf_counter()
                m1.append(mean_correction_group(mod, geo, Sg, q, results[-1][2], p, sz, T))
                timings["mean correction"] += _time.perf_counter() - t3
        bar.close()
        q = {k: np.mean([r[0][k] for r in results], axis=0) for k in results[0][0]}
        sigma, U, kappa = (np.mean([r[i] for r in results], axis=0) for i in (1, 2, 3))
        cond = max(r[4] for r in results)
        var_se = np.std([np.diag(r[1]) for r in results], axis=0, ddof=1) / np.sqrt(G) if G > 1 else None
    canonical = lambda q: {k: np.moveaxis(_k.canonical(q[k], tuple(a + 1 for a in mod.STORED_AXES[k])), 0, -1)  # noqa: E731
                           for k, _ in mod.ORDERS}
    means = canonical(q)
    mean_se = None
    if not exact and sampler == "sobol" and G > 1:     # randomised QMC: the groups' spread, not sqrt(var / samples)
        spread = canonical({k: np.std([r[0][k] for r in results], axis=0, ddof=1) / np.sqrt(G) for k in q})
        mean_se = np.zeros((T, geo.m))
        for k, v in spread.items():
            n = int(np.prod(geo.comp_shape[k], dtype=int))
            mean_se[:, geo.offset[k]:geo.offset[k] + n] = v.reshape(n, T).T
    _check_variances(np.diag(sigma), var_se, geo, T)
    diagnostics = {"u_condition": cond, "backend": "exact" if exact else "mc", "sampler": None if exact else sampler}
    if not exact and kink_shift is not None:
        diagnostics["kink"] = _kink_report(kink_shift, var_se, np.diag(sigma), p["dirac width"], chatter)
    blocks = DenseBlocks(T, geo.comp_shape, geo.offset, geo.m, sigma, var_se, kappa, U)
    per_name = lambda flat: None if flat is None else {k: blocks.flat(np.ravel(flat), k) for k in means}  # noqa: E731
    info = {"samples": samples, "seed": seed, "batch": batch, "timings": dict(timings),
            "diagnostics": dict(diagnostics), "spec_sha256": mod.SPEC_SHA256, "dmftc_version": mod.DMFTC_VERSION,
            "singular": mod.SINGULAR, "dirac_width": float(p.get("dirac width", 0.0))}
    m1_mean = m1_se = None
    if correction:
        m1 = np.asarray(m1)
        m1_mean, m1_se = m1.mean(axis=0), (m1.std(axis=0, ddof=1) / np.sqrt(len(m1)) if len(m1) > 1 else None)
    sol = Solution(mod.MODEL, dict(p), float(p[mod.TIME["step"]]) * np.arange(T), means, blocks, info,
                   mean_se=per_name(mean_se), m1=per_name(m1_mean), m1_se=per_name(m1_se))
    if correction:
        sol.info["mean_correction"] = {"groups": len(m1), "paths": int(n_paths if exact else samples),
                                       "seed": int(seed_used if exact else seed)}
        if mod.SINGULAR:
            sol.info["mean_correction"]["approximation"] = (
                f"the activation is not smooth ({', '.join(mod.SINGULAR)} in the sensitivities): the forward-mode "
                "derivatives of the march behind m1 miss the delta-function terms at its kinks, so m1 carries a "
                "bias that is not estimated")
    return sol


_CHATTER_WARN = 0.01      # warn when more than this fraction of the paths chatter across a kink


def _kink_crossings(mod, geo, S, q, p, sz, T):
    """Per kink field (``KINK_FIELDS``: fields at whose zero the activation has a kink), the fraction of the
    paths and components whose field changes sign at least 3 times along the trajectory: neurons that chatter
    across the kink, pushed over it by one point and back by another at every step or two.  The sensitivities
    through them are where the delta-function approximation is least reliable (README, 'What to expect for
    relu')."""
    names = tuple(getattr(mod, "KINK_FIELDS", ()))
    if not names:
        return None

    def sides(S, q, p):
        eta = p[mod.TIME["step"]]
        B = next(iter(S.values())).shape[0]
        R0 = {n: jnp.zeros(geo.shape(n, B)) for n in mod.SAMPLE_SUMS}

        def step(R, t):
            qt = {k: v[t] for k, v in q.items()}
            F = mod.fields(S, R, p, sz)
            inc = mod.sample_increments(F, qt, p, sz)
            return {k: R[k] + eta * inc[k] for k in R}, {n: F[n] > 0 for n in names}

        return jax.lax.scan(step, R0, jnp.arange(T))[1]

    side = _compiled("crossings", mod, geo, T, sides)(S, {k: jnp.asarray(v) for k, v in q.items()}, p)
    return {n: float(np.mean(np.sum(np.asarray(side[n][1:] != side[n][:-1]), axis=0) >= 3)) for n in names}


def _kink_report(shift, var_se, var, width, chatter=None):
    """How far the equal-time variances move when the delta functions of a non-smooth activation are halved
    in width (one sample group, same paths), against the Monte Carlo standard error of the result; and how
    many paths chatter across the kink (:func:`_kink_crossings`)."""
    se = var_se if var_se is not None else np.zeros_like(var)
    floor = 1e-3 * max(float(np.abs(var).max()), 1e-300)
    ratio = np.abs(shift) / np.maximum(se, floor)
    worst = float(ratio.max())
    text = ("non-smooth activation: the delta functions of its derivatives are Gaussians of width "
            f"{width:g}; halving the width moves N Var by up to "
            f"{float(np.abs(shift).max() / max(float(np.abs(var).max()), 1e-300)):.1%} of the "
            f"peak, {worst:.2g} times the Monte Carlo standard error" +
            (" (the approximation's bias may exceed the error bar)" if worst > 1 else ""))
    most = max(chatter.values()) if chatter else 0.0
    if most > _CHATTER_WARN:
        text += (f"; {most:.1%} of the paths cross the kink of {max(chatter, key=chatter.get)} 3 or more times "
                 "(chattering neurons: the sensitivities through them are approximate; in such cases N Var K "
                 "was measured 5-26% of its peak off networks, several times the shift at half width, which "
                 "is then a lower bound on the bias, not an estimate; issue 13)")
    return {"dirac_width": float(width), "shift_at_half_width_max": float(np.abs(shift).max()),
            "shift_rel_to_peak": float(np.abs(shift).max() / max(float(np.abs(var).max()), 1e-300)),
            "shift_vs_se": worst, "chattering": chatter or {},
            "exceeds_error_bar": bool(worst > 1.0 or most > _CHATTER_WARN), "approximation": text}


def propagator(U0, kappa_obs, D, geo, T, obs_names=None):
    """Sigma = U^-1 kappa U^-T with U = (explicit Jacobian) - D."""
    U = U0.copy()
    for (k, d), Dk in D.items():
        ko, do = geo.offset[k], geo.offset[d]
        U[:, ko:ko + geo.size(k), :, do:do + geo.size(d)] -= np.transpose(Dk, (0, 1, 3, 2))
    n = T * geo.m
    U = U.reshape(n, n)
    kappa = _embed_kappa(kappa_obs, geo, T)
    sigma, cond = causal_sandwich(U, kappa)
    return sigma, U, kappa, cond


def _embed_kappa(kappa_obs, geo, T):
    m = geo.m
    full = np.zeros((T, m, T, m))
    idx = np.concatenate([np.arange(geo.offset[n], geo.offset[n] + geo.size(n)) for n in geo.single_site]) \
        if geo.single_site else np.zeros(0, dtype=int)
    k = kappa_obs.reshape(T, len(idx), T, len(idx))
    full[np.ix_(range(T), idx, range(T), idx)] = k
    return full.reshape(T * m, T * m)


def _check_variances(var, var_se, geo, T):
    """A negative variance beyond Monte Carlo error means the propagator cannot be trusted."""
    scale = max(float(np.abs(var).max()), 1e-300)
    slack = 4 * var_se if var_se is not None else 0.0
    bad = var < -(slack + 1e-9 * scale)
    if bad.any():
        i = int(np.argmax(bad))
        t, c = divmod(i, geo.m)
        name = max((n for n in geo.offset if geo.offset[n] <= c), key=lambda n: geo.offset[n])
        raise NumericalError(f"negative variance N Var({name}) = {var[i]:.3g} at step {t}, beyond 4 Monte Carlo "
                             "standard errors: the propagator is not positive; increase samples or check the spec")


def _check_finite(mod, geo, arrays, stage, flat=False):
    for name, v in arrays.items():
        v = np.asarray(v)
        bad = ~np.isfinite(v)
        if bad.any():
            if flat:
                raise NumericalError(f"non-finite values in {name} during the {stage}")
            first = int(np.argmax(bad.reshape(v.shape[0], -1).any(axis=1)))
            raise NumericalError(
                f"{name} became non-finite at step {first} (t = {first} * eta) during the {stage}; "
                "the dynamics diverge: reduce the step size or the feature-learning strength")
