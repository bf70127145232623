"""The gradient field of a deep spec, g = a(h) z + b(h) (gradient descent: a = phi', b = 0; otherwise e.g. a
surrogate derivative): derived from the spec, printed into its generated module, and used by every numerical
stage (the site march, the propagator's per-path derivatives, the finite-width simulator).

Checked against SymPy (the generated coefficients), against the autodiff reference (the per-path sums on the
same paths, where JAX differentiates a and b itself), and against networks trained with the same backward
signal (means and N Var).
"""
from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp

import dmftc
from dmftc.runtime.march.deep_dmft import SpecKernels
from dmftc.runtime.problem.deep_model import from_spec
from models import assert_site_moments_equal_autodiff  # noqa: E402  (tests/models.py)

ROOT = Path(__file__).resolve().parent.parent
GD = "g[l](t) = phi'(h[l](t)) z[l](t)"
# a surrogate derivative with an extra term b(h): neither a = phi' nor b = 0
SURROGATE = ("tanh(h)", "g[l](t) = z[l](t) / (1 + h[l](t)^2) + 0.2 * sin(h[l](t))")


def _load(tmp_path, act, gline, name="deep_g"):
    text = (ROOT / "specs" / "deep_tanh.dmft").read_text()
    assert GD in text and "activation phi(h) = tanh(h)" in text
    text = text.replace("activation phi(h) = tanh(h)", f"activation phi(h) = {act}").replace(GD, gline)
    spec = tmp_path / f"{name}.dmft"
    spec.write_text(text)
    return dmftc.load(spec, tmp_path / f"gen_{name}")


def _site(model, **kw):
    p = dict(model.module.defaults({})) | {k: float(v) for k, v in kw.items()}
    return p, SpecKernels(model.module).site_activation(p, 0.0)


def test_generated_gradient_field_is_the_spec_s(tmp_path):
    """The generated gradient() holds a, b and their first three derivatives of the spec's g (SymPy, evaluated
    independently here); the shipped deep_tanh spec's is phi' and 0 (gradient descent)."""
    m = _load(tmp_path, *SURROGATE)
    mod = m.module
    assert mod.STANDARD_GRADIENT is False and mod.LINEAR is False and mod.KINK_ORDER is None
    x = sp.Symbol("x")
    a, b = 1 / (1 + x ** 2), sp.Rational(1, 5) * sp.sin(x)
    want = [sp.lambdify(x, sp.diff(e, x, k)) for e in (a, b) for k in range(4)]
    h = np.linspace(-3, 3, 13)
    got = mod.gradient(jnp.asarray(h), mod.defaults({}), 0.0)
    for k, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(np.asarray(g), w(h) * np.ones_like(h), rtol=1e-13, atol=1e-14, err_msg=str(k))
    from generated import deep_tanh

    assert deep_tanh.STANDARD_GRADIENT is True
    p = deep_tanh.defaults({})
    np.testing.assert_allclose(np.asarray(deep_tanh.gradient(jnp.asarray(h), p, 0.0)[:4]),
                               np.asarray(deep_tanh.activation(jnp.asarray(h), p, 0.0)[1:]), rtol=0, atol=0)
    assert not np.any(np.asarray(deep_tanh.gradient(jnp.asarray(h), p, 0.0)[4:]))


def test_derive_prints_the_gradient_field(tmp_path):
    """`dmftc derive` shows the spec's a and b, and says that this is not gradient descent."""
    from dmftc.derive.deep import derive_deep
    from dmftc.derive.deep_blocks import format_deep_derivation
    from dmftc.frontend.check import check
    from dmftc.frontend.parse import parse

    _load(tmp_path, *SURROGATE)
    text = format_deep_derivation(derive_deep(check(parse((tmp_path / "deep_g.dmft").read_text(), "deep_g.dmft"))))
    assert ("g(t) = a(h(t)) z(t) + b(h(t)),   a = 1/(h(t)^2 + 1),   b = 0.2*sin(h(t))   (not gradient descent"
            in text), text


def test_site_moments_equal_autodiff_for_a_nonstandard_gradient_field(tmp_path):
    """Every per-path sum of dmftc.runtime.sensitivities.site_moments (first, second and third source derivatives, from JAX
    derivatives of the spec's program) equals the autodiff reference, which differentiates the generated a and b
    with JAX inside the whole integrand, on the same paths of the spec's own saddle, for both layer kinds of L = 2 (the
    r-block varying, the u-block varying; the standard network's test covers the middle layer of L = 3)."""
    m = _load(tmp_path, *SURROGATE)
    p, site = _site(m, L=2, T=3, gamma=1.3, y=-0.8, eta=0.4)
    assert_site_moments_equal_autodiff(site, from_spec(m.module, p), L=2)


