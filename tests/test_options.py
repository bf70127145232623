"""The solve options are one definition for every kind of spec (dmftc.runtime.problem.options): the same bad option gives
the same error whatever the spec (two-layer, deep, deep linear, deep on several points), before anything is
solved, and an option that the spec's kind does not read is an error instead of being ignored."""
from pathlib import Path

import pytest

import dmftc
from cli_runner import dmftc as run_cli  # tests/cli_runner.py: the command line in this process
from dmftc.errors import ParameterError
from dmftc.runtime.problem.options import DEEP_ONLY, TWO_LAYER_ONLY, SolveOptions
from dmftc.runtime.solve import kind_of

ROOT = Path(__file__).resolve().parent.parent
SPECS = ("two_layer", "deep_tanh", "deep_linear", "deep_multi")

BAD = [
    (dict(samples=0), "samples must be an integer >= 2, got 0"),
    (dict(samples=1.5), "samples must be an integer >= 2, got 1.5"),
    (dict(samples=True), "samples must be an integer >= 2, got True"),
    (dict(seed=-1), "seed must be an integer >= 0, got -1"),
    (dict(groups=0), "groups must be an integer >= 1, got 0"),
    (dict(backend="foo"), "backend must be one of 'auto', 'exact', 'mc', 'cubature', got 'foo'"),
    (dict(sampler="halton"), "sampler must be one of 'sobol', 'random', got 'halton'"),
    (dict(dirac_width=-1.0), "dirac_width must be a finite number >= 0, got -1.0"),
    (dict(dirac_width=float("nan")), "dirac_width must be a finite number >= 0, got nan"),
    (dict(correction="yes"), "correction must be True or False, got 'yes'"),
    (dict(progress=1), "progress must be True or False, got 1"),
]


@pytest.fixture(scope="module")
def models():
    return {name: dmftc.load(ROOT / "specs" / f"{name}.dmft") for name in SPECS}


@pytest.mark.parametrize("bad, message", BAD, ids=[next(iter(b)) + "=" + repr(next(iter(b.values()))) for b, _ in BAD])
def test_a_bad_option_is_the_same_error_for_every_kind_of_spec(models, bad, message):
    for name, m in models.items():
        with pytest.raises(ParameterError) as err:
            m.solve(T=2, **bad)
        assert str(err.value) == message, name


def test_an_option_of_the_other_kind_is_an_error_not_ignored(models):
    assert kind_of(models["two_layer"].module) == "two-layer"
    assert {kind_of(models[n].module) for n in SPECS[1:]} == {"deep"}
    for name in DEEP_ONLY:
        with pytest.raises(ParameterError, match=f"the option {name} applies to deep specs only"):
            models["two_layer"].solve(T=2, **{name: 64})
    for name in TWO_LAYER_ONLY:
        for deep in SPECS[1:]:
            with pytest.raises(ParameterError, match=f"the option {name} applies to two-layer specs only"):
                models[deep].solve(T=2, **{name: 64})


def test_for_kind_hands_each_engine_its_options_and_defaults():
    opts = SolveOptions(samples=64, groups=4, propagator_samples=128)
    deep = opts.for_kind("deep")
    assert deep["propagator_samples"] == 128 and "batch" not in deep and "propagator_groups" not in deep
    assert "memory_limit" not in deep and "sampler" not in deep        # left to the engine's default
    with pytest.raises(ParameterError, match="propagator_samples applies to deep specs only"):
        opts.for_kind("two-layer")
    two = SolveOptions(samples=64, batch=8).for_kind("two-layer")
    assert two["batch"] == 8 and not set(two) & set(DEEP_ONLY)
    assert SolveOptions(seed=3, backend="mc").given() == {"seed": 3, "backend": "mc"}


def test_cli_rejects_a_deep_option_for_a_two_layer_spec():
    r = run_cli("run", "specs/two_layer.dmft", "--propagator-samples", "64", "-q")
    assert r.returncode == 2 and "propagator_samples applies to deep specs only" in r.stderr
    assert "Traceback" not in r.stderr


PARAMS_BAD = [
    (dict(T=0), "parameter 'T' must be a positive integer (the number of steps), got 0"),
    (dict(T=2.5), "parameter 'T' must be a positive integer (the number of steps), got 2.5"),
    (dict(eta=-0.1), "parameter 'eta' (time step) must be positive, got -0.1"),
    (dict(gamma=float("nan")), "parameter 'gamma' contains NaN or infinity"),
    (dict(gamma="large"), "parameter 'gamma' must be a number, got str 'large'"),
    (dict(gamma=[1.0, 2.0]), "parameter 'gamma' is a scalar, got an array of shape (2,)"),
]


@pytest.mark.parametrize("bad, message", PARAMS_BAD, ids=[repr(b) for b, _ in PARAMS_BAD])
def test_a_bad_model_parameter_is_the_same_error_for_every_kind_of_spec(models, bad, message):
    """One resolver (dmftc.runtime.problem.params.resolve_params) for the model parameters of every kind of spec."""
    for name, m in models.items():
        with pytest.raises(ParameterError) as err:
            m.solve(**{"T": 2, **bad})
        assert str(err.value) == message, name
    with pytest.raises(ParameterError, match=r"unknown parameter 'gama' .*did you mean 'gamma'"):
        models["deep_multi"].solve(gama=1.0)


def test_saddle_on_draws_of_a_deep_spec_is_a_clear_error(models):
    with pytest.raises(ParameterError, match="sources of the deep spec .* are Gaussian processes"):
        models["deep_tanh"].saddle_on_draws([[[0.0]], [[0.0]]], T=2)


def test_a_parameter_cannot_take_the_name_of_a_solve_option(tmp_path):
    """solve(**kw) takes options and model parameters together: a parameter named like an option could never be
    set, so the checker refuses it with its location (the checker's list is SolveOptions' fields)."""
    from dataclasses import fields

    from dmftc.errors import NameSpecError
    from dmftc.frontend.names import SOLVE_OPTIONS

    assert set(SOLVE_OPTIONS) == {f.name for f in fields(SolveOptions)}
    for spec, anchor in (("two_layer_multi", 'param gamma = 1.0 "feature learning strength"\n'),
                         ("deep_tanh", 'param gamma = 1.0 "feature learning strength"\n')):
        text = (ROOT / "specs" / f"{spec}.dmft").read_text()
        assert anchor in text, spec
        path = tmp_path / f"{spec}.dmft"
        path.write_text(text.replace(anchor, anchor + 'param seed = 3.0 "a name solve uses"\n'))
        line = text[:text.index(anchor)].count("\n") + 2
        with pytest.raises(NameSpecError) as err:
            dmftc.load(path, tmp_path / "gen")
        assert "'seed' is an option of solve" in str(err.value)
        assert f"{path}:{line}:7" in err.value.render(), err.value.render()


def test_too_few_feature_paths_are_refused_before_the_means_march(models):
    """propagator_feature_samples below propagator_samples (the feature paths include the derivative paths) is
    refused with the option's name, for one point and for several, before any march (T = 2000 would take
    minutes to march)."""
    for name in ("deep_tanh", "deep_multi"):
        with pytest.raises(ParameterError, match=r"propagator_feature_samples \(at least propagator_samples\) "
                                                 r"must be an integer >= 400, got 100"):
            models[name].solve(T=2000, samples=64, groups=2, propagator_samples=400, propagator_feature_samples=100)
