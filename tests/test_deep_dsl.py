"""Deep networks from specs: symbolic derivation against hand derivations, generated code, runtime.

Hand derivations on the smallest cases (one generic hidden layer l, its neighbours' kernels as symbols):
T = 1, where h(0) = u(0) ~ N(0, Phi[l-1](0, 0)); and T = 2 with a linear activation, where every average
is a Gaussian moment written out below.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import sympy as sp

import dmftc
from dmftc.frontend.check import check
from dmftc.derive import derive
from dmftc.derive.deep import activation_functions
from dmftc.derive.deep_blocks import (explicit_term, format_deep_derivation, gaussian_average, price_term,
                                      response_observable, unroll)
from dmftc.errors import ParameterError, PropagatorTooLarge
from dmftc.frontend.parse import parse

ROOT = Path(__file__).resolve().parent.parent


def derivation(name):
    return derive(check(parse((ROOT / "specs" / f"{name}.dmft").read_text(), f"specs/{name}.dmft")))


@pytest.fixture(scope="module")
def tanh_d():
    return derivation("deep_tanh")


@pytest.fixture(scope="module")
def linear_d():
    return derivation("deep_linear")


F = sp.Function


# ---------------------------------------------------------------- structure read off the spec

def test_couplings_and_readout_are_derived(tanh_d):
    t, s = tanh_d.t, tanh_d.s
    eta, gamma = sp.symbols("eta gamma")
    c = tanh_d.couplings
    assert sp.simplify(c.h_past - (F("A[l-1]")(t, s) + eta * gamma * F("Delta")(s) * F("Phi[l-1]")(t, s))) == 0
    assert c.z_upto == F("B[l+1]")(t, s)
    assert sp.simplify(c.z_past - eta * gamma * F("Delta")(s) * F("G[l+1]")(t, s)) == 0
    x = tanh_d.act_arg
    assert sp.simplify(tanh_d.phi[1] - (1 - sp.tanh(x) ** 2)) == 0
    assert sp.simplify(tanh_d.phi[2] + 2 * sp.tanh(x) * (1 - sp.tanh(x) ** 2)) == 0
    # Stein: E[z[L](t) phi(h[L](t))] = sum_{s<t} G[L+1] A[L] + sum_{s<=t} B[L+1] Phi[L] + sum_{s<t} c_z Phi[L]
    want = (sp.Sum(F("G[L+1]")(t, s) * F("A[L]")(t, s), (s, 0, t - 1))
            + sp.Sum(F("B[L+1]")(t, s) * F("Phi[L]")(t, s), (s, 0, t))
            + sp.Sum(eta * gamma * F("Delta")(s) * F("G[L+1]")(t, s) * F("Phi[L]")(t, s), (s, 0, t - 1)))
    assert sp.simplify(tanh_d.readout_stein - want) == 0
    assert tanh_d.roles == {"h": "h", "z": "z", "g": "g", "u": "u", "r": "r", "Phi": "Phi", "G": "G", "A": "A",
                            "B": "B"}
    assert not tanh_d.linear and derivation("deep_linear").linear


# ---------------------------------------------------------------- T = 1: Price's theorem

def test_price_term_t1_symbolic(tanh_d):
    u = unroll(tanh_d, 1)
    phi, dphi, ddphi = u.phi[:3]
    h0 = u.fields["h"][0]
    u0 = u.sources["u"][0]
    assert h0 == u0                                           # h(0) = u(0)
    got = price_term(phi(h0) ** 2, u.sources["u"], 0, 0)      # diagonal entry: factor 1/2
    assert sp.expand(got - (dphi(u0) ** 2 + phi(u0) * ddphi(u0))) == 0
    # no explicit dependence at T = 1: the coupling sums are empty
    assert explicit_term(phi(h0) ** 2, F("Phi[l-1]")(0, 0)) == 0


def test_price_term_t1_tanh_numbers(tanh_d):
    """<phi'^2 + phi phi''> (Gauss-Hermite) equals d/d sigma^2 E[tanh(sigma xi)^2] (finite differences)."""
    x = tanh_d.act_arg
    expr = sp.lambdify(x, tanh_d.phi[1] ** 2 + tanh_d.phi[0] * tanh_d.phi[2], "numpy")
    nodes, weights = np.polynomial.hermite_e.hermegauss(200)   # 120 nodes are 3e-7 off at var = 1.6
    avg = lambda f, var: float(np.sum(weights * f(math.sqrt(var) * nodes)) / math.sqrt(2 * math.pi))  # noqa: E731
    for var in (0.3, 0.7, 1.6):
        price = avg(expr, var)
        f = lambda v: avg(lambda x: np.tanh(x) ** 2, v)  # noqa: E731
        e = 1e-3   # five-point stencil: truncation O(e^4)
        fd = (-f(var + 2 * e) + 8 * f(var + e) - 8 * f(var - e) + f(var - 2 * e)) / (12 * e)
        assert price == pytest.approx(fd, rel=1e-8)
        assert price > 0.05


