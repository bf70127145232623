"""Tests for dmftc.validation.deep_ensemble: the brute-force finite-width deep network simulator.

Tolerances: comparisons against jax autodiff and against the two-layer simulator are float64
round-off checks (the codes differ only in summation order / the low-rank representation of
the hidden weights).  Statistical checks use the ensemble's own standard errors (4 SE); the lazy
check adds an explicit first-order-in-gamma allowance for feature movement, stated where used.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dmftc.validation.deep_ensemble import (deep_gd_step, deep_names, deep_truth, draw_deep_parameters,
                                 simulate_deep)
from dmftc.validation.ensemble import ACTIVATIONS, inputs_from_gram, simulate_two_layer
from dmftc.errors import NumericalError

ACTS = sorted(ACTIVATIONS)


@pytest.fixture(autouse=True, scope="module")
def _x64():
    prev = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", prev)


# ----------------------------------------------------------------------------- jax reference
def _jax_phi(name):
    return {"tanh": jnp.tanh,
            "relu": lambda h: jnp.where(h > 0, jnp.sqrt(2.0) * h, 0.0),   # phi'(0) = 0 as in ensemble.py
            "linear": lambda h: h,
            "erf": jax.scipy.special.erf}[name]


def _jax_net(params, eps, phi, gamma):
    """(f, [phi(h^l)]) of one network, x = [1]; eps[l] is added to h^{l+1} (for g = gamma N df/dh)."""
    W0, Ws, w = params
    N = W0.shape[0]
    h, phis = W0 + eps[0], []
    for l in range(len(Ws) + 1):
        phis.append(phi(h))
        if l < len(Ws):
            h = Ws[l] @ phis[-1] / jnp.sqrt(N) + eps[l + 1]
    return w @ phis[-1] / (gamma * N), phis


def _jax_record(params, phi, gamma, L):
    """Delta-independent records of one network: f, phis, gs, K = N gamma^2 |grad_theta f|^2."""
    N = params[0].shape[0]
    zeros = [jnp.zeros(N) for _ in range(L)]
    f, phis = _jax_net(params, zeros, phi, gamma)
    gs = [gamma * N * g for g in jax.grad(lambda e: _jax_net(params, e, phi, gamma)[0])(zeros)]
    grads = jax.tree_util.tree_leaves(jax.grad(lambda p: _jax_net(p, zeros, phi, gamma)[0])(params))
    K = N * gamma**2 * sum(jnp.sum(g * g) for g in grads)
    return float(f), [np.asarray(p) for p in phis], [np.asarray(g) for g in gs], float(K)


def _jax_step(params, y, f0, phi, gamma, eta, logistic=False):
    """theta - eta N gamma^2 grad loss, loss = 1/2 (y - f + f0)^2, or ln(1 + exp(-y (f - f0))) (jax.grad)."""
    N = params[0].shape[0]
    zeros = [jnp.zeros(N) for _ in range(len(params[1]) + 1)]
    if logistic:
        loss = lambda p: jnp.log1p(jnp.exp(-y * (_jax_net(p, zeros, phi, gamma)[0] - f0)))  # noqa: E731
    else:
        loss = lambda p: 0.5 * (y - _jax_net(p, zeros, phi, gamma)[0] + f0) ** 2  # noqa: E731
    grads = jax.grad(loss)(params)
    return jax.tree_util.tree_map(lambda p, g: p - eta * N * gamma**2 * g, params, grads)


def _member(W0, w, Ws, m):
    return (jnp.asarray(W0[m]), [jnp.asarray(W[m]) for W in Ws], jnp.asarray(w[m]))


# ----------------------------------------------------------------------------- 1. update = GD
@pytest.mark.parametrize("activation", ACTS)
def test_one_step_matches_jax_grad(activation):
    N, L, gamma, eta, y = 6, 3, 0.8, 0.3, 0.7
    W0, w, Ws = draw_deep_parameters(np.random.default_rng(1), 2, N, L)
    f0 = np.array([0.25, -0.4])          # arbitrary background so that Delta != y
    W0n, wn, Wsn = deep_gd_step(W0, w, Ws, y, f0, activation=activation, gamma=gamma, eta=eta)
    for m in range(2):
        ref = _jax_step(_member(W0, w, Ws, m), y, f0[m], _jax_phi(activation), gamma, eta)
        np.testing.assert_allclose(W0n[m], ref[0], rtol=1e-10, atol=1e-12)
        for l in range(L - 1):
            np.testing.assert_allclose(Wsn[l][m], ref[1][l], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(wn[m], ref[2], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("activation, logistic", [("tanh", False), ("relu", False), ("tanh", True)])
def test_recorded_trajectories_match_jax(activation, logistic):
    """Delta, K = N gamma^2 |grad f|^2, Phi[l], G[l] (diagonal and two-time mean) along jax-trained GD (on the
    squared loss, and on the logistic loss with the simulator's error_signal y / (1 + exp(y f)))."""
    N, L, gamma, eta, y, T, E, seed = 6, 3, 0.9, 0.4, 1.3, 5, 2, 7
    err = (lambda f, yy: yy / (1 + np.exp(yy * f))) if logistic else None
    st = simulate_deep(activation=activation, L=L, gamma=gamma, y=y, eta=eta, T=T, N=N, E=E, seed=seed,
                       keep_samples=True, error_signal=err, weights="dense")
    W0, w, Ws = draw_deep_parameters(np.random.default_rng(seed), E, N, L)
    phi = _jax_phi(activation)
    two = {f"{k}[{l}]": np.zeros((E, T, T)) for k in ("Phi", "G") for l in range(1, L + 1)}
    for m in range(E):
        params = _member(W0, w, Ws, m)
        hist_p, hist_g = [], []
        f0 = None
        for t in range(T):
            f, phis, gs, K = _jax_record(params, phi, gamma, L)
            f0 = f if f0 is None else f0
            delta = y / (1 + np.exp(y * (f - f0))) if logistic else y - (f - f0)
            np.testing.assert_allclose(st.samples["Delta"][m, t], delta, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(st.samples["K"][m, t], K, rtol=1e-10)
            hist_p.append(phis)
            hist_g.append(gs)
            params = _jax_step(params, y, f0, phi, gamma, eta, logistic)
        for l in range(L):
            P = np.array([h[l] for h in hist_p])
            G = np.array([h[l] for h in hist_g])
            two[f"Phi[{l + 1}]"][m] = P @ P.T / N
            two[f"G[{l + 1}]"][m] = G @ G.T / N
    for name, x in two.items():
        np.testing.assert_allclose(st.samples[name], np.diagonal(x, axis1=1, axis2=2), rtol=1e-10)
        np.testing.assert_allclose(st.mean[name], x.mean(axis=0), rtol=1e-10)
    # K is the sum over layers of G[l+1] Phi[l] (Phi[0] = G[L+1] = 1)
    s = st.samples
    K = s["G[1]"] + s[f"Phi[{L}]"] + sum(s[f"G[{l + 1}]"] * s[f"Phi[{l}]"] for l in range(1, L))
    np.testing.assert_allclose(s["K"], K, rtol=1e-12)


# ----------------------------------------------------------------------------- 2. batching, API
def test_batch_independence_and_shapes():
    """Dense weights: every member's draws and arithmetic are the same whatever the batches."""
    kw = dict(activation="tanh", L=2, gamma=1.0, y=1.0, eta=0.5, T=6, N=16, E=6, seed=3, keep_samples=True,
              weights="dense")
    a = simulate_deep(batch=1, **kw)
    b = simulate_deep(batch=6, **kw)
    c = simulate_deep(batch=4, **kw)
    assert set(a.mean) == set(deep_names(2)) == {"Delta", "K", "Phi[1]", "Phi[2]", "G[1]", "G[2]"}
    for name in a.mean:
        two_time = name.startswith(("Phi", "G"))
        shape = (6, 6) if two_time else (6,)
        assert a.mean[name].shape == a.se_mean[name].shape == shape
        assert a.nvar[name].shape == a.se_nvar[name].shape == (6,) and a.samples[name].shape == (6, 6)
        for other in (b, c):
            # per-member arithmetic is identical; the two-time means are combined per batch (round-off)
            np.testing.assert_allclose(other.samples[name], a.samples[name], rtol=1e-13, atol=0)
            for field in ("mean", "se_mean", "nvar", "se_nvar"):
                np.testing.assert_allclose(getattr(other, field)[name], getattr(a, field)[name],
                                           rtol=1e-12, atol=1e-14)
    assert a.N == 16 and a.E == 6 and a.T == 6 and a.L == 2
    d = simulate_deep(**(kw | {"seed": 4}))
    assert not np.allclose(d.samples["K"], a.samples["K"])


def test_lazy_weights_are_one_matrix_per_member_and_reproducible():
    """LazyGaussian: products in both directions, interleaved, are those of one matrix (u . W v = W^T u . v for
    every pair asked); a vector in the span of earlier ones draws nothing and gets their combination; the
    simulator's lazy ensembles are reproducible for a seed and a batch size, and differ between seeds."""
    from dmftc.validation.lazy_gaussian import LazyGaussian

    rng = np.random.default_rng(0)
    B, N = 3, 40
    W = LazyGaussian(np.random.default_rng(1), B, N, capacity=2)       # grown past its capacity below
    right, left = [], []
    for k in range(10):
        if k % 3:
            v = rng.standard_normal((B, 2, N))
            right.append((v, W.right(v)))
        else:
            u = rng.standard_normal((B, 1, N))
            left.append((u, W.left(u)))
    for v, Wv in right:
        for u, WTu in left:
            np.testing.assert_allclose(np.einsum("bpn,bqn->bpq", u, Wv), np.einsum("bpn,bqn->bpq", WTu, v),
                                       rtol=1e-12, atol=1e-12)
    drawn = W.directions
    assert drawn == (12, 4)
    v, Wv = right[0]
    combo = 2.0 * v[:, :1] - 0.5 * v[:, 1:]
    np.testing.assert_allclose(W.right(combo), 2.0 * Wv[:, :1] - 0.5 * Wv[:, 1:], rtol=1e-12, atol=1e-12)
    assert W.directions == drawn
    kw = dict(activation="tanh", L=3, gamma=1.0, y=1.0, eta=0.5, T=4, N=16, E=6, keep_samples=True, batch=3)
    a, b, c = simulate_deep(seed=3, **kw), simulate_deep(seed=3, **kw), simulate_deep(seed=4, **kw)
    for name in a.samples:
        np.testing.assert_array_equal(a.samples[name], b.samples[name])
    assert not np.allclose(a.samples["K"], c.samples["K"])


def test_lazy_weights_have_the_law_of_dense_weights():
    """Networks whose hidden matrices are drawn lazily (the default) and densely: means (the kernels' two-time
    means too) and N Var of every time-diagonal quantity agree within their combined standard errors (L = 3, tanh, two points of a random Gram
    matrix, targets of both signs; N = 24, 6000 networks each).  Of the n compared values none may lie beyond
    the two-sided normal quantile at 1e-3 / n (about 4.6 sigma here): a bias of the lazy draws of a tenth of the
    spread of one network's value would show at 6000 networks."""
    from scipy.stats import norm

    kw = dict(activation="tanh", L=3, gamma=1.0, y=np.array([1.0, -0.5]), eta=0.3, T=5, N=24, E=6000,
              Kx=_gram(2, 5))
    lazy = simulate_deep(seed=1, **kw)
    dense = simulate_deep(seed=2, weights="dense", **kw)
    z = []
    for name in lazy.nvar:
        for a, b, sa, sb in ((lazy.nvar[name], dense.nvar[name], lazy.se_nvar[name], dense.se_nvar[name]),
                             (lazy.mean[name], dense.mean[name], lazy.se_mean[name], dense.se_mean[name])):
            se = np.sqrt(sa ** 2 + sb ** 2)
            ok = se > 1e-12 * max(1.0, np.abs(a).max())
            assert np.all(np.abs(a - b)[~ok] <= 1e-10), name          # exact values (t = 0 of Delta)
            z.extend((np.abs(a - b)[ok] / se[ok]).ravel())
    z = np.asarray(z)
    limit = norm.isf(0.5e-3 / z.size)
    assert z.size > 100 and z.max() < limit, (z.size, z.max(), limit)


def test_ncov_and_truth():
    kw = dict(activation="erf", L=2, gamma=0.5, y=1.0, eta=0.3, T=4, N=8, E=10)
    st = simulate_deep(keep_samples=True, **kw)
    C = st.ncov("K", "Phi[2]")
    assert C.shape == (4, 4)
    np.testing.assert_allclose(C, st.ncov("Phi[2]", "K").T, rtol=1e-14)
    for name in ("K", "G[1]"):
        np.testing.assert_allclose(np.diag(st.ncov(name, name)), st.nvar[name], rtol=1e-10)
    with pytest.raises(ValueError, match="keep_samples"):
        simulate_deep(**kw).ncov("K", "K")
    with pytest.raises(ValueError, match="unknown quantity"):
        st.ncov("K", "Phi[3]")

    lone = deep_truth(extrapolate=False, seed=5, **kw)
    ref = simulate_deep(seed=5, **kw)
    np.testing.assert_array_equal(lone.mean["G[2]"], ref.mean["G[2]"])
    rich = deep_truth(seed=5, **kw)
    big = simulate_deep(seed=6, **(kw | {"N": 16}))
    assert rich.N == 16 and rich.samples is None
    for name in ref.mean:
        np.testing.assert_allclose(rich.mean[name], 2 * big.mean[name] - ref.mean[name], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(rich.nvar[name], 2 * big.nvar[name] - ref.nvar[name], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(rich.se_mean[name], np.hypot(2 * big.se_mean[name], ref.se_mean[name]),
                                   rtol=1e-12)
        np.testing.assert_allclose(rich.se_nvar[name], np.hypot(2 * big.se_nvar[name], ref.se_nvar[name]),
                                   rtol=1e-12)


@pytest.mark.parametrize("kw, word", [
    (dict(L=0), "L"), (dict(L=1.5), "L"), (dict(activation="gelu"), "activation"),
    (dict(N=0), "N"), (dict(E=1), "E"), (dict(T=0), "T"), (dict(batch=0), "batch"),
    (dict(gamma=0.0), "gamma"), (dict(gamma=float("nan")), "gamma"), (dict(eta=float("inf")), "eta"),
    (dict(eta=-0.1), "eta"), (dict(y=float("nan")), "y"), (dict(seed=-1), "seed"),
])
def test_input_validation(kw, word):
    base = dict(activation="tanh", L=2, gamma=1.0, y=1.0, eta=0.1, T=3, N=4, E=3)
    with pytest.raises(ValueError, match=word):
        simulate_deep(**(base | kw))


def test_divergence_names_the_step():
    with pytest.raises(NumericalError, match=r"step t=\d+"):
        simulate_deep(activation="linear", L=2, gamma=1.0, y=1.0, eta=1e3, T=400, N=4, E=2)


# ----------------------------------------------------------------------------- 3. L = 1
@pytest.mark.parametrize("activation", ACTS)
def test_single_hidden_layer_equals_two_layer_simulator(activation):
    """Same random stream (W_i, w_i interleaved), so members coincide up to round-off."""
    kw = dict(activation=activation, gamma=0.7, eta=0.4, T=8, N=32, E=6, seed=11, keep_samples=True)
    deep = simulate_deep(L=1, y=0.8, **kw)
    two = simulate_two_layer(Kx_all=np.array([[1.0]]), y=np.array([0.8]), **kw)
    np.testing.assert_allclose(deep.samples["Delta"], two.samples["Delta"][:, 0], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(deep.samples["K"], two.samples["K"][:, 0, 0], rtol=1e-12)
    np.testing.assert_allclose(deep.mean["Delta"], two.mean["Delta"][0], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(deep.mean["K"], two.mean["K"][0, 0], rtol=1e-12)
    np.testing.assert_allclose(deep.nvar["K"], two.nvar["K"][0, 0], rtol=1e-10)


# ----------------------------------------------------------------------------- 4. physics
def test_lazy_limit_linear_network():
    """gamma -> 0, linear phi, N = 1024.

    Exact finite-N facts at t = 0 for a linear network (iterated expectations over independent
    Gaussian layers): E Phi[l](0,0) = E G[l](0,0) = 1, E K(0) = L + 1 (G[l+1] and Phi[l] are
    independent), N Var Phi[1](0,0) = N Var G[L](0,0) = 2 (chi-square with N dof).  Checked at 4 SE.
    Laziness: parameters move by O(eta gamma |Delta|) per step, so every kernel drifts by at most
    ~ eta gamma |y| T per layer; the allowance eta gamma |y| T (L + 1) is added to the statistical
    tolerance for t, s > 0 (observed drift is ~50x smaller; the 4 SE term dominates).
    And in the lazy limit the output follows the NTK: per member
    Delta(t+1) = (1 - eta K(t)) Delta(t) + O(gamma); a 1% error in K would give a residual
    ~ eta K Delta / 100 ~ 2e-3 = 2 gamma, so we require residual <= gamma.
    """
    L, gamma, eta, y, T, N = 3, 1e-3, 0.1, 1.0, 6, 1024
    st = simulate_deep(activation="linear", L=L, gamma=gamma, y=y, eta=eta, T=T, N=N, E=8, seed=2,
                       keep_samples=True)
    drift = eta * gamma * abs(y) * T * (L + 1)
    for name in deep_names(L)[1:]:
        exact = L + 1.0 if name == "K" else 1.0
        m, se = st.mean[name], st.se_mean[name]
        m0 = m[0, 0] if m.ndim == 2 else m[0]
        se0 = se[0, 0] if m.ndim == 2 else se[0]
        assert abs(m0 - exact) <= 4 * se0, (name, m0, se0)
        assert np.all(np.abs(m - exact) <= 4 * se + drift), name
    for name in ("Phi[1]", f"G[{L}]"):
        assert abs(st.nvar[name][0] - 2.0) <= 4 * st.se_nvar[name][0], (name, st.nvar[name][0])
    D, K = st.samples["Delta"], st.samples["K"]
    assert np.max(np.abs(D[:, 1:] - (1 - eta * K[:, :-1]) * D[:, :-1])) <= gamma


def test_rich_regime_delta_decreases_monotonically():
    """gamma = 1, small eta (eta K ~ 0.15 < 1): GD on the 1-d output never overshoots, so every
    member's Delta stays positive and strictly decreases."""
    st = simulate_deep(activation="tanh", L=2, gamma=1.0, y=1.0, eta=0.05, T=20, N=1024, E=4, seed=5,
                       keep_samples=True)
    D = st.samples["Delta"]
    assert np.all(D > 0) and np.all(np.diff(D, axis=1) < 0)
    assert np.all(np.diff(st.mean["Delta"]) < 0)


# ----------------------------------------------------------------------------- 5. P training points
def _gram(P, seed):
    """A random Gram matrix x_mu . x_nu / D of P points in D = 6 dimensions."""
    Z = np.random.default_rng(seed).standard_normal((P, 6))
    return Z @ Z.T / 6


def _jax_points_net(params, eps, phi, gamma, X):
    """(f (P,), [phi(h^l) (P, N)]) of one network on the inputs X (P, D); eps[l] is added to h^{l+1}."""
    W0, Ws, w = params
    N, D = W0.shape
    h, phis = X @ W0.T / jnp.sqrt(D) + eps[0], []
    for l in range(len(Ws) + 1):
        phis.append(phi(h))
        if l < len(Ws):
            h = phis[-1] @ Ws[l].T / jnp.sqrt(N) + eps[l + 1]
    return phis[-1] @ w / (gamma * N), phis


def _jax_points_record(params, phi, gamma, X):
    """f, phis, gs (g^l_mu = gamma N df_mu / dh^l_mu), K_{mu nu} = N gamma^2 grad f_mu . grad f_nu."""
    N, P, L = params[0].shape[0], X.shape[0], len(params[1]) + 1
    zeros = [jnp.zeros((P, N)) for _ in range(L)]
    f, phis = _jax_points_net(params, zeros, phi, gamma, X)
    jac = jax.jacrev(lambda e: _jax_points_net(params, e, phi, gamma, X)[0])(zeros)   # [l] (P, P, N)
    gs = [gamma * N * np.asarray(j)[np.arange(P), np.arange(P)] for j in jac]
    leaves = jax.tree_util.tree_leaves(jax.jacrev(lambda p: _jax_points_net(p, zeros, phi, gamma, X)[0])(params))
    flat = jnp.concatenate([j.reshape(P, -1) for j in leaves], axis=1)
    return np.asarray(f), [np.asarray(p) for p in phis], gs, np.asarray(N * gamma**2 * flat @ flat.T)


def _jax_points_step(params, y, f0, phi, gamma, eta, X, mask=1.0):
    """theta - eta N gamma^2 grad loss, loss = 1/2 sum_mu mask_mu (y_mu - f_mu + f0_mu)^2 (jax.grad; mask 0 on
    a test point)."""
    N, P, L = params[0].shape[0], X.shape[0], len(params[1]) + 1
    zeros = [jnp.zeros((P, N)) for _ in range(L)]
    loss = lambda p: 0.5 * jnp.sum(mask * (y - _jax_points_net(p, zeros, phi, gamma, X)[0] + f0) ** 2)  # noqa: E731
    grads = jax.grad(loss)(params)
    return jax.tree_util.tree_map(lambda p, g: p - eta * N * gamma**2 * g, params, grads)


@pytest.mark.parametrize("activation", ACTS)
def test_one_step_on_points_matches_jax_grad(activation):
    N, L, P, gamma, eta = 6, 3, 3, 0.8, 0.3
    X = inputs_from_gram(_gram(P, 2))
    y = np.array([0.7, -0.4, 1.1])
    W0, w, Ws = draw_deep_parameters(np.random.default_rng(1), 2, N, L, D=P)
    f0 = np.array([[0.25, -0.4, 0.1], [0.0, 0.3, -0.2]])
    W0n, wn, Wsn = deep_gd_step(W0, w, Ws, y, f0, activation=activation, gamma=gamma, eta=eta, X=X)
    for m in range(2):
        ref = _jax_points_step(_member(W0, w, Ws, m), y, f0[m], _jax_phi(activation), gamma, eta, X)
        np.testing.assert_allclose(W0n[m], ref[0], rtol=1e-10, atol=1e-12)
        for l in range(L - 1):
            np.testing.assert_allclose(Wsn[l][m], ref[1][l], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(wn[m], ref[2], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("activation, mask", [("tanh", None), ("relu", None), ("tanh", (1.0, 0.0, 1.0))])
def test_recorded_trajectories_on_points_match_jax(activation, mask):
    """Delta_mu, the NTK K_{mu nu}, Phi[l] and G[l] between points (same-time samples and two-time means) along
    jax-trained GD on P = 3 points of a random Gram matrix, targets of both signs; with a test point (``mask``:
    the loss leaves it out, its residual is recorded all the same)."""
    N, L, P, gamma, eta, T, E, seed = 5, 3, 3, 0.9, 0.3, 4, 2, 7
    Kx, y = _gram(P, 4), np.array([1.2, -0.6, 0.3])
    st = simulate_deep(activation=activation, L=L, gamma=gamma, y=y, eta=eta, T=T, N=N, E=E, seed=seed,
                       keep_samples=True, Kx=Kx, trained=mask, weights="dense")
    X = inputs_from_gram(Kx)
    W0, w, Ws = draw_deep_parameters(np.random.default_rng(seed), E, N, L, D=P)
    phi = _jax_phi(activation)
    two = {f"{k}[{l}]": np.zeros((E, P, P, T, T)) for k in ("Phi", "G") for l in range(1, L + 1)}
    for m in range(E):
        params = _member(W0, w, Ws, m)
        hist = []
        f0 = None
        for t in range(T):
            f, phis, gs, K = _jax_points_record(params, phi, gamma, X)
            f0 = f if f0 is None else f0
            np.testing.assert_allclose(st.samples["Delta"][m, :, t], y - (f - f0), rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(st.samples["K"][m, :, :, t], K, rtol=1e-10, atol=1e-12)
            hist.append((phis, gs))
            params = _jax_points_step(params, y, f0, phi, gamma, eta, X, 1.0 if mask is None else np.array(mask))
        for l in range(L):
            for k, i in (("Phi", 0), ("G", 1)):
                H = np.array([h[i][l] for h in hist])                       # (T, P, N)
                two[f"{k}[{l + 1}]"][m] = np.einsum("tmn,sun->muts", H, H) / N
    for name, x in two.items():
        np.testing.assert_allclose(st.samples[name], np.diagonal(x, axis1=3, axis2=4), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(st.mean[name], x.mean(axis=0), rtol=1e-10, atol=1e-12)
    assert st.mean["Delta"].shape == st.nvar["Delta"].shape == (P, T)
    assert st.nvar["Phi[2]"].shape == (P, P, T) and st.se_mean["G[1]"].shape == (P, P, T, T)


def test_one_point_is_the_gram_matrix_of_one_point():
    kw = dict(activation="erf", L=2, gamma=0.6, eta=0.3, T=5, N=12, E=4, seed=9, keep_samples=True)
    one = simulate_deep(y=0.7, **kw)
    gram = simulate_deep(y=np.array([0.7]), Kx=np.array([[1.0]]), **kw)
    np.testing.assert_allclose(gram.samples["Delta"][:, 0], one.samples["Delta"], rtol=1e-13, atol=1e-15)
    for name in deep_names(2)[1:]:
        np.testing.assert_allclose(gram.samples[name][:, 0, 0], one.samples[name], rtol=1e-13)
        np.testing.assert_allclose(gram.mean[name][0, 0], one.mean[name], rtol=1e-12)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_single_hidden_layer_on_points_equals_two_layer_simulator(activation):
    Kx, y = _gram(4, 8), np.array([0.5, -1.0, 0.8, -0.2])
    kw = dict(activation=activation, gamma=0.7, eta=0.2, T=6, N=24, E=5, seed=13, keep_samples=True)
    deep = simulate_deep(L=1, y=y, Kx=Kx, **kw)
    two = simulate_two_layer(Kx_all=Kx, y=y, **kw)
    np.testing.assert_allclose(deep.samples["Delta"], two.samples["Delta"], rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(deep.samples["K"], two.samples["K"], rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(deep.nvar["K"], two.nvar["K"], rtol=1e-9, atol=1e-12)


def test_points_input_validation():
    base = dict(activation="tanh", L=2, gamma=1.0, eta=0.1, T=3, N=4, E=3, Kx=_gram(3, 1))
    with pytest.raises(ValueError, match=r"one target per point"):
        simulate_deep(y=np.ones(2), **base)
    with pytest.raises(ValueError, match="not both"):
        simulate_deep(y=np.ones(3), input_norm=2.0, **base)
    with pytest.raises(ValueError, match="symmetric"):
        simulate_deep(y=np.ones(3), **(base | {"Kx": np.triu(np.ones((3, 3)))}))
