"""dmftc.derive.activation: one definition of an activation and its derivatives through fourth order.

Smooth activations: the printed derivatives equal finite differences of phi.  Non-smooth ones: the
distributional derivatives have the closed forms worked out by hand (branches plus delta functions with the
jump weights), and the mollified delta functions integrate like the distributions they stand for.
"""
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp

from dmftc.runtime.numerics import kernels
from dmftc.derive.activation import X, Activation
from dmftc.runtime.problem.activation import as_activation
from dmftc.errors import ParameterError


@pytest.mark.parametrize("text", ["sin(h)", "tanh(h)", "erf(h)", "sigmoid(h) * cos(2 * h)", "h^3 / 6 + exp(-h^2)"])
def test_smooth_derivatives_equal_finite_differences(text):
    site = as_activation(text)
    assert site.kink_order is None
    h = np.linspace(-2.3, 2.1, 37)
    eps = 1e-3
    vals = [np.asarray(v) for v in site.fn(jnp.asarray(h))]
    for k in range(1, 5):
        prev = lambda x, k=k: np.asarray(site.fn(jnp.asarray(x))[k - 1])  # noqa: E731
        fd = (prev(h + eps) - prev(h - eps)) / (2 * eps)
        np.testing.assert_allclose(vals[k], fd, rtol=1e-5, atol=1e-5)


def test_softsign_distributional_derivatives_by_hand():
    d = Activation.parse("h / (1 + abs(h))").derivatives
    a = sp.Abs(X)
    want_regular = [X / (1 + a), 1 / (1 + a) ** 2, -2 * sp.sign(X) / (1 + a) ** 3, 6 / (1 + a) ** 4,
                    -24 * sp.sign(X) / (1 + a) ** 5]
    want_delta = [0, 0, 0, -4 * sp.DiracDelta(X), -4 * sp.DiracDelta(X, 1)]   # jumps of phi'' (-4) at 0
    for k in range(5):
        singular = sum((t for t in sp.Add.make_args(d[k]) if t.has(sp.DiracDelta)), sp.Integer(0))
        assert sp.simplify(singular - want_delta[k]) == 0
        regular = d[k] - singular
        for x0 in (-1.7, -0.3, 0.4, 2.2):
            assert float(regular.subs(X, x0)) == pytest.approx(float(want_regular[k].subs(X, x0)), rel=1e-12)
    assert Activation.parse("h / (1 + abs(h))").kink_order == 3


def test_relu_and_hard_tanh_kinks():
    relu = Activation.parse("relu")
    assert relu.kink_order == 2
    assert sp.simplify(relu.derivatives[2] - sp.sqrt(2) * sp.DiracDelta(X)) == 0
    assert sp.simplify(relu.derivatives[4] - sp.sqrt(2) * sp.DiracDelta(X, 2)) == 0
    hard = Activation.parse("max(-1, min(1, h))")
    assert hard.kink_order == 2
    assert sp.simplify(hard.derivatives[2] - (sp.DiracDelta(X + 1) - sp.DiracDelta(X - 1))) == 0
    leaky = Activation.parse("max(h / 10, h)")
    assert sp.simplify(leaky.derivatives[2] - sp.Rational(9, 10) * sp.DiracDelta(X)) == 0


@pytest.mark.parametrize("order", [0, 1, 2, 3])
def test_mollified_delta_derivatives_integrate_like_distributions(order):
    """int dirac^(k)(x) f(x) dx = (-1)^k f^(k)(0) up to O(width^2) for f = cos(x) + x^3 + exp(x)."""
    width = 0.02
    x = np.linspace(-1, 1, 200001)
    f = np.cos(x) + x ** 3 + np.exp(x)
    fk = [2.0, 1.0, 0.0, 7.0][order]                    # f^(k)(0)
    got = np.trapezoid(np.asarray(kernels.dirac(jnp.asarray(x), width, order)) * f, x)
    assert got == pytest.approx((-1) ** order * fk, abs=5e-3)


def test_bad_activations_are_named():
    for bad, match in (("foo(h)", "unknown functions foo"), ("tanh(beta h)", "cannot read|depends on"),
                       ("tanh(beta * h)", "depends on beta"), ("tanh", None), ("gelu", "depends on gelu"),
                       ("", "an activation is an expression")):
        if match is None:
            assert Activation.parse(bad).expr == sp.tanh(X)      # a shorthand
            continue
        with pytest.raises(ParameterError, match=match):
            Activation.parse(bad)


def test_periodic_and_shifted_kinks():
    """abs(sin(h)) has infinitely many kinks: its derivatives are SymPy's (delta of sin(h)), exact away from the
    kinks, also beyond the first period; relu(h - 1/2) has its delta at 1/2."""
    site = as_activation("abs(sin(h))")
    assert site.kink_order == 2
    for x in (-4.0, -0.5, 2.0, 7.0, 11.0):                  # away from k pi
        vals = [float(v) for v in site.fn(jnp.asarray(x))]
        s = np.sign(np.sin(x))
        np.testing.assert_allclose(vals[:2], [abs(np.sin(x)), s * np.cos(x)], rtol=1e-12)
    shifted = Activation.parse("relu(h - 0.5)")
    assert sp.simplify(shifted.derivatives[2] - sp.DiracDelta(X - sp.Rational(1, 2))) == 0
