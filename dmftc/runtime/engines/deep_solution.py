"""The solution of a deep network's DMFT from its parts: shared by compiled deep specs
(:mod:`dmftc.runtime.engines.deep_spec`, :mod:`dmftc.runtime.engines.deep_points`) and the Python API without a spec
(:func:`dmftc.deep.solve_deep`).

* :func:`linear_solution`: a linear network's exact saddle, propagator and O(1/N) mean correction from the
  closed-form Gaussian action (:mod:`dmftc.runtime.engines.deep_linear`);
* :func:`nonlinear_solution`: the Monte Carlo saddle (:mod:`dmftc.runtime.march.deep_dmft`, the spec's own march)
  and the Monte Carlo propagator (:mod:`dmftc.runtime.engines.deep_propagator`), computed on first use
  (:class:`LazyPropagator`);
* :func:`deep_solution`: either as a :class:`dmftc.runtime.results.solution.Solution` (lazy propagator blocks);
* the memory the propagators need (:func:`propagator_bytes`, :func:`causal_propagator_bytes`).
"""
from __future__ import annotations

import numpy as np

from dmftc.errors import ParameterError
from dmftc.runtime.results.blocks import LazyBlocks
from dmftc.runtime.problem.options import check_integer
from dmftc.runtime.results.solution import Solution, two_time_names

__all__ = ["deep_solution", "linear_solution", "nonlinear_solution", "LazyPropagator", "propagator_bytes",
           "causal_propagator_bytes", "kink_note", "NO_NONLINEAR_CORRECTION"]

NO_NONLINEAR_CORRECTION = (
    "the O(1/N) mean correction of deep networks is implemented for linear activations (exact, from the third "
    "derivatives of the closed-form action); a nonlinear deep net would need the Monte Carlo third derivatives "
    "of each layer's ln Z_l contracted with the full inverse Hessian (responses and conjugates included), about "
    "one forward-mode pass per eigen-direction of that inverse per source path, which is not built")


class LazyPropagator:
    """The Monte Carlo propagator of a deep nonlinear network, computed on first use (``get``) and kept."""

    def __init__(self, memory_limit: float, **kwargs):
        self.kwargs, self.memory_limit, self._value = kwargs, memory_limit, None

    def get(self):
        if self._value is None:
            from dmftc.runtime.engines.deep_propagator import deep_propagator

            L, T = self.kwargs["L"], self.kwargs["T"]
            need = causal_propagator_bytes(L, T)
            if need > self.memory_limit:
                raise ParameterError(
                    f"the deep propagator at L = {L}, T = {T} needs about {need / 1e9:.1f} GB "
                    f"(memory_limit = {self.memory_limit / 1e9:.1f} GB); means are available, for variances "
                    "lower T or L, or raise memory_limit")
            self._value = deep_propagator(**self.kwargs)
        return self._value


def propagator_bytes(L: int, T: int, correction: bool = False) -> int:
    """Peak memory of the deep-linear propagator: the Hessian's blocks U and Kd (n/2 x n/2 each), the solve's rows
    over the physical block and its result; with the mean correction the whole inverse (n x n) from U^-1."""
    from dmftc.runtime.problem.deep_action import Layout

    lay = Layout(L, T)
    half = lay.n // 2
    if correction:
        return 8 * (2 * half * half + 2 * half * half + lay.n * lay.n)
    return 8 * (2 * half * half + half * lay.n_phys + lay.n_phys * lay.n_phys)


