"""Issue 12, one engine: a two-layer spec lowered to the single-site program of the deep engine
(dmftc.derive.site_lowering: one layer, constant-in-time sources, every order parameter a readout) marches to
the same saddle as the two-layer engine (dmftc.reference.two_layer_engine), and its propagator by autodiff of the march
(dmftc.runtime.engines.site_engine) is the two-layer engine's, on the same source draws, to round-off."""
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import dmftc
from dmftc.errors import StructureSpecError
from dmftc.runtime.problem.params import resolve_params
from dmftc.runtime.numerics import kernels as _k
from dmftc.reference import two_layer_engine as engine
from dmftc.reference.two_layer_kernels import load as reference_module, place_sources
from dmftc.runtime.numerics.geometry import Geometry
from dmftc.runtime.engines.site_engine import two_layer_propagator, two_layer_saddle
from dmftc.reference.two_layer_engine import saddle_on_draws
from models import source_draws

ROOT = Path(__file__).resolve().parent.parent
TWO_LAYER = (ROOT / "specs" / "two_layer.dmft").read_text()
# One number of steps (T = 15) and of paths for every round-off comparison of a spec: XLA compiles a program per
# (spec, steps, paths), so tests of one spec at the same sizes share its compiled marches.
PATHS = 200


def _variant_path(tmp_path, name, text):
    path = tmp_path / f"{name}.dmft"
    path.write_text(text.replace("model two_layer ", f"model {name} ", 1))
    return path


def _pair(path, out_dir=None):
    """The generated module the solver runs and the reference engine's module (its own two-layer kernels)."""
    return dmftc.load(path, out_dir=out_dir).module, reference_module(path)


def _variant(tmp_path, name, text):
    return _pair(_variant_path(tmp_path, name, text), tmp_path / "generated")


def _assert_same_saddle(pair, params, S=PATHS, seed=0):
    mod, ref = pair
    p, sz, T = resolve_params(mod, params, dirac_width=0.1)
    draws = source_draws(mod, p, sz, S, seed)
    want = saddle_on_draws(ref, draws, **params)
    got = two_layer_saddle(mod, draws, p, sz, T)
    assert set(got) == set(want)
    for k in want:
        w, g = np.asarray(want[k]), np.asarray(got[k])
        scale = max(np.abs(w).max(), 1e-300)
        assert np.abs(w - g).max() <= 1e-12 * scale, (k, np.abs(w - g).max() / scale)
        assert np.ptp(w) > 1e-3 * scale or k == "Delta"                 # trajectories that move: not a 0 == 0 check


@pytest.mark.parametrize("spec, params", [
    ("two_layer", dict(T=15, gamma=1.0)),
    ("two_layer", dict(T=15, gamma=2.5, y=-0.7, kx=-0.3, eta=0.05)),
    ("rates", dict(T=15, gamma=0.5, y=-1.2)),
    ("eos", dict(T=15, gamma=3.0)),
])
def test_shipped_specs_march_to_the_two_layer_saddle(spec, params):
    _assert_same_saddle(_pair(ROOT / "specs" / f"{spec}.dmft"), params, seed=len(params))


@pytest.mark.parametrize("act", ["sqrt(2) * max(0, h)", "erf(h)", "sin(h) + 0.1 * h"])
def test_other_activations(tmp_path, act):
    """Activations and a spec nobody shipped: relu (a kink: the saddle needs no derivative of it), erf, sin."""
    pair = _variant(tmp_path, "site_two_layer_act", TWO_LAYER.replace("activation phi(h) = tanh(h)",
                                                                      f"activation phi(h) = {act}"))
    _assert_same_saddle(pair, dict(T=15, gamma=1.5, y=-0.5), seed=3)


def test_order_running_sums_and_same_time_constraints():
    """Error updates through the NTK: running sums of order parameters (integral(K(s) Delta(s), s < t))."""
    _assert_same_saddle(_pair(ROOT / "tests" / "specs" / "two_layer_ntk.dmft"), dict(T=15, gamma=0.7), seed=5)


MULTI = (ROOT / "specs" / "two_layer_multi.dmft").read_text()


def _gram(P, seed):
    x = np.random.default_rng(seed).standard_normal((P, 8))
    return x @ x.T / 8


