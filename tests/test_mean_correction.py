"""The O(1/N) correction to the mean (dmftc.runtime.mean_correction) against finite-width networks.

The two-layer tanh spec at several gamma is compared with networks by ``experiments/mean_correction.py --quick``
(in tests/test_experiments.py).  Ground truth: ``mean_shift_truth`` trains width-N networks and compares each batch of members with the spec's
saddle-point march on exactly those members' neurons (common random numbers), which removes the members'
first-order fluctuation and leaves N (E[q]_N - q_inf) with second-order noise only.  Tolerances are pointwise
z-scores from the two standard errors (ensemble batches, theory sample groups).
"""
from pathlib import Path

import numpy as np
import pytest

import dmftc
from dmftc.errors import ParameterError
from dmftc.validation.truth import mean_shift_truth

ROOT = Path(__file__).resolve().parent.parent
Z = 4.0

# the first-order (continuous-time) form of the error update: Delta(t) = y - eta sum_{s<t} K(s) Delta(s), a
# deterministic constraint whose second derivative enters m1 (the shipped specs use the exact readout instead)
FIRST_ORDER = """\
model first_order "two-layer tanh net, one point, error update to first order in the step"
param gamma = 1.0 "feature learning strength"
param y = 1.0 "target"
time t: T = 30 steps of eta = 0.05
activation phi(h) = tanh(h)
order Delta(t), K(t)
process:
  u ~ normal(0, 1);   r ~ normal(0, 1)
  h(t) = u + gamma * integral(Delta(s) * g(s), s < t)
  z(t) = r + gamma * integral(Delta(s) * phi(h(s)), s < t)
  g(t) = phi'(h(t)) * z(t)
action:
    integral(hat K(t) K(t) + hat Delta(t) (Delta(t) - y + integral(K(s) Delta(s), s < t)), t)
  + log E[exp(-integral(hat K(t) (phi(h(t))^2 + g(t)^2), t))]
"""


def _z(a, sa, b, sb):
    """Pointwise z; agreement to round-off where both errors vanish (t = 0) counts as z = 0."""
    d = np.abs(a - b)
    exact = d <= 1e-9 * max(np.abs(a).max(), np.abs(b).max(), 1e-300)
    return np.where(exact, 0.0, d / np.maximum(np.sqrt(sa ** 2 + sb ** 2), 1e-300))


def test_linear_whitened_exact_backend_richardson():
    """Linear net on P = 4 whitened points (exact backend for q and U, sampled paths for m1): the ensemble
    shift extrapolated from N = 32 and 64 (N^-2 terms are visible at P / N = 1/8)."""
    m = dmftc.load(ROOT / "specs" / "linear_whitened.dmft")
    params = dict(P=4, T=40, eta=0.05, gamma=1.0)
    sol = m.solve(samples=16000, correction=True, **params)
    assert sol.info["diagnostics"]["backend"] == "exact"
    a = mean_shift_truth(m, params, N=32, E=4000, batches=10, seed=3)
    b = mean_shift_truth(m, params, N=64, E=4000, batches=10, seed=4)
    for name in ("Delta", "loss"):
        rich, se = 2 * b.value[name] - a.value[name], np.hypot(2 * b.se[name], a.se[name])
        if name == "Delta":
            theory, tse = sol.mean_correction(name), sol.mean_correction(name, stderr=True)
        else:
            d = sol.mean("Delta")
            theory = (2 * d * sol.mean_correction("Delta") + sol.var("Delta")).sum(axis=0)
            tse = np.sqrt(((2 * d * sol.mean_correction("Delta", stderr=True)) ** 2).sum(axis=0))
        assert _z(rich, se, theory, tse).max() <= Z, name


def test_constraint_second_derivative_identity(tmp_path):
    """For Delta(t) = y - eta sum_{s<t} K(s) Delta(s), taking the mean of the finite-width update gives
    m1_D(t) = -eta sum_{s<t} [K m1_D + Delta m1_K + Sigma_KD](s) (paper App. "Correction to Mean Predictions",
    discrete time).  With one sample group the computed m1 obeys it to round-off: a check of the C'' term."""
    spec = tmp_path / "first_order.dmft"
    spec.write_text(FIRST_ORDER)
    sol = dmftc.load(spec, out_dir=tmp_path).solve(samples=6000, groups=1, correction=True)
    eta = sol.params["eta"]
    K, D, mK, mD = sol.mean("K"), sol.mean("Delta"), sol.mean_correction("K"), sol.mean_correction("Delta")
    skd = np.diag(sol.sigma("K", "Delta")) * 5999 / 6000      # Sigma = U^-1 kappa U^-T with kappa's ddof = 1
    want = -eta * np.concatenate([[0.0], np.cumsum(K * mD + D * mK + skd)[:-1]])
    assert np.allclose(mD, want, rtol=1e-6, atol=1e-9 * np.abs(mD).max())
    assert np.abs(mD).max() > 1e-3                          # not trivially zero


def test_first_step_is_unbiased():
    """At t = 0 the order parameters are plain neuron averages of iid neurons: no O(1/N) shift."""
    m = dmftc.load(ROOT / "specs" / "two_layer.dmft")
    sol = m.solve(samples=4000, correction=True, T=5)
    for name in sol.names:
        assert np.abs(sol.mean_correction(name)[..., 0]).max() < 1e-12


