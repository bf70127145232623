"""Deep specs with another loss: the logistic loss, whose error signal Delta = y / (1 + exp(y f)) is a nonlinear
function of the network output f (specs/deep_logistic.dmft).  The propagator sees it through its slope at the
saddle, step by step (dmftc.runtime.problem.deep_model: DeepModel.linearised).  Checked against width-N networks trained by
gradient descent on the logistic loss (dmftc.validation.deep_ensemble with ``error_signal``), extrapolated in 1/N
from N and 2N, pointwise within 4 combined standard errors, with labels of both signs and rich training:

(1) linear networks (exact backend) on one point and on P = 3 points of a random Gram matrix;
(2) tanh networks (Monte Carlo propagator) on one point;
(3) the linearisation: its per-step tangent against finite differences of the spec's error signal, and a
    propagator whose slope is frozen at its initial value is far from the same networks (the comparison can fail);
(4) the O(1/N) mean correction, which would need the error signal's curvature, is refused with the reason; an
    error signal affine in the output with weights that differ between points takes the same linearised path,
    exactly, and gets the mean correction (checked against linear networks trained on the weighted loss).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import dmftc
from dmftc.errors import ParameterError
from dmftc.runtime.problem import deep_model
from dmftc.validation.deep_ensemble import deep_truth

SPECS = Path(__file__).resolve().parent.parent / "specs"
SQUARED = ("  + integral(hat Delta(t) (Delta(t) - y + (E[z[L](t) phi(h[L](t))] - E[z[L](0) phi(h[L](0))]) / gamma), t)")
LOGISTIC = ("  + integral(hat Delta(t) (Delta(t) - y / (1 + exp(y * (E[z[L](t) phi(h[L](t))] - E[z[L](0) phi(h[L](0))])"
            " / gamma))), t)")
NAMES = ("Delta", "K", "Phi[1]", "Phi[2]", "G[1]", "G[2]")


def logistic(f, y):
    """The logistic loss's error signal -d ln(1 + exp(-y f)) / df."""
    return y / (1 + np.exp(y * f))


def _one_point(tmp_path, activation):
    text = (SPECS / "deep_tanh.dmft").read_text()
    assert SQUARED in text
    text = text.replace(SQUARED, LOGISTIC).replace("activation phi(h) = tanh(h)", f"activation phi(h) = {activation}")
    path = tmp_path / "deep_logistic_one.dmft"
    path.write_text(text)
    return dmftc.load(str(path))


def _points(tmp_path, activation):
    text = (SPECS / "deep_logistic.dmft").read_text().replace("activation phi(h) = tanh(h)",
                                                                f"activation phi(h) = {activation}")
    path = tmp_path / "deep_logistic_points.dmft"
    path.write_text(text)
    return dmftc.load(str(path))


def _var_z(sol, truth, names=NAMES):
    """name -> max pointwise z of N Var (theory against the extrapolated networks); asserts that the ensemble
    resolves every curve to < 8% of its peak."""
    out = {}
    for n in names:
        th, th_se, en, se = sol.var(n), sol.var_stderr(n), truth.nvar[n], truth.se_nvar[n]
        assert th.shape == en.shape, n
        peak = np.abs(en).max()
        assert se.max() < 0.08 * peak, n
        out[n] = float((np.abs(th - en) / np.maximum(np.sqrt(se ** 2 + th_se ** 2), 1e-12 * peak)).max())
    return out


