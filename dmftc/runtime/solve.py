"""The one entry of the runtime: solve a generated module, whatever kind of spec it was compiled from.

    solve(module, SolveOptions(...), params)  ->  dmftc.runtime.results.solution.Solution

The options are validated once (:mod:`dmftc.runtime.problem.options`); the module's ``KIND`` picks the engine:

* a two-layer spec (time-constant Gaussian sources), lowered to a one-layer single-site program:
  :func:`dmftc.runtime.engines.site_solve.solve_two_layer`;
* a deep spec (layers l = 1..L, gp sources whose covariances are order parameters):
  :func:`dmftc.runtime.engines.deep_spec.solve_deep_module`, and for a deep spec on several training points
  (``POINTS``) :func:`dmftc.runtime.engines.deep_points.solve_points`.

Every engine returns the same :class:`~dmftc.runtime.results.solution.Solution`.
"""
from __future__ import annotations

from dmftc.jax_setup import make_room
from dmftc.runtime.numerics.devices import serial_blas_on_cpu
from dmftc.runtime.problem.options import SolveOptions

__all__ = ["solve", "kind_of"]


def kind_of(module) -> str:
    """'deep' or 'two-layer': which engine solves a generated module."""
    return "deep" if getattr(module, "KIND", None) == "deep" else "two-layer"


def solve(module, options: SolveOptions, params: dict):
    """Solve ``module`` with ``options`` at the model parameters ``params`` (the spec's defaults for the rest)."""
    if not isinstance(options, SolveOptions):
        raise TypeError(f"options must be a SolveOptions, got {type(options).__name__}")
    kind = kind_of(module)
    kw = options.for_kind(kind)
    make_room()                       # a long process: drop compiled programs before the mappings run out
    if kind == "two-layer":
        from dmftc.runtime.engines.site_solve import solve_two_layer

        with serial_blas_on_cpu():        # measured for the two-layer solves (dmftc.runtime.numerics.devices)
            return solve_two_layer(module, **kw, **params)
    if getattr(module, "POINTS", None):
        from dmftc.runtime.engines.deep_points import solve_points

        return solve_points(module, **kw, **params)
    from dmftc.runtime.engines.deep_spec import solve_deep_module

    return solve_deep_module(module, **kw, **params)
