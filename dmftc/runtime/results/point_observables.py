"""The equal-time observables of a deep spec on several training points, as a linear map of the action's
physical order parameters.

On P points the action runs over the n = T P steps tau = t P + mu (:mod:`dmftc.frontend.points_deep`), and its
physical block (:class:`dmftc.runtime.problem.deep_action.Layout`) holds the kernels Phi[l], G[l] over pairs of steps and
Delta over steps.  The observables a user asks for are those of one time: Delta_mu(t) (P,), and over every pair of
points K_{mu nu}(t), Phi[l]_{mu nu}(t, t), G[l]_{mu nu}(t, t) (P, P).  Their fluctuations are J dq, with J
picking the same-time entries and K linearised by JAX at the saddle from the spec's own formula
(:meth:`dmftc.runtime.problem.deep_model.DeepModel.k_jacobian`, applied per pair of points).  Rows are time-major with
``block`` components per time, the layout of :class:`dmftc.runtime.results.blocks.DenseBlocks`, so that a propagator
J Sigma J^T is a DenseBlocks as it stands.  Both propagators of specs on points use this one map: the exact one of
linear specs and the Monte Carlo one (:mod:`dmftc.runtime.engines.deep_points`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["PointObservables"]


@dataclass(frozen=True)
class PointObservables:
    """The observables of a spec on ``P`` points at ``T`` times, depth ``L``, in the spec's names (``mod``: its
    generated module; ``model``: its :class:`dmftc.runtime.problem.deep_model.DeepModel`)."""
    mod: object
    model: object
    L: int
    T: int
    P: int

    @property
    def names(self) -> list:
        R = self.mod.ROLES
        kern = [f"{R['Phi']}[{l}]" for l in range(1, self.L + 1)] + [f"{R['G']}[{l}]" for l in range(1, self.L + 1)]
        return [self.mod.ERROR_SIGNAL, "K"] + kern

    @property
    def shapes(self) -> dict:
        return {k: ((self.P,) if k == self.mod.ERROR_SIGNAL else (self.P, self.P)) for k in self.names}

    @property
    def offsets(self) -> dict:
        out, o = {}, 0
        for k in self.names:
            out[k] = o
            o += int(np.prod(self.shapes[k]))
        return out

    @property
    def block(self) -> int:
        return sum(int(np.prod(s)) for s in self.shapes.values())

    def rows(self, name) -> np.ndarray:
        """Row indices of ``name``'s components, (T, size), time-major."""
        size = int(np.prod(self.shapes[name]))
        return np.arange(self.T)[:, None] * self.block + self.offsets[name] + np.arange(size)[None, :]

    def pair_steps(self):
        """(a, b, pos): for every (t, mu, nu) (flattened (T, P, P)), the steps a = t P + mu, b = t P + nu and the
        position of the pair in a packed lower triangle over the steps."""
        T, P = self.T, self.P
        t_, mu, nu = np.meshgrid(np.arange(T), np.arange(P), np.arange(P), indexing="ij")
        a, b = (t_ * P + mu).reshape(-1), (t_ * P + nu).reshape(-1)
        hi, lo = np.maximum(a, b), np.minimum(a, b)
        return a, b, hi * (hi + 1) // 2 + lo

    def diagonals(self, sad):
        """The same-time kernels entering K, per (t, mu, nu): (Phi[0..L], G[1..L+1]), boundaries included."""
        a, b, _ = self.pair_steps()
        n, P = self.T * self.P, self.P
        full = lambda v: (np.asarray(v, float)[np.arange(n) % P][:, np.arange(n) % P] if np.ndim(v) == 2  # noqa: E731
                          else float(v) * np.ones((n, n)))
        same = lambda K: np.asarray(K)[a, b]                                             # noqa: E731
        dPhi = [same(full(self.model.phi0))] + [same(sad.Phi[l - 1]) for l in range(1, self.L + 1)]
        dG = [same(sad.G[l - 1]) for l in range(1, self.L + 1)] + [same(full(self.model.g_top))]
        return dPhi, dG

    def kernel_columns(self, lay):
        """Columns in the physical block of Phi[1..L], G[1..L] at every same-time pair, (2 L, T P P)."""
        _, _, pos = self.pair_steps()
        return [lay.blocks[f"{role}[{l}]"][0] + pos for role in ("Phi", "G") for l in range(1, self.L + 1)]

    def __call__(self, sad, lay):
        """(names, rows, J): J (T block, n_phys) maps the physical block to the observables at the saddle ``sad``;
        rows[name] its rows of that observable (time-major, as :meth:`rows` flattened)."""
        R, L, n = self.mod.ROLES, self.L, self.T * self.P
        J = np.zeros((self.T * self.block, lay.n_phys))
        J[self.rows(self.mod.ERROR_SIGNAL).reshape(-1), lay.blocks["Delta"][0] + np.arange(n)] = 1.0
        cols = self.kernel_columns(lay)
        for l in range(1, L + 1):
            J[self.rows(f"{R['Phi']}[{l}]").reshape(-1), cols[l - 1]] = 1.0
            J[self.rows(f"{R['G']}[{l}]").reshape(-1), cols[L + l - 1]] = 1.0
        kP, kG = self.model.k_jacobian(*self.diagonals(sad))
        rk = self.rows("K").reshape(-1)
        for l in range(1, L + 1):
            np.add.at(J, (rk, cols[l - 1]), kP[l - 1])
            np.add.at(J, (rk, cols[L + l - 1]), kG[l - 1])
        return self.names, {k: self.rows(k).reshape(-1) for k in self.names}, J

    def dense(self, sigma: dict, se: dict | None = None):
        """A :class:`dmftc.runtime.results.blocks.DenseBlocks` from blocks ``sigma[a][b]`` over the rows of
        :meth:`__call__` (and the standard errors ``se[a][a]`` of their diagonals)."""
        from dmftc.runtime.results.blocks import DenseBlocks

        m = self.T * self.block
        full, var_se = np.zeros((m, m)), np.zeros(m)
        for a in self.names:
            ra = self.rows(a).reshape(-1)
            for b in self.names:
                full[np.ix_(ra, self.rows(b).reshape(-1))] = sigma[a][b]
            if se is not None:
                var_se[ra] = np.diag(se[a][a])
        return DenseBlocks(self.T, self.shapes, self.offsets, self.block, full, var_se=var_se)