def test_price_factor_off_diagonal(linear_d):
    """d<u(0) u(1)>/d Phi[l-1](1, 0) = 1: the symmetric entry counts twice (factor 1, not 1/2)."""
    u = unroll(linear_d, 2, concrete=True)
    src = u.sources["u"]
    assert price_term(src[0] * src[1], src, 1, 0) == 1
    assert price_term(src[0] ** 2, src, 0, 0) == 1
    assert gaussian_average(src[0] * src[1], [(src, u.cov["u"])]) == F("Phi[l-1]")(1, 0)


# ---------------------------------------------------------------- T = 2, linear activation, by hand

@pytest.fixture(scope="module")
def t2(linear_d):
    u = unroll(linear_d, 2, concrete=True)
    eta, gamma = sp.symbols("eta gamma")
    Phi, G, A, B, D = F("Phi[l-1]"), F("G[l+1]"), F("A[l-1]"), F("B[l+1]"), F("Delta")
    c10 = A(1, 0) + eta * gamma * D(0) * Phi(1, 0)            # c_h(1, 0)
    u0, u1 = u.sources["u"]
    r0, r1 = u.sources["r"]
    g0 = r0 + B(0, 0) * u0                                     # z(0) = r(0) + B[l+1](0,0) h(0), g = z (linear)
    h1 = u1 + c10 * g0
    groups = [(u.sources["u"], u.cov["u"]), (u.sources["r"], u.cov["r"])]
    return dict(u=u, c10=c10, g0=g0, h1=h1, groups=groups, Phi=Phi, G=G, A=A, B=B, D=D, eta=eta, gamma=gamma)


def test_t2_fields_by_hand(t2):
    u = t2["u"]
    assert sp.expand(u.fields["g"][0] - t2["g0"]) == 0
    assert sp.expand(u.fields["h"][1] - t2["h1"]) == 0


def test_t2_field_sensitivities(t2):
    u, h1, g0 = t2["u"], t2["u"].fields["h"][1], t2["g0"]
    # response block: d h(1) / d A[l-1](1, 0) = g(0)
    assert sp.expand(sp.diff(h1, t2["A"](1, 0)) - g0) == 0
    # error-signal sensitivity (paper eq. field_err_sensitivity at T = 2): eta gamma Phi[l-1](1,0) g(0)
    assert sp.expand(sp.diff(h1, t2["D"](0)) - t2["eta"] * t2["gamma"] * t2["Phi"](1, 0) * g0) == 0
    # kernel sensitivity: d h(1)/d Phi[l-1](1, 0) = eta gamma Delta(0) g(0)  (the g(s') factor is needed)
    assert sp.expand(sp.diff(h1, t2["Phi"](1, 0)) - t2["eta"] * t2["gamma"] * t2["D"](0) * g0) == 0
    # backward field: z(1) = r(1) + B(1,1) h(1) + (B(1,0) + eta gamma Delta(0) G(1,0)) h(0)
    z1 = u.fields["z"][1]
    assert sp.expand(sp.diff(z1, t2["B"](1, 0)) - u.sources["u"][0]) == 0
    assert sp.expand(sp.diff(z1, t2["G"](1, 0)) - t2["eta"] * t2["gamma"] * t2["D"](0) * u.sources["u"][0]) == 0


def test_t2_responses(t2):
    u = t2["u"]
    # A[l](1, 0) = <d phi(h(1)) / d r(0)> = c_h(1, 0)  (phi' = 1)
    assert sp.expand(response_observable(u, "phi(h)", 1, "r", 0) - t2["c10"]) == 0
    # B[l](1, 1) = <d g(1) / d u(1)> = B[l+1](1, 1): the same-time term of the discrete-time response
    assert sp.expand(response_observable(u, "g", 1, "u", 1) - t2["B"](1, 1)) == 0
    # B[l](1, 0) = B[l+1](1,0) + eta gamma Delta(0) G[l+1](1,0) + B[l+1](1,1) c_h(1,0) B[l+1](0,0)
    want = t2["B"](1, 0) + t2["eta"] * t2["gamma"] * t2["D"](0) * t2["G"](1, 0) + t2["B"](1, 1) * t2["c10"] * t2["B"](0, 0)
    assert sp.expand(response_observable(u, "g", 1, "u", 0) - want) == 0


