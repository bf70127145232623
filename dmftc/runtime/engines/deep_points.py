"""Runtime of deep specs on several training points (``POINTS`` in the generated module).

The spec's point index is folded into time (:mod:`dmftc.frontend.points_deep`): the march of
:mod:`dmftc.runtime.march.site_march` runs the spec's own single-site program over the T P steps tau = t P + mu, causal
in t, with sources that are Gaussian processes over (time, point) and kernels and responses that are
(T P) x (T P) matrices.  This module resolves the parameters (``Kx`` (P, P), ``y`` (P,), ...), runs the march in
independent groups of Monte Carlo paths (or once on the exact Gaussian basis for a linear activation) and
returns a :class:`dmftc.runtime.results.solution.Solution` in the spec's names and the shapes of the points:

    Delta (P, T), K (P, P, T) (a same-time pair of points), Phi[l], G[l], A[l], B[l] (P, P, T, T) [mu, nu, t, s].

The finite-width propagator lim N Cov of the equal-time observables of every point and pair
(:class:`dmftc.runtime.results.point_observables.PointObservables`) comes from the Hessian of the folded action over the
T P steps, whose causality goes by time (a step reads every point of earlier times): for a linear spec exactly
(:func:`linear_propagator`: the closed-form Gaussian action of :mod:`dmftc.runtime.engines.deep_linear`, with the O(1/N)
mean correction), for any other activation by the one Monte Carlo propagator of deep specs
(:func:`mc_propagator`: :mod:`dmftc.runtime.engines.deep_propagator` with ``points``), computed on first use of ``var``.
"""
from __future__ import annotations

import math
import time as _time

import jax
import numpy as np

from dmftc.errors import ParameterError
from dmftc.runtime.problem.deep_model import trained_mask
from dmftc.runtime.problem.params import resolve_params
from dmftc.runtime.results.point_observables import PointObservables
from dmftc.runtime.results.solution import Solution


__all__ = ["resolve_point_params", "solve_points", "linear_propagator", "mc_propagator"]


def resolve_point_params(mod, given: dict) -> tuple[dict, int, int, int]:
    """The spec's defaults overridden by ``given``, validated (:func:`dmftc.runtime.problem.params.resolve_params`: the
    number of points from the arrays' shapes when not given, Gram matrices symmetric and PSD, the update mask 0
    or 1): (params, L, T, P)."""
    p, sz, T = resolve_params(mod, given)
    return p, sz[mod.DEPTH], T, sz[mod.POINTS["size"]]


def _assemble(mod, out, L, T, P, p):
    """The march's output (:func:`dmftc.runtime.march.deep_dmft._site`: kernels and responses as causal rows by role,
    Delta, f over the T P steps) in the spec's names and the points' shapes (module doc)."""
    R = mod.ROLES
    to_pairs = lambda m: np.asarray(m).reshape(T, P, T, P).transpose(1, 3, 0, 2)   # noqa: E731  [mu, nu, t, s]
    arr = {}
    for role in ("Phi", "G"):
        for l in range(1, L + 1):
            m = np.asarray(out[role][l - 1])
            arr[f"{R[role]}[{l}]"] = to_pairs(np.tril(m) + np.tril(m, -1).T)
    for role, key in (("A", "Rphi"), ("B", "Rg")):
        for l in range(1, L + 1):
            arr[f"{R[role]}[{l}]"] = to_pairs(out[key][l - 1])
    arr[mod.ERROR_SIGNAL] = np.asarray(out["Delta"]).reshape(T, P).T
    arr["f"] = np.asarray(out["f"]).reshape(T, P).T
    bounds = mod.boundaries(p)

    def diag(name, layer):
        """The same-time (T, P, P) blocks of a kernel of layer ``layer`` (hidden or boundary)."""
        if 1 <= layer <= L:
            return np.einsum("mntt->tmn", arr[f"{name}[{layer}]"])
        from dmftc.runtime.problem.spec_kernels import layer_number

        for (fam, ref), v in bounds.items():
            if fam == name and layer_number(ref, 0, L, mod.LAYER, mod.DEPTH) == layer:
                return np.broadcast_to(np.asarray(v, dtype=float), (T, P, P))
        raise ParameterError(f"no boundary value {name}[{layer}] in {mod.SPEC_PATH}")  # pragma: no cover

    counts = dict(mod.POINTS["orders"])
    for name in mod.SCALARS:
        v = np.asarray(getattr(mod, f"scalar_{name}")(diag, p), dtype=float)        # (T, P, P)
        arr[name] = v.transpose(1, 2, 0) if counts.get(name, 2) == 2 else np.einsum("tmm->mt", v)
    return arr


