"""Labelled results: a :class:`~dmftc.runtime.results.solution.Solution` (or a finite-width ensemble) as an
``xarray.Dataset`` whose dims name what the axes are, netCDF files, and z-scores between two results.

Layout (docs/results.md):

* dims ``t`` (coordinate: the times), ``s`` (the second time of two-time arrays; the times), index dims named as
  in the spec (``mu``, ``nu`` for the first and second point index when the spec does not say; coordinates
  1..P), ``layer`` (coordinate 1..L) for a deep spec's layer families: ``Phi[1]``, ``Phi[2]`` stack into ``Phi``;
* per name ``X``: ``mean_X`` (``(layer, *index, t)``, or ``(..., t, s)`` for two-time kernels and responses),
  ``mean_se_X``, ``var_X`` (equal-time N Var, ``(layer, *index, t)``), ``var_se_X``, ``m1_X`` and ``m1_se_X``
  (O(1/N) mean correction), and requested propagator blocks ``sigma_A_B`` over
  ``(layer, *index_A, t, layer_s, *index_B_s, s)`` (the second name's dims carry the suffix ``_s``);
* attrs: provenance (model, kind, spec_sha256, params as JSON and each scalar parameter, seed, samples,
  backend, versions, created) and ``info`` as JSON.

:func:`write_netcdf` / :func:`read_netcdf` store a solution in netCDF-3 (SciPy engine): the Dataset above plus
the dense propagator (``propagator_sigma`` over ``(t, component, s, component_s)``, its errors, kappa, U) and
the results file's meta, so that ``Solution.load`` gives back the same solution.
"""
from __future__ import annotations

import datetime
import itertools
import json
import re
from pathlib import Path

import numpy as np

from dmftc.errors import DmftcError, ParameterError
from dmftc.runtime.results.atomic import atomic_output

__all__ = ["solution_dataset", "stats_dataset", "zscores", "index_names", "write_netcdf", "read_netcdf",
           "DEFAULT_INDEX"]

DEFAULT_INDEX = ("mu", "nu")            # index dims when the spec's names are not known
_LAYERED = re.compile(r"^(\w+)\[(\d+)\]$")
_STATS = (("mean", "mean_se"), ("var", "var_se"), ("m1", "m1_se"))


def index_names(module) -> dict:
    """The spec's index names per name of a generated module (its ``INDEX_NAMES``, recorded in
    ``info['index_names']`` by a solve; key ``'*'``: every name not listed, e.g. the kernels of a deep spec on
    several points)."""
    return {name: list(idx) for name, idx in module.INDEX_NAMES.items()}


def _split(name: str):
    m = _LAYERED.match(name)
    return (m.group(1), int(m.group(2))) if m else (name, None)


def _index_dims(name: str, n: int, names: dict) -> list:
    family = _split(name)[0]
    given = names.get(name, names.get(family, names.get("*", [])))
    given = list(given) if len(given) >= n else list(DEFAULT_INDEX)
    dims = given[:n] + [f"i{k + 1}" for k in range(len(given), n)]
    if len(set(dims)) != len(dims):            # the same index twice (K[mu, mu]): number the repeats
        dims = [d if dims.index(d) == k else f"{d}{k + 1}" for k, d in enumerate(dims)]
    return dims


class _Builder:
    """Collects (name, array, index dims, time dims) per variable prefix and stacks layer families."""

    def __init__(self, times):
        self.times = np.asarray(times)
        self.items = {}          # variable name -> {layer or None: (array, dims)}
        self.sizes = {}

    def add(self, prefix: str, name: str, array, index: list, times: tuple):
        family, layer = _split(name)
        array = np.asarray(array)
        var = f"{prefix}_{family}"
        entry = self.items.setdefault(var, {})
        if (layer is None) != all(k is None for k in entry) and entry:
            raise DmftcError(f"the name {name!r} is both a layer family and a plain name: cannot label {var}")
        entry[layer] = (array, list(index) + list(times))
        for d, n in zip(index, array.shape):
            if self.sizes.setdefault(d, n) != n:
                raise DmftcError(f"index {d!r} has sizes {self.sizes[d]} and {n}: cannot label {var}")

    def dataset(self, attrs: dict):
        import xarray as xr

        layers = sorted({l for e in self.items.values() for l in e if l is not None})
        data = {}
        for var, entry in self.items.items():
            if list(entry) == [None]:
                a, dims = entry[None]
                data[var] = (dims, a)
                continue
            some = next(iter(entry.values()))
            stack = np.full((len(layers),) + some[0].shape, np.nan)    # a family's missing layers are NaN
            for l, (a, _) in entry.items():
                stack[layers.index(l)] = a
            data[var] = (["layer"] + some[1], stack)
        used = {d for dims, _ in data.values() for d in dims}
        coords = {d: np.arange(1, n + 1) for d, n in self.sizes.items() if d in used}
        coords.update({d: self.times for d in ("t", "s") if d in used})
        if layers:
            coords["layer"] = np.asarray(layers)
        return xr.Dataset(data, coords=coords, attrs=attrs)


