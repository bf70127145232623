"""dmftc.reference.two_layer_sgd: the hand-derived infinite-width two-layer dynamics under SGD with momentum,
weight decay and a schedule, against networks trained by optax (widths N and 2N extrapolated in 1/N) and, for
plain gradient descent, against specs/two_layer.dmft.  Tolerance: z <= 4 pointwise on the ensembles' standard
errors (the reference's quadrature error is far below them)."""
from pathlib import Path

import numpy as np
import pytest

import dmftc
from dmftc.reference.two_layer_sgd import two_layer_sgd_mean
from dmftc.validation.optax_nets import optax_truth

optax = pytest.importorskip("optax")

ROOT = Path(__file__).resolve().parents[1]
T = 12


def _schedule():
    s = optax.warmup_cosine_decay_schedule(init_value=0.2, peak_value=1.0, warmup_steps=3, decay_steps=T,
                                           end_value=0.1)
    return np.array([float(s(t)) for t in range(T)])


def _z(value, se, ref):
    return (value - ref) / np.maximum(se, 1e-12)


def test_quadrature_agrees_with_monte_carlo():
    kw = dict(gamma=1.5, y=-0.8, eta=0.2, T=T, beta=0.9, lam=0.2, lr=_schedule())
    q = two_layer_sgd_mean(**kw)
    q2 = two_layer_sgd_mean(nodes=192, **kw)
    assert np.max(np.abs(q.K - q2.K)) < 1e-4 and np.max(np.abs(q.Delta - q2.Delta)) < 1e-4
    mc = two_layer_sgd_mean(samples=200_000, seed=3, **kw)
    assert np.max(np.abs(_z(mc.Delta, mc.Delta_se, q.Delta))[1:]) < 4
    assert np.max(np.abs(_z(mc.K, mc.K_se, q.K))) < 4


@pytest.mark.parametrize("gamma, y, beta, lam, eta", [(0.5, 1.2, 0.5, 0.3, 0.5), (1.5, -0.8, 0.9, 0.2, 0.2)])
def test_reference_matches_optax_networks(gamma, y, beta, lam, eta):
    lr = _schedule()
    ref = two_layer_sgd_mean(gamma=gamma, y=y, eta=eta, T=T, beta=beta, lam=lam, lr=lr)
    tr = optax_truth(gamma=gamma, y=y, eta=eta, T=T, N=64, E=4000, beta=beta, lam=lam, lr=lr)
    zs = {q: _z(tr.mean[q], tr.mean_se[q], getattr(ref, q)) for q in ("Delta", "K")}
    assert max(np.max(np.abs(z)) for z in zs.values()) <= 4, zs
    # the comparison has power: the reference without momentum or with the decay not scaled by 1/gamma fails
    for wrong in (dict(beta=0.0, lam=lam), dict(beta=beta, lam=lam * gamma)):
        bad = two_layer_sgd_mean(gamma=gamma, y=y, eta=eta, T=T, lr=lr, **wrong)
        assert max(np.max(np.abs(_z(tr.mean[q], tr.mean_se[q], getattr(bad, q)))) for q in ("Delta", "K")) > 4


def test_plain_gradient_descent_is_the_two_layer_spec():
    gamma, y, eta, T_ = 1.3, -0.7, 0.4, 10
    sol = dmftc.load(ROOT / "specs" / "two_layer.dmft").solve(T=T_, eta=eta, gamma=gamma, y=y, samples=2000)
    ref = two_layer_sgd_mean(gamma=gamma, y=y, eta=eta, T=T_)
    for q in ("Delta", "K"):
        z = _z(sol.mean(q), sol.mean_stderr(q), getattr(ref, q))
        assert np.max(np.abs(z)) <= 4, (q, z)
