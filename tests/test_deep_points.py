"""Deep specs on several training points (specs/deep_multi.dmft): the point index folded into time.

Checked against (1) the one-point spec: with P = 1 the fold is the identity, so deep_multi and deep_tanh march
the same standard normals to round-off and give the same propagator; (2) deep networks trained on P points by
gradient descent (dmftc.validation.deep_ensemble, N and 2N extrapolated), pointwise within 4 combined standard
errors, on a random Gram matrix with targets of both signs: the means, the N Var of the exact (linear) and Monte
Carlo (tanh) propagators, and the exact mean correction of linear specs; (3) the exact Gaussian basis of a linear
activation against its own Monte Carlo march, and the Monte Carlo propagator run on a degree-5 Gaussian cubature
against the exact one (equal to round-off).  Bad point indices are located errors.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import dmftc
from dmftc.derive import derive
from dmftc.errors import ParameterError, ShapeSpecError, SpecError, StructureSpecError
from dmftc.frontend.check import check
from dmftc.frontend.parse import parse
from dmftc.validation.deep_ensemble import deep_truth

SPECS = Path(__file__).resolve().parent.parent / "specs"
MULTI = (SPECS / "deep_multi.dmft").read_text()


def _load(tmp_path, text, name="deep_multi"):
    p = tmp_path / f"{name}.dmft"
    p.write_text(text)
    return dmftc.load(str(p))


def _gram(P, seed):
    Z = np.random.default_rng(seed).standard_normal((P, 8))
    return Z @ Z.T / 8


def _same_time(x):
    """(P, P, T) equal-time entries of a (P, P, T, T) kernel."""
    return np.einsum("mntt->mnt", x)


def assert_means_match(sol, truth, L, z_max=4.0):
    """Pointwise |theory - networks| <= z_max combined standard errors for Delta, K and the equal-time kernels."""
    worst = {}
    for name in ["Delta", "K"] + [f"{k}[{l}]" for k in ("Phi", "G") for l in range(1, L + 1)]:
        th, se, en, ense = sol.mean(name), sol.mean_stderr(name), truth.mean[name], truth.se_mean[name]
        if th.ndim == 4:
            th, se, en, ense = map(_same_time, (th, se, en, ense))
        assert th.shape == en.shape, name
        peak = np.abs(en).max()
        z = np.abs(th - en) / np.sqrt(se ** 2 + ense ** 2 + (1e-12 * peak) ** 2)
        worst[name] = (float(z.max()), float(np.abs(th - en).max() / peak))
        assert z.max() <= z_max, (name, worst[name])
    return worst


# ----------------------------------------------------------------------------- the fold with P = 1
def test_one_point_fold_is_the_one_point_spec(tmp_path):
    T = 5
    kw = dict(L=2, T=T, eta=0.1, gamma=0.9, samples=400, groups=2, seed=3, propagator_samples=256,
              propagator_groups=2)
    one = dmftc.load(str(SPECS / "deep_tanh.dmft")).solve(y=0.8, **kw)
    multi = _load(tmp_path, MULTI).solve(P=1, Kx=np.array([[1.0]]), y=np.array([0.8]), **kw)
    np.testing.assert_allclose(multi.mean("Delta")[0], one.mean("Delta"), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(multi.mean("K")[0, 0], one.mean("K"), rtol=1e-10, atol=1e-12)
    for name in ("Phi[1]", "G[2]", "A[1]", "B[2]"):
        np.testing.assert_allclose(multi.mean(name)[0, 0], one.mean(name), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(multi.mean_stderr("Delta")[0], one.mean_stderr("Delta"), rtol=1e-8, atol=1e-13)
    # the propagator too: the one deep propagator on the same normals (P = 1: the steps are the times)
    for name in ("Delta", "K", "Phi[1]", "G[2]"):
        ref, ref_se = one.var(name), one.var_stderr(name)
        got, got_se = multi.var(name).reshape(-1, T)[0], multi.var_stderr(name).reshape(-1, T)[0]
        assert multi.var(name).shape[:-1] == (1,) * (multi.var(name).ndim - 1)
        np.testing.assert_allclose(got, ref, rtol=1e-8, atol=1e-12 * np.abs(ref).max())
        np.testing.assert_allclose(got_se, ref_se, rtol=1e-6, atol=1e-12 * np.abs(ref).max())


# ----------------------------------------------------------------------------- one hidden layer = two-layer spec
def test_one_hidden_layer_is_the_two_layer_spec(tmp_path):
    """deep_multi at L = 1 and specs/two_layer_multi.dmft (tanh) describe the same network on P points: two
    compilers' independent Monte Carlo saddles agree within 4 combined standard errors (Delta, the NTK K)."""
    P, T, eta, gamma = 3, 6, 0.1, 1.3
    Kx, y = _gram(P, 8), np.array([0.8, -0.5, 0.2])
    text = (SPECS / "two_layer_multi.dmft").read_text().replace("activation phi(h) = sqrt(2) * max(0, h)",
                                                                 "activation phi(h) = tanh(h)")
    kw = dict(P=P, Kx=Kx, y=y, gamma=gamma, T=T, eta=eta)
    two = _load(tmp_path, text, "two_layer_tanh").solve(samples=20000, seed=7, **kw)
    deep = _load(tmp_path, MULTI).solve(L=1, samples=20000, groups=8, seed=5, **kw)
    for n in ("Delta", "K"):
        a, b = two.mean(n), deep.mean(n)
        assert a.shape == b.shape
        z = np.abs(a - b) / np.sqrt(two.mean_stderr(n) ** 2 + deep.mean_stderr(n) ** 2 + 1e-24)
        assert z.max() <= 4.0, (n, z.max())


