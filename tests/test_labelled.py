"""Labelled results (dmftc.runtime.results.labelled): Solution.to_xarray for every shipped spec, netCDF files that load
back the same solution, sweeps as one Dataset (serially and as Dask tasks), ensembles in the same layout and
z-scores between two results."""
import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import dmftc
from dmftc.errors import DmftcError, ParameterError
from dmftc.runtime.results.jsonable import jsonable
from dmftc.validation import truth_dataset
from dmftc.validation.truth import finite_width_truth

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "specs"
KX2 = np.array([[1.0, 0.4], [0.4, 1.0]])
DEEP_TIME = ("t", "s")


@pytest.fixture(scope="module")
def two_layer_model():
    return dmftc.load(SPECS / "two_layer.dmft")


@pytest.fixture(scope="module")
def two_layer(two_layer_model):
    return two_layer_model.solve(T=6, samples=2000, seed=1, correction=True)


@pytest.fixture(scope="module")
def deep_tanh():
    sol = dmftc.load(SPECS / "deep_tanh.dmft").solve(L=1, T=4, samples=400, seed=2, propagator_samples=256,
                                                     propagator_groups=2)
    sol.var("Delta")                    # the Monte Carlo propagator, once for every test of this module
    return sol


@pytest.fixture(scope="module")
def deep_linear():
    return dmftc.load(SPECS / "deep_linear.dmft").solve(L=2, T=3)


def _same_solution(a, b):
    """Every field of two solutions equal (info as JSON: a file keeps JSON values), blocks included."""
    assert (a.model, a.kind, a.depth, a.error_signal) == (b.model, b.kind, b.depth, b.error_signal)
    assert np.array_equal(a.times, b.times)
    assert list(a.means) == list(b.means)
    for n in a.names:
        assert np.array_equal(a.mean(n), b.mean(n)), n
        assert np.array_equal(a.mean_stderr(n), b.mean_stderr(n)), n
    for table in ("mean_se", "m1", "m1_se"):
        ta, tb = getattr(a, table), getattr(b, table)
        assert (ta is None) == (tb is None), table
        for k in ta or {}:
            assert np.array_equal(ta[k], tb[k]), (table, k)
    assert a.observables == b.observables
    for n in a.observables:
        assert np.array_equal(a.var(n), b.var(n)) and np.array_equal(a.var_stderr(n), b.var_stderr(n))
        for m in a.observables:
            assert np.array_equal(a.sigma(n, m), b.sigma(n, m)), (n, m)
            if a.kind != "deep":
                assert np.array_equal(a.kappa(n, m), b.kappa(n, m)) and np.array_equal(a.U(n, m), b.U(n, m))
    assert json.dumps(jsonable(a.params), sort_keys=True) == json.dumps(jsonable(b.params), sort_keys=True)
    strip = lambda info: {k: v for k, v in info.items() if k != "versions"}  # noqa: E731
    assert json.dumps(jsonable(strip(a.info)), sort_keys=True) == json.dumps(jsonable(strip(b.info)), sort_keys=True)


@pytest.mark.parametrize("which", ["two_layer", "deep_tanh"])
def test_netcdf_round_trip_gives_the_same_solution(which, request, tmp_path):
    sol = request.getfixturevalue(which)
    path = sol.save(tmp_path / "run.nc")
    assert path.read_bytes()[:3] == b"CDF"                 # netCDF-3, not the .npz format
    assert [p.name for p in tmp_path.iterdir()] == ["run.nc"]     # written through a temporary file
    back = dmftc.Solution.load(path)
    _same_solution(sol, back)
    _same_solution(back, dmftc.Solution.load(sol.save(tmp_path / "run.npz")))
    with xr.open_dataset(path, engine="scipy") as ds:      # the file is a labelled Dataset as well
        assert ds.attrs["model"] == sol.model and ds.attrs["spec_sha256"] == sol.info["spec_sha256"]
        assert json.loads(ds.attrs["params"])["T"] == sol.T
        np.testing.assert_array_equal(ds["var_Delta"].values, sol.var("Delta"))
        assert ds["propagator_sigma"].dims == ("t", "component", "s", "component_s")
        if which == "two_layer":
            np.testing.assert_array_equal(ds["m1_K"].values, sol.mean_correction("K"))
            assert {"propagator_kappa", "propagator_U", "sigma_K_K"} <= set(ds.data_vars)
        else:
            np.testing.assert_array_equal(ds["mean_Phi"].sel(layer=1).values, sol.mean("Phi[1]"))


