"""Groups of paths through the adjoint propagator: means, standard errors (:mod:`dmftc.runtime.adjoint`)."""
from __future__ import annotations

import time as _time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from dmftc.errors import ParameterError
from dmftc.runtime.adjoint.second_order import second_order_part
from dmftc.runtime.adjoint.sweep import Program, kappa_part, output_names, reverse_sweep
from dmftc.runtime.march.deep_dmft import march_kernels, runs_site
from dmftc.runtime.numerics.march_numerics import traced
from dmftc.runtime.problem.options import check_integer
from dmftc.runtime.numerics.sampling import source_normals
from dmftc.runtime.problem.spec_kernels import module_derivatives
from dmftc.runtime.problem.standard_spec import model_and_activation

_JIT: dict = {}

__all__ = ["AdjointPropagator", "program_of", "group_sigma", "adjoint_propagator"]


@dataclass(frozen=True)
class AdjointPropagator:
    """N Cov of the outputs ``names`` (each T steps): ``sigma`` (R, R) the groups' mean, ``se`` its standard
    error (std over groups / sqrt(groups)), ``parts`` the groups' mean kappa and H parts, ``seconds``."""
    names: tuple
    T: int
    sigma: np.ndarray
    se: np.ndarray
    parts: dict
    seconds: float

    def block(self, a: str, b: str) -> np.ndarray:
        """lim N Cov(a(t), b(s)), (T, T)."""
        i, j = self.names.index(a), self.names.index(b)
        T = self.T
        return self.sigma[i * T:(i + 1) * T, j * T:(j + 1) * T]

    def var(self, name: str) -> np.ndarray:
        return np.diag(self.block(name, name)).copy()

    def var_se(self, name: str) -> np.ndarray:
        i, T = self.names.index(name), self.T
        return np.diag(self.se[i * T:(i + 1) * T, i * T:(i + 1) * T]).copy()


def program_of(*, L: int, T: int, activation=None, model=None, gamma=None, y=None, eta=None) -> Program:
    """The :class:`Program` of a compiled deep spec's model, or of the standard network of ``activation``."""
    model, activation = model_and_activation(model, activation, gamma, y, eta, L=L)
    kern, prm = march_kernels(activation, model, L)
    if not runs_site(kern):
        raise ParameterError("the adjoint propagator marches a compiled spec's own single-site program")
    mod = kern.module
    width = float(prm["dirac width"])
    p = traced(prm)
    act = module_derivatives(mod, p, width)[:3]
    return Program(mod, act, p, L, T, width)


def group_sigma(prog: Program, xi: dict, wts):
    """(kappa part, H part) of one group of paths (source name -> standard normals (L, S, T)), over the outputs
    of :func:`dmftc.runtime.adjoint.sweep.output_names`."""
    _, W, V, state = reverse_sweep(prog, xi, wts)
    return kappa_part(V, wts), second_order_part(prog, xi, wts, W, state)


def adjoint_propagator(*, L: int, T: int, paths: int, groups: int = 4, seed: int = 0, sampler: str = "sobol",
                       activation=None, model=None, gamma=None, y=None, eta=None) -> AdjointPropagator:
    """The deep propagator of the time-diagonal outputs from ``paths`` source paths in ``groups`` independent
    groups (randomised quasi-Monte Carlo by default, :func:`dmftc.runtime.numerics.sampling.source_normals`)."""
    groups = check_integer("groups", groups, 2)
    size = check_integer("paths", paths, groups) // groups
    prog = program_of(L=L, T=T, activation=activation, model=model, gamma=gamma, y=y, eta=eta)
    (u, _, _), (r, _, _) = sorted(prog.mod.SITE["sources"], key=lambda src: src[2])     # offsets -1, +1
    key = (prog.mod.SPEC_PATH, prog.mod.SPEC_SHA256, tuple(sorted((k, float(v)) for k, v in prog.p.items())),
           L, T, size, prog.width)
    if key not in _JIT:
        _JIT[key] = jax.jit(lambda xi, w, prog=prog: group_sigma(prog, xi, w))
    run = _JIT[key]
    t0 = _time.perf_counter()
    sig, kap, hes = [], [], []
    wts = jnp.full(size, 1.0 / size)
    for g in range(groups):
        xiu, xir = source_normals(sampler, np.random.SeedSequence([seed, g]), L, size, T)
        k, h = run({u: jnp.asarray(xiu), r: jnp.asarray(xir)}, wts)
        k, h = np.asarray(k), np.asarray(h)
        kap.append(k)
        hes.append(h)
        sig.append(k + h)
    sig = np.array(sig)
    return AdjointPropagator(tuple(output_names(prog)), T, sig.mean(0), sig.std(0, ddof=1) / np.sqrt(groups),
                             {"kappa": np.mean(kap, 0), "H": np.mean(hes, 0)}, _time.perf_counter() - t0)