def test_t2_moments_and_d_blocks(t2):
    h1, c, B00 = t2["h1"], t2["c10"], t2["B"](0, 0)
    Phi, G = t2["Phi"], t2["G"]
    avg = gaussian_average(h1 ** 2, t2["groups"])
    # <h(1)^2> = Phi(1,1) + 2 c <u(1) g(0)> + c^2 <g(0)^2>, <u(1) g(0)> = B(0,0) Phi(1,0), <g0^2> = G(0,0) + B00^2 Phi(0,0)
    hand = Phi(1, 1) + 2 * c * B00 * Phi(1, 0) + c ** 2 * (G(0, 0) + B00 ** 2 * Phi(0, 0))
    assert sp.expand(avg - hand) == 0
    # D[Phi[l](1,1), A[l-1](1,0)] = 2 <h(1) g(0)>
    assert sp.expand(sp.diff(avg, t2["A"](1, 0)) - 2 * (B00 * Phi(1, 0) + c * (G(0, 0) + B00 ** 2 * Phi(0, 0)))) == 0
    # D with respect to a source covariance = Price term + explicit term (both averaged)
    u = t2["u"]
    for (a, b) in ((1, 0), (0, 0), (1, 1)):
        total = sp.diff(hand, Phi(a, b))
        price = gaussian_average(price_term(h1 ** 2, u.sources["u"], a, b), t2["groups"])
        explicit = gaussian_average(explicit_term(h1 ** 2, Phi(a, b)), t2["groups"])
        assert sp.expand(price + explicit - total) == 0, (a, b)
    assert sp.expand(sp.diff(hand, Phi(1, 0))) != 0


def test_kappa_t1_linear(linear_d):
    """kappa[Phi, Phi](0,0; 0,0) = Var(u^2) = 2 Phi[l-1](0,0)^2 for a linear net at T = 1."""
    u = unroll(linear_d, 1, concrete=True)
    h0 = u.fields["h"][0]
    groups = [(u.sources["u"], u.cov["u"]), (u.sources["r"], u.cov["r"])]
    kappa = gaussian_average(h0 ** 4, groups) - gaussian_average(h0 ** 2, groups) ** 2
    assert sp.expand(kappa - 2 * F("Phi[l-1]")(0, 0) ** 2) == 0
    g0 = u.fields["g"][0]
    cross = gaussian_average(h0 ** 2 * g0 ** 2, groups) - gaussian_average(h0 ** 2, groups) * gaussian_average(
        g0 ** 2, groups)
    B00, P00 = F("B[l+1]")(0, 0), F("Phi[l-1]")(0, 0)
    assert sp.expand(cross - 2 * B00 ** 2 * P00 ** 2) == 0       # kappa[Phi, G] through g(0) = r(0) + B00 u(0)


def test_activation_functions_chain():
    phi, d1, d2 = activation_functions("psi")[:3]
    x = sp.Symbol("x")
    assert sp.expand(sp.diff(phi(x) ** 2, x, 2) - (2 * d1(x) ** 2 + 2 * phi(x) * d2(x))) == 0


def test_derive_text_lists_the_blocks(tanh_d):
    text = format_deep_derivation(tanh_d)
    for piece in ("c_h(t, s) = eta*gamma*Delta(s)*Phi[l-1](t, s) + A[l-1](t, s)",
                  "dh(t)/dA[l-1](t', s') = [t' = t, s' < t] (1) g(s')", "Price-theorem term",
                  "w = 1/2 if t' = s' else 1", "kappa[Phi[l], G[l]]", "Schur complement", "readout by Stein"):
        assert piece in text, piece


# ---------------------------------------------------------------- generated module and runtime