def test_a_file_that_is_not_a_results_file_is_a_clear_error(tmp_path):
    (tmp_path / "junk.nc").write_bytes(b"CDF\x01 not really")
    with pytest.raises(DmftcError, match="not a dmftc results file"):
        dmftc.Solution.load(tmp_path / "junk.nc")
    xr.Dataset({"x": ("t", np.zeros(2))}).to_netcdf(tmp_path / "other.nc", engine="scipy")
    with pytest.raises(DmftcError, match="not a dmftc results file"):
        dmftc.Solution.load(tmp_path / "other.nc")


# every shipped spec at a small size: (solve arguments, {variable: dims}); deep specs on several points: means only
P2 = dict(P=2, Kx=KX2, y=np.array([1.0, -1.0]))
CASES = {
    "eos": (dict(T=3), {"mean_Delta": ("t",), "var_K": ("t",), "sigma_K_K": ("t", "s")}),
    "linear_whitened": (dict(T=3, P=3), {"mean_Delta": ("mu", "t"), "var_se_Delta": ("mu", "t"),
                                         "sigma_Delta_Delta": ("mu", "t", "mu_s", "s")}),
    "online_linear": (dict(T=3, D=2), {"mean_Delta": ("k", "t"), "var_Delta": ("k", "t"),
                                       "sigma_Delta_Delta": ("k", "t", "k_s", "s")}),
    "rates": (dict(T=3, samples=400), {"mean_r": ("t",), "mean_se_r": ("t",), "var_r": ("t",)}),
    "two_layer_multi": (dict(T=3, samples=400, **P2), {"mean_Delta": ("mu", "t"), "mean_K": ("mu", "nu", "t"),
                                                       "var_K": ("mu", "nu", "t"),
                                                       "sigma_K_K": ("mu", "nu", "t", "mu_s", "nu_s", "s")}),
    "deep_multi": (dict(L=1, T=2, samples=64, **P2, m=np.array([1.0, 0.0])),
                   {"mean_Delta": ("mu", "t"), "mean_K": ("mu", "nu", "t"),
                    "mean_Phi": ("layer", "mu", "nu") + DEEP_TIME, "mean_se_B": ("layer", "mu", "nu") + DEEP_TIME}),
    "deep_logistic": (dict(L=1, T=2, samples=64, **P2), {"mean_Delta": ("mu", "t"),
                                                         "mean_G": ("layer", "mu", "nu") + DEEP_TIME}),
}


def _check_dims(sol, ds, expected):
    for var, dims in expected.items():
        assert ds[var].dims == dims, (var, ds[var].dims)
    np.testing.assert_array_equal(ds["t"].values, sol.times)
    for d in ("mu", "nu", "k", "layer"):
        if d in ds.coords:
            assert list(ds[d].values) == list(range(1, ds.sizes[d] + 1)), d
    for n in sol.names:                          # each mean, by its labels
        family, _, layer = n.partition("[")
        da = ds[f"mean_{family}"]
        if layer:
            da = da.sel(layer=int(layer.rstrip("]")))
        np.testing.assert_array_equal(da.values, sol.mean(n))


@pytest.mark.parametrize("spec", sorted(CASES))
def test_to_xarray_dims_of_every_shipped_spec(spec):
    kwargs, expected = CASES[spec]
    deep_points = "P" in kwargs and spec.startswith("deep")
    sol = dmftc.load(SPECS / f"{spec}.dmft").solve(**kwargs)
    ds = sol.to_xarray(var=not deep_points)
    _check_dims(sol, ds, expected)
    if "mean_K" in ds and "mu" in ds["mean_K"].dims:
        np.testing.assert_array_equal(ds["mean_K"].sel(mu=2, nu=1).values, sol.mean("K")[1, 0])
    if deep_points:
        assert not any(v.startswith("var") for v in ds.data_vars)
    elif not spec.startswith("deep"):             # two-layer: every same-name block by default
        assert {f"sigma_{n}_{n}" for n in sol.observables} <= set(ds.data_vars)


