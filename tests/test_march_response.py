"""The deep propagator as the linear response of the march (dmftc/reference/march_response.py).

Sigma = J (kappa + H) J^T: the march's response to noise injected into every average, the paths' covariance
of the observables (response tangents included) and the path mean of the log-weight's second derivative in
the duals.  Checked against the MSR-Hessian propagator of the runtime, which is validated against networks."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dmftc.reference.march_response import Layout, dual_indices, march

jax.config.update("jax_enable_x64", True)


def test_log_weight_gradient_is_the_observables():
    """dl/dy at y = 0 equals the per-path observables: the kernels' products, the readout, and the response
    tangents as derivatives of -ln det(1 - dF/dx) in the anti-causal couplings."""
    import dmftc.reference.march_response as mr

    L, T, S = 2, 2, 64
    kw = dict(phi=jnp.tanh, L=L, T=T, gamma=1.3, eta=0.3, y=-0.7)
    ku, kr = jax.random.split(jax.random.PRNGKey(3))
    xiu, xir = jax.random.normal(ku, (L, T, S)), jax.random.normal(kr, (L, T, S))
    _, O, sd = march(jnp.zeros(Layout(L, T).n), xiu, xir, keep=True, **kw)
    for l in range(1, L + 1):
        grads = mr.log_weight_gradient(sd, l, **{k: kw[k] for k in ("phi", "L", "T", "gamma", "eta")})
        ix = dual_indices(Layout(L, T), l)
        np.testing.assert_allclose(np.asarray(grads).T, np.asarray(O[ix]), atol=1e-12)


@pytest.mark.slow
def test_march_response_equals_the_msr_propagator():
    """tanh, L = 2, T = 3: every N Var within z <= 4 of the runtime's propagator; without H (independent
    neurons) the same estimator is more than 4 standard errors off (measured: Phi[1](2) z = 13)."""
    from dmftc.deep import solve_deep
    from dmftc.reference.march_response import propagator

    kw = dict(L=2, T=3, gamma=1.0, eta=0.2, y=1.0)
    ref = solve_deep(activation="tanh", propagator_samples=80000, **kw)
    full = propagator(phi=jnp.tanh, paths=20000, groups=4, **kw)
    naive = propagator(phi=jnp.tanh, paths=20000, groups=4, second_order=False, **kw)
    worst_naive = 0.0
    for name, (m, se) in full.items():
        r, rse = np.asarray(ref.var(name)), np.asarray(ref.var_stderr(name))
        comb = np.sqrt(se ** 2 + rse ** 2)[1:]
        z = np.abs(m - r)[1:] / comb
        assert np.all(z <= 4), (name, m, r, z)
        worst_naive = max(worst_naive, float(np.max(np.abs(naive[name][0] - r)[1:] /
                                                    np.sqrt(naive[name][1] ** 2 + rse ** 2)[1:])))
    assert worst_naive > 4
