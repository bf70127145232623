"""O(1/N) correction to the mean of deep LINEAR networks, from third derivatives of their exact action.

For a linear network the finite-width law of all order parameters x (kernels, Delta, their conjugates and the
response pairs A, B of :mod:`dmftc.runtime.engines.deep_linear`) is exactly proportional to exp(N S(x)): every
single-site integral is Gaussian, so ln Z_l carries no hidden 1/N terms.  Expanding around the saddle x*,
N S = N S* + N/2 d^T H d + N/6 S3[d, d, d] + ..., and taking the Gaussian moments of d under
exp(N/2 d^T H d) (covariance C / N with C = -H^-1, formally for the conjugate directions) gives

    E[x]_N = x* + m1 / N + O(N^-2),     m1_a = 1/2 C_ab S3_bcd C_cd       (Wick: 3 pairings of the cubic term).

S3 is never formed.  S is the bilinear pairing (no third derivative) plus sum_l ln Z_l(v_l) over each layer's
local variables v_l, so S3_bcd C_cd = sum_l P_l^T grad_v tr(C_l Hess ln Z_l(v)) with C_l = P_l C P_l^T.  With
C_l = sum_k lambda_k u_k u_k^T (eigendecomposition, indefinite in general), tr(C_l Hess f) = sum_k lambda_k
u_k^T Hess f u_k, and each term's gradient is one third-order directional derivative of f by JAX
(forward-over-reverse, then reverse), batched over k.  Observables: Delta, Phi[l](t,t) and G[l](t,t) take m1
of their entries; K = sum_l G[l+1](t,t) Phi[l](t,t) is a product of two fluctuating kernels for 1 <= l < L,
so m1_K = J m1 + sum_{l=1}^{L-1} Sigma(G[l+1](t,t), Phi[l](t,t)).

Checked in the tests against the two-layer engine at L = 1 (:mod:`dmftc.runtime.engines.site_engine`, an
independent derivation from the neuron-average expansion) and against finite-width ensembles at L = 2.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dmftc.runtime.problem.deep_action import Layout, gather_local
from dmftc.runtime.problem.deep_action import log_z_local
from dmftc.runtime.problem.deep_model import family_jit
from dmftc.runtime.problem.standard_spec import as_model


__all__ = ["cubic_contraction", "mean_correction_from_inverse"]

_THIRD: dict = {}


def _third_directional(T, model):
    """jit(vmap(u -> grad_v u^T Hess ln Z_l(v) u)) over a batch of directions u (k, n_loc), for ``model``'s
    action (compiled once per T and model family: the model's values are traced)."""
    def build(model_of):
        def one(v, u, top, vals):
            f = lambda z: log_z_local(z, model_of(vals), top, T=T)  # noqa: E731

            def quad(w):
                hv = jax.jvp(jax.grad(f), (w,), (u,))[1]
                return hv @ u
            return jax.grad(quad)(v)

        return jax.vmap(one, in_axes=(None, 0, None, None))

    return family_jit(_THIRD, (T,), model, build)


def cubic_contraction(x0, C, *, L, T, model=None, gamma=None, y=None, eta=None, chunk: int = 128,
                      rtol: float = 1e-13) -> np.ndarray:
    """s_b = sum_cd S3_bcd C_cd at the point x0 (flat layout of :class:`Layout`) for a symmetric C (n, n), for
    ``model``'s action (default: the standard network with gamma, y, eta)."""
    model = as_model(model, gamma, y, eta, L=L)
    lay = Layout(L, T)
    x0 = np.asarray(x0, np.float64)              # host values: the local vectors are gathered in NumPy
    fn = _third_directional(T, model)
    out = np.zeros(lay.n)
    for l in range(1, L + 1):
        v, idx = gather_local(x0, lay, l, model.phi0, model.g_top)
        keep = np.flatnonzero(idx >= 0)
        Cl = np.zeros((len(idx), len(idx)))
        Cl[np.ix_(keep, keep)] = C[np.ix_(idx[keep], idx[keep])]
        lam, U = np.linalg.eigh(0.5 * (Cl + Cl.T))
        use = np.abs(lam) > rtol * np.abs(lam).max()
        lam, U = lam[use], U[:, use].T                                  # directions as rows
        grad = np.zeros(len(idx))
        top = float(l == L)
        k = min(chunk, len(lam))
        for a in range(0, len(lam), k):
            u = U[a:a + k]
            if len(u) < k:          # pad the last chunk with zero directions: one compiled shape per layer size
                u = np.concatenate([u, np.zeros((k - len(u), u.shape[1]))])
            g = np.asarray(fn(v, jnp.asarray(u), top))
            grad += lam[a:a + k] @ g[: len(lam[a:a + k])]
        out[idx[keep]] += grad[keep]
    return out


def mean_correction_from_inverse(x0, C, *, L, T, model) -> np.ndarray:
    """m1 over the whole flat layout: 1/2 C s, s = S3[C] (module doc); C = -H^-1 at the saddle x0 of ``model``'s
    action."""
    s = cubic_contraction(x0, C, L=L, T=T, model=model)
    return 0.5 * C @ s
