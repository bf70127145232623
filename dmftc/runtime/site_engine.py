"""The saddle and the propagator of a one-time single-site program through the site march (issue 12, one
engine): a two-layer spec lowered by :mod:`dmftc.derive.site_lowering`.

The order parameters q_k(t) are the readouts of the program: q = F(q), where F solves each readout constraint
from the single-site averages of the paths marched with the order parameters held at q
(:func:`dmftc.runtime.site_march.replay_march`).  The saddle is the march that solves them step by step.  At
the saddle, with the paths' averages replaced by their finite-width fluctuations, the paper's recipe gives the
propagator of the one-time order parameters, written here in the solved form of the constraints:

    U = 1 - dF/dq   (the whole trajectory: lower triangular in time; explicit couplings, same-time
                     constraints and the sensitivities D of the averages alike, by forward-mode autodiff of
                     the march in the order parameters the fields read)
    kappa = Cov_paths(Y),  Y_k(t) = sum_a dF_k(t)/d<O_a(t)> O_a(t)   (the averages' fluctuations)
    Sigma = U^-1 kappa U^-T

which equals the two-layer engine's (:mod:`dmftc.runtime.two_layer`: constraints coeff q + rest = <O>, U with
coeff on its diagonal, kappa = Cov(O)) row by row up to the factor 1 / coeff (tests/test_site_two_layer.py: to
round-off on the same paths).  The derivatives are pathwise: a kink in phi' differentiates to 0 on each side,
where the two-layer engine mollifies the delta function of phi''.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dmftc.errors import StructureSpecError
from dmftc.runtime.linalg import causal_sandwich
from dmftc.runtime.site_march import replay_march, site_march

__all__ = ["normals_of", "two_layer_saddle", "two_layer_propagator"]


def _program(mod):
    if getattr(mod, "SITE", None) is None:
        raise StructureSpecError(f"{mod.SPEC_PATH}: no single-site program in its generated module"
                                 + (" (recompile it: dmftc compile)" if not hasattr(mod, "SITE") else ""))
    return mod.SITE


def normals_of(mod, draws) -> dict:
    """{source: (S,)} from ``draws[k]`` (S, n_k), the k-th jointly Gaussian source group (``mod.SOURCES``)."""
    return {name: jnp.asarray(x, jnp.float64)[:, j] for group, x in zip(mod.SOURCES, draws)
            for j, (name, _) in enumerate(group)}


def _setup(mod, draws, p):
    _program(mod)
    normals = normals_of(mod, draws)
    S = next(iter(normals.values())).shape[0]
    pj = {k: jnp.asarray(v, jnp.float64) for k, v in p.items()}
    return normals, S, pj, dict(width=float(p.get("dirac width", 0.0)), normals=normals)


def two_layer_saddle(mod, draws, p: dict, T: int) -> dict:
    """The saddle-point march of a two-layer module's single-site program on given source draws (``draws[k]``
    (S, n_k) for the k-th source group of ``mod.SOURCES``; ``p`` the resolved parameters,
    dmftc.runtime.params).  Returns {order parameter: (T,)}: the trajectories of
    dmftc.runtime.two_layer.saddle_on_draws."""
    _, S, pj, kw = _setup(mod, draws, p)
    return site_march(mod, (), 1, T, {}, jnp.full(S, 1.0 / S), pj, direct=True, **kw)[1]


def two_layer_propagator(mod, draws, p: dict, T: int) -> dict:
    """The saddle and the propagator of a two-layer module's single-site program on given source draws (module
    doc).  Returns {'q': {name: (T,)}, 'sigma', 'U', 'kappa': (T m, T m) time-major over ``mod.ORDERS``,
    'condition': U's condition estimate}."""
    _, S, pj, kw = _setup(mod, draws, p)
    wts = jnp.full(S, 1.0 / S)
    names = [n for n, _ in mod.ORDERS]
    m = len(names)
    q = two_layer_saddle(mod, draws, p, T)
    q0 = jnp.stack([q[n] for n in names], axis=1).reshape(-1)

    def replay(qv):
        qd = dict(zip(names, qv.reshape(T, m).T))
        return replay_march(mod, (), 1, T, {}, wts, pj, qd, direct=True, **kw)

    def solved(qv):
        c = replay(qv)
        return jnp.stack([c["solved"][n] for n in names], axis=1).reshape(-1)

    J = np.asarray(jax.jacfwd(solved)(q0))
    U = np.eye(T * m) - J
    c = replay(q0)
    Y = np.zeros((S, T, m))
    for name, syms in mod.SITE["readouts"]:
        for sym in syms:
            X = np.asarray(c["paths"][sym])
            Y[:, :, names.index(name)] += np.asarray(c["dv"][(name, sym)])[None, :] * (X - X.mean(axis=0))
    Y = Y.reshape(S, T * m)
    kappa = Y.T @ Y / (S - 1)
    sigma, cond = causal_sandwich(U, kappa)
    return {"q": {n: np.asarray(v) for n, v in q.items()}, "sigma": sigma, "U": U, "kappa": kappa,
            "condition": cond}
