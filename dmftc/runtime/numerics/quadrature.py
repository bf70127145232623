"""Gauss-Hermite rules for expectations over d independent standard normals: tensor products and Smolyak sparse grids.

Both return nodes X (points, d) and weights W (points,) with sum(W) = 1, so that E[f(xi)] ~ W @ f(X).

* ``tensor_rule(d, n)``: the product of n-node rules in every coordinate, exact for polynomials of degree
  <= 2n - 1 in each coordinate; n^d points, so for few coordinates.
* ``sparse_rule(d, level)``: Smolyak's combination of products of one-dimensional rules U_i with m(i) = 2i - 1
  nodes (i >= 1),

      A(level, d) = sum over multi-indices i >= 1 with d + level - d + 1 <= |i| <= d + level of
                    (-1)^(d + level - |i|) binom(d - 1, d + level - |i|) U_i1 x ... x U_id,

  exact for every polynomial of total degree <= 2 level + 1 (level 2: every quartic moment, which is what kappa
  of a linear process needs).  The point count grows like 2^level d^level / level! rather than n^d; some
  weights are negative, which changes nothing for the averages built on them (every average is the same
  linear functional of the integrand).  Nodes shared by several products (the one-dimensional rules all
  contain 0) are merged.
"""
from __future__ import annotations

import itertools
from functools import lru_cache
from math import comb

import numpy as np

__all__ = ["hermite_rule", "tensor_rule", "sparse_rule", "sparse_size"]


def hermite_rule(n: int) -> tuple[np.ndarray, np.ndarray]:
    """n-node Gauss-Hermite rule for N(0, 1) (probabilists' Hermite polynomials), weights summing to 1."""
    x, w = np.polynomial.hermite_e.hermegauss(n)
    return x, w / w.sum()


def tensor_rule(d: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Product of n-node rules in each of d coordinates (module doc)."""
    x, w = hermite_rule(n)
    X = np.array(list(itertools.product(x, repeat=d))).reshape(-1, d)
    W = np.prod(np.array(list(itertools.product(w, repeat=d))).reshape(-1, d), axis=1)
    return X, W


def _compositions(total: int, d: int):
    """Every multi-index of d entries >= 1 summing to ``total``."""
    for cuts in itertools.combinations(range(1, total), d - 1):
        edges = (0,) + cuts + (total,)
        yield tuple(edges[k + 1] - edges[k] for k in range(d))


def _terms(d: int, level: int):
    """(coefficient, multi-index) of Smolyak's combination technique (module doc)."""
    q = d + level
    for total in range(max(d, q - d + 1), q + 1):
        c = (-1) ** (q - total) * comb(d - 1, q - total)
        for idx in _compositions(total, d):
            yield c, idx


def sparse_size(d: int, level: int) -> int:
    """Number of distinct nodes of ``sparse_rule(d, level)``."""
    return len(sparse_rule(d, level)[1])


@lru_cache(maxsize=32)
def _sparse(d: int, level: int) -> tuple[np.ndarray, np.ndarray]:
    rules = {i: hermite_rule(2 * i - 1) for i in range(1, level + 2)}
    Xs, Ws = [], []
    for c, idx in _terms(d, level):
        grids = np.meshgrid(*[rules[i][0] for i in idx], indexing="ij")
        wgrids = np.meshgrid(*[rules[i][1] for i in idx], indexing="ij")
        Xs.append(np.stack([g.ravel() for g in grids], axis=1))
        Ws.append(c * np.prod(np.stack([g.ravel() for g in wgrids], axis=1), axis=1))
    X, W = np.concatenate(Xs), np.concatenate(Ws)
    keys, first, inverse = np.unique(np.round(X, 12), axis=0, return_index=True, return_inverse=True)
    Wm = np.bincount(inverse.ravel(), weights=W, minlength=len(keys))
    keep = Wm != 0.0
    return X[first][keep], Wm[keep] / Wm[keep].sum()


def sparse_rule(d: int, level: int) -> tuple[np.ndarray, np.ndarray]:
    """Smolyak sparse grid of the given level over d coordinates (module doc)."""
    if d < 1 or level < 0:
        raise ValueError(f"sparse_rule needs d >= 1 and level >= 0, got d={d}, level={level}")
    X, W = _sparse(int(d), int(level))
    return X.copy(), W.copy()
