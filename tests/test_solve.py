"""Runtime: API shapes, argument validation, closed forms, and an autodiff cross-check of D."""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dmftc
from dmftc.errors import NumericalError, ParameterError
from dmftc.reference.two_layer_engine import triangular_sandwich
from dmftc.runtime.solvers.linalg import asymmetry, factor, left_solve, right_solve, sandwich, time_edges, time_major_edges
from dmftc.reference.two_layer_kernels import load as reference_module, place_sources
from dmftc.runtime.numerics.geometry import Geometry
from dmftc.runtime.engines.site_solve import sample_draws

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def two_layer():
    return dmftc.load(ROOT / "specs" / "two_layer.dmft")


@pytest.fixture(scope="module")
def multi():
    return dmftc.load(ROOT / "specs" / "two_layer_multi.dmft")


@pytest.fixture(scope="module")
def sol2(two_layer):
    return two_layer.solve(samples=2000, seed=3, T=30, eta=0.05, gamma=1.5, kx=0.3, backend="mc")


def test_shapes_single_point(sol2):
    T = 30
    assert sol2.times.shape == (T,) and np.isclose(sol2.times[1], 0.05)
    assert sol2.mean("Delta").shape == (T,) and sol2.mean("Delta")[0] == 1.0
    assert sol2.sigma("Delta").shape == (T, T)
    assert sol2.sigma("K", "Delta").shape == (T, T)
    assert sol2.var("K").shape == (T,)
    np.testing.assert_allclose(sol2.var("K"), np.diag(sol2.sigma("K")))
    np.testing.assert_allclose(sol2.sigma("K", "Delta"), sol2.sigma("Delta", "K").T)
    assert sol2.params["kx"] == 0.3 and sol2.params["y"] == 1.0   # default


def test_shapes_multi_sample(multi):
    sol = multi.solve(samples=500, T=8, P=3, Kx=np.eye(3) * 0.6 + 0.4, y=[1.0, -1.0, 0.5], gamma=0.5)
    assert sol.mean("Delta").shape == (3, 8) and sol.mean("K").shape == (3, 3, 8)
    assert sol.sigma("Delta").shape == (3, 8, 3, 8)
    assert sol.sigma("K", "Delta").shape == (3, 3, 8, 3, 8)
    assert sol.var("K").shape == (3, 3, 8)
    np.testing.assert_allclose(sol.mean("Delta")[:, 0], [1.0, -1.0, 0.5])
    # K is symmetric in its sample indices, and so is its variance
    np.testing.assert_allclose(sol.mean("K"), np.swapaxes(sol.mean("K"), 0, 1), atol=1e-12)
    np.testing.assert_allclose(sol.var("K"), np.swapaxes(sol.var("K"), 0, 1), rtol=1e-8, atol=1e-12)


def test_unknown_order_parameter_name(sol2):
    with pytest.raises(ParameterError, match="did you mean 'Delta'"):
        sol2.mean("Detla")


@pytest.mark.parametrize("kwargs, match", [
    ({"gama": 1.0}, "unknown parameter 'gama'.*did you mean 'gamma'"),
    ({"T": 0}, "'T' must be a positive integer"),
    ({"T": -3}, "'T' must be a positive integer"),
    ({"T": 2.5}, "'T' must be a positive integer"),
    ({"gamma": float("nan")}, "'gamma' contains NaN"),
    ({"eta": float("inf")}, "'eta' contains NaN or infinity"),
    ({"eta": -0.1}, "'eta' .* must be positive"),
    ({"gamma": "large"}, "'gamma' must be a number"),
    ({"kx": [0.1, 0.2]}, "'kx' is a scalar"),
    ({"kx": 1.5}, "not positive semi-definite"),
    ({"samples": 1}, "samples must be an integer >= 2"),
    ({"seed": 1.5}, "seed must be an integer"),
])
def test_bad_arguments_single_point(two_layer, kwargs, match):
    samples = kwargs.pop("samples", 100)
    seed = kwargs.pop("seed", 0)
    with pytest.raises(ParameterError, match=match):
        two_layer.solve(samples=samples, seed=seed, **kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"Kx": np.eye(3), "P": 4}, r"'Kx' must have shape \(4, 4\)"),
    ({"Kx": np.array([[1.0, 0.2], [0.5, 1.0]])}, "not symmetric"),
    ({"Kx": np.array([[1.0, 2.0], [2.0, 1.0]])}, "not positive semi-definite"),
    ({"y": [1.0, 2.0, 3.0], "P": 2}, r"'y' must have shape \(2,\)"),
    ({"P": 0}, "'P' must be a positive integer"),
])
def test_bad_arguments_multi(multi, kwargs, match):
    with pytest.raises(ParameterError, match=match):
        multi.solve(samples=100, **kwargs)


