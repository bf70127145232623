"""Parameter sweeps of a compiled model (:meth:`dmftc.runtime.model.CompiledModel.sweep`): one solve per value,
serially or as Dask tasks, gathered into one ``xarray.Dataset`` with the swept parameter as a dim.

With a ``dask.distributed`` client every value is one task (:func:`dmftc.runtime.model.solve_task`): the worker
loads the model from its spec file (the generated module in the same folder as in the caller; once per worker
process and spec text), solves, and returns the solution's Dataset, which pickles as plain arrays. The seeds are the
caller's, so the sweep equals the serial one.
"""
from __future__ import annotations

import numbers
from pathlib import Path

import numpy as np

from dmftc.errors import ParameterError

__all__ = ["run_sweep", "combine"]


def combine(name: str, values: list, datasets: list):
    """The datasets of a sweep along a new dim ``name`` (coordinate: the values, or 0, 1, ... with the values as
    JSON in attr ``<name>_values`` when they are not all scalars); attrs that differ are dropped."""
    import json

    import pandas as pd
    import xarray as xr

    from dmftc.runtime.results.jsonable import jsonable

    for ds in datasets:
        if name in ds.dims or name in ds.coords or name in ds.data_vars:
            raise ParameterError(f"cannot sweep {name!r}: the results already have a dim or variable of that name")
    scalar = all(isinstance(v, numbers.Number) and np.ndim(v) == 0 for v in values)
    coord = pd.Index(list(values) if scalar else range(len(values)), name=name)
    out = xr.concat(datasets, dim=coord, combine_attrs="drop_conflicts", join="outer")
    if not scalar:
        out.attrs[f"{name}_values"] = json.dumps(jsonable(list(values)))
    return out


def run_sweep(model, name: str, values, client, kwargs: dict, *, task):
    """The sweep of :meth:`dmftc.runtime.model.CompiledModel.sweep`; ``task(spec_file, out_dir, kwargs)`` solves one
    value in a Dask worker (:func:`dmftc.runtime.model.solve_task`)."""
    values = list(values)
    if not values:
        raise ParameterError(f"sweep({name!r}, values): no values")
    if not isinstance(name, str) or not name:
        raise ParameterError(f"sweep(name, values): name is a parameter name, got {name!r}")
    runs = [{**kwargs, name: v} for v in values]
    if client is None:
        return combine(name, values, [model.solve(**kw).to_xarray() for kw in runs])
    spec = getattr(model.module, "SPEC_FILE", None)
    if spec is None or not Path(spec).exists():
        raise ParameterError("a Dask sweep loads the model from its spec file in each worker; this model has none "
                             "(load it with dmftc.load(spec_path))")
    out_dir = str(Path(model.module.__file__).resolve().parent)
    own = isinstance(client, str)
    if own:
        from dask.distributed import Client

        client = Client(client)
    try:
        futures = client.map(task, [str(spec)] * len(runs), [out_dir] * len(runs), runs, pure=False)
        datasets = client.gather(futures)
    finally:
        if own:
            client.close()
    return combine(name, values, datasets)