def test_to_xarray_dims_of_the_shipped_two_layer_and_deep_specs(two_layer, deep_tanh, deep_linear):
    """The specs of the round-trip tests (two_layer, deep_tanh with its Monte Carlo propagator) and deep_linear
    (L = 2: layers stack; its exact propagator)."""
    ds = two_layer.to_xarray()
    _check_dims(two_layer, ds, {"mean_f_star": ("t",), "m1_K": ("t",), "m1_se_K": ("t",), "sigma_K_K": ("t", "s")})
    assert set(ds.coords) == {"t", "s"}
    ds = deep_tanh.to_xarray(sigma=[("Phi", "G"), ("K", "K")])
    _check_dims(deep_tanh, ds, {"mean_Phi": ("layer", "t", "s"), "var_Phi": ("layer", "t"),
                                "var_se_G": ("layer", "t"), "mean_se_Delta": ("t",),
                                "sigma_Phi_G": ("layer", "t", "layer_s", "s"), "sigma_K_K": ("t", "s")})
    np.testing.assert_array_equal(ds["sigma_Phi_G"].sel(layer=1, layer_s=1).values, deep_tanh.sigma("Phi[1]", "G[1]"))
    assert "var_A" not in ds and "mean_A" in ds                  # responses: means only
    assert not any(v.startswith("sigma") for v in deep_tanh.to_xarray().data_vars)   # deep: none by default
    assert ds.attrs["depth"] == 1 and ds.attrs["gamma"] == 1.0 and ds.attrs["seed"] == 2
    ds = deep_linear.to_xarray(sigma=[("Phi", "Phi"), ("Delta", "G")])
    _check_dims(deep_linear, ds, {"mean_Delta": ("t",), "mean_Phi": ("layer", "t", "s"),
                                  "mean_A": ("layer", "t", "s"), "var_G": ("layer", "t"), "var_se_K": ("t",),
                                  "sigma_Phi_Phi": ("layer", "t", "layer_s", "s"),
                                  "sigma_Delta_G": ("t", "layer_s", "s")})
    assert list(ds["layer"].values) == [1, 2]
    np.testing.assert_array_equal(ds["sigma_Phi_Phi"].sel(layer=1, layer_s=2).values,
                                  deep_linear.sigma("Phi[1]", "Phi[2]"))
    np.testing.assert_array_equal(ds["sigma_Delta_G"].sel(layer_s=2).values, deep_linear.sigma("Delta", "G[2]"))
    np.testing.assert_array_equal(ds["var_Phi"].sel(layer=2).values, deep_linear.var("Phi[2]"))


def test_to_xarray_rejects_bad_sigma_requests(two_layer):
    with pytest.raises(ParameterError, match="did you mean 'Delta'"):
        two_layer.to_xarray(sigma=[("Delt", "K")])
    with pytest.raises(ParameterError, match="pairs of names"):
        two_layer.to_xarray(sigma=["Delta"])


def test_sweep_is_one_dataset_along_the_parameter(two_layer_model):
    ds = two_layer_model.sweep("gamma", [0.5, 1.0], T=4, samples=400, seed=5)
    assert ds["mean_K"].dims == ("gamma", "t") and list(ds["gamma"].values) == [0.5, 1.0]
    one = two_layer_model.solve(T=4, samples=400, seed=5, gamma=1.0).to_xarray()
    xr.testing.assert_equal(ds.sel(gamma=1.0, drop=True), one)
    assert "gamma" not in ds.attrs and ds.attrs["model"] == "two_layer"     # differing attrs are dropped
    with pytest.raises(ParameterError, match="no values"):
        two_layer_model.sweep("gamma", [])


def test_dask_sweep_equals_the_serial_sweep(two_layer_model):
    distributed = pytest.importorskip("dask.distributed")
    kw = dict(T=4, samples=400, seed=7)
    serial = two_layer_model.sweep("gamma", [0.5, 1.5], **kw)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        spread = two_layer_model.sweep("gamma", [0.5, 1.5], client=client, **kw)
        ran_on = client.run(lambda: True)
    assert len(ran_on) == 2
    xr.testing.assert_identical(serial.drop_attrs(), spread.drop_attrs())


