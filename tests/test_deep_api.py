"""dmftc.deep.solve_deep: the user-facing deep-network entry point."""
import numpy as np
import pytest

from dmftc.deep import propagator_bytes, solve_deep
from dmftc.runtime.engines.deep_linear import deep_linear_propagator
from dmftc.errors import ParameterError


@pytest.fixture(scope="module")
def linear():
    return solve_deep(activation="linear", L=2, gamma=1.0, y=1.0, eta=0.1, T=6)


def test_linear_solution_exposes_means_and_propagator(linear):
    ref = deep_linear_propagator(L=2, gamma=1.0, y=1.0, eta=0.1, T=6)
    assert linear.mean("Phi[1]").shape == (6, 6) and linear.mean("Delta").shape == (6,)
    np.testing.assert_allclose(linear.mean("G[2]"), ref.saddle.G[1], rtol=0, atol=1e-14)
    np.testing.assert_allclose(linear.var("Phi[1]"), ref.var("Phi[1]"), rtol=0, atol=1e-12)
    np.testing.assert_allclose(linear.sigma("Delta", "K"), ref["Delta"]["K"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(linear.sigma("K", "Delta"), linear.sigma("Delta", "K").T, atol=1e-12)
    blk = linear.two_time("Phi[2]")
    assert blk.shape == (6,) * 4
    np.testing.assert_allclose([blk[t, t, t, t] for t in range(6)], linear.var("Phi[2]"), atol=1e-12)
    assert np.all(linear.mean_stderr("K") == 0) and np.all(linear.var_stderr("K") == 0)
    text = linear.summary()
    assert "Phi[2]" in text and "peak N Var" in text


def test_exact_initial_variances(linear):
    # at t = 0 the kernels of a linear net are sums of squares of independent Gaussians:
    # N Var Phi[l](0,0) = 2 l, N Var G[l](0,0) = 2 (L + 1 - l) (here L = 2)
    assert linear.var("Phi[1]")[0] == pytest.approx(2.0, abs=1e-10)
    assert linear.var("Phi[2]")[0] == pytest.approx(4.0, abs=1e-10)
    assert linear.var("G[1]")[0] == pytest.approx(4.0, abs=1e-10)
    assert linear.var("G[2]")[0] == pytest.approx(2.0, abs=1e-10)


def test_too_large_is_refused_with_the_size():
    need = propagator_bytes(3, 200)
    with pytest.raises(ParameterError, match=r"needs about [0-9.]+ GB") as e:
        solve_deep(activation="linear", L=3, T=200, memory_limit=1e9)
    assert f"{need / 1e9:.1f} GB" in str(e.value)


@pytest.mark.parametrize("kw, match", [
    ({"L": 0}, r"L \(number of hidden layers\) must be an integer >= 1, got 0"),
    ({"T": 2.5}, r"T \(number of steps\) must be an integer >= 1, got 2.5"),
    ({"L": 0, "activation": "tanh"}, r"L \(number of hidden layers\) must be an integer >= 1, got 0"),
    ({"T": 2.5, "activation": "tanh"}, r"T \(number of steps\) must be an integer >= 1, got 2.5"),
    ({"activation": 3}, "an activation is an expression in h"),
])
def test_bad_arguments(kw, match):
    with pytest.raises(ParameterError, match=match):
        solve_deep(**kw)


def test_unknown_name(linear):
    with pytest.raises(ParameterError, match="unknown name 'Phi\\[3\\]'"):
        linear.var("Phi[3]")


# ------------------------------------------------------------------ nonlinear: the Monte Carlo propagator
TANH = dict(L=2, gamma=1.0, y=1.0, eta=0.1, T=4)


@pytest.fixture(scope="module")
def tanh_sol():
    return solve_deep(activation="tanh", samples=2000, seed=3, propagator_samples=1600, propagator_groups=4, **TANH)


def test_tanh_solution_gives_the_monte_carlo_propagator_on_first_use(tanh_sol):
    from dmftc.runtime.engines.deep_propagator import deep_propagator

    assert not tanh_sol.blocks.computed
    ref = deep_propagator(activation="tanh", samples=1600, groups=4, seed=3, **TANH)
    for name in ("Delta", "K", "Phi[1]", "Phi[2]", "G[1]", "G[2]"):
        np.testing.assert_allclose(tanh_sol.var(name), ref.var(name), rtol=1e-10, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(tanh_sol.var_stderr(name), ref.se_var(name), rtol=1e-10, atol=1e-12)
    assert tanh_sol.blocks.computed                           # computed once, kept
    assert np.all(tanh_sol.var_stderr("K") > 0) and tanh_sol.var("Delta")[0] == pytest.approx(0.0, abs=1e-10)
    np.testing.assert_allclose(tanh_sol.sigma("Delta", "K"), ref["Delta"]["K"], rtol=1e-10, atol=1e-12)
    with pytest.raises(ParameterError, match="linear deep specs only"):
        tanh_sol.two_time("Phi[1]")
    rows = {line.split()[0]: line.split() for line in tanh_sol.summary().splitlines()[2:]}
    assert float(rows["Phi[1]"][4]) == pytest.approx(tanh_sol.var("Phi[1]").max(), rel=1e-3)


def test_tanh_propagator_too_large_keeps_means_and_names_the_size():
    sol = solve_deep(activation="tanh", samples=200, memory_limit=1e4, **TANH)
    assert sol.mean("Delta").shape == (4,)
    with pytest.raises(ParameterError, match=r"needs about [0-9.]+ GB"):
        sol.var("K")
    assert "peak N Var" in sol.summary()


def test_any_activation_gets_a_propagator_and_kinks_are_flagged_and_bad_arguments():
    sol = solve_deep(activation="h / (1 + abs(h))", samples=400, propagator_samples=64, propagator_groups=2, **TANH)
    assert sol.info["kink_order"] == 3 and "delta function" in sol.info["approximation"]
    assert np.all(np.isfinite(sol.var("K"))) and sol.var("K")[-1] > 0
    assert sol.info["dirac_extrapolated"] and set(sol.info["dirac_shift"]) >= {"K", "Delta", "G[1]"}
    smooth = solve_deep(activation="sin(h)", samples=400, **TANH)
    assert smooth.info["kink_order"] is None and "approximation" not in smooth.info
    for bad in ("foo(h)", "tanh(h", "tanh(beta * h)", ""):
        with pytest.raises(ParameterError, match="activation"):
            solve_deep(activation=bad, samples=200, **TANH)
    with pytest.raises(ParameterError, match="propagator_groups >= 2"):
        solve_deep(activation="tanh", samples=200, propagator_groups=1, **TANH)


def test_kink_in_phi_prime_gets_means_and_a_refused_propagator(tmp_path):
    """relu's phi''' and phi'''' are derivatives of a delta function, which the deep propagator's third source
    derivatives cannot sample (measured: N Var K of 8e31 at T = 6): the means come, the variances are refused
    with the reason, through the API and through a spec alike."""
    import dmftc
    from pathlib import Path

    kw = dict(L=2, T=3, samples=200, groups=2, propagator_samples=200, propagator_groups=2)
    sol = solve_deep(activation="relu", gamma=1.0, y=1.0, eta=0.1, **kw)
    assert sol.info["kink_order"] == 2 and np.all(np.isfinite(sol.mean("K")))
    with pytest.raises(ParameterError, match=r"no deep propagator for phi\(h\) = sqrt\(2\) \* max\(0, h\)"):
        sol.var("K")
    text = (Path(__file__).resolve().parent.parent / "specs" / "deep_tanh.dmft").read_text()
    spec = tmp_path / "deep_relu.dmft"
    spec.write_text(text.replace("activation phi(h) = tanh(h)", "activation phi(h) = max(0, h)"))
    sol = dmftc.load(spec, tmp_path / "gen").solve(**kw)
    assert np.all(np.isfinite(sol.mean("K")))
    with pytest.raises(ParameterError, match="derivatives of delta functions"):
        sol.var("K")
    # the means' own approximation (the march drops the delta of the second derivative) is named, with its size
    note = sol.info["approximation"]
    assert "pathwise derivatives and drop it" in note and "3-10% of its peak off networks" in note, note
    assert "note:" in sol.summary() and "Gaussian of width" not in note


@pytest.mark.parametrize("kw, match", [
    (dict(gamma=[1.0], y=1.0, eta=0.1, L=2), "gamma must be a finite real number"),
    (dict(gamma=1.0, y=1.0, eta=-0.1, L=2), "eta must be >= 0"),
    (dict(gamma=1.0, y=1.0, eta=0.1, L=0), r"L \(number of hidden layers\) must be an integer >= 1"),
    (dict(gamma=1.0, y=1.0, eta=0.1), "give either model= or the standard network's gamma, y, eta and L"),
])
def test_default_model_checks_its_parameters(kw, match):
    """as_model without a model builds the standard network from its compiled spec; bad values are refused
    before they key its cache (a ParameterError, not a TypeError)."""
    from dmftc.runtime.problem.standard_spec import as_model

    with pytest.raises(ParameterError, match=match):
        as_model(None, **kw)
