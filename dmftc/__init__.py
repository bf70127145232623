"""dmftc: a symbolic-to-numeric compiler for finite-width DMFT of wide neural networks.

Stages: parse -> check -> derive -> lower -> emit (see :mod:`dmftc.compiler`),
then a runtime (:mod:`dmftc.runtime.solve`) that marches the spec's single-site program to the saddle point
and forms the propagator Sigma = U^-1 kappa U^-T.
"""
from dmftc.version import __version__  # noqa: F401

# 64-bit floats and JAX's persistent compilation cache (where: jax_cache_dir), set before anything compiles
from dmftc.jax_setup import CACHE_DIR as jax_cache_dir  # noqa: E402
from dmftc.compiler import compile_spec, load  # noqa: E402
from dmftc.errors import DmftcError, NumericalError, ParameterError, SpecError  # noqa: E402
from dmftc.runtime.results.solution import Solution  # noqa: E402
from dmftc.runtime.results.labelled import zscores  # noqa: E402

__all__ = ["load", "compile_spec", "Solution", "DmftcError", "SpecError", "ParameterError", "NumericalError",
           "zscores", "jax_cache_dir", "__version__"]
