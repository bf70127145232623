"""Ground-truth ensembles of finite-width DEEP networks trained by discrete GD.

The exact network (no DMFT approximation), in the
mean-field / muP parameterisation, trained on one point x with |x|^2 = D.  Only
x.x/D = 1 matters, so we take D = 1, x = [1].

Parameterisation (width N, L >= 1 hidden layers; all weights N(0, 1) iid at t = 0)::

    h^1 = W^0 x / sqrt(D) = W^0,        h^{l+1} = W^l phi(h^l) / sqrt(N)   (l = 1..L-1)
    f   = w . phi(h^L) / (gamma N),     ftilde(t) = f(t) - f(0)   (background subtraction)
    Delta(t) = y - ftilde(t),           loss = Delta^2 / 2

with W^0 (N,) (= the N x 1 first layer), W^l (N, N), w (N,).  Gradient signals
g^l = gamma N df/dh^l are g^L = phi'(h^L) * w, g^l = phi'(h^l) * (W^l^T g^{l+1}) / sqrt(N).
A spec's other backward signal (a surrogate derivative a(h) in place of phi'(h), plus a term b(h): the
gradient field g = a(h) z + b(h) of a deep spec) replaces these by g^L = a(h^L) * w + b(h^L) and
g^l = a(h^l) * (W^l^T g^{l+1}) / sqrt(N) + b(h^l); the updates below use g as written (:func:`gradient_fns`).
GD with learning rate eta N gamma^2, theta <- theta - eta N gamma^2 dloss/dtheta, i.e. the
simultaneous update (right-hand sides at the old parameters)::

    w   += eta gamma Delta phi(h^L)
    W^l += eta gamma Delta g^{l+1} phi(h^l)^T / sqrt(N)      (l = 1..L-1)
    W^0 += eta gamma Delta g^1 x / sqrt(D)

Recorded at t = 0..T-1, each *before* the t-th update (t = 0 is initialisation), l = 1..L::

    Phi[l](t,s) = phi(h^l(t)) . phi(h^l(s)) / N,   G[l](t,s) = g^l(t) . g^l(s) / N,
    K(t) = sum_{l=0..L} G[l+1](t,t) Phi[l](t,t)   (Phi[0] = G[L+1] = 1; = N gamma^2 |grad_theta f|^2),
    Delta(t).

Activations as in :mod:`dmftc.validation.ensemble` ('tanh', 'relu' = sqrt(2) max(0, h), 'linear', 'erf').
Randomness: member m uses the m-th block of 2N + (L-1) N^2 standard normals of
np.random.default_rng(seed): first (W^0_i, w_i) interleaved for i = 0..N-1 (the same layout
as :func:`dmftc.validation.ensemble.draw_parameters` with D = 1, so for L = 1 the networks coincide
with :func:`dmftc.validation.ensemble.simulate_two_layer` on Kx_all = [[1]]), then W^1, ..., W^{L-1}
row-major.  Results therefore do not depend on the batch size.

Implementation: the hidden matrices are never rewritten.  Since every update is rank one,
W^l(t) = W^l(0) + (eta gamma / sqrt N) sum_{s<t} Delta(s) g^{l+1}(s) phi(h^l(s))^T exactly, and
W^l(t) v is evaluated as W^l(0) v plus that sum, using the stored histories phi(h^l(s)), g^{l+1}(s)
(needed anyway for the two-time kernels).  This is the same arithmetic as the dense update up
to float round-off (nothing is linearised) and costs two N^2 matrix-vector products per hidden
matrix and step instead of five N^2 passes.  :func:`deep_gd_step` performs the dense update
with the same forward / backward code.  Members run in batches on a 2-thread pool; per-member
time-diagonal trajectories (E, T) are kept, two-time kernels are reduced per batch to mean and
sum of squared deviations and combined in member order (Chan et al.).
"""
from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from dmftc.validation.ensemble import _positive_int, _summarise, activation_fns
from dmftc.errors import NumericalError
from dmftc.progress import Progress

