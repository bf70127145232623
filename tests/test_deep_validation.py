"""Deep networks against real finite-width networks trained by gradient descent.

Theory: dmftc.deep.solve_deep (Monte Carlo saddle point for tanh, exact for linear nets).
Truth: dmftc.validation.deep_ensemble.deep_truth, width-N and 2N ensembles Richardson-extrapolated in 1/N.
Agreement is pointwise, z = |theory - ensemble| / sqrt(se_theory^2 + se_ensemble^2) <= 4, for the
time series Delta, K and every entry (t, s) of the two-time kernels Phi[l], G[l].
"""
import numpy as np
import pytest

from dmftc.deep import solve_deep
from dmftc.validation.deep_ensemble import deep_truth

Z = 4.0


def _z(theory, theory_se, ens, ens_se):
    d = np.abs(theory - ens)
    se = np.sqrt(theory_se ** 2 + ens_se ** 2)
    return np.where(d > 1e-12, d / np.maximum(se, 1e-300), 0.0)


def _compare_means(sol, truth, L):
    out = {}
    for n in ["Delta", "K"] + [f"{k}[{l}]" for k in ("Phi", "G") for l in range(1, L + 1)]:
        out[n] = float(_z(sol.mean(n), sol.mean_stderr(n), truth.mean[n], truth.se_mean[n]).max())
    return out


def test_deep_tanh_means_match_networks():
    kw = dict(activation="tanh", L=2, gamma=1.0, y=1.0, eta=0.05, T=24)
    sol = solve_deep(samples=16000, seed=3, **kw)
    truth = deep_truth(N=256, E=600, seed=21, **kw)
    z = _compare_means(sol, truth, 2)
    assert max(z.values()) <= Z, z


@pytest.mark.slow
def test_deep_tanh_means_within_two_percent():
    """Acceptance of the deep-network issue: tanh, L = 2, T = 40, means within 2% of the networks."""
    kw = dict(activation="tanh", L=2, gamma=1.0, y=1.0, eta=0.05, T=40)
    sol = solve_deep(samples=80000, seed=5, **kw)
    truth = deep_truth(N=512, E=2000, seed=41, **kw)
    for n in ["Delta", "K", "Phi[1]", "Phi[2]", "G[1]", "G[2]"]:
        th, ens = sol.mean(n), truth.mean[n]
        if th.ndim == 2:
            th, ens = np.diag(th), np.diag(ens)
        rel = np.abs(th - ens).max() / np.abs(ens).max()
        assert rel < 0.02, (n, rel)
    z = _compare_means(sol, truth, 2)
    assert max(z.values()) <= Z, z


# ------------------------------------------------------------------ a spec the built-in network does not cover
def _input_norm_spec(tmp_path, base="deep_tanh"):
    """specs/<base>.dmft with an input kernel Phi[0] = kx = |x|^2 / D as a parameter: the propagator reads
    the boundary from the spec's action (dmftc.runtime.problem.deep_model.from_spec); no built-in network has it."""
    from pathlib import Path

    import dmftc

    text = (Path(__file__).resolve().parents[1] / "specs" / f"{base}.dmft").read_text()
    for old, new in (('param y = 1.0 "training target"', 'param y = 1.0 "training target"\nparam kx = 0.5 "|x|^2 / D"'),
                     ("Phi[0](t, s) = 1;", "Phi[0](t, s) = kx;")):
        assert old in text
        text = text.replace(old, new)
    spec = tmp_path / f"{base}_kx.dmft"
    spec.write_text(text)
    return dmftc.load(spec, tmp_path / f"gen_{base}")


KX = dict(L=2, gamma=1.5, y=-0.8, eta=0.3, kx=0.5)


