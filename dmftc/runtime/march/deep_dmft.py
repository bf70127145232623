"""Infinite-width (saddle-point) solver of the exact discrete-time DMFT of deep networks.

Network: :mod:`dmftc.validation.deep_ensemble` (mean-field / muP parameterisation,
one training point, L hidden layers, discrete GD with learning rate eta N gamma^2).
Single-site process of hidden layer l = 1..L, all layers coupled only through order parameters::

    h^l(t) = u^l(t) + sum_{s<t}  [Rphi[l-1](t,s) + eta gamma Delta(s) Phi[l-1](t,s)] g^l(s)
    z^l(t) = r^l(t) + sum_{s<=t} Rg[l+1](t,s) phi(h^l(s)) + sum_{s<t} eta gamma Delta(s) G[l+1](t,s) phi(h^l(s))
    g^l(t) = phi'(h^l(t)) z^l(t),      u^l ~ GP(0, Phi[l-1]),  r^l ~ GP(0, G[l+1])  independent

    Phi[l](t,s) = <phi(h^l(t)) phi(h^l(s))>,   G[l](t,s) = <g^l(t) g^l(s)>,   Phi[0] = G[L+1] = 1
    Rphi[l](t,s) = <d phi(h^l(t)) / d r^l(s)>  (s < t),   Rg[l](t,s) = <d g^l(t) / d u^l(s)>  (s <= t)
    Rphi[0] = Rg[L+1] = 0
    f(t) = <z^L(t) phi(h^L(t))> / gamma,   Delta(t) = y - f(t)
    K(t) = sum_{l=0..L} G[l+1](t,t) Phi[l](t,t)

f is evaluated with the exact Gaussian identity (Stein's lemma for r^L = w(0) ~ N(0, 1), constant in
time, which enters z^L(s) additively for every s)::

    f(t) = (1/gamma) sum_{s<t} Rphi[L](t,s) + eta sum_{s<t} Delta(s) Phi[L](t,s)

which equals <z^L phi(h^L)>/gamma in expectation but has O(1) instead of O(1/gamma) Monte Carlo
noise (the direct average is kept in ``diagnostics['f_direct']``; both agree exactly on the
exact backend).

The march: a compiled deep spec carries its own single-site program (:mod:`dmftc.derive.site`, printed into
the generated module), and :mod:`dmftc.runtime.march.site_march` marches it: every compiled spec, and the standard
network above, which the Python API (:func:`dmftc.deep.solve_deep`) compiles from ``specs/deep_tanh.dmft``
(:mod:`dmftc.runtime.problem.standard_spec`).  :func:`solve_deep` (means), :func:`march_exact` (the exact basis) and
:func:`march_paths` (each Monte Carlo propagator group's saddle with its paths kept,
:func:`dmftc.runtime.engines.deep_propagator.mc_saddle`) run it through :func:`compiled_march`.  A model given as a
:class:`dmftc.runtime.problem.deep_model.DeepModel` without a spec runs the structured march of
:mod:`dmftc.reference.structured_march` (the fixed h / z / g template above, kept as the oracle the site march is
checked against).

The equations are causal, so there is no fixed-point iteration: one forward march in time.  Inside
step t: forward sweep l = 1..L (u^l(t) from Phi[l-1](t, s<=t), h^l(t), Phi[l](t, s<=t), Rphi[l](t, s<t)),
then f(t) and Delta(t) (used by later steps only), then backward sweep l = L..1 (r^l(t) from
G[l+1](t, s<=t), z^l(t) including the same-time term Rg[l+1](t,t) phi(h^l(t)), g^l(t), G[l](t, s<=t),
Rg[l](t, s<=t)).

Sources are generated causally with common random numbers: u(t) = sum_{s<=t} C(t,s) xi(s), the
Cholesky factor C of the kernel being extended by one row per step (negative residual variance
clamped to 0, pivots below a relative threshold treated as zero, as for the rank-deficient kernels
of linear / lazy networks).  Responses are forward-mode tangents carried along the march, per
sample: the derivatives of g^l(t) and phi(h^l(t)) with respect to additive perturbations of the fields at
earlier times, all s at once: O(S T^3 L) work.
For a non-smooth activation (ReLU) phi'' contains a Dirac delta that pathwise tangents cannot sample; it
is replaced by a Gaussian of width ``dirac_width`` (bias O(width^2)), as in :mod:`dmftc.derive.activation`.

Validation: linear networks agree with the numpy march of :mod:`dmftc.reference.deep_marches` to round-off; tanh,
L = 2, gamma = 1, eta = 0.05, T = 40 (320k samples) agrees with finite-width networks
(:mod:`dmftc.validation.deep_ensemble`, N = 512..2048 extrapolated in 1/N, initial-condition control variates)
to <= 0.7 % in Delta, K, Phi[l](t,t), G[l](t,t), within 1.5 combined standard errors.

Backends: 'mc' draws ``samples`` source paths split into ``groups`` independent groups, each with its
own complete march; means are group averages and ``stderr`` their standard errors.  'exact'
(linear activation only) runs the same march on the coefficient vectors of the fields over the
2 L T independent standard normals xi (the "samples" are the basis directions; second moments are
sums over them; the response tangents do not depend on the fields and are carried once), so every
average is an exact Gaussian covariance: no sampling, stderr = 0.
"""
from __future__ import annotations