@pytest.mark.parametrize("spec, params", [
    ("specs/two_layer_multi.dmft", dict(T=15, gamma=0.5)),
    ("specs/linear_whitened.dmft", dict(T=15, P=3, gamma=1.5)),
    ("specs/online_linear.dmft", dict(T=15, D=3, gamma=0.8)),
])
def test_sample_axes(spec, params):
    """Sample axes (h[mu], K[mu, nu], sums over nu inside the causal integrals) lowered to the layout
    (paths, one axis per index, time)."""
    _assert_same_saddle(_pair(ROOT / spec), params, seed=11)


def test_sample_axes_random_gram_both_signs():
    """Relu on P = 3 points with a random Gram matrix and targets of both signs, rich training."""
    _assert_same_saddle(_pair(ROOT / "specs" / "two_layer_multi.dmft"), dict(T=15, P=3, gamma=1.0, Kx=_gram(3, 2), y=np.array([1.0, -0.5, 0.8])), seed=4)


def test_no_program():
    """A module without a single-site program gets a clear error."""
    from types import SimpleNamespace

    with pytest.raises(StructureSpecError, match="no single-site program"):
        two_layer_saddle(SimpleNamespace(SITE=None, SPEC_PATH="x.dmft"), [], {}, {}, 3)


def _two_layer_engine_sigma(mod, draws, params, dirac_width=0.1, full=False):
    """One sample group of the two-layer engine (``mod``: a reference module) on exactly these draws: its
    propagator (``full``: sigma, U, kappa and the condition number)."""
    p, sz, T = resolve_params(mod, params, dirac_width=dirac_width)
    geo = Geometry(mod, sz)
    S = place_sources(mod, [jnp.asarray(x) for x in draws])
    pj = {k: jnp.asarray(v, dtype=jnp.float64) for k, v in p.items()}
    q, Rq, avg = engine._saddle_march(mod, geo, S, pj, sz, T)
    kappa, D = engine._moments(mod, geo, S, q, avg, pj, sz, T, len(draws[0]))
    U0 = engine.explicit_jacobian(mod, geo, {k: np.asarray(v) for k, v in q.items()},
                                  {k: np.asarray(v) for k, v in Rq.items()}, p, sz, T)
    out = engine.propagator(U0, kappa, D, geo, T)
    return out if full else out[0]


@pytest.mark.parametrize("spec, params", [
    ("specs/two_layer.dmft", dict(T=15, gamma=1.5, y=-0.6, kx=0.4)),
    ("specs/linear_whitened.dmft", dict(T=15, P=3, gamma=1.2)),
    ("specs/two_layer_multi.dmft", dict(T=15, P=3, gamma=0.7, Kx=_gram(3, 5), y=np.array([0.9, -1.1, 0.4]))),
    ("specs/rates.dmft", dict(T=15, gamma=0.5)),
    ("specs/eos.dmft", dict(T=15, gamma=2.0, eta=0.1)),
    ("tests/specs/two_layer_ntk.dmft", dict(T=15, gamma=0.8)),
])
def test_propagator_is_the_two_layer_engine(spec, params):
    """Sigma = U^-1 kappa U^-T with U = 1 - dF/dq by autodiff of the march (explicit couplings, same-time
    constraints and D at once) equals the two-layer engine's symbolic tangents, same paths, to round-off."""
    _assert_same_propagator(_pair(ROOT / spec), params, 0.1)


@pytest.mark.parametrize("width", [0.1, 0.03, 0.0])
def test_relu_kink_is_the_mollified_delta(width):
    """Relu: the program prints phi' = Heaviside as kernels.step, whose derivative is the delta function as a
    Gaussian of the solve's width, so autodiff of the march differentiates the kink as the two-layer engine's
    symbolic tangents do (at width 0 both drop it)."""
    _assert_same_propagator(_pair(ROOT / "specs" / "two_layer_multi.dmft"), dict(T=15, P=3, gamma=1.0, Kx=_gram(3, 8), y=np.array([-0.8, 1.0, 0.3])), width)


def _assert_same_propagator(pair, params, width):
    mod, ref = pair
    p, sz, T = resolve_params(mod, params, dirac_width=width)
    draws = source_draws(mod, p, sz, PATHS, 7)
    got = two_layer_propagator(mod, draws, p, sz, T)
    want = _two_layer_engine_sigma(ref, draws, params, width)
    scale = np.abs(want).max()
    assert np.abs(got["sigma"] - want).max() <= 1e-12 * scale, np.abs(got["sigma"] - want).max() / scale
    assert np.abs(np.diag(want)).max() > 1e-3 * scale           # the variances are resolved, not 0 == 0
    assert np.allclose(np.triu(got["U"], 1), 0)                  # causal: U lower triangular in time


