"""specs/two_layer_sgd.dmft against networks trained by optax (widths N and 2N extrapolated in 1/N), at two settings
chosen before looking at the results: a warm-up + cosine schedule from optax.schedules ending at 0.1, momentum
0.5 and 0.9 with weight decay, rich training, targets of both signs.  Means within 1% of their peak; N Var within
z <= 4 pointwise (both standard errors) and within 5% of its peak."""
from pathlib import Path

import numpy as np
import pytest

import dmftc
from dmftc.validation.optax_nets import optax_truth

optax = pytest.importorskip("optax")

ROOT = Path(__file__).resolve().parents[1]
T = 12


def _schedule():
    s = optax.schedules.warmup_cosine_decay_schedule(init_value=0.0, peak_value=1.0, warmup_steps=3,
                                                     decay_steps=T, end_value=0.1)
    return np.array([float(s(t)) for t in range(T)])


@pytest.mark.parametrize("setting", [dict(gamma=1.2, y=-1.0, beta=0.5, lam=0.1, eta=0.3),
                                     dict(gamma=2.0, y=0.8, beta=0.9, lam=0.3, eta=0.15)], ids=["beta0.5", "beta0.9"])
def test_against_optax_networks(setting):
    lr = _schedule()
    tr = optax_truth(T=T, N=64, E=100_000, lr=lr, **setting)
    sol = dmftc.load(ROOT / "specs" / "two_layer_sgd.dmft").solve(T=T, lr=lr, backend="mc", samples=100_000, seed=1,
                                                                 progress=False, **setting)
    for q in ("Delta", "K"):
        peak = np.max(np.abs(sol.mean(q)))
        assert np.max(np.abs(sol.mean(q) - tr.mean[q])) <= 0.01 * peak, q
        v, pv = sol.var(q), np.max(sol.var(q))
        se = np.sqrt(tr.nvar_se[q] ** 2 + sol.var_stderr(q) ** 2)
        assert np.max(np.abs(v - tr.nvar[q]) / np.maximum(se, 1e-12 * pv)) <= 4, q
        assert np.max(np.abs(v - tr.nvar[q])) <= 0.05 * pv, q
