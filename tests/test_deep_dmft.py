"""Saddle point of the exact discrete-time deep DMFT (dmftc.runtime.march.deep_dmft).

Reference equations: the docstrings of dmftc.validation.deep_ensemble and dmftc.runtime.march.deep_dmft.  The checks below are independent of the
solver's method: closed recursions, Gauss-Hermite integrals, and field equations re-implemented
here in numpy and differentiated by finite differences.
"""
import math

import numpy as np
import pytest

from dmftc.runtime.march.deep_dmft import DeepSaddle, solve_deep
from dmftc.errors import NumericalError, ParameterError

# 16 groups: the group standard errors have 15 degrees of freedom, so a "4 standard errors" band
# is a ~1e-3 two-sided event per entry (Student t), not the ~5e-3 of 8 groups.
GROUPS = 16


def _names(L):
    return ["Delta", "f", "K"] + [f"{q}[{l}]" for l in range(1, L + 1) for q in ("Phi", "G", "Rphi", "Rg")]


def _tanh(h):
    p = np.tanh(h)
    return p, 1 - p * p


def _gh(fn, var, n=80):
    """E[fn(x)] for x ~ N(0, var) by Gauss-Hermite quadrature."""
    x, w = np.polynomial.hermite_e.hermegauss(n)
    return float(np.sum(w * fn(math.sqrt(var) * x)) / math.sqrt(2 * math.pi))


def _kernels(sad, l, L):
    """(Phi[l-1], Rphi[l-1], G[l+1], Rg[l+1]) with Phi[0] = G[L+1] = 1 and Rphi[0] = Rg[L+1] = 0."""
    T = sad.T
    ones, zero = np.ones((T, T)), np.zeros((T, T))
    Phi = ones if l == 1 else sad[f"Phi[{l - 1}]"]
    Rphi = zero if l == 1 else sad[f"Rphi[{l - 1}]"]
    G = ones if l == L else sad[f"G[{l + 1}]"]
    Rg = zero if l == L else sad[f"Rg[{l + 1}]"]
    return Phi, Rphi, G, Rg


def _site(sad, l, u, r, act):
    """Single-site process of layer l (notes), written out directly; u, r: (n, T) source paths."""
    L, T, p = sad.L, sad.T, sad.params
    Phi, Rphi, G, Rg = _kernels(sad, l, L)
    egD = p["eta"] * p["gamma"] * sad["Delta"]
    h, z, g, ph = (np.zeros_like(u) for _ in range(4))
    for t in range(T):
        C = Rphi[t, :t] + egD[:t] * Phi[t, :t]                       # s < t
        h[:, t] = u[:, t] + g[:, :t] @ C
        ph[:, t], dp = act(h[:, t])
        E = Rg[t, :t + 1] + np.append(egD[:t] * G[t, :t], 0.0)      # s <= t (same-time Rg term)
        z[:, t] = r[:, t] + ph[:, :t + 1] @ E
        g[:, t] = dp * z[:, t]
    return h, z, g, ph


# ---------------------------------------------------------------- 1. exact vs Monte Carlo (linear)

@pytest.fixture(scope="module")
def linear_pair():
    kw = dict(activation="linear", L=2, gamma=1.0, y=1.0, eta=0.3, T=8)
    return solve_deep(backend="exact", **kw), solve_deep(backend="mc", samples=16000, groups=GROUPS, seed=1, **kw)


def test_exact_and_monte_carlo_agree_for_linear(linear_pair):
    ex, mc = linear_pair
    assert isinstance(ex, DeepSaddle) and ex.params["backend"] == "exact" and mc.params["backend"] == "mc"
    for name in _names(2):
        shape = (8,) if name in ("Delta", "f", "K") else (8, 8)
        assert ex[name].shape == mc[name].shape == mc.stderr[name].shape == shape, name
        assert np.all(ex.stderr[name] == 0)
        # exact has no sampling error; 1e-12 of the scale absorbs round-off in entries exactly 0 in both
        tol = 4 * mc.stderr[name] + 1e-12 * np.abs(ex[name]).max()
        bad = np.abs(ex[name] - mc[name]) > tol
        assert not bad.any(), (name, np.argwhere(bad)[:3], ex[name][bad][:3], mc[name][bad][:3])
    assert mc.stderr["Delta"][1:].min() > 0


# ---------------------------------------------------------------- 2. L = 1 linear closed recursion