@pytest.mark.parametrize("spec, params, width", [
    ("specs/rates.dmft", dict(T=15, gamma=0.7, y=-1.0), 0.1),
    ("tests/specs/two_layer_ntk.dmft", dict(T=15, gamma=1.2), 0.1),
    ("specs/two_layer_multi.dmft", dict(T=15, P=3, gamma=1.0, Kx=_gram(3, 9), y=np.array([0.7, -0.9, 0.2])), 0.0),
])
def test_mean_correction_is_the_two_layer_engine(spec, params, width):
    """The O(1/N) mean correction m1 through the site march (the per-path marches differentiated to second order,
    the constraints' solutions to second order) equals the two-layer engine's, same paths, to round-off: an
    order parameter defined at the same time (rates), running sums of order parameters (NTK update), relu on
    sample axes.  Relu at dirac width 0: the two-layer engine's m1 differentiates its march pathwise (the delta
    of phi'' dropped, as its solutions say), where the site program's kernels.step brings the mollified delta at
    a positive width (then the two differ: 39% of m1's peak on this case, measured)."""
    from dmftc.reference.two_layer_mean_correction import mean_correction_group

    mod, ref = _pair(ROOT / spec)
    p, sz, T = resolve_params(mod, params, dirac_width=width)
    draws = source_draws(mod, p, sz, PATHS, 13)
    got = two_layer_propagator(mod, draws, p, sz, T, correction=True)["m1"]
    mod = ref
    geo = Geometry(mod, sz)
    S = place_sources(mod, [jnp.asarray(x) for x in draws])
    pj = {k: jnp.asarray(v, dtype=jnp.float64) for k, v in p.items()}
    q, Rq, avg = engine._saddle_march(mod, geo, S, pj, sz, T)
    kappa, D = engine._moments(mod, geo, S, q, avg, pj, sz, T, len(draws[0]))
    qn = {k: np.asarray(v) for k, v in q.items()}
    U0 = engine.explicit_jacobian(mod, geo, qn, {k: np.asarray(v) for k, v in Rq.items()}, p, sz, T)
    U = engine.propagator(U0, kappa, D, geo, T)[1]
    want = mean_correction_group(mod, geo, S, qn, U, p, sz, T)
    scale = np.abs(want).max()
    assert scale > 0
    assert np.abs(got - want).max() <= 1e-10 * scale, np.abs(got - want).max() / scale


@pytest.mark.parametrize("spec, params", [
    ("specs/linear_whitened.dmft", dict(T=15, P=3, gamma=1.3)),
    ("specs/eos.dmft", dict(T=15, gamma=2.0, eta=0.1)),
    ("specs/online_linear.dmft", dict(T=15, D=3, gamma=0.7)),
])
def test_exact_backend_is_the_two_layer_engine(spec, params):
    """Linear specs without sampling: the march on the 2n points +-sqrt(n) e_i (exact averages of quadratics)
    and Isserlis on one path's gradient and Hessian in the sources give the two-layer exact backend's saddle
    and propagator to round-off."""
    from dmftc.reference.two_layer_exact import exact_moments
    from dmftc.runtime.engines.site_engine import two_layer_exact

    mod, ref = _pair(ROOT / spec)
    assert mod.NONLINEAR is None
    p, sz, T = resolve_params(mod, params, dirac_width=0.1)
    got = two_layer_exact(mod, p, sz, T)
    mod = ref
    geo = Geometry(mod, sz)
    q, Rq, kappa, D = exact_moments(mod, geo, p, sz, T)
    U0 = engine.explicit_jacobian(mod, geo, {k: np.asarray(v) for k, v in q.items()},
                                  {k: np.asarray(v) for k, v in Rq.items()}, p, sz, T)
    want = engine.propagator(U0, kappa, D, geo, T)[0]
    scale = np.abs(want).max()
    assert np.abs(np.diag(want)).max() > 1e-3 * scale
    assert np.abs(got["sigma"] - want).max() <= 1e-10 * scale, np.abs(got["sigma"] - want).max() / scale
    qe = {k: np.moveaxis(_k.canonical(np.asarray(v), tuple(a + 1 for a in mod.STORED_AXES[k])), 0, -1)
          for k, v in q.items()}
    for k in qe:
        assert np.abs(got["q"][k] - qe[k]).max() <= 1e-12 * max(np.abs(qe[k]).max(), 1.0), k


