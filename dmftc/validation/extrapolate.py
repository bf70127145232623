"""Extrapolation of finite-width statistics in 1/N: the one Richardson step every ensemble kind uses."""
from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["richardson"]


def richardson(a, b):
    """The O(1/N) corrections removed from statistics at widths N (``a``) and 2N (``b``): x = 2 x(2N) - x(N) for
    means and N Var, standard errors sqrt(4 se(2N)^2 + se(N)^2).  ``b`` with these fields replaced (so width 2N)
    and no samples; any frozen dataclass of statistics (:class:`dmftc.validation.optax_nets.OptaxEnsembleStats`, and the fields of
    :class:`dmftc.validation.truth.Truth` and :class:`dmftc.validation.deep_ensemble.DeepEnsembleStats`)."""
    fields = {f.name for f in dataclasses.fields(b)}
    new = {k: {n: 2 * getattr(b, k)[n] - getattr(a, k)[n] for n in getattr(a, k)}
           for k in ("mean", "nvar") if k in fields}
    new.update({k: {n: np.sqrt(4 * getattr(b, k)[n] ** 2 + getattr(a, k)[n] ** 2) for n in getattr(a, k)}
                for k in ("mean_se", "nvar_se", "se_mean", "se_nvar") if k in fields})
    if "samples" in fields:
        new["samples"] = None
    return dataclasses.replace(b, **new)