def test_sizes_are_inferred_from_arrays(multi):
    sol = multi.solve(samples=200, T=3, Kx=np.eye(2), y=[1.0, 0.0])
    assert sol.params["P"] == 2 and sol.mean("Delta").shape == (2, 3)


def test_lazy_limit_closed_form(two_layer):
    """gamma -> 0: K is frozen at its random initial value, Delta(t) = y (1 - eta K)^t, so
    N Var(Delta(t)) = kappa_K(0,0) * (dDelta(t)/dK)^2 = kappa * (y t eta (1 - eta K)^(t-1))^2
    (the discrete-time form of the paper's kappa y^2 t^2 e^{-2t}), with kappa taken from the same run."""
    sol = two_layer.solve(samples=4000, seed=1, gamma=1e-6, T=40, eta=0.05, groups=1)  # one consistent pipeline
    K0 = sol.mean("K")[0]
    kappa = sol.kappa("K")[0, 0]
    t = np.arange(40)
    closed = kappa * (sol.params["y"] * t * 0.05 * (1 - 0.05 * K0) ** np.maximum(t - 1, 0)) ** 2
    np.testing.assert_allclose(sol.var("Delta"), closed, rtol=1e-4, atol=1e-10)
    np.testing.assert_allclose(sol.mean("Delta"), (1 - 0.05 * K0) ** t, rtol=1e-4)


def _autodiff_D(spec, sol, name):
    """D[name, Delta](t, s) = d<O(t)>/dDelta(s) by jax.jacfwd through a plain march of the same samples (the
    reference's two-layer kernels of ``spec``)."""
    mod = reference_module(ROOT / "specs" / f"{spec}.dmft")
    p = dict(sol.params)
    sz = {k: int(p[k]) for k in set(mod.AXIS_SIZE.values())}
    geo = Geometry(mod, sz)
    S = place_sources(mod, [jnp.asarray(x) for x in sample_draws(mod, p, sz, sol.info["samples"], sol.info["seed"])])
    T = len(sol.times)
    eta = p["eta"]
    shape = geo.shape("Delta")

    def mean_obs(delta):  # delta: canonical (comps, T)
        R = {n: jnp.zeros(geo.shape(n, sol.info["samples"])) for n in mod.SAMPLE_SUMS}
        outs = []
        for t in range(T):
            F = mod.fields(S, R, p, sz)
            O = mod.observables(F, S, p, sz)
            outs.append(jnp.mean(O[name], axis=0).reshape(-1))
            q = {"Delta": _place_comp(delta[..., t], mod, shape)}
            inc = mod.sample_increments(F, q, p, sz)
            R = {k: R[k] + eta * inc[k] for k in R}
        return jnp.stack(outs)                    # (T, comps_O)

    return jax.jacfwd(mean_obs)(jnp.asarray(sol.mean("Delta")))


def _place_comp(vals, mod, shape):
    from dmftc.runtime.numerics import kernels as _k

    return jnp.reshape(_k.place(vals, mod.STORED_AXES["Delta"], len(shape)), shape) if mod.STORED_AXES["Delta"] \
        else jnp.full(shape, vals)