# ----------------------------------------------------------------------------- against networks
def test_means_on_points_match_networks(tmp_path):
    """tanh, L = 2, P = 3 points of a random Gram matrix, targets of both signs, gamma = 1.2, T = 6."""
    P, L, T, eta, gamma = 3, 2, 6, 0.1, 1.2
    Kx, y = _gram(P, 21), np.array([0.9, -0.7, 0.3])
    sol = _load(tmp_path, MULTI).solve(P=P, Kx=Kx, y=y, L=L, T=T, eta=eta, gamma=gamma, samples=8000, groups=8)
    truth = deep_truth(activation="tanh", L=L, gamma=gamma, y=y, eta=eta, T=T, N=128, E=1500, Kx=Kx, seed=4)
    assert_means_match(sol, truth, L)
    # power: the same network trained on the third point alone (the fold with P = 1) is > 20 standard errors off
    # these networks' Delta of that point (measured: 177), so the test sees the other points' updates
    alone = _load(tmp_path, MULTI).solve(P=1, Kx=Kx[2:, 2:], y=y[2:], L=L, T=T, eta=eta, gamma=gamma, samples=8000,
                                         groups=8)
    z = np.abs(alone.mean("Delta")[0] - truth.mean["Delta"][2]) / np.hypot(alone.mean_stderr("Delta")[0] + 1e-12,
                                                                         truth.se_mean["Delta"][2])
    assert z.max() > 20


@pytest.mark.slow
@pytest.mark.parametrize("act, P, L, T, eta, gamma, seed", [
    ("sin(h)", 4, 2, 20, 0.05, 1.5, 1),
    ("tanh(h)", 3, 3, 16, 0.08, 0.8, 2),
])
def test_means_on_points_match_networks_long(tmp_path, act, P, L, T, eta, gamma, seed):
    rng = np.random.default_rng(seed)
    Kx, y = _gram(P, 100 + seed), rng.uniform(-1, 1, P)
    text = MULTI.replace("activation phi(h) = tanh(h)", f"activation phi(h) = {act}")
    # 16 groups: with 8 the theory's standard error (7 degrees of freedom) was itself too noisy for z <= 4 over
    # ~300 correlated entries (measured z 3.75 and 3.93 at 32000 paths in 8 groups)
    sol = _load(tmp_path, text).solve(P=P, Kx=Kx, y=y, L=L, T=T, eta=eta, gamma=gamma, samples=64000, groups=16)
    truth = deep_truth(activation=act, L=L, gamma=gamma, y=y, eta=eta, T=T, N=256, E=3000, Kx=Kx, seed=seed)
    assert_means_match(sol, truth, L)


