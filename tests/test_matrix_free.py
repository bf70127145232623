"""The matrix-free propagator (dmftc.runtime.matrix_free): Hessian-vector products of each layer's Monte Carlo
ln Z_l equal the dense Hessian (Price blocks pathwise) times random vectors, and the products-only Neumann solve
equals the causal solve of the assembled blocks, on the same paths, to round-off."""
import numpy as np
import pytest

from dmftc.runtime.problem.deep_action import Layout, gather_local, saddle_point_vector
from dmftc.runtime.engines.deep_propagator import group_propagator, mc_saddle
from dmftc.runtime.sensitivities.local_estimator import LocalEstimator
from dmftc.runtime.matrix_free.products import LayerProducts
from dmftc.runtime.matrix_free.solve import matrix_free_propagator
from dmftc.runtime.problem.standard_spec import model_and_activation


def _group(L, T, S=32):
    xi = np.random.default_rng(1).standard_normal((2, L, S, T))
    model, act = model_and_activation(None, "tanh", 1.0, 1.0, 0.1, L=L)
    sad, fields = mc_saddle(activation=act, L=L, T=T, xiu=xi[0], xir=xi[1], model=model)
    return xi, act, sad, fields


def _assert_products_equal_dense_hessian(act, sad, fields, L, T, chunk):
    """Each layer's matrix-free products U h equal U times the structured estimator's dense Hessian h (1e-10)."""
    model, lay = sad.model, Layout(L, T)
    x0 = saddle_point_vector(sad)
    for l in range(1, L + 1):
        v, _ = gather_local(x0, lay, l, phi0=model.phi0, g_top=model.g_top)
        est = LocalEstimator(T=T, activation=act, vary_u=l > 1, vary_r=l < L)
        est.price_tol = None
        _, _, h = est.log_z(np.asarray(v), fields.w[l - 1], fields.x[l - 1], top=float(l == L), model=model)
        lp = LayerProducts(T=T, activation=act, vary_u=l > 1, vary_r=l < L, model=model, v=np.asarray(v),
                           W=fields.w[l - 1], X0=fields.x[l - 1], top=l == L, chunk=chunk)
        U = np.random.default_rng(2).standard_normal((3, lp.nv))
        ref = U @ h
        assert np.abs(lp.apply(U) - ref).max() < 1e-10 * np.abs(ref).max()


@pytest.mark.slow
def test_layer_products_equal_dense_hessian():
    L, T = 2, 4
    _, act, sad, fields = _group(L, T)
    _assert_products_equal_dense_hessian(act, sad, fields, L, T, chunk=32)


@pytest.mark.slow
def test_matrix_free_solve_equals_causal_solve(monkeypatch):
    monkeypatch.setattr(LocalEstimator, "price_tol", None)
    L, T = 2, 4
    xi, act, sad, fields = _group(L, T)
    P = group_propagator(activation="tanh", L=L, T=T, xiu=xi[0], xir=xi[1], gamma=1.0, y=1.0, eta=0.1)
    M = matrix_free_propagator(sad, fields, activation=act)
    assert M.diagnostics["neumann_terms"] == 2 * T + 1
    for a in P.sigma:
        for b in P.sigma:
            scale = np.abs(P.sigma[a][b]).max()
            assert np.abs(M.sigma[a][b] - P.sigma[a][b]).max() <= 1e-8 * scale


@pytest.mark.slow
def test_layer_products_with_one_time_coefficients():
    """A spec whose local functions read one-time coefficients (specs/deep_sgd.dmft with weight decay: phi(a(t) h),
    g = a(t) phi'(a(t) h) z): the matrix-free products (the integrand's local map, fed the coefficients' values per
    step) equal the dense Hessian of the structured estimator (fed them by its own path) to round-off."""
    from dmftc.runtime.problem.deep_model import from_spec
    from dmftc.runtime.problem.params import resolve_deep_params
    from dmftc.runtime.problem.spec_kernels import SpecKernels
    from generated import deep_sgd as mod

    p, L, T = resolve_deep_params(mod, dict(L=2, T=3, lam=0.7, beta=0.5, eta=0.2, gamma=1.2, y=0.8,
                                            lr=np.linspace(1.0, 0.5, 3)))
    assert np.ptp(np.asarray(mod.coefficients(p, T)["a"])) > 0.1          # a(t) really varies
    act = SpecKernels(mod).site_activation(p, 0.1)
    xi = np.random.default_rng(1).standard_normal((2, L, 16, T))
    sad, fields = mc_saddle(activation=act, L=L, T=T, xiu=xi[0], xir=xi[1], model=from_spec(mod, p))
    _assert_products_equal_dense_hessian(act, sad, fields, L, T, chunk=16)
