"""Ground-truth ensembles of finite-width two-layer networks trained by discrete GD.

This is the *exact* network (no DMFT approximation) in the mean-field / muP
parameterisation of Bordelon & Pehlevan (NeurIPS 2023), used to validate DMFT
solvers by brute-force simulation.

Parameterisation (width N, input dim D, P training + Q test points)::

    h_{i,a} = W_i . x_a / sqrt(D),        W_ij, w_i ~ N(0, 1) iid at t = 0
    f_a     = (1 / (gamma N)) sum_i w_i phi(h_{i,a})
    ftilde_a(t) = f_a(t) - f_a(0)          (background subtraction)
    Delta_mu    = y_mu - ftilde_mu,        L = 1/2 sum_{mu<P} Delta_mu^2

Inputs enter only through Kx_all[a, b] = x_a . x_b / D; we build X (n x D) with
D = n = P + Q from the eigendecomposition Kx = U diag(lam) U^T (negative round-off
eigenvalues clipped to 0) as X = U diag(sqrt(D lam)), so X X^T / D = Kx.

Gradient descent with learning rate eta N gamma^2, theta <- theta - eta N gamma^2 dL/dtheta.
Since dL/dtheta = -sum_mu Delta_mu df_mu/dtheta, df_mu/dw_i = phi(h_{i,mu}) / (gamma N) and
df_mu/dW_i = w_i phi'(h_{i,mu}) x_mu / (gamma N sqrt(D)), the simultaneous update is::

    g_{i,mu} = phi'(h_{i,mu}) w_i
    W_i <- W_i + eta gamma sum_mu Delta_mu g_{i,mu} x_mu / sqrt(D)
    w_i <- w_i + eta gamma sum_mu Delta_mu phi(h_{i,mu})

(both right-hand sides evaluated at the old parameters).  Recorded at steps
t = 0..T-1, each *before* the t-th update (t = 0 is initialisation):

    Delta (P,), f = ftilde (P+Q,),
    K_ab = (1/N) sum_i [phi(h_ia) phi(h_ib) + w_i^2 phi'(h_ia) phi'(h_ib) Kx_ab]
         = N gamma^2 grad_theta f_a . grad_theta f_b          (empirical NTK),
    M_a  = (1/N) sum_i w_i h_ia                               (used for linear nets).

Activations: 'tanh', 'relu' (= sqrt(2) max(0, h)), 'linear', 'erf'.
Randomness: member m uses the m-th block of N (D + 1) standard normals of
np.random.default_rng(seed) (W_i then w_i for each neuron), so results do not depend
on the batch size used to process members.

Implementation: members are processed in batches (arrays of shape (B, P+Q, N)), each trained by one
jit-compiled JAX program (a scan over the T steps; the last batch padded with copies, so one compiled shape), on a
2-thread pool; all per-member trajectories are stored (E x (P+Q)^2 x T doubles for K)
and reduced to mean / N*var / standard errors at the end.  The arithmetic is the plain
network in float64; nothing is linearised or approximated.
"""
from __future__ import annotations

import math
import operator
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from scipy.special import erf

from dmftc.progress import Progress

__all__ = ["EnsembleStats", "simulate_two_layer", "inputs_from_gram", "draw_parameters",
           "activation_fns", "jax_activation", "pad_copies", "gd_step", "ACTIVATIONS"]

_SQRT2 = math.sqrt(2.0)
_ERF_C = 2.0 / math.sqrt(math.pi)


# Each returns (phi(h), phi'(h)).  Intermediates are named / updated in place on purpose:
# chained numpy expressions on large temporaries were ~10x slower on the target machine.
def _tanh(h):
    p = np.tanh(h)
    dp = p * p
    np.subtract(1.0, dp, out=dp)
    return p, dp


def _relu(h):
    dp = (h > 0).astype(np.float64)
    dp *= _SQRT2
    p = h * dp
    return p, dp


def _linear(h):
    return h, np.ones_like(h)


def _erf(h):
    dp = h * h
    np.negative(dp, out=dp)
    np.exp(dp, out=dp)
    dp *= _ERF_C
    return erf(h), dp


ACTIVATIONS = {"tanh": _tanh, "relu": _relu, "linear": _linear, "erf": _erf}
QUANTITIES = ("Delta", "f", "K", "M")


def activation_fns(activation):
    """h -> (phi(h), phi'(h)) in numpy.  The simulators' own in-place implementations for 'tanh', 'relu'
    (sqrt(2) max(0, h)), 'linear' and 'erf'; any other activation (an expression in h such as 'sin(h)', or a
    :class:`dmftc.runtime.problem.activation.SiteActivation`) through :mod:`dmftc.runtime.problem.activation`, jit-compiled."""
    if isinstance(activation, str) and activation in ACTIVATIONS:
        return ACTIVATIONS[activation]
    import jax

    fn = jax.jit(_jax_activation(activation))

    def phi_dphi(h):
        p, d = fn(h)
        return np.array(p), np.array(d)

    return phi_dphi


