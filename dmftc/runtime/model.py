"""A generated module wrapped with the stable user-facing API."""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from dmftc.build import build_module
from dmftc.runtime.results.labelled import index_names
from dmftc.runtime.problem.options import SolveOptions
from dmftc.runtime.solve import solve


class CompiledModel:
    """``m = dmftc.load(spec)``; ``m.solve(**params)`` -> :class:`dmftc.runtime.results.solution.Solution`."""

    def __init__(self, module):
        self.module = module

    @property
    def name(self) -> str:
        return self.module.MODEL

    @property
    def parameters(self) -> dict:
        """Default parameter values of the spec."""
        return self.module.defaults({})

    def solve(self, *, samples: int = 20000, seed: int = 0, batch: int | None = None, groups: int = 8,
              dirac_width: float = 0.1, backend: str = "auto", progress: bool = False, correction: bool = False,
              sampler: str | None = None, propagator_samples: int | None = None,
              propagator_groups: int | None = None, propagator_feature_samples: int | None = None,
              memory_limit: float | None = None, devices=None, **params):
        """Saddle point and propagator; unspecified parameters take the spec's defaults.

        ``samples`` single-site draws (seeded by ``seed``) estimate every average; ``groups``
        independent sample groups give Monte Carlo standard errors; ``dirac_width`` is the
        width of the Gaussian that stands for DiracDelta terms of non-smooth activations;
        ``backend`` is "auto" (exact Gaussian moments when the process is proven linear,
        Monte Carlo otherwise), "exact" or "mc"; ``progress`` draws a progress bar on stderr;
        ``correction`` also computes the O(1/N) correction to the mean (two-layer and deep linear specs:
        ``sol.mean_correction``, ``sol.mean_at_width``, ``sol.expected_loss``); ``sampler``: the standard normals
        of the sample groups, 'sobol' (randomised quasi-Monte Carlo) or 'random' (:mod:`dmftc.runtime.numerics.sampling`;
        default: 'sobol' for the propagator paths of deep specs, 'random' for two-layer specs).
        Two-layer specs only: ``batch`` (paths per kernel call; default: sized to memory) and ``devices`` (None:
        one device; 'all' or a number: each group's Monte Carlo paths sharded over that many JAX devices).  Deep
        specs only: ``propagator_samples``, ``propagator_groups`` (paths and groups of the Monte Carlo propagator;
        default 4000 and 8), ``propagator_feature_samples`` (paths whose features give the propagator's feature
        covariance, which carries most of its noise; default 16 times ``propagator_samples``; equal to it: the
        plain estimator) and ``memory_limit`` (bytes a dense propagator may take; default 8e9).  The options are
        checked alike for every spec (:class:`dmftc.runtime.problem.options.SolveOptions`); one that the spec's kind
        does not read is an error, not ignored.
        """
        options = SolveOptions(samples=samples, seed=seed, groups=groups, dirac_width=dirac_width, backend=backend,
                               sampler=sampler, progress=progress, correction=correction, batch=batch,
                               propagator_samples=propagator_samples, propagator_groups=propagator_groups,
                               propagator_feature_samples=propagator_feature_samples, memory_limit=memory_limit,
                               devices=devices)
        sol = solve(self.module, options, params)
        sol.info.setdefault("index_names", index_names(self.module))     # the dims of sol.to_xarray()
        return sol

    def saddle_on_draws(self, draws, **params) -> dict:
        """The saddle-point march on given source draws, one (S, n_k) array per source group (``module.SOURCES``,
        in declaration order); returns ``{name: (*dims, T)}``.  With the S draws of the neurons of finite-width
        networks this is the order-parameter trajectory of a width-S system on exactly those neurons: the
        common-random-number reference for measuring O(1/N) effects.  It marches the spec's single-site program
        (:func:`dmftc.runtime.engines.site_engine.two_layer_saddle`)."""
        from dmftc.errors import ParameterError
        from dmftc.runtime.problem.options import check_dirac_width
        from dmftc.runtime.problem.params import resolve_params
        from dmftc.runtime.engines.site_engine import two_layer_saddle

        if self.module.SITE["sources"]:              # the single-site program's sources are Gaussian processes
            raise ParameterError(
                f"saddle_on_draws takes draws of time-constant sources (two-layer specs); the sources of the deep "
                f"spec {self.module.SPEC_PATH} are Gaussian processes whose covariances are order parameters, "
                "so no draws are fixed before the march: use solve(seed=...) for common random numbers")
        mod = self.module
        width = check_dirac_width(params.pop("dirac_width", 0.1))
        p, sz, T = resolve_params(mod, params, dirac_width=width)
        return two_layer_saddle(mod, draws, p, sz, T)

    def sweep(self, name: str, values, client=None, **kwargs):
        """Solve for each value of one parameter; one ``xarray.Dataset`` (:meth:`Solution.to_xarray` of each
        solution, concatenated along a new dim ``name`` whose coordinate is ``values``; attrs that differ between
        the solutions are dropped).  ``kwargs``: the other parameters and options of :meth:`solve`, the same for
        every value.  Serially in this process (compiled kernels are reused across the sweep), or with
        ``client`` (a ``dask.distributed.Client`` or a scheduler address) as one Dask task per value: each
        worker loads this model from its spec file and returns the solution's Dataset."""
        from dmftc.runtime.results.sweep import run_sweep

        return run_sweep(self, name, values, client, kwargs, task=solve_task)

    def __repr__(self) -> str:
        return f"CompiledModel({self.name!r}, spec={self.module.SPEC_PATH!r})"


def load_model(spec_path, out_dir=None) -> CompiledModel:
    """Compile ``spec_path`` if its generated module is missing or stale, import it, wrap it
    (:func:`dmftc.load`)."""
    return CompiledModel(build_module(spec_path, out_dir))


@lru_cache(maxsize=8)
def _model(spec_file: str, out_dir: str, digest: str):
    return load_model(spec_file, out_dir)


def solve_task(spec_file: str, out_dir: str, kwargs: dict):
    """One Dask task of a sweep (:func:`dmftc.runtime.results.sweep.run_sweep`): the Dataset of
    ``load(spec_file, out_dir).solve(**kwargs)``."""
    digest = hashlib.sha256(Path(spec_file).read_bytes()).hexdigest()
    return _model(spec_file, out_dir, digest).solve(**kwargs).to_xarray()
