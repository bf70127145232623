"""One solution contract (dmftc.runtime.solution.SolutionAPI) for two-layer specs, deep specs and solve_deep."""
import warnings
from pathlib import Path

import numpy as np
import pytest

import dmftc
from dmftc.deep import solve_deep
from dmftc.errors import ParameterError
from dmftc.runtime.solution import SolutionAPI

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def two_layer():
    m = dmftc.load(ROOT / "specs" / "two_layer.dmft")
    return m.solve(samples=1000, seed=1, T=8, eta=0.05, gamma=1.0, correction=True)


@pytest.fixture(scope="module")
def deep_spec():
    return dmftc.load(ROOT / "specs" / "deep_linear.dmft").solve(L=1, T=4)


@pytest.fixture(scope="module")
def deep_api():
    return solve_deep(activation="linear", L=1, gamma=1.0, y=1.0, eta=0.05, T=4, correction=True)


@pytest.fixture(scope="module")
def deep_mc():
    """A Monte Carlo deep solution (means only are read: nonzero standard errors of the mean)."""
    return dmftc.load(ROOT / "specs" / "deep_tanh.dmft").solve(L=1, T=4, samples=400, seed=2)


def _no_warning(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn(*args)


@pytest.mark.parametrize("which", ["two_layer", "deep_spec", "deep_api"])
def test_every_solution_answers_one_contract(which, request):
    sol = request.getfixturevalue(which)
    assert isinstance(sol, SolutionAPI)
    for n in ("Delta", "K"):
        np.testing.assert_array_equal(_no_warning(sol.stderr, n, "mean"), sol.mean_stderr(n))
        np.testing.assert_array_equal(_no_warning(sol.stderr, n, "var"), sol.var_stderr(n))
        assert sol.mean_stderr(n).shape == sol.mean(n).shape
        assert sol.var_stderr(n).shape == sol.var(n).shape
    with pytest.raises(ParameterError, match="what is 'mean' or 'var'"):
        sol.stderr("Delta", "both")
    with pytest.raises(ParameterError, match="did you mean 'Delta'"):
        sol.mean("Delt")
    if which == "deep_spec":        # solved without correction=True (deep_api is the same solution with it)
        with pytest.raises(ParameterError, match="correction=True"):
            sol.expected_loss(64)
        return
    # the width-N results are the contract's one formula: |Delta|^2 + (2 Delta . m1 + tr Sigma) / N
    N, T = 64.0, len(sol.times)
    d = sol.mean(sol.error_signal).reshape(-1, T)
    m1 = sol.mean_correction(sol.error_signal).reshape(-1, T)
    v = sol.var(sol.error_signal).reshape(-1, T)
    np.testing.assert_allclose(sol.expected_loss(N), (d ** 2 + (2 * d * m1 + v) / N).sum(axis=0), rtol=1e-14)
    np.testing.assert_allclose(sol.mean_at_width("K", N), sol.mean("K") + sol.mean_correction("K") / N, rtol=1e-14)
    assert np.all(np.isfinite(sol.expected_loss(N, stderr=True)))
    with pytest.raises(ParameterError, match="must be positive"):
        sol.mean_at_width("K", 0)


def test_two_layer_stderr_is_the_variance_error_without_warning(two_layer):
    np.testing.assert_array_equal(_no_warning(two_layer.stderr, "K"), two_layer.var_stderr("K"))
    np.testing.assert_allclose(two_layer.mean_stderr("K"), np.sqrt(two_layer.var("K") / 1000))
    assert np.all(two_layer.var_stderr("K")[1:] > 0)      # Monte Carlo: the two errors are different arrays
    assert not np.allclose(two_layer.var_stderr("K"), two_layer.mean_stderr("K"))


@pytest.mark.parametrize("which", ["deep_spec", "deep_api", "deep_mc"])
def test_deep_stderr_without_what_keeps_the_mean_error_and_warns(which, request):
    sol = request.getfixturevalue(which)
    with pytest.warns(FutureWarning, match="standard error of the MEAN"):
        se = sol.stderr("Delta")
    np.testing.assert_array_equal(se, sol.mean_stderr("Delta"))


def test_deep_exact_errors_are_zero_and_monte_carlo_ones_are_not(deep_spec, deep_api, deep_mc):
    for n in ("Delta", "K", "Phi[1]"):
        assert np.all(deep_spec.mean_stderr(n) == 0) and np.all(deep_spec.var_stderr(n) == 0)
    assert np.all(deep_api.expected_loss(64, stderr=True) == 0)
    assert deep_mc.mean_stderr("K")[-1] > 0 and deep_mc.mean_stderr("Phi[1]")[-1, -1] > 0
    assert "mean se" in deep_spec.summary().splitlines()[1]
