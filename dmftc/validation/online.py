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

The same networks, at a cost independent of N (:func:`simulate_online_linear_gram`): the update keeps the Gram
matrix G = X^T X of X = [W, a] (N x (D + 1)) closed, with M = W^T W, v = W^T a, s = a . a and c = eta gamma,

    v += c (M e + s e) + c^2 (v . e) e,   M += c (v e^T + e v^T) + c^2 s e e^T,   s += 2 c v . e + c^2 e^T M e,

and e = beta_star - (v - v(0)) / (gamma N) reads only v.  At initialisation G is Wishart(N, I_{D+1}), drawn by
Bartlett's decomposition in O(D^2) numbers per network.  Run from the G of given weights
(:func:`gram_trajectories`) it reproduces :func:`simulate_online_linear` member by member to round-off (tested).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dmftc.validation.ensemble import positive_int, draw_parameters

__all__ = ["OnlineRun", "gram_trajectories", "simulate_online_linear", "simulate_online_linear_gram",
           "wishart_bartlett"]


@dataclass(frozen=True)
class OnlineRun:
    """Per-member records: ``Delta`` (E, D, T) weight-space errors, ``loss`` (E, T) = |Delta|^2."""
    N: int
    D: int
    E: int
    T: int
    Delta: np.ndarray
    loss: np.ndarray


def _checked(beta_star, gamma, eta, N, E, T):
    beta_star = np.asarray(beta_star, dtype=np.float64).reshape(-1)
    if beta_star.size == 0 or not np.all(np.isfinite(beta_star)):
        raise ValueError("beta_star must be a non-empty finite vector")
    if not (np.isfinite(gamma) and gamma > 0 and np.isfinite(eta) and eta >= 0):
        raise ValueError(f"need gamma > 0 and eta >= 0, got gamma={gamma!r}, eta={eta!r}")
    return beta_star, positive_int("N", N), positive_int("E", E), positive_int("T", T)


def simulate_online_linear(*, beta_star, gamma: float, eta: float, T: int, N: int, E: int, seed: int = 0,
                           batch: int | None = None) -> OnlineRun:
    """Train E width-N networks online for T recorded steps (module doc); ``beta_star`` (D,) sets D."""
    beta_star, N, E, T = _checked(beta_star, gamma, eta, N, E, T)
    D = beta_star.size
    batch = positive_int("batch", batch if batch is not None else max(1, min(E, (1 << 20) // (N * (D + 1)))))
    rng = np.random.default_rng(positive_int("seed", seed, 0))
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


def wishart_bartlett(rng: np.random.Generator, n_members: int, N: int, p: int) -> np.ndarray:
    """(n_members, p, p) draws of Wishart(N, I_p), the Gram matrix of an N x p standard normal matrix: A A^T
    with A lower triangular, A_ii = sqrt(chi^2 with N - i degrees of freedom), A_ij ~ N(0, 1) below (Bartlett)."""
    if N < p:
        raise ValueError(f"Bartlett's decomposition needs N >= D + 1, got N={N}, D + 1={p}")
    A = np.tril(rng.standard_normal((n_members, p, p)), -1)
    idx = np.arange(p)
    A[:, idx, idx] = np.sqrt(rng.chisquare(N - idx, size=(n_members, p)))
    return A @ np.swapaxes(A, 1, 2)


def gram_trajectories(G: np.ndarray, *, beta_star, gamma: float, eta: float, T: int, N: int) -> np.ndarray:
    """Errors Delta (B, D, T) of the networks whose initial Gram matrices G = [W, a]^T [W, a] are given (B, D+1,
    D+1), by the closed update of the module doc."""
    beta_star = np.asarray(beta_star, dtype=np.float64).reshape(-1)
    D = beta_star.size
    G = np.asarray(G, dtype=np.float64)
    M, v, s = G[:, :D, :D].copy(), G[:, :D, D].copy(), G[:, D, D].copy()
    v0 = v.copy()
    c = eta * gamma
    out = np.empty((len(G), D, T))
    for t in range(T):
        e = beta_star - (v - v0) / (gamma * N)
        out[:, :, t] = e
        Me = np.einsum("bij,bj->bi", M, e)
        ve = np.einsum("bi,bi->b", v, e)
        eMe = np.einsum("bi,bi->b", e, Me)
        v_new = v + c * (Me + s[:, None] * e) + c * c * ve[:, None] * e
        M += c * (v[:, :, None] * e[:, None, :] + e[:, :, None] * v[:, None, :]) \
            + c * c * s[:, None, None] * e[:, :, None] * e[:, None, :]
        s = s + 2 * c * ve + c * c * eMe
        v = v_new
    return out


def simulate_online_linear_gram(*, beta_star, gamma: float, eta: float, T: int, N: int, E: int, seed: int = 0,
                                batch: int | None = None) -> OnlineRun:
    """E width-N networks trained online as :func:`simulate_online_linear`, simulated through their Gram
    matrices (module doc): the same distribution of trajectories at a cost independent of N (other draws of
    the random numbers, so not the same members for a seed)."""
    beta_star, N, E, T = _checked(beta_star, gamma, eta, N, E, T)
    D = beta_star.size
    batch = positive_int("batch", batch if batch is not None else max(1, min(E, (1 << 21) // (D + 1) ** 2)))
    rng = np.random.default_rng(positive_int("seed", seed, 0))
    out = np.empty((E, D, T))
    for b0 in range(0, E, batch):
        G = wishart_bartlett(rng, min(batch, E - b0), N, D + 1)
        out[b0:b0 + len(G)] = gram_trajectories(G, beta_star=beta_star, gamma=gamma, eta=eta, T=T, N=N)
    return OnlineRun(N=N, D=D, E=E, T=T, Delta=out, loss=(out ** 2).sum(axis=1))
