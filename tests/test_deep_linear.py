"""Deep linear networks: exact discrete-time saddle, Gaussian DMFT action, autodiff propagator, and
validation against finite-width networks (dmftc.validation.deep_ensemble) and the exact two-layer backend."""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dmftc.runtime.problem.deep_action import Layout, gather_local, observable_names, saddle_point_vector
from dmftc.reference.dense_hessian import action_hessian, dense_linear_propagator
from dmftc.runtime.engines.deep_linear import deep_linear_action, deep_linear_propagator, deep_linear_saddle

ROOT = Path(__file__).resolve().parent.parent
PARAMS = dict(gamma=1.0, y=1.0, eta=0.1, T=10)
_CACHE: dict = {}


def propagator(L):
    if L not in _CACHE:
        _CACHE[L] = deep_linear_propagator(L=L, **PARAMS)
    return _CACHE[L]


def test_two_layer_saddle_equals_discrete_closed_form():
    """L = 1: v+- = (u +- r)/sqrt 2 decouple, v+-(t+1) = (1 +- eta gamma Delta(t)) v+-(t), so with
    a, b = prod (1 +- eta gamma Delta): Phi = G = (a a^T + b b^T)/2, f = (a^2 - b^2)/(2 gamma), K = a^2 + b^2."""
    gamma, eta, y, T = 1.5, 0.3, 0.8, 25
    s = deep_linear_saddle(L=1, gamma=gamma, y=y, eta=eta, T=T)
    a = np.concatenate([[1.0], np.cumprod(1 + eta * gamma * s.Delta[:-1])])
    b = np.concatenate([[1.0], np.cumprod(1 - eta * gamma * s.Delta[:-1])])
    np.testing.assert_allclose(s.Delta, y - (a ** 2 - b ** 2) / (2 * gamma), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(s.K, a ** 2 + b ** 2, rtol=1e-12)
    np.testing.assert_allclose(s.Phi[0], (np.outer(a, a) + np.outer(b, b)) / 2, rtol=1e-12)
    np.testing.assert_allclose(s.G[0], (np.outer(a, a) + np.outer(b, b)) / 2, rtol=1e-12)
    # Rphi(t,s) = dh(t)/dr(s), a kick of z at time s only: h(s+1) += eta gamma Delta(s), z(s+1) unchanged
    kick = eta * gamma * s.Delta / 2
    a1, b1 = np.append(a[1:], np.nan), np.append(b[1:], np.nan)
    R = np.tril((np.outer(a, kick / a1) + np.outer(b, kick / b1)), -1)
    np.testing.assert_allclose(s.Rphi[0], np.nan_to_num(R), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("L", [2, 3])
def test_deep_saddle_first_step_and_initial_values(L):
    """At t = 0 every kernel diagonal is 1 and K = L + 1; at infinite width the first step is exactly
    linear, f(1) = eta K(0) y, since the multi-layer cross terms carry h^L . w / N = gamma f(0) = 0."""
    s = deep_linear_saddle(L=L, gamma=1.3, y=0.7, eta=0.2, T=4)
    assert s.Delta[0] == 0.7 and s.K[0] == pytest.approx(L + 1, rel=1e-14)
    for l in range(L):
        assert s.Phi[l][0, 0] == pytest.approx(1, rel=1e-14) and s.G[l][0, 0] == pytest.approx(1, rel=1e-14)
        assert np.allclose(np.triu(s.Rphi[l]), 0) and np.allclose(np.triu(s.Rg[l], 1), 0)   # causality
    assert s.Delta[1] == pytest.approx(0.7 * (1 - 0.2 * (L + 1)), rel=1e-13)


@pytest.mark.parametrize("L", [1, 2, 3])
def test_action_is_stationary_at_the_saddle(L):
    """dS/dq = 0 for every order parameter at the marched saddle (hats 0, A = Rphi, B = Rg): the Gaussian
    determinant formula reproduces the march's kernels, error and responses (all to round-off).  For A, B
    this pins the pairing -Tr(A B) = -sum A(t,s) B(s,t) against d ln Z/dA(t,s) = Rg(s,t), which is nonzero
    for the ANTI-causal entries of A: A and B must be kept as full T x T matrices."""
    T = PARAMS["T"]
    s = deep_linear_saddle(L=L, **PARAMS)
    x0 = saddle_point_vector(s)
    lay = Layout(L, T)
    grad = np.asarray(jax.jit(jax.grad(lambda x: deep_linear_action(x, L=L, **PARAMS)))(jnp.asarray(x0)))
    for name in lay.blocks:
        scale = max(1.0, np.abs(x0).max())
        assert np.abs(grad[lay.slice(name)]).max() < 1e-12 * scale, name


def test_blocked_hessian_equals_dense_jax_hessian():
    kw = dict(L=2, gamma=1.2, y=1.0, eta=0.15, T=5)
    x0 = saddle_point_vector(deep_linear_saddle(**kw))
    Hd = action_hessian(x0, method="dense", **kw)
    Hb = action_hessian(x0, method="blocked", **kw)
    np.testing.assert_allclose(Hb, Hd, rtol=0, atol=1e-12 * np.abs(Hd).max())


@pytest.mark.parametrize("L, T, correction", [(2, 6, False), (3, 5, True)])
def test_causal_solve_equals_the_dense_inverse_of_the_whole_hessian(L, T, correction):
    """The runtime's deep linear propagator (U and Kd assembled layer by layer from the dual rows of each ln Z_l's
    Hessian, block back substitution, the whole inverse from U^-1 for the mean correction) against the LU of the
    whole Hessian (every entry, the primal-primal block included) assembled densely: the physical block, the
    observables and m1 agree to round-off."""
    kw = dict(L=L, T=T, gamma=1.3, y=-0.7, eta=0.15)
    fast = deep_linear_propagator(**kw, correction=correction)
    dense = dense_linear_propagator(**kw, correction=correction)
    scale = np.abs(dense.sigma_phys).max()
    np.testing.assert_allclose(fast.sigma_phys, dense.sigma_phys, rtol=0, atol=1e-11 * scale)
    for a in dense.sigma:
        for b in dense.sigma:
            np.testing.assert_allclose(fast.sigma[a][b], dense.sigma[a][b], rtol=0, atol=1e-11 * scale)
    if correction:
        for name in ("Delta", "K", f"Phi[{L}]", "G[1]"):
            ref = dense.mean_correction(name)
            np.testing.assert_allclose(fast.mean_correction(name), ref, rtol=0, atol=1e-10 * np.abs(ref).max())


def test_paper_schur_route_and_vanishing_hat_variance():
    """Full inverse of the Hessian vs the paper's route (Sigma0 = [[U^-1 kappa U^-T, -U^-1], [-U^-T, 0]] on
    (kernels, hats), then the Schur complement that folds in A, B): identical physical block, zero
    physical-physical Hessian block and vanishing variance of every conjugate variable."""
    kw = dict(L=3, gamma=1.0, y=1.0, eta=0.2, T=5)
    lay = Layout(kw["L"], kw["T"])
    H = action_hessian(saddle_point_vector(deep_linear_saddle(**kw)), **kw)
    p, n = lay.n_phys, lay.n
    h, r = slice(p, 2 * p), slice(2 * p, n)
    assert np.abs(H[:p, :p]).max() == 0
    Sigma = -np.linalg.inv(H)
    scale = np.abs(Sigma[:p, :p]).max()
    assert np.abs(Sigma[h, h]).max() < 1e-10 * scale
    U, kappa = H[h, :p], H[h, h]
    Ui = np.linalg.inv(U)
    S0 = np.block([[Ui @ kappa @ Ui.T, -Ui], [-Ui.T, np.zeros((p, p))]])
    H12, H22 = H[: 2 * p, r], H[r, r]
    S11 = S0 - S0 @ H12 @ np.linalg.solve(H22 + H12.T @ S0 @ H12, H12.T @ S0)
    np.testing.assert_allclose(S11[:p, :p], Sigma[:p, :p], rtol=0, atol=1e-10 * scale)


@pytest.mark.parametrize("L", [2, 3])
def test_propagator_is_symmetric_psd_with_exact_initial_covariances(L):
    """At initialisation (linear net, Gaussian weights) N Cov(Phi[l](0,0), Phi[m](0,0)) = 2 min(l, m),
    N Cov(G[l](0,0), G[m](0,0)) = 2 (L + 1 - max(l, m)), Phi and G uncorrelated, Delta(0) = y exactly."""
    P = propagator(L)
    d = P.diagnostics
    assert d["psd"] and d["min_eig"] > -1e-10 * d["max_eig"] and d["asymmetry"] < 1e-12
    for a in observable_names(L):
        for b in observable_names(L):
            np.testing.assert_allclose(P[a][b], P[b][a].T, rtol=0, atol=1e-12 * max(1, np.abs(P[a][b]).max()))
    assert np.all(P["Delta"]["Delta"][0] == 0)
    for l in range(1, L + 1):
        for m in range(1, L + 1):
            assert P[f"Phi[{l}]"][f"Phi[{m}]"][0, 0] == pytest.approx(2 * min(l, m), rel=1e-10)
            assert P[f"G[{l}]"][f"G[{m}]"][0, 0] == pytest.approx(2 * (L + 1 - max(l, m)), rel=1e-10)
            assert abs(P[f"Phi[{l}]"][f"G[{m}]"][0, 0]) < 1e-10
    # K(0) = sum of all kernel diagonals (each ~ 1): its variance is the sum of the blocks above
    expected = 4 * sum(min(l, m) for l in range(1, L + 1) for m in range(1, L + 1))
    assert P["K"]["K"][0, 0] == pytest.approx(expected, rel=1e-10)
    # two-time blocks: the time-diagonal entries reproduce sigma, and the block is symmetric
    tt = P.two_time("Phi[2]", "G[1]")
    idx = np.arange(PARAMS["T"])
    np.testing.assert_allclose(tt[idx, idx][:, idx, idx], P["Phi[2]"]["G[1]"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tt, tt.transpose(1, 0, 2, 3), rtol=0, atol=0)


def test_two_layer_matches_exact_backend():
    """L = 1 is the shipped eos spec (two-layer linear net, discrete GD): same saddle and propagator."""
    import dmftc

    m = dmftc.load(ROOT / "specs" / "eos.dmft")
    for gamma, eta, T in ((1.0, 0.1, 10), (1.5, 0.4, 10)):
        sol = m.solve(gamma=gamma, eta=eta, T=T, backend="exact")
        P = deep_linear_propagator(L=1, gamma=gamma, y=1.0, eta=eta, T=T)
        np.testing.assert_allclose(P.saddle.Delta, sol.mean("Delta"), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(P.saddle.K, sol.mean("K"), rtol=1e-12)
        for a, b in (("Delta", "Delta"), ("K", "K"), ("K", "Delta")):
            ref = np.asarray(sol.sigma(a, b))
            np.testing.assert_allclose(P[a][b], ref, rtol=0, atol=1e-12 * np.abs(ref).max())


@pytest.mark.parametrize("L, E", [(2, 1000), (3, 1000)])
def test_propagator_matches_finite_width_networks(L, E):
    """Richardson-extrapolated (N = 256, 512) ensembles of real deep linear networks: N Var of Delta, K and
    every kernel diagonal, and the means, within 4 standard errors of the theory at every time."""
    from dmftc.validation.deep_ensemble import deep_truth

    P = propagator(L)
    s = P.saddle
    truth = deep_truth(activation="linear", L=L, N=256, E=E, seed=11, extrapolate=True, **PARAMS)
    means = {"Delta": s.Delta, "K": s.K, **{f"Phi[{l}]": np.diag(s.Phi[l - 1]) for l in range(1, L + 1)},
             **{f"G[{l}]": np.diag(s.G[l - 1]) for l in range(1, L + 1)}}
    for name in observable_names(L):
        nvar, se = truth.nvar[name], truth.se_nvar[name]
        m, sem = truth.mean[name], truth.se_mean[name]
        if m.ndim == 2:
            m, sem = np.diag(m), np.diag(sem)
        exact = se == 0                                  # Delta(0) = y in every member
        assert np.all(P.var(name)[exact] == 0) and np.all(nvar[exact] == 0), name
        z = np.abs(P.var(name) - nvar)[~exact] / se[~exact]
        assert z.max() <= 4, (name, z.round(2))
        ok = sem > 0
        zm = np.abs(means[name] - m)[ok] / sem[ok]
        assert zm.max() <= 4, (name, zm.round(2))


def test_a_parameter_sweep_reuses_the_compiled_hessian_and_matches_a_fresh_compile(tmp_path):
    """Models of one family (the standard network; a compiled spec at other parameter values) share one compiled
    local Hessian with their values traced; it equals the Hessian compiled for the model alone (bind=None)."""
    import dataclasses

    import dmftc
    from pathlib import Path

    from dmftc.runtime.engines import deep_linear
    from dmftc.runtime.problem.deep_model import from_spec
    from dmftc.reference.standard_model import standard

    T, L = 4, 2
    spec = dmftc.load(Path(__file__).resolve().parents[1] / "specs" / "deep_linear.dmft")
    for make in (lambda g: standard(gamma=g, eta=0.2, y=0.7),
                 lambda g: from_spec(spec.module, {"L": L, "gamma": g, "y": -0.4, "eta": 0.1, "T": T})):
        sizes = []
        for g in (0.8, 1.7):
            model = make(g)
            x0 = saddle_point_vector(deep_linear_saddle(L=L, T=T, model=model))
            v, _ = gather_local(jnp.asarray(x0), Layout(L, T), L, model.phi0, model.g_top)
            h = np.asarray(deep_linear.local_hessian(T, model)(v, 1.0))
            sizes.append(len(deep_linear._HESS_CACHE))
            alone = dataclasses.replace(model, bind=None, family=None, key=("alone",) + model.key)
            ref = np.asarray(deep_linear.local_hessian(T, alone)(v, 1.0))
            np.testing.assert_allclose(h, ref, rtol=0, atol=1e-12 * np.abs(ref).max())
        assert sizes[1] == sizes[0] + 1                  # the second value compiled only the 'alone' reference


def test_linear_spec_action_must_be_stationary_at_its_programs_saddle(monkeypatch):
    """A linear spec's saddle is its own program marched on the exact basis; the propagator differentiates the
    closed-form action read from the spec (deep_model.from_spec).  That action is stationary there to round-off,
    a model with a coupling 5% off is not, and a spec whose action were not gets its means without a propagator."""
    import dataclasses

    import dmftc
    from dmftc.errors import StructureSpecError
    from dmftc.runtime.engines import deep_linear
    from dmftc.runtime.problem.deep_model import from_spec
    from dmftc.runtime.engines.deep_spec import resolve_deep_params

    m = dmftc.load(ROOT / "specs" / "deep_linear.dmft")
    p, L, T = resolve_deep_params(m.module, dict(L=2, T=6, gamma=1.3, y=-0.4))
    model = from_spec(m.module, p)
    sad = deep_linear.deep_linear_saddle(L=L, T=T, model=model)
    assert deep_linear.stationarity(sad, model) < 1e-12
    k_h = model.k_h
    wrong = dataclasses.replace(model, k_h=lambda q, d: 1.05 * k_h(q, d), key=("wrong",), family=None, bind=None)
    assert deep_linear.stationarity(sad, wrong) > 1e-4
    monkeypatch.setattr(deep_linear, "stationarity", lambda sad, model: 1e-3)
    sol = m.solve(L=2, T=6)
    assert np.all(np.isfinite(sol.mean("K")))
    with pytest.raises(StructureSpecError, match="different saddle points"):
        sol.var("K")
