"""Training the members with optax (one jit-compiled, jax.vmap-ed program per chunk) and their statistics; the
network and the records: :mod:`dmftc.validation.optax_nets`."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dmftc.errors import NumericalError, ParameterError
from dmftc.jax_setup import long_run_options
from dmftc.validation.ensemble import pad_copies, summarise
from dmftc.validation.extrapolate import richardson
from dmftc.validation.optax_nets.inputs import (activation_pair, check_int, check_real, design, draw_members,
                                                schedule_factors, sgd)

__all__ = ["OptaxEnsembleStats", "simulate_optax", "optax_truth", "richardson", "optax_names"]


def optax_names(L: int) -> tuple[str, ...]:
    """Recorded quantities: 'Delta', 'f', 'K', 'Phi[1]'..'Phi[L]', 'G[1]'..'G[L]'."""
    return ("Delta", "f", "K", *(f"Phi[{l}]" for l in range(1, L + 1)), *(f"G[{l}]" for l in range(1, L + 1)))


@dataclass(frozen=True)
class OptaxEnsembleStats:
    """Ensemble statistics, time on the last axis (the layout of :class:`dmftc.validation.ensemble.EnsembleStats`,
    accepted by :func:`dmftc.validation.truth_dataset`): ``mean``, ``nvar`` (N Var, ddof = 1) and their standard
    errors; ``samples`` the per-member records (E, ..., T) or None; ``index``: each record family's index dims
    (mu, nu the points, c, d the classes), which :func:`dmftc.validation.truth_dataset` uses."""
    N: int
    E: int
    T: int
    L: int
    C: int | None
    eta: float
    times: np.ndarray
    mean: dict
    nvar: dict
    mean_se: dict
    nvar_se: dict
    index: dict | None = None
    samples: dict | None = None


def index_dims(vector: bool, C) -> dict:
    """Index dims of the records: points mu, nu when there are several, classes c, d for C outputs."""
    p, c = (["mu"] if vector else []), (["c"] if C is not None else [])
    q, d = (["nu"] if vector else []), (["d"] if C is not None else [])
    pair = p + c + q + d
    return {"Delta": p + c, "f": p + c, "K": pair, "G": pair, "Phi": p + q}


# ----------------------------------------------------------------------------- checks
def _trainer(phi, dphi, L, N, gamma, X, Kx, y, loss, optimizer, T):
    """jit(vmap(member -> records (T, ...))) for params {W0, w, Ws}."""
    import jax
    import jax.numpy as jnp
    import optax

    X, Kx, y = (jnp.asarray(a) for a in (X, Kx, y))
    C = y.shape[1]
    sD, sN = math.sqrt(X.shape[1]), math.sqrt(N)

    def forward(p):
        hs = [(X / sD) @ p["W0"].T]
        for l in range(L - 1):
            hs.append(phi(hs[-1]) @ p["Ws"][l].T / sN)
        return phi(hs[-1]) @ p["w"] / (gamma * N), hs

    def signal(ft):
        return y - ft if loss == "squared" else y - jax.nn.softmax(ft, axis=-1)

    def objective(p, f0):
        ft = forward(p)[0] - f0
        if loss == "squared":
            return 0.5 * jnp.sum((y - ft) ** 2)
        return -jnp.sum(y * jax.nn.log_softmax(ft, axis=-1))

    def records(p, f0):
        f, hs = forward(p)
        ft = f - f0
        phis = [phi(h) for h in hs]
        g = dphi(hs[-1])[:, None, :] * p["w"].T[None]                    # (P, C, N)
        gs = [g]
        for l in range(L - 1, 0, -1):
            g = dphi(hs[l - 1])[:, None, :] * (g @ p["Ws"][l - 1]) / sN
            gs.append(g)
        gs = gs[::-1]
        Phi = [jnp.einsum("pn,qn->pq", a, a) / N for a in phis]
        G = [jnp.einsum("pcn,qdn->pcqd", a, a) / N for a in gs]
        K = G[0] * Kx[:, None, :, None] + Phi[-1][:, None, :, None] * jnp.eye(C)[None, :, None, :]
        for l in range(1, L):
            K = K + G[l] * Phi[l - 1][:, None, :, None]
        return {"Delta": signal(ft), "f": ft, "K": K,
                **{f"Phi[{l + 1}]": v for l, v in enumerate(Phi)}, **{f"G[{l + 1}]": v for l, v in enumerate(G)}}

    def member(p):
        f0 = forward(p)[0]

        def step(carry, _):
            p, state = carry
            rec = records(p, f0)
            grads = jax.grad(objective)(p, f0)
            updates, state = optimizer.update(grads, state, p)
            return (optax.apply_updates(p, updates), state), rec

        return jax.lax.scan(step, (p, optimizer.init(p)), None, length=T)[1]

    return jax.jit(jax.vmap(member), compiler_options=long_run_options())


def simulate_optax(*, gamma: float, y, eta: float, T: int, N: int, E: int, L: int = 1, Kx=None,
                   input_norm: float = 1.0, activation="tanh", loss: str = "squared", beta: float = 0.0,
                   lam: float = 0.0, lr=None, optimizer=None, seed: int = 0, chunk: int | None = None,
                   keep_samples: bool = False) -> OptaxEnsembleStats:
    """Train E width-N networks (module doc) for T recorded steps with optax.

    ``Kx`` (P, P): the Gram matrix x_mu . x_nu / D of P training points (None: one point, |x|^2 / D =
    ``input_norm``); ``y``: targets (P,) (scalar outputs), (P, C) (C outputs), one-hot (P, C) for ``loss`` =
    'softmax'.  ``optimizer``: None for :func:`sgd` with ``eta, beta, lam, lr``; else an optax
    GradientTransformation, or a callable N -> GradientTransformation (needed for the 1/N extrapolation of
    :func:`optax_truth`, since the mean-field step size scales with N); ``eta`` then only sets ``times``.
    ``activation``: 'tanh', 'relu' (sqrt(2) max(0, h)), 'linear', 'erf', an expression in h, or a jax function.
    ``chunk``: members per compiled call (default ~32 MB of records per chunk)."""
    import jax
    import jax.numpy as jnp

    L, N, E, T = check_int("L", L, 1), check_int("N", N, 1), check_int("E", E, 2), check_int("T", T, 1)
    seed = check_int("seed", seed, 0)
    gamma = check_real("gamma", gamma, positive=True)
    eta = check_real("eta", eta, nonneg=True)
    X, Kxm, ym, vector, C = design(y, Kx, input_norm, loss)
    if optimizer is None:
        optimizer = sgd(N, gamma=gamma, eta=eta, beta=beta, lam=lam, lr=None if lr is None else schedule_factors(lr, T),
                        T=T)
    else:
        if beta != 0.0 or lam != 0.0 or lr is not None:
            raise ParameterError("give either optimizer or beta / lam / lr (which build the default optimizer)")
        if not hasattr(optimizer, "update"):
            optimizer = optimizer(N) if callable(optimizer) else optimizer
        if not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
            raise ParameterError(f"optimizer must be an optax GradientTransformation or N -> one, got {optimizer!r}")
    phi, dphi = activation_pair(activation)
    P, D = X.shape
    Cw = ym.shape[1]
    names = optax_names(L)
    per_member = T * (2 * L + 3) * (P * Cw) ** 2 + 4 * ((L - 1) * N * N + N * (D + Cw))
    chunk = check_int("chunk", chunk, 1) if chunk is not None else max(1, min(E, (1 << 22) // per_member))
    train = _trainer(phi, dphi, L, N, gamma, X, Kxm, ym, loss, optimizer, T)

    rng = np.random.default_rng(seed)
    out = {}
    for b0 in range(0, E, chunk):
        n = min(chunk, E - b0)
        W0, w, Ws = draw_members(rng, n, N, L, D, Cw)
        params = {"W0": jnp.asarray(pad_copies(W0, chunk)), "w": jnp.asarray(pad_copies(w, chunk)),
                  "Ws": jnp.asarray(pad_copies(Ws, chunk))}
        rec = jax.device_get(train(params))
        for q in names:
            if q not in out:
                out[q] = np.empty((E,) + rec[q].shape[1:])
            out[q][b0:b0 + n] = rec[q][:n]
    if not all(np.all(np.isfinite(v)) for v in out.values()):
        raise NumericalError(f"simulate_optax: non-finite records: training diverged; reduce eta (= {eta}) or "
                             "the optimiser's step size")

    def shaped(q, v):                      # (E, T, ...) -> the singleton point / class axes dropped, time last
        kinds = "pp" if q.startswith("Phi") else "pc" if q in ("Delta", "f") else "pcpc"
        drop = ("c" if C is None else "") + ("" if vector else "p")
        v = v[(slice(None), slice(None)) + tuple(0 if k in drop else slice(None) for k in kinds)]
        return np.ascontiguousarray(np.moveaxis(v, 1, -1))

    out = {q: shaped(q, v) for q, v in out.items()}
    stats = {q: summarise(out[q], N) for q in names}
    pick = lambda k: {q: stats[q][k] for q in names}                     # noqa: E731
    return OptaxEnsembleStats(N=N, E=E, T=T, L=L, C=C, eta=eta, times=eta * np.arange(T), mean=pick(0),
                              nvar=pick(1), mean_se=pick(2), nvar_se=pick(3), index=index_dims(vector, C),
                              samples=out if keep_samples else None)


def optax_truth(*, N: int, seed: int = 0, extrapolate: bool = True, **kw) -> OptaxEnsembleStats:
    """Ground truth with the O(1/N) corrections removed, as :func:`dmftc.validation.deep_ensemble.deep_truth`:
    ensembles at widths N (``seed``) and 2N (``seed + 1``) combined by :func:`richardson`; without
    ``extrapolate``, :func:`simulate_optax` at width N.  ``kw``: the arguments of :func:`simulate_optax`."""
    a = simulate_optax(N=N, seed=seed, **kw)
    if not extrapolate:
        return a
    return richardson(a, simulate_optax(N=2 * N, seed=check_int("seed", seed, 0) + 1, **kw))
