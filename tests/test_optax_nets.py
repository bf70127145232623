"""dmftc.validation.optax_nets: networks trained by optax.

(a) plain optax.sgd reproduces the existing gradient-descent ensembles (same seeds, same draws) to round-off;
(b) an independent NumPy heavy-ball + weight-decay loop pins optax's momentum convention (v <- beta v + g,
p <- p - lr v) and the scaling of the default optimiser with N; (c) the softmax error signal is the gradient the
network trains on; (d) bad input is a ParameterError.
"""
import math

import numpy as np
import pytest

from dmftc.errors import NumericalError, ParameterError
from dmftc.validation import truth_dataset
from dmftc.validation.deep_ensemble import draw_deep_parameters, simulate_deep
from dmftc.validation.ensemble import inputs_from_gram, simulate_two_layer
from dmftc.validation.optax_nets import optax_truth, simulate_optax

optax = pytest.importorskip("optax")

KX = np.array([[1.0, 0.3], [0.3, 1.2]])


def test_plain_sgd_equals_two_layer_ensemble():
    y = np.array([1.0, -0.5])
    a = simulate_optax(gamma=1.5, y=y, eta=0.5, T=8, N=32, E=40, Kx=KX, seed=3, chunk=16)
    b = simulate_two_layer(activation="tanh", Kx_all=KX, y=y, gamma=1.5, eta=0.5, T=8, N=32, E=40, seed=3)
    for q in ("Delta", "f", "K"):
        for field in ("mean", "nvar", "mean_se", "nvar_se"):
            np.testing.assert_allclose(getattr(a, field)[q], getattr(b, field)[q], rtol=1e-10, atol=1e-12)


def test_plain_sgd_equals_deep_ensemble():
    a = simulate_optax(gamma=1.0, y=0.7, eta=0.5, T=6, N=24, E=20, L=3, seed=5)
    b = simulate_deep(activation="tanh", L=3, gamma=1.0, y=0.7, eta=0.5, T=6, N=24, E=20, seed=5,
                      weights="dense")                    # the optax members draw every weight up front
    assert set(b.mean) <= set(a.mean)
    for q, m in b.mean.items():
        m = np.diagonal(m) if m.ndim == 2 else m
        np.testing.assert_allclose(a.mean[q], m, rtol=1e-10, atol=1e-12, err_msg=q)
        np.testing.assert_allclose(a.nvar[q], b.nvar[q], rtol=1e-10, atol=1e-12, err_msg=q)
    # P points, L = 2
    y = np.array([0.4, -0.8])
    a = simulate_optax(gamma=0.7, y=y, eta=0.4, T=5, N=16, E=10, L=2, Kx=KX, seed=1)
    b = simulate_deep(activation="tanh", L=2, gamma=0.7, y=y, eta=0.4, T=5, N=16, E=10, Kx=KX, seed=1,
                      weights="dense")
    for q in ("Delta", "K", "Phi[2]", "G[1]"):
        np.testing.assert_allclose(a.nvar[q], b.nvar[q], rtol=1e-10, atol=1e-12, err_msg=q)


def _numpy_heavy_ball(W0, W1, w, X, y, *, gamma, eta, beta, lam, lr, T):
    """Independent reference: L = 2, squared loss, hand-written backprop, v <- beta v + g + wd p, p -= rate v."""
    N, D = W0.shape
    params = [W0.copy(), W1.copy(), w.copy()]
    vel = [np.zeros_like(p) for p in params]

    def forward(p):
        a1 = np.tanh(X @ p[0].T / math.sqrt(D))
        a2 = np.tanh(a1 @ p[1].T / math.sqrt(N))
        return a1, a2, a2 @ p[2] / (gamma * N)

    f0 = forward(params)[2]
    deltas, Ks = [], []
    for t in range(T):
        a1, a2, f = forward(params)
        delta = y - (f - f0)
        g2 = (1 - a2 ** 2) * params[2]
        g1 = (1 - a1 ** 2) * (g2 @ params[1]) / math.sqrt(N)
        Kx = X @ X.T / D
        K = (g1 @ g1.T) * Kx / N + (g2 @ g2.T) * (a1 @ a1.T) / N ** 2 + a2 @ a2.T / N
        deltas.append(delta)
        Ks.append(K)
        dh2 = -delta[:, None] * g2 / (gamma * N)                    # dloss/dh2
        dh1 = (dh2 @ params[1] / math.sqrt(N)) * (1 - a1 ** 2)
        grads = [dh1.T @ X / math.sqrt(D), dh2.T @ a1 / math.sqrt(N), -(delta @ a2) / (gamma * N)]
        rate = eta * N * gamma ** 2 * lr[t]
        for k in range(3):
            vel[k] = beta * vel[k] + grads[k] + lam / (N * gamma ** 2) * params[k]
            params[k] = params[k] - rate * vel[k]
    return np.array(deltas), np.array(Ks)