@dataclass(frozen=True)
class EnsembleStats:
    """Ensemble statistics; every array has time on its last axis."""
    N: int
    E: int
    eta: float
    T: int
    times: np.ndarray                 # (T,) = eta * arange(T)
    mean: dict[str, np.ndarray]       # ensemble mean
    nvar: dict[str, np.ndarray]       # N * ensemble variance (ddof=1)
    mean_se: dict[str, np.ndarray]    # standard error of `mean`
    nvar_se: dict[str, np.ndarray]    # standard error of `nvar` (from the 4th moment)
    samples: dict[str, np.ndarray] | None = None   # raw trajectories, leading E axis


def inputs_from_gram(Kx_all) -> np.ndarray:
    """Validate Kx_all and return X (n, D=n) with X X^T / D equal to Kx_all (PSD-clipped)."""
    Kx = np.asarray(Kx_all, dtype=np.float64)
    if Kx.ndim != 2 or Kx.shape[0] != Kx.shape[1] or Kx.shape[0] == 0:
        raise ValueError(f"Kx_all must be a non-empty square matrix, got shape {Kx.shape}")
    if not np.all(np.isfinite(Kx)):
        raise ValueError("Kx_all must be finite")
    scale = max(1.0, float(np.max(np.abs(Kx))))
    if not np.allclose(Kx, Kx.T, rtol=0.0, atol=1e-12 * scale):
        raise ValueError("Kx_all must be symmetric")
    lam, U = np.linalg.eigh(0.5 * (Kx + Kx.T))
    if lam.min() < -1e-10 * scale:
        raise ValueError(f"Kx_all must be positive semi-definite (min eigenvalue {lam.min():.3g})")
    D = Kx.shape[0]
    return U * np.sqrt(D * np.clip(lam, 0.0, None))


def draw_parameters(rng: np.random.Generator, n_members: int, N: int, D: int):
    """Draw (W, w) of shapes (n_members, N, D), (n_members, N) from the next block of rng."""
    z = rng.standard_normal((n_members, N, D + 1))
    return np.ascontiguousarray(z[..., :D]), np.ascontiguousarray(z[..., D])


# Internally the first-layer weights are stored transposed, Wt[b, d, i] = W[b, i, d], and all
# per-neuron arrays have the neuron index last, e.g. h[b, a, i].  The whole training of a batch of members is one
# jit-compiled program (a lax.scan over the steps, compiled at XLA's default optimisation: it runs long against
# its compilation); the step is written once, in JAX, and :func:`gd_step` runs the same step.

def jax_activation(activation):
    """h -> (phi(h), phi'(h)) as one elementwise JAX function, for every compiled ensemble (these and the optax
    networks of :mod:`dmftc.validation.optax_nets`): one of the four names of :data:`ACTIVATIONS` or a JAX
    function of h (phi' by forward-mode autodiff), or an expression in h or a SiteActivation (its own phi', through
    :mod:`dmftc.runtime.problem.activation`, whose ParameterError a bad one raises)."""
    import jax
    import jax.numpy as jnp

    table = {"tanh": jnp.tanh, "linear": lambda h: h, "erf": jax.scipy.special.erf,
             "relu": lambda h: jnp.where(h > 0, _SQRT2 * h, 0.0)}
    if isinstance(activation, str) and activation in table:
        phi = table[activation]
    elif callable(activation) and not hasattr(activation, "fn"):
        phi = activation
    else:
        from dmftc.runtime.problem.activation import as_activation
        phi, dphi = (as_activation(activation).derivative(k) for k in (0, 1))
        return lambda h: (phi(h), dphi(h))
    return lambda h: jax.jvp(phi, (h,), (jnp.ones_like(h),))


def _jax_activation(activation):
    """:func:`jax_activation`, a bad activation reported as ValueError as everywhere in these simulators."""
    from dmftc.errors import ParameterError

    try:
        return jax_activation(activation)
    except ParameterError as err:
        raise ValueError(str(err)) from None