def test_generated_activation_and_couplings():
    import jax.numpy as jnp

    mod = dmftc.load(ROOT / "specs" / "deep_tanh.dmft").module
    x = jnp.linspace(-2.0, 2.0, 9)
    p = mod.defaults({})
    np.testing.assert_allclose(mod.phi(x, p, 0.1), np.tanh(x), rtol=1e-15)
    np.testing.assert_allclose(mod.dphi(x, p, 0.1), 1 - np.tanh(x) ** 2, rtol=1e-14)
    np.testing.assert_allclose(mod.ddphi(x, p, 0.1), -2 * np.tanh(x) * (1 - np.tanh(x) ** 2), rtol=1e-13, atol=1e-15)
    prev = {"Phi": jnp.array([0.5, 0.25]), "A": jnp.array([0.1, 0.2])}
    D = jnp.array([2.0, 3.0])
    np.testing.assert_allclose(mod.h_coupling(prev, D, p), [0.1 + 0.05 * 2 * 0.5, 0.2 + 0.05 * 3 * 0.25])
    c0, c1 = mod.z_coupling({"G": jnp.array([1.0, 2.0]), "B": jnp.array([0.3, 0.4])}, D, p)
    np.testing.assert_allclose(c0, [0.3, 0.4])
    np.testing.assert_allclose(c1, [0.05 * 2, 0.05 * 3 * 2])
    assert mod.readout(0.7, 0.2, p) == pytest.approx(1.0 - 0.5)
    diag = lambda name, l: np.full(3, {"G": 2.0, "Phi": 3.0}[name] + l)  # noqa: E731
    # K = sum_{l=0..L} G[l+1] Phi[l] with G[j] = 2 + j, Phi[j] = 3 + j: 3*3 + 4*4 + 5*5
    np.testing.assert_allclose(mod.scalar_K(diag, {"L": 2.0}), 9 + 16 + 25)
    assert mod.BOUNDARIES == (("Phi", "0"), ("G", "L+1"), ("A", "0"), ("B", "L+1"))


def test_deep_tanh_spec_matches_python_api():
    """Same seed and samples: the spec reproduces dmftc.deep.solve_deep, means and propagator.

    The Python API's standard network is this spec with its model line renamed (dmftc.runtime.problem.standard_spec),
    so both run the same generated program through separately compiled but identical XLA computations: the
    results are equal (measured: bitwise; asserted to 1e-12 of each curve's scale).  Before that the API ran the
    structured march and the two agreed only to ~1e-8 (round-off lifted by the Cholesky extension of the rank-one
    input kernel).
    """
    from dmftc.deep import solve_deep

    m = dmftc.load(ROOT / "specs" / "deep_tanh.dmft")
    kw = dict(L=2, T=5, gamma=1.0, y=1.0, eta=0.05)
    prop = dict(propagator_samples=400, propagator_groups=4)
    sol = m.solve(samples=800, seed=5, **prop, **kw)
    ref = solve_deep(activation="tanh", samples=800, seed=5, **prop, **kw)
    assert "site_march" in ref.info["march"]
    assert set(sol.names) == {"Delta", "K"} | {f"{q}[{l}]" for q in ("Phi", "G", "A", "B") for l in (1, 2)}
    close = lambda a, b, n: np.testing.assert_allclose(a, b, rtol=0, atol=1e-12 * max(np.abs(b).max(), 1.0),  # noqa: E731
                                                       err_msg=n)
    for name in sol.names:
        internal = _internal(name)
        close(sol.mean(name), ref.mean(internal), name)
        close(sol.mean_stderr(name), ref.mean_stderr(internal), name)
    assert np.max(sol.mean_stderr("Delta")) > 1e-5       # a real Monte Carlo run
    for name in ("Delta", "K", "Phi[1]", "G[2]"):     # the propagator of the standard network, same seed
        close(sol.var(name), ref.var(name), name)
        close(sol.var_stderr(name), ref.var_stderr(name), name)
    assert sol.var("K").max() > 0.1
    with pytest.raises(ParameterError, match="no propagator block for the response function"):
        sol.var("A[1]")


def test_tanh_spec_of_another_action_gets_the_propagator_of_its_own_action(tmp_path):
    """A spec whose z coupling carries 2 gamma is not the standard network; its propagator is that of its OWN
    action (deep_model.from_spec): the Monte Carlo action built from the spec's couplings is stationary to
    round-off at the saddle marched with the same couplings, and the variances differ from the standard
    network's on the same paths."""
    text = (ROOT / "specs" / "deep_tanh.dmft").read_text().replace(
        "+ gamma * integral(Delta(s) G[l+1](t, s) phi(h[l](s)), s < t)",
        "+ 2 * gamma * integral(Delta(s) G[l+1](t, s) phi(h[l](s)), s < t)")
    spec = tmp_path / "other_tanh.dmft"
    spec.write_text(text)
    kw = dict(L=2, T=4, eta=0.1, samples=200, propagator_samples=400, propagator_groups=2, seed=3)
    sol = dmftc.load(spec, tmp_path / "gen").solve(**kw)
    ref = dmftc.load(ROOT / "specs" / "deep_tanh.dmft").solve(**kw)
    assert sol.var("K").shape == (4,)
    assert sol.info["propagator_stationarity"] < 1e-12
    assert np.abs(sol.var("G[2]") - ref.var("G[2]")).max() > 0.01 * ref.var("G[2]").max()