def test_derive_prints_the_program():
    """`dmftc derive` of a two-layer spec ends with the single-site program the site engine runs."""
    from dmftc.compiler import front_end
    from dmftc.derive.report import format_derivation

    text = format_derivation(front_end(ROOT / "specs" / "two_layer_multi.dmft")[1])
    program = text[text.index("single-site program (one layer l"):]
    assert "sources constant in time: u[mu], r;  array axes (paths, mu, nu, time)" in program
    assert "g[l](t, mu) = sqrt(2)*z[l](t)*Heaviside(h[l](t, mu))" in program
    assert "running sum _I1[mu](t + 1) = _I1[mu](t) + eta*sum(nu: Delta(t, nu)*g[l](t, nu)*Kx[mu, nu])" in program
    assert "readout -E_K + K[mu, nu](t) = 0" in program


def test_compiled_model_saddle_on_draws_runs_the_program():
    """CompiledModel.saddle_on_draws (the common-random-number reference of dmftc.validation.truth) marches the
    single-site program: the two-layer engine's trajectories to round-off, and its errors are kept."""
    m = dmftc.load(ROOT / "specs" / "two_layer_multi.dmft")
    params = dict(T=15, P=3, gamma=0.8, Kx=_gram(3, 21), y=np.array([1.0, -1.0, 0.5]))
    p, sz, T = resolve_params(m.module, params)
    draws = source_draws(m.module, p, sz, PATHS, 2)
    ref = reference_module(ROOT / "specs" / "two_layer_multi.dmft")
    got, want = m.saddle_on_draws(draws, **params), saddle_on_draws(ref, draws, **params)
    for k in want:
        assert np.abs(got[k] - want[k]).max() <= 1e-12 * np.abs(want[k]).max(), k
    with pytest.raises(dmftc.errors.ParameterError, match="source groups"):
        m.saddle_on_draws(draws[:1], **params)
    with pytest.raises(dmftc.errors.ParameterError, match="dirac_width"):
        m.saddle_on_draws(draws, dirac_width=-1.0, **params)


def test_abs_activation_propagator(tmp_path):
    """|h| (phi' = sign, phi'' = 2 delta): the program's functions are real-valued, so SymPy differentiates |h| to
    sign(h) and sign to a delta (tests/test_fuzz.py regressions: a complex derivative broke compilation)."""
    path = tmp_path / "abs_multi.dmft"
    path.write_text(MULTI.replace("sqrt(2) * max(0, h)", "abs(h)").replace("model two_layer_multi ", "model abs_multi "))
    pair = _pair(path, tmp_path / "generated")
    assert pair[0].SITE is not None
    _assert_same_propagator(pair, dict(T=15, P=3, gamma=1.0, Kx=_gram(3, 4), y=np.array([0.5, -1.0, 0.2])), 0.1)


@pytest.mark.parametrize("spec, params, batch, segments", [
    ("tests/specs/two_layer_ntk.dmft", dict(T=15, gamma=1.1, y=-0.8), 7, 1),
    ("tests/specs/two_layer_ntk.dmft", dict(T=15, gamma=1.1, y=-0.8), None, 3),
    ("specs/two_layer_multi.dmft", dict(T=15, P=3, gamma=0.8, Kx=_gram(3, 4), y=np.array([0.5, -1.0, 0.9])), 64, 5),
])
def test_batches_and_causal_pieces_of_the_tangent_march_add_up(spec, params, batch, segments):
    """The driving directions' tangents marched in batches of paths (the last one padded with zero-weight
    rows; the constraints' explicit dependence on q counted in one batch only) and in causal pieces (each
    carrying only the directions already reached) give the Jacobian of the whole group in one piece: running
    sums of order parameters (NTK update) and sample axes."""
    mod = dmftc.load(ROOT / spec).module
    p, sz, T = resolve_params(mod, params, dirac_width=0.1)
    draws = source_draws(mod, p, sz, PATHS, 17)
    whole = two_layer_propagator(mod, draws, p, sz, T, segments=1)
    parts = two_layer_propagator(mod, draws, p, sz, T, batch=batch, segments=segments)
    for k in ("U", "sigma"):
        scale = np.abs(whole[k]).max()
        assert np.abs(parts[k] - whole[k]).max() <= 1e-12 * scale, (k, np.abs(parts[k] - whole[k]).max() / scale)
    assert np.abs(np.tril(whole["U"], -1)).max() > 1e-3          # couplings across time, not only the diagonal


