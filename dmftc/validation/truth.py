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
from dmftc.validation.extrapolate import richardson


@dataclass(frozen=True)
class Truth:
    mean: dict
    nvar: dict
    mean_se: dict
    nvar_se: dict
    N: int
    E: int


def _network(model: str, p: dict):
    """(activation, Kx_all, y, {order parameter: (recorded key, index[, per-member transform])}); a transformed
    entry exists only for per-member records (:func:`mean_shift_truth`)."""
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
    if model == "rates":       # the two_layer network without its test point; r = -log(Delta / y) per member
        y = float(p["y"])
        return "tanh", np.array([[1.0]]), np.array([y]), {
            "Delta": ("Delta", (0,)), "K": ("K", (0, 0)), "r": ("Delta", (0,), lambda d: -np.log(d / y))}
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
        return richardson(a, b)
    act, Kx_all, y, names = _network(model, params)
    stats = simulate_two_layer(activation=act, Kx_all=Kx_all, y=y, gamma=float(params["gamma"]),
                               eta=float(params["eta"]), T=int(params["T"]), N=N, E=E, seed=seed)
    out = {k: {} for k in ("mean", "nvar", "mean_se", "nvar_se")}
    for name, (key, idx, *fn) in names.items():
        if fn:                        # a nonlinear function of the records: its mean needs the members
            continue
        for field in out:
            arr = getattr(stats, field)[key]
            out[field][name] = arr[idx] if idx else arr
    return Truth(out["mean"], out["nvar"], out["mean_se"], out["nvar_se"], N, E)


@dataclass(frozen=True)
class MeanShift:
    """N (E[q]_N - q_inf) measured with common random numbers: ``value[name]`` (shape of ``Solution.mean``),
    its standard error ``se[name]`` (spread over ``batches`` independent batches of members); ``value['loss']``
    is N (E[sum_mu Delta_mu^2]_N - |Delta_inf|^2), to compare with 2 Delta_inf . m1 + tr Sigma(t, t).

    ``loss`` / ``loss_se``: the plain ensemble mean of the training loss sum_mu Delta_mu(t)^2 over the E members
    and its standard error std / sqrt(E) (no common random numbers: what an experimenter measures at width N)."""

    value: dict
    se: dict
    N: int
    E: int
    batches: int
    loss: np.ndarray | None = None
    loss_se: np.ndarray | None = None


def mean_shift_truth(compiled, params: dict, *, N: int, E: int, batches: int = 16, seed: int = 0,
                     network: str | None = None, activation: str | None = None) -> MeanShift:
    """The O(1/N) shift of the ensemble mean of width-N networks, N (E[q]_N - q_inf), for a two-layer spec.

    The ensemble mean carries the first-order fluctuation (1/N) sum_i v(xi_i) of every member, zero-mean but
    of size N^-1/2 per member, which would need ~N^2 / m1^2 members to average away.  Instead each batch of
    E_b members is compared with the spec's saddle-point march run on exactly those members' E_b N neurons
    (their first-layer projections u_i = W_i . x / sqrt(D) and readout weights w_i are the spec's sources):
    that width-(E_b N) system carries the same first-order fluctuation, so the difference
    d_b = mean_b(q_N) - q_{E_b N} = m1 (1/N - 1/(E_b N)) + O(N^-2) has only second-order noise.  Returns
    N d_b / (1 - 1/E_b), averaged over the batches.  ``network``: the shipped model whose network the spec
    describes (default: the spec's own name); ``activation``: the networks' activation when the spec changes the
    shipped one (one of dmftc.validation.ensemble.ACTIVATIONS).
    """
    from dmftc.validation.ensemble import draw_parameters, inputs_from_gram

    from dmftc.runtime.problem.params import resolve_params

    full, _, _ = resolve_params(compiled.module, dict(params))
    act, Kx_all, y, names = _network(network or compiled.name, full)
    act = activation or act
    stats = simulate_two_layer(activation=act, Kx_all=Kx_all, y=y, gamma=float(full["gamma"]),
                               eta=float(full["eta"]), T=int(full["T"]), N=N, E=E, seed=seed,
                               keep_samples=True)
    X = inputs_from_gram(Kx_all)
    D = X.shape[1]
    W, w = draw_parameters(np.random.default_rng(seed), E, N, D)     # the members' draws, in member order
    u = np.einsum("mid,ad->mia", W, X) / np.sqrt(D)                   # (E, N, n): u_{i,a} = W_i . x_a / sqrt(D)
    edges = np.linspace(0, E, batches + 1).astype(int)
    diffs = {name: [] for name in list(names) + ["loss"]}
    for a, b in zip(edges[:-1], edges[1:]):
        draws = [u[a:b].reshape(-1, u.shape[2]), w[a:b].reshape(-1, 1)]
        ref = compiled.saddle_on_draws(draws, **params)
        for name, (key, idx, *fn) in names.items():
            rec = stats.samples[key][a:b]
            rec = rec[(slice(None),) + idx] if idx else rec
            rec = fn[0](rec) if fn else rec
            diffs[name].append(N * (rec.mean(axis=0) - ref[name]) / (1 - 1 / (b - a)))
        # the training loss sum_mu Delta_mu(t)^2: E = |Delta_inf|^2 + (2 Delta_inf . m1 + tr Sigma) / N
        loss = (stats.samples["Delta"][a:b] ** 2).sum(axis=1).mean(axis=0)
        ref_loss = (np.asarray(ref["Delta"]).reshape(-1, loss.shape[-1]) ** 2).sum(axis=0)
        diffs["loss"].append(N * (loss - ref_loss) / (1 - 1 / (b - a)))
    value = {k: np.mean(v, axis=0) for k, v in diffs.items()}
    se = {k: np.std(v, axis=0, ddof=1) / np.sqrt(batches) for k, v in diffs.items()}
    member_loss = (stats.samples["Delta"] ** 2).reshape(E, -1, stats.samples["Delta"].shape[-1]).sum(axis=1)
    return MeanShift(value, se, N, E, batches, loss=member_loss.mean(axis=0),
                     loss_se=member_loss.std(axis=0, ddof=1) / np.sqrt(E))
