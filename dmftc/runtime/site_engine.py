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
round-off on the same paths).  A kink differentiates as in the two-layer engine's symbolic tangents: the program
prints Heaviside (relu's phi') as ``kernels.step``, whose derivative is the delta function as a Gaussian of the
solve's ``dirac width``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dmftc.errors import StructureSpecError
from dmftc.runtime.linalg import causal_sandwich
from dmftc.runtime.site_march import readout_pass, replay_march, site_march

__all__ = ["normals_of", "two_layer_saddle", "two_layer_propagator"]


def _program(mod):
    if getattr(mod, "SITE", None) is None:
        raise StructureSpecError(f"{mod.SPEC_PATH}: no single-site program in its generated module"
                                 + (" (recompile it: dmftc compile)" if not hasattr(mod, "SITE") else ""))
    return mod.SITE


def normals_of(mod, draws) -> dict:
    """{source: (S,) or (S, its index)} from ``draws[k]`` (S, n_k), the k-th jointly Gaussian source group
    (``mod.SOURCES``): an indexed source is its group's draws."""
    out = {}
    for group, x in zip(mod.SOURCES, draws):
        x = jnp.asarray(x, jnp.float64)
        if len(group) == 1 and group[0][1]:
            out[group[0][0]] = x
        else:
            out.update({name: x[:, j] for j, (name, _) in enumerate(group)})
    return out


def _canonical(mod, name, v):
    """A layout array (1, index dims, T) of an order parameter -> (its components in ``mod.STORED_AXES`` order,
    T), as the two-layer engine orders them."""
    axes = tuple(a for a, _ in mod.SITE["axes"])
    stored = dict(mod.SITE["stored"])[name]
    v = jnp.asarray(v)[0]
    keep = [axes.index(i) for i in stored]
    v = jnp.transpose(v, keep + [k for k in range(len(axes)) if k not in keep] + [len(axes)])
    return v.reshape(-1, v.shape[-1])


_JIT: dict = {}


def _compiled(kind, mod, sz: dict, T: int, S: int, width: float, fn):
    """One jitted function per (module, sizes, steps, paths, delta width): repeated solves reuse it."""
    key = (kind, id(mod), tuple(sorted((k, int(v)) for k, v in sz.items())), T, S, width)
    if key not in _JIT:
        _JIT[key] = jax.jit(fn)
    return _JIT[key]


def _setup(mod, draws, p, sz):
    _program(mod)
    normals = normals_of(mod, draws)
    S = int(next(iter(normals.values())).shape[0])
    pj = {k: jnp.asarray(v, jnp.float64) for k, v in p.items()}
    return normals, S, pj, float(p.get("dirac width", 0.0))


def _march_q(mod, normals, pj, sz, T, S, width):
    return site_march(mod, (), 1, T, {}, jnp.full(S, 1.0 / S), pj, direct=True, width=width, normals=normals,
                      sizes=dict(sz))[1]


def _as_arrays(mod, q, sz, T):
    stored = dict(mod.SITE["stored"])
    axes = dict(mod.SITE["axes"])
    return {n: np.asarray(_canonical(mod, n, v)).reshape(tuple(int(sz[axes[i]]) for i in stored[n]) + (T,))
            for n, v in q.items()}


def two_layer_saddle(mod, draws, p: dict, sz: dict, T: int) -> dict:
    """The saddle-point march of a two-layer module's single-site program on given source draws (``draws[k]``
    (S, n_k) for the k-th source group of ``mod.SOURCES``; ``p``, ``sz``: the resolved parameters and sizes,
    dmftc.runtime.params).  Returns {order parameter: (*index dims, T)}: the trajectories of
    dmftc.runtime.two_layer.saddle_on_draws."""
    normals, S, pj, width = _setup(mod, draws, p, sz)
    fn = _compiled("saddle", mod, sz, T, S, width, lambda nm, pj: _march_q(mod, nm, pj, sz, T, S, width))
    return _as_arrays(mod, fn(normals, pj), sz, T)


