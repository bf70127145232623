"""The exact O(1/N) mean correction of deep linear networks (dmftc.runtime.engines.deep_linear_correction).

Checked three ways: the cubic contraction against a dense third-derivative tensor of the whole action (tiny
size); L = 1 against the two-layer engine on specs/eos.dmft (the same network, an independent derivation: the
second-order expansion of the neuron-average fixed point, Monte Carlo with standard errors); L = 2 against
finite-width networks in ``experiments/deep_linear_correction.py --quick`` (tests/test_experiments.py).
"""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dmftc
from dmftc.errors import ParameterError
from dmftc.runtime.problem.deep_action import Layout, saddle_point_vector
from dmftc.runtime.engines.deep_linear import deep_linear_action, deep_linear_propagator, deep_linear_saddle
from dmftc.runtime.engines.deep_linear_correction import cubic_contraction
from dmftc.reference.standard_model import standard
from models import odd_model  # noqa: E402  (tests/models.py)

ROOT = Path(__file__).resolve().parent.parent


# the odd model exercises every term the standard one does and more; the standard one runs with -m slow
@pytest.mark.parametrize("odd", [pytest.param(False, marks=pytest.mark.slow), True])
def test_cubic_contraction_equals_dense_third_derivative(odd):
    """s_b = sum_cd S3_bcd C_cd from per-layer directional derivatives = the dense jacfwd(hessian) tensor, for
    the standard network and for a model with nonlinear couplings, another readout and boundaries."""
    L, T = 2, 3
    model = odd_model() if odd else standard(gamma=1.3, eta=0.2, y=0.8)
    x0 = saddle_point_vector(deep_linear_saddle(L=L, T=T, model=model))
    rng = np.random.default_rng(4)
    n = Layout(L, T).n
    C = rng.standard_normal((n, n))
    C = C + C.T
    x = x0 + 0.05 * rng.standard_normal(n)           # away from the saddle: every term of S3 is exercised
    S3 = jax.jit(jax.jacfwd(jax.hessian(lambda v: deep_linear_action(v, L=L, T=T, model=model))))(jnp.asarray(x))
    ref = np.einsum("bcd,cd->b", np.asarray(S3), C)
    got = cubic_contraction(x, C, L=L, T=T, model=model)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-9 * np.abs(ref).max())


def test_mean_correction_of_a_model_k_takes_its_second_derivatives():
    """K of the odd model is sum_l (1 + l/2) G[l+1] Phi[l] + 0.2 Phi[L]^2 at each t: its O(1/N) mean correction is
    the linearised m1 plus, written out by hand, (1 + l/2) Sigma(G[l+1], Phi[l]) for l = 1..L-1 and
    0.2 Sigma(Phi[L], Phi[L]) (the propagator computes it with JAX second derivatives of the model's K)."""
    L, T = 3, 5
    model = odd_model()
    P = deep_linear_propagator(L=L, T=T, model=model, correction=True)
    sad = P.saddle
    d = lambda a: np.diag(a)  # noqa: E731
    lin = sum((1 + 0.5 * l) * (d(sad.g(l + 1)) * d(P.mean_correction(f"Phi[{l}]")) if l >= 1 else 0)
              + (1 + 0.5 * l) * (d(sad.phi(l)) * d(P.mean_correction(f"G[{l + 1}]")) if l + 1 <= L else 0)
              for l in range(L + 1))
    lin = lin + 0.4 * d(sad.phi(L)) * d(P.mean_correction(f"Phi[{L}]"))
    quad = sum((1 + 0.5 * l) * d(P.sigma[f"G[{l + 1}]"][f"Phi[{l}]"]) for l in range(1, L)) \
        + 0.2 * d(P.sigma[f"Phi[{L}]"][f"Phi[{L}]"])
    got = P.mean_correction("K")
    np.testing.assert_allclose(got, lin + quad, rtol=1e-10, atol=1e-12 * np.abs(got).max())
    assert np.abs(quad).max() > 0.01 * np.abs(got).max()             # the second-order term matters here


