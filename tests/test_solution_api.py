"""One solution class (dmftc.runtime.results.solution.Solution) for two-layer specs, deep specs and solve_deep."""
import warnings
from pathlib import Path

import numpy as np
import pytest

import dmftc
from dmftc.deep import solve_deep
from dmftc.errors import ParameterError
from dmftc.runtime.results.solution import Solution

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
    assert type(sol) is Solution
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
def test_deep_stderr_is_the_variance_error_without_warning(which, request):
    """stderr(name) means one thing for every solution (deep ones answered with the mean's error before)."""
    sol = request.getfixturevalue(which)
    for n in ("Delta", "K"):
        np.testing.assert_array_equal(_no_warning(sol.stderr, n), sol.var_stderr(n))
    if which == "deep_mc":                                 # Monte Carlo: the two errors are different arrays
        assert not np.allclose(sol.var_stderr("Delta"), sol.mean_stderr("Delta"))


def test_deep_exact_errors_are_zero_and_monte_carlo_ones_are_not(deep_spec, deep_api, deep_mc):
    for n in ("Delta", "K", "Phi[1]"):
        assert np.all(deep_spec.mean_stderr(n) == 0) and np.all(deep_spec.var_stderr(n) == 0)
    assert np.all(deep_api.expected_loss(64, stderr=True) == 0)
    assert deep_mc.mean_stderr("K")[-1] > 0 and deep_mc.mean_stderr("Phi[1]")[-1, -1] > 0
    assert "mean se" in deep_spec.summary().splitlines()[1]


def _same(a, b, name, what):
    np.testing.assert_array_equal(getattr(a, what)(name), getattr(b, what)(name), err_msg=f"{what}({name})")


@pytest.mark.parametrize("which", ["two_layer", "deep_spec", "deep_api"])
def test_one_results_file_for_every_kind(which, request, tmp_path):
    """save / Solution.load round-trips means, errors, the propagator's equal-time blocks, the mean correction,
    names, kind and depth, for two-layer and deep solutions alike."""
    sol = request.getfixturevalue(which)
    back = Solution.load(sol.save(tmp_path / "r.npz"))
    assert type(back) is Solution and back.kind == sol.kind and back.depth == sol.depth
    assert back.names == sol.names and back.observables == sol.observables and back.model == sol.model
    assert back.error_signal == sol.error_signal
    np.testing.assert_array_equal(back.times, sol.times)
    for n in sol.observables:
        for what in ("mean", "mean_stderr", "var", "var_stderr"):
            _same(sol, back, n, what)
        np.testing.assert_array_equal(back.sigma(n, "K"), sol.sigma(n, "K"))
        if sol.m1 is not None:
            _same(sol, back, n, "mean_correction")
    if sol.kind == "two_layer":
        np.testing.assert_array_equal(back.U("K", "Delta"), sol.U("K", "Delta"))
        np.testing.assert_array_equal(back.kappa("K"), sol.kappa("K"))
    else:
        with pytest.raises(ParameterError, match="kept by two-layer solves"):
            back.kappa("K")
    assert back.summary().splitlines()[1:] and "peak N Var" in back.summary()


def test_deep_monte_carlo_solution_saves_its_propagator_and_responses_have_means_only(tmp_path):
    sol = dmftc.load(ROOT / "specs" / "deep_tanh.dmft").solve(L=1, T=3, samples=400, seed=2, propagator_samples=64,
                                                             propagator_groups=2)
    assert not sol.blocks.computed
    back = Solution.load(sol.save(tmp_path / "mc.npz"))
    assert sol.blocks.computed                          # saving computed it
    assert set(sol.names) - set(sol.observables) == {"A[1]", "B[1]"}
    for n in sol.observables:
        _same(sol, back, n, "var")
        _same(sol, back, n, "var_stderr")
    with pytest.raises(ParameterError, match="response function 'A\\[1\\]'"):
        back.var("A[1]")
    np.testing.assert_array_equal(back.mean("A[1]"), sol.mean("A[1]"))
    assert "dirac_shift" not in back.info and back.info["propagator_samples"] == 64


def test_a_solution_without_propagator_keeps_its_reason_through_a_file(tmp_path):
    sol = solve_deep(activation="tanh", L=1, T=3, samples=200, memory_limit=1e4)
    back = Solution.load(sol.save(tmp_path / "means.npz"))
    np.testing.assert_array_equal(back.mean("Delta"), sol.mean("Delta"))
    with pytest.raises(ParameterError, match="needs about"):
        back.var("K")
    assert "N Var: (saved) ParameterError" in back.summary()


@pytest.mark.parametrize("which", ["two_layer", "deep_spec", "deep_api", "deep_mc"])
def test_time_axes_are_data_of_the_solution(which, request, tmp_path):
    """sol.time_axes(name): 2 for the two-time kernels and responses of deep solutions ((T, T) means), 1 for
    everything else, whatever the kind of spec; kept through a results file, and read off the means of a deep
    file written before solves recorded it (``info['two_time']`` missing)."""
    import json

    sol = request.getfixturevalue(which)
    want = {n: 2 if sol.depth is not None and np.ndim(sol.mean(n)) == 2 else 1 for n in sol.names}
    assert {n: sol.time_axes(n) for n in sol.names} == want
    assert (sol.depth is not None) == (2 in want.values())
    with pytest.raises(ParameterError, match="unknown name"):
        sol.time_axes("Phi[9]")
    if which == "deep_mc":
        return                                       # saving computes its propagator: the exact ones suffice
    back = Solution.load(sol.save(tmp_path / "s.npz"))
    assert {n: back.time_axes(n) for n in back.names} == want
    with np.load(tmp_path / "s.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k != "meta"}
        meta = json.loads(str(z["meta"]))
    meta["info"].pop("two_time", None)
    old = Solution.from_record(arrays, meta)
    assert {n: old.time_axes(n) for n in old.names} == want
