"""Exact Gaussian backend: closed forms, agreement with Monte Carlo, determinism."""
from pathlib import Path

import numpy as np
import pytest

import dmftc
from dmftc.errors import ParameterError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def eos():
    return dmftc.load(ROOT / "specs" / "eos.dmft")


def _closed_form(delta, eta, gamma):
    """Discrete-time v+/v- decoupling of the two-layer linear net (paper App. "Two layer linear network
    closed form", discretised): v+(t+1) = (1 + eta gamma Delta(t)) v+(t), v-(t+1) = (1 - eta gamma Delta(t)) v-(t),
    v+-(0) = (u +- r)/sqrt 2 independent standard normals, h = (v+ + v-)/sqrt 2, z = (v+ - v-)/sqrt 2."""
    T = len(delta)
    a = np.concatenate([[1.0], np.cumprod(1 + eta * gamma * delta[:-1])])
    b = np.concatenate([[1.0], np.cumprod(1 - eta * gamma * delta[:-1])])
    A, B = a ** 2, b ** 2
    K = A + B                                              # <h^2 + z^2> = <v+^2 + v-^2>
    Delta = 1.0 - (A - B) / (2 * gamma)                    # y - <z h - r u> / gamma, y = 1
    kappa_K = 2 * np.outer(A, A) + 2 * np.outer(B, B)      # Var(xi^2) = 2 (Isserlis)
    kappa_D = 2 * (np.outer(A - 1, A - 1) + np.outer(B - 1, B - 1)) / (4 * gamma ** 2)
    kappa_KD = -(2 * np.outer(A, A - 1) - 2 * np.outer(B, B - 1)) / (2 * gamma)
    causal = np.tril(np.ones((T, T)), -1)                  # D(t, s) needs s < t
    gp = 2 * eta * gamma / (1 + eta * gamma * delta)
    gm = 2 * eta * gamma / (1 - eta * gamma * delta)
    D_K = (np.outer(A, gp) - np.outer(B, gm)) * causal     # d<O_K(t)>/dDelta(s)
    D_D = -(np.outer(A, gp) + np.outer(B, gm)) * causal / (2 * gamma)
    return K, Delta, kappa_K, kappa_D, kappa_KD, D_K, D_D


def _D(sol, row):
    T = len(sol.times)
    explicit = np.eye(T) if row == "Delta" else 0.0        # U = dC/dq - D, with dC_Delta/dDelta = identity
    return explicit - sol.U(row, "Delta")