def test_heavy_ball_and_weight_decay_match_numpy():
    N, T, gamma, eta, beta, lam = 8, 4, 0.8, 0.3, 0.7, 0.4
    lr = np.array([0.5, 1.0, 0.8, 0.3])
    y = np.array([1.0, -0.6])
    st = simulate_optax(gamma=gamma, y=y, eta=eta, T=T, N=N, E=2, L=2, Kx=KX, beta=beta, lam=lam, lr=lr,
                        seed=7, keep_samples=True)
    X = inputs_from_gram(KX)
    W0, w, Ws = draw_deep_parameters(np.random.default_rng(7), 2, N, 2, X.shape[1])
    for m in range(2):
        d, K = _numpy_heavy_ball(W0[m], Ws[0][m], w[m], X, y, gamma=gamma, eta=eta, beta=beta, lam=lam, lr=lr, T=T)
        assert np.max(np.abs(st.samples["Delta"][m] - d.T)) < 1e-10
        assert np.max(np.abs(st.samples["K"][m] - K.transpose(1, 2, 0))) < 1e-10
        assert np.max(np.abs(d[-1] - d[0])) > 1e-2                          # it trained
    # another convention (dampened momentum, v <- beta v + (1 - beta) g) is distinguishable at this size
    d2, _ = _numpy_heavy_ball(W0[1], Ws[0][1], w[1], X, y, gamma=gamma, eta=eta * (1 - beta), beta=beta,
                              lam=lam, lr=lr, T=T)
    assert np.max(np.abs(st.samples["Delta"][1] - d2.T)) > 1e-4


def test_softmax_error_signal_is_the_training_gradient():
    """Delta = y - softmax(ftilde), and one optax step moves f as the GD update driven by this Delta does."""
    N, gamma, eta = 8, 1.2, 0.6
    y = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    st = simulate_optax(gamma=gamma, y=y, eta=eta, T=2, N=N, E=2, Kx=KX, loss="softmax", seed=2,
                        keep_samples=True)
    assert st.samples["Delta"].shape == (2, 2, 3, 2) and st.mean["K"].shape == (2, 3, 2, 3, 2)
    X = inputs_from_gram(KX)
    D = X.shape[1]
    z = np.random.default_rng(2).standard_normal((2, N * (D + 3))).reshape(2, N, D + 3)
    for m in range(2):
        W, w = z[m, :, :D], z[m, :, D:]
        ft = st.samples["f"][m]                                                 # (P, C, T)
        sm = np.exp(ft) / np.exp(ft).sum(axis=1, keepdims=True)
        np.testing.assert_allclose(st.samples["Delta"][m], y[:, :, None] - sm, atol=1e-13)
        delta = y - 1.0 / 3                                                    # at t = 0, ftilde = 0
        np.testing.assert_allclose(st.samples["Delta"][m][..., 0], delta, atol=1e-13)
        h = X @ W.T / math.sqrt(D)
        ph, dph = np.tanh(h), 1 - np.tanh(h) ** 2
        f0 = ph @ w / (gamma * N)
        W1 = W + eta * gamma * ((delta @ w.T) * dph).T @ X / math.sqrt(D)
        w1 = w + eta * gamma * ph.T @ delta
        f1 = np.tanh(X @ W1.T / math.sqrt(D)) @ w1 / (gamma * N)
        np.testing.assert_allclose(ft[..., 1], f1 - f0, atol=1e-12)
    ds = truth_dataset(st)
    assert ds["mean_K"].dims == ("mu", "c", "nu", "d", "t") and ds["mean_Delta"].dims == ("mu", "c", "t")
    one = simulate_optax(gamma=gamma, y=[0.0, 1.0], eta=eta, T=2, N=N, E=2, loss="softmax")    # one point
    assert one.mean["Delta"].shape == (2, 2) and one.mean["G[1]"].shape == (2, 2, 2)


