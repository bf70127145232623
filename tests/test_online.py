"""Online learning (dmftc.validation.online, specs/online_linear.dmft): the same dynamical system as offline
learning of D whitened points, member by member and in theory (paper App. "Connections to Offline Learning")."""
from pathlib import Path

import numpy as np
import pytest

import dmftc
from dmftc.validation.ensemble import simulate_two_layer
from dmftc.validation.online import simulate_online_linear

ROOT = Path(__file__).resolve().parent.parent


def test_online_networks_are_the_offline_networks_on_whitened_points():
    beta = np.array([0.9, -0.3, 0.2, -0.5])
    kw = dict(gamma=1.3, eta=0.07, T=15, N=32, E=6, seed=4)
    on = simulate_online_linear(beta_star=beta, **kw)
    off = simulate_two_layer(activation="linear", Kx_all=np.eye(4), y=beta, keep_samples=True, **kw)
    np.testing.assert_allclose(on.Delta, off.samples["Delta"], rtol=0, atol=1e-13)
    np.testing.assert_allclose(on.loss, (on.Delta ** 2).sum(axis=1))
    assert np.abs(on.Delta[:, :, -1]).max() < 0.5 * np.abs(beta).max()     # it learns


def test_online_step_is_the_population_gradient():
    """One step by hand: w_i += eta gamma a_i e, a_i += eta gamma w_i . e with e = beta_star - beta~."""
    from dmftc.validation.ensemble import draw_parameters

    beta, gamma, eta, N = np.array([0.6, -0.8]), 0.7, 0.3, 5
    W, a = draw_parameters(np.random.default_rng(2), 1, N, 2)
    W, a = W[0], a[0]
    e0 = beta.copy()
    a1, W1 = a + eta * gamma * W @ e0, W + eta * gamma * np.outer(a, e0)
    beta1 = (a1 @ W1 - a @ W) / (gamma * N)
    run = simulate_online_linear(beta_star=beta, gamma=gamma, eta=eta, T=2, N=N, E=1, seed=2)
    np.testing.assert_allclose(run.Delta[0, :, 1], beta - beta1, rtol=1e-13)


def test_online_spec_theory_equals_offline_spec():
    beta = np.array([0.5, -0.5, 0.7071067811865476])
    on = dmftc.load(ROOT / "specs" / "online_linear.dmft").solve(D=3, beta_star=beta, gamma=1.2, T=12, eta=0.1,
                                                                  backend="exact")
    off = dmftc.load(ROOT / "specs" / "linear_whitened.dmft").solve(P=3, y=beta, gamma=1.2, T=12, eta=0.1,
                                                                     backend="exact")
    np.testing.assert_allclose(on.mean("Delta"), off.mean("Delta"), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(on.sigma("Delta"), off.sigma("Delta"), rtol=1e-10, atol=1e-12)


def test_bad_teacher_is_refused():
    with pytest.raises(ValueError, match="beta_star"):
        simulate_online_linear(beta_star=[], gamma=1.0, eta=0.1, T=3, N=4, E=2)


def test_gram_simulator_is_the_network_member_by_member():
    """The closed update of the Gram matrix [W, a]^T [W, a], started from the drawn networks' own G, gives
    their trajectories to round-off (so the N-independent simulator simulates these networks, not a model)."""
    from dmftc.validation.ensemble import draw_parameters
    from dmftc.validation.online import gram_trajectories

    beta = np.array([0.9, -0.3, 0.2, -0.5, 0.1])
    kw = dict(beta_star=beta, gamma=1.3, eta=0.07, T=40, N=24)
    direct = simulate_online_linear(E=5, seed=3, **kw)
    W, a = draw_parameters(np.random.default_rng(3), 5, 24, 5)
    X = np.concatenate([W, a[:, :, None]], axis=2)
    G = np.swapaxes(X, 1, 2) @ X
    np.testing.assert_allclose(gram_trajectories(G, **kw), direct.Delta, rtol=0, atol=1e-12)


def test_bartlett_draws_are_wishart():
    """E G = N I, Var G_ii = 2N, Var G_ij = N (i != j), Cov(G_ii, G_jj) = 0: pointwise z <= 4 over 40000 draws."""
    from dmftc.validation.online import wishart_bartlett

    N, p, n = 9, 4, 40000
    G = wishart_bartlett(np.random.default_rng(11), n, N, p)
    mean, se = G.mean(0), G.std(0, ddof=1) / np.sqrt(n)
    assert np.all(np.abs(mean - N * np.eye(p)) <= 4 * se)
    var = G.var(0, ddof=1)
    c = G - G.mean(0)
    var_se = np.sqrt(((c ** 2 - var) ** 2).mean(0) / n)
    assert np.all(np.abs(var - N * (1 + np.eye(p))) <= 4 * var_se)
    cov = (c[:, 0, 0] * c[:, 2, 2])
    assert abs(cov.mean()) <= 4 * cov.std() / np.sqrt(n)
    with pytest.raises(ValueError, match="N >= D \\+ 1"):
        wishart_bartlett(np.random.default_rng(0), 2, 3, 4)


def test_gram_ensemble_matches_direct_ensemble():
    """Independent ensembles of the two simulators at small width (N = 12, so finite-width effects are large):
    mean Delta and N tr Var(Delta) agree pointwise within z <= 4."""
    from dmftc.validation.online import simulate_online_linear_gram

    beta = np.array([0.8, -0.6, 0.0])
    kw = dict(beta_star=beta, gamma=1.5, eta=0.1, T=25, N=12, E=6000)
    runs = (simulate_online_linear(seed=1, **kw), simulate_online_linear_gram(seed=2, **kw))
    m = [r.Delta.mean(0) for r in runs]
    m_se = [r.Delta.std(0, ddof=1) / np.sqrt(r.E) for r in runs]
    assert np.all(np.abs(m[0] - m[1]) <= 4 * np.hypot(*m_se))
    stats = []
    for r in runs:
        d = ((r.Delta - r.Delta.mean(0)) ** 2).sum(1)
        stats.append((d.mean(0), d.std(0, ddof=1) / np.sqrt(r.E)))
    (v0, s0), (v1, s1) = stats
    assert np.all(np.abs(v0 - v1) <= 4 * np.hypot(s0, s1))
    assert v0.max() > 20 * s0.max()       # resolved
