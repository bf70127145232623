"""Solve a two-layer spec: sample groups of source paths, the site engine on each, diagnostics -> Solution.

Monte Carlo backend: the ``samples`` source draws are cut into G independent groups, each a complete pipeline
(its own saddle, sensitivities, kappa and propagator, :mod:`dmftc.runtime.engines.site_engine`), so that the spread of
the group results is an honest standard error, that of the saddle included.  A non-smooth activation's delta
functions are Gaussians of the solve's ``dirac width``; the first group's propagator is recomputed at half that
width and the paths that chatter across the kink are counted (:func:`kink_report`).  A process proven linear
(``mod.NONLINEAR`` None) uses the exact backend (:func:`dmftc.runtime.engines.site_engine.two_layer_exact`).  The O(1/N)
correction to the mean uses the same groups' paths (the exact backend draws ``samples`` paths for it).
Each group's kappa and propagator (NumPy's BLAS) run on a second thread while the next marches run (JAX): the
stages overlap, so ``info['timings']`` (seconds per stage, summed over the groups) may add up to more than the
solve's wall time.

The engine works in the solved form of the constraints (U = 1 - dF/dq, kappa = Cov(Y)); the solution keeps
the spec's own form, ``coeff q + rest = <O>`` (U with the coefficients on its diagonal, kappa = Cov(O)), the
paper's kappa and D when the coefficients are 1.
"""
from __future__ import annotations

import time as _time
from concurrent.futures import ThreadPoolExecutor

import jax.numpy as jnp
import numpy as np

from dmftc.errors import NumericalError, ParameterError
from dmftc.runtime.numerics import kernels as _k
from dmftc.runtime.engines.cubature import auto_prefers_cubature, two_layer_cubature
from dmftc.runtime.numerics.devices import describe, path_mesh, place_paths, rows_for
from dmftc.runtime.numerics.geometry import Geometry, source_factors
from dmftc.runtime.problem.params import resolve_params
from dmftc.runtime.numerics.sampling import block_normals, check_sampler
from dmftc.runtime.numerics.march_numerics import group_normals
from dmftc.runtime.sensitivities.site_drivers import pad_rows, path_batch
from dmftc.runtime.engines.site_engine import (centred, check_finite, group_saddle, group_sensitivities, identity_minus,
                                       layout_arrays, normals_of, paths_at, propagate, require_program,
                                       two_layer_exact, two_layer_mean_correction)

__all__ = ["sample_draws", "solve_two_layer"]


def sample_draws(mod, p: dict, sz: dict, samples: int, seed: int, sampler: str = "random", edges=None) -> list:
    """The source draws of every path, one (samples, n_k) array per source group (``mod.SOURCES``): 'random',
    JAX normals (one stream per source group); 'sobol', randomised QMC with an independent scrambled set per
    sample group, rows edges[g]:edges[g+1] (:mod:`dmftc.runtime.numerics.sampling`)."""
    factors = source_factors(mod, p, sz)
    if check_sampler(sampler) == "sobol":
        zs = block_normals(seed, [L.shape[0] for L in factors], edges)
        return [np.asarray(z) @ L.T for z, L in zip(zs, factors)]
    # (1, samples, n) unstacks to the one (samples, n) array, the same normals as drawing that shape
    return [np.asarray(group_normals(seed, gi, (1, samples, L.shape[0]))[0]) @ L.T for gi, L in enumerate(factors)]


def coefficient_rows(mod, geo: Geometry, p: dict, sz: dict, T: int) -> np.ndarray:
    """(T m,) time-major: each component's coefficient in its own constraint, ``coeff q + rest = <O>``."""
    coeff = mod.coefficients(p, sz)
    out = np.zeros(geo.m)
    for n, _ in mod.ORDERS:
        o, k = geo.offset[n], geo.size(n)
        c = coeff[n]
        out[o:o + k] = (np.broadcast_to(np.asarray(c, dtype=float), (k,)) if np.ndim(c) == 0 else
                        _k.canonical(np.asarray(c, dtype=float), mod.STORED_AXES[n], keep_batch=False).reshape(k))
    return np.tile(out, T)