def causal_propagator_bytes(L: int, T: int) -> int:
    """Peak memory of one group of the nonlinear deep propagator: U and Kd (dual x primal, dual x dual) twice
    (the group's and their sum over groups, dmftc.runtime.solvers.solve_bias), one layer's local Hessian with its
    chain-rule temporaries, and the per-chunk path arrays (at most 2 GB, see site_moments.SiteMoments)."""
    from dmftc.runtime.problem.deep_action import Layout

    lay = Layout(L, T)
    nt = T * (T + 1) // 2
    nv = 4 * nt + 2 * T * T + 2 * T
    return int(8 * (4 * (lay.n // 2) ** 2 + 2 * nv * nv) + min(2e9, 512 * 40 * (2 * T) ** 3))


def deep_solution(activation: str, L: int, T: int, params: dict, means: dict, mean_se: dict, source, info: dict,
                  m1: dict | None = None, error: Exception | None = None):
    """A :class:`dmftc.runtime.results.solution.Solution` of a deep network in the internal names (Delta, K, Phi[l],
    G[l], Rphi[l], Rg[l], f): ``source()`` returns its propagator (called on first use; None: means only, with
    ``error`` saying why); ``m1``: the exact O(1/N) mean correction of the observables (standard error 0)."""
    from dmftc.runtime.problem.deep_action import observable_names

    obs = observable_names(L)
    info.setdefault("two_time", two_time_names(means))
    blocks = LazyBlocks(T, source if source is not None else _no_source(error), {n: n for n in obs}, info)
    return Solution(f"deep {activation} network", dict(params), params["eta"] * np.arange(T), dict(means), blocks,
                    info, kind="deep", mean_se=dict(mean_se), m1=m1,
                    m1_se=None if m1 is None else {k: np.zeros_like(v) for k, v in m1.items()},
                    blocks_error=error if source is None else None, depth=L)


def _no_source(error):
    def raise_():
        raise error
    return raise_


def nonlinear_solution(act, march_act, *, L: int, T: int, gamma: float, y: float, eta: float, samples: int,
                       seed: int, spec, spec_params, model, memory_limit: float, propagator_samples: int,
                       propagator_groups: int, progress: bool, propagator_sampler: str, width: float,
                       propagator_feature_samples: int | None = None, **march_options) -> Solution:
    """A nonlinear deep network: the Monte Carlo saddle of ``spec`` (a compiled spec's
    :class:`dmftc.runtime.march.deep_dmft.SpecKernels` at ``spec_params``; without one, the reference march of
    ``model``) and its propagator on first use, from ``propagator_samples`` paths in ``propagator_groups``
    groups (and the features' covariance from ``propagator_feature_samples`` paths, default
    :data:`dmftc.runtime.engines.deep_propagator.FEATURE_FACTOR` times as many).  ``act``: the activation (labels,
    kink order); ``march_act``: the one the propagator marches."""
    from dmftc.runtime.march.deep_dmft import solve_deep as mc_saddle

    params = {"gamma": gamma, "y": y, "eta": eta}
    # the propagator's options, checked before the means march
    check_integer("propagator_samples", propagator_samples, 2)
    if check_integer("propagator_groups", propagator_groups, 1) < 2 or propagator_samples < 2 * propagator_groups:
        raise ParameterError(f"the propagator needs propagator_groups >= 2 and at least 2 source paths per "
                             f"group, got {propagator_groups} groups and {propagator_samples} paths")
    from dmftc.runtime.engines.deep_propagator import feature_paths

    propagator_feature_samples = feature_paths(propagator_feature_samples, propagator_samples,
                                               "propagator_feature_samples", "propagator_samples")

    sad = mc_saddle(activation=act.label if spec is not None else act, L=L, gamma=gamma, y=y, eta=eta, T=T,
                    samples=samples, seed=seed, spec=spec, spec_params=spec_params,
                    model=model if spec is None else None, **march_options)
    means = {k: np.asarray(sad[k]) for k in sad.keys()}
    se = {k: np.asarray(sad.stderr[k]) if k in sad.stderr else np.zeros_like(means[k]) for k in means}
    from dmftc.runtime.numerics.sampling import check_sampler

    prop = LazyPropagator(memory_limit, activation=march_act, L=L, gamma=gamma, y=y, eta=eta, T=T, model=model,
                          samples=propagator_samples, groups=propagator_groups, seed=seed, progress=progress,
                          sampler=check_sampler(propagator_sampler), feature_samples=propagator_feature_samples)
    info = {"samples": samples, "seed": seed, "propagator_samples": propagator_samples,
            "propagator_feature_samples": propagator_feature_samples,
            "propagator_groups": propagator_groups, "propagator_sampler": propagator_sampler,
            "activation": act.label, "kink_order": act.kink_order, "march": sad.diagnostics.get("march")}
    if act.kink_order is not None:
        info["approximation"] = kink_note(act, width)
    return deep_solution(act.label, L, T, params, means, se, prop.get, info)


def linear_solution(label: str, L: int, T: int, params: dict, model, memory_limit: float, correction: bool):
    """The exact solution of a deep linear network's action ``model`` (a compiled spec's
    :class:`~dmftc.runtime.problem.deep_model.DeepModel`, or the standard network's): the saddle, the propagator and,
    with ``correction``, the O(1/N) mean correction, from the autodiff derivatives of the closed-form Gaussian
    action (:mod:`dmftc.runtime.engines.deep_linear`); refused with the size it would need above ``memory_limit``."""
    from dmftc.runtime.problem.deep_action import observable_names
    from dmftc.runtime.engines.deep_linear import deep_linear_propagator

    need = propagator_bytes(L, T, correction)
    if need > memory_limit:
        raise ParameterError(
            f"the deep-linear propagator{' with the mean correction' if correction else ''} at L = {L}, "
            f"T = {T} needs about {need / 1e9:.1f} GB (memory_limit = {memory_limit / 1e9:.1f} GB); lower T "
            "or L, or raise memory_limit")
    prop = deep_linear_propagator(L=L, T=T, model=model, correction=correction)
    sad = prop.saddle
    means = {"Delta": sad.Delta, "f": sad.f, "K": sad.K}
    for l in range(1, L + 1):
        means.update({f"Phi[{l}]": sad.Phi[l - 1], f"G[{l}]": sad.G[l - 1],
                      f"Rphi[{l}]": sad.Rphi[l - 1], f"Rg[{l}]": sad.Rg[l - 1]})
    zeros = {k: np.zeros_like(v) for k, v in means.items()}
    m1 = {n: prop.mean_correction(n) for n in observable_names(L)} if correction else None
    return deep_solution(label, L, T, params, means, zeros, lambda: prop, dict(prop.diagnostics), m1)


def kink_note(act, width: float) -> str:
    """What a deep solve with a kinked activation approximates (``info['approximation']``)."""
    via = "" if act.standard_gradient else f" (or derivative {act.kink_order - 1} of the gradient field's a or b)"
    head = f"the activation's derivative of order {act.kink_order}{via} holds a delta function (a kink)"
    if act.kink_order <= 2:
        return (head + ": the march's responses take pathwise derivatives and drop it (the means are biased: "
                "measured for sqrt(2) max(0, h), L = 2-3, T = 30: K 3-10% of its peak off networks, growing "
                "with gamma, beyond the Monte Carlo error; see experiments/README.md); no propagator")
    return (head + f", replaced by a Gaussian of width {width:g} (dirac_width) in the propagator, which is "
            "extrapolated to width 0 from widths w and w/2 on the same paths (info 'dirac_shift': the size of "
            "that correction relative to each curve's peak); the residual bias is not estimated and may exceed "
            "the Monte Carlo error.  The groups' values are heavy-tailed (the mollified delta is large on the few "
            "paths near the kink), so few groups can under-state the standard error: measured for "
            "h / (1 + abs(h)), L = 2, T = 30, 16 groups of 4096 paths sufficed where 8 groups of 2048 did not "
            "(they gave a late-time standard error a third of the one 8 groups of 8192 gave, not twice it)")
