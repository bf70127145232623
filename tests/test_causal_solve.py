"""Causal (block back substitution) propagator of the deep action against the dense LU of the whole Hessian."""
import numpy as np
import pytest

from dmftc.runtime.solvers.causal_solve import causal_order
from dmftc.runtime.solvers.linalg import left_solve
from dmftc.reference.dense_hessian import assemble_hessian, propagator_from_hessian
from dmftc.runtime.problem.deep_action import Layout
from dmftc.runtime.engines.deep_propagator import group_propagator
from dmftc.errors import NumericalError


def test_left_solve_matches_dense_solve():
    rng = np.random.default_rng(3)
    edges = np.array([0, 2, 5, 9, 14])
    n = edges[-1]
    U = rng.standard_normal((n, n))
    for b in range(len(edges) - 1):                     # zero above the diagonal blocks
        U[edges[b]:edges[b + 1], edges[b + 1]:] = 0.0
    E = rng.standard_normal((3, n))
    Y, cond = left_solve(U, edges, E)
    np.testing.assert_allclose(Y, np.linalg.solve(U.T, E.T).T, rtol=1e-11, atol=1e-11)
    assert cond >= 1.0


def test_left_solve_singular_block_is_reported():
    edges = np.array([0, 2, 4])
    U = np.eye(4)
    U[2:, 2:] = [[1.0, 2.0], [2.0, 4.0]]
    with pytest.raises(NumericalError, match="singular at time 1"):
        left_solve(U, edges, np.ones((1, 4)))


@pytest.mark.parametrize("L,T", [(1, 5), (3, 3)])
def test_causal_order_blocks_are_square_and_cover_everything(L, T):
    lay = Layout(L, T)
    co = causal_order(lay)
    assert len(co.primal) == len(co.dual) == lay.n // 2
    assert np.array_equal(np.sort(np.concatenate([co.primal, co.dual])), np.arange(lay.n))
    assert co.is_primal[: lay.n_phys].all() and not co.is_primal[lay.n_phys: 2 * lay.n_phys].any()


@pytest.mark.parametrize("L,T", [(2, 5), (3, 6)])
def test_causal_propagator_equals_dense_inverse(L, T):
    """Same Monte Carlo Hessian, two solvers: the whole physical block agrees to round-off, and the
    primal-primal block of every local Hessian is exactly zero (the premise of the causal solve)."""
    xi = np.random.default_rng(1).standard_normal((2, L, 300, T))
    kw = dict(activation="tanh", L=L, gamma=1.0, y=1.0, eta=0.1, T=T, xiu=xi[0], xir=xi[1])
    causal = group_propagator(**kw, full=True, keep_local=True)
    lay = Layout(L, T)
    H = assemble_hessian(causal.x0, lay, causal.saddle.model, causal.local_hessians)
    dense = propagator_from_hessian(causal.saddle, H)
    scale = np.abs(dense.sigma_phys).max()
    assert np.abs(causal.sigma_phys - dense.sigma_phys).max() < 1e-12 * scale
    assert causal.diagnostics["primal_block_max"] == 0.0
    short = group_propagator(**kw)                      # observables only
    assert short.sigma_phys is None
    for a in dense.sigma:
        for b in dense.sigma:
            np.testing.assert_allclose(short.sigma[a][b], dense.sigma[a][b], rtol=0, atol=1e-12 * scale)


def _timed(d):
    """A coefficient that depends on (t, s) (as a spec's time coefficients do), sized by Delta (1, T)."""
    import jax.numpy as jnp

    n = jnp.shape(d)[-1]
    return 1.0 + 0.1 * jnp.arange(n)[:, None] + 0.05 * jnp.arange(n)[None, :] ** 2


@pytest.mark.parametrize("odd", [False, True, "timed"])
def test_theta_jacobian_matches_autodiff(odd):
    """The sparse chain rule v -> (C, E, hats) used by the local Hessians (elementwise partials of the model's
    couplings) equals jax.jacfwd / jax.hessian of the whole map, for the standard network, for couplings
    nonlinear in the kernels and in Delta, and for couplings whose coefficients depend on (t, s)."""
    import jax.numpy as jnp

    from dmftc.runtime.problem.deep_model import DeepModel
    from dmftc.reference.standard_model import standard
    from dmftc.runtime.sensitivities.local_estimator import _theta_jacobian
    from dmftc.reference.deep_autodiff import _theta_map

    model = standard(gamma=0.7, eta=0.3, y=1.0) if not odd else DeepModel(
        key=("odd-theta",), label="odd", k_h=lambda q, d: 0.3 * d * q + 0.1 * d ** 2 * q ** 2 + 0.2 * q ** 3,
        k_z=lambda q, d: jnp.sin(d) * q / (1 + 0.2 * q ** 2), readout=(0.6, -0.9, 0.5), phi0=0.7, g_top=1.3,
        k_of=lambda P, G: sum(G[l] * P[l] for l in range(len(P))))
    if odd == "timed":
        model = DeepModel(key=("timed-theta",), label="timed", k_h=lambda q, d: _timed(d) * (0.3 * d * q + 0.1 * q ** 2),
                          k_z=lambda q, d: _timed(d).T * jnp.sin(d) * q ** 2, readout=(0.6, -0.9, 0.5), phi0=0.7,
                          g_top=1.3, k_of=lambda P, G: sum(G[l] * P[l] for l in range(len(P))))
    T = 4
    nt = T * (T + 1) // 2
    rng = np.random.default_rng(5)
    v = rng.standard_normal(4 * nt + 2 * T * T + 2 * T)
    m = rng.standard_normal(2 * T * T + 2 * nt + T)
    J, (i, j, val) = _theta_jacobian(v, m, T, model)
    Jr, Hr = (np.asarray(a) for a in _theta_map(T, model)(jnp.asarray(v), jnp.asarray(m)))
    np.testing.assert_allclose(J.toarray(), Jr, rtol=0, atol=1e-14)
    H = np.zeros_like(Hr)
    np.add.at(H, (i, j), val)
    np.testing.assert_allclose(H, Hr, rtol=0, atol=1e-14)
    assert np.abs(Hr).max() > 0.1


@pytest.mark.parametrize("T, points", [(4, 1), (6, 2)])
def test_dual_positions_of_a_local_vector_are_the_causal_solve_duals(T, points):
    """The directions along which the linear propagator differentiates each ln Z_l (dmftc.runtime.engines.deep_linear.
    dual_positions) are exactly the local variables that the causal order calls dual, in every layer (restricted
    to the entries that are variables there), and they are half of all directions."""
    from dmftc.runtime.problem.deep_action import gather_local
    from dmftc.runtime.engines.deep_linear import dual_positions

    L = 3
    lay = Layout(L, T)
    co = causal_order(lay, points)
    dual = dual_positions(T, points)
    x = np.zeros(lay.n)
    for l in (1, 2, 3):
        _, idx = gather_local(x, lay, l)
        var = idx >= 0
        want = np.flatnonzero(var & ~co.is_primal[np.where(var, idx, 0)])
        got = dual[var[dual]]
        np.testing.assert_array_equal(np.sort(got), want)
        if l == 2:                                  # all but Delta_hat (the last layer's) are variables here
            assert var[:-T].all() and len(dual) == len(idx) // 2