def _z(theory, theory_se, ens, ens_se):
    d = np.abs(theory - ens)
    return np.where(d > 1e-12, d / np.maximum(np.hypot(theory_se, ens_se), 1e-300), 0.0)


def _compare(sol, truth, names):
    diag = lambda a: a if a.ndim == 1 else np.diagonal(a)  # noqa: E731
    worst = {}
    for n in names:
        zm = _z(diag(sol.mean(n)), diag(sol.mean_stderr(n)), diag(truth.mean[n]), diag(truth.se_mean[n]))
        th, th_se, ens, ens_se = sol.var(n), sol.var_stderr(n), diag(truth.nvar[n]), diag(truth.se_nvar[n])
        zv = _z(th, th_se, ens, ens_se)
        peak = np.abs(ens).max()
        worst[n] = (float(zm.max()), float(zv.max()), float(np.abs(th - ens).max() / peak),
                    float(np.hypot(th_se, ens_se).max() / peak))
    return worst


def test_surrogate_gradient_matches_networks_short(tmp_path):
    """A network trained with the surrogate backward signal (simulate_deep given the spec's activation, which
    carries its g) against the spec's theory, L = 2, T = 4: means and N Var of Delta, K, Phi[l](t,t), G[l](t,t)
    within 4 combined standard errors (N = 128 and 256 extrapolated, E = 6000 each).  Networks trained by
    gradient descent are many standard errors off this theory's G, so the test sees which g was used."""
    from dmftc.validation.deep_ensemble import deep_truth, simulate_deep

    kw = dict(L=2, T=4, eta=0.2, gamma=1.2, y=0.6)
    m = _load(tmp_path, *SURROGATE)
    _, site = _site(m, **kw)
    sol = m.solve(samples=16000, propagator_samples=8192, propagator_groups=8, seed=2, **kw)
    truth = deep_truth(activation=site, N=128, E=6000, seed=9, **kw)
    names = ["Delta", "K", "Phi[1]", "Phi[2]", "G[1]", "G[2]"]
    worst = _compare(sol, truth, names)
    print("surrogate g vs networks (mean z, N Var z, |diff|/peak, se/peak):", worst)
    for n, (zm, zv, _, _) in worst.items():
        assert zm <= 4.0 and zv <= 4.0, (n, worst[n])
    gd = simulate_deep(activation="tanh", N=256, E=2000, seed=9, **kw)
    off = _z(np.diagonal(sol.mean("G[1]")), np.diagonal(sol.mean_stderr("G[1]")),
             np.diagonal(gd.mean["G[1]"]), np.diagonal(gd.se_mean["G[1]"]))
    assert off.max() > 20, off.max()


@pytest.mark.slow
@pytest.mark.parametrize("act, gline, gamma, y", [
    ("tanh(h)", "g[l](t) = z[l](t) / (1 + h[l](t)^2)", 1.0, 0.7),
    ("sin(h)", "g[l](t) = cos(h[l](t)) z[l](t) + 0.25 * sin(h[l](t))", 1.5, -0.6)])
def test_nonstandard_gradient_fields_match_networks(tmp_path, act, gline, gamma, y):
    """Two gradient fields no other test uses, fixed before their first run: a surrogate derivative 1 / (1 + h^2)
    of tanh, and for sin(h) the true derivative plus a term b(h) = 0.25 sin(h), L = 2, T = 10, eta = 0.1 (networks
    trained with the same backward signals, N = 128 and 256 extrapolated, E = 40000 each): means and N Var of
    Delta, K, Phi[l](t,t), G[l](t,t) within 4 combined standard errors pointwise and within 5% of each curve's
    peak, with the power to see a 4% error."""
    from dmftc.validation.deep_ensemble import deep_truth

    kw = dict(L=2, T=10, eta=0.1, gamma=gamma, y=y)
    m = _load(tmp_path, act, gline)
    _, site = _site(m, **kw)
    sol = m.solve(samples=64000, groups=8, propagator_samples=65536, propagator_groups=8, seed=1, **kw)
    truth = deep_truth(activation=site, N=128, E=40000, seed=7, **kw)
    worst = _compare(sol, truth, ["Delta", "K", "Phi[1]", "Phi[2]", "G[1]", "G[2]"])
    print("gradient field vs networks (mean z, N Var z, |diff|/peak, se/peak):", worst)
    for n, (zm, zv, rel, power) in worst.items():
        assert zm <= 4.0 and zv <= 4.0 and rel <= 0.05 and power <= 0.04, (n, worst[n])
    assert sol.info["propagator_stationarity"] < 1e-10