def test_one_layer_linear_closed_recursion():
    """L = 1, phi = id: h(t) = u + eta gamma sum_{s<t} Delta(s) z(s), z(t) = r + eta gamma sum_{s<t} Delta(s) h(s)
    with u, r ~ N(0, 1) independent (Rphi[0] = Rg[2] = 0, Phi[0] = G[2] = 1).  Writing h = a u + b r,
    z = c u + d r gives (a, b, c, d)(t+1) = (a + k c, b + k d, c + k a, d + k b), k = eta gamma Delta(t),
    f = <z h>/gamma = (a c + b d)/gamma, K = G[1](t,t) + Phi[1](t,t) = a^2 + b^2 + c^2 + d^2."""
    gamma, y, eta, T = 0.7, 1.3, 0.4, 12
    sad = solve_deep(activation="linear", L=1, gamma=gamma, y=y, eta=eta, T=T)
    assert sad.params["backend"] == "exact"
    co = np.zeros((T, 4))
    delta = np.zeros(T)
    a, b, c, d = 1.0, 0.0, 0.0, 1.0
    for t in range(T):
        co[t] = a, b, c, d
        delta[t] = y - (a * c + b * d) / gamma
        k = eta * gamma * delta[t]
        a, b, c, d = a + k * c, b + k * d, c + k * a, d + k * b
    A, B, C, D = co.T
    np.testing.assert_allclose(sad["Delta"], delta, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(sad["f"], y - delta, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(sad["K"], A ** 2 + B ** 2 + C ** 2 + D ** 2, rtol=1e-10)
    np.testing.assert_allclose(sad["Phi[1]"], np.outer(A, A) + np.outer(B, B), rtol=1e-10)
    np.testing.assert_allclose(sad["G[1]"], np.outer(C, C) + np.outer(D, D), rtol=1e-10)
    np.testing.assert_allclose(sad.diagnostics["f_direct"], sad["f"], rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- 3. lazy limit

def test_lazy_limit_tanh_two_layers():
    """gamma -> 0: kernels stay at their Gaussian initial values and Delta(t) = y (1 - eta K0)^t.
    Feature-learning corrections are O(gamma) at eta T = O(1) (in fact O(gamma^2) for the kernels by
    the r -> -r symmetry); the band is 4 Monte Carlo standard errors + 10 gamma."""
    gamma, y, eta, T = 1e-3, 1.0, 0.5, 6
    sad = solve_deep(activation="tanh", L=2, gamma=gamma, y=y, eta=eta, T=T, samples=8000, groups=GROUPS)
    phi1 = _gh(lambda x: np.tanh(x) ** 2, 1.0)                          # u^1 ~ N(0, 1), constant in t
    phi2 = _gh(lambda x: np.tanh(x) ** 2, phi1)                         # h^2 = u^2 ~ N(0, Phi[1])
    g2 = _gh(lambda x: (1 - np.tanh(x) ** 2) ** 2, phi1)                # g^2 = phi'(h^2) w, <w^2> = 1
    g1 = _gh(lambda x: (1 - np.tanh(x) ** 2) ** 2, 1.0) * g2            # z^1 = r^1 ~ N(0, G[2]) indep. of u^1
    K0 = g1 + g2 * phi1 + phi2
    expect = {"Phi[1]": phi1, "Phi[2]": phi2, "G[1]": g1, "G[2]": g2, "K": K0,
              "Delta": y * (1 - eta * K0) ** np.arange(T)}
    for name, ref in expect.items():
        err = np.abs(sad[name] - ref)
        assert np.all(err <= 4 * sad.stderr[name] + 10 * gamma), (name, err.max(), sad.stderr[name].max())


# ---------------------------------------------------------------- 4. response functions

def test_linear_responses_are_the_derivatives_of_the_field_equations():
    """Linear, L = 2, exact backend: every field is linear in the sources, so finite differences of the
    field equations (re-implemented here, using the solver's order parameters) are exact derivatives:
    Rphi[l](t,s) = dh^l(t)/dr^l(s), Rg[l](t,s) = dg^l(t)/du^l(s).  The same linear maps J then close the
    saddle point: Phi[l] = J_hu Phi[l-1] J_hu^T + J_hr G[l+1] J_hr^T (G[l] likewise) and
    f = <z^L h^L>/gamma."""
    L, T, gamma, eta, y = 2, 7, 1.2, 0.35, 0.8
    sad = solve_deep(activation="linear", L=L, gamma=gamma, y=y, eta=eta, T=T, backend="exact")
    ident = lambda h: (h, np.ones_like(h))                                 # noqa: E731
    zero, eps = np.zeros((1, T)), 0.5
    for l in range(1, L + 1):
        Phi, _, G, _ = _kernels(sad, l, L)
        J = {}
        for src in ("u", "r"):
            cols = []
            for s in range(T):
                pert = zero.copy()
                pert[0, s] = eps
                u, r = (pert, zero) if src == "u" else (zero, pert)
                h, z, g, _ = _site(sad, l, u, r, ident)
                cols.append(np.stack([h[0], z[0], g[0]]) / eps)             # base path is 0
            J[src] = np.stack(cols, axis=-1)                                # (3, T_t, T_s)
        np.testing.assert_allclose(sad[f"Rphi[{l}]"], J["r"][0], atol=1e-12)
        np.testing.assert_allclose(sad[f"Rg[{l}]"], J["u"][2], atol=1e-12)
        cov = lambda a, b: J["u"][a] @ Phi @ J["u"][b].T + J["r"][a] @ G @ J["r"][b].T   # noqa: E731
        np.testing.assert_allclose(sad[f"Phi[{l}]"], cov(0, 0), rtol=1e-10)
        np.testing.assert_allclose(sad[f"G[{l}]"], cov(2, 2), rtol=1e-10)
        if l == L:
            np.testing.assert_allclose(sad["f"], np.diagonal(cov(1, 0)) / gamma, rtol=1e-10, atol=1e-12)
    assert np.abs(sad["Rphi[1]"]).max() > 0.1 and np.abs(sad["Rg[1]"]).max() > 0.1
    # for phi = id, g^l(t) = z^l(t) does not depend on h^l(t): the same-time response vanishes exactly
    for l in range(1, L + 1):
        assert np.all(np.diagonal(sad[f"Rg[{l}]"]) == 0)


def test_tanh_responses_include_same_time_term():
    """tanh, L = 2: per-sample central finite differences of the field equations (numpy, fresh sources
    drawn from the solver's kernels, same paths for +-eps) averaged over samples estimate Rphi and Rg;
    they agree with the solver's tangents within 4 combined standard errors, and the same-time Rg[l](t,t)
    is resolved and non-zero for t > 0 (at t = 0, z^l(0) is independent of h^l(0) so it vanishes)."""
    L, T, gamma, eta, y = 2, 5, 1.0, 0.5, 1.0
    sad = solve_deep(activation="tanh", L=L, gamma=gamma, y=y, eta=eta, T=T, samples=16000, groups=GROUPS)
    rng = np.random.default_rng(7)
    n, eps = 20000, 1e-5

    def gp(K):
        lam, V = np.linalg.eigh(K)
        return rng.standard_normal((n, T)) @ (V * np.sqrt(np.clip(lam, 0, None))).T

    for l in range(1, L + 1):
        Phi, _, G, _ = _kernels(sad, l, L)
        u, r = gp(Phi), gp(G)
        Rg, Rphi = np.zeros((n, T, T)), np.zeros((n, T, T))
        for s in range(T):
            e = np.zeros((n, T))
            e[:, s] = eps
            Rg[:, :, s] = (_site(sad, l, u + e, r, _tanh)[2] - _site(sad, l, u - e, r, _tanh)[2]) / (2 * eps)
            Rphi[:, :, s] = (_site(sad, l, u, r + e, _tanh)[3] - _site(sad, l, u, r - e, _tanh)[3]) / (2 * eps)
        for name, fd in ((f"Rg[{l}]", Rg), (f"Rphi[{l}]", Rphi)):
            mean, se = fd.mean(0), fd.std(0, ddof=1) / math.sqrt(n)
            tol = 4 * np.sqrt(se ** 2 + sad.stderr[name] ** 2) + 1e-9
            bad = np.abs(mean - sad[name]) > tol
            assert not bad.any(), (name, np.argwhere(bad), mean[bad], sad[name][bad])
        diag, dse = np.diagonal(sad[f"Rg[{l}]"]), np.diagonal(sad.stderr[f"Rg[{l}]"])
        assert abs(diag[0]) <= 4 * dse[0] + 1e-12
        assert np.all(np.abs(diag[1:]) > 4 * dse[1:]), (l, diag, dse)
    # f from Rphi[L] (Stein's lemma on r^L = w(0)) equals the direct average <z^L phi(h^L)>/gamma
    fd, fd_se = sad.diagnostics["f_direct"], sad.diagnostics["f_direct_stderr"]
    assert np.all(np.abs(fd - sad["f"]) <= 4 * np.sqrt(fd_se ** 2 + sad.stderr["f"] ** 2) + 1e-12)


# ---------------------------------------------------------------- 5. errors

@pytest.mark.parametrize("kw, match", [
    (dict(activation="sigmoid"), "not an expression in h; write it applied to h, e.g. 'sigmoid\\(h\\)'"),
    (dict(activation="tanh(h) + foo(h)"), "unknown functions foo"),
    (dict(activation=None), "an activation is an expression in h"),
    (dict(L=0), "L .* integer >= 1"),
    (dict(L=1.5), "L .* integer >= 1"),
    (dict(L=True), "L .* integer >= 1"),
    (dict(T=0), "T .* integer >= 1"),
    (dict(gamma=0.0), "gamma must be > 0"),
    (dict(gamma=float("nan")), "gamma must be a finite real"),
    (dict(eta=-0.1), "eta must be >= 0"),
    (dict(y="1"), "y must be a finite real"),
    (dict(backend="gpu"), "backend must be"),
    (dict(activation="tanh", backend="exact"), "exact backend needs .*linear"),
    (dict(samples=10), "samples must be an integer >= 16"),
    (dict(groups=1), "groups must be an integer >= 2"),
    (dict(seed=-1), "seed must be an integer >= 0"),
    (dict(dirac_width=-1.0), "dirac_width must be >= 0"),
])
def test_bad_arguments(kw, match):
    args = dict(activation="linear", L=2, gamma=1.0, y=1.0, eta=0.1, T=4)
    args.update(kw)
    with pytest.raises(ParameterError, match=match):
        solve_deep(**args)


def test_divergence_is_a_numerical_error():
    with pytest.raises(NumericalError, match=r"became non-finite at step \d+"):
        solve_deep(activation="linear", L=2, gamma=1.0, y=1.0, eta=20.0, T=40)


def test_the_march_of_any_model_equals_the_exact_linear_march_of_its_action():
    """The one march (jitted, kernels object ModelKernels) run on a DeepModel that is not the standard network
    (couplings nonlinear in the kernels and in Delta, a readout with unequal coefficients, boundary kernels 0.7 and
    1.3, another K) on the exact backend equals the independent exact march of dmftc.reference.deep_marches (numpy
    coefficient rows) to round-off; 'f' is -c_t E_t.  deep_linear_saddle (the one march too) equals the
    oracle for this model and the standard network."""
    from models import odd_model

    from dmftc.reference.deep_marches import numpy_linear_saddle
    from dmftc.runtime.engines.deep_linear import deep_linear_saddle

    L, T = 3, 6
    model = odd_model()
    sad = solve_deep(activation="linear", L=L, T=T, gamma=1.0, y=0.0, eta=0.1, model=model)
    ref = numpy_linear_saddle(L=L, T=T, model=model)
    assert sad.params["backend"] == "exact"
    pairs = [("Delta", ref.Delta), ("K", ref.K)] + [(f"{k}[{l}]", getattr(ref, k)[l - 1]) for k in
                                                    ("Phi", "G", "Rphi", "Rg") for l in range(1, L + 1)]
    for name, want in pairs:
        np.testing.assert_allclose(sad[name], want, rtol=0, atol=1e-12 * max(1.0, np.abs(want).max()), err_msg=name)
    np.testing.assert_allclose(sad["f"], ref.f, rtol=0, atol=1e-12)        # E_0 = 0 here: -c_t E_t = y0 - Delta
    for kw in (dict(model=model), dict(gamma=1.3, y=-0.7, eta=0.2)):
        mine, ref = deep_linear_saddle(L=L, T=T, **kw), numpy_linear_saddle(L=L, T=T, **kw)
        for k in ("Delta", "f", "K", "Phi", "G", "Rphi", "Rg"):
            want = np.asarray(getattr(ref, k))
            np.testing.assert_allclose(getattr(mine, k), want, rtol=0, atol=1e-12 * max(1.0, np.abs(want).max()))
