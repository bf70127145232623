"""The Hessian of one layer's ln Z_l over its local variables, held as its parts rather than as a dense matrix.

The Monte Carlo estimator (:mod:`dmftc.runtime.sensitivities.local_estimator`) finds the Hessian as a sum of
parts: a dense block over the columns R (the anti-causal couplings and the hats, plain entries ``cols`` of the
local vector), the chain rule's causal rows ``B`` in those columns and its transpose, a few sparse bilinear terms
and the Price rows ``P`` at the source-covariance entries ``pos`` and their transpose.  Dense, it is an nv x nv
matrix (L = 2, T = 50: nv = 10200, 830 MB per layer and group), of which the propagator reads only the
dual-primal block (into U) and the dual-dual block (into Kd).  :meth:`LocalHessian.block` builds any sub-block
from the parts, adding them in the same order as :meth:`LocalHessian.dense`, so both give the same numbers to
the bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["LocalHessian", "local_block"]


@dataclass(frozen=True, eq=False)               # (arrays: compared by identity)
class LocalHessian:
    """``h[i, j]`` (nv x nv) = ``HRR[r(i), r(j)]`` (i, j in ``cols``) + ``B[i, r(j)]`` (j in cols) +
    ``B[j, r(i)]`` (i in cols) + the sparse terms (``si``, ``sj``, ``sv``; repeated pairs add) + ``P[p(i), j]``
    (i in ``pos``) + ``P[p(j), i]`` (j in pos), where r and p are the positions in ``cols`` and ``pos``."""
    nv: int
    cols: np.ndarray          # (m,) distinct local indices
    HRR: np.ndarray           # (m, m)
    B: np.ndarray             # (nv, m)
    si: np.ndarray
    sj: np.ndarray
    sv: np.ndarray
    pos: np.ndarray           # (k,) distinct local indices
    P: np.ndarray             # (k, nv)

    def __post_init__(self):
        for name in ("cols", "pos"):
            idx = getattr(self, name)
            if len(np.unique(idx)) != len(idx):
                raise AssertionError(f"LocalHessian.{name} must hold distinct local indices")

    def _where(self, idx):
        out = np.full(self.nv, -1)
        out[idx] = np.arange(len(idx))
        return out

    def block(self, a, b) -> np.ndarray:
        """``h[np.ix_(a, b)]`` for index arrays a, b of distinct local indices."""
        a, b = np.asarray(a, int), np.asarray(b, int)
        rc, rp = self._where(self.cols), self._where(self.pos)
        ra, rb, pa, pb = rc[a], rc[b], rp[a], rp[b]
        ia, ib = np.flatnonzero(ra >= 0), np.flatnonzero(rb >= 0)
        out = np.zeros((len(a), len(b)))
        out[np.ix_(ia, ib)] = self.HRR[np.ix_(ra[ia], rb[ib])]
        out[:, ib] += self.B[np.ix_(a, rb[ib])]
        out[ia, :] += self.B[np.ix_(b, ra[ia])].T
        wa, wb = self._where(a), self._where(b)
        sel = (wa[self.si] >= 0) & (wb[self.sj] >= 0)
        np.add.at(out, (wa[self.si[sel]], wb[self.sj[sel]]), self.sv[sel])
        ka, kb = np.flatnonzero(pa >= 0), np.flatnonzero(pb >= 0)
        out[ka, :] += self.P[np.ix_(pa[ka], b)]
        out[:, kb] += self.P[np.ix_(pb[kb], a)].T
        return out

    def finite(self) -> bool:
        """Whether every part is finite."""
        return all(bool(np.all(np.isfinite(x))) for x in (self.HRR, self.B, self.sv, self.P))

    def dense(self) -> np.ndarray:
        """The whole nv x nv matrix."""
        everything = np.arange(self.nv)
        return self.block(everything, everything)


def local_block(h, a, b) -> np.ndarray:
    """``h[np.ix_(a, b)]`` of a local Hessian given dense (an array) or as a :class:`LocalHessian`."""
    if isinstance(h, LocalHessian):
        return h.block(a, b)
    return np.asarray(h)[np.ix_(a, b)]