def _step(act, Wt, w, XsT, XpT, Kx, y, f0, gamma, eta):
    """One recorded step of a batch: the records (Delta, ftilde, K, M) before the update, and the updated (Wt, w)
    (module doc).  Wt (B, D, N), w (B, N), XsT = X / sqrt(D) (n, D), XpT = X_P^T / sqrt(D) (D, P); f0 (B, n)
    the outputs at initialisation (None: these are)."""
    import jax.numpy as jnp

    N, P = w.shape[-1], y.shape[0]
    h = XsT @ Wt                                                  # (B, n, N) = W x_a / sqrt(D)
    ph, dph = act(h)
    g = dph * w[:, None, :]                                       # phi'(h) w
    f = jnp.einsum("ban,bn->ba", ph, w) / (gamma * N)
    ft = f - (f if f0 is None else f0)
    delta = y - ft[:, :P]
    K = (jnp.einsum("ban,bcn->bac", ph, ph) + jnp.einsum("ban,bcn->bac", g, g) * Kx) / N
    M = jnp.einsum("ban,bn->ba", h, w) / N
    Wn = Wt + (eta * gamma) * jnp.einsum("dp,bpn->bdn", XpT, g[:, :P, :] * delta[:, :, None])
    wn = w + (eta * gamma) * jnp.einsum("bp,bpn->bn", delta, ph[:, :P, :])
    return (delta, ft, K, M), (Wn, wn), f


_TRAINERS: dict = {}


def _trainer(activation, T: int):
    """jit((Wt, w, XsT, XpT, Kx, y, gamma, eta) -> records (Delta, f, K, M), each (T, B, ...)) of a batch."""
    act = _jax_activation(activation)              # a bad activation is reported here, before any work
    # keyed by the activation itself (a name, a function, a SiteActivation: all hashable, and held by the key),
    # never by id: a freed object's id can be reused
    key = (activation, T)
    if key not in _TRAINERS:
        import jax
        from dmftc.jax_setup import long_run_options

        def train(Wt, w, XsT, XpT, Kx, y, gamma, eta):
            rec0, carry, f0 = _step(act, Wt, w, XsT, XpT, Kx, y, None, gamma, eta)    # t = 0: ftilde = 0 exactly

            def body(carry, _):
                rec, carry, _f = _step(act, *carry, XsT, XpT, Kx, y, f0, gamma, eta)
                return carry, rec

            recs = jax.lax.scan(body, carry, None, length=T - 1)[1]
            return tuple(jax.numpy.concatenate([a[None], b]) for a, b in zip(rec0, recs))

        _TRAINERS[key] = jax.jit(train, compiler_options=long_run_options())
    return _TRAINERS[key]


def gd_step(W, w, X, y, f0, *, activation: str, gamma: float, eta: float):
    """One discrete GD step for a batch of networks, W (B,N,D), w (B,N), X (n,D).

    f0 (B, n) is the output at initialisation (background); y has shape (P,).
    Returns (W_new, w_new). The step of `simulate_two_layer` (:func:`_step`), run eagerly.
    """
    import jax.numpy as jnp

    W, w, X = (np.asarray(a, dtype=np.float64) for a in (W, w, X))
    D = X.shape[1]
    P = np.asarray(y).shape[0]
    _, (Wt, wn), _ = _step(_jax_activation(activation), jnp.asarray(W.transpose(0, 2, 1)), jnp.asarray(w),
                           jnp.asarray(X / math.sqrt(D)), jnp.asarray(X[:P].T / math.sqrt(D)), jnp.asarray(X @ X.T / D),
                           jnp.asarray(y, dtype=jnp.float64), jnp.asarray(f0), gamma, eta)
    return np.asarray(Wt).transpose(0, 2, 1), np.asarray(wn)


def _run_batch(train, W, w, XsT, XpT, Kx, y, gamma, eta, out, sl):
    """Train one batch of members (padded to the batch shape) and write its first sl.stop - sl.start members'
    records into out[q][sl, ..., t]."""
    recs = train(np.ascontiguousarray(W.transpose(0, 2, 1)), w, XsT, XpT, Kx, y, gamma, eta)
    k = sl.stop - sl.start
    for q, r in zip(QUANTITIES, recs):
        out[q][sl] = np.moveaxis(np.asarray(r), 0, -1)[:k]


