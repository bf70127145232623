"""Noise-free two-layer solves: Gauss-Hermite cubature over the sources, with an error estimate.

A two-layer spec's sources are a few Gaussians constant in time (``u, u_star ~ normal(0, [[1, kx], [kx, 1]])``,
``r ~ normal(0, 1)``: n = 3 standard-normal coordinates for ``specs/two_layer.dmft``), and for a smooth
activation every average the solver needs, the saddle point, D = <dO/dq> and kappa = Cov(O), is a smooth
integral over them.  So instead of random paths the march runs on the nodes of a tensor-product Gauss-Hermite
rule (probabilists' weights, ``numpy.polynomial.hermite_e.hermegauss``) with their weights: the same saddle
march, tangent march and causal solve (:mod:`dmftc.runtime.site_engine`), with every path average weighted.

The rule's error is estimated by solving again with fewer nodes per coordinate (about three quarters) and
reported as the difference of the two levels: for analytic integrands the error falls geometrically with the
number of nodes, so the difference is a conservative bound on the error of the finer level.  For a kinked
activation the integrands are not smooth, convergence is algebraic and the two-level difference may
understate the error; the solution says so.  A linear process is integrated exactly (the rule with n nodes
is exact for polynomials of degree 2n - 1 in each coordinate), so this backend equals the exact backend to
round-off there.

Cost: n_nodes^d paths for d coordinates, so the rule is for specs with few sources; ``samples`` bounds the
number of nodes (the finest level uses the most nodes per coordinate with n_nodes^d <= samples) and a spec
with too many coordinates for at least 3 nodes each is refused with a pointer to Monte Carlo.
"""
from __future__ import annotations

import itertools

import numpy as np

from dmftc.errors import ParameterError
from dmftc.runtime.geometry import source_factors
from dmftc.runtime.site_engine import two_layer_propagator

__all__ = ["rule_levels", "cubature_points", "two_layer_cubature"]

_MIN_NODES = 3          # exact for the quartic moments of a linear process (kappa)


def rule_levels(d: int, budget: int) -> tuple[int, int]:
    """(fine, coarse) nodes per coordinate for d coordinates within ``budget`` points."""
    fine = int(np.floor(budget ** (1.0 / d) + 1e-9))
    if fine < _MIN_NODES + 1:
        raise ParameterError(
            f"the cubature backend needs at least {_MIN_NODES + 1}^{d} = {(_MIN_NODES + 1) ** d} points for this "
            f"spec's {d} source coordinates; samples={budget} allows {fine} per coordinate: raise samples or use "
            "backend='mc'")
    return fine, max(_MIN_NODES, int(round(0.75 * fine)))


def cubature_points(mod, p: dict, sz: dict, nodes: int):
    """Tensor-product Gauss-Hermite rule in the sources' standard-normal coordinates, mapped through each source
    group's square-root factor: (draws, one (points, n_k) array per source group; weights (points,), sum 1)."""
    factors = source_factors(mod, p, sz)
    d = sum(L.shape[1] for L in factors)
    x, w = np.polynomial.hermite_e.hermegauss(nodes)
    w = w / w.sum()
    X = np.array(list(itertools.product(x, repeat=d)))
    W = np.prod(np.array(list(itertools.product(w, repeat=d))), axis=1)
    draws, off = [], 0
    for L in factors:
        draws.append(X[:, off:off + L.shape[1]] @ L.T)
        off += L.shape[1]
    return draws, W


def _one_level(mod, p, sz, T, nodes):
    draws, W = cubature_points(mod, p, sz, nodes)
    out = two_layer_propagator(mod, draws, p, sz, T, weights=W)
    out["points"] = len(W)
    return out


def source_dimension(mod, p: dict, sz: dict) -> int:
    """Number of standard-normal coordinates of the sources."""
    return sum(L.shape[1] for L in source_factors(mod, p, sz))


def two_layer_cubature(mod, p: dict, sz: dict, T: int, budget: int) -> dict:
    """The saddle and propagator of a two-layer spec by Gauss-Hermite cubature at two levels (module doc).
    Returns the finer level's {'q', 'sigma', 'U', 'kappa', 'condition'} and the error estimates 'q_err'
    ({name: array}) and 'var_err' (T m,), with 'nodes' (fine, coarse) and 'points' (fine, coarse)."""
    d = source_dimension(mod, p, sz)
    fine, coarse = rule_levels(d, budget)
    hi = _one_level(mod, p, sz, T, fine)
    lo = _one_level(mod, p, sz, T, coarse)
    hi["q_err"] = {k: np.abs(hi["q"][k] - lo["q"][k]) for k in hi["q"]}
    hi["var_err"] = np.abs(np.diag(hi["sigma"]) - np.diag(lo["sigma"]))
    hi["nodes"] = (fine, coarse)
    hi["points"] = (hi["points"], lo["points"])
    hi["dimension"] = d
    return hi
