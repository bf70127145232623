"""The adjoint propagator (dmftc/runtime/adjoint): reverse-mode sensitivities of the spec's own march, and the
log-weights' second derivatives from per-path forward products and loops, against the brute-force
march-response form (dmftc/reference/march_response.py: jacfwd of the unrolled march, jax.hessian of each
path's log-weight) on the same paths, and against the MSR-Hessian propagator of the runtime in standard errors."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dmftc.reference.march_response import Layout, dual_indices, log_weight_hessian, march
from dmftc.runtime.adjoint.propagator import group_sigma, program_of
from dmftc.runtime.adjoint.sweep import output_names

jax.config.update("jax_enable_x64", True)


def _reference(L, T, S, gamma, eta, y, key):
    """(names, kappa part, H part) of the march-response form on standard normals of ``key``."""
    kw = dict(phi=jnp.tanh, L=L, T=T, gamma=gamma, eta=eta, y=y)
    ku, kr = jax.random.split(jax.random.PRNGKey(key))
    xiu, xir = jax.random.normal(ku, (L, T, S)), jax.random.normal(kr, (L, T, S))
    n = Layout(L, T).n
    J = np.asarray(jax.jacfwd(lambda e: march(e, xiu, xir, **kw))(jnp.zeros(n)))
    _, O, sd = march(jnp.zeros(n), xiu, xir, keep=True, **kw)
    Oc = np.asarray(O - O.mean(1, keepdims=True))
    H = np.zeros((n, n))
    for l in range(1, L + 1):
        Hl = jax.jit(lambda d, l=l: log_weight_hessian(d, l, phi=jnp.tanh, L=L, T=T, gamma=gamma, eta=eta)[0])(sd)
        ix = dual_indices(Layout(L, T), l)
        H[np.ix_(ix, ix)] += np.asarray(Hl)
    names = ["Delta", "K"] + [f"Phi[{l}]" for l in range(1, L + 1)] + [f"G[{l}]" for l in range(1, L + 1)]
    return names, J @ (Oc @ Oc.T / S) @ J.T, J @ H @ J.T, (xiu, xir)


def _adjoint(L, T, S, gamma, eta, y, xiu, xir, names):
    prog = program_of(L=L, T=T, activation="tanh", gamma=gamma, y=y, eta=eta)
    k, h = group_sigma(prog, {"u": jnp.swapaxes(xiu, 1, 2), "r": jnp.swapaxes(xir, 1, 2)}, jnp.full(S, 1.0 / S))
    mine = output_names(prog)
    perm = np.concatenate([np.arange(T) + T * mine.index(n) for n in names])
    return np.asarray(k)[np.ix_(perm, perm)], np.asarray(h)[np.ix_(perm, perm)]


@pytest.mark.slow          # a prototype no solve uses (like dmftc.runtime.matrix_free): 16-24 s of the suite
@pytest.mark.parametrize("L, T, gamma, eta, y", [(2, 3, 1.3, 0.3, -0.7), (3, 3, 0.8, 0.4, 1.1)])
def test_adjoint_equals_the_march_response_form(L, T, gamma, eta, y):
    """Same paths: the kappa part (covariance of d outputs / d path weight) and the H part (forward products
    along the response duals' source moves, and loops) equal J kappa J^T and J H J^T to round-off."""
    S = 40
    names, rk, rh, (xiu, xir) = _reference(L, T, S, gamma, eta, y, key=3)
    k, h = _adjoint(L, T, S, gamma, eta, y, xiu, xir, names)
    assert np.abs(rh).max() > 1e-3 * np.abs(rk).max()            # H matters at this setting
    np.testing.assert_allclose(k, rk, rtol=0, atol=1e-10 * np.abs(rk).max())
    np.testing.assert_allclose(h, rh, rtol=0, atol=1e-10 * np.abs(rh).max())


@pytest.mark.slow
def test_adjoint_agrees_with_the_msr_propagator():
    """A different estimator of the same propagator (source-covariance sensitivities pathwise through the
    Cholesky factors, not Price's theorem): tanh, L = 2, T = 10, 4000 paths each, every N Var within z <= 4."""
    from dmftc.runtime.adjoint.propagator import adjoint_propagator
    from dmftc.runtime.engines.deep_propagator import deep_propagator

    kw = dict(L=2, T=10, activation="tanh", gamma=1.0, y=1.0, eta=0.05)
    A = adjoint_propagator(paths=4000, groups=8, seed=5, **kw)
    D = deep_propagator(samples=4000, groups=8, seed=5, **kw)
    for n in A.names:
        z = np.abs(A.var(n) - D.var(n))[1:] / np.sqrt(A.var_se(n) ** 2 + D.se_var(n) ** 2)[1:]
        assert np.all(z <= 4), (n, z)