import math
import time as _time
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from dmftc.errors import NumericalError, ParameterError
from dmftc.runtime.numerics.march_numerics import (MEMORY_BUDGET, PIVOT_TOL, PIVOT_TOL_EXACT, group_normals, symmetric,
                                                    traced)
from dmftc.runtime.problem.options import check_integer, check_number
from dmftc.runtime.problem.spec_kernels import SpecKernels, module_derivatives


_JIT: dict = {}


def runs_site(spec) -> bool:
    """Whether ``spec``'s march is its generated module's own single-site program."""
    return hasattr(getattr(spec, "module", None), "SITE")


def march_kernels(activation, model, L: int):
    """(kernels, parameter values) of the march of ``model`` (a :class:`dmftc.runtime.problem.deep_model.DeepModel`) with
    ``activation``: the spec's generated program (:class:`SpecKernels`) when the model was read from a compiled
    spec and ``activation`` is that spec's (None: the spec's own, delta width 0), else the kernels the model
    brings for itself (``DeepModel.march``: the tests' hand-built models bring the reference structured march,
    :class:`dmftc.reference.structured_march.ModelKernels`).  The runtime has no march of its own besides the
    spec's program."""
    mod = model.module
    spec = SpecKernels(mod) if mod is not None else None
    if runs_site(spec):
        if activation is None or tuple(activation.key[:len(spec.key)]) == spec.key:
            width = 0.0 if activation is None else activation.width
            mask = {mod.POINTS["mask"]: np.asarray(model.trained)} if model.trained is not None else {}
            return spec, dict(model.values) | mask | {mod.DEPTH: L, "dirac width": width}
    if model.march is None:
        what = (f"the activation {activation.label} is not that of its spec {mod.SPEC_PATH}" if mod is not None
                else "it was not compiled from a spec")
        raise ParameterError(f"{model.label}: no single-site program to march: {what}; write the activation into "
                             "a deep spec (activation phi(h) = ...) and load it with dmftc.load")
    kern = model.march(activation, model)
    return kern, kern.params(L)


def compiled_march(L, T, exact, spec, direct=False, keep=False, points=1):
    """The jitted march: a compiled spec's own single-site program (:mod:`dmftc.runtime.march.site_march`) when its
    generated module carries one, else the march of the kernels a hand-built model brings (``spec.march``)."""
    key = (spec.key, L, T, exact, direct, keep, points)
    if key not in _JIT:
        if runs_site(spec):
            fn = lambda xiu, xir, wts, prm: _site(xiu, xir, wts, prm, L=L, T=T, mod=spec.module,  # noqa: E731
                                                  direct=direct, keep=keep, exact=exact, points=points)
        else:
            fn = lambda xiu, xir, wts, prm: spec.march(xiu, xir, wts, prm, L=L, T=T, exact=exact,  # noqa: E731
                                                       direct=direct, keep=keep)
        _JIT[key] = jax.jit(fn)
    return _JIT[key]