def linear_propagator(mod, p: dict, L: int, T: int, P: int, memory_limit: float = 8e9, correction: bool = False):
    """The exact propagator of a linear deep spec on P points: the Hessian of its closed-form Gaussian action
    (:mod:`dmftc.runtime.engines.deep_linear`) over the T P steps (time, point), at the saddle of the spec's own march, as
    its blocks U and Kd, causal by time, and Sigma = [-(Hess S)^-1]_{phys, phys} by the causal solve, mapped to the equal-time observables of every point and pair of points:
    Delta (P,), K, Phi[l], G[l] (P, P) per time (K linearised by JAX from the spec's formula).  Returns
    (:class:`dmftc.runtime.results.blocks.DenseBlocks` in the spec's names, diagnostics, m1).  ``correction``: also the
    exact O(1/N) mean correction m1 = 1/2 C S3[C] (:mod:`dmftc.runtime.engines.deep_linear_correction`, C = -H^-1 whole):
    {name: m1} in the means' shapes (K: its linear part plus 1/2 tr(d2K Sigma) over the equal-time kernels of
    the same pair of points), else None."""
    import scipy.linalg as sla

    from dmftc.runtime.results.blocks import DenseBlocks
    from dmftc.runtime.solvers.causal_solve import back_kernel, covariance_of_all, physical_sigma
    from dmftc.runtime.problem.deep_action import Layout, saddle_point_vector
    from dmftc.runtime.engines.deep_linear import deep_linear_saddle, linear_blocks, require_affine_readout, stationarity
    from dmftc.runtime.problem.deep_model import from_spec

    t0 = _time.perf_counter()
    n = T * P
    lay = Layout(L, n)
    need = 8.0 * lay.n * lay.n * (3 if correction else 1)
    if need > memory_limit:
        raise ParameterError(f"the deep-linear propagator on {P} points at L = {L}, T = {T} needs about "
                             f"{need / 1e9:.1f} GB (memory_limit = {memory_limit / 1e9:.1f} GB); means are available, "
                             "for variances lower T, L or the number of points, or raise memory_limit")
    model = from_spec(mod, p)
    if correction:
        require_affine_readout(model)
    sad = deep_linear_saddle(L=L, T=n, model=model)
    model = sad.model                  # (a nonlinear error signal: linearised at this saddle)
    x0 = saddle_point_vector(sad)
    stat = stationarity(sad, model)
    blocks = linear_blocks(x0, lay, model, points=P)
    m1 = None
    if correction:
        from dmftc.runtime.engines.deep_linear_correction import mean_correction_from_inverse

        C = covariance_of_all(blocks, model)
        del blocks
        m1 = mean_correction_from_inverse(x0, C, L=L, T=n, model=model)[:lay.n_phys]
        Sp = C[:lay.n_phys, :lay.n_phys].copy()
        del C
    else:
        Sp = physical_sigma(blocks, np.eye(lay.n_phys), back_kernel(model, blocks.U.shape[0], lay.n_phys))[0]
        del blocks
    Sp = 0.5 * (Sp + Sp.T)
    obs = PointObservables(mod, model, L, T, P)                  # the equal-time observables of every point and pair
    names, rows, J = obs(sad, lay)
    sigma = J @ Sp @ J.T
    means_m1 = None
    if m1 is not None:
        R = mod.ROLES
        full_m1 = lambda blk: _pairs_of_tril(m1[lay.slice(blk)], n, T, P)                # noqa: E731
        means_m1 = {mod.ERROR_SIGNAL: m1[lay.slice("Delta")].reshape(T, P).T}
        for l in range(1, L + 1):
            means_m1[f"{R['Phi']}[{l}]"] = full_m1(f"Phi[{l}]")
            means_m1[f"{R['G']}[{l}]"] = full_m1(f"G[{l}]")
        k_lin = J[rows["K"]] @ m1                                                        # (T P P,)
        var = obs.kernel_columns(lay)
        cov = np.stack([np.stack([Sp[i, j] for j in var], axis=1) for i in var], axis=1)  # (T P P, 2L, 2L)
        kk = model.k_hessian(*obs.diagonals(sad))
        k_m1 = k_lin + 0.5 * np.einsum("eij,eij->e", kk, cov)
        means_m1["K"] = k_m1.reshape(T, P, P).transpose(1, 2, 0)
    ev = sla.eigh(Sp, eigvals_only=True, driver="evr")
    diag = {"stationarity": stat, "n_vars": lay.n, "min_eig": float(ev.min()), "max_eig": float(ev.max()),
            "psd": bool(ev.min() >= -1e-8 * max(ev.max(), 1e-300)), "time_propagator": _time.perf_counter() - t0}
    return (DenseBlocks(T, obs.shapes, obs.offsets, obs.block, sigma, var_se=np.zeros(T * obs.block)), diag,
            means_m1)