def _symbolic_D(sol, name):
    """-U[name, Delta] as the solve assembles it (tangents of the spec's single-site program)."""
    T = len(sol.times)
    U = sol.U(name, "Delta").reshape(-1, T, int(sol.mean("Delta").size // T), T)     # (n, T, nd, T)
    return -np.transpose(U, (1, 0, 3, 2))           # (T, n, T, nd)


def test_symbolic_sensitivities_match_autodiff_two_layer(two_layer):
    sol = two_layer.solve(samples=300, seed=5, T=12, eta=0.1, gamma=2.0, groups=1, backend="mc")
    for name in ("K", "K_star"):
        ad = np.asarray(_autodiff_D("two_layer", sol, name))[:, 0, :]          # (T, T)
        sym = _symbolic_D(sol, name)[:, 0, :, 0]
        assert np.abs(ad).max() > 0.01   # D(t, s) carries one factor eta: not trivially zero
        np.testing.assert_allclose(sym, ad, rtol=1e-9, atol=1e-11)


def test_symbolic_sensitivities_match_autodiff_multi(multi):
    # autodiff through a ReLU is pathwise (phi'' = 0 a.e.): compare with the delta terms switched off
    sol = multi.solve(samples=200, seed=2, T=8, eta=0.1, gamma=1.5, P=3, Kx=np.eye(3) * 0.5 + 0.5,
                      y=[1.0, -0.5, 0.3], dirac_width=0.0, groups=1)
    ad = np.asarray(_autodiff_D("two_layer_multi", sol, "K"))                          # (T, P*P, P, T)
    sym = _symbolic_D(sol, "K")                                            # (T, P*P, T, P)
    assert np.abs(ad).max() > 0.01
    np.testing.assert_allclose(np.transpose(sym, (0, 1, 3, 2)), ad, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("m", [1, 3])
def test_block_solves_match_dense_triangular_solves(m):
    """The one causal solve (runtime.solvers.linalg) against LAPACK's dense triangular solves, on a time-major U with m
    components per time (a two-layer spec's U: lower triangular, some rows starting late)."""
    rng = np.random.default_rng(0)
    T = 20
    n = T * m
    U = np.tril(rng.normal(size=(n, n))) + 5 * np.eye(n)
    U[10:, :5] = 0.0
    edges = time_edges(T, m)
    np.testing.assert_array_equal(time_major_edges(n, T), edges)
    with pytest.raises(ValueError, match="multiple of T"):
        time_major_edges(n + 1, T)
    B = rng.normal(size=(n, 7))
    X = right_solve(U, edges, B)
    np.testing.assert_allclose(U @ X, B, atol=1e-10)
    np.testing.assert_allclose(right_solve(U, edges, B[:, 0]), X[:, 0], rtol=1e-13)
    np.testing.assert_array_equal(right_solve(U, edges, B, factors=factor(U, edges)), X)
    Y, worst = left_solve(U, edges)
    np.testing.assert_allclose(Y @ U, np.eye(n), atol=1e-10)
    assert np.all(np.triu(Y, m) == 0.0)
    K = B @ B.T
    S, info = sandwich(U, K, edges)
    ref, cond = triangular_sandwich(U, K)
    np.testing.assert_allclose(S, ref, rtol=1e-10, atol=1e-12 * np.abs(ref).max())
    assert info["cond"] == pytest.approx(cond, rel=1e-10) and 1 <= worst <= cond
    H = sandwich(U, K, edges, half=True)[0]                                 # S = H + H^T
    np.testing.assert_allclose(H + H.T, S, rtol=1e-14, atol=1e-15 * np.abs(S).max())
    A = rng.normal(size=(n, n))                    # the asymmetry check by tiles = its dense formula, exactly
    assert info["asymmetry"] < 1e-15
    for rows in (7, n - 1, n, 512):
        assert asymmetry(A, rows=rows) == np.abs(A - A.T).max() / np.abs(A).max()
    E = rng.normal(size=(3, n))                   # a few observables' rows: E Sigma E^T without U^-1
    np.testing.assert_allclose(sandwich(U, K, edges, E)[0], E @ ref @ E.T, rtol=1e-9)


def test_singular_U_is_reported_with_its_time():
    U = np.eye(4)
    U[2, 2] = 0.0
    with pytest.raises(NumericalError, match="singular at time 2"):
        sandwich(U, np.eye(4), time_edges(4, 1))


def test_ill_conditioned_U_is_reported():
    n = 40
    U = np.eye(n) - 3.0 * np.eye(n, k=-1)          # forward substitution amplifies by 3 per step
    with pytest.raises(NumericalError, match="ill-conditioned"):
        sandwich(U, np.eye(n), time_edges(n, 1))


def test_divergence_is_reported_with_the_step():
    eos = dmftc.load(ROOT / "specs" / "eos.dmft")
    with pytest.raises(NumericalError, match=r"non-finite at step \d+"):
        eos.solve(samples=200, gamma=20.0, eta=0.1, T=60)


def test_stderr_shapes_and_scaling(sol2):
    se = sol2.stderr("Delta")
    assert se.shape == (30,) and np.all(se >= 0) and se[5:].max() > 0
    np.testing.assert_allclose(sol2.stderr("K", "mean"), np.sqrt(sol2.var("K") / 2000))


def test_saved_results_reload_identically(sol2, tmp_path):
    path = sol2.save(tmp_path / "r.npz")
    back = dmftc.Solution.load(path)
    assert back.model == sol2.model and back.names == sol2.names
    for n in sol2.names:
        np.testing.assert_array_equal(back.mean(n), sol2.mean(n))
        np.testing.assert_array_equal(back.sigma(n), sol2.sigma(n))
        np.testing.assert_array_equal(back.stderr(n), sol2.stderr(n))
    np.testing.assert_array_equal(back.times, sol2.times)
    assert back.params["kx"] == 0.3 and back.info["seed"] == 3 and back.info["spec_sha256"]
    assert back.info["versions"]["dmftc"] == dmftc.__version__
    with pytest.raises(dmftc.DmftcError, match="not a dmftc results file"):
        (tmp_path / "junk.npz").write_text("nope")
        dmftc.Solution.load(tmp_path / "junk.npz")


def test_sweep_reuses_the_model(two_layer):
    ds = two_layer.sweep("gamma", [0.5, 1.0], samples=300, T=5)
    assert list(ds["gamma"].values) == [0.5, 1.0]
    assert ds["mean_K"].sel(gamma=0.5)[-1] != ds["mean_K"].sel(gamma=1.0)[-1]


def test_relu_solution_reports_its_kink_bias_and_chattering_paths():
    """A non-smooth activation (issue 13): halving the delta functions' width moves N Var, and the solution
    reports by how much against its Monte Carlo error; it counts the paths whose preactivation crosses the
    kink 3 or more times: under 1% near the lazy limit, about 10% on three random points with targets of both
    signs (gamma = 0.5, eta = 0.05, T = 40), as in a width-20000 network trained on the same data (14%, 1% and 12%
    of its neurons for the three points, experiments/relu_rich.py); it warns when either exceeds its bound."""
    rng = np.random.default_rng(1300 + 17 * 3)
    X = rng.standard_normal((3, 8))
    Kx, y = X @ X.T / 8, rng.standard_normal(3)
    y[0] = -y[0] if (np.all(y > 0) or np.all(y < 0)) else y[0]       # targets of both signs, as relu_rich.data
    m = dmftc.load(ROOT / "specs" / "two_layer_multi.dmft")
    rich = m.solve(P=3, Kx=Kx, y=y, gamma=0.5, T=40, eta=0.05, samples=2000, seed=1)
    lazy = m.solve(P=3, Kx=Kx, y=y, gamma=0.02, T=40, eta=0.05, samples=1000, groups=2, seed=1)
    kink = rich.info["diagnostics"]["kink"]
    assert kink["dirac_width"] == 0.1 and kink["shift_at_half_width_max"] > 0
    assert kink["exceeds_error_bar"] == (kink["shift_vs_se"] > 1 or kink["chattering"]["h"] > 0.01)
    assert ("warning: non-smooth activation" in rich.summary()) == kink["exceeds_error_bar"]
    assert 0.05 < kink["chattering"]["h"] < 0.15 and m.module.KINK_FIELDS == ("h",)
    assert "chattering" in rich.summary()
    assert lazy.info["diagnostics"]["kink"]["chattering"]["h"] < 0.01 and "chattering" not in lazy.summary()
    smooth = dmftc.load(ROOT / "specs" / "two_layer.dmft").solve(samples=2000, T=5)
    assert "kink" not in smooth.info["diagnostics"]
