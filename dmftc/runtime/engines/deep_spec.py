"""Runtime of compiled deep specs: solve a generated deep module (``KIND = 'deep'``).

The generated module supplies the numerics the spec determines (activation and derivatives, coupling
kernels, boundaries, readout, scalar order parameters); :func:`dmftc.runtime.march.deep_dmft.solve_deep` marches them
(``spec=SpecKernels(module)``).  The propagator differentiates the spec's own action: its couplings, readout,
boundary kernels and K read by :func:`dmftc.runtime.problem.deep_model.from_spec` (coupling derivatives by JAX from the
generated functions; no comparison with a built-in network).  For a linear activation every single-site
integral is Gaussian: the propagator (and the O(1/N) mean correction) is the autodiff Hessian of the exact
log-det action (:mod:`dmftc.runtime.engines.deep_linear`), after checking that the action so read reproduces the
spec's own march (so the two readings of the spec cannot drift apart).  For any other activation the means
come from the spec-driven march and the propagator from :mod:`dmftc.runtime.engines.deep_propagator` (computed on first
use of ``var``/``sigma``), with the generated activation and its four derivatives and the coefficients of the
spec's gradient field g = a(h) z + b(h) with their first three.

    m = dmftc.load("specs/deep_tanh.dmft")
    sol = m.solve(L=3, T=20, samples=20000)
    sol.mean("Phi[2]"), sol.mean_stderr("Delta"), sol.var("K"), sol.var_stderr("K"), sol.names
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from dmftc.errors import ParameterError, PropagatorTooLarge, StructureSpecError
from dmftc.runtime.problem.params import resolve_deep_params  # noqa: F401  (also read from here)
from dmftc.runtime.results.solution import Solution

# Stationarity required of the closed-form action read from the spec at the saddle of the spec's own program
# before that action's propagator is attached (round-off when they agree).
_LINEAR_MATCH = 1e-8


def solve_deep_module(mod, *, samples: int = 20000, seed: int = 0, groups: int = 8, dirac_width: float = 0.1,
                      backend: str = "auto", memory_limit: float = 8e9, propagator_samples: int = 4000,
                      propagator_groups: int = 8, propagator_feature_samples: int | None = None,
                      progress: bool = False, correction: bool = False,
                      sampler: str = "sobol", **given) -> Solution:
    """Solve a compiled deep spec (see the module doc); parameters not given take the spec's defaults.
    ``correction``: also the exact O(1/N) mean correction (linear specs only)."""
    from dmftc.runtime.engines import deep_solution as deep
    from dmftc.runtime.problem.spec_kernels import SpecKernels
    from dmftc.runtime.march.deep_dmft import solve_deep as march

    p, L, T = resolve_deep_params(mod, given)
    spec = SpecKernels(mod)
    steps, step = mod.TIME["steps"], mod.TIME["step"]
    r = mod.ROLES
    names = {n: n for n, k in mod.ORDERS if k == 1}
    for l in range(1, L + 1):
        names[f"{r['Phi']}[{l}]"] = f"Phi[{l}]"
        names[f"{r['G']}[{l}]"] = f"G[{l}]"
    for l in range(1, L + 1):
        names[f"{r['A']}[{l}]"] = f"Rphi[{l}]"
        names[f"{r['B']}[{l}]"] = f"Rg[{l}]"
    std = dict(gamma=p.get("gamma", 1.0), y=p.get("y", 0.0), eta=p[step])      # recorded only (the spec's own
    # parameters drive the march and, through deep_model.from_spec, the propagator)
    from dmftc.runtime.problem.deep_model import from_spec

    try:                              # the propagator differentiates the spec's own action (module deep_model)
        model, err = from_spec(mod, p), None
    except StructureSpecError as exc:
        model, err = None, exc
    if mod.LINEAR:
        if backend == "mc":
            raise ParameterError("deep linear specs are solved exactly (backend 'auto' or 'exact')")
        label = spec.site_activation(p, dirac_width).label        # the spec's own activation (phi = h)
        own = march(activation=label, L=L, T=T, backend="exact", spec=spec, spec_params=p,
                    dirac_width=dirac_width, **std)
        need = deep.propagator_bytes(L, T, correction)
        if need > memory_limit:
            if correction:
                raise ParameterError(
                    f"the deep-linear propagator with the mean correction at {mod.DEPTH} = {L}, {steps} = {T} needs "
                    f"about {need / 1e9:.1f} GB (memory_limit = {memory_limit / 1e9:.1f} GB); lower {steps} or "
                    f"{mod.DEPTH}, or raise memory_limit")
            err = PropagatorTooLarge(
                f"the deep-linear propagator at {mod.DEPTH} = {L}, {steps} = {T} needs about {need / 1e9:.1f} GB "
                f"(memory_limit = {memory_limit / 1e9:.1f} GB); means are available, for variances lower {steps} "
                f"or {mod.DEPTH}, or raise memory_limit")
        if err is None:
            inner = deep.linear_solution(label, L, T, std, model, memory_limit, correction)
            err = _saddle_mismatch(mod, inner)
            if err is None:
                return _in_spec_names(mod, inner, p, names)
        inner = _from_saddle(deep, own, label, L, T, std, {"backend": "exact"}, err)
        return _in_spec_names(mod, inner, p, names)
    if correction:
        raise ParameterError(deep.NO_NONLINEAR_CORRECTION)
    act = spec.site_activation(p, dirac_width)
    inner = deep.nonlinear_solution(act, act, L=L, T=T, samples=samples, seed=seed, spec=spec, spec_params=p,
                                    groups=groups, dirac_width=dirac_width, backend=backend, width=dirac_width,
                                    memory_limit=memory_limit, propagator_samples=propagator_samples,
                                    propagator_groups=propagator_groups, progress=progress, model=model,
                                    propagator_feature_samples=propagator_feature_samples,
                                    propagator_sampler=sampler, **std)
    if err is not None:
        inner = replace(inner, blocks_error=err)
    return _in_spec_names(mod, inner, p, names)


def _in_spec_names(mod, inner: Solution, p: dict, names: dict) -> Solution:
    """The solution of the internal march and propagator in the spec's names, parameters and provenance."""
    info = inner.info
    info.update(spec=mod.SPEC_PATH, spec_sha256=mod.SPEC_SHA256, dmftc_version=mod.DMFTC_VERSION)
    return inner.renamed(names, model=mod.MODEL, params=dict(p), error_signal=mod.ERROR_SIGNAL)


def _from_saddle(deep, sad, activation, L, T, params, diag, error):
    means = {k: np.asarray(sad[k]) for k in sad.keys()}
    se = {k: np.asarray(sad.stderr.get(k, np.zeros_like(v))) for k, v in means.items()}
    return deep.deep_solution(activation, L, T, dict(params), means, se, None, dict(diag), error=error)


def _saddle_mismatch(mod, inner) -> StructureSpecError | None:
    """The action read from the spec (module deep_model: couplings, readout, boundaries, K) must be stationary at
    the saddle the spec's own program marches (its generated equations on the exact basis) before that action's
    propagator is used (``info['stationarity']`` of the closed-form propagator): None, or the error to attach."""
    stat = float(inner.info.get("stationarity", np.inf))
    if stat <= _LINEAR_MATCH:
        return None
    return StructureSpecError(
        f"the spec's equations and its action as the propagator reads it (couplings, readout, boundaries, K) give "
        f"different saddle points: the action's gradient at the spec's saddle is {stat:.3g} (relative); the means "
        "are the spec's, but no propagator is attached (please report this spec)", None, filename=mod.SPEC_PATH)