def _site(xiu, xir, wts, prm, *, L, T, mod, direct, keep, exact, points=1):
    """The site march of a generated deep module, in the structured march's output names (roles)."""
    from dmftc.runtime.march.site_march import site_march

    width = prm["dirac width"]
    act = module_derivatives(mod, prm, width)[:3]
    (u, _, _), (r, _, _) = sorted(mod.SITE["sources"], key=lambda src: src[2])       # offsets -1 (u), +1 (r)
    rows, q1, hist, avg, chol = site_march(mod, act, L, T, {u: xiu, r: xir}, wts, prm, width=width, direct=direct,
                                           pivot_tol=PIVOT_TOL_EXACT if exact else PIVOT_TOL,
                                           tangent_wts=jnp.full(xiu.shape[1], 1.0 / xiu.shape[1]) if exact else None,
                                           points=points)
    R, layers = mod.ROLES, range(1, L + 1)
    stack = lambda d, name: jnp.stack([d[(name, l)] for l in layers])  # noqa: E731
    fixed = {sym for sym, _, _ in mod.SITE["fixed"]}
    e_t = next(sym for sym in mod.SITE["readouts"][0][1] if sym not in fixed)
    stein = any(sym == e_t for sym, _, _ in mod.SITE["stein"])
    out = {"Phi": stack(rows, R["Phi"]), "G": stack(rows, R["G"]), "Rphi": stack(rows, R["A"]),
           "Rg": stack(rows, R["B"]), "Delta": q1[mod.ERROR_SIGNAL],
           "f": avg[("stein" if stein else "direct", e_t)], "fdir": avg[("direct", e_t)],
           "e_used": avg[("stein" if stein and not direct else "direct", e_t)]}   # what Delta read
    if keep:
        out.update(h=stack(hist, R["h"]), z=stack(hist, R["z"]), Cu=stack(chol, u), Cr=stack(chol, r))
    return out


def march_exact(spec, prm: dict, L: int, T: int, points: int = 1) -> dict:
    """The march on the exact Gaussian backend (linear fields): the rows are the 2 L T basis vectors of the
    sources, so every average is an exact quadratic form.  ``prm``: the march's parameter values.  Returns
    numpy arrays {Phi, G, Rphi, Rg (L, T, T; kernels as causal rows), Delta, f, fdir (T,)}."""
    n = 2 * L * T
    basis = np.eye(n).reshape(n, 2, L, T).transpose(1, 2, 0, 3)      # (2, L, n, T)
    out = jax.device_get(compiled_march(L, T, True, spec, points=points)(basis[0], basis[1], np.ones(n),
                                                                         traced(prm)))
    _check_finite(out, L, T, "exact backend")
    return out


def march_paths(spec, prm: dict, xiu, xir, weights=None, points: int = 1):
    """The march with the direct readout on given standard normals xiu, xir (L, S, T), keeping every path
    (direct=True, keep=True): the saddle of the Monte Carlo action of these paths, and the
    paths themselves.  ``prm``: the march's parameter values (the kernels' own and 'dirac width').
    ``weights`` (S,): row weights (default equal), normalised to sum to 1.  Returns numpy
    arrays {Phi, G, Rphi, Rg (L, T, T; kernels as causal rows), Delta, fdir (T,), h, z, u, r (L, S, T), and the
    sources' causal Cholesky factors Cu, Cr (L, T, T): u = Cu xiu, r = Cr xir path by path}.
    ``points``: P of a spec on several training points (T = its (time, point) steps)."""
    L, S, T = xiu.shape
    wts = np.full(S, 1.0 / S) if weights is None else np.asarray(weights, float) / np.sum(weights)
    march = compiled_march(L, T, False, spec, direct=True, keep=True, points=points)
    out = jax.device_get(march(xiu, xir, wts, traced(prm)))
    _check_finite(out, L, T, "Monte Carlo group of the propagator")
    out["u"] = np.einsum("lnk,ltk->lnt", np.asarray(xiu), out["Cu"])
    out["r"] = np.einsum("lnk,ltk->lnt", np.asarray(xir), out["Cr"])
    return out