__all__ = ["DeepEnsembleStats", "DeepMeanShift", "simulate_deep", "deep_truth", "deep_mean_shift", "deep_names",
           "draw_deep_parameters", "deep_gd_step", "deep_forward"]


def deep_names(L: int) -> tuple[str, ...]:
    """Recorded quantities: 'Delta', 'K', 'Phi[1]'..'Phi[L]', 'G[1]'..'G[L]'."""
    return ("Delta", "K", *(f"Phi[{l}]" for l in range(1, L + 1)), *(f"G[{l}]" for l in range(1, L + 1)))


@dataclass(frozen=True)
class DeepEnsembleStats:
    """Ensemble statistics.  mean: (T,) for Delta, K and (T, T) two-time kernels for Phi[l], G[l];
    nvar: (T,) N * Var (ddof=1) of the time-diagonal values; se_mean / se_nvar: their standard
    errors (same shapes); samples: per-member time-diagonal trajectories (E, T) or None."""
    N: int
    E: int
    T: int
    L: int
    mean: dict[str, np.ndarray]
    nvar: dict[str, np.ndarray]
    se_mean: dict[str, np.ndarray]
    se_nvar: dict[str, np.ndarray]
    samples: dict[str, np.ndarray] | None = None

    def ncov(self, name_a: str, name_b: str) -> np.ndarray:
        """(T, T) matrix N Cov(a(t), b(s)) over members (ddof=1) of time-diagonal values."""
        if self.samples is None:
            raise ValueError("ncov needs per-member samples: run simulate_deep(..., keep_samples=True) "
                             "(Richardson-extrapolated results carry no samples)")
        for name in (name_a, name_b):
            if name not in self.samples:
                raise ValueError(f"unknown quantity {name!r}; expected one of {list(self.samples)}")
        a = self.samples[name_a] - self.samples[name_a].mean(axis=0)
        b = self.samples[name_b] - self.samples[name_b].mean(axis=0)
        return self.N * (a.T @ b) / (self.E - 1)


def draw_deep_parameters(rng: np.random.Generator, n_members: int, N: int, L: int):
    """Next n_members blocks of rng as (W0 (B,N), w (B,N), [W^1..W^{L-1}] each (B,N,N)).

    W0 and w are fresh arrays; the hidden matrices are views of the drawn block."""
    z = rng.standard_normal((n_members, 2 * N + (L - 1) * N * N))
    W0, w = z[:, 0:2 * N:2].copy(), z[:, 1:2 * N:2].copy()
    hid = z[:, 2 * N:].reshape(n_members, L - 1, N, N)
    return W0, w, [hid[:, k] for k in range(L - 1)]


# Layer l = 1..L is stored at list index l-1.  matvec(l, v) = W^l v and rmatvec(l, v) = W^l^T v
# (l = 1..L-1) abstract over the dense (deep_gd_step) and low-rank (simulator) representations.
def gradient_fns(activation):
    """h -> (phi(h), a(h), b(h)) in numpy: the activation and the coefficients of the backward signal
    g = a(h) z + b(h) (b None for gradient descent, a = phi').  A
    :class:`dmftc.derive.activation.SiteActivation` of a compiled deep spec carries its spec's gradient field
    (e.g. a surrogate derivative); anything else is gradient descent (:func:`activation_fns`)."""
    if getattr(activation, "standard_gradient", True):
        fns = activation_fns(activation)
        return lambda h: fns(h) + (None,)
    import jax

    site = activation
    fn = jax.jit(lambda h: (site.fn(h)[0],) + tuple(site.gradient(h)[k] for k in (0, 4)))
    return lambda h: tuple(np.array(v) for v in fn(h))


