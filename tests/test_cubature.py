"""The cubature backend (dmftc/runtime/engines/cubature.py): Gauss-Hermite nodes over a two-layer spec's sources."""
import numpy as np
import pytest

import dmftc
from dmftc.errors import ParameterError


def _load(name):
    return dmftc.load(f"specs/{name}.dmft")


def test_linear_spec_equals_the_exact_backend():
    """A linear process is integrated exactly by a rule of >= 3 nodes per coordinate: the exact backend's means
    and propagator to round-off, with an error estimate at round-off too."""
    m = _load("eos")
    ex = m.solve(T=12, backend="exact")
    cu = m.solve(T=12, backend="cubature", samples=400)
    assert cu.info["diagnostics"]["backend"] == "cubature"
    for n in ex.observables:
        scale = np.max(np.abs(ex.mean(n))) + 1e-300
        np.testing.assert_allclose(cu.mean(n), ex.mean(n), rtol=0, atol=1e-10 * scale)
        vs = np.max(np.abs(ex.var(n))) + 1e-300
        np.testing.assert_allclose(cu.var(n), ex.var(n), rtol=0, atol=1e-10 * vs)
        assert np.max(cu.var_stderr(n)) <= 1e-10 * vs


def test_tanh_agrees_with_monte_carlo_and_its_error_is_small(tmp_path):
    """tanh in rich training (gamma = 1.5, y = -0.8, T = 12): every N Var and mean within z <= 4 of a Monte Carlo
    solve (its standard errors and the rule's two-level error combined), and the rule's estimated error (24 against
    18 nodes per coordinate) below 1% of each curve's peak and below Monte Carlo's largest standard error."""
    m = _load("two_layer")
    kw = dict(T=12, gamma=1.5, y=-0.8, eta=0.05)
    cu = m.solve(backend="cubature", samples=14000, **kw)
    assert cu.info["diagnostics"]["cubature"]["nodes"] == [24, 18]
    mc = m.solve(backend="mc", samples=40000, seed=3, **kw)
    from dmftc.runtime.results.plot import CUBATURE_BAND, MC_BAND
    fig = cu.plot(tmp_path / "c.png", return_fig=True)         # the bands say what they are
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert CUBATURE_BAND in legend and MC_BAND not in legend
    for n in mc.observables:
        peak = np.max(np.abs(mc.var(n)))
        err = np.asarray(cu.var_stderr(n))
        assert np.max(err) < 0.01 * peak, (n, np.max(err) / peak)
        assert np.max(err) < np.max(mc.var_stderr(n)), n
        comb = np.sqrt(err ** 2 + np.asarray(mc.var_stderr(n)) ** 2)
        live = comb > 0
        z = np.abs(cu.var(n) - mc.var(n))[live] / comb[live]
        assert np.all(z <= 4), (n, z.max())
        dm = np.abs(cu.mean(n) - mc.mean(n))
        sm = np.sqrt(np.asarray(cu.mean_stderr(n)) ** 2 + np.asarray(mc.mean_stderr(n)) ** 2)
        scale = np.max(np.abs(mc.mean(n)))
        assert np.all((dm <= 4 * sm) | (dm <= 1e-12 * scale)), (n, dm, sm)     # Delta(0) = y exactly


def test_sparse_grid_exact_for_a_linear_spec_on_eight_points():
    """linear_whitened with P = 8 has 9 source coordinates: the Smolyak grid (level 3, 1501 nodes, negative weights
    among them) gives the exact backend's means and propagator to round-off, its level-2 partner too."""
    m = _load("linear_whitened")
    ex = m.solve(T=6, P=8, backend="exact")
    cu = m.solve(T=6, P=8, backend="cubature", samples=2000)
    c = cu.info["diagnostics"]["cubature"]
    assert "Smolyak" in c["rule"] and c["coordinates"] == 9 and c["points"] == [1501, 199]
    scale, vs = np.max(np.abs(ex.mean("Delta"))), np.max(np.abs(ex.var("Delta")))
    np.testing.assert_allclose(cu.mean("Delta"), ex.mean("Delta"), rtol=0, atol=1e-12 * scale)
    np.testing.assert_allclose(cu.var("Delta"), ex.var("Delta"), rtol=0, atol=1e-12 * vs)
    assert np.max(cu.var_stderr("Delta")) <= 1e-12 * vs
    assert "Smolyak" in cu.summary()


def test_sparse_rule_moments():
    """The Smolyak rule of level k integrates every monomial of total degree <= 2k + 1 exactly (and not degree
    2k + 2 in general: the test can fail); the tensor rule of n nodes every degree <= 2n - 1 per coordinate."""
    import itertools
    from math import prod
    from dmftc.runtime.numerics.quadrature import sparse_rule, tensor_rule

    def moment(a):
        return prod(0 if k % 2 else prod(range(k - 1, 0, -2)) for k in a)

    def worst(X, W, degree, d):
        return max(abs(W @ np.prod(X ** np.array(a), axis=1) - moment(a))
                   for a in itertools.product(range(degree + 1), repeat=d) if sum(a) == degree)
    for d, level in ((4, 2), (5, 3)):
        X, W = sparse_rule(d, level)
        assert abs(W.sum() - 1) < 1e-14 and np.any(W < 0)
        assert max(worst(X, W, k, d) for k in range(2 * level + 2)) < 1e-11
        assert worst(X, W, 2 * level + 2, d) > 1e-3
    X, W = tensor_rule(2, 4)
    assert len(W) == 16 and max(worst(X, W, k, 2) for k in range(8)) < 1e-11


def test_refusals():
    with pytest.raises(ParameterError, match="at least"):
        _load("two_layer").solve(T=4, backend="cubature", samples=20)
    with pytest.raises(ParameterError, match="sparse grid of level 3"):
        _load("linear_whitened").solve(T=4, P=8, backend="cubature", samples=1000)
    with pytest.raises(ParameterError, match="mean correction"):
        _load("two_layer").solve(T=4, backend="cubature", samples=400, correction=True)
    with pytest.raises(ParameterError, match="constant in time"):
        _load("deep_tanh").solve(T=3, backend="cubature")