def test_linear_deep_network_with_logistic_loss_matches_networks(tmp_path, monkeypatch):
    """One point, y = -1.5, gamma = 1.5, eta = 0.2, T = 8 (the slope of the error signal changes by a factor ~2
    over the run): every N Var within 4 combined standard errors of linear networks (N = 64/128, E = 8000); with
    the slope frozen at t = 0 (the rest unchanged, so the saddle is still stationary) the same comparison fails."""
    kw = dict(L=2, T=8, eta=0.2, gamma=1.5, y=-1.5)
    m = _one_point(tmp_path, "h")
    sol = m.solve(**kw)
    assert sol.info["stationarity"] < 1e-12
    truth = deep_truth(activation="linear", N=64, E=8000, seed=5, error_signal=logistic, **kw)
    np.testing.assert_allclose(sol.mean("Delta")[0], 0.5 * kw["y"])            # Delta(0) = y / 2
    for n in ("Delta", "K"):
        z = np.abs(sol.mean(n) - truth.mean[n]) / np.maximum(truth.se_mean[n], 1e-12)
        assert z.max() <= 4.0, (n, z.max())
    z = _var_z(sol, truth)
    assert max(z.values()) <= 4.0, z

    true_linearised = deep_model.DeepModel.linearised

    def frozen(self, e):                          # the slope of F at t = 0 for every step, y0 kept stationary
        lin = true_linearised(self, e)
        e = np.asarray(e).reshape(-1, self.points)
        at0 = true_linearised(self, np.tile(e[:1], (e.shape[0], 1)).ravel())
        ct, c0 = at0.readout[1], at0.readout[2]
        y0 = lin.readout[0] + (lin.readout[1] - ct) * e.ravel() + (lin.readout[2] - c0) * np.tile(e[0], e.shape[0])
        values = tuple((k, (y0, ct, c0) if k == deep_model._LINEARISED else v) for k, v in lin.values)
        return dataclasses.replace(lin, readout=(y0, ct, c0), values=values)

    monkeypatch.setattr(deep_model.DeepModel, "linearised", frozen)
    wrong = _var_z(m.solve(**kw), truth)
    assert max(wrong.values()) > 10.0, wrong


def test_linear_deep_network_with_logistic_loss_on_points_matches_networks(tmp_path):
    """specs/deep_logistic.dmft with a linear activation on P = 3 points of a random Gram matrix, labels of both
    signs and sizes: N Var of Delta_mu, K_{mu nu} and the equal-time kernels of every pair within 4 combined
    standard errors of linear networks (N = 64/128, E = 8000)."""
    P = 3
    rng = np.random.default_rng(8)
    Z = rng.standard_normal((P, 8))
    Kx, y = Z @ Z.T / 8, np.array([-1.2, 1.7, 0.6])
    kw = dict(L=2, T=5, eta=0.2, gamma=1.0, y=y)
    sol = _points(tmp_path, "h").solve(P=P, Kx=Kx, **kw)
    assert sol.info["diagnostics"]["propagator"]["stationarity"] < 1e-12
    truth = deep_truth(activation="linear", N=64, E=8000, seed=9, Kx=Kx, error_signal=logistic, **kw)
    z = np.abs(sol.mean("Delta") - truth.mean["Delta"]) / np.maximum(truth.se_mean["Delta"], 1e-12)
    assert z.max() <= 4.0, z.max()
    z = _var_z(sol, truth)
    assert max(z.values()) <= 4.0, z


def test_tanh_deep_network_with_logistic_loss_matches_networks(tmp_path):
    """The Monte Carlo propagator of a tanh network with the logistic loss (one point, y = 1.5, gamma = 1.5,
    eta = 0.2, T = 6, 2048 paths): every N Var within 4 combined standard errors of tanh networks (N = 128/256,
    E = 6000)."""
    kw = dict(L=2, T=6, eta=0.2, gamma=1.5, y=1.5)
    sol = _one_point(tmp_path, "tanh(h)").solve(**kw, samples=16000, propagator_samples=2048, propagator_groups=8,
                                                 seed=2)
    truth = deep_truth(activation="tanh", N=128, E=6000, seed=21, error_signal=logistic, **kw)
    z = _var_z(sol, truth)
    assert max(z.values()) <= 4.0, z
    assert sol.info["propagator_stationarity"] < 1e-12


def test_linearised_error_signal_is_the_tangent_of_the_spec(tmp_path):
    """DeepModel.linearised: per step y0 + c_t e(t) + c_0 e(0) = F(e(t), e(0)) and c_t, c_0 are F's partial
    derivatives (central differences of the generated error signal), on P = 2 points with labels of both signs;
    the model before linearisation refuses to give its features."""
    m = _points(tmp_path, "h")
    from dmftc.runtime.engines.deep_points import resolve_point_params

    p = resolve_point_params(m.module, dict(P=2, Kx=np.eye(2), y=np.array([1.3, -0.7]), T=3))[0]
    model = deep_model.from_spec(m.module, p)
    with pytest.raises(RuntimeError, match="linearised"):
        model.features()
    e = np.array([0.1, -0.2, 0.5, 0.3, 0.9, 0.4])           # (time, point) steps, T = 3, P = 2
    lin = model.linearised(e)
    y0, ct, c0 = lin.readout
    E, E0 = e.reshape(3, 2), e.reshape(3, 2)[0]
    F = lambda a, b: np.asarray(m.module.readout(a, b, p))           # noqa: E731
    np.testing.assert_allclose(y0 + ct * e + c0 * np.tile(E0, 3), np.concatenate([F(a, E0) for a in E]),
                               rtol=1e-12)
    h = 1e-6
    d_t = np.concatenate([(F(a + h, E0) - F(a - h, E0)) / (2 * h) for a in E])
    d_0 = np.concatenate([(F(a, E0 + h) - F(a, E0 - h)) / (2 * h) for a in E])
    np.testing.assert_allclose(ct, d_t, rtol=1e-7)
    np.testing.assert_allclose(c0, d_0, rtol=1e-7)
    assert np.ptp(ct) > 0.05                      # the slope differs between steps: not an affine readout


