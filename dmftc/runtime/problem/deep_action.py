"""The deep action's engine, shared by both ln Z_l backends: its order parameters, saddle, Hessian and
propagator.

The action per neuron of an L-hidden-layer network (the order parameters of a deep spec; derivation in the
docstring of :mod:`dmftc.runtime.engines.deep_linear`) is

    S = sum_l sum_{t>=s} [Phi_hat^l Phi^l + G_hat^l G^l](t,s) + sum_t Delta_hat(t) (Delta(t) - y0)
        - sum_{l=1}^{L-1} Tr(A^l B^l) + sum_{l=1}^{L} ln Z_l,

a bilinear part written here once, and one single-site log-partition function per layer, which depends only on
that layer's LOCAL variables (:func:`gather_local`).  ln Z_l has two backends: the closed-form Gaussian integral
of linear networks (:mod:`dmftc.runtime.engines.deep_linear`, exact) and the Monte Carlo estimate of any other
activation (:mod:`dmftc.runtime.engines.deep_propagator`).  Both give the Hessian of ln Z_l over its local variables;
this module lays out all variables (:class:`Layout`) and the bilinear part (:func:`bilinear_pairs`), and maps
the physical block to the time-diagonal observables Delta, K, Phi[l](t,t), G[l](t,t) (:func:`observable_map`);
:mod:`dmftc.runtime.solvers.causal_solve` assembles the Hessian's blocks U and Kd and solves for the propagator (the
dense Hessian and its LU are the tests' oracle, :mod:`dmftc.reference.dense_hessian`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import jax.numpy as jnp
import numpy as np

from dmftc.runtime.numerics.march_numerics import array_module


__all__ = ["Saddle", "saddle_of_march", "Layout", "saddle_point_vector", "bilinear_pairs", "observable_names",
           "Propagator", "observable_map"]


# ----------------------------------------------------------------------------------------------
# the saddle point
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Saddle:
    """Infinite-width discrete-time DMFT solution.  Layer-indexed lists hold index l at position l - 1."""
    L: int
    gamma: float
    y: float
    eta: float
    T: int
    Delta: np.ndarray           # (T,)
    f: np.ndarray               # (T,)  f(t) - f(0), f(0) = 0
    K: np.ndarray               # (T,)  sum_{l=0..L} G[l+1](t,t) Phi[l](t,t)
    Phi: list                   # L x (T,T)   Phi[l], l = 1..L
    G: list                     # L x (T,T)   G[l],   l = 1..L
    Rphi: list                  # L x (T,T)   <d h^l(t)/d r^l(s)>, s < t
    Rg: list                    # L x (T,T)   <d g^l(t)/d u^l(s)>, s <= t
    maps: list = field(repr=False, default=None)  # L x (H, Z): (T, 2T) coefficients of h^l, z^l on (u^l, r^l)
    #                                               (from the numpy oracle dmftc.reference.deep_marches only)
    phi0: float = 1.0           # boundary kernels Phi[0] = phi0 1 1^T, G[L+1] = g_top 1 1^T
    g_top: float = 1.0
    model: object = field(repr=False, default=None)   # the DeepModel whose action this is the saddle of

    def phi(self, l):           # Phi[l] with Phi[0] = phi0 1 1^T
        return self.phi0 * np.ones((self.T, self.T)) if l == 0 else self.Phi[l - 1]

    def g(self, l):             # G[l] with G[L+1] = g_top 1 1^T
        return self.g_top * np.ones((self.T, self.T)) if l == self.L + 1 else self.G[l - 1]


def saddle_of_march(model, out: dict, L: int, T: int) -> Saddle:
    """The Saddle of ``model``'s action from the deep march's arrays (kernels as causal rows, symmetrised here;
    f = y0 - Delta; K from the model's K of the kernels' time diagonals and the boundary kernels)."""
    from dmftc.runtime.numerics.march_numerics import symmetric

    Phi, G = list(symmetric(out["Phi"])), list(symmetric(out["G"]))
    Delta = np.asarray(out["Delta"])
    if model.readout_fn is not None:     # another loss: the error signal's tangent at this march's averages
        model = model.linearised(out["e_used"])
    if model.points > 1:           # K of a same-time pair of points: left to dmftc.runtime.engines.deep_points
        K, f = None, np.asarray(model.y_steps(T)) - Delta
    else:
        K = np.asarray(model.k_of([model.phi0 * np.ones(T)] + [np.diag(a) for a in Phi],
                                  [np.diag(a) for a in G] + [model.g_top * np.ones(T)]), float)
        f = model.y0 - Delta
    return make_saddle(model, L, T, Delta, f, K, Phi, G, [np.asarray(a) for a in out["Rphi"]],
                   [np.asarray(a) for a in out["Rg"]])


def make_saddle(model, L, T, Delta, f, K, Phi, G, Rphi, Rg, maps=None) -> Saddle:
    """A Saddle of ``model``'s action (gamma, y, eta recorded: the standard network's, else gamma = -1 / c_t of
    the readout and eta = nan; the numerics read ``model``)."""
    ct = model.readout[1]
    std = model.standard_params or {"gamma": -1.0 / ct if np.ndim(ct) == 0 and ct else float("nan"),
                                    "eta": float("nan")}
    return Saddle(L, float(std["gamma"]), model.y0, float(std["eta"]), T, Delta, f, K, Phi, G, Rphi, Rg, maps,
                  phi0=model.phi0, g_top=model.g_top, model=model)


# ----------------------------------------------------------------------------------------------
# order parameters and the bilinear part
# ----------------------------------------------------------------------------------------------
class Layout:
    """Flat packing of all order parameters.  Physical block first: Phi[1..L] (lower triangles, t >= s),
    G[1..L] (lower triangles), Delta (T); then Phi_hat, G_hat (lower triangles), Delta_hat (T);
    then A[1..L-1], B[1..L-1] (full T x T, row-major)."""

    def __init__(self, L: int, T: int):
        self.L, self.T = int(L), int(T)
        self.tril = np.tril_indices(T)
        self.nt = T * (T + 1) // 2
        blocks, off = {}, 0

        def add(name, size):
            nonlocal off
            blocks[name] = (off, size)
            off += size

        for l in range(1, L + 1):
            add(f"Phi[{l}]", self.nt)
        for l in range(1, L + 1):
            add(f"G[{l}]", self.nt)
        add("Delta", T)
        self.n_phys = off
        for l in range(1, L + 1):
            add(f"Phi_hat[{l}]", self.nt)
        for l in range(1, L + 1):
            add(f"G_hat[{l}]", self.nt)
        add("Delta_hat", T)
        for l in range(1, L):
            add(f"A[{l}]", T * T)
        for l in range(1, L):
            add(f"B[{l}]", T * T)
        self.blocks, self.n = blocks, off

    def slice(self, name):
        o, s = self.blocks[name]
        return slice(o, o + s)

    def pack(self, q: dict) -> np.ndarray:
        """dict of arrays (symmetric kernels as (T,T): lower triangle used) -> flat vector."""
        x = np.zeros(self.n)
        for name, (o, s) in self.blocks.items():
            v = np.asarray(q[name], dtype=float)
            x[o:o + s] = v[self.tril] if self._kind(name) == "tril" else v.reshape(-1)
        return x

    def unpack(self, x) -> dict:
        """flat vector -> dict (kernels/hats as lower-triangular (T,T) arrays, A/B full); numpy arrays for a host
        vector, JAX arrays for a JAX array or tracer (:func:`array_module`)."""
        T, out = self.T, {}
        for name, (o, s) in self.blocks.items():
            v = x[o:o + s]
            kind = self._kind(name)
            if kind == "tril":
                out[name] = tril_matrix(v, T)
            elif kind == "full":
                out[name] = v.reshape(T, T)
            else:
                out[name] = v
        return out

    @staticmethod
    def _kind(name):
        if name in ("Delta", "Delta_hat"):
            return "vector"
        return "full" if name.startswith(("A[", "B[")) else "tril"

    def indices(self, name):
        o, s = self.blocks[name]
        return np.arange(o, o + s)


def sym_from_tril(low):
    """symmetric matrix from its lower triangle (diagonal once)."""
    xp = array_module(low)
    return low + low.T - xp.diag(xp.diag(low))


def tril_matrix(w, T):
    """(T, T) with the lower triangle (t >= s, row-major) set from w and zeros above."""
    if array_module(w) is np:
        out = np.zeros((T, T), dtype=np.result_type(w, np.float64))
        out[np.tril_indices(T)] = w
        return out
    return jnp.zeros((T, T), dtype=w.dtype).at[np.tril_indices(T)].set(w)


def split_local(v, T):
    nt = T * (T + 1) // 2
    sizes = [nt, nt, T * T, T * T, nt, nt, T, T]
    out, o = [], 0
    for n in sizes:
        out.append(v[o:o + n])
        o += n
    return out


def _local_parts(lay: "Layout", l: int, phi0: float = 1.0, g_top: float = 1.0):
    """(names or constants) of the local variables of layer l, in log_z_local order (boundary kernels
    Phi[0] = phi0, G[L+1] = g_top)."""
    L, T = lay.L, lay.T
    return [f"Phi[{l - 1}]" if l > 1 else ("const", boundary_tril(phi0, lay)),
            f"G[{l + 1}]" if l < L else ("const", boundary_tril(g_top, lay)),
            f"A[{l - 1}]" if l > 1 else ("const", np.zeros(T * T)),
            f"B[{l}]" if l < L else ("const", np.zeros(T * T)),
            f"Phi_hat[{l}]", f"G_hat[{l}]", "Delta",
            "Delta_hat" if l == L else ("const", np.zeros(T))]


def boundary_tril(value, lay: "Layout"):
    """Lower triangle (t >= s) of a boundary kernel: a number on every entry, or a (P, P) matrix over the
    training points read at (point of t, point of s) on the T P steps (time, point) of a spec on P points."""
    if np.ndim(value) == 2:                        # (traced when a family jit traces the parameters)
        P = np.shape(value)[0]
        ti, si = lay.tril
        return array_module(value).asarray(value)[ti % P, si % P]
    return value * np.ones(lay.nt)


def log_z_local(v, model, top, *, T):
    """ln Z_l = -1/2 ln det [[-Q, M^T], [M, Sw]] of ``model``'s action from the layer's local variables
    v = [Phi[l-1] (tril), G[l+1] (tril), A[l-1] (T*T), B[l] (T*T), Phi_hat[l] (tril), G_hat[l] (tril),
    Delta, Delta_hat].  The first layer passes Phi[0] = phi0 1 1^T and A[0] = 0, the last G[L+1] = g_top 1 1^T,
    B[L] = 0 and top = 1 (the Delta_hat source term belongs to the last layer only): with the readout's feature
    coefficients (a, b) (:meth:`DeepModel.features`) it adds sum_t Delta_hat(t) (a h(t) z(t) + b h(0) z(0)) to
    -x^T Q x / 2."""
    pp, gn, a, b, ph, gh, Delta, dh = split_local(v, T)
    phi_prev, g_next = sym_from_tril(tril_matrix(pp, T)), sym_from_tril(tril_matrix(gn, T))
    ph, gh = tril_matrix(ph, T), tril_matrix(gh, T)
    C, E = model.couplings(phi_prev, g_next, a.reshape(T, T), b.reshape(T, T), Delta)
    eye, zero = jnp.eye(T), jnp.zeros((T, T))
    M = jnp.block([[eye, -C], [-E, eye]])
    fa, fb = model.features()
    P = model.points                   # the fixed-time feature h(0) z(0) of each point (its step at time 0)
    Qhz = -top * (jnp.diag(fa * dh) + zero.at[jnp.arange(P), jnp.arange(P)].add((fb * dh).reshape(-1, P).sum(0)))
    Q = jnp.block([[ph + ph.T, Qhz], [Qhz.T, gh + gh.T]])
    Sw = jnp.block([[phi_prev, zero], [zero, g_next]])
    big = jnp.block([[-Q, M.T], [M, Sw]])
    return -0.5 * jnp.linalg.slogdet(big)[1]


def gather_local(x, lay, l, phi0: float = 1.0, g_top: float = 1.0):
    """local vector of layer l and, per entry, its index in the flat layout (-1 for constants)."""
    vals, idx = [], []
    for part in _local_parts(lay, l, phi0, g_top):
        if isinstance(part, tuple):
            vals.append(part[1])
            idx.append(-np.ones(len(part[1]), dtype=int))
        else:
            vals.append(x[lay.slice(part)])
            idx.append(lay.indices(part))
    return array_module(*vals).concatenate(vals), np.concatenate(idx)


def bilinear_part(q, *, L, T, y):
    """The bilinear part: Delta_hat (Delta - y0), the kernel-hat pairings and -Tr(A B)."""
    if jnp.ndim(y):                                               # (P,) on several points: every step's
        y = jnp.tile(y, T // jnp.shape(y)[0])
    s = q["Delta_hat"] @ (q["Delta"] - y)
    for l in range(1, L + 1):
        s = s + jnp.sum(q[f"Phi_hat[{l}]"] * q[f"Phi[{l}]"]) + jnp.sum(q[f"G_hat[{l}]"] * q[f"G[{l}]"])
    for l in range(1, L):
        s = s - jnp.sum(q[f"A[{l}]"] * q[f"B[{l}]"].T)            # Tr(A B)
    return s


def saddle_point_vector(sad: Saddle) -> np.ndarray:
    """The saddle point as a flat vector: kernels and Delta from the march, hats 0, A = Rphi, B = Rg."""
    L, T = sad.L, sad.T
    lay = Layout(L, T)
    q = {"Delta": sad.Delta, "Delta_hat": np.zeros(T)}
    for l in range(1, L + 1):
        q[f"Phi[{l}]"] = sad.Phi[l - 1]
        q[f"G[{l}]"] = sad.G[l - 1]
        q[f"Phi_hat[{l}]"] = np.zeros((T, T))
        q[f"G_hat[{l}]"] = np.zeros((T, T))
    for l in range(1, L):
        q[f"A[{l}]"] = sad.Rphi[l - 1]           # couples g^{l+1}(s) into h^{l+1}(t)
        q[f"B[{l}]"] = sad.Rg[l]                 # = Rg[l+1], couples h^l(s) into z^l(t)
    return lay.pack(q)


# ----------------------------------------------------------------------------------------------
# Hessian and propagator
# ----------------------------------------------------------------------------------------------
def bilinear_pairs(lay: "Layout"):
    """Constant Hessian of the bilinear part S_0 as index pairs (ia, ib) and values (each pair once, ia != ib):
    +1 between every kernel entry / Delta and its conjugate, -1 between A[l](t,s) and B[l](s,t) (-Tr(A B))."""
    ia, ib, val = [], [], []
    names = [(f"Phi[{l}]", f"Phi_hat[{l}]") for l in range(1, lay.L + 1)]
    names += [(f"G[{l}]", f"G_hat[{l}]") for l in range(1, lay.L + 1)] + [("Delta", "Delta_hat")]
    for a, b in names:
        ia.append(lay.indices(a))
        ib.append(lay.indices(b))
        val.append(np.ones(len(ia[-1])))
    TT = np.arange(lay.T * lay.T).reshape(lay.T, lay.T)
    for l in range(1, lay.L):
        ia.append(lay.indices(f"A[{l}]"))
        ib.append(lay.indices(f"B[{l}]")[TT.T.reshape(-1)])   # A(t,s) pairs with B(s,t)
        val.append(-np.ones(len(ia[-1])))
    return np.concatenate(ia), np.concatenate(ib), np.concatenate(val)


def observable_names(L: int) -> list:
    return ["Delta", "K"] + [f"Phi[{l}]" for l in range(1, L + 1)] + [f"G[{l}]" for l in range(1, L + 1)]


@dataclass
class Propagator:
    """sigma[a][b] (T,T) = lim N Cov(a(t), b(s)) for a, b in observable_names(L) (time-diagonal kernels);
    sigma_phys over the packed physical block of ``layout`` (all kernel entries t >= s and Delta)."""
    saddle: Saddle
    layout: Layout
    sigma: dict
    sigma_phys: np.ndarray
    diagnostics: dict
    m1_phys: np.ndarray | None = None     # O(1/N) mean correction of the packed physical block (correction=True)

    def mean_correction(self, name: str) -> np.ndarray:
        """m1 with E[q]_N = q_inf + m1 / N + O(N^-2): (T,) for Delta and K, (T, T) for the kernels Phi[l], G[l]
        (:mod:`dmftc.runtime.engines.deep_linear_correction`)."""
        if self.m1_phys is None:
            raise ValueError("no mean correction: compute the propagator with correction=True")
        lay, T, sad = self.layout, self.layout.T, self.saddle
        if name == "K":       # K(t) = k(kernel diagonals at t): dk . m1 + 1/2 tr(d2k Sigma) at each t
            L = lay.L
            dPhi, dG = [np.diag(sad.phi(l)) for l in range(L + 1)], [np.diag(sad.g(l)) for l in range(1, L + 2)]
            kP, kG = sad.model.k_jacobian(dPhi, dG)
            out = sum(kP[l - 1] * np.diag(self.mean_correction(f"Phi[{l}]"))
                      + kG[l - 1] * np.diag(self.mean_correction(f"G[{l}]")) for l in range(1, L + 1))
            kk = sad.model.k_hessian(dPhi, dG)                           # (T, 2L, 2L)
            var = [f"Phi[{l}]" for l in range(1, L + 1)] + [f"G[{l}]" for l in range(1, L + 1)]
            cov = np.stack([np.stack([np.diag(self.sigma[a][b]) for b in var], axis=1) for a in var], axis=1)
            return out + 0.5 * np.einsum("tij,tij->t", kk, cov)
        if name not in lay.blocks or lay.blocks[name][0] >= lay.n_phys:
            raise ValueError(f"unknown order parameter {name!r}; expected Delta, K, Phi[l] or G[l]")
        v = self.m1_phys[lay.slice(name)]
        if name == "Delta":
            return v.copy()
        out = np.zeros((T, T))
        out[lay.tril] = v
        out[lay.tril[1], lay.tril[0]] = v
        return out

    def __getitem__(self, a):
        return self.sigma[a]

    def var(self, name):
        """lim N Var(name(t)), shape (T,)."""
        return np.diag(self.sigma[name][name]).copy()

    def two_time(self, a: str, b: str | None = None) -> np.ndarray:
        """Full two-time block (T,T,T,T): N Cov(a(t,s), b(t',s')) for kernels a, b in 'Phi[l]', 'G[l]'."""
        b = a if b is None else b
        lay, T = self.layout, self.layout.T
        ti, si = lay.tril
        S = self.sigma_phys[lay.slice(a), lay.slice(b)]           # (nt, nt)
        out = np.zeros((T, T, T, T))
        for i, (t, s) in enumerate(zip(ti, si)):
            blk = np.zeros((T, T))
            blk[ti, si] = S[i]
            blk[si, ti] = S[i]
            out[t, s] = blk
            out[s, t] = blk
        return out


def observable_map(sad: Saddle, lay: "Layout", model=None):
    """(names, rows, J): the linear map J (len(names) T, n_phys) from the packed physical block to the
    time-diagonal observables Delta, K, Phi[l](t,t), G[l](t,t); rows[name] are its rows of that observable.
    K(t) (the formula of ``model``, default the saddle's model) is linearised at the saddle ``sad`` by JAX."""
    model = sad.model if model is None else model
    L, T = sad.L, sad.T
    names = observable_names(L)
    J = np.zeros((len(names) * T, lay.n_phys))
    diag_pos = np.array([i for i, (t, s) in enumerate(zip(*lay.tril)) if t == s])   # position of (t,t)
    rows = {n: np.arange(k * T, (k + 1) * T) for k, n in enumerate(names)}
    J[rows["Delta"], np.arange(lay.n_phys)[lay.slice("Delta")]] = 1.0
    for l in range(1, L + 1):
        J[rows[f"Phi[{l}]"], lay.blocks[f"Phi[{l}]"][0] + diag_pos] = 1.0
        J[rows[f"G[{l}]"], lay.blocks[f"G[{l}]"][0] + diag_pos] = 1.0
    kP, kG = model.k_jacobian([np.diag(sad.phi(l)) for l in range(L + 1)], [np.diag(sad.g(l)) for l in range(1, L + 2)])
    for l in range(1, L + 1):
        J[rows["K"], lay.blocks[f"Phi[{l}]"][0] + diag_pos] += kP[l - 1]
        J[rows["K"], lay.blocks[f"G[{l}]"][0] + diag_pos] += kG[l - 1]
    return names, rows, J