@pytest.mark.parametrize("gamma, eta", [(1.5, 0.4), (6.0, 0.2)])
def test_exact_backend_equals_discrete_closed_forms(eos, gamma, eta):
    sol = eos.solve(gamma=gamma, eta=eta, T=25, backend="exact")
    assert sol.info["diagnostics"]["backend"] == "exact"
    K, Delta, kK, kD, kKD, DK, DD = _closed_form(sol.mean("Delta"), eta, gamma)
    np.testing.assert_allclose(sol.mean("K"), K, rtol=1e-10)
    np.testing.assert_allclose(sol.mean("Delta"), Delta, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(sol.kappa("K"), kK, rtol=1e-10, atol=1e-12 * np.abs(kK).max())
    np.testing.assert_allclose(sol.kappa("Delta"), kD, rtol=1e-10, atol=1e-12 * np.abs(kD).max())
    np.testing.assert_allclose(sol.kappa("K", "Delta"), kKD, rtol=1e-10, atol=1e-12 * np.abs(kKD).max())
    np.testing.assert_allclose(_D(sol, "K"), DK, rtol=1e-10, atol=1e-12 * np.abs(DK).max())
    np.testing.assert_allclose(_D(sol, "Delta"), DD, rtol=1e-10, atol=1e-12 * np.abs(DD).max())


def test_continuous_time_limit_is_approached_at_order_eta(eos):
    """Paper (continuous time): K(t) = exp(2 g I) + exp(-2 g I), D(t,s)/eta = 2 g [exp(2 g I) - exp(-2 g I)],
    I = int_0^t Delta; halving eta (same t_max) halves the error."""
    gamma, tmax = 1.0, 2.0
    errs = []
    for eta in (0.02, 0.01):
        T = int(round(tmax / eta))
        sol = eos.solve(gamma=gamma, eta=eta, T=T, backend="exact")
        delta = sol.mean("Delta")
        I = eta * np.concatenate([[0.0], np.cumsum(delta[:-1])])
        K_ct = np.exp(2 * gamma * I) + np.exp(-2 * gamma * I)
        D_ct = 2 * gamma * (np.exp(2 * gamma * I) - np.exp(-2 * gamma * I))
        D_rate = _D(sol, "K")[-1, : T - 1] / eta                # row t = tmax, s < t
        errs.append((np.abs(sol.mean("K") - K_ct).max(), np.abs(D_rate - D_ct[-1]).max()))
    for coarse, fine in zip(*errs):
        assert 1.7 < coarse / fine < 2.3                      # first order in eta


def test_exact_backend_is_deterministic_and_needs_no_samples(eos):
    a = eos.solve(T=15, backend="exact")
    b = eos.solve(T=15, backend="exact", samples=7, seed=99)
    assert np.array_equal(a.blocks.sigma_full, b.blocks.sigma_full) and np.array_equal(a.mean("K"), b.mean("K"))
    assert a.info["samples"] is None and np.all(a.stderr("K") == 0)


def test_auto_picks_exact_for_linear_cubature_for_smooth_three_sources_else_mc(eos):
    """backend='auto': exact for a linear process; the cubature for a smooth activation on three source
    coordinates (two_layer, tanh), saying so; Monte Carlo for a kinked activation (two_layer_multi, relu), for
    more coordinates (two_layer_softmax, tanh, P + C sources: sparse grids), a budget below the smallest rule,
    and whenever the solve asks for sampled paths (the mean correction, a sampler)."""
    assert eos.solve(T=5).info["diagnostics"]["backend"] == "exact"
    tl = dmftc.load(ROOT / "specs" / "two_layer.dmft")
    auto = tl.solve(T=5, samples=200)
    assert auto.info["diagnostics"]["backend"] == "cubature"
    assert "auto" in auto.info["diagnostics"]["auto"] and "chosen by backend 'auto'" in auto.summary()
    cub = tl.solve(T=5, samples=200, backend="cubature")
    assert np.array_equal(auto.blocks.sigma_full, cub.blocks.sigma_full)
    for kw in (dict(samples=40), dict(samples=200, correction=True), dict(samples=200, sampler="sobol")):
        sol = tl.solve(T=5, **kw)
        assert sol.info["diagnostics"]["backend"] == "mc" and "auto" not in sol.info["diagnostics"], kw
    relu = dmftc.load(ROOT / "specs" / "two_layer_multi.dmft")
    assert relu.solve(T=3, P=2, samples=400).info["diagnostics"]["backend"] == "mc"
    softmax = dmftc.load(ROOT / "specs" / "two_layer_softmax.dmft")
    assert softmax.solve(T=3, samples=400).info["diagnostics"]["backend"] == "mc"
    with pytest.raises(ParameterError, match=r"field g = .*tanh.*\(line \d+\) is not affine"):
        tl.solve(T=5, backend="exact")


def test_monte_carlo_agrees_with_exact_and_error_decays_as_inverse_sqrt(eos):
    """MC within its own error bars (4 standard errors) at 1e4 and 1e5 samples; the RMS error over
    seeds and times decays like samples^-1/2: fitted log-log slope within 0.15 of -0.5."""
    params = dict(gamma=1.5, eta=0.4, T=10)
    ex = eos.solve(backend="exact", **params)
    sizes, rms = [2_000, 8_000, 32_000], []
    for S in sizes:
        errs = []
        for seed in range(4):
            mc = eos.solve(backend="mc", samples=S, seed=seed, **params)
            for n in ("Delta", "K"):
                errs.append((mc.var(n) - ex.var(n))[1:] / ex.var(n).max())
        rms.append(np.sqrt(np.mean(np.square(errs))))
    slope = np.polyfit(np.log(sizes), np.log(rms), 1)[0]
    assert abs(slope + 0.5) < 0.15, (slope, rms)
    for S in (10_000, 100_000):
        mc = eos.solve(backend="mc", samples=S, seed=1, **params)
        for n in ("Delta", "K"):
            z = np.abs(mc.var(n) - ex.var(n))[1:] / mc.stderr(n)[1:]
            assert z.max() < 4, (S, n, z.max())
            zm = np.abs(mc.mean(n) - ex.mean(n))[1:] / mc.stderr(n, "mean")[1:]
            assert zm.max() < 4, (S, n, zm.max())


def test_linear_whitened_target_and_orthogonal_directions():
    """Sigma_y = y^T Sigma_Delta y and Sigma_perp = e^T Sigma_Delta e (e orthogonal to y) come out of the
    general propagator, are the same for every orthogonal direction, and match width-N networks."""
    m = dmftc.load(ROOT / "specs" / "linear_whitened.dmft")
    P = 4
    sol = m.solve(P=P, T=40, eta=0.05, gamma=1.0)
    S = sol.sigma("Delta")                                     # (P, T, P, T)
    y = np.full(P, 0.5)
    Q, _ = np.linalg.qr(np.column_stack([y, np.eye(P)[:, 1:]]))
    perp = Q[:, 1:]
    Sy = np.einsum("m,mtns,n->ts", y, S, y)
    Sp = np.einsum("mi,mtns,ni->its", perp, S, perp)
    for i in range(1, P - 1):
        np.testing.assert_allclose(Sp[i], Sp[0], rtol=1e-8, atol=1e-12)
    assert np.abs(np.diag(Sp[0])).max() > 0.05 * np.abs(np.diag(Sy)).max()   # perp fluctuations are not trivial
    # finite-width networks: project each member's Delta trajectory
    from dmftc.validation.ensemble import simulate_two_layer

    for N, seed in ((512, 3),):
        st = simulate_two_layer(activation="linear", Kx_all=np.eye(P), y=y, gamma=1.0, eta=0.05, T=40,
                                N=N, E=4000, seed=seed, keep_samples=True)
        D = st.samples["Delta"]                                # (E, P, T)
        proj_y = np.einsum("m,emt->et", y, D)
        proj_p = np.einsum("m,emt->et", perp[:, 0], D)
        for proj, theory in ((proj_y, np.diag(Sy)), (proj_p, np.diag(Sp[0]))):
            nvar = N * proj.var(axis=0, ddof=1)
            c = proj - proj.mean(axis=0)
            se = N * np.sqrt(np.maximum(np.mean(c ** 4, axis=0) - proj.var(axis=0) ** 2, 0) / len(proj))
            z = np.abs(nvar - theory)[1:] / se[1:]
            # width-N ensembles carry O(1/N) corrections; at N = 512 they are below 4 standard errors here
            assert z.max() < 4, z.max()


def test_two_layer_with_linear_activation_uses_exact_moments(tmp_path):
    """The two_layer spec with phi(h) = linear(h) is proven Gaussian; exact and Monte Carlo agree."""
    spec = tmp_path / "two_layer_linear.dmft"
    spec.write_text((ROOT / "specs" / "two_layer.dmft").read_text()
                    .replace("activation phi(h) = tanh(h)", "activation phi(h) = linear(h)"))
    m = dmftc.load(spec, tmp_path / "gen")
    assert m.module.NONLINEAR is None
    params = dict(T=30, eta=0.05, gamma=1.0, kx=0.4)
    ex = m.solve(**params)
    assert ex.info["diagnostics"]["backend"] == "exact"
    mc = m.solve(backend="mc", samples=20000, seed=4, **params)
    for n in ex.names:
        z = np.abs(mc.var(n) - ex.var(n))[1:] / np.maximum(mc.stderr(n)[1:], 1e-300)
        assert z.max() < 4, (n, z.max())
        zm = np.abs(mc.mean(n) - ex.mean(n))[1:] / np.maximum(mc.stderr(n, "mean")[1:], 1e-300)
        assert zm.max() < 4, (n, zm.max())