def _forward(W0, w, matvec, act, L, gamma, x=1.0):
    """phis, coefs (lists of L arrays (B,N), and of L pairs (a, b) of the backward signal g = a z + b, b None for
    0) and f (B,); input x = [x], D = 1 (|x|^2 / D = x^2).  ``act``: :func:`gradient_fns`."""
    N = W0.shape[1]
    phis, coefs = [], []
    h = W0 if x == 1.0 else W0 * x
    for l in range(1, L + 1):
        p, a, b = act(h)
        phis.append(p)
        coefs.append((a, b))
        if l < L:
            h = matvec(l, p)
            h /= math.sqrt(N)
    f = (phis[-1][:, None, :] @ w[:, :, None])[:, 0, 0] / (gamma * N)
    return phis, coefs, f


def _backward(w, coefs, rmatvec, L):
    """gs: list of L arrays g^l = a(h^l) z^l + b(h^l) (B,N), z^L = w (``coefs``: the pairs (a, b) of _forward)."""
    N = w.shape[1]

    def signal(l, z):
        a, b = coefs[l - 1]
        g = a * z
        if b is not None:
            g += b
        return g

    g = signal(L, w)
    gs = [g]
    for l in range(L - 1, 0, -1):
        z = rmatvec(l, g)
        z /= math.sqrt(N)
        g = signal(l, z)
        gs.append(g)
    return gs[::-1]


def _update_vectors(W0, w, phis, gs, delta, eta, gamma, x=1.0):
    """New (W0, w): W0 + eta gamma Delta g^1 x, w + eta gamma Delta phi(h^L) (same op order as ensemble.py)."""
    dW0 = gs[0] * delta[:, None]
    dW0 *= eta * gamma * x
    dW0 += W0
    dw = phis[-1] * delta[:, None]
    dw *= eta * gamma
    dw += w
    return dW0, dw


def deep_forward(W0, w, Ws, *, activation: str, gamma: float):
    """Dense forward + backward pass: (phis, gs, f) for parameters W0 (B,N), w (B,N), Ws list of (B,N,N)."""
    act = gradient_fns(activation)
    L = len(Ws) + 1
    phis, coefs, f = _forward(W0, w, lambda l, v: (Ws[l - 1] @ v[:, :, None])[:, :, 0], act, L, gamma)
    gs = _backward(w, coefs, lambda l, v: (v[:, None, :] @ Ws[l - 1])[:, 0, :], L)
    return phis, gs, f


def deep_gd_step(W0, w, Ws, y, f0, *, activation: str, gamma: float, eta: float):
    """One dense GD step (module docstring) for a batch; f0 (B,) is the output at initialisation.

    Returns (W0_new, w_new, Ws_new).  Shares the forward/backward code with :func:`simulate_deep`."""
    W0, w = np.asarray(W0, np.float64), np.asarray(w, np.float64)
    Ws = [np.asarray(W, np.float64) for W in Ws]
    N = W0.shape[1]
    phis, gs, f = deep_forward(W0, w, Ws, activation=activation, gamma=gamma)
    delta = y - (f - f0)
    c = eta * gamma * delta / math.sqrt(N)
    Ws_new = [W + c[:, None, None] * gs[l][:, :, None] * phis[l - 1][:, None, :] for l, W in enumerate(Ws, 1)]
    W0n, wn = _update_vectors(W0, w, phis, gs, delta, eta, gamma)
    return W0n, wn, Ws_new


