"""Ground truth from the library people train with: finite-width networks trained by optax itself.

The network (width N, L >= 1 hidden layers, mean-field parameterisation, all weights N(0, 1) iid at t = 0)::

    h^1_mu = W^0 x_mu / sqrt(D),     h^{l+1}_mu = W^l phi(h^l_mu) / sqrt(N)      (l = 1..L-1)
    f_mu,c = w_c . phi(h^L_mu) / (gamma N),     ftilde(t) = f(t) - f(0)           (background subtracted)

with W^0 (N, D), W^l (N, N), readouts w (N, C).  The loss is summed over the P training points: the squared
loss 1/2 sum_mu |y_mu - ftilde_mu|^2 (error signal Delta = y - ftilde; scalar outputs when y is (P,)), or the
softmax cross-entropy -sum_mu sum_c y_mu,c log softmax(ftilde_mu)_c on one-hot y (P, C) (Delta_mu,c = y_mu,c -
softmax(ftilde_mu)_c).  Every parameter is trained by an optax GradientTransformation applied to jax.grad of
this loss; by default the optimiser of the issue (:func:`sgd`)::

    optax.chain(optax.add_decayed_weights(lam / (N gamma^2)),
                optax.sgd(learning_rate=lambda t: eta N gamma^2 lr[t], momentum=beta))

(optax's heavy ball: v <- beta v + g, theta <- theta - eta N gamma^2 lr[t] v, t counting updates from 0).
With beta = lam = 0 and lr = 1 this is the plain gradient descent of :mod:`dmftc.validation.ensemble` and
:mod:`dmftc.validation.deep_ensemble` (same loss normalisation, same random draws: the same networks, equal to
round-off; tested).  Records at t = 0..T-1, each taken *before* the t-th update:

    Delta, f = ftilde                  (P,) or (P, C)
    K   = N gamma^2 grad f_mu,c . grad f_nu,c'    the NTK of the points, (P, P) or (P, C, P, C)
    Phi[l] = phi(h^l_mu) . phi(h^l_nu) / N        (P, P),  l = 1..L
    G[l]   = g^l_mu,c . g^l_nu,c' / N             (P, P) or (P, C, P, C),  g^l = gamma N df/dh^l

(the time diagonals of the two-time kernels of :func:`dmftc.validation.deep_ensemble.simulate_deep`).  On one
point (``Kx`` None, |x|^2 / D = ``input_norm``) the point axes are dropped, as there.

Randomness: member m uses the m-th block of N (D + C) + (L - 1) N^2 standard normals of
np.random.default_rng(seed) (neuron i's D input weights then its C readouts, then W^1..W^{L-1} row-major: for
C = 1 the layout of :func:`dmftc.validation.deep_ensemble.draw_deep_parameters`).  Members are trained in
chunks by one jit-compiled, jax.vmap-ed program (``lax.scan`` over the steps); the last chunk is padded with
copies and the copies dropped, so results do not depend on the chunk size.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import numpy as np

from dmftc.errors import ParameterError
from dmftc.validation.ensemble import inputs_from_gram, summarise

__all__ = ["OptaxEnsembleStats", "sgd", "simulate_optax", "optax_truth", "richardson", "optax_names"]

LOSSES = ("squared", "softmax")


def optax_names(L: int) -> tuple[str, ...]:
    """Recorded quantities: 'Delta', 'f', 'K', 'Phi[1]'..'Phi[L]', 'G[1]'..'G[L]'."""
    return ("Delta", "f", "K", *(f"Phi[{l}]" for l in range(1, L + 1)), *(f"G[{l}]" for l in range(1, L + 1)))


@dataclass(frozen=True)
class OptaxEnsembleStats:
    """Ensemble statistics, time on the last axis (the layout of :class:`dmftc.validation.ensemble.EnsembleStats`,
    accepted by :func:`dmftc.validation.truth_dataset`): ``mean``, ``nvar`` (N Var, ddof = 1) and their standard
    errors; ``samples`` the per-member records (E, ..., T) or None."""
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
    samples: dict | None = None


def richardson(a, b):
    """The O(1/N) corrections removed from statistics at widths N (``a``) and 2N (``b``): x = 2 x(2N) - x(N) for
    means and N Var, standard errors sqrt(4 se(2N)^2 + se(N)^2); the result reports width 2N, no samples."""
    rich = lambda x, z: {k: 2 * z[k] - x[k] for k in x}                  # noqa: E731
    err = lambda x, z: {k: np.sqrt(4 * z[k] ** 2 + x[k] ** 2) for k in x}  # noqa: E731
    return OptaxEnsembleStats(N=b.N, E=a.E, T=a.T, L=a.L, C=a.C, eta=a.eta, times=a.times,
                              mean=rich(a.mean, b.mean), nvar=rich(a.nvar, b.nvar),
                              mean_se=err(a.mean_se, b.mean_se), nvar_se=err(a.nvar_se, b.nvar_se))


# ----------------------------------------------------------------------------- checks
def _int(name, value, minimum):
    try:
        v = operator.index(value)
    except TypeError:
        raise ParameterError(f"{name} must be an integer, got {value!r}") from None
    if isinstance(value, bool) or v < minimum:
        raise ParameterError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return v


def _real(name, value, *, positive=False, nonneg=False):
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ParameterError(f"{name} must be a real number, got {value!r}") from None
    if not math.isfinite(v) or (positive and not v > 0) or (nonneg and not v >= 0):
        kind = "positive and finite" if positive else "non-negative and finite" if nonneg else "finite"
        raise ParameterError(f"{name} must be {kind}, got {value!r}")
    return v


def _schedule(lr, T):
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

    N = _int("N", N, 1)
    gamma = _real("gamma", gamma, positive=True)
    eta = _real("eta", eta, nonneg=True)
    beta = _real("beta", beta, nonneg=True)
    lam = _real("lam", lam, nonneg=True)
    if lr is None:
        rate = eta * N * gamma ** 2
    else:
        if T is None:
            T = np.size(lr)
        factors = jnp.asarray(_schedule(lr, _int("T", T, 1)))
        rate = lambda t: eta * N * gamma ** 2 * factors[jnp.minimum(t, factors.shape[0] - 1)]  # noqa: E731
    return optax.chain(optax.add_decayed_weights(lam / (N * gamma ** 2)),
                       optax.sgd(learning_rate=rate, momentum=beta if beta > 0 else None))


def _activation(activation):
    """(phi, phi') as elementwise jax functions; phi' by forward-mode autodiff of phi."""
    import jax
    import jax.numpy as jnp

    table = {"tanh": jnp.tanh, "linear": lambda h: h, "erf": jax.scipy.special.erf,
             "relu": lambda h: jnp.where(h > 0, math.sqrt(2.0) * h, 0.0)}
    if isinstance(activation, str) and activation in table:
        phi = table[activation]
    elif callable(activation) and not hasattr(activation, "fn"):
        phi = activation
    else:
        from dmftc.derive.activation import as_activation
        site = as_activation(activation)
        phi = lambda h: site.fn(h)[0]                                     # noqa: E731
    return phi, lambda h: jax.jvp(phi, (h,), (jnp.ones_like(h),))[1]


def _design(y, Kx, input_norm, loss):
    """(X (P, D), Kx (P, P), y (P, C), vector, C or None)."""
    if loss not in LOSSES:
        raise ParameterError(f"loss must be one of {LOSSES}, got {loss!r}")
    if Kx is None:
        x = math.sqrt(_real("input_norm", input_norm, positive=True))
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
        ok = {0: not vector, 1: vector and y.shape[:1] == (P,), 2: vector and y.shape[0] == P}.get(y.ndim, False)
        if not vector and y.ndim == 1:                         # one point, C outputs
            ok = y.size >= 1
            y = y.reshape(1, -1)
            C = y.shape[1]
        elif not ok:
            raise ParameterError(f"y must have one target per point: shape ({P},) or ({P}, C)"
                                 f"{' (or a number on one point)' if not vector else ''}, got shape {y.shape}")
        else:
            C = y.shape[1] if y.ndim == 2 else None
            y = y.reshape(P, -1)
    if not np.all(np.isfinite(y)):
        raise ParameterError("y must be finite")
    return X, X @ X.T / X.shape[1], y, vector, C


def _draw(rng, n, N, L, D, C):
    """n members' (W0 (n,N,D), w (n,N,C), Ws (n,L-1,N,N)) in the module's layout."""
    z = rng.standard_normal((n, N * (D + C) + (L - 1) * N * N))
    first = z[:, :N * (D + C)].reshape(n, N, D + C)
    return first[..., :D], first[..., D:], z[:, N * (D + C):].reshape(n, L - 1, N, N)


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

    return jax.jit(jax.vmap(member))


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

    L, N, E, T = _int("L", L, 1), _int("N", N, 1), _int("E", E, 2), _int("T", T, 1)
    seed = _int("seed", seed, 0)
    gamma = _real("gamma", gamma, positive=True)
    eta = _real("eta", eta, nonneg=True)
    X, Kxm, ym, vector, C = _design(y, Kx, input_norm, loss)
    if optimizer is None:
        optimizer = sgd(N, gamma=gamma, eta=eta, beta=beta, lam=lam, lr=None if lr is None else _schedule(lr, T),
                        T=T)
    else:
        if beta != 0.0 or lam != 0.0 or lr is not None:
            raise ParameterError("give either optimizer or beta / lam / lr (which build the default optimizer)")
        if not hasattr(optimizer, "update"):
            optimizer = optimizer(N) if callable(optimizer) else optimizer
        if not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
            raise ParameterError(f"optimizer must be an optax GradientTransformation or N -> one, got {optimizer!r}")
    phi, dphi = _activation(activation)
    P, D = X.shape
    Cw = ym.shape[1]
    names = optax_names(L)
    per_member = T * (2 * L + 3) * (P * Cw) ** 2 + 4 * ((L - 1) * N * N + N * (D + Cw))
    chunk = _int("chunk", chunk, 1) if chunk is not None else max(1, min(E, (1 << 22) // per_member))
    train = _trainer(phi, dphi, L, N, gamma, X, Kxm, ym, loss, optimizer, T)

    rng = np.random.default_rng(seed)
    out = {}
    for b0 in range(0, E, chunk):
        n = min(chunk, E - b0)
        W0, w, Ws = _draw(rng, n, N, L, D, Cw)
        pad = lambda a: np.concatenate([a, np.repeat(a[-1:], chunk - n, axis=0)]) if n < chunk else a  # noqa
        params = {"W0": jnp.asarray(pad(W0)), "w": jnp.asarray(pad(w)), "Ws": jnp.asarray(pad(Ws))}
        rec = jax.device_get(train(params))
        for q in names:
            if q not in out:
                out[q] = np.empty((E,) + rec[q].shape[1:])
            out[q][b0:b0 + n] = rec[q][:n]
    if not all(np.all(np.isfinite(v)) for v in out.values()):
        raise ParameterError(f"simulate_optax: non-finite records: training diverged; reduce eta (= {eta}) or "
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
                              nvar=pick(1), mean_se=pick(2), nvar_se=pick(3), samples=out if keep_samples else None)


def optax_truth(*, N: int, seed: int = 0, extrapolate: bool = True, **kw) -> OptaxEnsembleStats:
    """Ground truth with the O(1/N) corrections removed, as :func:`dmftc.validation.deep_ensemble.deep_truth`:
    ensembles at widths N (``seed``) and 2N (``seed + 1``) combined by :func:`richardson`; without
    ``extrapolate``, :func:`simulate_optax` at width N.  ``kw``: the arguments of :func:`simulate_optax`."""
    a = simulate_optax(N=N, seed=seed, **kw)
    if not extrapolate:
        return a
    return richardson(a, simulate_optax(N=2 * N, seed=_int("seed", seed, 0) + 1, **kw))