def _group(mod, draws, a: int, b: int, size: int, mesh=None):
    """The normals of rows a:b padded with zero rows to ``size`` paths, and their weights (0 on the padding); the
    padded ones with their path axis sharded over ``mesh`` (:mod:`dmftc.runtime.numerics.devices`; None: one device)."""
    normals = normals_of(mod, [d[a:b] for d in draws])
    wts = jnp.asarray((np.arange(size) < b - a) / (b - a))
    padded, wts = place_paths(({k: pad_rows(v, size) for k, v in normals.items()}, wts), mesh)
    return normals, padded, wts


def solve_two_layer(mod, *, samples=20000, seed=0, batch=None, groups=8, dirac_width=0.1, backend="auto",
                    progress=False, correction=False, sampler=None, devices=None, **kwargs):
    """Solve the saddle point and the propagator of a two-layer module; returns a Solution (module doc).

    ``backend``: "mc" (Monte Carlo over the single-site process), "exact" (only for processes proven linear),
    "cubature" (:mod:`dmftc.runtime.engines.cubature`, ``samples`` its budget of nodes) or "auto": exact when proven, the
    cubature where it is more accurate per second (:func:`dmftc.runtime.engines.cubature.auto_prefers_cubature`; not with
    ``correction``, a ``sampler`` or ``devices``, which ask for sampled paths), else mc; ``batch``: paths per
    batch of the drivers' columns (default: sized to memory, :func:`dmftc.runtime.sensitivities.site_drivers.path_batch`);
    ``progress``: a progress bar on stderr; ``devices``: None (one device), 'all' or a number of JAX devices to
    shard each group's paths over (:mod:`dmftc.runtime.numerics.devices`)."""
    from dmftc.progress import Progress
    from dmftc.runtime.results.blocks import DenseBlocks
    from dmftc.runtime.results.solution import Solution

    require_program(mod)
    sampler_given = sampler
    sampler = "random" if sampler is None else sampler
    if backend == "exact" and mod.NONLINEAR is not None:
        raise ParameterError(f"the exact backend needs a Gaussian single-site process, but {mod.NONLINEAR}")
    exact = backend == "exact" or (backend == "auto" and mod.NONLINEAR is None)
    cubature = backend == "cubature"
    if cubature and correction:
        raise ParameterError("the cubature backend does not compute the O(1/N) mean correction yet: use "
                             "backend='mc' (or 'exact' for a linear spec) with correction=True")
    p, sz, T = resolve_params(mod, kwargs, dirac_width=dirac_width)
    chosen = None
    if backend == "auto" and not exact and not correction and sampler_given is None and devices is None:
        chosen = auto_prefers_cubature(mod, p, sz, samples)
        cubature = chosen is not None
    geo = Geometry(mod, sz)
    width = float(p.get("dirac width", 0.0))
    pj = {k: jnp.asarray(v, jnp.float64) for k, v in p.items()}
    coeff = coefficient_rows(mod, geo, p, sz, T)
    G = max(1, min(groups, samples // 2))
    edges = np.linspace(0, samples, G + 1).astype(int)
    mesh = path_mesh(devices)
    size = rows_for(int(np.diff(edges).max()), mesh)       # one device: the largest group
    placed = None
    timings, m1, kink = {}, [], None
    if exact:
        bar = Progress(f"{mod.MODEL} exact", 2, enabled=progress)
        t0 = _time.perf_counter()
        ex = two_layer_exact(mod, p, sz, T)
        timings["exact moments"] = _time.perf_counter() - t0
        bar.advance(note="moments")
        t0 = _time.perf_counter()
        sigma, U, kappa, cond = ex["sigma"], ex["U"], ex["kappa"], ex["condition"]
        timings["propagator"] = _time.perf_counter() - t0
        bar.advance(note="propagator")
        bar.close()
        means, var_se, batch_used = ex["q"], np.zeros(len(sigma)), None
        if correction:
            t0 = _time.perf_counter()
            draws = sample_draws(mod, p, sz, samples, seed, sampler, edges)
            for a, b in zip(edges[:-1], edges[1:]):
                normals, padded, wts = _group(mod, draws, a, b, size, mesh)
                Y = centred(paths_at(mod, padded, wts, pj, ex["layout"], sz, T, width), wts)
                m1.append(two_layer_mean_correction(mod, normals, pj, sz, T, width, ex["layout"], U, Y, ex["avg"],
                                                    mesh=mesh))
                placed = padded
            timings["mean correction"] = _time.perf_counter() - t0
        n_paths, seed_used, samples, seed = samples, seed, None, None
    elif cubature:
        bar = Progress(f"{mod.MODEL} cubature", 1, enabled=progress)
        t0 = _time.perf_counter()
        cub = two_layer_cubature(mod, p, sz, T, samples)
        timings["cubature"] = _time.perf_counter() - t0
        bar.advance(note="two levels")
        bar.close()
        sigma, U, kappa, cond = cub["sigma"], cub["U"], cub["kappa"], cub["condition"]
        means, var_se, batch_used = cub["q"], cub["var_err"], None
        samples, seed = cub["points"][0], None
    else:
        draws = sample_draws(mod, p, sz, samples, seed, sampler, edges)
        batch_used = path_batch(mod, sz, T, size, batch)
        kinks = tuple(getattr(mod, "KINK_FIELDS", ())) if mod.SINGULAR and width > 0 else ()
        results = []
        timings.update(saddle=0.0, moments=0.0, propagator=0.0)
        if correction:
            timings["mean correction"] = 0.0
        bar = Progress(f"{mod.MODEL} mc", 3 * G, enabled=progress)
        ones = bool(np.all(coeff == 1.0))                    # the spec's own form: coeff q + rest = <O>
        sums = []                       # over the groups: H (sigma = H + H^T), U, kappa (n x n each)

        def group_kappa(Y, w, paths):
            """(the group's centred Y, its kappa, seconds)."""
            t0 = _time.perf_counter()
            Y = centred(Y, w)
            return Y, Y.T @ Y / (paths - 1), _time.perf_counter() - t0

        def group_propagator(U, kappa, Uh):
            """The group's propagator, added to the running sums as H with sigma = H + H^T (symmetrised once,
            after the sum): (sigma's diagonal, U's condition number, the diagonal at half the delta width
            (U = ``Uh``) or None, seconds)."""
            t0 = _time.perf_counter()
            H, cond = propagate(U, kappa, T, half=True)
            at_half = None if Uh is None else 2.0 * np.diag(propagate(Uh, kappa, T, half=True)[0])
            group = (H, U if ones else coeff[:, None] * U,
                     kappa if ones else coeff[:, None] * kappa * coeff[None, :])
            if not sums:                 # U is the main thread's too (the mean correction): a copy
                sums.extend((group[0], group[1].copy(), group[2]))
            else:
                for acc, x in zip(sums, group):
                    acc += x
            return 2.0 * np.diag(H), cond, at_half, _time.perf_counter() - t0

        # NumPy's BLAS work (kappa, the propagator) runs on a second thread, one job at a time in order, while
        # the main thread runs the marches (JAX; on the CPU each takes about one core): a group's kappa as soon
        # as the replay gives its paths, during its drivers' columns; its propagator during the next group's
        # marches.  At most one group's propagator is pending when the next group starts.
        def finish(job):
            g, q_arr, chatter, kappa_job, prop_job = job
            var, cond, half, seconds = prop_job.result()
            results.append((q_arr, var, cond))
            timings["moments"] += kappa_job.result()[2]
            timings["propagator"] += seconds
            bar.advance(note=f"group {g + 1}/{G}: propagator")
            return None if half is None else (half - var, chatter)

        pending = None
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dmftc-blas") as pool:
            for g, (a, b) in enumerate(zip(edges[:-1], edges[1:])):
                t0 = _time.perf_counter()
                normals, padded, wts = _group(mod, draws, a, b, size, mesh)
                placed = padded
                q = group_saddle(mod, padded, wts, pj, sz, T, width)
                q_arr = layout_arrays(mod, q, sz, T)
                check_finite(q_arr, "saddle-point march")
                bar.advance(note=f"group {g + 1}/{G}: saddle march")
                t1 = _time.perf_counter()
                jobs = []
                J, _, avg, chatter = group_sensitivities(
                    mod, padded, wts, pj, q, sz, T, width, batch_used, kinks if g == 0 else (),
                    paths_ready=lambda Y, w=wts, n=b - a: jobs.append(pool.submit(group_kappa, Y, w, n)))
                U = identity_minus(J)
                Uh = None
                if g == 0 and kinks:
                    # kink check: the same group's propagator with the delta functions at half the width
                    Uh = identity_minus(group_sensitivities(mod, padded, wts, pj, q, sz, T, width / 2,
                                                            batch_used)[0])
                timings["saddle"] += t1 - t0
                timings["moments"] += _time.perf_counter() - t1
                bar.advance(note=f"group {g + 1}/{G}: kappa and D")
                if pending is not None:
                    kink = finish(pending) or kink
                kappa_job = jobs[0]
                pending = (g, q_arr, chatter, kappa_job,
                           pool.submit(lambda U=U, k=kappa_job, Uh=Uh: group_propagator(U, k.result()[1], Uh)))
                if correction:
                    t3 = _time.perf_counter()
                    m1.append(two_layer_mean_correction(mod, normals, pj, sz, T, width, q, U, kappa_job.result()[0],
                                                        avg, mesh=mesh))
                    timings["mean correction"] += _time.perf_counter() - t3
            kink = finish(pending) or kink
        bar.close()
        means = {k: np.mean([r[0][k] for r in results], axis=0) for k in results[0][0]}
        H, U, kappa = sums
        sigma = (H + H.T) / G
        U, kappa = U / G, kappa / G
        cond = max(r[2] for r in results)
        var_se = np.std([r[1] for r in results], axis=0, ddof=1) / np.sqrt(G) if G > 1 else None
    if exact or cubature:
        U, kappa = coeff[:, None] * U, coeff[:, None] * kappa * coeff[None, :]
    mean_se = None
    if cubature:                                       # the two levels' difference
        mean_se = time_major(geo, T, cub["q_err"])
    elif not exact and sampler == "sobol" and G > 1:     # randomised QMC: the groups' spread, not sqrt(var / samples)
        mean_se = time_major(geo, T, {k: np.std([r[0][k] for r in results], axis=0, ddof=1) / np.sqrt(G)
                                      for k in means})
    check_variances(np.diag(sigma), var_se, geo)
    diagnostics = {"u_condition": cond, "backend": "exact" if exact else "cubature" if cubature else "mc",
                   "sampler": None if exact or cubature else sampler}
    if chosen:
        diagnostics["auto"] = chosen
    if cubature:
        diagnostics["cubature"] = {
            "rule": cub["rule"], "coordinates": cub["dimension"], "nodes": list(cub["nodes"]),
            "points": list(cub["points"]),
            "error": "standard errors are the difference between the two levels (a bound for smooth integrands)"}
        if mod.SINGULAR:
            diagnostics["cubature"]["approximation"] = (
                "the activation is not smooth: the rule converges algebraically and the two-level difference may "
                "understate the error")
    if kink is not None:
        diagnostics["kink"] = kink_report(kink[0], var_se, np.diag(sigma), width, kink[1])
    blocks = DenseBlocks(T, geo.comp_shape, geo.offset, geo.m, sigma, var_se, kappa, U)
    per_name = lambda flat: None if flat is None else {k: blocks.flat(np.ravel(flat), k) for k in means}  # noqa: E731
    info = {"samples": samples, "seed": seed, "batch": batch_used, "timings": dict(timings),
            "diagnostics": dict(diagnostics), "spec_sha256": mod.SPEC_SHA256, "dmftc_version": mod.DMFTC_VERSION,
            "singular": mod.SINGULAR, "dirac_width": width}
    if mesh is not None and placed is not None:
        info["devices"] = describe(mesh, placed)
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
                f"the activation is not smooth ({', '.join(mod.SINGULAR)} in the sensitivities): the derivatives "
                f"of the march behind m1 take its kinks' delta functions as Gaussians of width {width:g}, a "
                "smoothing whose bias in m1 is not estimated")
    return sol


_CHATTER_WARN = 0.01      # warn when more than this fraction of the paths chatter across a kink


def time_major(geo: Geometry, T: int, arrays: dict) -> np.ndarray:
    """Per-name arrays {name: (*index dims, T)} as one (T, m) array over the components of every name."""
    out = np.zeros((T, geo.m))
    for k, v in arrays.items():
        n = geo.size(k)
        out[:, geo.offset[k]:geo.offset[k] + n] = np.reshape(v, (n, T)).T
    return out


def kink_report(shift, var_se, var, width, chatter=None) -> dict:
    """How far the equal-time variances move when the delta functions of a non-smooth activation are halved
    in width (one sample group, same paths), against the Monte Carlo standard error of the result; and how
    many paths chatter across the kink: the fraction of paths and components of each kink field (``KINK_FIELDS``,
    fields at whose zero the activation has a kink) that change sign 3 or more times along the trajectory,
    pushed over it by one point and back by another at every step or two.  The sensitivities through them are
    where the delta-function approximation is least reliable (docs/limitations.md, 'Relu in rich training')."""
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


def check_variances(var, var_se, geo):
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