def _dense(blocks) -> bool:
    """Whether a solution's propagator blocks are at hand (dense; not computed on first use, as a deep solve's)."""
    return blocks is not None and not hasattr(blocks, "computed")


def _members(sol, name: str) -> list:
    """The solution's names under ``name``: itself, or every layer of a family (in layer order)."""
    if name in sol.means:
        return [name]
    members = sorted((n for n in sol.means if _split(n)[0] == name), key=lambda n: _split(n)[1])
    if not members:
        sol.mean(name)                           # the unknown-name error, with its suggestion
    return members


def _attrs(sol) -> dict:
    import jax

    from dmftc.runtime.results.jsonable import jsonable
    from dmftc.version import __version__

    info = sol.info
    diag = info.get("diagnostics", {})
    attrs = {"title": f"dmftc solution of {sol.model}", "model": sol.model, "kind": sol.kind}
    if sol.depth is not None:
        attrs["depth"] = int(sol.depth)
    for k in ("spec", "spec_sha256", "seed", "samples", "groups", "propagator_samples", "propagator_groups",
              "propagator_feature_samples"):
        v = jsonable(info.get(k))
        if v is not None:
            attrs[k] = v if isinstance(v, (str, int, float)) and not isinstance(v, bool) else json.dumps(v)
    attrs["backend"] = str(info.get("backend", diag.get("backend", "mc")))
    attrs["params"] = json.dumps({k: jsonable(v) for k, v in sol.params.items()}, sort_keys=True)
    for k, v in sol.params.items():
        key = re.sub(r"\W", "_", str(k))
        if np.ndim(v) == 0 and not isinstance(v, (str, bool)) and key not in attrs:
            attrs[key] = float(v) if isinstance(v, (float, np.floating)) else int(v)
    attrs["info"] = json.dumps(jsonable(info), sort_keys=True)
    attrs.update(dmftc_version=__version__, jax_version=jax.__version__, numpy_version=np.__version__,
                 created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    return attrs


def solution_dataset(sol, sigma=None, var: bool = True):
    """``sol`` as an ``xarray.Dataset`` (module doc).  ``sigma``: pairs of names (plain names or layer families
    such as 'Phi') whose propagator blocks to include as ``sigma_A_B``; default every same-name block of a
    two-layer solution and none of a deep one.  ``var``: include ``var_X`` and ``var_se_X`` (a deep solution's
    propagator is computed for them; when it cannot be, attr ``var_missing`` says why)."""
    names = sol.info.get("index_names", {})
    b = _Builder(sol.times)
    ndim_index = {n: np.ndim(m) - sol.time_axes(n) for n, m in sol.means.items()}
    attrs = _attrs(sol)
    observables = ()
    if var and not sol.observables:
        attrs["var_missing"] = str(sol.blocks_error or "no finite-width propagator in this solution")
    elif var:
        try:
            sol.var(sol.observables[0])
            observables = sol.observables
        except DmftcError as err:
            attrs["var_missing"] = str(err)
    for n, m in sol.means.items():
        idx = _index_dims(n, ndim_index[n], names)
        times = ("t", "s") if sol.time_axes(n) == 2 else ("t",)
        b.add("mean", n, m, idx, times)
        se = None
        if sol.mean_se is not None and n in sol.mean_se:
            se = sol.mean_se[n]
        elif sol.info.get("samples") is None or n in observables:
            try:
                se = sol.mean_stderr(n)
            except DmftcError:
                se = None
        if se is not None:
            b.add("mean_se", n, se, idx, times)
        if n in observables:
            v = sol.var(n)
            vidx = _index_dims(n, v.ndim - 1, names)
            b.add("var", n, v, vidx, ("t",))
            try:
                b.add("var_se", n, sol.var_stderr(n), vidx, ("t",))
            except ParameterError:
                pass
        for prefix, table in (("m1", sol.m1), ("m1_se", sol.m1_se)):
            if table is not None and n in table:
                b.add(prefix, n, table[n], idx, times)
    ds = b.dataset(attrs)
    if sigma is None:
        sigma = [(n, n) for n in sol.observables] if _dense(sol.blocks) else []
    for pair in sigma:
        if isinstance(pair, str) or len(pair) != 2:
            raise ParameterError(f"sigma takes pairs of names, e.g. [('Delta', 'Delta')]; got {pair!r}")
        ds = _add_sigma(ds, sol, *pair, names)
    return ds


def _add_sigma(ds, sol, a: str, b: str, names: dict):
    """``ds`` with the propagator block ``sigma_a_b`` (a family of layers stacks over ``layer`` / ``layer_s``)."""
    import xarray as xr

    ma, mb = _members(sol, a), _members(sol, b)
    arr = np.array([[np.asarray(sol.sigma(x, y)) for y in mb] for x in ma])    # (La, Lb, *a, T, *b, T)
    na = np.ndim(sol.var(ma[0])) - 1
    nb = arr.ndim - 2 - na - 2
    arr = np.moveaxis(arr, 1, na + 2)                                           # (La, *a, T, Lb, *b, T)
    dims = (["layer"] + _index_dims(ma[0], na, names) + ["t", "layer_s"]
            + [f"{d}_s" for d in _index_dims(mb[0], nb, names)] + ["s"])
    coords = {"t": sol.times, "s": sol.times, "layer": [_split(n)[1] for n in ma],
              "layer_s": [_split(n)[1] for n in mb]}
    if b in sol.means:                                  # a plain name: no layer axis
        arr, dims = arr.squeeze(axis=na + 2), dims[:na + 2] + dims[na + 3:]
    if a in sol.means:
        arr, dims = arr.squeeze(axis=0), dims[1:]
    for d, n in zip(dims, arr.shape):
        coords.setdefault(d, np.arange(1, n + 1))
    da = xr.DataArray(arr, dims=dims, coords={k: v for k, v in coords.items() if k in dims})
    return ds.assign({f"sigma_{a}_{b}": da})


def stats_dataset(times, mean: dict, var: dict | None = None, mean_se: dict | None = None,
                  var_se: dict | None = None, *, index: dict | None = None, attrs: dict | None = None):
    """A Dataset in the layout of :func:`solution_dataset` from plain tables name -> array (finite-width ensembles,
    :func:`dmftc.validation.truth_dataset`): ``mean`` ``(*index, T)`` or ``(*index, T, T)`` (two-time: one axis
    more than ``var``'s ``(*index, T)``), ``index``: name -> index dim names (default mu, nu)."""
    index = index or {}
    var, mean_se, var_se = var or {}, mean_se or {}, var_se or {}
    b = _Builder(times)
    for n, m in mean.items():
        m = np.asarray(m)
        n_index = np.ndim(var[n]) - 1 if n in var else m.ndim - 1
        two = m.ndim == n_index + 2
        idx = _index_dims(n, n_index, index)
        times_ = ("t", "s") if two else ("t",)
        b.add("mean", n, m, idx, times_)
        if n in mean_se:
            b.add("mean_se", n, mean_se[n], idx, times_)
        if n in var:
            b.add("var", n, var[n], idx, ("t",))
        if n in var_se:
            b.add("var_se", n, var_se[n], idx, ("t",))
    return b.dataset(dict(attrs or {}))


def zscores(a, b, rtol: float = 1e-9):
    """Pointwise z = (a - b) / sqrt(se_a^2 + se_b^2) of every statistic both Datasets have with its error
    (``mean_X`` with ``mean_se_X``, ``var_X`` with ``var_se_X``, ``m1_X`` with ``m1_se_X``), aligned by name and
    coordinates (inner join).  The denominator has a floor of ``rtol`` times the statistic's largest |value|, so
    that where both sides are exact up to rounding (e.g. N Var at t = 0) z is about 0, not rounding / rounding.
    attrs ``max_abs_<stat>``: the largest |z| of each (NaN ignored)."""
    import xarray as xr

    out = {}
    for value, error in _STATS:
        for var in a.data_vars:
            if not var.startswith(value + "_") or var.startswith(error + "_"):
                continue
            se = error + var[len(value):]
            if var in b.data_vars and se in a.data_vars and se in b.data_vars:
                xa, xb, sa, sb = xr.align(a[var], b[var], a[se], b[se], join="inner")
                if xa.size == 0 and a[var].size and b[var].size:
                    raise ParameterError(f"{var}: the two datasets share no coordinates (different times or "
                                         "sizes?)")
                scale = max(float(np.nanmax(np.abs(xa.values), initial=0.0)),
                            float(np.nanmax(np.abs(xb.values), initial=0.0)))
                out[var] = (xa - xb) / np.sqrt(sa ** 2 + sb ** 2 + (rtol * scale) ** 2)
    if not out:
        raise ParameterError("no statistic with its standard error is in both datasets (names such as mean_Delta "
                             "with mean_se_Delta, var_Delta with var_se_Delta)")
    z = xr.Dataset(out)
    for k, v in z.data_vars.items():
        finite = np.abs(v.values)[~np.isnan(v.values)]
        z.attrs[f"max_abs_{k}"] = float(finite.max()) if finite.size else float("nan")
    return z


# ---------------------------------------------------------------------------------------------- netCDF files
_RAW = ("sigma", "var_se", "kappa", "U")


def _components(dense) -> list:
    labels = [None] * dense.block
    for name in dense.names:
        shape, o = dense.shapes[name], dense.offsets[name]
        for k, idx in enumerate(itertools.product(*(range(1, n + 1) for n in shape))):
            labels[o + k] = name + (f"[{','.join(map(str, idx))}]" if idx else "")
    return labels


def write_netcdf(sol, path: Path) -> Path:
    """Write ``sol`` as netCDF-3 (SciPy engine), atomically: its Dataset (default blocks), the dense propagator
    and the results file's meta (module doc)."""
    arrays, meta, saved = sol.record()
    ds = saved.to_xarray()
    layout = {}
    for key in arrays:
        if ":" not in key or key.startswith("blocks:"):
            continue
        prefix, name = key.split(":", 1)
        family, layer = _split(name)
        layout[key] = [f"{prefix}_{family}", layer]
    if "blocks" in meta:
        dense = saved.blocks
        T, m = saved.T, dense.block
        ds = ds.assign_coords(component=np.array(_components(dense)), component_s=np.array(_components(dense)))
        for k in _RAW:
            key = f"blocks:{k}"
            if key not in arrays:
                continue
            v = np.asarray(arrays[key])
            if v.ndim == 1:
                ds[f"propagator_{k}"] = (("t", "component"), v.reshape(T, m))
            else:
                ds[f"propagator_{k}"] = (("t", "component", "s", "component_s"), v.reshape(T, m, T, m))
            layout[key] = [f"propagator_{k}", None]
    meta["netcdf_layout"] = layout
    ds.attrs["dmftc_meta"] = json.dumps(meta, sort_keys=True)
    for k, v in list(ds.attrs.items()):
        if isinstance(v, (bool, np.bool_)):
            ds.attrs[k] = int(v)
    return atomic_output(path, ".nc", lambda tmp: ds.to_netcdf(tmp, engine="scipy", format="NETCDF3_64BIT"))


def read_netcdf(path) -> tuple[dict, dict]:
    """(arrays, meta) of a netCDF file written by :func:`write_netcdf`, as :meth:`Solution.from_record` reads
    them."""
    import xarray as xr

    try:
        with xr.open_dataset(path, engine="scipy") as ds:
            ds = ds.load()
        meta = json.loads(ds.attrs["dmftc_meta"])
        layout = meta.pop("netcdf_layout")
        arrays = {"times": np.asarray(ds["t"].values, dtype=float)}
        for key, (var, layer) in layout.items():
            da = ds[var] if layer is None else ds[var].sel(layer=layer)
            v = np.asarray(da.values)
            if var.startswith("propagator_"):
                v = v.reshape(-1) if v.ndim == 2 else v.reshape(v.shape[0] * v.shape[1], -1)
            arrays[key] = v
    except (OSError, KeyError, ValueError, TypeError) as err:
        raise DmftcError(f"{path}: not a dmftc results file ({err})") from None
    return arrays, meta
