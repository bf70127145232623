"""Checks of the arguments of :mod:`dmftc.validation.optax_nets`, the default optimiser (:func:`sgd`), the
activations and the members' random draws."""
from __future__ import annotations

import math

import numpy as np

from dmftc.errors import ParameterError
from dmftc.validation.ensemble import inputs_from_gram, jax_activation, positive_int

__all__ = ["LOSSES", "check_int", "check_real", "schedule_factors", "sgd", "activation_pair", "design",
           "draw_members"]

LOSSES = ("squared", "softmax")


def check_int(name, value, minimum):
    return positive_int(name, value, minimum, error=ParameterError)


def check_real(name, value, *, positive=False, nonneg=False):
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ParameterError(f"{name} must be a real number, got {value!r}") from None
    if not math.isfinite(v) or (positive and not v > 0) or (nonneg and not v >= 0):
        kind = "positive and finite" if positive else "non-negative and finite" if nonneg else "finite"
        raise ParameterError(f"{name} must be {kind}, got {value!r}")
    return v


def schedule_factors(lr, T):
    """The per-step factors lr[0..T-1] (None: all 1)."""
    if lr is None:
        return np.ones(T)
    a = np.asarray(lr, dtype=float)
    if a.ndim == 0:
        a = np.full(T, float(a))
    if a.shape != (T,) or not np.all(np.isfinite(a)):
        raise ParameterError(f"lr must be a finite number or T = {T} per-step factors, got shape {a.shape}")
    return a


def sgd(N: int, *, gamma: float, eta: float, beta: float = 0.0, lam: float = 0.0, lr=None, T: int | None = None):
    """The issue's optimiser at width N: ``optax.chain(optax.add_decayed_weights(lam / (N gamma^2)),
    optax.sgd(learning_rate=lambda t: eta N gamma^2 lr[t], momentum=beta))``; ``lr`` None (factor 1), a number,
    or T per-step factors (the update t uses lr[t]; later updates the last)."""
    import jax.numpy as jnp
    import optax

    N = check_int("N", N, 1)
    gamma = check_real("gamma", gamma, positive=True)
    eta = check_real("eta", eta, nonneg=True)
    beta = check_real("beta", beta, nonneg=True)
    lam = check_real("lam", lam, nonneg=True)
    if lr is None:
        rate = eta * N * gamma ** 2
    else:
        if T is None:
            T = np.size(lr)
        factors = jnp.asarray(schedule_factors(lr, check_int("T", T, 1)))
        rate = lambda t: eta * N * gamma ** 2 * factors[jnp.minimum(t, factors.shape[0] - 1)]  # noqa: E731
    return optax.chain(optax.add_decayed_weights(lam / (N * gamma ** 2)),
                       optax.sgd(learning_rate=rate, momentum=beta if beta > 0 else None))


def activation_pair(activation):
    """(phi, phi') as elementwise jax functions (:func:`dmftc.validation.ensemble.jax_activation`: phi' by
    forward-mode autodiff of phi, or a SiteActivation's own)."""
    pair = jax_activation(activation)
    return (lambda h: pair(h)[0]), (lambda h: pair(h)[1])


def design(y, Kx, input_norm, loss):
    """(X (P, D), Kx (P, P), y (P, C), vector, C or None)."""
    if loss not in LOSSES:
        raise ParameterError(f"loss must be one of {LOSSES}, got {loss!r}")
    if Kx is None:
        x = math.sqrt(check_real("input_norm", input_norm, positive=True))
        X, vector = np.array([[x]]), False
    else:
        if input_norm != 1.0:
            raise ParameterError("give either input_norm (one point) or Kx (P points), not both")
        try:
            X = inputs_from_gram(Kx)
        except ValueError as err:
            raise ParameterError(f"Kx: {err}") from None
        vector = True
    P = X.shape[0]
    y = np.asarray(y, dtype=float)
    if loss == "softmax":
        want = "(C,) one-hot on one point" if not vector else f"({P}, C) one-hot"
        yy = y.reshape(1, -1) if (not vector and y.ndim == 1) else y
        if yy.ndim != 2 or yy.shape[0] != P or yy.shape[1] < 2:
            raise ParameterError(f"softmax cross-entropy needs targets y of shape {want} with C >= 2 classes, "
                                 f"got shape {y.shape}")
        if np.any(yy < 0) or not np.allclose(yy.sum(axis=1), 1.0):
            raise ParameterError("softmax cross-entropy needs targets y whose rows are probabilities (one-hot)")
        y, C = yy, yy.shape[1]
    else:
        want = f"({P},) or ({P}, C)" if vector else "a number (or (C,))"
        if vector and y.ndim in (1, 2) and y.shape[0] == P and y.size >= 1:
            C = y.shape[1] if y.ndim == 2 else None
        elif not vector and y.ndim in (0, 1) and y.size >= 1:
            C = y.size if y.ndim == 1 else None
        else:
            raise ParameterError(f"y must have one target per point: {want}, got shape {y.shape}")
        y = y.reshape(P, -1)
    if not np.all(np.isfinite(y)):
        raise ParameterError("y must be finite")
    return X, X @ X.T / X.shape[1], y, vector, C


def draw_members(rng, n, N, L, D, C):
    """n members' (W0 (n,N,D), w (n,N,C), Ws (n,L-1,N,N)) in the module's layout."""
    z = rng.standard_normal((n, N * (D + C) + (L - 1) * N * N))
    first = z[:, :N * (D + C)].reshape(n, N, D + C)
    return first[..., :D], first[..., D:], z[:, N * (D + C):].reshape(n, L - 1, N, N)
