"""Deep networks (L hidden layers, one training point): one entry point over the deep solvers.

    sol = dmftc.deep.solve_deep(activation="tanh", L=2, gamma=1.0, y=1.0, eta=0.05, T=20)
    sol.mean("Phi[1]")        # (T, T) infinite-width feature kernel of layer 1
    sol.var("Phi[1]")         # (T,)  lim N Var(Phi[1](t, t))
    sol.var_stderr("Phi[1]")  # its Monte Carlo standard error (zeros when exact); sol.mean_stderr: the mean's
    sol.sigma("Delta", "K")   # (T, T) lim N Cov(Delta(t), K(s))

Backends:

* linear activation: exact discrete-time saddle and the propagator (and O(1/N) mean correction) from the
  autodiff Hessian of the closed-form Gaussian action of the model (``model``, a
  :class:`dmftc.runtime.problem.deep_model.DeepModel`; default the standard network) (:mod:`dmftc.runtime.engines.deep_linear`).
* any other activation (an expression in h, e.g. 'sin(h)', or a shorthand 'tanh', 'erf', 'relu'):
  the Monte Carlo saddle point of the exact discrete-time DMFT (:mod:`dmftc.runtime.march.deep_dmft`)
  for the means, and the finite-width propagator from the Monte Carlo Hessian of the MSR action
  (:mod:`dmftc.runtime.engines.deep_propagator`, ``propagator_samples`` source paths in ``propagator_groups``
  independent groups), computed on first use of ``var`` / ``sigma`` (it costs far more than the means).

Both propagators assemble the two halves U and Kd of the action's Hessian over all O(L T^2) variables (the exact
Gaussian ln Z_l of linear networks, the Monte Carlo one of the others) and solve by causal block back
substitution (:mod:`dmftc.runtime.solvers.causal_solve`).  Both need O((L T^2)^2) memory; sizes that do not fit
``memory_limit`` are refused with the size they would need.

Names: "Delta", "K" (time series), "Phi[l]", "G[l]" (two-time kernels, l = 1..L), and for the
means also "Rphi[l]", "Rg[l]" (response functions) and "f".
"""
from __future__ import annotations

from dmftc.errors import ParameterError
from dmftc.runtime.engines.deep_solution import (NO_NONLINEAR_CORRECTION, causal_propagator_bytes, deep_solution,
                                         linear_solution, nonlinear_solution, propagator_bytes)
from dmftc.runtime.problem.options import check_integer
from dmftc.runtime.results.solution import Solution

# the parts of a deep solution live in dmftc.runtime.engines.deep_solution; these names stay importable from here
__all__ = ["solve_deep", "propagator_bytes", "causal_propagator_bytes", "deep_solution"]


def solve_deep(*, activation: str = "linear", L: int = 2, gamma: float = 1.0, y: float = 1.0,
               eta: float = 0.05, T: int = 20, samples: int = 20000, seed: int = 0,
               memory_limit: float = 8e9, spec=None, spec_params: dict | None = None,
               propagator_samples: int = 4000, propagator_groups: int = 8,
               propagator_feature_samples: int | None = None, progress: bool = False,
               correction: bool = False, model=None, propagator_sampler: str = "sobol",
               **march_options) -> Solution:
    """Solve the deep network's discrete-time DMFT; the propagator too for linear networks.

    ``spec``/``spec_params``: a compiled deep spec's kernels (:class:`dmftc.runtime.march.deep_dmft.SpecKernels`) and
    parameters, which then drive the Monte Carlo march (used by :mod:`dmftc.runtime.engines.deep_spec`);
    ``march_options`` (groups, dirac_width, backend) are passed to :func:`dmftc.runtime.march.deep_dmft.solve_deep`;
    ``propagator_samples`` / ``propagator_groups``: source paths and independent groups of the nonlinear
    propagator (:func:`dmftc.runtime.engines.deep_propagator.deep_propagator`, seeded with ``seed``), run on first use;
    ``propagator_feature_samples``: the paths whose features give its feature covariance (default 16 times
    ``propagator_samples``; equal to it: the plain estimator);
    ``propagator_sampler``: its paths' standard normals, 'sobol' (randomised quasi-Monte Carlo) or 'random'
    (:mod:`dmftc.runtime.numerics.sampling`).
    ``correction``: also the exact O(1/N) mean correction of a linear network
    (:mod:`dmftc.runtime.engines.deep_linear_correction`); not available for nonlinear networks.  ``model``: the
    :class:`dmftc.runtime.problem.deep_model.DeepModel` whose action the propagator differentiates (exactly for a linear
    activation, by Monte Carlo otherwise; a compiled spec's; default: the standard network with gamma, y, eta).
    """
    from dmftc.runtime.problem.activation import as_activation
    from dmftc.jax_setup import make_room

    make_room()                       # a long process: drop compiled programs before the mappings run out
    width = march_options.get("dirac_width", 0.1)
    act = as_activation(activation, width)
    params = {"gamma": gamma, "y": y, "eta": eta}
    if act.linear:
        from dmftc.runtime.problem.standard_spec import as_model

        L, T = check_integer("L (number of hidden layers)", L, 1), check_integer("T (number of steps)", T, 1)
        if model is None and isinstance(activation, str):      # the standard network: its compiled spec
            from dmftc.runtime.problem.standard_spec import standard

            model = standard(activation, L=L, T=T, gamma=gamma, y=y, eta=eta, width=width)[2]
        return linear_solution(act.label, L, T, params, as_model(model, gamma, y, eta, L=L), memory_limit, correction)
    if correction:
        raise ParameterError(NO_NONLINEAR_CORRECTION)
    march_act = act
    if spec is None and model is None and isinstance(activation, str):     # the standard network: its compiled spec
        from dmftc.runtime.problem.standard_spec import standard

        spec, spec_params, model, march_act = standard(activation, L=L, T=T, gamma=gamma, y=y, eta=eta, width=width)
    return nonlinear_solution(act, march_act, L=L, T=T, gamma=gamma, y=y, eta=eta, samples=samples, seed=seed,
                              spec=spec, spec_params=spec_params, model=model, memory_limit=memory_limit,
                              propagator_samples=propagator_samples, propagator_groups=propagator_groups,
                              propagator_feature_samples=propagator_feature_samples, progress=progress,
                              propagator_sampler=propagator_sampler, width=width,
                              **march_options)
