"""Ground truth for ONLINE learning: two-layer linear networks trained on the population loss.

The network (paper App. "Online Learning", linear activations): inputs x ~ N(0, I_D), teacher
y(x) = beta_star . x, predictor f(x) = beta . x with beta = (1/(gamma N)) sum_i a_i w_i, width N, read-in
weights w_i in R^D and readouts a_i, all N(0, 1) at t = 0.  Each step takes the exact gradient of the
population loss L = E_x (y - f~)^2 / 2 = |e|^2 / 2, with the background-subtracted predictor
f~ = f - f(0) and the weight-space error e(t) = beta_star - (beta(t) - beta(0)), and learning rate
eta gamma^2 N (mean-field scaling), i.e. the simultaneous update

    w_i += eta gamma a_i e,      a_i += eta gamma w_i . e .

Recorded at t = 0..T-1 before each update: Delta[k](t) = e_k(t) (the order parameter of
specs/online_linear.dmft) and the test loss |e(t)|^2.  No data are sampled: the population gradient is exact.

Randomness: member m uses the m-th block of N (D + 1) standard normals of np.random.default_rng(seed), as
:func:`dmftc.validation.ensemble.draw_parameters` with that D, so the members are the same networks as the
offline ensemble ``simulate_two_layer(activation='linear', Kx_all=np.eye(D), y=beta_star)`` on the same seed
(there x_mu = sqrt(D) e_mu, so h_i,mu = w_i[mu]): online learning in D dimensions and offline learning of D
whitened points are the same dynamical system, which the experiment checks member by member.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dmftc.validation.ensemble import _positive_int, draw_parameters

__all__ = ["OnlineRun", "simulate_online_linear"]


@dataclass(frozen=True)
class OnlineRun:
    """Per-member records: ``Delta`` (E, D, T) weight-space errors, ``loss`` (E, T) = |Delta|^2."""
    N: int
    D: int
    E: int
    T: int
    Delta: np.ndarray
    loss: np.ndarray


def simulate_online_linear(*, beta_star, gamma: float, eta: float, T: int, N: int, E: int, seed: int = 0,
                           batch: int | None = None) -> OnlineRun:
    """Train E width-N networks online for T recorded steps (module doc); ``beta_star`` (D,) sets D."""
    beta_star = np.asarray(beta_star, dtype=np.float64).reshape(-1)
    if beta_star.size == 0 or not np.all(np.isfinite(beta_star)):
        raise ValueError("beta_star must be a non-empty finite vector")
    if not (np.isfinite(gamma) and gamma > 0 and np.isfinite(eta) and eta >= 0):
        raise ValueError(f"need gamma > 0 and eta >= 0, got gamma={gamma!r}, eta={eta!r}")
    D = beta_star.size
    N, E, T = _positive_int("N", N), _positive_int("E", E), _positive_int("T", T)
    batch = _positive_int("batch", batch if batch is not None else max(1, min(E, (1 << 20) // (N * (D + 1)))))
    rng = np.random.default_rng(_positive_int("seed", seed, 0))
    out = np.empty((E, D, T))
    for b0 in range(0, E, batch):
        W, a = draw_parameters(rng, min(batch, E - b0), N, D)          # (B, N, D), (B, N)
        beta0 = np.einsum("bi,bid->bd", a, W) / (gamma * N)
        for t in range(T):
            e = beta_star - (np.einsum("bi,bid->bd", a, W) / (gamma * N) - beta0)      # (B, D)
            out[b0:b0 + len(a), :, t] = e
            c = eta * gamma
            a, W = a + c * np.einsum("bid,bd->bi", W, e), W + c * a[:, :, None] * e[:, None, :]
    return OnlineRun(N=N, D=D, E=E, T=T, Delta=out, loss=(out ** 2).sum(axis=1))