def test_readout_nonlinear_in_the_average_gets_the_propagator_of_its_saddle(tmp_path):
    """An error signal that is not affine in the average E[z phi] (here y - (E_t - E_0)^2) is linearised at each
    saddle (deep_model.DeepModel.linearised): the Monte Carlo action so read is stationary at the group saddles
    to round-off (tests/test_deep_losses.py checks such losses against networks)."""
    text = (ROOT / "specs" / "deep_tanh.dmft").read_text()
    old = "(Delta(t) - y + (E[z[L](t) phi(h[L](t))] - E[z[L](0) phi(h[L](0))]) / gamma)"
    assert old in text
    spec = tmp_path / "squared.dmft"
    spec.write_text(text.replace(old, "(Delta(t) - y + (E[z[L](t) phi(h[L](t))] - E[z[L](0) phi(h[L](0))]) ^ 2)"))
    m = dmftc.load(spec, tmp_path / "gen")
    sol = m.solve(L=2, T=4, eta=0.1, samples=200, propagator_samples=64, propagator_groups=2)
    assert sol.mean("Delta").shape == (4,)
    assert np.all(np.isfinite(sol.var("K"))) and sol.var("K")[-1] > 0
    assert sol.info["propagator_stationarity"] < 1e-12


def test_propagator_reads_the_constants_from_the_spec_whatever_the_names(tmp_path):
    """The same network written with other parameter names and a rescaled gamma (gamma = 2 beta): the
    propagator differentiates the spec's action through its generated functions (deep_model.from_spec), so it
    is the one of deep_tanh at gamma = 2 beta (same seed: equal to round-off)."""
    text = (ROOT / "specs" / "deep_tanh.dmft").read_text()
    for old, new in (('param gamma = 1.0 "feature learning strength"', 'param beta = 0.6 "half the feature strength"'),
                     ('param y = 1.0 "training target"', 'param target = -0.7'),
                     ("steps of eta = 0.05", "steps of lr = 0.05"),
                     ("+ gamma * integral(Delta(s) Phi", "+ 2 * beta * integral(Delta(s) Phi"),
                     ("+ gamma * integral(Delta(s) G", "+ 2 * beta * integral(Delta(s) G"),
                     ("(Delta(t) - y + ", "(Delta(t) - target + "), (") / gamma), t)", ") / (2 * beta)), t)")):
        assert old in text
        text = text.replace(old, new)
    spec = tmp_path / "renamed.dmft"
    spec.write_text(text)
    kw = dict(T=4, samples=400, propagator_samples=64, propagator_groups=2, seed=5)
    mine = dmftc.load(spec, tmp_path / "gen").solve(lr=0.1, **kw)
    ref = dmftc.load(ROOT / "specs" / "deep_tanh.dmft").solve(gamma=1.2, y=-0.7, eta=0.1, **kw)
    for name in ("Delta", "K", "Phi[1]", "G[2]"):
        np.testing.assert_allclose(mine.mean(name), ref.mean(name), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(mine.var(name), ref.var(name), rtol=1e-8, atol=1e-12)


def _internal(name: str) -> str:
    """The Python API's name of a deep_tanh / deep_linear spec name (the responses A, B are Rphi, Rg there)."""
    return name.replace("A[", "Rphi[").replace("B[", "Rg[")


def test_deep_linear_spec_matches_python_api():
    from dmftc.deep import solve_deep

    m = dmftc.load(ROOT / "specs" / "deep_linear.dmft")
    sol = m.solve(L=2, T=6, eta=0.1)
    ref = solve_deep(activation="linear", L=2, gamma=1.0, y=1.0, eta=0.1, T=6)
    # to round-off, not bitwise: the spec's march and the built-in model's are compiled separately
    for name in ("Delta", "K", "Phi[1]", "G[2]", "A[2]", "B[1]"):
        np.testing.assert_allclose(sol.mean(name), ref.mean(_internal(name)), rtol=1e-13, atol=1e-15)
    for name in ("Delta", "K", "Phi[1]", "Phi[2]", "G[1]", "G[2]"):
        np.testing.assert_allclose(sol.var(name), ref.var(name), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(sol.sigma("Delta", "K"), ref.sigma("Delta", "K"), rtol=1e-12, atol=1e-14)
    assert sol.var("Phi[2]")[0] == pytest.approx(4.0, abs=1e-10)     # N Var Phi[l](0,0) = 2 l at t = 0
    with pytest.raises(ParameterError, match="unknown name 'Phi\\[3\\]'"):
        sol.mean("Phi[3]")


def test_deep_linear_too_large_keeps_means_and_names_the_size():
    m = dmftc.load(ROOT / "specs" / "deep_linear.dmft")
    sol = m.solve(L=2, T=6, eta=0.1, memory_limit=1e5)
    assert sol.mean("Delta").shape == (6,)
    with pytest.raises(PropagatorTooLarge, match=r"needs about [0-9.]+ GB"):
        sol.var("K")


def test_linear_spec_of_another_action_gets_its_own_exact_propagator(tmp_path):
    """A deep linear spec that is not the standard network (2 gamma in the h coupling, an input kernel Phi[0] =
    0.6): its exact propagator is that of its OWN action (deep_model.from_spec, then the autodiff Hessian of the
    log-det action of dmftc.runtime.engines.deep_linear).  Oracle: the Monte Carlo engine of dmftc.runtime.engines.deep_propagator
    (its own march, closed-form site moments, causal solve) run with the same model on a degree-5 Gaussian
    cubature rule, on which it is exact for phi = identity; both agree to round-off, and differ from the
    standard network's."""
    from dmftc.reference.deep_autodiff import gaussian_cubature5
    from dmftc.runtime.problem.deep_model import from_spec
    from dmftc.runtime.march.deep_dmft import SpecKernels
    from dmftc.runtime.engines.deep_propagator import group_propagator

    text = (ROOT / "specs" / "deep_linear.dmft").read_text()
    for old, new in (("+ gamma * integral(Delta(s) Phi[l-1](t, s) g[l](s), s < t)",
                      "+ 2 * gamma * integral(Delta(s) Phi[l-1](t, s) g[l](s), s < t)"),
                     ("Phi[0](t, s) = 1;", "Phi[0](t, s) = 0.6;")):
        assert old in text
        text = text.replace(old, new)
    spec = tmp_path / "other.dmft"
    spec.write_text(text)
    m = dmftc.load(spec, tmp_path / "gen")
    L, T = 2, 5
    sol = m.solve(L=L, T=T, eta=0.1, gamma=1.3, y=-0.6)
    ref = dmftc.load(ROOT / "specs" / "deep_linear.dmft").solve(L=L, T=T, eta=0.1, gamma=1.3, y=-0.6)
    model = from_spec(m.module, sol.params)
    assert model.phi0 == 0.6 and model.standard_params is None
    pts, w = gaussian_cubature5(2 * T)
    xiu, xir = np.repeat(pts[None, :, :T], L, axis=0), np.repeat(pts[None, :, T:], L, axis=0)
    act = SpecKernels(m.module).site_activation(sol.params, 0.1)          # the spec's own (linear) activation
    P = group_propagator(activation=act, L=L, T=T, xiu=xiu, xir=xir, weights=w, model=model)
    assert P.diagnostics["stationarity"] < 1e-12 and P.diagnostics["march"] == "site program"
    names = ("Delta", "K", "Phi[1]", "Phi[2]", "G[1]", "G[2]")
    for a in names:
        np.testing.assert_allclose(P.saddle.Delta, sol.mean("Delta"), rtol=0, atol=1e-12)
        for b in names:
            scale = max(np.abs(P.sigma[a][b]).max(), 1e-3)
            assert np.abs(sol.sigma(a, b) - P.sigma[a][b]).max() <= 1e-9 * scale, (a, b)
        assert np.abs(sol.var(a) - ref.var(a)).max() > 0.01 * np.abs(ref.var(a)).max(), a
    assert sol.var("Phi[1]")[0] == pytest.approx(2 * 0.6 ** 2, abs=1e-12)    # N Var of the mean of h^2, h ~ N(0, 0.6)


@pytest.mark.parametrize("kw, match", [({"L": 2.5}, "must be a positive integer"), ({"L": 0}, "must be a positive integer"),
                                       ({"gama": 1.0}, "did you mean 'gamma'"), ({"eta": -1.0}, "must be positive")])
def test_bad_parameters(kw, match):
    m = dmftc.load(ROOT / "specs" / "deep_tanh.dmft")
    with pytest.raises(ParameterError, match=match):
        m.solve(samples=100, **kw)


def test_cli_run_deep_tanh_with_depth_and_plot(tmp_path, capsys, monkeypatch):
    from dmftc.cli import main

    monkeypatch.chdir(ROOT)
    code = main(["run", "specs/deep_tanh.dmft", "--set", "L=3", "--set", "T=4", "--samples", "400",
                 "--propagator-samples", "200", "--plot", str(tmp_path / "d.png"), "--out", str(tmp_path / "d.npz")])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "model deep_tanh" in out.out and "Phi[3]" in out.out and "not implemented" not in out.out
    assert "deep propagator (L = 3, T = 4)" in out.err                 # progress bar on stderr
    assert (tmp_path / "d.png").stat().st_size > 1000
    back = dmftc.Solution.load(tmp_path / "d.npz")
    assert back.kind == "deep" and back.depth == 3
    assert back.mean("Phi[3]").shape == (4, 4) and back.var("Phi[3]").shape == (4,)
    assert back.var("Phi[3]")[0] > 0


def test_cli_deep_errors_and_derive_in_process(capsys, monkeypatch):
    from dmftc.cli import main

    monkeypatch.chdir(ROOT)
    assert main(["run", "specs/deep_tanh.dmft", "--set", "L=1.5", "-q"]) == 2
    assert "integer" in capsys.readouterr().err
    assert main(["derive", "specs/deep_tanh.dmft"]) == 0
    out = capsys.readouterr().out
    assert "Price-theorem term" in out and "c0_z(t, s) = B[l+1](t, s)" in out


def test_action_form_derives_the_direct_form(tmp_path):
    """specs/deep_tanh.dmft states the action; tests/specs/deep_tanh_direct.dmft the averages it implies.  Both
    compile to the same module (up to the spec path and hash, and SOURCE_POS: where each part sits in its own
    text), and `dmftc derive` prints the derived equations."""
    from dmftc.compiler import generate

    direct = (Path(__file__).resolve().parent / "specs" / "deep_tanh_direct.dmft").read_text()
    action = (ROOT / "specs" / "deep_tanh.dmft").read_text()
    assert "action:" in action and "action:" not in direct
    strip = lambda text: [ln for ln in text.splitlines()  # noqa: E731
                          if "sha256" not in ln.lower() and not ln.startswith("SOURCE_POS = ")]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "deep_tanh.dmft").write_text(action)
    (tmp_path / "b" / "deep_tanh.dmft").write_text(direct)
    a, b = generate(tmp_path / "a" / "deep_tanh.dmft"), generate(tmp_path / "b" / "deep_tanh.dmft")
    assert strip(a) == strip(b) and len(strip(a)) == len(a.splitlines()) - 3   # two hash lines, SOURCE_POS
    model = check(parse(action, "specs/deep_tanh.dmft"))
    text = {f"{f.name}({f.time}{', ' + f.time2 if f.time2 else ''})": f for f in model.from_action}
    assert set(text) == {"Phi(t, s)", "G(t, s)", "A(t, s)", "B(t, s)", "K(t)", "Delta(t)"}
    out = format_deep_derivation(derive(model))
    for line in ("Phi[l](t, s) = E[phi(h[l](t)) phi(h[l](s))]", "B[l](t, s) = E[d g[l](t) / d u[l](s)]",
                 "A[l](t, s) = E[d phi(h[l](t)) / d r[l](s)]", "K(t) = sum(l = 0..L: G[l+1](t, t) Phi[l](t, t))",
                 "Delta(t) = y - (E[z[L](t) phi(h[L](t))] - E[z[L](0) phi(h[L](0))]) / gamma"):
        assert line in out, out


def test_propagator_reads_the_action_at_any_parameter_scale(tmp_path):
    """deep_model.from_spec checks that the responses enter the couplings additively by derivatives (the coupling's
    Jacobian in the response rows is the identity), which holds at any scale of the other terms: at eta = 1e50 a
    difference quotient lost the response against terms of 1e51 and refused the standard network.  A spec that
    scales the response is refused earlier, at compile time, with its location (the action then pairs the
    responses differently)."""
    from dmftc.errors import StructureSpecError
    from dmftc.runtime.problem.deep_model import from_spec
    from dmftc.runtime.engines.deep_spec import resolve_deep_params

    mod = dmftc.load(ROOT / "specs" / "deep_tanh.dmft").module
    model = from_spec(mod, resolve_deep_params(mod, dict(gamma=10.0, eta=1e50))[0])
    assert model.k_h(np.ones((2, 2)), np.ones((1, 2))).max() > 1e50
    text = (ROOT / "specs" / "deep_tanh.dmft").read_text()
    old = "sum(s < t: A[l-1](t, s) g[l](s))"
    assert old in text
    spec = tmp_path / "scaled_response.dmft"
    spec.write_text(text.replace(old, "sum(s < t: 2 * A[l-1](t, s) g[l](s))"))
    with pytest.raises(StructureSpecError, match="response 'B' must be") as err:
        dmftc.load(spec, tmp_path / "gen")
    assert "scaled_response.dmft:" in str(err.value) and "^" in str(err.value)


def test_spec_activation_is_keyed_by_the_parameters_it_reads(tmp_path):
    """The spec's activation (and so every program compiled for it, e.g. the propagator's per-path sums) is keyed
    by the parameters phi and the gradient field read: a gamma sweep reuses them, another slope does not, and
    the slope reaches the numbers."""
    from dmftc.runtime.march.deep_dmft import SpecKernels

    text = (Path(__file__).resolve().parent.parent / "specs" / "deep_tanh.dmft").read_text()
    text = text.replace("activation phi(h) = tanh(h)", "activation phi(h) = tanh(beta * h)").replace(
        'param y = 1.0 "training target"', 'param y = 1.0 "training target"\nparam beta = 1.5 "slope"')
    (tmp_path / "slope.dmft").write_text(text)
    mod = dmftc.load(tmp_path / "slope.dmft", tmp_path / "gen").module
    assert mod.ACTIVATION_PARAMS == ("beta",)
    spec = SpecKernels(mod)
    key = lambda **p: spec.site_activation(mod.defaults(p), 0.0).key        # noqa: E731
    assert key(gamma=1.0) == key(gamma=2.0) and key(beta=1.5) != key(beta=0.5)
    h = np.linspace(-2, 2, 5)
    np.testing.assert_allclose(np.asarray(spec.site_activation(mod.defaults({"beta": 0.5}), 0.0).fn(h)[0]),
                               np.tanh(0.5 * h), rtol=1e-15)


def test_standard_module_disk_cache(tmp_path, monkeypatch):
    """The standard network's generated module is kept on disk, keyed by the spec text and the compiler's sources:
    a fresh process (here: an emptied in-process table) imports the kept module, whose code is the one a compile
    writes; another activation, or an incomplete entry, compiles; DMFTC_JAX_CACHE=0 keeps nothing."""
    from dmftc.compiler import generate
    from dmftc.runtime.problem import standard_spec as std

    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)   # (the suite's own JAX cache turns it off)
    monkeypatch.setenv("DMFTC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(std, "_MODULES", {})
    first = std.standard_module("sin(h)")
    entries = sorted(tmp_path.glob("standard-*/*.py"))
    assert len(entries) == 1 and not first.SPEC_FILE.is_relative_to(tmp_path)
    monkeypatch.setattr(std, "_MODULES", {})
    again = std.standard_module("sin(h)")
    assert again.SPEC_FILE.is_relative_to(tmp_path) and again.SPEC_FILE.read_text() == std.standard_text("sin(h)")
    assert entries[0].read_text() == generate(first.SPEC_FILE)           # the compiler's output, kept as it was
    assert again.SITE == first.SITE and again.KINK_ORDER == first.KINK_ORDER
    monkeypatch.setattr(std, "_MODULES", {})
    std.standard_module("cos(h)")
    assert len(sorted(tmp_path.glob("standard-*/*.py"))) == 2
    entries[0].unlink()                                  # an incomplete entry: compiled and kept again
    monkeypatch.setattr(std, "_MODULES", {})
    assert not std.standard_module("sin(h)").SPEC_FILE.is_relative_to(tmp_path) and entries[0].exists()
    monkeypatch.setenv("DMFTC_JAX_CACHE", "0")
    monkeypatch.setattr(std, "_MODULES", {})
    assert std._cached("x", "text") is None and not std.standard_module("sin(h)").SPEC_FILE.is_relative_to(tmp_path)
