"""Noise-free two-layer solves: Gauss-Hermite cubature over the sources, with an error estimate.

A two-layer spec's sources are a few Gaussians constant in time (``u, u_star ~ normal(0, [[1, kx], [kx, 1]])``,
``r ~ normal(0, 1)``: d = 3 standard-normal coordinates for ``specs/two_layer.dmft``, P + 1 on P points), and for
a smooth activation every average the solver needs, the saddle point, D = <dO/dq> and kappa = Cov(O), is a smooth
integral over them.  So instead of random paths the march runs on the nodes of a Gauss-Hermite rule
(:mod:`dmftc.runtime.numerics.quadrature`) with their weights: the same saddle march, tangent march and causal solve
(:mod:`dmftc.runtime.engines.site_engine`), with every path average weighted.

The rule: for d <= 3 coordinates the tensor product of n-node rules (n^d points, n the most the ``samples``
budget allows); for more coordinates a Smolyak sparse grid of the highest level whose products fit the budget
(exact for polynomials of total degree 2 level + 1; some weights are negative).  The error is estimated by
solving again with a coarser rule (about three quarters of the nodes per coordinate, or one level lower) and
reported as the difference of the two: for analytic integrands the error falls geometrically, so the difference
is a conservative bound on the error of the finer rule.  For a kinked activation the integrands are not smooth,
convergence is algebraic and the two-level difference may understate the error; the solution says so.  A linear
process is integrated exactly (both rules are exact for the quartic moments kappa needs), so this backend
equals the exact backend to round-off there.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dmftc.errors import ParameterError
from dmftc.runtime.numerics.geometry import source_factors
from dmftc.runtime.numerics.quadrature import sparse_rule, sparse_size, tensor_rule
from dmftc.runtime.engines.site_engine import two_layer_propagator

__all__ = ["Rule", "auto_prefers_cubature", "choose_rule", "cubature_points", "two_layer_cubature"]

_MIN_NODES = 3          # tensor rule: exact for the quartic moments of a linear process (kappa)
_MIN_LEVEL = 2          # sparse grid: the same
TENSOR_MAX_COORDINATES = 3


@dataclass(frozen=True)
class Rule:
    """A pair of rules over d coordinates: 'tensor' (``fine``, ``coarse`` nodes per coordinate) or 'sparse'
    (Smolyak levels)."""
    kind: str
    d: int
    fine: int
    coarse: int

    def nodes(self, fine: bool = True):
        """(X (points, d), W (points,)) of the finer or the coarser rule."""
        k = self.fine if fine else self.coarse
        return tensor_rule(self.d, k) if self.kind == "tensor" else sparse_rule(self.d, k)

    @property
    def description(self) -> str:
        if self.kind == "tensor":
            return f"tensor-product Gauss-Hermite, {self.fine}^{self.d} nodes (error: against {self.coarse}^{self.d})"
        return (f"Smolyak sparse grid of Gauss-Hermite rules over {self.d} coordinates, level {self.fine} "
                f"(error: against level {self.coarse})")


def _tensor_nodes(d: int, budget: int) -> int:
    """Nodes per coordinate of the finest tensor rule within ``budget`` points."""
    return int(np.floor(budget ** (1.0 / d) + 1e-9))


def choose_rule(d: int, budget: int) -> Rule:
    """The finest rule within ``budget`` points for d coordinates (module doc), with its coarser partner."""
    if d <= TENSOR_MAX_COORDINATES:
        fine = _tensor_nodes(d, budget)
        if fine < _MIN_NODES + 1:
            raise ParameterError(
                f"the cubature backend needs at least {_MIN_NODES + 1}^{d} = {(_MIN_NODES + 1) ** d} points for this "
                f"spec's {d} source coordinates; samples={budget} allows {fine} per coordinate: raise samples or "
                "use backend='mc'")
        return Rule("tensor", d, fine, max(_MIN_NODES, int(round(0.75 * fine))))
    level = _MIN_LEVEL
    while sparse_size(d, level + 1) <= budget:
        level += 1
    if level < _MIN_LEVEL + 1:
        raise ParameterError(
            f"the cubature backend needs a sparse grid of level {_MIN_LEVEL + 1} for this spec's {d} source "
            f"coordinates, {sparse_size(d, _MIN_LEVEL + 1)} points; samples={budget} is fewer: raise samples or use "
            "backend='mc'")
    return Rule("sparse", d, level, level - 1)


def cubature_points(mod, p: dict, sz: dict, X: np.ndarray):
    """The rule's standard-normal nodes X (points, d) mapped through each source group's square-root factor:
    one (points, n_k) array per source group."""
    draws, off = [], 0
    for L in source_factors(mod, p, sz):
        draws.append(X[:, off:off + L.shape[1]] @ L.T)
        off += L.shape[1]
    return draws


def _one_level(mod, p, sz, T, rule: Rule, fine: bool):
    X, W = rule.nodes(fine)
    out = two_layer_propagator(mod, cubature_points(mod, p, sz, X), p, sz, T, weights=W)
    out["points"] = len(W)
    return out


def source_dimension(mod, p: dict, sz: dict) -> int:
    """Number of standard-normal coordinates of the sources."""
    return sum(L.shape[1] for L in source_factors(mod, p, sz))


def auto_prefers_cubature(mod, p: dict, sz: dict, budget: int) -> str | None:
    """Why ``backend='auto'`` takes the cubature for this nonlinear two-layer spec, or None (Monte Carlo): a
    smooth activation and at most three source coordinates, where a tensor rule's error falls geometrically
    (two_layer, tanh, T = 100: 0.08% of the peak in 2-3 s with 40^3 nodes, where 8 groups of 20000 Monte Carlo
    paths give 4%; benchmarks/bench_cubature.py).  Sparse grids on more coordinates (several training points)
    converge slowly and kinked activations algebraically: there Monte Carlo is the better choice."""
    if mod.SINGULAR:
        return None
    d = source_dimension(mod, p, sz)
    if d > TENSOR_MAX_COORDINATES or _tensor_nodes(d, budget) < _MIN_NODES + 1:
        return None
    return (f"auto: cubature (a smooth activation and {d} source coordinates: a Gauss-Hermite rule is more "
            f"accurate per second than Monte Carlo; backend='mc' for sampled paths)")


def two_layer_cubature(mod, p: dict, sz: dict, T: int, budget: int) -> dict:
    """The saddle and propagator of a two-layer spec by cubature at two levels (module doc).  Returns the finer
    rule's {'q', 'sigma', 'U', 'kappa', 'condition'} and the error estimates 'q_err' ({name: array}) and 'var_err'
    (T m,), with 'rule' (its description), 'nodes' (fine, coarse: nodes per coordinate or levels), 'points' (fine,
    coarse) and 'dimension'."""
    rule = choose_rule(source_dimension(mod, p, sz), budget)
    hi = _one_level(mod, p, sz, T, rule, True)
    lo = _one_level(mod, p, sz, T, rule, False)
    hi["q_err"] = {k: np.abs(hi["q"][k] - lo["q"][k]) for k in hi["q"]}
    hi["var_err"] = np.abs(np.diag(hi["sigma"]) - np.diag(lo["sigma"]))
    hi["nodes"] = (rule.fine, rule.coarse)
    hi["points"] = (hi["points"], lo["points"])
    hi["dimension"] = rule.d
    hi["rule"] = rule.description
    return hi
