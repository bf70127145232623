"""Ground truth for the shipped specs: finite-width ensembles mapped onto order-parameter names.

Each shipped model is a two-layer network; :func:`dmftc.validation.ensemble.simulate_two_layer`
trains real width-N networks with the same discrete updates, and this module
translates its recorded quantities into the spec's order parameters, with the
same shapes as ``Solution.mean`` / ``Solution.var``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dmftc.validation.ensemble import simulate_two_layer


@dataclass(frozen=True)
class Truth:
    mean: dict
    nvar: dict
    mean_se: dict
    nvar_se: dict
    N: int
    E: int


def _network(model: str, p: dict):
    """(activation, Kx_all, y, {order parameter: (recorded key, index)})."""
    if model == "two_layer":
        kx = float(p["kx"])
        return "tanh", np.array([[1.0, kx], [kx, 1.0]]), np.array([float(p["y"])]), {
            "Delta": ("Delta", (0,)), "f_star": ("f", (1,)), "K": ("K", (0, 0)), "K_star": ("K", (0, 1))}
    if model == "two_layer_multi":
        P = int(p["P"])
        return "relu", np.asarray(p["Kx"], float), np.asarray(p["y"], float).reshape(P), {
            "Delta": ("Delta", ()), "K": ("K", ())}
    if model == "linear_whitened":
        P = int(p["P"])
        return "linear", np.eye(P), np.asarray(p["y"], float).reshape(P), {"Delta": ("Delta", ())}
    if model == "eos":
        return "linear", np.array([[1.0]]), np.array([float(p["y"])]), {
            "Delta": ("Delta", (0,)), "K": ("K", (0, 0))}
    raise KeyError(f"no finite-width network is known for model {model!r}")


def finite_width_truth(model: str, params: dict, *, N: int, E: int, seed: int = 0,
                       extrapolate: bool = False) -> Truth:
    """Ensemble means and N*Var of the order parameters of a shipped model, with standard errors.

    With ``extrapolate``, ensembles at widths N and 2N remove the O(1/N)
    corrections to the mean and to N*Var by Richardson extrapolation,
    x = 2 x(2N) - x(N), with standard errors sqrt(4 se(2N)^2 + se(N)^2).
    """
    if extrapolate:
        a = finite_width_truth(model, params, N=N, E=E, seed=seed)
        b = finite_width_truth(model, params, N=2 * N, E=E, seed=seed + 1)
        rich = lambda x, y: {k: 2 * y[k] - x[k] for k in x}
        err = lambda x, y: {k: np.sqrt(4 * y[k] ** 2 + x[k] ** 2) for k in x}
        return Truth(rich(a.mean, b.mean), rich(a.nvar, b.nvar), err(a.mean_se, b.mean_se),
                     err(a.nvar_se, b.nvar_se), 2 * N, E)
    act, Kx_all, y, names = _network(model, params)
    stats = simulate_two_layer(activation=act, Kx_all=Kx_all, y=y, gamma=float(params["gamma"]),
                               eta=float(params["eta"]), T=int(params["T"]), N=N, E=E, seed=seed)
    out = {k: {} for k in ("mean", "nvar", "mean_se", "nvar_se")}
    for name, (key, idx) in names.items():
        for field in out:
            arr = getattr(stats, field)[key]
            out[field][name] = arr[idx] if idx else arr
    return Truth(out["mean"], out["nvar"], out["mean_se"], out["nvar_se"], N, E)