def _assemble(out, L, T, spec, p, report_f=None):
    """Raw march output -> named arrays; kernels symmetrised from their causal rows.  ``report_f``: what 'f' is
    (default ``spec.report_f``)."""
    report_f = report_f or spec.report_f
    arr = {"Delta": np.asarray(out["Delta"]), "f": np.asarray(report_f(np.asarray(out["f"]), p)),
           "f_direct": np.asarray(report_f(np.asarray(out["fdir"]), p))}
    for l in range(1, L + 1):
        arr[f"Phi[{l}]"] = symmetric(out["Phi"][l - 1])
        arr[f"G[{l}]"] = symmetric(out["G"][l - 1])
        arr[f"Rphi[{l}]"] = np.asarray(out["Rphi"][l - 1])
        arr[f"Rg[{l}]"] = np.asarray(out["Rg"][l - 1])
    roles = {spec.names["Phi"]: "Phi", spec.names["G"]: "G"}   # scalars from the kernels' time diagonals

    def diag(name, layer):
        role = roles[name]
        if 1 <= layer <= L:
            return np.diagonal(arr[f"{role}[{layer}]"])
        return np.asarray(spec._boundary(role, layer, T, p, L))

    for name, value in spec.scalar_values(diag, p).items():
        arr[name] = np.asarray(value, dtype=float)
    return arr


def _check_finite(out, L, T, where):
    """Raise NumericalError naming the first step (and quantity, in causal order) that is not finite."""
    first = {}
    for l in range(1, L + 1):
        first[f"Phi[{l}]"], first[f"Rphi[{l}]"] = np.asarray(out["Phi"][l - 1]), np.asarray(out["Rphi"][l - 1])
    first["f"], first["Delta"] = np.asarray(out["f"])[:, None], np.asarray(out["Delta"])[:, None]
    for l in range(L, 0, -1):
        first[f"G[{l}]"], first[f"Rg[{l}]"] = np.asarray(out["G"][l - 1]), np.asarray(out["Rg"][l - 1])
    best = None
    for name, v in first.items():
        bad = ~np.isfinite(v).all(axis=1)
        if bad.any() and (best is None or int(np.argmax(bad)) < best[1]):
            best = (name, int(np.argmax(bad)))
    if best is not None:
        raise NumericalError(f"{best[0]} became non-finite at step {best[1]} of the deep DMFT march ({where}); "
                             "the dynamics diverge: reduce the learning rate eta or the feature strength gamma")


@dataclass(frozen=True)
class DeepSaddle:
    """Saddle point of the deep DMFT: ``sad['Phi[1]']`` etc.; ``stderr`` has the same keys (MC errors)."""

    L: int
    T: int
    params: dict
    arrays: dict
    stderr: dict = field(default_factory=dict)
    diagnostics: dict = field(default_factory=dict)

    def __getitem__(self, name):
        try:
            return self.arrays[name]
        except KeyError:
            raise KeyError(f"no quantity {name!r}; available: {', '.join(self.arrays)}") from None

    def __contains__(self, name):
        return name in self.arrays

    def keys(self):
        return self.arrays.keys()