def mc_propagator(obs: PointObservables, memory_limit: float, kw: dict):
    """The Monte Carlo propagator of a nonlinear deep spec on several points: the one deep propagator
    (:func:`dmftc.runtime.engines.deep_propagator.deep_propagator`: each group's own saddle on the T P steps, the Monte Carlo
    Hessian of the folded action, causal by time, and its causal solve) mapped to the observables ``obs`` of
    every point and pair.  Returns (:class:`dmftc.runtime.results.blocks.DenseBlocks` with the standard errors over groups,
    diagnostics)."""
    from dmftc.runtime.engines.deep_solution import LazyPropagator

    prop = LazyPropagator(memory_limit, **kw).get()
    return obs.dense(prop.sigma, prop.se), prop.diagnostics


def _pairs_of_tril(v, n, T, P):
    """A symmetric (n, n) kernel over the steps from its packed lower triangle, as (P, P, T, T) [mu, nu, t, s]."""
    full = np.zeros((n, n))
    full[np.tril_indices(n)] = v
    full = full + np.tril(full, -1).T
    return full.reshape(T, P, T, P).transpose(1, 3, 0, 2)


def solve_points(mod, *, samples: int = 20000, seed: int = 0, groups: int = 8, dirac_width: float = 0.1,
                 backend: str = "auto", correction: bool = False, progress: bool = False, memory_limit: float = 8e9,
                 propagator_samples: int = 4000, propagator_groups: int = 8, sampler: str = "sobol",
                 propagator_feature_samples: int | None = None, **given) -> Solution:
    """Solve a compiled deep spec on several training points (module doc).  ``samples`` source paths in
    ``groups`` independent marches (means = group averages, standard errors from their spread); a linear spec
    is marched once on the exact Gaussian basis (``backend`` 'auto' or 'exact').  The Monte Carlo propagator of
    a nonlinear spec (``propagator_samples`` paths in ``propagator_groups`` groups, ``sampler``'s normals) is
    computed on first use of ``var`` or ``sigma`` (:func:`mc_propagator`)."""
    from dmftc.runtime.march.deep_dmft import SpecKernels, compiled_march, march_exact
    from dmftc.runtime.numerics.march_numerics import MEMORY_BUDGET, group_normals, traced
    from dmftc.runtime.problem.options import check_integer

    p, L, T, P = resolve_point_params(mod, given)
    if correction and not mod.LINEAR:
        raise ParameterError("the O(1/N) mean correction of nonlinear deep specs on several training points is not "
                             "implemented (linear ones have the exact one)")
    dirac_width = float(dirac_width)             # the options are checked by dmftc.runtime.problem.options.SolveOptions
    linear = bool(mod.LINEAR)
    if backend == "exact" and not linear:
        raise ParameterError("the exact backend needs Gaussian fields (a linear activation); use backend='mc'")
    exact = linear and backend != "mc"
    seed, groups = check_integer("seed", seed, 0), check_integer("groups", groups, 2)
    samples = check_integer("samples", samples, 2 * groups)
    if not exact:
        propagator_groups = check_integer("propagator_groups", propagator_groups, 2)
        propagator_samples = check_integer("propagator_samples", propagator_samples, 2 * propagator_groups)
        from dmftc.runtime.engines.deep_propagator import feature_paths

        propagator_feature_samples = feature_paths(propagator_feature_samples, propagator_samples,
                                                   "propagator_feature_samples", "propagator_samples")
    TP = T * P
    if not exact and 4 * L * (samples // groups) * TP * TP > MEMORY_BUDGET:
        raise ParameterError(f"the tangents of one group need 4 L (samples/groups) (T P)^2 = "
                             f"{4 * L * (samples // groups) * TP * TP:.3g} floats (budget {MEMORY_BUDGET:.0e}); "
                             "use more groups or fewer samples")
    prm = dict(p) | {"dirac width": dirac_width}
    t0 = _time.perf_counter()
    spec = SpecKernels(mod)
    if exact:                                  # the one march on the exact Gaussian basis (deep_dmft.march_exact)
        runs = [_assemble(mod, march_exact(spec, prm, L, TP, points=P), L, T, P, p)]
        diag = dict(backend="exact", basis_size=2 * L * TP)
    else:
        per = samples // groups
        march = compiled_march(L, TP, False, spec, points=P)
        runs = []
        for gi in range(groups):               # the standard normals of the one-point solve (deep_dmft.solve_deep)
            xiu, xir = group_normals(seed, gi, (2, L, per, TP))
            out = jax.device_get(march(xiu, xir, np.full(per, 1.0 / per), traced(prm)))
            runs.append(_assemble(mod, out, L, T, P, p))
        diag = dict(backend="mc", samples_per_group=per)
    means = {k: np.mean([r[k] for r in runs], axis=0) for k in runs[0]}
    se = ({k: np.zeros_like(v) for k, v in means.items()} if exact else
          {k: np.std([r[k] for r in runs], axis=0, ddof=1) / math.sqrt(groups) for k in runs[0]})
    bad = [k for k, v in means.items() if not np.all(np.isfinite(v))]
    if bad:
        from dmftc.errors import NumericalError

        raise NumericalError(f"{', '.join(bad)} became non-finite in the march of {mod.SPEC_PATH}: the dynamics "
                             "diverge; reduce the learning rate or the feature strength")
    diag.update(wall_time=_time.perf_counter() - t0, march="the spec's single-site program over (time, point) "
                "pairs (dmftc.runtime.march.site_march)")
    two = tuple(k for k, v in means.items() if v.ndim == 4)
    info = dict(diagnostics=diag, backend=diag["backend"], points=P, two_time=two, spec=mod.SPEC_PATH,
                spec_sha256=mod.SPEC_SHA256, dmftc_version=mod.DMFTC_VERSION)
    trained = trained_mask(mod, p)            # 0/1 per point (validated by resolve_params); None without a mask
    if trained is not None:                   # positions along the point axes (0-based) of the trained / test points
        info.update(trained_points=tuple(i for i, v in enumerate(trained) if v == 1.0),
                    test_points=tuple(i for i, v in enumerate(trained) if v == 0.0))
    if not exact:
        info.update(samples=per * groups, seed=seed, groups=groups, propagator_samples=propagator_samples,
                    propagator_feature_samples=propagator_feature_samples,
                    propagator_groups=propagator_groups, propagator_sampler=sampler)
    params = dict(p) | {"dirac width": dirac_width}
    blocks, error, m1 = None, None, None
    if exact:
        try:
            blocks, pdiag, m1 = linear_propagator(mod, p, L, T, P, memory_limit, correction)
            info["diagnostics"]["propagator"] = pdiag
            error = None
        except ParameterError as err:               # too large for memory_limit: the means stand
            if correction:
                raise
            error = err
    elif correction:
        raise ParameterError("the mean correction of a linear spec needs the exact backend (backend 'auto' or "
                             "'exact')")
    else:
        from dmftc.errors import StructureSpecError
        from dmftc.runtime.results.blocks import LazyDense
        from dmftc.runtime.problem.deep_model import from_spec

        try:                              # the propagator differentiates the spec's own action (module deep_model)
            model = from_spec(mod, p)
        except StructureSpecError as exc:
            error = exc
        else:
            act = spec.site_activation(p, dirac_width)
            info.update(activation=act.label, kink_order=act.kink_order)
            if act.kink_order is not None:
                from dmftc.runtime.engines.deep_solution import kink_note

                info["approximation"] = kink_note(act, dirac_width)
            obs = PointObservables(mod, model, L, T, P)
            kw = dict(activation=act, L=L, T=T * P, model=model, samples=propagator_samples,
                      groups=propagator_groups, seed=seed, progress=progress, sampler=sampler,
                      dirac_width=dirac_width, points=P, observables=obs,
                      feature_samples=propagator_feature_samples)
            blocks = LazyDense(T, obs.names, lambda: mc_propagator(obs, memory_limit, kw), info)
    return Solution(mod.MODEL, params, p[mod.TIME["step"]] * np.arange(T), means, blocks, info, kind="deep",
                    mean_se=se, error_signal=mod.ERROR_SIGNAL, blocks_error=error, depth=L, m1=m1,
                    m1_se=None if m1 is None else {k: np.zeros_like(v) for k, v in m1.items()})
