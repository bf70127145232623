"""The two-layer engine and the deep engine on the model they share: a deep network with L = 1 hidden layer
trained on one point IS the two-layer network (deep: u ~ GP(0, Phi[0] = 1) is constant in time and
h(t) = u + eta gamma sum_{s<t} Delta(s) g(s), z(t) = r + eta gamma sum_{s<t} Delta(s) phi(h(s)) because
Phi[0] = G[2] = 1 and the boundary responses vanish; K = G[1](t,t) Phi[0] + G[2] Phi[1](t,t) = <g^2> + <phi^2>).
The two specs are written differently (two-layer: constant sources and running integrals, order parameters
Delta and K; deep: gp sources, two-time kernels and responses of each layer), are derived, generated and
solved by different code, and must give the same means and the same finite-width propagator of Delta and K.
"""
import re
from pathlib import Path

import numpy as np
import pytest

import dmftc

SPECS = Path(__file__).resolve().parent.parent / "specs"


@pytest.mark.parametrize("gamma,y", [(1.3, 0.8), (0.4, -1.1)])
def test_exact_backends_agree_linear(gamma, y):
    """Linear networks: both exact (Gaussian) backends, so the agreement is to round-off."""
    T, eta = 20, 0.05
    two = dmftc.load(f"{SPECS}/linear_whitened.dmft").solve(P=1, y=np.array([y]), gamma=gamma, T=T, eta=eta,
                                                           backend="exact")
    deep = dmftc.load(f"{SPECS}/deep_linear.dmft").solve(L=1, gamma=gamma, y=y, T=T, eta=eta, backend="exact")
    np.testing.assert_allclose(np.ravel(two.mean("Delta")), np.ravel(deep.mean("Delta")), rtol=0, atol=1e-12)
    s2, sd = np.squeeze(two.sigma("Delta")), np.squeeze(deep.sigma("Delta"))
    assert s2.shape == sd.shape == (T, T)
    assert np.abs(sd).max() > 1e-2                       # a propagator, not zeros
    np.testing.assert_allclose(s2, sd, rtol=0, atol=1e-12 * np.abs(sd).max())


def _with_activation(src, dst, expr):
    text = Path(src).read_text()
    text, n = re.subn(r"^activation phi\(h\) = .*$", f"activation phi(h) = {expr}", text, flags=re.M)
    assert n == 1
    dst.write_text(text)
    return dst


def test_monte_carlo_engines_agree_sin(tmp_path):
    """A nonlinear activation in neither shipped spec (sin), rich training (gamma = 1.5, two time units in 15
    steps: both engines discretise time alike, so a coarse step tests the agreement as well as a fine one):
    Monte Carlo on both sides with independent paths (means: 16 groups each; variances: 16 groups on the
    two-layer side, the deep spec's default propagator_samples / propagator_groups = 4000 / 8 on the deep side),
    pointwise z <= 4 on the means and N Var of Delta and K.  Resolution: the standard errors are about 0.2%
    (Delta) and 0.5% (K) of the means' peaks and 2-5% of the variances' (measured on four seed pairs at T = 15:
    max z 0.9, 2.4, 0.8 and 4.2, the last with the deep side's 8-group error bar of N Var K at 12% of the peak,
    an outlying group; at T = 25 and eta = 0.08 on four other pairs, max z 0.4-3.0; pooled over five pairs at
    gamma = 2 within 2.4% of the peak, z <= 1.9)."""
    T, eta, gamma, y = 15, 2 / 15, 1.5, -0.8
    two_spec = _with_activation(f"{SPECS}/two_layer.dmft", tmp_path / "two_layer.dmft", "sin(h)")
    deep_spec = _with_activation(f"{SPECS}/deep_tanh.dmft", tmp_path / "deep_tanh.dmft", "sin(h)")
    two = dmftc.load(two_spec, out_dir=tmp_path / "gen2").solve(gamma=gamma, y=y, T=T, eta=eta, samples=32000,
                                                                 groups=16, seed=1)
    deep = dmftc.load(deep_spec, out_dir=tmp_path / "gend").solve(L=1, gamma=gamma, y=y, T=T, eta=eta,
                                                                   samples=32000, groups=16, seed=2)
    for name in ("Delta", "K"):
        for what, err in (("mean", "mean_stderr"), ("var", "var_stderr")):
            a, b = np.ravel(getattr(two, what)(name)), np.ravel(getattr(deep, what)(name))
            ea, eb = np.ravel(getattr(two, err)(name)), np.ravel(getattr(deep, err)(name))
            assert a.shape == b.shape == (T,)
            scale = np.abs(a).max()
            live = np.sqrt(ea ** 2 + eb ** 2) > 1e-12 * scale   # Var Delta(0) = 0 exactly on both sides
            z = np.abs(a - b)[live] / np.sqrt(ea ** 2 + eb ** 2)[live]
            assert z.max() <= 4.0, (name, what, z.max())
            assert np.all(np.abs(a - b)[~live] <= 1e-12 * scale), (name, what)
            # and the comparison has power: each side's error is small against the curve
            assert max(ea.max(), eb.max()) < (0.01 if what == "mean" else 0.08) * scale, (name, what)