def test_input_norm_spec_initial_covariances_match_quadrature(tmp_path):
    """At t = 0 with input kernel kx: h^1 ~ N(0, kx), h^2 | layer 1 ~ N(0, Phi1), so N Var Phi[1](0,0) =
    Var_kx(tanh^2) and N Var Phi[2](0,0) = Var_P1(tanh^2) + (dE_v tanh^2 / dv)^2 V1 (law of total covariance,
    Gaussian quadrature).  The spec's propagator must give these within 4 se; the standard network's values
    (kx = 1) are many se away, so the test sees whether the boundary came from the spec."""
    import math

    sol = _input_norm_spec(tmp_path).solve(T=2, samples=2000, propagator_samples=16000, propagator_groups=16,
                                            seed=4, **KX)
    x, wq = np.polynomial.hermite_e.hermegauss(160)
    wq = wq / wq.sum()
    E = lambda fn, v: float(np.sum(wq * fn(math.sqrt(v) * x)))                       # noqa: E731
    dE = lambda fn, v, e=1e-5: (E(fn, v + e) - E(fn, v - e)) / (2 * e)               # noqa: E731
    t2 = lambda h: np.tanh(h) ** 2                                                    # noqa: E731

    def exact(kx):
        P1 = E(t2, kx)
        V1 = E(lambda h: t2(h) ** 2, kx) - P1 ** 2
        return {"Phi[1]": V1, "Phi[2]": E(lambda h: t2(h) ** 2, P1) - E(t2, P1) ** 2 + dE(t2, P1) ** 2 * V1}

    assert sol.var("Delta")[0] == 0.0                                  # Delta(0) = y exactly
    assert sol.info["propagator_stationarity"] < 1e-12               # (set once the propagator has run)
    for n, val in exact(KX["kx"]).items():
        m, se = sol.var(n)[0], sol.var_stderr(n)[0]
        assert abs(m - val) <= Z * se and se < 0.05 * val, (n, m, val, se)
        assert abs(m - exact(1.0)[n]) > 10 * se, n


@pytest.mark.slow
def test_input_norm_spec_propagator_matches_networks(tmp_path):
    """The same spec against networks trained with |x|^2 / D = kx (deep_ensemble input_norm; N = 256 and 512
    extrapolated, 8000 members each): N Var of Delta, K, Phi[l](t,t), G[l](t,t) within 4 combined se at
    T = 3.  (~2 minutes.)"""
    kw = dict(KX)
    sol = _input_norm_spec(tmp_path).solve(T=3, samples=4000, propagator_samples=16000, propagator_groups=16,
                                            seed=4, **kw)
    kx = kw.pop("kx")
    truth = deep_truth(activation="tanh", T=3, N=256, E=8000, seed=11, input_norm=kx, **kw)
    worst = {}
    for n in ["Delta", "K", "Phi[1]", "Phi[2]", "G[1]", "G[2]"]:
        worst[n] = float(_z(sol.var(n), sol.var_stderr(n), truth.nvar[n], truth.se_nvar[n]).max())
    print("input-norm spec vs networks, max z:", {k: round(v, 2) for k, v in worst.items()})
    assert max(worst.values()) <= Z, worst


def test_linear_input_norm_spec_exact_propagator(tmp_path):
    """The deep LINEAR spec with input kernel kx gets the exact propagator of its own action: at t = 0,
    h^1 ~ N(0, kx) and h^2 | layer 1 ~ N(0, Phi[1]), so N Var Phi[l](0, 0) = 2 l kx^2 (the standard network's
    2 l is far off at kx = 0.5); the mean correction is available too."""
    kx = KX["kx"]
    sol = _input_norm_spec(tmp_path, "deep_linear").solve(T=4, correction=True, **KX)
    for l in (1, 2):
        assert sol.var(f"Phi[{l}]")[0] == pytest.approx(2 * l * kx ** 2, rel=1e-12), l
        assert sol.mean(f"Phi[{l}]")[0, 0] == pytest.approx(kx, rel=1e-12)
    assert sol.var("Delta")[0] == 0.0 and np.all(np.isfinite(sol.mean_correction("K")))