def _propagator_core(mod, normals, pj, sz, T, S, width):
    """(q in the layout, dF/dq (T m, T m), the paths' fluctuations Y (S, T m)) (module doc)."""
    kw = dict(width=width, normals=normals, sizes=dict(sz))
    wts = jnp.full(S, 1.0 / S)
    names = [n for n, _ in mod.ORDERS]
    q = _march_q(mod, normals, pj, sz, T, S, width)
    shapes = {n: q[n].shape for n in names}
    flat = lambda d: jnp.concatenate([_canonical(mod, n, d[n]) for n in names], axis=0).T.reshape(-1)  # noqa: E731
    sizes = [int(np.prod(shapes[n][1:-1])) for n in names]
    m = sum(sizes)
    edges = np.cumsum([0] + sizes)
    axes = tuple(a for a, _ in mod.SITE["axes"])
    stored = dict(mod.SITE["stored"])

    def unflat(v):
        """(T m,) time-major -> {name: (1, index dims, T)} (the inverse of ``flat``)."""
        comp = v.reshape(T, m).T
        out = {}
        for n, a, b in zip(names, edges[:-1], edges[1:]):
            keep = [axes.index(i) for i in stored[n]]
            perm = keep + [k for k in range(len(axes)) if k not in keep]
            dims = tuple(shapes[n][1 + k] for k in perm)
            x = comp[a:b].reshape(dims + (T,))
            out[n] = jnp.transpose(x, [perm.index(k) for k in range(len(axes))] + [len(axes)])[None]
        return out

    def replay(qv, record=True):
        return replay_march(mod, (), 1, T, {}, wts, pj, unflat(qv), direct=True, record=record, **kw)

    q0 = flat(q)
    c = replay(q0)
    # dF/dq: through the march in the order parameters the fields and running sums read (the drivers), through
    # the readouts alone in the others (the fields do not depend on them)
    drive = np.zeros((T, m), dtype=bool)
    for n, a, b in zip(names, edges[:-1], edges[1:]):
        drive[:, a:b] = n in mod.SITE["drivers"]
    drive = drive.reshape(-1)
    J = jnp.zeros((T * m, T * m))
    for cols, fn in ((drive, lambda qv: flat(replay(qv, record=False)["solved"])),
                     (~drive, lambda qv: flat(readout_pass(mod, T, wts, pj, unflat(qv), c["rec_hist"],
                                                           rsums=c["rec_sums"], **kw)))):
        idx = np.flatnonzero(cols)
        if idx.size:
            J = J.at[:, idx].set(jax.jacfwd(lambda x, fn=fn, idx=idx: fn(q0.at[idx].set(x)))(q0[idx]))
    Y = {n: 0.0 for n in names}
    for name, syms in mod.SITE["readouts"]:
        for sym in syms:
            X = c["paths"][sym]
            Y[name] = Y[name] + c["dv"][(name, sym)] * (X - X.mean(axis=0, keepdims=True))
    cols = []
    for n in names:
        y = jnp.broadcast_to(Y[n], (S,) + shapes[n][1:])
        cols.append(jax.vmap(lambda row, n=n: _canonical(mod, n, row[None]))(y))    # (S, components, T)
    return q, J, jnp.concatenate(cols, axis=1).transpose(0, 2, 1).reshape(S, T * m)


def two_layer_propagator(mod, draws, p: dict, sz: dict, T: int) -> dict:
    """The saddle and the propagator of a two-layer module's single-site program on given source draws (module
    doc).  Returns {'q': {name: (*index dims, T)}, 'sigma', 'U', 'kappa': (T m, T m) time-major over the
    components of ``mod.ORDERS`` (m in all), 'condition': U's condition estimate}."""
    normals, S, pj, width = _setup(mod, draws, p, sz)
    fn = _compiled("propagator", mod, sz, T, S, width,
                   lambda nm, pj: _propagator_core(mod, nm, pj, sz, T, S, width))
    q, J, Y = fn(normals, pj)
    U = np.eye(J.shape[0]) - np.asarray(J)
    Y = np.asarray(Y)
    kappa = Y.T @ Y / (S - 1)
    sigma, cond = causal_sandwich(U, kappa)
    return {"q": _as_arrays(mod, q, sz, T), "sigma": sigma, "U": U, "kappa": kappa, "condition": cond}
