"""The deep propagator's per-path derivatives come from the spec's own program (dmftc.runtime.sensitivities.site_local: local
derivatives by JAX of the generated site functions; dmftc.runtime.sensitivities.site_moments: the implicit-function sums).  They
are checked here against the hand-written closed forms of the standard two-field network
(dmftc.reference.site_moments_closed) on the same paths, where the autodiff reference of
tests/test_deep_propagator.py does not reach: a kink in phi'' (delta functions through the activation's
derivatives), several training points folded into time, and Gaussian integration by parts of the Price blocks."""
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dmftc
from dmftc.reference.site_moments_closed import ClosedFormMoments
from dmftc.runtime.numerics import kernels as K
from dmftc.runtime.problem.deep_action import Layout, gather_local, split_local, saddle_point_vector
from dmftc.runtime.march.deep_dmft import SpecKernels
from dmftc.runtime.problem.deep_model import from_spec
from dmftc.runtime.engines.deep_propagator import mc_saddle
from dmftc.runtime.engines.deep_spec import resolve_deep_params
from dmftc.runtime.sensitivities.local_estimator import local_couplings, estimator
from dmftc.runtime.sensitivities.price_by_parts import stein_plan
from dmftc.runtime.sensitivities.site_local import local_map

SPECS = Path(__file__).resolve().parent.parent / "specs"
NAMES = ("F", "residual", "g", "f", "ff", "Jf", "Ha", "Pc", "Pe", "Sf", "Sc")


def _spec(tmp_path, text, **given):
    f = tmp_path / "case.dmft"
    f.write_text(text)
    mod = dmftc.load(str(f), tmp_path / "generated").module
    p, _, _ = resolve_deep_params(mod, given)
    return SpecKernels(mod).site_activation(p, 0.1), from_spec(mod, p)


def _assert_program_sums_equal_closed_forms(act, model, *, L, T, points=1, S=48, seed=3):
    xi = np.random.default_rng(seed).standard_normal((2, L, S, T))
    sad, fields = mc_saddle(activation=act, L=L, T=T, xiu=xi[0], xir=xi[1], model=model, points=points)
    model, lay, x0 = sad.model, Layout(L, T), saddle_point_vector(sad)
    for l in range(1, L + 1):
        v, _ = gather_local(jnp.asarray(x0), lay, l, phi0=model.phi0, g_top=model.g_top)
        est = estimator(T, act, l > 1, l < L, None, points)
        C, E, _ = (np.asarray(a) for a in local_couplings(jnp.asarray(v), T, model))
        feature = model.features() if l == L else (0.0, 0.0)
        Z = stein_plan(split_local(np.asarray(v), T)[0], T, 1e-2)[0] if l > 1 else None
        args = (C, E, fields.w[l - 1], fields.x[l - 1])
        ours = est._site.moments(*args, feature=feature, stein=Z)
        ref = ClosedFormMoments(T=T, activation=act, pa=est.pa, pb=est.pb, anti=est.anti, points=points).moments(
            *args, feature=feature, stein=Z)
        assert len(ours) == len(ref) == (11 if Z is not None else 9)
        for name, a, b in zip(NAMES, ours, ref):
            a, b = np.asarray(a), np.asarray(b)
            assert a.shape == b.shape, (l, name)
            if name == "residual":
                assert a < 1e-24 * S and b < 1e-24 * S
                continue
            scale = np.abs(b).max()
            if name not in ("Pc", "Pe") or est.vary_u or l < L:      # every block that exists is exercised
                assert scale > 1e-3 or b.size == 0, (l, name)
            assert np.abs(a - b).max() <= 1e-12 * max(scale, 1e-300), (l, name, np.abs(a - b).max(), scale)


def test_local_map_reads_the_program(tmp_path):
    """The x-fields, the outputs the couplings read and the kernels come from SITE, in the spec's own names."""
    text = (SPECS / "deep_tanh.dmft").read_text()
    for old, new in (("h", "a"), ("z", "b"), ("g", "q")):
        text = re.sub(rf"\b{old}\[", f"{new}[", text)
    act, _ = _spec(tmp_path, text)
    lm = local_map(act)
    assert lm.xfields == ("a", "b")
    assert lm.outputs == ("q[l](s)", "phi(a[l](s))")
    assert lm.kinds == (("C", 0, 0), ("E", 1, 1))
    X = jnp.asarray(np.random.default_rng(0).standard_normal((5, 2)))
    y, Y1, Y2, Y3 = lm.output_tensors(X)
    h, z = X[:, 0], X[:, 1]
    p = act.fn(h)
    np.testing.assert_allclose(y, np.stack([p[1] * z, p[0]], axis=1), rtol=1e-14)
    np.testing.assert_allclose(Y3[:, 0, 0, 0, 0], p[4] * z, rtol=1e-14)        # d^3 (phi'(h) z) / dh^3
    np.testing.assert_allclose(Y3[:, 0, 0, 0, 1], p[3], rtol=1e-14)
    assert np.all(Y2[:, :, 1, 1] == 0) and np.all(Y2[:, 1, 1, :] == 0)      # g linear in z; phi(h) free of z


