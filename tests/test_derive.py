"""Symbolic derivation checked against hand derivations (SymPy equality)."""
from pathlib import Path

import pytest
import sympy as sp

from dmftc.compiler import front_end
from dmftc.derive.report import format_derivation, u_blocks
from dmftc.ir.symbolic import ONEHOT

SPECS = Path(__file__).resolve().parent.parent / "specs"
TEST_SPECS = Path(__file__).resolve().parent / "specs"


@pytest.fixture(scope="module")
def two_layer():
    """The NTK form of the two-layer spec (paper eq. two_layer_var_test): constraints with running sums."""
    return front_end(TEST_SPECS / "two_layer_ntk.dmft")[1]


def same(a, b):
    return sp.simplify(sp.sympify(a) - sp.sympify(b)) == 0


def fn(name, when):
    return sp.Function(name)(sp.Symbol(when))


def test_saddle_point_equations_two_layer(two_layer):
    h, hs, z = sp.symbols("h h_star z", real=True)
    kx = sp.Symbol("kx", real=True)
    g = (1 - sp.tanh(h) ** 2) * z
    gs = (1 - sp.tanh(hs) ** 2) * z
    K = two_layer.saddle("K")
    Ks = two_layer.saddle("K_star")
    # K(t) = <phi(h)^2 + g^2>, K_star(t) = <phi(h) phi(h_star) + kx g g_star> after substituting the fields
    fields = {sp.Symbol("g", real=True): g, sp.Symbol("g_star", real=True): gs}
    assert same(K.observable.xreplace(fields), sp.tanh(h) ** 2 + g ** 2)
    assert same(Ks.observable.xreplace(fields), sp.tanh(h) * sp.tanh(hs) + kx * g * gs)
    # Delta(t) = y - eta sum_{s<t} K(s) Delta(s): constraint-only, with a causal running sum
    D = two_layer.saddle("Delta")
    assert D.observable is None and same(D.coeff, 1)
    (rs,) = [s for s in two_layer.order_sums if sp.Symbol(s.name, real=True) in D.rest.free_symbols]
    Delta, Kq = sp.symbols("Delta K", real=True)
    assert same(rs.increment, Delta * Kq)
    assert same(D.rest, -sp.Symbol("y", real=True) + sp.Symbol(rs.name, real=True))


def test_two_layer_U_blocks_match_hand_derivation(two_layer):
    """U = [[I + Theta_K, 0, Theta_Delta, 0], [-Theta_Kstar, I, 0, -Theta_Delta], [-D, 0, I, 0], [-D_star, 0, 0, I]]
    (paper eq. two_layer_var_test, with Theta(t-s) -> eta [s < t] in discrete time)."""
    U = u_blocks(two_layer)
    eta = sp.Symbol("eta")
    expect = {
        ("Delta", "Delta"): (1, eta * fn("K", "s"), False),
        ("Delta", "K"): (0, eta * fn("Delta", "s"), False),
        ("f_star", "f_star"): (1, 0, False),
        ("f_star", "Delta"): (0, -eta * fn("K_star", "s"), False),
        ("f_star", "K_star"): (0, -eta * fn("Delta", "s"), False),
        ("K", "Delta"): (0, 0, True),
        ("K", "K"): (1, 0, False),
        ("K_star", "Delta"): (0, 0, True),
        ("K_star", "K_star"): (1, 0, False),
    }
    assert set(U) == set(expect)
    for key, (same_t, past, has_d) in expect.items():
        b = U[key]
        assert same(b.same, same_t), key
        assert same(b.past, past), key
        assert b.has_d == has_d, key


def test_sensitivity_equations_two_layer(two_layer):
    """dh(t)/dDelta(s') = gamma * eta * sum_{s<t} [g(s) delta_{s s'} + Delta(s) dg(s)/dDelta(s')],
    dz(t)/dDelta(s') = gamma * eta * sum_{s<t} [phi(h(s)) delta_{s s'} + Delta(s) phi'(h(s)) dh(s)/dDelta(s')]."""
    d = two_layer
    gamma, Delta = sp.symbols("gamma Delta", real=True)
    h, z, g = sp.symbols("h z g", real=True)
    dI1, dI2, dh, dz, dg = (sp.Symbol(f"d{n}/dDelta", real=True) for n in ("∫1", "∫2", "h", "z", "g"))
    assert same(d.tangent("field", "h", "Delta").expr, gamma * dI1)
    assert same(d.tangent("field", "z", "Delta").expr, gamma * dI2)
    # g = phi'(h) z -> dg = phi''(h) z dh + phi'(h) dz
    phi = sp.tanh
    x = sp.Symbol("x")
    d1, d2 = sp.diff(phi(x), x), sp.diff(phi(x), x, 2)
    assert same(d.tangent("field", "g", "Delta").expr, d2.subs(x, h) * z * dh + d1.subs(x, h) * dz)
    assert same(d.tangent("sum", "∫1", "Delta").expr, g * ONEHOT + Delta * dg)
    assert same(d.tangent("sum", "∫2", "Delta").expr, phi(h) * ONEHOT + Delta * d1.subs(x, h) * dh)
    # D(t,s) = < d/dDelta(s) (phi(h)^2 + g^2) >
    assert same(d.tangent("observable", "K", "Delta").expr, 2 * phi(h) * d1.subs(x, h) * dh + 2 * g * dg)