def test_user_optimizer_and_extrapolated_truth_dataset():
    kw = dict(gamma=1.0, y=[0.5, -0.5], eta=0.1, T=4, E=8, Kx=KX)
    a = simulate_optax(N=8, optimizer=lambda N: optax.adam(1e-2), **kw)
    b = simulate_optax(N=8, optimizer=optax.adam(1e-2), **kw)
    np.testing.assert_array_equal(a.mean["Delta"], b.mean["Delta"])
    assert np.all(np.abs(a.mean["Delta"][:, -1]) < np.abs(a.mean["Delta"][:, 0]))
    tr = optax_truth(N=8, **kw)
    assert tr.N == 16
    ds = truth_dataset(tr)
    assert ds["mean_Delta"].shape == (2, 4) and "var_se_K" in ds


@pytest.mark.parametrize("kw, msg", [
    (dict(y=[1.0, 2.0, 3.0]), "one target per point"),
    (dict(N=-3), "N must be an integer >= 1"),
    (dict(loss="softmax"), "C >= 2 classes"),
    (dict(loss="hinge"), "loss must be one of"),
    (dict(lr=[1.0, 2.0]), "per-step factors"),
    (dict(Kx=np.array([[1.0, 2.0], [2.0, 1.0]])), "positive semi-definite"),
    (dict(beta=0.9, optimizer=optax.sgd(0.1)), "either optimizer or"),
])
def test_bad_input(kw, msg):
    args = dict(gamma=1.0, y=[1.0, -1.0], eta=0.1, T=3, N=4, E=2, Kx=KX)
    args.update(kw)
    with pytest.raises(ParameterError, match=msg):
        simulate_optax(**args)


def test_divergence_is_a_numerical_error():
    with pytest.raises(NumericalError, match="diverged"):
        simulate_optax(gamma=1.0, y=[1.0, -1.0], eta=1e200, T=4, N=4, E=2, Kx=KX, activation="linear")


def test_richardson_step():
    """The one N, 2N extrapolation every ensemble kind uses (deep_truth, finite_width_truth, optax_truth):
    x = 2 x(2N) - x(N), se = sqrt(4 se(2N)^2 + se(N)^2), the width of the larger ensemble, no samples."""
    from dmftc.validation.deep_ensemble import DeepEnsembleStats
    from dmftc.validation.extrapolate import richardson
    from dmftc.validation.truth import Truth

    one = lambda v: {"Delta": np.array([v, 2 * v])}              # noqa: E731
    a = DeepEnsembleStats(N=8, E=5, T=2, L=2, mean=one(1.0), nvar=one(3.0), se_mean=one(0.1), se_nvar=one(0.3),
                          samples={"Delta": np.zeros((5, 2))})
    b = DeepEnsembleStats(N=16, E=5, T=2, L=2, mean=one(2.0), nvar=one(4.0), se_mean=one(0.2), se_nvar=one(0.4))
    r = richardson(a, b)
    assert r.N == 16 and r.samples is None
    np.testing.assert_allclose(r.mean["Delta"], [3.0, 6.0])
    np.testing.assert_allclose(r.nvar["Delta"], [5.0, 10.0])
    np.testing.assert_allclose(r.se_mean["Delta"], np.sqrt([4 * 0.04 + 0.01, 4 * 0.16 + 0.04]))
    np.testing.assert_allclose(r.se_nvar["Delta"], np.sqrt([4 * 0.16 + 0.09, 4 * 0.64 + 0.36]))
    t = richardson(Truth(one(1.0), one(3.0), one(0.1), one(0.3), 8, 5), Truth(one(2.0), one(4.0), one(0.2), one(0.4), 16, 5))
    assert (t.N, t.E) == (16, 5)
    np.testing.assert_allclose(t.nvar_se["Delta"], r.se_nvar["Delta"])