def test_kink_helpers_differentiate_as_distributions():
    """abs, sign, max and min of a deep program: the values of jnp, derivatives with the mollified delta
    functions of the symbolic derivation (abs'' = 2 delta), and pathwise (no delta) at width 0."""
    x = jnp.linspace(-0.4, 0.4, 9) + 0.013
    w = 0.1
    d2abs = jax.vmap(jax.grad(jax.grad(lambda v: K.kabs(v, w))))(x)
    np.testing.assert_allclose(d2abs, 2 * K.dirac(x, w), rtol=1e-14)
    d1max = jax.vmap(jax.grad(lambda v: K.kmax(v, 0.3 * v ** 2, w)))(x)
    np.testing.assert_allclose(d1max, np.where(x > 0.3 * x ** 2, 1.0, 0.6 * x), rtol=1e-14)
    d2min = jax.vmap(jax.grad(jax.grad(lambda v: K.kmin(0.0, v, w))))(x)      # min(0, x)'' = -delta(x)
    np.testing.assert_allclose(d2min, -K.dirac(x, w), rtol=1e-14)
    for f in (lambda v: K.kabs(v, 0.0), lambda v: K.kmax(0.0, v, 0.0)):
        assert np.all(jax.vmap(jax.grad(jax.grad(f)))(x) == 0)
    np.testing.assert_array_equal(K.kabs(x, w), jnp.abs(x))
    np.testing.assert_array_equal(K.kmax(x, -x, w), jnp.maximum(x, -x))


def test_program_derivatives_of_a_kinked_activation_equal_the_closed_forms(tmp_path):
    """Softsign h / (1 + |h|) (phi''' holds -4 delta(h)): the sums from the program's derivatives (act(k)' =
    act(k + 1)) equal the closed forms to round-off, for both layer kinds of L = 2 (the first layer's backward
    source varies, the last layer's forward source, with the Stein sums; the middle layer of L = 3 is the tanh
    case of tests/test_deep_propagator.py)."""
    text = (SPECS / "deep_tanh.dmft").read_text().replace("tanh(h)", "h / (1 + abs(h))")
    act, model = _spec(tmp_path, text, gamma=1.2, y=-0.8, eta=0.3)
    assert act.kink_order == 3
    _assert_program_sums_equal_closed_forms(act, model, L=2, T=3)


@pytest.mark.parametrize("case", ["points", pytest.param("surrogate", marks=pytest.mark.slow)])
def test_program_derivatives_equal_the_closed_forms(tmp_path, case):
    """On P = 2 training points folded into time (deep_multi, a random Gram matrix, targets of both signs), and
    (slow) for a surrogate gradient field with a parameter: the program's sums equal the closed forms."""
    if case == "points":
        rng = np.random.default_rng(4)
        X = rng.standard_normal((2, 5))
        act, model = _spec(tmp_path, (SPECS / "deep_multi.dmft").read_text(), P=2, Kx=X @ X.T / 5,
                           y=np.array([0.6, -0.9]), gamma=1.1, eta=0.2)
        _assert_program_sums_equal_closed_forms(act, model, L=2, T=4, points=2)
    else:
        text = (SPECS / "deep_tanh.dmft").read_text().replace(
            "g[l](t) = phi'(h[l](t)) z[l](t)", "g[l](t) = z[l](t) / (1 + gamma * h[l](t)^2) + 0.3 * sin(h[l](t))")
        act, model = _spec(tmp_path, text, gamma=0.7, y=0.9, eta=0.3)
        _assert_program_sums_equal_closed_forms(act, model, L=3, T=3)


def test_chunks_fit_the_paths_and_change_no_sum(tmp_path):
    """dmftc.runtime.sensitivities.site_moments.chunk_rows: as few chunks as the cap allows, each at most the cap, and at most
    about twice the paths' rows in all (a power of two per chunk); the sums over fitted chunks (here one chunk
    of 64 rows for 48 paths) equal those over fixed chunks of 16 rows to round-off."""
    from dmftc.runtime.sensitivities.site_moments import chunk_rows

    for most in (4, 37, 232, 512):
        for S in range(1, 1500, 7):
            c = chunk_rows(S, most)
            n = -(-S // c)
            assert c <= most and n == -(-S // most), (S, most, c)
            assert n * c < 2 * (S + n - 1) or c == most, (S, most, c)
    act, model = _spec(tmp_path, (SPECS / "deep_tanh.dmft").read_text(), gamma=0.8, y=-0.6, eta=0.2)
    L, T, S = 2, 4, 48
    xi = np.random.default_rng(5).standard_normal((2, L, S, T))
    sad, fields = mc_saddle(activation=act, L=L, T=T, xiu=xi[0], xir=xi[1], model=model)
    v, _ = gather_local(jnp.asarray(saddle_point_vector(sad)), Layout(L, T), 2, phi0=sad.model.phi0,
                        g_top=sad.model.g_top)
    C, E, _ = (np.asarray(a) for a in local_couplings(jnp.asarray(v), T, sad.model))
    args = (C, E, fields.w[1], fields.x[1])
    fitted = estimator(T, act, True, False, None)._site
    fixed = estimator(T, act, True, False, 16)._site
    assert fitted.fit and chunk_rows(S, fitted.chunk) == 64 and not fixed.fit
    feature = sad.model.features()
    for name, a, b in zip(NAMES, fitted.moments(*args, feature=feature), fixed.moments(*args, feature=feature)):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape, name
        assert np.abs(a - b).max() <= 1e-12 * max(np.abs(b).max(), 1e-300), name