def _run_batch(W0, w, Ws, act, L, gamma, y, eta, T, out, sl, x=1.0):
    """Train one batch for T recorded steps; writes time-diagonal samples into out[name][sl] and
    returns (B, {two-time name: (batch mean (T,T), sum of squared deviations (T,T))})."""
    B, N = W0.shape
    P = [np.zeros((B, T, N)) for _ in range(L)]       # phi(h^l(s))
    G = [np.zeros((B, T, N)) for _ in range(L)]       # g^l(s)
    cs = np.zeros((B, T))                              # eta gamma Delta(s) / sqrt(N)
    t = 0

    def matvec(l, v):    # W^l(t) v = W^l(0) v + sum_{s<t} cs(s) g^{l+1}(s) (phi^l(s) . v)
        a = (Ws[l - 1] @ v[:, :, None])[:, :, 0]
        if t:
            coef = (P[l - 1][:, :t] @ v[:, :, None])[:, :, 0] * cs[:, :t]
            a += (coef[:, None, :] @ G[l][:, :t])[:, 0, :]
        return a

    def rmatvec(l, v):   # W^l(t)^T v = W^l(0)^T v + sum_{s<t} cs(s) phi^l(s) (g^{l+1}(s) . v)
        a = (v[:, None, :] @ Ws[l - 1])[:, 0, :]
        if t:
            coef = (G[l][:, :t] @ v[:, :, None])[:, :, 0] * cs[:, :t]
            a += (coef[:, None, :] @ P[l - 1][:, :t])[:, 0, :]
        return a

    f0 = None
    for t in range(T):
        with np.errstate(over="ignore", invalid="ignore"):   # divergence is detected and reported below
            phis, coefs, f = _forward(W0, w, matvec, act, L, gamma, x)
            gs = _backward(w, coefs, rmatvec, L)
            if f0 is None:
                f0 = f
            delta = y - (f - f0)
            K = np.einsum("bn,bn->b", gs[0], gs[0]) / N
            if x != 1.0:
                K *= x * x
            for l in range(1, L + 1):
                g2 = np.einsum("bn,bn->b", gs[l], gs[l]) / N if l < L else 1.0
                K = K + g2 * np.einsum("bn,bn->b", phis[l - 1], phis[l - 1]) / N
        if not (np.all(np.isfinite(delta)) and np.all(np.isfinite(K))):
            raise NumericalError(f"simulate_deep: non-finite values at step t={t} (members {sl.start}.."
                                 f"{sl.stop - 1}): training diverged; reduce eta (= {eta}) or gamma")
        out["Delta"][sl, t] = delta
        out["K"][sl, t] = K
        for l in range(L):
            P[l][:, t] = phis[l]
            G[l][:, t] = gs[l]
        cs[:, t] = eta * gamma * delta / math.sqrt(N)
        if t + 1 < T:
            with np.errstate(over="ignore", invalid="ignore"):
                W0, w = _update_vectors(W0, w, phis, gs, delta, eta, gamma, x)

    two = {}
    for kind, hist in (("Phi", P), ("G", G)):
        for l in range(1, L + 1):
            X = hist[l - 1] @ hist[l - 1].transpose(0, 2, 1)
            X /= N                                                    # (B, T, T) per member
            name = f"{kind}[{l}]"
            out[name][sl] = np.diagonal(X, axis1=1, axis2=2)
            m = X.mean(axis=0)
            two[name] = (m, ((X - m) ** 2).sum(axis=0))
    return B, two


