"""Hand-derived infinite-width (DMFT mean) dynamics of a two-layer network trained by SGD with heavy-ball
momentum, weight decay and a per-step learning-rate factor: an oracle for ``specs/two_layer_sgd.dmft`` and for
:mod:`dmftc.validation.optax_nets`.

The network (one training point x with |x|^2 / D = 1, target y, tanh, squared loss; as in
:mod:`dmftc.validation.optax_nets`)::

    h_i = W_i . x / sqrt(D),   f = sum_i w_i phi(h_i) / (gamma N),   Delta = y - (f - f(0)),   loss = Delta^2 / 2

with W_i (D,), w_i ~ N(0, 1), trained by ``optax.chain(optax.add_decayed_weights(lam / (N gamma^2)),
optax.sgd(learning_rate=lambda t: eta N gamma^2 lr[t], momentum=beta))`` on all weights: per parameter theta,
with velocity v (0 at t = 0) and t counting updates from 0::

    v <- beta v + dloss/dtheta + lam / (N gamma^2) theta,      theta <- theta - eta N gamma^2 lr[t] v.

Derivation of the per-neuron recurrences.  The gradients are dloss/dw_i = -Delta phi(h_i) / (gamma N) and
dloss/dW_i = -Delta w_i phi'(h_i) x / (gamma N sqrt(D)): both O(1/N), as is the weight-decay coefficient
lam / (N gamma^2), while the step eta N gamma^2 is O(N).  Scale the velocities by -gamma N,

    m^w_i = -gamma N v_{w_i},      m^h_i = -gamma N v_{W_i} . x / sqrt(D)

(the projection of W_i's velocity on the input direction, the only one that moves h_i: components of W_i
orthogonal to x decay under the weight decay but never enter h_i).  Multiplying the velocity update by
-gamma N (and projecting it on x / sqrt(D) for W_i, using x . x / D = 1) and the parameter update likewise::

    m^h_i <- beta m^h_i + Delta w_i phi'(h_i) - (lam / gamma) h_i,      h_i <- h_i + eta gamma lr[t] m^h_i
    m^w_i <- beta m^w_i + Delta phi(h_i)      - (lam / gamma) w_i,      w_i <- w_i + eta gamma lr[t] m^w_i

(both with the old h_i, w_i, Delta(t)): every term is O(1), since lam / (N gamma^2) times gamma N is lam / gamma
and eta N gamma^2 / (gamma N) is eta gamma.  The factor gamma N that v carries is the one the gradient lost,
so the momentum and the decay act on O(1) per-neuron quantities and the neurons interact only through
Delta(t).  As N -> infinity the neuron average becomes the expectation over the neuron's initial condition
(h_i(0), w_i(0)) ~ N(0, 1)^2 (independent: W_i . x / sqrt(D) is a unit normal), through which each neuron's
trajectory is deterministic::

    Delta(t) = y - E[w(t) phi(h(t)) - w(0) phi(h(0))] / gamma
    K(t)     = E[phi(h(t))^2 + w(t)^2 phi'(h(t))^2]            (= N gamma^2 |grad_theta f|^2, the NTK)

Delta(t) feeds the updates of step t, so the recurrences are marched in t with the expectation taken by a
tensor-product Gauss-Hermite rule (``nodes`` per axis; the integrand is smooth but varies quickly in the tails
of w(0) under strong momentum, so the rule converges algebraically: at beta = 0.9, gamma = 1.5, T = 12, K moves
by 4e-3 from 64 to 128 nodes and by 2e-4 from 128 to 256, the default) or by Monte Carlo over ``samples``
neurons (antithetic pairs (h, w), (-h, -w), standard errors over 16 groups).  With beta = lam = 0 and lr = 1
these are the equations of ``specs/two_layer.dmft``
(h = u + gamma sum_{s<t} eta Delta(s) g(s), z = r + gamma sum_{s<t} eta Delta(s) phi(h(s)), g = phi'(h) z).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["SgdMean", "two_layer_sgd_mean"]


@dataclass(frozen=True)
class SgdMean:
    """Infinite-width trajectories (T,) of Delta, f = f - f(0) and K, and their standard errors (zero for the
    quadrature rule)."""
    Delta: np.ndarray
    f: np.ndarray
    K: np.ndarray
    Delta_se: np.ndarray
    K_se: np.ndarray


def _march(h, w, weights, *, gamma, y, eta, beta, lam, lr, T):
    """Per-group (Delta, f, K) (groups, T) for neuron arrays h, w (groups, M) with weights (M,) summing to 1."""
    base = (w * np.tanh(h)) @ weights
    mh, mw = np.zeros_like(h), np.zeros_like(w)
    out = np.empty((3, h.shape[0], T))
    for t in range(T):
        ph = np.tanh(h)
        dph = 1.0 - ph * ph
        f = ((w * ph) @ weights - base) / gamma
        delta = y - f
        out[0, :, t], out[1, :, t] = delta, f
        out[2, :, t] = (ph * ph + (w * dph) ** 2) @ weights
        d = delta[:, None]
        mh = beta * mh + d * w * dph - (lam / gamma) * h
        mw = beta * mw + d * ph - (lam / gamma) * w
        step = eta * gamma * lr[t]
        h, w = h + step * mh, w + step * mw
    return out


def two_layer_sgd_mean(*, gamma: float, y: float, eta: float, T: int, beta: float = 0.0, lam: float = 0.0,
                       lr=None, nodes: int = 256, samples: int | None = None, seed: int = 0) -> SgdMean:
    """The infinite-width Delta(t), f(t), K(t), t = 0..T-1 (module doc).  ``lr``: None (1), a number or T per-step
    factors.  ``samples`` None: Gauss-Hermite quadrature with ``nodes`` per axis; else Monte Carlo over
    ``samples`` neurons (rounded up to a multiple of 32) from np.random.default_rng(seed)."""
    from dmftc.errors import ParameterError

    T = int(T)
    if T < 1 or not all(math.isfinite(float(v)) for v in (gamma, y, eta, beta, lam)) or gamma <= 0:
        raise ParameterError(f"two_layer_sgd_mean: need T >= 1, gamma > 0 and finite parameters "
                             f"(T={T}, gamma={gamma}, y={y}, eta={eta}, beta={beta}, lam={lam})")
    lr = np.ones(T) if lr is None else np.broadcast_to(np.asarray(lr, float), (T,)) if np.ndim(lr) == 0 \
        else np.asarray(lr, float)
    if lr.shape != (T,):
        raise ParameterError(f"lr must be a number or T = {T} per-step factors, got shape {lr.shape}")
    kw = dict(gamma=float(gamma), y=float(y), eta=float(eta), beta=float(beta), lam=float(lam), lr=lr, T=T)
    if samples is None:
        x, wq = np.polynomial.hermite_e.hermegauss(int(nodes))       # probabilists' Hermite: weight exp(-x^2/2)
        wq = wq / wq.sum()
        h, w = np.meshgrid(x, x, indexing="ij")
        out = _march(h.reshape(1, -1), w.reshape(1, -1), np.outer(wq, wq).reshape(-1), **kw)[:, 0]
        zero = np.zeros(T)
        return SgdMean(Delta=out[0], f=out[1], K=out[2], Delta_se=zero, K_se=zero)
    groups = 16
    half = -(-int(samples) // (2 * groups))
    z = np.random.default_rng(seed).standard_normal((2, groups, half))
    h, w = np.concatenate([z[0], -z[0]], axis=1), np.concatenate([z[1], -z[1]], axis=1)
    out = _march(h, w, np.full(2 * half, 1.0 / (2 * half)), **kw)
    mean, se = out.mean(axis=1), out.std(axis=1, ddof=1) / math.sqrt(groups)
    return SgdMean(Delta=mean[0], f=mean[1], K=mean[2], Delta_se=se[0], K_se=se[2])