def summarise(x: np.ndarray, N: int):
    """mean, N*var (ddof=1) and their standard errors over axis 0, in memory-bounded chunks."""
    E = x.shape[0]
    flat = x.reshape(E, -1)
    res = [np.empty(flat.shape[1]) for _ in range(4)]
    step = max(1, (1 << 22) // E)
    for j in range(0, flat.shape[1], step):
        c = flat[:, j:j + step]
        m = c.mean(axis=0)
        d2 = (c - m) ** 2
        s2 = d2.sum(axis=0) / (E - 1)
        m4 = (d2 * d2).mean(axis=0)
        # Var(s^2) ~ (m4 - (E-3)/(E-1) s^4) / E  (clipped at 0 against sampling noise)
        var_s2 = np.clip((m4 - (E - 3) / (E - 1) * s2 * s2) / E, 0.0, None)
        for r, v in zip(res, (m, N * s2, np.sqrt(s2 / E), N * np.sqrt(var_s2))):
            r[j:j + step] = v
    return [r.reshape(x.shape[1:]) for r in res]


def pad_copies(a: np.ndarray, size: int) -> np.ndarray:
    """``a`` with its leading axis (members) padded to ``size`` by copies of its last member: the last batch of an
    ensemble takes the compiled shape of the others, and the copies' records are dropped."""
    n = a.shape[0]
    return a if n >= size else np.concatenate([a, np.repeat(a[-1:], size - n, axis=0)])


def positive_int(name, value, minimum=1, error=ValueError):
    """``value`` as an int >= ``minimum`` (bools refused), else ``error`` naming ``name``."""
    try:
        v = operator.index(value)
    except TypeError:
        raise error(f"{name} must be an integer, got {value!r}") from None
    if isinstance(value, bool) or v < minimum:
        raise error(f"{name} must be an integer >= {minimum}, got {value!r}")
    return v


def simulate_two_layer(*, activation: str, Kx_all: np.ndarray, y: np.ndarray, gamma: float,
                       eta: float, T: int, N: int, E: int, seed: int = 0,
                       batch: int | None = None, keep_samples: bool = False,
                       progress: bool = False) -> EnsembleStats:
    """Train E independent width-N two-layer networks for T recorded steps (see module doc).

    ``progress`` draws a progress bar (members trained) on stderr.

    Returns ensemble means, N * variances and their standard errors for
    "Delta" (P, T), "f" (P+Q, T), "K" (P+Q, P+Q, T) and "M" (P+Q, T).
    """
    T = positive_int("T", T)
    train = _trainer(activation, T)                 # a bad activation is reported before any work
    X = inputs_from_gram(Kx_all)
    n, D = X.shape
    Kx = X @ X.T / D            # equals Kx_all up to the PSD clipping
    y = np.asarray(y, dtype=np.float64)
    if y.ndim != 1 or not 1 <= y.shape[0] <= n:
        raise ValueError(f"y must be a 1-d array with 1 <= P <= {n} entries, got shape {y.shape}")
    if not np.all(np.isfinite(y)):
        raise ValueError("y must be finite")
    gamma, eta = float(gamma), float(eta)
    if not (math.isfinite(gamma) and gamma > 0):
        raise ValueError(f"gamma must be positive and finite, got {gamma}")
    if not (math.isfinite(eta) and eta >= 0):
        raise ValueError(f"eta must be non-negative and finite, got {eta}")
    N = positive_int("N", N)
    E = positive_int("E", E, 2)
    if batch is None:   # ~128k doubles (1 MB) per (B, n, N) work array
        batch = max(1, min(E, (1 << 17) // (N * n)))
    batch = positive_int("batch", batch)
    P = y.shape[0]
    XsT, XpT = X / math.sqrt(D), X[:P].T / math.sqrt(D)

    shapes = {"Delta": (P,), "f": (n,), "K": (n, n), "M": (n,)}
    out = {q: np.empty((E, *s, T)) for q, s in shapes.items()}
    # Parameters are drawn sequentially in member order in this thread (so results do not
    # depend on `batch`); batches run on a small thread pool (compiled JAX calls release the GIL) and
    # write disjoint slices of `out`.  At most 2 * workers batches are in flight.
    rng = np.random.default_rng(seed)
    workers = max(1, min(2, os.cpu_count() or 1, -(-E // batch)))
    with ThreadPoolExecutor(max_workers=workers) as pool, \
            Progress(f"ensemble N={N}", E, enabled=progress) as bar:
        pending = []
        for b0 in range(0, E, batch):
            sl = slice(b0, min(E, b0 + batch))
            W, w = (pad_copies(a, batch) for a in draw_parameters(rng, sl.stop - sl.start, N, D))
            pending.append((sl, pool.submit(_run_batch, train, W, w, XsT, XpT, Kx, y, gamma, eta, out, sl)))
            while len(pending) > 2 * workers:
                done, fut = pending.pop(0)
                fut.result()
                bar.advance(done.stop - done.start, note="members")
        for done, fut in pending:
            fut.result()
            bar.advance(done.stop - done.start, note="members")

    stats = {q: summarise(out[q], N) for q in QUANTITIES}
    pick = lambda k: {q: stats[q][k] for q in QUANTITIES}  # noqa: E731
    return EnsembleStats(N=N, E=E, eta=eta, T=T, times=eta * np.arange(T),
                         mean=pick(0), nvar=pick(1), mean_se=pick(2), nvar_se=pick(3),
                         samples=out if keep_samples else None)