def test_linear_exact_basis_equals_its_monte_carlo(tmp_path):
    text = MULTI.replace("activation phi(h) = tanh(h)", "activation phi(h) = h")
    m = _load(tmp_path, text)
    kw = dict(P=2, Kx=_gram(2, 5), y=np.array([1.0, -0.5]), L=2, T=4, eta=0.2, gamma=1.0)
    exact = m.solve(**kw)
    mc = m.solve(backend="mc", samples=8000, groups=8, **kw)
    assert exact.info["backend"] == "exact" and mc.info["backend"] == "mc"
    for name in ("Delta", "K", "Phi[1]", "G[2]"):
        z = np.abs(exact.mean(name) - mc.mean(name)) / (mc.mean_stderr(name) + 1e-12)
        assert z.max() <= 4.0, (name, z.max())
        assert np.all(exact.mean_stderr(name) == 0)


# ----------------------------------------------------------------------------- the exact propagator of linear specs
LINEAR = MULTI.replace("activation phi(h) = tanh(h)", "activation phi(h) = h")


def test_linear_propagator_with_one_point_is_deep_linear(tmp_path):
    """With P = 1 the Hessian of the folded action is deep_linear's: the same propagator, and the same exact O(1/N)
    mean correction (third derivatives), to round-off; so the networks' check of the correction on points below
    covers the one-point spec's too (experiments/deep_linear_correction.py checks it at full size)."""
    kw = dict(L=2, T=4, eta=0.2, gamma=1.1, correction=True)
    one = dmftc.load(str(SPECS / "deep_linear.dmft")).solve(y=0.7, **kw)
    pts = _load(tmp_path, LINEAR, "deep_multi_linear").solve(P=1, Kx=np.array([[1.0]]), y=np.array([0.7]), **kw)
    assert pts.info["diagnostics"]["propagator"]["stationarity"] < 1e-12
    for n in ("Delta", "K", "Phi[1]", "G[2]"):
        np.testing.assert_allclose(np.ravel(pts.var(n)), one.var(n), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(pts.sigma("K", "Phi[2]")[0, 0, :, 0, 0], one.sigma("K", "Phi[2]"), rtol=1e-9,
                               atol=1e-12)
    for n in ("Delta", "K", "Phi[1]", "Phi[2]", "G[1]", "G[2]"):
        ref = one.mean_correction(n)
        assert np.abs(ref).max() > 0.01, n
        np.testing.assert_allclose(np.ravel(pts.mean_correction(n)), np.ravel(ref), rtol=1e-9,
                                   atol=1e-12 * np.abs(ref).max())
    assert one.two_time("Phi[1]").shape == (4, 4, 4, 4)      # kept on one point, and said so on several
    with pytest.raises(ParameterError, match="one training point"):
        pts.two_time("Phi[1]")


def test_linear_one_hidden_layer_is_the_two_layer_engine(tmp_path):
    """L = 1 on P = 3 points: the folded deep action and the two-layer compiler's exact backend
    (specs/two_layer_multi.dmft with phi = h) give the same propagator to round-off, and the O(1/N) mean
    correction (third derivatives of the deep action, exact) agrees with the two-layer engine's (Monte Carlo)
    within 4 of its standard errors."""
    P, T, eta, gamma = 3, 6, 0.1, 1.2
    Kx, y = _gram(P, 3), np.array([0.8, -0.5, 0.3])
    kw = dict(T=T, eta=eta, gamma=gamma, P=P, Kx=Kx, y=y, correction=True)
    deep = _load(tmp_path, LINEAR, "deep_multi_linear").solve(L=1, **kw)
    text = (SPECS / "two_layer_multi.dmft").read_text().replace("activation phi(h) = sqrt(2) * max(0, h)",
                                                                 "activation phi(h) = h")
    two = _load(tmp_path, text, "two_layer_linear").solve(samples=100000, seed=3, **kw)
    for n in ("Delta", "K"):
        np.testing.assert_allclose(deep.var(n), two.var(n), rtol=1e-9, atol=1e-12 * np.abs(two.var(n)).max())
        ref, se, got = two.mean_correction(n), two.mean_correction(n, stderr=True), deep.mean_correction(n)
        assert np.abs(ref).max() > 20 * se.max(), n                  # resolved: the comparison can fail
        ok = se > 1e-8 * se.max()                                    # Delta(0), Delta(1), K(0): exact on both
        assert (np.abs(got - ref)[ok] / se[ok]).max() <= 4.0, n
        np.testing.assert_allclose(got[~ok], ref[~ok], atol=1e-10 * np.abs(ref).max())


def test_linear_propagator_on_points_matches_networks(tmp_path):
    """N Var of Delta_mu, K_{mu nu}, Phi[l]_{mu nu}(t, t), G[l]_{mu nu}(t, t) (every point and pair) of linear deep
    networks on P = 3 points of a random Gram matrix (N = 128/256 extrapolated, E = 6000), pointwise z <= 4."""
    P, L, T, eta, gamma = 3, 2, 6, 0.1, 1.0
    rng = np.random.default_rng(7)
    Kx, y = _gram(P, 7), rng.uniform(-1, 1, P)
    sol = _load(tmp_path, LINEAR, "deep_multi_linear").solve(P=P, Kx=Kx, y=y, L=L, T=T, eta=eta, gamma=gamma)
    assert sol.info["diagnostics"]["propagator"]["stationarity"] < 1e-12
    truth = deep_truth(activation="linear", L=L, gamma=gamma, y=y, eta=eta, T=T, N=128, E=6000, Kx=Kx, seed=11)
    for n in ["Delta", "K"] + [f"{k}[{l}]" for k in ("Phi", "G") for l in range(1, L + 1)]:
        th, en, se = sol.var(n), truth.nvar[n], truth.se_nvar[n]
        assert th.shape == en.shape, n
        z = np.abs(th - en) / np.maximum(se, 1e-12 * np.abs(en).max())
        assert z.max() <= 4.0, (n, z.max())
    S = sol.sigma("Delta", "K")
    assert S.shape == (P, T, P, P, T)
    np.testing.assert_allclose(np.einsum("mtmt->mt", sol.sigma("Delta", "Delta")), sol.var("Delta"), rtol=1e-12)


def test_linear_mean_correction_on_points_matches_networks(tmp_path):
    """The exact O(1/N) mean correction m1 of linear deep specs on P = 3 points of a random Gram matrix against
    N (E[q]_N - q_inf) of linear networks trained on the same points (deep_mean_shift with the initial kernels as
    control variates, N = 32/64 extrapolated, E = 20000/40000): Delta_mu, K_{mu nu}, the equal-time Phi[l], G[l]
    of every pair and the loss Delta_mu^2 (2 Delta m1 + N Var), pointwise z <= 4; the shift of Delta itself is
    > 10 standard errors from 0 at N = 32, so q_inf alone fails the test."""
    from dmftc.validation.deep_ensemble import deep_mean_shift

    P, L, T, eta, gamma = 3, 2, 6, 0.1, 1.0
    rng = np.random.default_rng(7)
    Kx, y = _gram(P, 7), rng.uniform(-1, 1, P)
    sol = _load(tmp_path, LINEAR, "deep_multi_linear").solve(P=P, Kx=Kx, y=y, L=L, T=T, eta=eta, gamma=gamma,
                                                            correction=True)
    names = ["Delta", "K"] + [f"{k}[{l}]" for k in ("Phi", "G") for l in range(1, L + 1)]
    same = lambda x: _same_time(x) if x.ndim == 4 else x                                   # noqa: E731
    ref = {n: same(sol.mean(n)) for n in names}
    theory = {n: same(sol.mean_correction(n)) for n in names}
    theory["loss"] = 2 * ref["Delta"] * theory["Delta"] + sol.var("Delta")
    kw = dict(L=L, gamma=gamma, y=y, eta=eta, T=T, Kx=Kx)
    a = deep_mean_shift(ref, N=32, E=20000, seed=70, **kw)
    b = deep_mean_shift(ref, N=64, E=40000, seed=71, **kw)
    for n in names + ["loss"]:
        assert a.value[n].shape == theory[n].shape, n
        ext, se = 2 * b.value[n] - a.value[n], np.sqrt(4 * b.se[n] ** 2 + a.se[n] ** 2)
        ok = se > 0                                       # exact entries (Phi[1] at t = 0 is a control variate)
        assert (np.abs(ext - theory[n])[ok] / se[ok]).max() <= 4.0, n
    ok = a.se["Delta"] > 0
    assert (np.abs(a.value["Delta"])[ok] / a.se["Delta"][ok]).max() > 10


# ----------------------------------------------------------------------------- the Monte Carlo propagator
@pytest.mark.parametrize("P, T, L", [(3, 3, 2), (2, 4, 3)])
def test_monte_carlo_propagator_on_points_is_exact_on_a_gaussian_cubature(tmp_path, P, T, L):
    """For phi = h every sum behind the Monte Carlo Hessian is a Gaussian moment of degree <= 4, so the Monte
    Carlo propagator run on the points of a degree-5 cubature rule (dmftc.reference.deep_autodiff) must equal the
    exact one of the closed-form action over the T P steps (linear_propagator) to round-off, for every block of
    every point and pair.  This checks the estimator's causality by time (anti-causal couplings, the readout's
    time-0 term per point, the causal blocks of the Price sums and of U) on a case where an index-ordered
    causality would differ."""
    from dmftc.reference.deep_autodiff import gaussian_cubature5
    from dmftc.runtime.march.deep_dmft import SpecKernels
    from dmftc.runtime.problem.deep_model import from_spec
    from dmftc.runtime.engines.deep_points import linear_propagator, resolve_point_params
    from dmftc.runtime.engines.deep_propagator import group_propagator
    from dmftc.runtime.results.point_observables import PointObservables

    mod = _load(tmp_path, LINEAR, "deep_multi_linear").module
    rng = np.random.default_rng(P + T)
    p, L, T, P = resolve_point_params(mod, dict(P=P, T=T, L=L, Kx=_gram(P, P), y=rng.uniform(-1, 1, P), eta=0.2,
                                                gamma=1.2))
    model = from_spec(mod, p)
    obs = PointObservables(mod, model, L, T, P)
    n = T * P
    pts, w = gaussian_cubature5(2 * n)
    xiu, xir = np.repeat(pts[None, :, :n], L, axis=0), np.repeat(pts[None, :, n:], L, axis=0)
    mc = group_propagator(activation=SpecKernels(mod).site_activation(p, 0.1), L=L, T=n, xiu=xiu, xir=xir,
                          weights=w, model=model, points=P, observables=obs)
    assert mc.diagnostics["stationarity"] < 1e-12
    exact = linear_propagator(mod, p, L, T, P)[0]
    got = obs.dense(mc.sigma)
    scale = {a: np.abs(exact.sigma(a, a)).max() for a in obs.names}
    for a in obs.names:
        for b in obs.names:
            # round-off of the two marches' pivoted Cholesky factors (stationarity ~1e-13) reaches 5e-8 of a block's
            # Cauchy-Schwarz scale at L = 3; a causality error gives O(1) (measured by mutation: 0.1 to 9 times the block)
            err = np.abs(got.sigma(a, b) - exact.sigma(a, b)).max()
            assert err <= 1e-7 * np.sqrt(scale[a] * scale[b]), (a, b, err)


@pytest.mark.parametrize("act, gamma, seed", [pytest.param("tanh(h)", 1.0, 3, id="tanh"),
                                               pytest.param("sin(h)", 1.5, 6, marks=pytest.mark.slow, id="sin")])
def test_monte_carlo_propagator_on_points_matches_networks(tmp_path, act, gamma, seed):
    """N Var of Delta_mu, K_{mu nu} and the equal-time Phi[l], G[l] of every point and pair of nonlinear deep
    networks on P = 3 points of a random Gram matrix with targets of both signs (N = 128/256 extrapolated,
    E = 4000), pointwise within 4 combined standard errors; the ensembles resolve each curve to < 8% of its
    peak, so the comparison can fail (the full-size run is in docs/validation.md)."""
    P, L, T, eta = 3, 2, 5, 0.1
    rng = np.random.default_rng(seed)
    Kx = _gram(P, seed)
    y = rng.uniform(-1, 1, P)
    text = MULTI.replace("activation phi(h) = tanh(h)", f"activation phi(h) = {act}")
    sol = _load(tmp_path, text).solve(P=P, Kx=Kx, y=y, L=L, T=T, eta=eta, gamma=gamma, samples=8000,
                                      propagator_samples=1024, propagator_groups=8, seed=seed)
    truth = deep_truth(activation=act, L=L, gamma=gamma, y=y, eta=eta, T=T, N=128, E=4000, Kx=Kx, seed=seed + 50)
    for n in ["Delta", "K"] + [f"{k}[{l}]" for k in ("Phi", "G") for l in range(1, L + 1)]:
        th, th_se, en, se = sol.var(n), sol.var_stderr(n), truth.nvar[n], truth.se_nvar[n]
        assert th.shape == en.shape, n
        peak = np.abs(en).max()
        assert se.max() < 0.08 * peak, n
        z = np.abs(th - en) / np.maximum(np.sqrt(se ** 2 + th_se ** 2), 1e-12 * peak)
        assert z.max() <= 4.0, (n, z.max())
    assert sol.info["propagator_stationarity"] < 1e-12


# ----------------------------------------------------------------------------- the solution
def test_shapes_summary_save_and_propagator(tmp_path):
    m = _load(tmp_path, MULTI)
    sol = m.solve(T=4, samples=200, groups=2, propagator_samples=256, propagator_groups=2)
    P, T = 3, 4
    assert sol.mean("Delta").shape == (P, T) and sol.mean("K").shape == (P, P, T)
    assert sol.mean("Phi[2]").shape == sol.mean("B[1]").shape == (P, P, T, T)
    np.testing.assert_allclose(sol.mean("Delta")[:, 0], 1.0)                       # y = 1 at every point
    K = sol.mean("K")
    np.testing.assert_allclose(K, K.transpose(1, 0, 2), atol=1e-12)
    assert sol.var("Delta").shape == sol.var_stderr("Delta").shape == (P, T)
    assert sol.var("K").shape == (P, P, T) and sol.sigma("Delta", "G[2]").shape == (P, T, P, P, T)
    np.testing.assert_allclose(sol.var("K"), sol.var("K").transpose(1, 0, 2), rtol=1e-10)
    np.testing.assert_allclose(sol.var("Delta")[:, 0], 0.0, atol=1e-12)           # Delta(0) = y exactly
    assert np.all(sol.var("Delta")[:, 1:] > 0) and sol.info["propagator_stationarity"] < 1e-12
    text = sol.summary()
    assert "Delta" in text and "3x3" in text and "peak N Var" in text
    back = dmftc.Solution.load(sol.save(tmp_path / "r.npz"))
    np.testing.assert_array_equal(back.mean("Phi[1]"), sol.mean("Phi[1]"))
    np.testing.assert_array_equal(back.var("K"), sol.var("K"))
    np.testing.assert_array_equal(back.var_stderr("Delta"), sol.var_stderr("Delta"))


def test_kinked_activations_on_points_say_what_they_approximate(tmp_path):
    """A kink in phi'' (softsign): the propagator is extrapolated in the delta width and the solution says so; a
    kink in phi' (relu): the means stand and N Var is refused with the reason."""
    soft = _load(tmp_path, MULTI.replace("activation phi(h) = tanh(h)", "activation phi(h) = h / (1 + abs(h))"),
                 "deep_multi_soft")
    kw = dict(P=2, Kx=_gram(2, 4), y=np.array([0.7, -0.4]), T=3, samples=400, groups=2, propagator_samples=128,
              propagator_groups=2)
    sol = soft.solve(**kw)
    assert np.all(np.isfinite(sol.var("K"))) and sol.info["dirac_extrapolated"] is True
    assert "delta function" in sol.info["approximation"] and "note:" in sol.summary()
    relu = _load(tmp_path, MULTI.replace("activation phi(h) = tanh(h)", "activation phi(h) = max(0, h)"),
                 "deep_multi_relu").solve(**kw)
    assert relu.mean("Delta").shape == (2, 3)
    with pytest.raises(ParameterError, match="no deep propagator"):
        relu.var("Delta")


@pytest.mark.parametrize("given, word", [
    (dict(Kx=np.eye(2), P=3), r"'Kx' must have shape \(3, 3\)"),
    (dict(y=np.ones(4), P=3), r"'y' must have shape \(3,\)"),
    (dict(y=np.ones(4), Kx=np.eye(3)), "disagree on the size P: 'y' has 4, 'Kx' has 3"),
    (dict(Kx=np.array([[1.0, 2.0], [0.0, 1.0]]), P=2), "symmetric"),
    (dict(Kx=np.array([[1.0, 2.0], [2.0, 1.0]]), P=2), "positive semi-definite"),
    (dict(P=2.5), "integer"),
    (dict(correction=True), "mean correction of nonlinear deep specs"),
])
def test_bad_parameters_are_explained(tmp_path, given, word):
    with pytest.raises(ParameterError, match=word):
        _load(tmp_path, MULTI).solve(T=3, samples=40, groups=2, **given)


def test_array_shapes_set_the_number_of_points(tmp_path):
    sol = _load(tmp_path, MULTI).solve(T=3, samples=40, groups=2, Kx=_gram(2, 1), y=np.array([1.0, -1.0]))
    assert sol.mean("K").shape == (2, 2, 3)


# ----------------------------------------------------------------------------- located errors
H_SUM = "sum(s < t: sum(nu: A[l-1, mu, nu](t, s) g[l, nu](s)))"

BAD = [
    ("missing-point", (("g[l, mu](t) = phi'(h[l, mu](t))", "g[l, mu](t) = phi'(h[l](t))"),), ShapeSpecError,
     "h[l](t))", "g[l, mu](t) = ", "'h' takes the layer index and one point index", "h[l, mu]"),
    ("wrong-point-at-t", (("g[l, mu](t) = phi'(h[l, mu](t))", "g[l, mu](t) = phi'(h[l, nu](t))"),), ShapeSpecError,
     "h[l, nu](t))", "g[l, mu](t) = ", "at the time 't' the point is 'mu', not 'nu'", "sum(nu:"),
    ("time-sum-without-point-sum", ((H_SUM, "sum(s < t: A[l-1, mu, nu](t, s) g[l, nu](s))"),), ShapeSpecError,
     "A[l-1, mu, nu](t, s) g", None, "no point is paired with the time 's'", "sum(s < t: sum(nu:"),
    ("pair-parameter-in-a-field", (("g[l, mu](t) = phi'(h[l, mu](t)) z[l, mu](t)",
                                    "g[l, mu](t) = phi'(h[l, mu](t)) z[l, mu](t) Kx[mu, nu]"),), ShapeSpecError,
     "Kx[mu, nu]", "g[l, mu](t) = ", "a parameter with point indices is read with the points of its equation",
     "Phi[0, mu, nu](t, s) = Kx[mu, nu]"),
    ("order-without-point", (("order Delta[mu](t)", "order Delta(t)"),), ShapeSpecError, "Delta(t), K",
     None, "carries the point index", "Delta[mu](t)"),
    ("family-one-point", (("order Delta[mu](t), K[mu, nu](t), Phi[l, mu, nu](t, s)",
                           "order Delta[mu](t), K[mu, nu](t), Phi[l, mu](t, s)"),), ShapeSpecError, "Phi[l, mu](t, s)",
     "order ", "'Phi' takes the layer index and two point indices", "Phi[l, mu, nu]"),
    ("unpaired-point-sum", (("g[l, mu](t) = phi'(h[l, mu](t)) z[l, mu](t)",
                             "g[l, mu](t) = phi'(h[l, mu](t)) z[l, mu](t) + sum(nu: h[l, nu](t))"),),
     StructureSpecError, "sum(nu: h[l, nu](t))", None, "pairs with a sum over earlier times", None),
    ("array-parameter-size", (('param y[P] = 1.0', 'param y[L] = 1.0'),), ShapeSpecError, "param y[L]", None,
     "one or two dimensions of size 'P'", "param y[P]"),
    # the update mask of test points (tests/test_deep_test_points.py)
    ("mask-without-error-signal", (("sum(nu: m[nu] Delta[nu](s) Phi[l-1, mu, nu](t, s) g[l, nu](s))",
                                    "sum(nu: Delta[nu](s) Phi[l-1, mu, nu](t, s) g[l, nu](s) + m[nu] g[l, nu](s))"),),
     ShapeSpecError, "m[nu] g[l", None, "update mask and multiplies the error signal's term only", "m[nu] Delta[nu]"),
    ("mask-in-one-field", (("sum(nu: m[nu] Delta[nu](s) G[l+1", "sum(nu: Delta[nu](s) G[l+1"),), ShapeSpecError,
     "Delta[nu](s) G[l+1", None, "lacks the update mask 'm'", "a test point updates no layer"),
    ("two-masks", (("sum(nu: m[nu] Delta[nu](s) G[l+1", "sum(nu: y[nu] Delta[nu](s) G[l+1"),), ShapeSpecError,
     "y[nu] Delta[nu](s) G[l+1", None, "one update mask for every field", "in every layer and field alike"),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_point_indices_are_located(case):
    _, edits, exc, at, after, message, hint = case
    text = MULTI
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    with pytest.raises(SpecError) as info:
        derive(check(parse(text, "specs/deep_multi.dmft")))
    err = info.value
    assert type(err) is exc, err.render()
    assert message in err.message, err.render()
    if hint is not None:
        assert err.hint and hint in err.hint, err.render()
    start = text.index(after) + len(after) if after else 0
    i = text.index(at, start)
    line, col = text.count("\n", 0, i) + 1, i - (text.rfind("\n", 0, i) + 1) + 1
    assert (err.pos.line, err.pos.col) == (line, col), err.render()
    assert re.fullmatch(rf"specs/deep_multi\.dmft:{line}:{col}: error: .+", err.render().splitlines()[0])


def test_array_parameter_without_points_is_explained():
    text = (SPECS / "deep_tanh.dmft").read_text().replace('param y = 1.0', 'param y[L] = 1.0')
    with pytest.raises(StructureSpecError, match="without a point index") as info:
        check(parse(text, "specs/deep_tanh.dmft"))
    assert "index mu, nu in 1..L" in info.value.hint
