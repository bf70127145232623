"""Ground-truth ensembles of finite-width DEEP networks trained by discrete GD.

The exact network (no DMFT approximation), in the mean-field / muP parameterisation, trained on one point x
with |x|^2 = D (only x.x/D matters, so D = 1, x = [1], or sqrt(input_norm)) or on P points with Gram matrix
Kx[mu, nu] = x_mu . x_nu / D (built as in :func:`dmftc.validation.ensemble.inputs_from_gram`, D = P).

Parameterisation (width N, L >= 1 hidden layers; all weights N(0, 1) iid at t = 0)::

    h^1_mu = W^0 x_mu / sqrt(D),        h^{l+1}_mu = W^l phi(h^l_mu) / sqrt(N)   (l = 1..L-1)
    f_mu   = w . phi(h^L_mu) / (gamma N),     ftilde(t) = f(t) - f(0)   (background subtraction)
    Delta_mu(t) = y_mu - ftilde_mu(t),       loss = sum_mu Delta_mu^2 / 2

with W^0 (N, D), W^l (N, N), w (N,).  Below, one point (the index mu dropped) for brevity.  Gradient signals
g^l = gamma N df/dh^l are g^L = phi'(h^L) * w, g^l = phi'(h^l) * (W^l^T g^{l+1}) / sqrt(N).
A spec's other backward signal (a surrogate derivative a(h) in place of phi'(h), plus a term b(h): the
gradient field g = a(h) z + b(h) of a deep spec) replaces these by g^L = a(h^L) * w + b(h^L) and
g^l = a(h^l) * (W^l^T g^{l+1}) / sqrt(N) + b(h^l); the updates below use g as written (:func:`gradient_fns`).
GD with learning rate eta N gamma^2, theta <- theta - eta N gamma^2 dloss/dtheta, i.e. the
simultaneous update (right-hand sides at the old parameters)::

    w   += eta gamma Delta phi(h^L)
    W^l += eta gamma Delta g^{l+1} phi(h^l)^T / sqrt(N)      (l = 1..L-1)
    W^0 += eta gamma Delta g^1 x / sqrt(D)

(on P points each update is the sum over mu of these terms).  Recorded at t = 0..T-1, each *before* the t-th
update (t = 0 is initialisation), l = 1..L (on P points: Phi[l]_{mu nu}(t,s) = phi(h^l_mu(t)) . phi(h^l_nu(s)) / N,
G likewise, K_{mu nu}(t) with Phi[0] = Kx; the NTK between the points)::

    Phi[l](t,s) = phi(h^l(t)) . phi(h^l(s)) / N,   G[l](t,s) = g^l(t) . g^l(s) / N,
    K(t) = sum_{l=0..L} G[l+1](t,t) Phi[l](t,t)   (Phi[0] = G[L+1] = 1; = N gamma^2 |grad_theta f|^2),
    Delta(t).

Activations as in :mod:`dmftc.validation.ensemble` ('tanh', 'relu' = sqrt(2) max(0, h), 'linear', 'erf').
Randomness: member m uses the m-th block of (D + 1) N + (L-1) N^2 standard normals of
np.random.default_rng(seed): first (W^0_i, w_i) interleaved for i = 0..N-1 (the same layout
as :func:`dmftc.validation.ensemble.draw_parameters`, so for L = 1 the networks coincide
with :func:`dmftc.validation.ensemble.simulate_two_layer` on the same Kx), then W^1, ..., W^{L-1}
row-major; one point with x = 1 and P = 1 point with Kx = [[1]] are the same networks.  Results therefore do
not depend on the batch size.

Implementation: the hidden matrices are never rewritten.  Since every update has rank P,
W^l(t) = W^l(0) + (eta gamma / sqrt N) sum_{s<t, mu} Delta_mu(s) g^{l+1}_mu(s) phi(h^l_mu(s))^T exactly, and
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

from dmftc.validation.ensemble import positive_int, summarise, activation_fns, inputs_from_gram
from dmftc.errors import NumericalError
from dmftc.validation.extrapolate import richardson
from dmftc.validation.lazy_gaussian import DenseMatrices, LazyGaussian
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
        """N Cov over members (ddof=1) of the time-diagonal values, (T, T) for one point; on P points the
        per-member arrays are flattened (Delta (P, T) -> P T entries, mu-major)."""
        if self.samples is None:
            raise ValueError("ncov needs per-member samples: run simulate_deep(..., keep_samples=True) "
                             "(Richardson-extrapolated results carry no samples)")
        for name in (name_a, name_b):
            if name not in self.samples:
                raise ValueError(f"unknown quantity {name!r}; expected one of {list(self.samples)}")
        a, b = (self.samples[n].reshape(self.E, -1) for n in (name_a, name_b))
        a, b = a - a.mean(axis=0), b - b.mean(axis=0)
        return self.N * (a.T @ b) / (self.E - 1)


def draw_deep_parameters(rng: np.random.Generator, n_members: int, N: int, L: int, D: int | None = None):
    """Next n_members blocks of rng as (W0, w (B,N), [W^1..W^{L-1}] each (B,N,N)).

    Per member: the first layer and readout in the layout of :func:`dmftc.validation.ensemble.draw_parameters`
    (neuron i's D input weights, then w_i), then the hidden matrices row-major.  ``D`` None: one input (D = 1)
    and W0 (B,N); else W0 (B,N,D).  W0 and w are fresh arrays; the hidden matrices are views of the drawn block."""
    d = 1 if D is None else D
    z = rng.standard_normal((n_members, N * (d + 1) + (L - 1) * N * N))
    first = z[:, :N * (d + 1)].reshape(n_members, N, d + 1)
    W0, w = np.ascontiguousarray(first[..., :d]), np.ascontiguousarray(first[..., d])
    hid = z[:, N * (d + 1):].reshape(n_members, L - 1, N, N)
    return (W0[..., 0] if D is None else W0), w, [hid[:, k] for k in range(L - 1)]


# Layer l = 1..L is stored at list index l-1.  Per-neuron arrays are (B, P, N): member, training point, neuron.
# matvec(l, v) = W^l v and rmatvec(l, v) = W^l^T v (l = 1..L-1), applied to each point's vector, abstract over
# the dense (deep_gd_step) and low-rank (simulator) representations.
def gradient_fns(activation):
    """h -> (phi(h), a(h), b(h)) in numpy: the activation and the coefficients of the backward signal
    g = a(h) z + b(h) (b None for gradient descent, a = phi').  A
    :class:`dmftc.runtime.problem.activation.SiteActivation` of a compiled deep spec carries its spec's gradient field
    (e.g. a surrogate derivative); anything else is gradient descent (:func:`activation_fns`)."""
    if getattr(activation, "standard_gradient", True):
        fns = activation_fns(activation)
        return lambda h: fns(h) + (None,)
    import jax

    site = activation
    fn = jax.jit(lambda h: (site.fn(h)[0],) + tuple(site.gradient(h)[k] for k in (0, 4)))
    return lambda h: tuple(np.array(v) for v in fn(h))


def _forward(W0t, w, matvec, act, L, gamma, XsT):
    """phis, coefs (lists of L arrays (B,P,N), and of L pairs (a, b) of the backward signal g = a z + b, b None
    for 0) and f (B,P).  W0t (B,D,N) holds the first layer transposed; XsT = X / sqrt(D) (P,D) the inputs."""
    N = W0t.shape[-1]
    phis, coefs = [], []
    h = XsT @ W0t
    for l in range(1, L + 1):
        p, a, b = act(h)
        phis.append(p)
        coefs.append((a, b))
        if l < L:
            h = matvec(l, p)
            h /= math.sqrt(N)
    f = (phis[-1] @ w[:, :, None])[:, :, 0] / (gamma * N)
    return phis, coefs, f


def _backward(w, coefs, rmatvec, L):
    """gs: list of L arrays g^l = a(h^l) z^l + b(h^l) (B,P,N), z^L = w (``coefs``: the pairs (a, b) of _forward)."""
    N = w.shape[-1]

    def signal(l, z):
        a, b = coefs[l - 1]
        g = a * z
        if b is not None:
            g += b
        return g

    g = signal(L, w[:, None, :])
    gs = [g]
    for l in range(L - 1, 0, -1):
        z = rmatvec(l, g)
        z /= math.sqrt(N)
        g = signal(l, z)
        gs.append(g)
    return gs[::-1]


def _update_vectors(W0t, w, phis, gs, delta, eta, gamma, XpT):
    """New (W0t, w): W0 + eta gamma sum_mu Delta_mu g^1_mu x_mu^T / sqrt(D), w + eta gamma sum_mu Delta_mu
    phi(h^L_mu) (same op order as ensemble.py); XpT = X^T / sqrt(D) (D,P), delta (B,P)."""
    dW0 = XpT @ (gs[0] * delta[:, :, None])
    dW0 *= eta * gamma
    dW0 += W0t
    dw = (delta[:, None, :] @ phis[-1])[:, 0, :]
    dw *= eta * gamma
    dw += w
    return dW0, dw


def _inputs(W0, X):
    """(W0t (B,D,N), X (P,D)) from W0 (B,N) and X None (one input, x = 1) or W0 (B,N,D) and X (P,D)."""
    W0 = np.asarray(W0, np.float64)
    if X is None:
        return W0[:, None, :], np.ones((1, 1))
    return np.ascontiguousarray(W0.transpose(0, 2, 1)), np.asarray(X, np.float64)


def deep_forward(W0, w, Ws, *, activation, gamma: float, X=None):
    """Dense forward + backward pass: (phis, gs, f) for parameters W0, w (B,N), Ws list of (B,N,N).  One input
    (``X`` None): W0 (B,N), phis and gs (B,N), f (B,); P inputs X (P,D): W0 (B,N,D), phis and gs (B,P,N), f (B,P)."""
    act = gradient_fns(activation)
    L = len(Ws) + 1
    W0t, X = _inputs(W0, X)
    phis, coefs, f = _forward(W0t, np.asarray(w, np.float64), lambda l, v: v @ Ws[l - 1].transpose(0, 2, 1), act,
                              L, gamma, X / math.sqrt(X.shape[1]))
    gs = _backward(np.asarray(w, np.float64), coefs, lambda l, v: v @ Ws[l - 1], L)
    if X.shape == (1, 1):
        return [p[:, 0] for p in phis], [g[:, 0] for g in gs], f[:, 0]
    return phis, gs, f


def deep_gd_step(W0, w, Ws, y, f0, *, activation, gamma: float, eta: float, X=None):
    """One dense GD step (module docstring) for a batch, loss 1/2 sum_mu Delta_mu^2; f0 is the output at
    initialisation ((B,) for one input, (B,P) for inputs X (P,D) with targets y (P,)).

    Returns (W0_new, w_new, Ws_new) in the shapes given.  Shares the forward/backward code with :func:`simulate_deep`."""
    one = X is None
    W0t, Xa = _inputs(W0, X)
    w = np.asarray(w, np.float64)
    Ws = [np.asarray(W, np.float64) for W in Ws]
    N, D = w.shape[1], Xa.shape[1]
    act = gradient_fns(activation)
    phis, coefs, f = _forward(W0t, w, lambda l, v: v @ Ws[l - 1].transpose(0, 2, 1), act, len(Ws) + 1, gamma,
                              Xa / math.sqrt(D))
    gs = _backward(w, coefs, lambda l, v: v @ Ws[l - 1], len(Ws) + 1)
    delta = np.reshape(y, (1, -1)) - (f - np.reshape(f0, (f.shape[0], -1)))
    c = eta * gamma * delta / math.sqrt(N)                                   # (B,P)
    Ws_new = [W + (gs[l].transpose(0, 2, 1) * c[:, None, :]) @ phis[l - 1] for l, W in enumerate(Ws, 1)]
    W0n, wn = _update_vectors(W0t, w, phis, gs, delta, eta, gamma, Xa.T / math.sqrt(D))
    return (W0n[:, 0, :] if one else W0n.transpose(0, 2, 1)), wn, Ws_new


def _run_batch(W0t, w, Ws, act, L, gamma, y, eta, T, out, sl, X, Kx, error_signal=None, trained=None):
    """Train one batch for T recorded steps; writes time-diagonal samples into out[name][sl] (Delta (B,T,P), the
    others (B,T,P,P)) and returns (B, {two-time name: (batch mean, sum of squared deviations), (T,P,T,P) each}).
    ``Ws``: the hidden matrices at initialisation, :class:`LazyGaussian` or :class:`DenseMatrices` (their
    products ``right`` and ``left``)."""
    B, N = w.shape
    P, D = X.shape
    XsT, XpT = X / math.sqrt(D), X.T / math.sqrt(D)
    Ph = [np.zeros((B, T * P, N)) for _ in range(L)]   # phi(h^l_nu(s)) at row s P + nu
    G = [np.zeros((B, T * P, N)) for _ in range(L)]    # g^l_nu(s)
    cs = np.zeros((B, T * P))                           # eta gamma Delta_nu(s) / sqrt(N)
    k = 0                                               # rows recorded so far (t P)

    def matvec(l, v):    # W^l(t) v = W^l(0) v + sum_{s<t, nu} cs g^{l+1}_nu(s) (phi^l_nu(s) . v)
        a = Ws[l - 1].right(v)
        if k:
            coef = (v @ Ph[l - 1][:, :k].transpose(0, 2, 1)) * cs[:, None, :k]
            a += coef @ G[l][:, :k]
        return a

    def rmatvec(l, v):   # W^l(t)^T v = W^l(0)^T v + sum_{s<t, nu} cs phi^l_nu(s) (g^{l+1}_nu(s) . v)
        a = Ws[l - 1].left(v)
        if k:
            coef = (v @ G[l][:, :k].transpose(0, 2, 1)) * cs[:, None, :k]
            a += coef @ Ph[l - 1][:, :k]
        return a

    def gram(x):
        return (x @ x.transpose(0, 2, 1)) / N

    f0 = None
    for t in range(T):
        with np.errstate(over="ignore", invalid="ignore"):   # divergence is detected and reported below
            phis, coefs, f = _forward(W0t, w, matvec, act, L, gamma, XsT)
            gs = _backward(w, coefs, rmatvec, L)
            if f0 is None:
                f0 = f
            delta = y - (f - f0) if error_signal is None else error_signal(f - f0, y)
            update = delta if trained is None else delta * trained     # test points: recorded, never trained on
            grams = {f"Phi[{l}]": gram(phis[l - 1]) for l in range(1, L + 1)}
            grams.update({f"G[{l}]": gram(gs[l - 1]) for l in range(1, L + 1)})
            K = grams["G[1]"] * Kx + grams[f"Phi[{L}]"]
            for l in range(1, L):
                K = K + grams[f"G[{l + 1}]"] * grams[f"Phi[{l}]"]
        if not (np.all(np.isfinite(delta)) and np.all(np.isfinite(K))):
            raise NumericalError(f"simulate_deep: non-finite values at step t={t} (members {sl.start}.."
                                 f"{sl.stop - 1}): training diverged; reduce eta (= {eta}) or gamma")
        out["Delta"][sl, t] = delta
        out["K"][sl, t] = K
        for name, v in grams.items():
            out[name][sl, t] = v
        for l in range(L):
            Ph[l][:, k:k + P] = phis[l]
            G[l][:, k:k + P] = gs[l]
        cs[:, k:k + P] = eta * gamma * update / math.sqrt(N)
        k += P
        if t + 1 < T:
            with np.errstate(over="ignore", invalid="ignore"):
                W0t, w = _update_vectors(W0t, w, phis, gs, update, eta, gamma, XpT)

    two = {}
    for kind, hist in (("Phi", Ph), ("G", G)):
        for l in range(1, L + 1):
            Xk = gram(hist[l - 1]).reshape(B, T, P, T, P)        # per member
            m = Xk.mean(axis=0)
            two[f"{kind}[{l}]"] = (m, ((Xk - m) ** 2).sum(axis=0))
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


def _design(y, Kx, input_norm):
    """(X (P,D), Kx (P,P), y (P,), vector): the inputs and targets of a run.  ``Kx`` None: one point with
    |x|^2 / D = input_norm, the results without sample axes; else the Gram matrix of P points (targets y (P,))."""
    if Kx is None:
        y = _finite("y", y)
        x = math.sqrt(_finite("input_norm", input_norm, positive=True))
        return np.array([[x]]), np.array([[x * x]]), np.array([y]), False
    if input_norm != 1.0:
        raise ValueError("give either input_norm (one point) or Kx (P points), not both")
    X = inputs_from_gram(Kx)
    P = X.shape[0]
    y = np.asarray(y, dtype=np.float64)
    if y.shape != (P,):
        raise ValueError(f"y must have one target per point of Kx, shape ({P},), got shape {y.shape}")
    if not np.all(np.isfinite(y)):
        raise ValueError("y must be finite")
    return X, X @ X.T / P, y, True


def simulate_deep(*, activation, L: int, gamma: float, y, eta: float, T: int, N: int, E: int,
                  seed: int = 0, batch: int | None = None, keep_samples: bool = False,
                  progress: bool = False, input_norm: float = 1.0, Kx=None,
                  error_signal=None, trained=None, weights: str = "lazy") -> DeepEnsembleStats:
    """Train E independent width-N networks with L hidden layers for T recorded steps (module doc).

    One training point (``Kx`` None): ``input_norm`` = |x|^2 / D, the input kernel Phi[0] (default 1), ``y``
    its target; Delta, K and the time diagonals have shape (T,), two-time kernels (T, T).  P points: ``Kx`` their
    Gram matrix x_mu . x_nu / D (P, P) and ``y`` (P,), loss 1/2 sum_mu Delta_mu^2; Delta (P, T), K and the
    same-time kernels (P, P, T), two-time kernels (P, P, T, T) indexed [mu, nu, t, s].

    ``activation``: an expression in h, a shorthand, or a :class:`dmftc.runtime.problem.activation.SiteActivation` (a
    compiled deep spec's carries its backward signal, e.g. a surrogate derivative: :func:`gradient_fns`).
    ``batch`` members are processed together (default: ~16 MB of work arrays per batch); ``progress``
    shows a progress bar on stderr as in :func:`dmftc.validation.ensemble.simulate_two_layer`.
    ``error_signal``: another loss, as the error signal Delta = -dloss/df of the background-subtracted outputs
    ``error_signal(ftilde, y)`` (numpy, elementwise; e.g. the logistic loss ln(1 + exp(-y f)) has
    y / (1 + exp(y f))); default the squared loss, Delta = y - ftilde.  The recorded Delta is this error signal.
    ``trained`` (P,) of 0/1: the points the networks train on (default all); the others are test points, whose
    error signal (e.g. the residual y - ftilde) and kernels are recorded but never enter an update.

    ``weights``: how the hidden matrices are drawn.  'lazy' (default): only along the directions the training
    applies them to, each product from its exact conditional law given the ones before
    (:mod:`dmftc.validation.lazy_gaussian`; about 2 T P N normals per matrix instead of N^2, the same law of
    every trajectory); the fresh normals of a batch of members come from its own stream (child ``batch start``
    of the seed), so results depend on the seed and the batch size.  'dense': every entry drawn up front, in
    member order from the seed's stream (the layout of :func:`draw_deep_parameters`), whatever the batch."""
    if weights not in ("lazy", "dense"):
        raise ValueError(f"weights must be 'lazy' or 'dense', got {weights!r}")
    lazy = weights == "lazy"
    act = gradient_fns(activation)
    L = positive_int("L", L)
    N = positive_int("N", N)
    E = positive_int("E", E, 2)
    T = positive_int("T", T)
    seed = positive_int("seed", seed, 0)
    gamma = _finite("gamma", gamma, positive=True)
    eta = _finite("eta", eta, nonneg=True)
    X, Kx, y, vector = _design(y, Kx, input_norm)
    if trained is not None:
        trained = np.asarray(trained, float)
        if trained.shape != (X.shape[0],) or not np.all((trained == 0) | (trained == 1)):
            raise ValueError(f"trained must be {X.shape[0]} values 0 or 1, got {trained!r}")
    P, D = X.shape
    per_member = (L - 1) * (4 * T * P * N if lazy else N * N) + 2 * L * T * P * (N + T * P) + (4 + D) * N
    if batch is None:   # ~2M doubles (16 MB) per batch
        batch = max(1, min(E, (1 << 21) // per_member))
    batch = positive_int("batch", batch)

    names = deep_names(L)
    out = {q: np.empty((E, T, P) if q == "Delta" else (E, T, P, P)) for q in names}
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

    # Parameters (lazy: the first layer and readout; each batch's hidden matrices come from its own child of the
    # seed) are drawn sequentially in member order in this thread; batches run on a small
    # thread pool (numpy releases the GIL) and write disjoint slices of `out`.
    rng = np.random.default_rng(seed)
    workers = max(1, min(2, os.cpu_count() or 1, -(-E // batch)))
    with ThreadPoolExecutor(max_workers=workers) as pool, \
            Progress(f"deep ensemble N={N} L={L}", E, enabled=progress) as bar:
        pending = []
        try:
            for b0 in range(0, E, batch):
                sl = slice(b0, min(E, b0 + batch))
                B = sl.stop - sl.start
                W0, w, Ws = draw_deep_parameters(rng, B, N, 1 if lazy else L, D if vector else None)
                if lazy:              # the batch's own stream, drawn from in its thread
                    own = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(sl.start,)))
                    Ws = [LazyGaussian(own, B, N, capacity=T * P) for _ in range(L - 1)]
                else:
                    Ws = [DenseMatrices(W) for W in Ws]
                W0t, _ = _inputs(W0, X if vector else None)
                pending.append(pool.submit(_run_batch, W0t, w, Ws, act, L, gamma, y, eta, T, out, sl, X, Kx,
                                           error_signal, trained))
                while len(pending) > 2 * workers:
                    combine(pending.pop(0))
            while pending:
                combine(pending.pop(0))
        finally:
            for fut in pending:
                fut.cancel()

    if vector:      # sample axes first, time last (as dmftc.validation.ensemble)
        out = {q: np.ascontiguousarray(np.moveaxis(v, 1, -1)) for q, v in out.items()}
        two = lambda a: np.ascontiguousarray(a.transpose(1, 3, 0, 2))        # noqa: E731
    else:
        out = {q: np.ascontiguousarray(v.reshape(E, T)) for q, v in out.items()}
        two = lambda a: a[:, 0, :, 0]                                        # noqa: E731
    mean, nvar, se_mean, se_nvar = {}, {}, {}, {}
    for q in names:
        mean[q], nvar[q], se_mean[q], se_nvar[q] = summarise(out[q], N)
    for q in names[2:]:
        n, m, m2 = acc[q]
        mean[q], se_mean[q] = two(m), two(np.sqrt(m2 / (n - 1) / n))
    return DeepEnsembleStats(N=N, E=E, T=T, L=L, mean=mean, nvar=nvar, se_mean=se_mean, se_nvar=se_nvar,
                             samples=out if keep_samples else None)


def deep_truth(*, activation, L: int, gamma: float, y, eta: float, T: int, N: int, E: int,
               seed: int = 0, extrapolate: bool = True, progress: bool = False,
               input_norm: float = 1.0, Kx=None, error_signal=None, trained=None,
               weights: str = "lazy") -> DeepEnsembleStats:
    """Ground truth with the O(1/N) corrections removed (as :func:`dmftc.validation.truth.finite_width_truth`).

    With ``extrapolate``, ensembles at widths N (seed) and 2N (seed + 1) give x = 2 x(2N) - x(N) for
    means and N*Var, with standard errors sqrt(4 se(2N)^2 + se(N)^2); the result reports width 2N and
    carries no samples.  Without, it is ``simulate_deep`` at width N.  ``weights`` as in :func:`simulate_deep`."""
    kw = dict(activation=activation, L=L, gamma=gamma, y=y, eta=eta, T=T, E=E, progress=progress,
              input_norm=input_norm, Kx=Kx, error_signal=error_signal, trained=trained, weights=weights)
    a = simulate_deep(N=N, seed=seed, **kw)
    if not extrapolate:
        return a
    b = simulate_deep(N=2 * N, seed=positive_int("seed", seed, 0) + 1, **kw)
    return richardson(a, b)


@dataclass(frozen=True)
class DeepMeanShift:
    """N (E[q(t)]_N - q_inf(t)) of the time-diagonal quantities (``value``: (T,) each on one point, the shapes of
    the reference on several) and its standard error."""
    N: int
    E: int
    value: dict[str, np.ndarray]
    se: dict[str, np.ndarray]
    variance_ratio: dict[str, np.ndarray]      # residual / raw variance per time (the control variates' gain)


def deep_mean_shift(reference: dict, *, L: int, gamma: float, y, eta: float, T: int, N: int, E: int,
                    seed: int = 0, chunk: int = 50000, progress: bool = False, Kx=None,
                    error_signal=None, trained=None) -> DeepMeanShift:
    """N (E[q]_N - q_inf) for the deep LINEAR network, q in :func:`deep_names` and 'loss' = Delta^2 (against
    Delta_inf^2), from E members at width N.

    ``reference``: q_inf(t) per name of :func:`deep_names` (time-diagonal: (T,) on one point; on P points, with
    ``Kx`` (P, P) and ``y`` (P,), the shapes of :func:`simulate_deep`'s samples: Delta (P, T), the rest
    (P, P, T)).  The O(1/N) shift is small against the members' O(N^-1/2) spread, so the mean is estimated with
    control variates: the initial kernels, whose expectation is known exactly at every width for a linear
    network with unit-variance weights (Phi[l](0, 0) = Kx of each pair of points (1 on one point); G[l](0, 0) = 1,
    one per layer since the backward fields at initialisation are the same for every point), are regressed out
    of every q(t) (pooled least squares, estimate mean(q) - beta . mean(c)).  The estimator is consistent (its
    bias is O(1/E), from fitting beta); the standard error is that of the residual.  Members run in chunks of
    ``chunk`` with seeds seed, seed + 1, ... and only moments are kept.  ``error_signal`` (another loss) and
    ``trained`` (test points) as in :func:`simulate_deep`."""
    names = deep_names(L) + ("loss",)
    missing = [n for n in names[:-1] if n not in reference]
    if missing:
        raise ValueError(f"reference lacks {missing}")
    reference = {**reference, "loss": np.asarray(reference["Delta"], float) ** 2}
    E = positive_int("E", E, 2)
    if Kx is None:
        pairs, kx = (np.zeros(1, int), np.zeros(1, int)), np.ones(1)
    else:
        Kx = np.asarray(Kx, float)
        pairs = np.triu_indices(Kx.shape[0])
        kx = Kx[pairs]

    def controls(st):
        """(members, controls): the initial kernels minus their exact expectation."""
        phi = [st.samples[f"Phi[{l}]"][..., 0] for l in range(1, L + 1)]
        g = [st.samples[f"G[{l}]"][..., 0] for l in range(1, L + 1)]
        if Kx is None:
            return np.stack([c - 1.0 for c in phi + g], axis=1)
        return np.concatenate([c[:, pairs[0], pairs[1]] - kx for c in phi] + [c[:, :1, 0] - 1.0 for c in g], axis=1)

    shapes = {n: np.shape(reference[n]) for n in names}
    sizes = [int(np.prod(shapes[n])) for n in names]
    S1 = S2 = shift = None
    done, k = 0, 0
    while done < E:
        m = min(chunk, E - done)
        st = simulate_deep(activation="linear", L=L, gamma=gamma, y=y, eta=eta, T=T, N=N, E=max(m, 2),
                           seed=seed + k, keep_samples=True, progress=progress, Kx=Kx, error_signal=error_signal,
                           trained=trained)
        Z = np.concatenate([controls(st)] + [st.samples[n].reshape(st.E, -1) for n in names[:-1]]
                           + [(st.samples["Delta"] ** 2).reshape(st.E, -1)], axis=1)[:m]
        if k == 0:
            shift = Z.mean(axis=0)                 # moments about the first chunk's mean (no cancellation)
            S1, S2 = np.zeros(Z.shape[1]), np.zeros((Z.shape[1], Z.shape[1]))
        Z -= shift
        S1 += Z.sum(axis=0)
        S2 += Z.T @ Z
        done, k = done + m, k + 1
    nc = S1.shape[0] - sum(sizes)
    d = S1 / E
    cov = (S2 - E * np.outer(d, d)) / (E - 1)
    mu = shift + d
    cxx, cxy, cyy = cov[:nc, :nc], cov[:nc, nc:], np.diag(cov)[nc:]
    beta = np.linalg.solve(cxx, cxy)                                   # (nc, quantities)
    est = mu[nc:] - mu[:nc] @ beta
    resid = np.maximum(cyy - np.einsum("ij,ij->j", cxy, beta), 0.0)
    value, se, ratio = {}, {}, {}
    offs = np.concatenate([[0], np.cumsum(sizes)])
    for i, n in enumerate(names):
        sl = slice(offs[i], offs[i + 1])
        value[n] = (N * (est[sl] - np.asarray(reference[n], float).reshape(-1))).reshape(shapes[n])
        se[n] = (N * np.sqrt(resid[sl] / E)).reshape(shapes[n])
        ratio[n] = np.where(cyy[sl] > 0, resid[sl] / np.maximum(cyy[sl], 1e-300), 0.0).reshape(shapes[n])
    return DeepMeanShift(N=N, E=E, value=value, se=se, variance_ratio=ratio)
