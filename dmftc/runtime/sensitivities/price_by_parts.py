"""The Price blocks of the deep propagator by Gaussian integration by parts along the leading source directions.

A layer's ln Z_l depends on the covariance K of its Gaussian sources w; Price's theorem gives the derivatives
in K as averages of second source derivatives, P(a, b) = E_K[d^2 G / dw_a dw_b] for each column G of the block
(a hat's feature, or an anti-causal coupling's response), which the pathwise estimator samples directly
(:mod:`dmftc.runtime.sensitivities.site_moments`).  In the forward source u (K = Phi[l-1]) those second derivatives reach
phi''' and phi'''' through h, whose samples are large for steep activations: they carried the noise that made
the propagator of tanh(3 h) wrong by orders of magnitude (docs/how-it-works.md, "Steep activations: the Price
blocks by parts"; the measurements are in docs/validation.md, "Steep activations").  Stein's identity
E[w G] = K E[dG/dw] moves one derivative onto the Gaussian density; with
K = V Lambda V^T it needs 1 / lambda, harmless only along the leading directions.  So, with Pg the projector on
the eigen-directions with lambda >= tol * lambda_max, Z = V_g Lambda_g^-1 V_g^T and

    S(a, b) = E[(Z w)(a) dG/dw_b]          (= (Pg P)(a, b), unbiased; first derivatives only)
    P = S + S^T - Pg (S + S^T) Pg / 2 + (I - Pg) P_pathwise (I - Pg),

each block of P in the split (Pg, I - Pg) estimated once: by parts where a leading direction is involved,
pathwise elsewhere.  Entries whose source time max(a, b) exceeds the time tau at which the column is
determined are set to zero: they vanish exactly by causality (which keeps U block lower triangular).

The backward source r enters z linearly: its pathwise sums have no phi''' and were the quieter ones measured
(tanh(2 h), L = 2, T = 4: batch variance 0.30 pathwise against 3.6 by parts), so its block stays pathwise.
In one dimension (G = phi'(h)^2, h ~ N(0, 0.6), 2e6 samples) the standard deviation of one sample goes from
102 (pathwise) to 3.6 (by parts) for tanh(3 h), 24 to 1.6 for tanh(2 h) and 1.9 to 0.4 for tanh(h).
"""
from __future__ import annotations

import numpy as np

__all__ = ["stein_plan", "hybrid_price"]


def stein_plan(kernel, T: int, tol: float):
    """(Z, Pg) of the forward source block: ``kernel`` the lower triangle of its covariance Phi[l-1] at the base
    point; Z = V_g Lambda_g^-1 V_g^T and Pg = V_g V_g^T over the eigen-directions with eigenvalue >= tol times
    the largest."""
    low = np.zeros((T, T))
    low[np.tril_indices(T)] = kernel
    lam, V = np.linalg.eigh(low + np.tril(low, -1).T)
    good = (lam >= tol * max(lam.max(), 0.0)) & (lam > 0)
    Vg = V[:, good]
    return Vg @ np.diag(1.0 / lam[good]) @ Vg.T, Vg @ Vg.T


def hybrid_price(Pc, Pe, Sf, Sc, Pg, *, T: int, anti, feature_time, time=None):
    """(Pc, Pe) with the forward source block combined as in the module doc.  Pc (pairs, 2 T^2) and Pe (pairs,
    features): the pathwise sums, rows the lower-triangle pairs (a >= b) of each varying block in turn, the
    forward block first; Sf (T, features, T) and Sc (T, T^2, T): the by-parts sums of
    :meth:`dmftc.runtime.sensitivities.site_moments.SiteMoments.moments` (the latter over the anti-causal couplings ``anti``);
    ``feature_time``: the time each feature is determined at (an anti-causal coupling (t, s) at s); ``time``:
    the time of each of the T steps (default the step itself; on P training points the steps are (time, point)
    pairs and a source at another point of the same time is not later).  The backward block's rows stay
    pathwise."""
    time = np.arange(T) if time is None else np.asarray(time)
    ti, si = np.tril_indices(T)
    rows = np.arange(len(ti))
    anti = np.asarray(anti)
    Pc, Pe = np.array(Pc), np.array(Pe)
    Pb = np.eye(T) - Pg
    for P, S, cols, tau in ((Pe, np.asarray(Sf), np.arange(Pe.shape[1]), np.asarray(feature_time)),
                            (Pc, np.asarray(Sc), anti, time[anti % T])):
        H = np.zeros((T, T, len(cols)))
        H[ti, si] = P[np.ix_(rows, cols)]
        H[si, ti] = P[np.ix_(rows, cols)]
        St = np.moveaxis(S, 1, 2)                                                  # (a, b, column)
        Sym = St + np.swapaxes(St, 0, 1)
        hyb = (Sym - 0.5 * np.einsum("ai,ijk,jb->abk", Pg, Sym, Pg, optimize=True)
               + np.einsum("ai,ijk,jb->abk", Pb, H, Pb, optimize=True))
        P[np.ix_(rows, cols)] = np.where(time[ti][:, None] > tau[None, :], 0.0, hyb[ti, si])
    return Pc, Pe