def test_mean_correction_of_a_nonlinear_error_signal_is_refused(tmp_path):
    with pytest.raises(ParameterError, match="another loss"):
        _one_point(tmp_path, "h").solve(L=2, T=3, correction=True)


def test_derive_says_which_error_signal_the_propagator_linearises():
    from dmftc.derive.deep_blocks import format_deep_derivation
    from dmftc.derive import derive
    from dmftc.frontend.check import check
    from dmftc.frontend.parse import parse

    def text(name):
        path = SPECS / f"{name}.dmft"
        return format_deep_derivation(derive(check(parse(path.read_text(), str(path)))))

    assert "nonlinear in the averages" in text("deep_logistic")
    assert "nonlinear in the averages" not in text("deep_multi")


def test_mean_correction_of_a_per_point_weighted_squared_loss_matches_networks(tmp_path):
    """Loss 1/2 sum_mu w_mu (y_mu - f_mu)^2: the error signal w_mu (y_mu - f_mu) is affine in the output but its
    coefficients differ between points, so the runtime linearises it at the saddle (exact); the derivation says it
    is affine (READOUT_AFFINE), and the exact O(1/N) mean correction of the linear spec on P = 3 points of a random
    Gram matrix must match N (E[q]_N - q_inf) of linear networks trained on the weighted loss (deep_mean_shift, N =
    32/64 extrapolated, E = 8000/16000), pointwise z <= 4 for Delta, K, the equal-time kernels and the loss.  The
    correction of the unweighted loss is far from the same networks (the comparison can fail)."""
    from spec_texts import weighted_loss

    from dmftc.validation.deep_ensemble import deep_mean_shift

    text = weighted_loss((SPECS / "deep_multi.dmft").read_text().replace("activation phi(h) = tanh(h)",
                                                                        "activation phi(h) = h"))
    path = tmp_path / "deep_weighted.dmft"
    path.write_text(text)
    m = dmftc.load(str(path))
    assert m.module.READOUT_AFFINE
    P, L, T, eta, gamma = 3, 2, 6, 0.1, 1.0
    rng = np.random.default_rng(7)
    Z = rng.standard_normal((P, 8))
    Kx, y, w = Z @ Z.T / 8, rng.uniform(-1, 1, P), np.array([1.6, 0.4, 1.0])
    kw = dict(P=P, Kx=Kx, y=y, L=L, T=T, eta=eta, gamma=gamma, correction=True)
    sol = m.solve(w=w, **kw)
    plain = m.solve(**kw).mean_correction("Delta")
    same = lambda x: np.einsum("mntt->mnt", x) if x.ndim == 4 else x                      # noqa: E731
    names = ["Delta", "K"] + [f"{k}[{l}]" for k in ("Phi", "G") for l in range(1, L + 1)]
    ref = {n: same(sol.mean(n)) for n in names}
    theory = {n: same(sol.mean_correction(n)) for n in names}
    theory["loss"] = 2 * ref["Delta"] * theory["Delta"] + sol.var("Delta")
    net = dict(L=L, gamma=gamma, y=y, eta=eta, T=T, Kx=Kx, error_signal=lambda f, yy: w * (yy - f))
    a = deep_mean_shift(ref, N=32, E=8000, seed=70, **net)
    b = deep_mean_shift(ref, N=64, E=16000, seed=71, **net)
    for n in names + ["loss"]:
        ext, se = 2 * b.value[n] - a.value[n], np.sqrt(4 * b.se[n] ** 2 + a.se[n] ** 2)
        ok = se > 0                                       # exact entries (Phi[1] at t = 0 is a control variate)
        assert (np.abs(ext - theory[n])[ok] / se[ok]).max() <= 4.0, n
        if n == "Delta":
            assert (np.abs(ext - plain)[ok] / se[ok]).max() > 8
