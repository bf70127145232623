"""The Jacobian of a two-layer program's saddle-point map in the order parameters its fields read, by the
program's own tangents (issue 12, one engine; dmftc.derive.site_lowering.tangent).

The site engine's map q -> F(q) (dmftc.runtime.engines.site_engine) is differentiated here in one forward march that
carries, beside every field and running sum, its tangents along all D directions at once: the directions
(s, component) of the driving order parameters, on the arrays' last axis (the layout's time axis, size 1 for a
value at one time, is where the directions go).  At step t the fields' tangents are the printed
``site_dfield_*`` (chain rule through SymPy, kinks as mollified deltas), the averages' the ``site_daverage_*``
averaged over the paths, each readout constraint's the jvp of its solution in (averages, the order parameters
at t, the running sums of order parameters), and the running sums advance by ``site_dincrement_*``.  The
perturbation of q_d(s) enters at step s only (its one-hot on the last axis), so nothing is recomputed per
direction and the directions are the fastest axis (JAX's vmap over directions of the whole march, which this
replaced, cost about one primal march per direction).  tests/test_site_two_layer.py checks the propagators
against the two-layer engine's symbolic tangents.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dmftc.runtime.march.site_eval import Buffers, Evaluator, layer_names, schedule

__all__ = ["driver_jacobian"]


def driver_jacobian(mod, T: int, wts, p: dict, q: dict, columns: dict, *, normals: dict, sizes: dict,
                    width: float = 0.0, avg: dict | None = None, explicit=1.0, per_step: int | None = None,
                    segments: int = 8):
    """{name: (T, 1, index dims, D)}: d F_name(t) / d (direction j), for the D directions given by ``columns``
    ({driver: (T, 1, index dims, D) one-hot}: the perturbation of that order parameter at each time), with the
    order parameters held at ``q`` ({name: (1, index dims, T)}) and paths ``normals`` of weights ``wts``.

    A batch of a group's paths: ``avg`` ({average: (1, index dims, T)}) gives the group's averages, at which the
    constraints are solved (the batch's own otherwise), ``wts`` are 1 / (the group's paths) on the batch's rows
    (0 on padding), and ``explicit`` scales the constraints' explicit dependence on the order parameters (1 in
    one batch of the group, 0 in the others): the map is then linear in the batch's paths, and the group's
    Jacobian is the sum of its batches'.

    Causality: with ``per_step`` directions per time, ordered time-major (direction j perturbs time
    j // per_step), nothing depends on q(s) before step s, so the march is cut into ``segments`` pieces and
    during the piece ending at step e the tangents carry only the first e * per_step directions (about 9/16 of
    the work of carrying all of them throughout, at 8 pieces)."""
    site = mod.SITE
    S = int(jnp.shape(wts)[0])
    B = Buffers(site, sizes, S, T)
    D = next(iter(columns.values())).shape[-1]
    src = {(n, 1): B.source(n, v) for n, v in normals.items()}
    q1 = {n: jnp.broadcast_to(jnp.asarray(q[n], jnp.float64), B.zeros(n).shape) for n, _ in site["readouts"]}
    sums = site.get("sums", ())
    order = [node for node in schedule(site, 1, *layer_names(mod)) if node[0] == "field"]
    order_sums = [(n, 1) for n, scope in sums if scope == "order"]

    def step(t, c, D):
        zeros = {n: jnp.zeros(B.zeros(n).shape[:-1] + (D,)) for n in q1}
        hist, rs, dhist, drs, rows = (dict(c[k]) for k in ("hist", "rs", "dhist", "drs", "rows"))
        dq = {n: columns[n][t][..., :D] if n in columns else zeros[n] for n in q1}
        tan = {"field": dhist, "rsum": drs, "q": dq}
        E = Evaluator(mod, 1, T, t, 1, hist, {}, q1, src, p, (), width, {}, sz=sizes, rsums=rs, tangents=tan)
        for _, name, _ in order:
            hist[(name, 1)] = jnp.broadcast_to(getattr(mod, f"site_field_{name}")(E), hist[(name, 1)].shape)
            dhist[(name, 1)] = jnp.broadcast_to(getattr(mod, f"site_dfield_{name}")(E), dhist[(name, 1)].shape)
        for qname, syms in site["readouts"]:
            vals = {sym: (B.mean(wts, getattr(mod, f"site_average_{sym}")(E), qname) if avg is None
                          else B.col(avg[sym], t)) for sym in syms}
            dvals = {sym: jnp.broadcast_to(getattr(mod, f"site_dmean_{sym}")(E, wts), (1,) + B.dims[qname] + (D,))
                     for sym in syms}

            def solve(v, qq, r, qname=qname):
                Ej = Evaluator(mod, 1, T, t, 1, hist, {}, qq, src, p, (), width, {}, sz=sizes, rsums=r)
                return getattr(mod, f"site_constraint_{qname}")(Ej, v)

            # the jvp of the constraint's solution along each direction (the last axis): cheap, no paths; the
            # tangents get a time axis of size 1 (values at t) or T (the order parameters' buffers) before it
            tq = {n: explicit * jnp.where(jnp.arange(T)[:, None] == t, dq[n][..., None, :], 0.0) for n in q1}
            ro = {k: rs[k] for k in order_sums}
            tr = {k: explicit * drs[k][..., None, :] for k in order_sums}
            tv = {k: v[..., None, :] for k, v in dvals.items()}
            fn = lambda a, b, c, qname=qname: jax.jvp(solve, (vals, q1, ro), (a, b, c))[1]    # noqa: E731
            d = jax.vmap(fn, in_axes=(-1, -1, -1), out_axes=-1)(tv, tq, tr)
            d = jnp.broadcast_to(d, (1,) + B.dims[qname] + (1, D)).reshape((1,) + B.dims[qname] + (D,))
            rows[qname] = rows[qname].at[t].set(d)
        steps = [(getattr(mod, f"site_increment_{k}")(E), getattr(mod, f"site_dincrement_{k}")(E))
                 for k in range(len(sums))]         # all from the values at t (a recurrence's reads the sums)
        for (n, _), (inc, dinc) in zip(sums, steps):
            rs[(n, 1)] = rs[(n, 1)] + inc
            drs[(n, 1)] = drs[(n, 1)] + jnp.broadcast_to(dinc, drs[(n, 1)].shape)
        return {"hist": hist, "rs": rs, "dhist": dhist, "drs": drs, "rows": rows}

    c0 = {"hist": {(f, 1): B.zeros(f, S, current=True) for f in site["fields"]},
          "rs": {(n, 1): B.zeros(n, S if scope == "sample" else None, current=True) for n, scope in sums},
          "dhist": {(f, 1): jnp.zeros((S,) + B.dims[f] + (0,)) for f in site["fields"]},
          "drs": {(n, 1): jnp.zeros((S if scope == "sample" else 1,) + B.dims[n] + (0,)) for n, scope in sums},
          "rows": {n: jnp.zeros((T, 1) + B.dims[n] + (0,)) for n in q1}}
    ends = sorted({-(-(k + 1) * T // segments) for k in range(segments)}) if per_step else [T]
    c, start = c0, 0
    for end in ends:
        width_k = D if per_step is None else min(D, end * per_step)
        c = {**c, **{k: {key: _widen(v, width_k) for key, v in c[k].items()} for k in ("dhist", "drs", "rows")}}
        c = jax.lax.fori_loop(start, end, lambda t, c, D=width_k: step(t, c, D), c)
        start = end
    return {n: _widen(v, D) for n, v in c["rows"].items()}


def _widen(x, width: int):
    """x with its last axis (the directions) zero-padded to ``width``."""
    extra = width - x.shape[-1]
    return x if extra == 0 else jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)])