def test_test_point_field_is_driven_by_training_gradient(two_layer):
    """h_star is driven by the training point's g (the paper's App. formula has phi'(h_star) z: a typo)."""
    kx, gamma = sp.symbols("kx gamma", real=True)
    dI1 = sp.Symbol("d∫1/dDelta", real=True)
    assert same(two_layer.tangent("field", "h_star", "Delta").expr, gamma * kx * dI1)


def test_shipped_two_layer_reads_out_the_network():
    """The shipped spec's errors are the network's readout, a neuron average: Delta(t) - y = <(r phi(u) -
    z phi(h)) / gamma>, and the test prediction likewise; both then have sensitivity blocks D."""
    d = front_end(SPECS / "two_layer.dmft")[1]
    r, u, z, h, hs, gamma = sp.symbols("r u z h h_star gamma", real=True)
    us = sp.Symbol("u_star", real=True)
    D, F = d.saddle("Delta"), d.saddle("f_star")
    assert same(D.coeff, 1) and same(D.rest, -sp.Symbol("y", real=True))
    assert same(D.observable, (r * sp.tanh(u) - z * sp.tanh(h)) / gamma)
    assert same(F.observable, (z * sp.tanh(hs) - r * sp.tanh(us)) / gamma)
    U = u_blocks(d)
    assert U[("Delta", "Delta")].has_d and U[("f_star", "Delta")].has_d and not d.order_sums


def test_multi_sample_structure():
    d = front_end(TEST_SPECS / "two_layer_multi_ntk.dmft")[1]
    assert d.drivers == ("Delta",)
    assert [s.name for s in d.saddles if s.observable is not None] == ["K"]
    mu, nu = sp.symbols("mu nu", integer=True)
    Kx = sp.IndexedBase("Kx")
    phi = lambda x: sp.sqrt(2) * sp.Max(0, x)
    h, g = sp.IndexedBase("h"), sp.IndexedBase("g")
    obs = d.saddle("K").observable
    assert same(obs, phi(h[mu]) * phi(h[nu]) + Kx[mu, nu] * g[mu] * g[nu])
    # U[Delta, K]: d/dK[mu',nu'](s) of sum_nu K[mu,nu] Delta[nu] -> delta(mu, mu') Delta[nu'](s)
    U = u_blocks(d)
    assert ("Delta", "K") in U and ("Delta", "Delta") in U and U[("K", "Delta")].has_d
    # the ReLU's second derivative is a DiracDelta: reported, not silently dropped
    assert any("DiracDelta" in s for s in d.singular)


def test_derive_report_mentions_every_block(two_layer):
    text = format_derivation(two_layer)
    for piece in ("K(t) = <", "dh(t)/dDelta(s')", "U[K, Delta](t, s) = - D[K, Delta](t, s)",
                  "kappa[K, *]"):
        assert piece in text
    latex = format_derivation(two_layer, latex=True)
    assert latex.count(r"\begin{align*}") == latex.count(r"\end{align*}") >= 3      # one per section
    assert latex.count("{") == latex.count("}")


SECTIONS = ("order parameters", "single-site process", "saddle-point equations", "field sensitivities",
            "Hessian blocks", "single-site program")


@pytest.mark.parametrize("spec", sorted(p.stem for p in SPECS.glob("*.dmft")))
def test_derive_prints_the_same_sections_for_every_spec(spec):
    """`dmftc derive`: the same six sections, in the same order, for two-layer and deep specs alike (the headings
    are the report's unindented lines after the model's own; sub-blocks are indented under them)."""
    text = format_derivation(front_end(SPECS / f"{spec}.dmft")[1])
    heads = [line for line in text.splitlines() if line and not line.startswith(" ")]
    found = [next((s for s in SECTIONS if line.startswith(s)), None) for line in heads]
    assert [s for s in found if s is not None] == list(SECTIONS), heads
    first = found.index(SECTIONS[0])
    assert all(s is not None for s in found[first:]), heads      # nothing but sections after the header lines