@pytest.mark.slow
def test_linear_input_norm_spec_propagator_matches_networks(tmp_path):
    """The same linear spec against linear networks trained with |x|^2 / D = kx (N = 256 and 512 extrapolated,
    8000 members each): N Var of Delta, K, Phi[l](t,t), G[l](t,t) within 4 se at T = 6 (theory exact), eta = 0.1
    (measured: max z 1.22).  At eta = 0.3 this linear net has converged by t = 4 (Delta ~ 1e-3, below its own
    fluctuation at N = 256) and the leading order misses N Var Delta(4) by z = 9 at N = 256/512, while at
    N = 1024/2048 every z <= 1.81: the expansion, not the propagator, breaks down there.  (~1 min.)"""
    kw = dict(KX, eta=0.1)
    sol = _input_norm_spec(tmp_path, "deep_linear").solve(T=6, **kw)
    kx = kw.pop("kx")
    truth = deep_truth(activation="linear", T=6, N=256, E=8000, seed=13, input_norm=kx, **kw)
    worst = {}
    for n in ["Delta", "K", "Phi[1]", "Phi[2]", "G[1]", "G[2]"]:
        worst[n] = float(_z(sol.var(n), 0.0, truth.nvar[n], truth.se_nvar[n]).max())
    print("linear input-norm spec vs networks, max z:", {k: round(v, 2) for k, v in worst.items()})
    assert max(worst.values()) <= Z, worst


@pytest.mark.slow
@pytest.mark.parametrize("act, gamma, y", [("sigmoid(2 * h)", 0.6, -0.9), ("h + 0.5 * sin(2 * h)", 1.8, 0.6)])
def test_untuned_activations_and_parameters_match_networks(tmp_path, act, gamma, y):
    """Cases no other test or figure uses, fixed before their first run: a non-odd activation with a negative target
    in weak feature learning, and a non-monotone-derivative one in rich training, as specs (deep_tanh.dmft with
    its activation line replaced), L = 2, T = 10, eta = 0.1.  Means and N Var of Delta, K, Phi[l](t,t), G[l](t,t)
    within 4 combined standard errors pointwise of networks (N = 128 and 256, E = 40000 each, extrapolated), with
    the power to see a 4% error (combined standard error of N Var at most 4% of each curve's peak).  Measured:
    N Var within 1.0-4.0% of the peak, z <= 2.3 (sigmoid, 16384 paths) and 0.8-8.5%, z <= 3.6 (sine, where the
    theory's own standard error reached 2.7% of Phi[1]'s peak; hence 65536 paths here)."""
    from pathlib import Path

    import dmftc

    root = Path(__file__).resolve().parent.parent
    spec = tmp_path / "deep_x.dmft"
    spec.write_text((root / "specs" / "deep_tanh.dmft").read_text().replace(
        "activation phi(h) = tanh(h)", f"activation phi(h) = {act}"))
    kw = dict(L=2, T=10, eta=0.1, gamma=gamma, y=y)
    sol = dmftc.load(spec, tmp_path / "gen").solve(samples=64000, groups=8, propagator_samples=65536,
                                                   propagator_groups=8, seed=1, **kw)
    truth = deep_truth(activation=act, N=128, E=40000, seed=7, **kw)
    diag = lambda a: a if a.ndim == 1 else np.diagonal(a)  # noqa: E731
    for n in ["Delta", "K", "Phi[1]", "Phi[2]", "G[1]", "G[2]"]:
        zm = _z(diag(sol.mean(n)), diag(sol.mean_stderr(n)), diag(truth.mean[n]), diag(truth.se_mean[n]))
        assert zm.max() <= Z, (n, "mean", zm.max())
        th, th_se, ens, ens_se = sol.var(n), sol.var_stderr(n), diag(truth.nvar[n]), diag(truth.se_nvar[n])
        z = _z(th, th_se, ens, ens_se)
        assert z.max() <= Z, (n, "N Var", z.max())
        peak = np.abs(ens).max()
        assert np.hypot(th_se, ens_se).max() <= 0.04 * peak, (n, "no power", np.hypot(th_se, ens_se).max() / peak)
    assert sol.info["propagator_stationarity"] < 1e-10