@pytest.mark.parametrize("gamma, eta, T", [(1.0, 0.1, 10), (2.0, 0.15, 12)])
def test_one_hidden_layer_matches_two_layer_engine(gamma, eta, T):
    """L = 1 is the eos spec's network: m1 of Delta and K from the third derivatives of the closed-form action
    agree with the two-layer engine's (Monte Carlo) m1 within 4 standard errors at every t."""
    P = deep_linear_propagator(L=1, gamma=gamma, y=1.0, eta=eta, T=T, correction=True)
    sol = dmftc.load(ROOT / "specs" / "eos.dmft").solve(gamma=gamma, eta=eta, T=T, backend="exact",
                                                         correction=True, samples=100000, seed=3)
    for name in ("Delta", "K"):
        ref, se = sol.mean_correction(name), sol.mean_correction(name, stderr=True)
        got = P.mean_correction(name)
        assert np.abs(ref).max() > 20 * se.max(), name          # the correction is resolved: the test can fail
        ok = se > 1e-8 * se.max()                    # Delta(0), Delta(1) and K(0) are exact (round-off here)
        z = np.abs(got - ref)[ok] / se[ok]
        assert z.max() <= 4, (name, z.round(2))
        assert np.all(np.abs(got[~ok]) <= 1e-10 * np.abs(got).max()), (name, got[~ok])


def test_spec_api_and_expected_loss():
    m = dmftc.load(ROOT / "specs" / "deep_linear.dmft")
    sol = m.solve(T=8, correction=True)
    T = 8
    assert sol.mean_correction("Delta").shape == (T,)
    assert sol.mean_correction("Phi[1]").shape == (T, T)
    m1 = sol.mean_correction("Phi[2]")
    np.testing.assert_array_equal(m1, m1.T)
    np.testing.assert_array_equal(sol.mean_correction("K", stderr=True), np.zeros(T))
    np.testing.assert_allclose(sol.mean_at_width("K", 50), sol.mean("K") + sol.mean_correction("K") / 50)
    d = sol.mean("Delta")
    np.testing.assert_allclose(sol.expected_loss(64), d ** 2 + (2 * d * sol.mean_correction("Delta")
                                                                + sol.var("Delta")) / 64)
    # K = sum_l G[l+1] Phi[l]: its correction carries the covariance of the two factors
    lin = sum(np.diagonal(sol.mean(f"G[{l + 1}]") if l < 2 else np.ones((T, T))) * np.diagonal(sol.mean_correction(f"Phi[{l}]"))
              + np.diagonal(sol.mean(f"Phi[{l - 1}]") if l > 1 else np.ones((T, T))) * np.diagonal(sol.mean_correction(f"G[{l}]"))
              for l in (1, 2))
    np.testing.assert_allclose(sol.mean_correction("K"), lin + np.diag(sol.sigma("G[2]", "Phi[1]")), atol=1e-12)
    with pytest.raises(ParameterError, match="response function"):
        sol.mean_correction("A[1]")
    with pytest.raises(ParameterError, match="no mean correction"):
        m.solve(T=8).mean_correction("Delta")


def test_nonlinear_deep_correction_is_refused_with_its_cost():
    m = dmftc.load(ROOT / "specs" / "deep_tanh.dmft")
    with pytest.raises(ParameterError, match="linear activations"):
        m.solve(T=5, samples=200, correction=True)


def test_cli_width_on_a_deep_linear_spec(capsys, tmp_path):
    from dmftc.cli import main

    png = tmp_path / "w.png"
    assert main(["run", str(ROOT / "specs" / "deep_linear.dmft"), "--set", "T=6", "--width", "64",
                 "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "at width N = 64" in out and "Phi[2]" in out and "expected loss" in out
    assert "A[1]" not in out.split("at width N = 64")[1]          # responses have no width-N line
    assert png.stat().st_size > 10_000
