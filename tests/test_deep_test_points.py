"""Deep networks read out on test points (specs/deep_multi.dmft with its update mask m[mu] = 0 on a test point).

A test point is folded into time like a training point, but no update reads its error signal (the mask multiplies
its couplings at s, dmftc.frontend.points_deep); its Delta[mu] = y[mu] - f[mu] is the test error, and K, Phi, G
pair it with the training points.  Checked against:

(1) deep networks trained by gradient descent on the training points only, read out on the test point
    (dmftc.validation.deep_ensemble with ``trained``, itself checked against jax-trained GD in
    tests/test_deep_ensemble.py), N and 2N extrapolated: means and N Var of every point and pair, pointwise within
    4 combined standard errors, for a linear (exact) and a tanh (Monte Carlo) network; the theory that trains on
    every point is far from the same networks (the comparison can fail);
(2) an independent route to the same limit: the per-point weighted loss with a vanishing weight on the test point
    (the error signal w (y - f), linearised per point), whose Var(Delta) / w^2 must approach the masked result
    as O(w);
(3) the O(1/N) mean correction of the test error of linear networks (deep_mean_shift with ``trained``);
(4) a ParameterError for mask values other than 0, 1 (a misused mask is a located error: tests/test_deep_points.py).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import dmftc
from dmftc.derive import derive
from dmftc.errors import ParameterError
from dmftc.frontend.check import check
from dmftc.frontend.parse import parse
from dmftc.validation.deep_ensemble import deep_mean_shift, deep_truth
from spec_texts import weighted_loss   # tests/spec_texts.py: the weighted-loss edit of deep_multi

SPECS = Path(__file__).resolve().parent.parent / "specs"
MULTI = (SPECS / "deep_multi.dmft").read_text()
LINEAR = MULTI.replace("activation phi(h) = tanh(h)", "activation phi(h) = h")
NAMES = ["Delta", "K", "Phi[1]", "Phi[2]", "G[1]", "G[2]"]
P, L, T, ETA, GAMMA = 3, 2, 6, 0.1, 1.0
MASK = np.array([1.0, 0.0, 1.0])        # the test point in the middle: the fold's order (time, point) matters


def _load(tmp_path, text, name):
    p = tmp_path / f"{name}.dmft"
    p.write_text(text)
    return dmftc.load(str(p))


def _case(seed):
    rng = np.random.default_rng(seed)
    Z = rng.standard_normal((P, 8))
    return Z @ Z.T / 8, np.array([0.9, -0.7, 0.5]) * rng.choice([-1.0, 1.0])     # targets of both signs


def _same(x):
    return np.einsum("mntt->mnt", x) if x.ndim == 4 else x


def _assert_matches(sol, truth, z_max=4.0):
    for n in NAMES:
        th, th_se, en, en_se = _same(sol.mean(n)), _same(sol.mean_stderr(n)), _same(truth.mean[n]), \
            _same(truth.se_mean[n])
        peak = np.abs(en).max()
        z = np.abs(th - en) / np.maximum(np.sqrt(th_se ** 2 + en_se ** 2), 1e-12 * peak)
        assert z.max() <= z_max, ("mean", n, z.max())
        v, v_se, nv, nv_se = sol.var(n), sol.var_stderr(n), truth.nvar[n], truth.se_nvar[n]
        peak = np.abs(nv).max()
        z = np.abs(v - nv) / np.maximum(np.sqrt(v_se ** 2 + nv_se ** 2), 1e-12 * peak)
        assert z.max() <= z_max, ("N Var", n, z.max())


def test_linear_test_point_matches_networks(tmp_path):
    Kx, y = _case(3)
    m = _load(tmp_path, LINEAR, "deep_multi_linear")
    kw = dict(P=P, Kx=Kx, y=y, L=L, T=T, eta=ETA, gamma=GAMMA)
    sol = m.solve(m=MASK, **kw)
    assert sol.info["diagnostics"]["propagator"]["stationarity"] < 1e-12
    truth = deep_truth(activation="linear", L=L, gamma=GAMMA, y=y, eta=ETA, T=T, N=128, E=6000, Kx=Kx, seed=21,
                       trained=MASK)
    _assert_matches(sol, truth)
    # the theory of the network that trains on every point is far from these networks
    every = m.solve(**kw)
    # the solution names its test points (positions along the point axes), and says so in its summary
    assert sol.info["test_points"] == (1,) and sol.info["trained_points"] == (0, 2)
    assert "test points (not trained on; 0-based along the point axes): 1" in sol.summary()
    assert every.info["test_points"] == () and "test points" not in every.summary()
    z = np.abs(every.var("Delta")[1] - truth.nvar["Delta"][1])[1:] / truth.se_nvar["Delta"][1][1:]
    assert z.max() > 8


def test_tanh_test_point_matches_networks(tmp_path):
    """Monte Carlo propagator (1024 paths in 8 groups, the features' covariance from 16 times as many: its
    standard errors are at most 3.5% of each N Var curve's peak, measured), N = 128/256, E = 4000; the ensembles
    resolve each N Var curve to < 8% of its peak."""
    Kx, y = _case(5)
    sol = _load(tmp_path, MULTI, "deep_multi").solve(P=P, Kx=Kx, y=y, m=MASK, L=L, T=5, eta=ETA, gamma=GAMMA,
                                                   samples=8000, propagator_samples=1024, seed=5)
    truth = deep_truth(activation="tanh", L=L, gamma=GAMMA, y=y, eta=ETA, T=5, N=128, E=4000, Kx=Kx, seed=55,
                       trained=MASK)
    for n in NAMES:
        assert truth.se_nvar[n].max() < 0.08 * np.abs(truth.nvar[n]).max(), n
    _assert_matches(sol, truth)


def test_mask_is_the_limit_of_a_vanishing_loss_weight(tmp_path):
    """The weighted loss 1/2 sum_mu w_mu (y_mu - f_mu)^2 trains on the test point with weight w_1 -> 0: its error
    signal is w_1 (y_1 - f_1), so Var(Delta_1) / w_1^2 and Delta_1 / w_1 must approach the masked test error's
    N Var and mean as O(w_1).  Both exact (linear), through different parts of the engine (the update mask in
    the couplings; a per-point readout linearised at the saddle)."""
    Kx, y = _case(8)
    kw = dict(P=P, Kx=Kx, y=y, L=L, T=T, eta=ETA, gamma=GAMMA)
    masked = _load(tmp_path, LINEAR, "deep_multi_linear").solve(m=MASK, **kw)
    wm = _load(tmp_path, weighted_loss(LINEAR), "deep_weighted")
    gaps = []
    for eps in (1e-2, 1e-3):
        sol = wm.solve(w=np.array([1.0, eps, 1.0]), **kw)
        var, mean = sol.var("Delta")[1] / eps ** 2, sol.mean("Delta")[1] / eps
        ref, ref_mean = masked.var("Delta")[1], masked.mean("Delta")[1]
        gaps.append((np.abs(var - ref).max() / ref.max(), np.abs(mean - ref_mean).max() / np.abs(ref_mean).max()))
        # the training points and the kernels see the test point through O(eps) only
        assert np.abs(sol.var("K") - masked.var("K")).max() < 20 * eps * np.abs(masked.var("K")).max()
    (v2, m2), (v3, m3) = gaps
    assert v3 < 0.02 and m3 < 0.02
    assert 5 < v2 / v3 < 20 and 5 < m2 / max(m3, 1e-300) < 20        # O(eps): tenfold smaller at a tenfold eps


def test_mean_correction_of_the_test_error_matches_networks(tmp_path):
    """The exact O(1/N) mean correction of linear networks with a test point against N (E[q]_N - q_inf) of networks
    trained on the training points only (N = 32/64 extrapolated, E = 8000/16000), pointwise z <= 4, the test
    point's error and loss included."""
    Kx, y = _case(11)
    sol = _load(tmp_path, LINEAR, "deep_multi_linear").solve(P=P, Kx=Kx, y=y, m=MASK, L=L, T=T, eta=ETA,
                                                           gamma=GAMMA, correction=True)
    ref = {n: _same(sol.mean(n)) for n in NAMES}
    theory = {n: _same(sol.mean_correction(n)) for n in NAMES}
    theory["loss"] = 2 * ref["Delta"] * theory["Delta"] + sol.var("Delta")
    kw = dict(L=L, gamma=GAMMA, y=y, eta=ETA, T=T, Kx=Kx, trained=MASK)
    a = deep_mean_shift(ref, N=32, E=8000, seed=90, **kw)
    b = deep_mean_shift(ref, N=64, E=16000, seed=91, **kw)
    for n in NAMES + ["loss"]:
        ext, se = 2 * b.value[n] - a.value[n], np.sqrt(4 * b.se[n] ** 2 + a.se[n] ** 2)
        ok = se > 0
        assert (np.abs(ext - theory[n])[ok] / se[ok]).max() <= 4.0, n
    ok = a.se["Delta"][1] > 0
    assert (np.abs(a.value["Delta"][1])[ok] / a.se["Delta"][1][ok]).max() > 5    # the test error does shift


def test_mask_values_other_than_0_and_1_are_refused(tmp_path):
    m = _load(tmp_path, LINEAR, "deep_multi_linear")
    with pytest.raises(ParameterError, match="update mask"):
        m.solve(P=P, m=np.array([1.0, 0.5, 1.0]), T=3)


def test_derive_and_the_ir_name_the_mask():
    from dmftc.derive.deep_blocks import format_deep_derivation
    from dmftc.ir import lower
    from dmftc.ir.text import format_ir

    checked = check(parse(MULTI, "specs/deep_multi.dmft"))
    assert checked.points.mask == "m"
    assert "update mask m[mu]: every coupling at s below is multiplied by m" in format_deep_derivation(derive(checked))
    assert "update mask m: each coupling at s is multiplied by m of the point of s" in format_ir(lower(checked))
    plain = MULTI.replace("m[nu] Delta[nu](s)", "Delta[nu](s)")
    assert check(parse(plain, "specs/deep_multi.dmft")).points.mask is None
