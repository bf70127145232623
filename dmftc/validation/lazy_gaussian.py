"""Gaussian weight matrices drawn only along the directions a network applies them to.

A deep network's hidden matrix W (N x N, entries iid N(0, 1) at initialisation) enters gradient descent only
through products: the forward pass applies W to phi(h(t)) and the backward pass W^T to g(t), one vector per
training point and step, and the updates are outer products of those vectors (kept apart by the simulator).
Over T steps on P points that is at most T P products on each side, against the N^2 entries a dense draw
costs.  :class:`LazyGaussian` samples each product from its exact conditional distribution given the products
drawn before, so that every trajectory has exactly the law it has with a dense W.

Let Qv be an orthonormal basis of the right directions v drawn so far, with W Qv known, and Qu one of the left
directions u, with W^T Qu known.  In the rotated coordinates W' = [Qu Qu_perp]^T W [Qv Qv_perp] (again iid
N(0, 1), W being rotation invariant), the known products fix the columns of W' in the V block and its rows in
the U block; the rest, W'[U_perp, V_perp], is independent of them and iid N(0, 1).  So for a new right direction
v = Qv c + rho e (e a unit vector orthogonal to Qv):

    W e = Qu (W^T Qu)^T e + P_U_perp z,    z ~ N(0, I_N) fresh,

the first term known, the second an unconditioned Gaussian vector projected out of the left directions; then
W v = (W Qv) c + rho W e, and e joins Qv with W e.  Left products are the same with the roles exchanged.  Each
product costs N fresh normals and O(N k) work for k directions so far, instead of N^2 normals for a dense draw
(L = 2, N = 512, T = 10 on one point: 20 products, 26 times fewer normals).  The directions are orthonormalised
twice (classical Gram-Schmidt, repeated); a direction whose part orthogonal to the ones before is below
``REL_TOL`` of the vector is taken to lie in their span (it adds no direction and draws nothing).
"""
from __future__ import annotations

import numpy as np

__all__ = ["LazyGaussian", "DenseMatrices", "REL_TOL"]

REL_TOL = 1e-10


class _Side:
    """Orthonormal directions (B, k, N) of one side, and W (right side) or W^T (left side) applied to each."""

    def __init__(self, B: int, N: int, capacity: int):
        self.Q = np.zeros((B, capacity, N))
        self.A = np.zeros((B, capacity, N))
        self.k = 0

    def grow(self):
        if self.k == self.Q.shape[1]:
            self.Q = np.concatenate([self.Q, np.zeros_like(self.Q)], axis=1)
            self.A = np.concatenate([self.A, np.zeros_like(self.A)], axis=1)


class LazyGaussian:
    """A batch of B independent N x N matrices with iid N(0, 1) entries, sampled along the products asked of
    them (module doc).  ``right(v)`` = W v and ``left(u)`` = W^T u for v, u of shape (B, P, N) (P vectors per
    member, applied in order).  ``rng``: the numpy Generator the fresh normals come from (one (B, N) block per
    new direction, in the order of the products); ``capacity``: the directions per side to reserve (grown when
    exceeded)."""

    def __init__(self, rng: np.random.Generator, B: int, N: int, capacity: int = 16):
        self.rng, self.B, self.N = rng, int(B), int(N)
        self._right = _Side(B, N, max(1, capacity))
        self._left = _Side(B, N, max(1, capacity))

    @property
    def directions(self) -> tuple[int, int]:
        """(right, left) directions drawn so far."""
        return self._right.k, self._left.k

    def right(self, v: np.ndarray) -> np.ndarray:
        return self._apply(v, self._right, self._left)

    def left(self, u: np.ndarray) -> np.ndarray:
        return self._apply(u, self._left, self._right)

    def _apply(self, x, own: _Side, other: _Side):
        x = np.asarray(x, np.float64)
        out = np.empty_like(x)
        for p in range(x.shape[1]):
            out[:, p] = self._one(x[:, p], own, other)
        return out

    def _one(self, x, own: _Side, other: _Side):
        """W x (own = right side) or W^T x (own = left) for x (B, N), drawing a new direction where x leaves the
        span of the directions before."""
        k = own.k
        Q, A = own.Q[:, :k], own.A[:, :k]
        c = np.einsum("bkn,bn->bk", Q, x)
        r = x - np.einsum("bk,bkn->bn", c, Q)
        c2 = np.einsum("bkn,bn->bk", Q, r)                        # the second pass of Gram-Schmidt
        r -= np.einsum("bk,bkn->bn", c2, Q)
        c += c2
        known = np.einsum("bk,bkn->bn", c, A)
        rho = np.linalg.norm(r, axis=1)
        new = rho > REL_TOL * np.linalg.norm(x, axis=1)
        if not new.any():
            return known
        e = np.where(new[:, None], r / np.where(new, rho, 1.0)[:, None], 0.0)
        Qo, Ao = other.Q[:, :other.k], other.A[:, :other.k]
        z = self.rng.standard_normal((self.B, self.N))
        z -= np.einsum("bk,bkn->bn", np.einsum("bkn,bn->bk", Qo, z), Qo)       # out of the other side's span
        We = np.einsum("bk,bkn->bn", np.einsum("bkn,bn->bk", Ao, e), Qo) + z
        We *= new[:, None]
        own.grow()
        own.Q[:, k], own.A[:, k] = e, We
        own.k = k + 1
        return known + np.where(new, rho, 0.0)[:, None] * We


class DenseMatrices:
    """Given matrices W (B, N, N) behind the interface of :class:`LazyGaussian`: ``right(v)`` = W v and
    ``left(u)`` = W^T u for v, u (B, P, N)."""

    def __init__(self, W):
        self.W = W

    def right(self, v):
        return (self.W @ v.transpose(0, 2, 1)).transpose(0, 2, 1)

    def left(self, u):
        return u @ self.W