def test_api_and_persistence(tmp_path):
    m = dmftc.load(ROOT / "specs" / "two_layer.dmft")
    plain = m.solve(samples=2000, T=6)
    with pytest.raises(ParameterError, match="correction=True"):
        plain.mean_correction("K")
    sol = m.solve(samples=2000, T=6, correction=True)
    assert sol.mean_correction("K").shape == sol.mean("K").shape
    assert np.allclose(sol.mean_at_width("K", 50), sol.mean("K") + sol.mean_correction("K") / 50)
    d = sol.mean("Delta")
    assert np.allclose(sol.expected_loss(50), d ** 2 + (2 * d * sol.mean_correction("Delta") + sol.var("Delta")) / 50)
    assert sol.expected_loss(50, stderr=True).shape == (6,)
    with pytest.raises(ParameterError):
        sol.mean_at_width("K", 0)
    back = dmftc.Solution.load(sol.save(tmp_path / "r.npz"))
    assert np.array_equal(back.mean_correction("K"), sol.mean_correction("K"))
    with pytest.raises(ParameterError, match="linear activations"):     # deep nonlinear: not built, says why
        dmftc.load(ROOT / "specs" / "deep_tanh.dmft").solve(T=4, samples=200, correction=True)


def test_lazy_limit_closed_form():
    """gamma -> 0: the width-N net is a linear model with its random initial NTK K_N = K + eps,
    Delta(t) = y (1 - eta K_N)^t, so E[Delta]_N = Delta_inf + y t (t - 1) eta^2 (1 - eta K)^(t - 2) kappa / (2N)
    with kappa = N Var K_N(0) (paper App. "Mean Prediction Error Correction in the Lazy Limit", discrete time),
    and the mean kernel is unbiased (m1_K = O(gamma))."""
    m = dmftc.load(ROOT / "specs" / "two_layer.dmft")
    sol = m.solve(samples=32000, correction=True, gamma=0.002, T=30, eta=0.05)
    eta, y = sol.params["eta"], sol.params["y"]
    K, kappa = sol.mean("K")[0], sol.var("K")[0]
    t = np.arange(30)
    closed = y * t * (t - 1) * eta ** 2 * (1 - eta * K) ** np.clip(t - 2, 0, None) * kappa / 2
    m1, se = sol.mean_correction("Delta"), sol.mean_correction("Delta", stderr=True)
    assert np.abs(closed).max() > 20 * se.max()                       # resolved: the comparison can fail
    assert _z(m1, se, closed, np.abs(closed) * sol.stderr("K")[0] / kappa).max() <= Z
    assert np.abs(sol.mean_correction("K")).max() < 0.05 * np.abs(closed).max()


def test_multi_point_tanh_loss_at_width(tmp_path):
    """two_layer_multi with tanh, P = 4 random points (Gram matrix of Gaussian vectors in D = 8, targets of both
    signs), rich training: the O(1/N) shifts of the errors, the kernel and the loss against width-64/128
    networks, extrapolated in 1/N."""
    text = (ROOT / "specs" / "two_layer_multi.dmft").read_text()
    spec = tmp_path / "multi_tanh.dmft"
    spec.write_text(text.replace("activation phi(h) = sqrt(2) * max(0, h)", "activation phi(h) = tanh(h)")
                    .replace("model two_layer_multi ", "model multi_tanh "))
    m = dmftc.load(spec, out_dir=tmp_path)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 8))
    y = rng.standard_normal(4) * np.array([1, -1, 1, -1])     # random targets, two of each sign
    y[:2] = np.abs(y[:2]) * np.array([1, -1])
    params = dict(P=4, Kx=x @ x.T / 8, y=y, gamma=1.0, T=30, eta=0.05)
    sol = m.solve(samples=24000, correction=True, **params)
    a, b = (mean_shift_truth(m, params, N=N, E=3000, batches=10, seed=N, network="two_layer_multi",
                             activation="tanh") for N in (64, 128))
    d = sol.mean("Delta")
    theory = {"Delta": (sol.mean_correction("Delta"), sol.mean_correction("Delta", stderr=True)),
              "K": (sol.mean_correction("K"), sol.mean_correction("K", stderr=True)),
              "loss": ((2 * d * sol.mean_correction("Delta") + sol.var("Delta")).sum(axis=0),
                       np.sqrt(((2 * d * sol.mean_correction("Delta", stderr=True)) ** 2
                                + sol.stderr("Delta") ** 2).sum(axis=0)))}
    for name, (m1, se) in theory.items():
        rich, rse = 2 * b.value[name] - a.value[name], np.hypot(2 * b.se[name], a.se[name])
        assert _z(rich, rse, m1, se).max() <= Z, name


def test_summary_says_the_exact_backend_samples_the_mean_correction():
    """On the exact backend the saddle, U and kappa are exact but m1's pathwise terms are a Monte Carlo average:
    the summary says so (and says nothing of it without correction=True)."""
    m = dmftc.load(ROOT / "specs" / "linear_whitened.dmft")
    sol = m.solve(P=2, T=5, correction=True, samples=2000)
    assert sol.info["diagnostics"]["backend"] == "exact"
    assert np.max(sol.mean_correction("Delta", stderr=True)) > 0
    assert "mean correction: Monte Carlo over 2000 sampled paths in 8 groups" in sol.summary()
    assert "mean correction" not in m.solve(P=2, T=5).summary()