def _finite(name, value, *, positive=False, nonneg=False):
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number, got {value!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    if positive and not v > 0:
        raise ValueError(f"{name} must be positive, got {v}")
    if nonneg and not v >= 0:
        raise ValueError(f"{name} must be non-negative, got {v}")
    return v


def simulate_deep(*, activation: str, L: int, gamma: float, y: float, eta: float, T: int, N: int, E: int,
                  seed: int = 0, batch: int | None = None, keep_samples: bool = False,
                  progress: bool = False, input_norm: float = 1.0) -> DeepEnsembleStats:
    """Train E independent width-N networks with L hidden layers for T recorded steps (module doc).
    ``input_norm`` = |x|^2 / D, the input kernel Phi[0] (default 1).  ``activation``: an expression in h, a
    shorthand, or a :class:`dmftc.derive.activation.SiteActivation` (a compiled deep spec's carries its backward
    signal, e.g. a surrogate derivative: :func:`gradient_fns`).

    ``batch`` members are processed together (default: ~16 MB of work arrays per batch); ``progress``
    shows a progress bar on stderr as in :func:`dmftc.validation.ensemble.simulate_two_layer`."""
    act = gradient_fns(activation)
    L = _positive_int("L", L)
    N = _positive_int("N", N)
    E = _positive_int("E", E, 2)
    T = _positive_int("T", T)
    seed = _positive_int("seed", seed, 0)
    gamma = _finite("gamma", gamma, positive=True)
    eta = _finite("eta", eta, nonneg=True)
    y = _finite("y", y)
    x = math.sqrt(_finite("input_norm", input_norm, positive=True))
    per_member = (L - 1) * N * N + 2 * L * T * (N + T) + 4 * N
    if batch is None:   # ~2M doubles (16 MB) per batch
        batch = max(1, min(E, (1 << 21) // per_member))
    batch = _positive_int("batch", batch)

    names = deep_names(L)
    out = {q: np.empty((E, T)) for q in names}
    two_names = names[2:]
    acc = {}                                  # name -> (count, mean, M2), combined in member order

    def combine(fut):
        nb, two = fut.result()
        bar.advance(nb, note="members")
        for name, (mb, m2b) in two.items():
            if name not in acc:
                acc[name] = (nb, mb, m2b)
                continue
            na, ma, m2a = acc[name]
            n = na + nb
            d = mb - ma
            acc[name] = (n, ma + d * (nb / n), m2a + m2b + d * d * (na * nb / n))

    # Parameters are drawn sequentially in member order in this thread; batches run on a small
    # thread pool (numpy releases the GIL) and write disjoint slices of `out`.
    rng = np.random.default_rng(seed)
    workers = max(1, min(2, os.cpu_count() or 1, -(-E // batch)))
    with ThreadPoolExecutor(max_workers=workers) as pool, \
            Progress(f"deep ensemble N={N} L={L}", E, enabled=progress) as bar:
        pending = []
        try:
            for b0 in range(0, E, batch):
                sl = slice(b0, min(E, b0 + batch))
                W0, w, Ws = draw_deep_parameters(rng, sl.stop - sl.start, N, L)
                pending.append(pool.submit(_run_batch, W0, w, Ws, act, L, gamma, y, eta, T, out, sl, x))
                while len(pending) > 2 * workers:
                    combine(pending.pop(0))
            while pending:
                combine(pending.pop(0))
        finally:
            for fut in pending:
                fut.cancel()

    mean, nvar, se_mean, se_nvar = {}, {}, {}, {}
    for q in names:
        m, nv, sem, sev = _summarise(out[q], N)
        mean[q], nvar[q], se_mean[q], se_nvar[q] = m, nv, sem, sev
    for q in two_names:
        n, m, m2 = acc[q]
        mean[q], se_mean[q] = m, np.sqrt(m2 / (n - 1) / n)
    return DeepEnsembleStats(N=N, E=E, T=T, L=L, mean=mean, nvar=nvar, se_mean=se_mean, se_nvar=se_nvar,
                             samples=out if keep_samples else None)


def deep_truth(*, activation: str, L: int, gamma: float, y: float, eta: float, T: int, N: int, E: int,
               seed: int = 0, extrapolate: bool = True, progress: bool = False,
               input_norm: float = 1.0) -> DeepEnsembleStats:
    """Ground truth with the O(1/N) corrections removed (as :func:`dmftc.validation.truth.finite_width_truth`).

    With ``extrapolate``, ensembles at widths N (seed) and 2N (seed + 1) give x = 2 x(2N) - x(N) for
    means and N*Var, with standard errors sqrt(4 se(2N)^2 + se(N)^2); the result reports width 2N and
    carries no samples.  Without, it is ``simulate_deep`` at width N."""
    kw = dict(activation=activation, L=L, gamma=gamma, y=y, eta=eta, T=T, E=E, progress=progress,
              input_norm=input_norm)
    a = simulate_deep(N=N, seed=seed, **kw)
    if not extrapolate:
        return a
    b = simulate_deep(N=2 * N, seed=_positive_int("seed", seed, 0) + 1, **kw)
    rich = lambda x, z: {k: 2 * z[k] - x[k] for k in x}                 # noqa: E731
    err = lambda x, z: {k: np.sqrt(4 * z[k] ** 2 + x[k] ** 2) for k in x}  # noqa: E731
    return DeepEnsembleStats(N=b.N, E=a.E, T=a.T, L=a.L, mean=rich(a.mean, b.mean), nvar=rich(a.nvar, b.nvar),
                             se_mean=err(a.se_mean, b.se_mean), se_nvar=err(a.se_nvar, b.se_nvar))


@dataclass(frozen=True)
class DeepMeanShift:
    """N (E[q(t)]_N - q_inf(t)) of the time-diagonal quantities (``value``, (T,) each) and its standard error."""
    N: int
    E: int
    value: dict[str, np.ndarray]
    se: dict[str, np.ndarray]
    variance_ratio: dict[str, np.ndarray]      # residual / raw variance per time (the control variates' gain)


def deep_mean_shift(reference: dict, *, L: int, gamma: float, y: float, eta: float, T: int, N: int, E: int,
                    seed: int = 0, chunk: int = 50000, progress: bool = False) -> DeepMeanShift:
    """N (E[q]_N - q_inf) for the deep LINEAR network, q in :func:`deep_names` and 'loss' = Delta^2 (against
    Delta_inf^2), from E members at width N.

    ``reference``: q_inf(t) per name of :func:`deep_names` (time-diagonal, (T,)).  The O(1/N) shift is small against the members'
    O(N^-1/2) spread, so the mean is estimated with control variates: the initial kernels Phi[l](0,0),
    G[l](0,0) (l = 1..L), whose expectation is exactly 1 at every width for a linear network with unit-variance
    weights, are regressed out of every q(t) (pooled least squares, estimate mean(q) - beta . mean(c)).  The
    estimator is consistent (its bias is O(1/E), from fitting beta); the standard error is that of the residual.
    Members run in chunks of ``chunk`` with seeds seed, seed + 1, ... and only moments are kept."""
    names = deep_names(L) + ("loss",)
    controls = [f"Phi[{l}]" for l in range(1, L + 1)] + [f"G[{l}]" for l in range(1, L + 1)]
    missing = [n for n in names[:-1] if n not in reference]
    if missing:
        raise ValueError(f"reference lacks {missing}")
    reference = {**reference, "loss": np.asarray(reference["Delta"], float) ** 2}
    E = _positive_int("E", E, 2)
    nc, dim = len(controls), len(controls) + len(names) * T
    S1, S2, done, k = np.zeros(dim), np.zeros((dim, dim)), 0, 0
    while done < E:
        m = min(chunk, E - done)
        st = simulate_deep(activation="linear", L=L, gamma=gamma, y=y, eta=eta, T=T, N=N, E=max(m, 2),
                           seed=seed + k, keep_samples=True, progress=progress)
        Z = np.concatenate([np.stack([st.samples[c][:, 0] - 1.0 for c in controls], axis=1)]
                           + [st.samples[n] for n in names[:-1]] + [st.samples["Delta"] ** 2], axis=1)[:m]
        if k == 0:
            shift = Z.mean(axis=0)                 # moments about the first chunk's mean (no cancellation)
        Z -= shift
        S1 += Z.sum(axis=0)
        S2 += Z.T @ Z
        done, k = done + m, k + 1
    d = S1 / E
    cov = (S2 - E * np.outer(d, d)) / (E - 1)
    mu = shift + d
    cxx, cxy, cyy = cov[:nc, :nc], cov[:nc, nc:], np.diag(cov)[nc:]
    beta = np.linalg.solve(cxx, cxy)                                   # (nc, names*T)
    est = mu[nc:] - mu[:nc] @ beta
    resid = np.maximum(cyy - np.einsum("ij,ij->j", cxy, beta), 0.0)
    value, se, ratio = {}, {}, {}
    for i, n in enumerate(names):
        sl = slice(i * T, (i + 1) * T)
        value[n] = N * (est[sl] - np.asarray(reference[n], float))
        se[n] = N * np.sqrt(resid[sl] / E)
        ratio[n] = np.where(cyy[sl] > 0, resid[sl] / np.maximum(cyy[sl], 1e-300), 0.0)
    return DeepMeanShift(N=N, E=E, value=value, se=se, variance_ratio=ratio)