def test_solve_is_the_two_layer_engine_group_by_group(tmp_path):
    """The user's solve (dmftc.runtime.engines.site_solve) on the draws it samples, cut into unequal groups (one padded
    to the other's size), equals the two-layer engine run group by group on the same draws: means, sigma, its
    standard error, and U and kappa in the spec's own form, here with a coefficient 2 in K's constraint
    (2 K = <phi^2 + g^2>), which the engine's solved form divides out."""
    from dmftc.runtime.engines.site_solve import sample_draws

    text = TWO_LAYER.replace("hat K(t) K(t)", "hat K(t) 2 K(t)")
    assert text != TWO_LAYER
    path = _variant_path(tmp_path, "site_two_layer_coeff", text)
    model = dmftc.load(path, out_dir=tmp_path / "generated")
    mod, ref = model.module, reference_module(path)
    assert mod.coefficients({}, {})["K"] == 2.0
    params = dict(T=15, gamma=1.3, y=-0.7, kx=-0.4)
    sol = model.solve(samples=301, groups=2, seed=4, backend="mc", **params)
    p, sz, T = resolve_params(mod, dict(params), dirac_width=0.1)
    draws = sample_draws(mod, p, sz, 301, 4)
    edges = np.linspace(0, 301, 3).astype(int)
    groups = [_two_layer_engine_sigma(ref, [d[a:b] for d in draws], params, full=True)
              for a, b in zip(edges[:-1], edges[1:])]
    means = [saddle_on_draws(ref, [d[a:b] for d in draws], **params) for a, b in zip(edges[:-1], edges[1:])]
    for got, want in [(sol.blocks.sigma_full, np.mean([g[0] for g in groups], axis=0)),
                      (sol.blocks.U_full, np.mean([g[1] for g in groups], axis=0)),
                      (sol.blocks.kappa_full, np.mean([g[2] for g in groups], axis=0)),
                      (sol.blocks.var_se_flat, np.std([np.diag(g[0]) for g in groups], axis=0, ddof=1) / np.sqrt(2))]:
        scale = np.abs(want).max()
        assert scale > 0 and np.abs(got - want).max() <= 1e-10 * scale, np.abs(got - want).max() / scale
    for k in sol.means:
        want = np.mean([m[k] for m in means], axis=0)
        assert np.abs(sol.mean(k) - want).max() <= 1e-12 * np.abs(want).max(), k


def test_kinked_mean_correction_says_it_is_smoothed():
    """m1 of a relu spec takes the kink's delta functions as Gaussians of the solve's width: the solution says
    so (and by which width); a smooth spec's does not."""
    relu = dmftc.load(ROOT / "specs" / "two_layer_multi.dmft")
    sol = relu.solve(samples=64, groups=2, T=6, P=2, gamma=0.5, correction=True, dirac_width=0.05)
    note = sol.info["mean_correction"]["approximation"]
    assert "delta functions" in note and "width 0.05" in note and "not estimated" in note
    smooth = dmftc.load(ROOT / "specs" / "two_layer.dmft").solve(samples=64, groups=2, T=6, correction=True)
    assert "approximation" not in smooth.info["mean_correction"]


def test_reference_kernels_sit_beside_the_generated_module():
    """The oracle's module (dmftc.reference.two_layer_kernels.load) is the generated module's text followed by the
    former engine's kernels: the same metadata and program as the module the solver runs, which has no kernels."""
    mod, ref = _pair(ROOT / "specs" / "two_layer_multi.dmft")
    assert ref.SITE == mod.SITE and ref.ORDERS == mod.ORDERS and ref.SOURCES == mod.SOURCES
    assert all(ref.STORED_AXES[k] == v for k, v in mod.STORED_AXES.items())
    assert callable(ref.tangents_Delta) and callable(ref.past_factors) and not hasattr(mod, "fields")
    assert reference_module(ROOT / "specs" / "two_layer_multi.dmft") is ref
    with pytest.raises(TypeError, match="not a two-layer spec"):
        reference_module(ROOT / "specs" / "deep_tanh.dmft")
