"""Finite-width ensembles as labelled Datasets, in the layout of ``Solution.to_xarray()`` (docs/results.md), so
that theory and networks line up by name: ``dmftc.zscores(sol.to_xarray(), truth_dataset(truth, like=sol))``."""
from __future__ import annotations

import numpy as np

from dmftc.errors import ParameterError
from dmftc.runtime.results.labelled import stats_dataset
from dmftc.validation.ensemble import EnsembleStats

__all__ = ["truth_dataset"]

# simulate_two_layer's records: Delta over the P training points (mu), the rest over every input, training points
# then test points (a, b)
_RECORDS = {"Delta": ["mu"], "f": ["a"], "K": ["a", "b"], "M": ["a"]}


def truth_dataset(stats, times=None, *, like=None, index: dict | None = None):
    """``mean_X``, ``mean_se_X``, ``var_X`` (N Var), ``var_se_X`` of an ensemble's statistics: a
    :class:`~dmftc.validation.truth.Truth`, :class:`~dmftc.validation.ensemble.EnsembleStats` or
    :class:`~dmftc.validation.deep_ensemble.DeepEnsembleStats` (deep two-time kernels get dims (t, s) and their
    layers stack over ``layer``).  The records of ``EnsembleStats`` (Delta over the training points ``mu``; f, K,
    M over every input ``a``, ``b``: training points, then test points) are the network's, not a spec's names.  ``times``: the time coordinate (default ``like.times`` or ``stats.times``);
    ``like``: a Solution whose times and index names to use (the comparison's other side); ``index``: name ->
    index dim names (default the solution's, else mu, nu)."""
    mean = stats.mean
    mean_se = getattr(stats, "mean_se", None)
    mean_se = getattr(stats, "se_mean", None) if mean_se is None else mean_se
    var_se = getattr(stats, "nvar_se", None)
    var_se = getattr(stats, "se_nvar", None) if var_se is None else var_se
    if times is None:
        times = like.times if like is not None else getattr(stats, "times", None)
    if times is None:
        raise ParameterError("truth_dataset: give times= (or like=solution): these statistics carry no times")
    times = np.asarray(times, dtype=float)
    T = {np.shape(v)[-1] for v in stats.nvar.values()}
    if T != {len(times)}:
        raise ParameterError(f"truth_dataset: {len(times)} times for statistics over {sorted(T)} steps")
    if index is None and like is not None:
        index = like.info.get("index_names")
    if index is None:                                           # the ensemble's own index names, if it has them
        index = getattr(stats, "index", None)
    if index is None and isinstance(stats, EnsembleStats):      # the network's records, on all its inputs
        index = dict(_RECORDS)
    attrs = {"title": "finite-width ensemble", "N": int(stats.N), "E": int(stats.E)}
    if like is not None:
        attrs["model"] = like.model
    return stats_dataset(times, mean, stats.nvar, mean_se, var_se, index=index, attrs=attrs)