def test_zscores_of_synthetic_datasets():
    t = np.arange(3.0)
    a = xr.Dataset({"mean_X": ("t", [1.0, 2.0, 3.0]), "mean_se_X": ("t", [0.3, 0.3, 0.3]),
                    "var_X": ("t", [0.0, 1.0, 1.0]), "var_se_X": ("t", [0.0, 0.1, 0.1]),
                    "mean_Y": ("t", [5.0, 5.0, 5.0])}, coords={"t": t})
    b = xr.Dataset({"mean_X": ("t", [1.0, 1.5, 1.0, 9.0]), "mean_se_X": ("t", [0.4, 0.4, 0.4, 0.4]),
                    "var_X": ("t", [0.0, 0.8, 1.2, 9.0]), "var_se_X": ("t", [0.0, 0.2, 0.2, 0.2]),
                    "mean_Y": ("t", [1.0, 1.0, 1.0, 1.0]), "mean_se_Y": ("t", [1.0, 1.0, 1.0, 1.0])},
                   coords={"t": np.arange(4.0)})
    z = dmftc.zscores(a, b)
    assert set(z.data_vars) == {"mean_X", "var_X"}           # mean_Y: no error in a
    assert z.sizes["t"] == 3                                 # aligned on the shared times
    np.testing.assert_allclose(z["mean_X"].values, [0.0, 1.0, 4.0])
    np.testing.assert_allclose(z["var_X"].values, [0.0, 0.2 / np.sqrt(0.05), -0.2 / np.sqrt(0.05)])
    assert z.attrs["max_abs_mean_X"] == pytest.approx(4.0)
    with pytest.raises(ParameterError, match="no statistic"):
        dmftc.zscores(a[["mean_Y"]], b)
    with pytest.raises(ParameterError, match="share no coordinates"):
        dmftc.zscores(a, b.assign_coords(t=b["t"] + 0.5))


def test_theory_and_networks_line_up_by_name(two_layer):
    truth = finite_width_truth("two_layer", two_layer.params, N=64, E=40, seed=0)
    nets = truth_dataset(truth, like=two_layer)
    theory = two_layer.to_xarray()
    assert {v for v in nets.data_vars} <= set(theory.data_vars)
    z = dmftc.zscores(theory, nets)
    assert set(z.data_vars) == {f"{s}_{n}" for s in ("mean", "var") for n in two_layer.observables}
    assert all(np.isfinite(z[v]).all() for v in z.data_vars)
    with pytest.raises(ParameterError, match="times"):
        truth_dataset(truth)


def test_ensembles_of_every_kind_as_datasets():
    from dmftc.validation.deep_ensemble import simulate_deep
    from dmftc.validation.ensemble import simulate_two_layer

    two = simulate_two_layer(activation="tanh", Kx_all=np.array([[1.0, 0.5], [0.5, 1.0]]), y=np.array([1.0]),
                             gamma=1.0, eta=0.1, T=3, N=16, E=4)
    ds = truth_dataset(two)                                      # its own times
    assert ds["mean_Delta"].dims == ("mu", "t") and ds["var_K"].dims == ("a", "b", "t")
    assert (ds.sizes["mu"], ds.sizes["a"]) == (1, 2)
    np.testing.assert_array_equal(ds["var_se_K"].sel(a=1, b=2).values, two.nvar_se["K"][0, 1])
    deep = simulate_deep(activation="tanh", L=2, gamma=1.0, y=1.0, eta=0.1, T=3, N=16, E=4)
    ds = truth_dataset(deep, times=0.1 * np.arange(3))
    assert ds["mean_Phi"].dims == ("layer", "t", "s") and ds["var_se_G"].dims == ("layer", "t")
    np.testing.assert_array_equal(ds["mean_se_Phi"].sel(layer=2).values, deep.se_mean["Phi[2]"])
    with pytest.raises(ParameterError, match="4 times for statistics over \\[3\\] steps"):
        truth_dataset(deep, times=np.arange(4.0))