def solve_deep(*, activation: str, L: int, gamma: float, y: float, eta: float, T: int,
               samples: int = 20000, seed: int = 0, backend: str = "auto", groups: int = 8,
               dirac_width: float = 0.1, spec=None, spec_params: dict | None = None, model=None) -> DeepSaddle:
    """Infinite-width saddle point of the discrete-time DMFT of an L-hidden-layer network (see module doc).

    ``backend``: 'exact' (linear activation only, no sampling), 'mc', or 'auto' (exact iff linear).
    MC: ``samples`` source paths in ``groups`` independent complete marches (means = group averages,
    ``stderr`` = their standard errors).  ``dirac_width``: width of the Gaussians that stand for delta functions in
    the derivatives of a non-smooth activation (:mod:`dmftc.derive.activation`).  ``activation``: an expression in h,
    a shorthand ('tanh', 'relu', ...) or a :class:`dmftc.runtime.problem.activation.SiteActivation`.
    ``spec``: a :class:`SpecKernels` of a compiled deep spec, which then supplies the activation, the
    couplings and the readout; ``spec_params`` its parameter values (``activation`` is a label only,
    gamma, y and eta are recorded but the spec's own parameters are used).  Without a spec, ``model`` (a
    :class:`dmftc.runtime.problem.deep_model.DeepModel`, default the standard network with gamma, y, eta) is marched.
    """
    dirac_width = check_number("dirac_width", dirac_width, low=0.0)
    L, T = check_integer("L (number of hidden layers)", L, 1), check_integer("T (number of steps)", T, 1)
    gamma = check_number("gamma", gamma, low=0.0, strict=True)
    y, eta = check_number("y", y), check_number("eta", eta, low=0.0)
    label = activation if spec is not None else None
    report_f = None
    if spec is None:                      # a DeepModel (default: the standard network's compiled spec)
        from dmftc.runtime.problem.standard_spec import model_and_activation

        model, site = model_and_activation(model, activation, gamma, y, eta, L=L, width=dirac_width)
        spec, spec_params = march_kernels(site, model, L)
        label = site.label
        c_t = np.asarray(model.readout[1]) if model.readout_fn is None else None
        if runs_site(spec) and c_t is not None and c_t.ndim == 0:
            # a model's 'f' is its output change -c_t E_t (the standard network's E_t / gamma), not E_t
            report_f = lambda e, p, c=-float(c_t): c * e  # noqa: E731
    linear = spec.linear
    if backend not in ("auto", "exact", "mc"):
        raise ParameterError(f"backend must be 'auto', 'exact' or 'mc', got {backend!r}")
    if backend == "exact" and not linear:
        raise ParameterError(f"the exact backend needs Gaussian fields (activation='linear'), got {activation!r}; "
                             "use backend='mc'")
    exact = backend == "exact" or (backend == "auto" and linear)
    seed = check_integer("seed", seed, 0)
    groups = check_integer("groups", groups, 2)
    samples = check_integer("samples", samples, 2 * groups)
    if not exact and 4 * L * (samples // groups) * T * T > MEMORY_BUDGET:
        raise ParameterError(f"the tangents of one group need 4 L (samples/groups) T^2 = "
                             f"{4 * L * (samples // groups) * T * T:.3g} floats (budget {MEMORY_BUDGET:.0e}); "
                             "use more groups or fewer samples")
    prm = traced((spec_params or {}) | {"dirac width": dirac_width})
    host = {k: float(v) if np.ndim(v) == 0 else np.asarray(v, float) for k, v in (spec_params or {}).items()}
    params = dict(activation=label, L=L, gamma=gamma, y=y, eta=eta, T=T, backend="exact" if exact else "mc",
                  dirac_width=dirac_width)
    t0 = _time.perf_counter()
    if exact:
        arrays = _assemble(march_exact(spec, prm, L, T), L, T, spec, host, report_f)
        stderr = {k: np.zeros_like(v) for k, v in arrays.items()}
        diag = dict(backend="exact", basis_size=2 * L * T)
    else:
        per = samples // groups
        march = compiled_march(L, T, False, spec)
        runs = []
        for gi in range(groups):
            xiu, xir = group_normals(seed, gi, (2, L, per, T))
            out = jax.device_get(march(xiu, xir, np.full(per, 1.0 / per), prm))
            _check_finite(out, L, T, f"Monte Carlo group {gi}")
            runs.append(_assemble(out, L, T, spec, host, report_f))
        arrays = {k: np.mean([r[k] for r in runs], axis=0) for k in runs[0]}
        stderr = {k: np.std([r[k] for r in runs], axis=0, ddof=1) / math.sqrt(groups) for k in runs[0]}
        params.update(samples=per * groups, seed=seed, groups=groups)
        diag = dict(backend="mc", samples_per_group=per)
    diag["f_direct"] = arrays.pop("f_direct")
    diag["f_direct_stderr"] = stderr.pop("f_direct")
    diag["wall_time"] = _time.perf_counter() - t0
    diag["march"] = ("the spec's single-site program (dmftc.runtime.march.site_march)" if runs_site(spec)
                     else f"the model's own march ({type(spec).__module__}.{type(spec).__qualname__})")
    return DeepSaddle(L=L, T=T, params=params, arrays=arrays, stderr=stderr, diagnostics=diag)
