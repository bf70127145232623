"""The saddle-point march of a deep spec from its generated single-site program (issue 12).

Where the structured march of :mod:`dmftc.runtime.march.deep_dmft` fills a fixed template (forward field h, backward
field z, g = phi'(h) z; the spec supplies coupling coefficients, boundaries and readout), this march runs the
spec's own field equations, kernels, responses and readout, as :mod:`dmftc.codegen.site` printed them into the
generated module (``SITE`` and the ``site_*`` functions, called with an :class:`Evaluator`).  Per time step t,
every layer's quantities in the order of their same-time reads (``SITE['reads']``, :func:`schedule`):

* a gp source ``x[l] ~ gp(0, Q[l+k])`` grows causally, x(t) = sum_{s<=t} C(t, s) xi(s), the Cholesky factor C of
  Q[l+k] extended by its row t (a boundary layer's constant value beyond the hidden layers; pivots below a
  relative threshold are zero, as in the structured march);
* a field is its function of the fields at t (paths,), the fields at every earlier s (paths, T), the rows t of
  the neighbouring kernels and responses (T,) and the one-time order parameters (T,);
* a kernel's row t is the weighted path average of its observable at (t, s <= t);
* a response ``R[l](t, s) = <d X(t) / d x[l](s)>`` is the path average of forward-mode tangents: every field of
  the layer carries its derivative with respect to an additive perturbation of the source x[l] at each time s
  (``jax.jvp`` of the same generated functions, vectorised over s, the order parameters held fixed).  The
  tangents are pathwise: a kink in phi' (relu) differentiates to 0 on each side, and the delta function of its
  phi'' is dropped, not mollified.  Measured against depth-L relu networks (experiments/deep_relu_means.py): the
  means of K are 3-10% of their peak off in rich training, growing with gamma and depth; with the delta as a
  Gaussian of width 0.1 they are 9-73% off, and as the width shrinks the means diverge (the neurons of layer 1
  that switch off keep a fixed h, so the tangents multiply deltas at the same point).  The solution says so
  (:func:`dmftc.runtime.engines.deep_solution.kink_note`);
* a path factor of the fields' sums (``SITE['terms']``: phi(h[l](s)), g[l](s)) is computed once, at its time, with
  its tangents; a sum reads the kept values and tangents (paths x T^2 per factor and step, as for one
  matrix-vector product), so that no step re-evaluates a factor, or differentiates it, over the whole history.
  The fields' own tangents live for the current step only.  Tangent histories are stored flat, (direction s *
  paths, time), and written as columns in place (a 3-D buffer read through a reshape made XLA copy it each step);
* last, the readout constraints: each average X(t) on the paths ('direct') and, where
  :mod:`dmftc.derive.site` found Stein's lemma to apply, sum_{s<=t} Cov_x(t, s) <dY / dx(s)> + <X - x(t) Y>
  ('stein', the default, whose Monte Carlo error does not grow like 1/gamma); an average at a fixed time reads
  its t-form's history.

A two-layer spec's program (dmftc.derive.site_lowering: one layer, sources constant in time, order parameters
that are all readouts) runs through the same march: its sources are the values the caller drew (``normals``),
its causal integrals are running sums carried as state (``SITE['sums']``, advanced at the end of each step), and
its arrays are laid out over the sample indices (:class:`Evaluator`, :class:`Buffers`);
:mod:`dmftc.runtime.engines.site_engine` differentiates it for the propagator (:func:`replay_march`,
:func:`readout_pass`).

With ``direct=True`` the result is the exact saddle of the Monte Carlo action of the given paths (what the
propagator differentiates).  The structured march computes the same numbers (tests/test_site_march.py: equal to
round-off on the same paths for several specs, both readouts).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dmftc.errors import StructureSpecError
from dmftc.runtime.numerics.march_numerics import PIVOT_TOL, at_index, extend_cholesky, set_col, set_index
from dmftc.runtime.problem.spec_kernels import layer_number
from dmftc.runtime.march.site_eval import (Buffers, Evaluator, boundary_row, layer_names, point_params, schedule,
                                     update_mask)


__all__ = ["Buffers", "Evaluator", "adjoint_march", "boundary_row", "constraint_pass", "layer_names", "layer_number",
           "point_params", "readout_pass", "replay_march", "schedule", "site_march", "update_mask"]


def site_march(mod, act, L: int, T: int, xi: dict, wts, p: dict, *, width: float = 0.1, direct: bool = False,
               pivot_tol: float = PIVOT_TOL, tangent_wts=None, points: int = 1, normals: dict | None = None,
               sizes: dict | None = None):
    """One march of the generated module ``mod`` on standard normals ``xi`` (source name -> (L, S, T)) with path
    weights ``wts`` (S,) summing to 1 (or 1 per row of an exact basis).  ``act``: (phi, phi', phi'', ...) as
    functions of x; ``p``: parameter values; ``width``: the delta functions' width (where the generated code
    has any).  ``direct``: the readout reads the plain path averages (the saddle of the Monte Carlo action of
    these paths) instead of their Stein's-lemma form.  Returns (rows {(name, l): (T, T) causal rows of kernels
    and responses}, q1 {name: (T,)}, hist {(field, l): (S, T)}, avg {('stein' | 'direct', symbol): (T,)},
    chol {(source, l): (T, T)}).  ``pivot_tol``: residual variance below this fraction of the diagonal counts as
    zero in the sources' Cholesky factors (an exact basis needs the tighter ``march_numerics.PIVOT_TOL_EXACT``).
    ``tangent_wts``: the weights of the averages of tangents (responses, the Stein term); default ``wts``.  On an
    exact basis (rows = basis directions of the sources, ``wts`` = 1 each, exact for the quadratic averages of
    linear fields) the tangents are the same on every row and their average is any row's: weights 1 / rows.
    ``points``: P of a spec on several training points, whose steps are then the T = (time steps) P pairs
    (time, point) (:class:`Evaluator`).  ``normals``: the values (S,) of the sources constant in time
    (``SITE['normals']``, a two-layer spec's: drawn by the caller from the module's ``source_covariances``), the
    same in every layer; ``sizes``: the sizes of its sample indices (dmftc.runtime.problem.params), whose arrays then
    have the layout of :class:`Evaluator` (q1 (1, index dims, T))."""
    c = _march(mod, act, L, T, xi, wts, p, width=width, direct=direct, pivot_tol=pivot_tol, tangent_wts=tangent_wts,
               points=points, normals=normals, sizes=sizes)
    return c["rows"], c["q1"], c["hist"], c["avg"], c["chol"]


def replay_march(mod, act, L: int, T: int, xi: dict, wts, p: dict, q: dict, **kw) -> dict:
    """The march with the one-time order parameters held at the given trajectories ``q`` ({name: (T,)}) instead
    of solving the readouts: what the saddle-point map makes of them.  Returns the march's state with, besides
    those of :func:`site_march`, 'solved' {name: (T,)} (each readout constraint's solution from the averages
    of these paths, the order parameters read at the same time taken from ``q``), 'paths' {average: (S, T)}
    (its per-path values) and 'dv' {(name, average): (T,)} (the solution's derivative in the average).  At the
    saddle, 'solved' equals ``q``; its Jacobian in ``q`` and the paths' covariance give the propagator
    (dmftc.runtime.engines.site_engine).  A two-layer program (layout) keeps its fields' and running sums' current values
    only; their histories come back too, 'rec_hist' {(field, 1): (S, index dims, T)} and 'rec_sums', for
    :func:`readout_pass` (``history=False``: not kept, which saves writing them at every step)."""
    return _march(mod, act, L, T, xi, wts, p, replay=q, **kw)


def adjoint_march(mod, act, L: int, T: int, xi: dict, wts, p: dict, *, shift: dict | None = None,
                  hold: dict | None = None, dsrc: dict | None = None, record: bool = False, **kw) -> dict:
    """The march of a deep program (direct readout) as the adjoint engine differentiates it
    (:mod:`dmftc.runtime.adjoint`); returns the march's final state.

    ``shift``: additive perturbations eps of the averages, {('row', name, l): (T, T)} (a kernel's or response's
    row t gains row t of eps) and {('avg', symbol): (T,)} (a readout's direct average at t); the march's response
    to them is d q / d eps.  ``hold``: {'rows': ..., 'q1': ...}, the order parameters the fields, sources and
    constraints read, held at these values (a saddle's): the averages the march then computes are the single-site
    averages at fixed order parameters.  ``dsrc``: {(source, l): (S, T)}, added to the sources' path values.
    ``record``: also keep, per path, each response's observable X[l](t) ('X', {(name, l): (S, T)}) and its
    tangents dX[l](t) / dx[l](s) in every source x ('Gamma', {(name, x, l): (S, T, T)}, [path, t, s])."""
    return _march(mod, act, L, T, xi, wts, p, direct=True, shift=shift, hold=hold, dsrc=dsrc, record=record, **kw)


def _march(mod, act, L: int, T: int, xi: dict, wts, p: dict, *, width: float = 0.1, direct: bool = False,
           pivot_tol: float = PIVOT_TOL, tangent_wts=None, points: int = 1, normals: dict | None = None,
           replay: dict | None = None, sizes: dict | None = None, history: bool = True, shift: dict | None = None,
           hold: dict | None = None, dsrc: dict | None = None, record: bool = False):
    """The march (:func:`site_march`; ``replay``: :func:`replay_march`; ``shift``, ``hold``, ``dsrc``,
    ``record``: :func:`adjoint_march`)."""
    site = mod.SITE
    if "terms" not in site:
        raise StructureSpecError(f"{mod.SPEC_PATH}: its generated module predates the site march's path factors; "
                                 "recompile it (dmftc compile)")
    normals = {} if normals is None else normals
    missing = [n for n in site.get("normals", ()) if n not in normals]
    if missing:
        raise StructureSpecError(f"{mod.SPEC_PATH}: no values given for the constant-in-time sources {missing}")
    S = next(iter(xi.values())).shape[1] if xi else jnp.shape(next(iter(normals.values())))[0]
    twts = wts if tangent_wts is None else tangent_wts
    order = schedule(site, L, *layer_names(mod))
    names, terms = site["fields"], site["terms"]
    wrt = tuple(sorted({x for _, x in site["responses"]}))
    resp = dict(site["responses"])
    covs = {x: (fam, off) for x, fam, off in site["sources"]}
    stein = {sym: (f, x) for sym, f, x in site["stein"]}
    fixed = {sym: (o, k) for sym, o, k in site["fixed"]}
    bounds = mod.boundaries(p) if hasattr(mod, "boundaries") else {}
    idx = jnp.arange(T)
    B = Buffers(site, sizes, S, T)
    readout_of = {sym: q for q, syms in site["readouts"] for sym in syms}
    sums = site.get("sums", ())
    layers = range(1, L + 1)
    keep = B.layout and replay is not None and history
    shift = shift or {}
    dsrc = dsrc or {}
    src0 = {(n, l): B.source(n, v) for n, v in normals.items() for l in layers}     # the same at every step

    def step(t, c):
        hist, tval, dterm, chol, rows, q1, avg = (dict(c[k]) for k in ("hist", "terms", "dterms", "chol", "rows",
                                                                        "q1", "avg"))
        rs = dict(c["rsum"])
        if replay is not None:
            solved, paths, dv = dict(c["solved"]), dict(c["paths"]), dict(c["dv"])
        if record:
            seen = {k: dict(c[k]) for k in ("X", "Gamma")}
        if keep:
            rec = {k: dict(c[k]) for k in ("rec_hist", "rec_sums")}
            rec["rec_sums"] = {k: B.put(v, rs[k], t) for k, v in rec["rec_sums"].items()}
        src, dcol = dict(src0), {}            # this step's gp sources join the constant ones
        onehot = (idx == t).astype(jnp.float64)

        read_rows, read_q1 = (rows, q1) if hold is None else (hold["rows"], hold["q1"])

        def ev(l, srcs=src, cur=None, tv=tval):
            return Evaluator(mod, L, T, t, l, hist, read_rows, read_q1, srcs, p, act, width, bounds, cur=cur,
                             terms=tv, points=points, sz=sizes, rsums=rs)

        E0 = ev(1)

        def now(l):
            """Layer l's fields at t (zero for those not yet computed at this step)."""
            return {(f, l): B.col(hist[(f, l)], t) for f in names}

        def dnow(l, x):
            """Their tangents in x[l](s), (direction s, paths) each (zero for those not yet computed)."""
            return {(f, l): dcol.get((x, f, l), jnp.zeros((T, S))) for f in names}

        def tangent_at_t(fn, l, x, axis):
            """d fn / d x[l](s) for every s, the direction s on ``axis`` of (paths, T), for an observable of layer
            l's fields at t only (a path factor's, a response's, the Stein term's): the jvp in the fields' values
            at t, whose tangents are those of the current step."""
            return tangents_at_t(fn, l, (x,), axis)[x]

        def tangents_at_t(fn, l, xs, axis):
            """{x: d fn / d x[l](s)} for each source x in ``xs``, in one vmap over the directions of them all."""
            if not xs:
                return {}
            dirs = stacked([dnow(l, x) for x in xs])
            out = jax.vmap(lambda a: jax.jvp(lambda cur: fn(ev(l, cur=cur)), (now(l),), (a,))[1],
                           in_axes=0, out_axes=axis)(dirs)
            return split(out, xs, axis)

        def stacked(parts):
            """Dicts of tangents, one per source (directions first), as one dict stacked along the directions."""
            return parts[0] if len(parts) == 1 else {k: jnp.concatenate([d[k] for d in parts]) for k in parts[0]}

        def split(v, xs, axis):
            """{x: the T directions of source x} of tangents stacked by :func:`stacked` (on ``axis``)."""
            if len(xs) == 1:
                return {xs[0]: v}
            return {x: jax.lax.slice_in_dim(v, i * T, (i + 1) * T, axis=axis) for i, x in enumerate(xs)}

        for kind, name, l in order:
            if kind == "source":
                fam, off = covs[name]
                row = (at_index(read_rows[(fam, l + off)], t) if 1 <= l + off <= L
                       else boundary_row(E0.at(l).boundary(fam, l + off), t, T, points))
                chol[(name, l)] = C = extend_cholesky(chol[(name, l)], row * (idx <= t), t, pivot_tol)
                src[(name, l)] = xi[name][l - 1] @ at_index(C, t)
                if (name, l) in dsrc:
                    src[(name, l)] = src[(name, l)] + at_index(dsrc[(name, l)], t, 1)
            elif kind == "field":
                fn = getattr(mod, f"site_field_{name}")
                srcs = {k: v for k, v in src.items() if k[1] == l}
                tl = {k: v for k, v in tval.items() if k[1] == l}

                def value(tv, ss, cs, fn=fn):
                    """The field as a function of layer l's path factors (histories), sources and fields at t."""
                    return fn(ev(l, srcs={**src, **ss}, cur=cs, tv={**tval, **tv}))

                hist[(name, l)] = B.put(hist[(name, l)], value(tl, srcs, now(l)), t)
                # d field(t) / d x[l](s) for every source x, in one vmap over the directions (x, s): (x s, paths)
                if wrt:
                    dt = stacked([{k: dterm[(x,) + k].reshape(T, S, T) for k in tl} for x in wrt])  # (x s, paths, time)
                    ds = stacked([{k: (onehot[:, None] * jnp.ones((1, S)) if k[0] == x else jnp.zeros((T, S)))
                                   for k in srcs} for x in wrt])
                    both = jax.vmap(lambda a, b, d: jax.jvp(value, (tl, srcs, now(l)), (a, b, d))[1])(
                        dt, ds, stacked([dnow(l, x) for x in wrt]))
                    for x, d in split(both, wrt, 0).items():
                        dcol[(x, name, l)] = d
            elif kind == "term":
                fn = getattr(mod, f"site_term_{terms.index(name)}")
                tval[(name, l)] = B.put(tval[(name, l)], fn(ev(l, cur=now(l))), t)
                for x, d in tangents_at_t(fn, l, wrt, 0).items():
                    dterm[(x, name, l)] = set_col(dterm[(x, name, l)], d, t)
            elif name in resp:
                fn = getattr(mod, f"site_response_{name}")
                d = tangent_at_t(fn, l, resp[name], 1)
                rows[(name, l)] = set_index(rows[(name, l)], _shifted(twts @ d, shift, ("row", name, l), t), t)
                if record:
                    seen["X"][(name, l)] = set_col(seen["X"][(name, l)], fn(ev(l, cur=now(l))), t)
                    for x in wrt:
                        dx = d if x == resp[name] else tangent_at_t(fn, l, x, 1)
                        seen["Gamma"][(name, x, l)] = set_index(seen["Gamma"][(name, x, l)], dx, t, 1)
            else:
                obs = getattr(mod, f"site_kernel_{name}")(E0.at(l))
                kt = _shifted(wts @ jnp.broadcast_to(obs, (S, T)), shift, ("row", name, l), t) * (idx <= t)
                rows[(name, l)] = set_index(rows[(name, l)], kt, t)
        EL = E0.at(L)
        now_avg, now_X = {}, {}
        for qname, syms in site["readouts"]:
            for sym in syms:
                if sym in fixed:
                    continue
                now_X[sym] = X = getattr(mod, f"site_average_{sym}")(EL)
                now_avg[sym] = _shifted(B.mean(wts, X, readout_of[sym]), shift, ("avg", sym), t)
                avg[("direct", sym)] = B.put(avg[("direct", sym)], now_avg[sym], t)
                if sym in stein:
                    f, x = stein[sym]
                    fam, off = covs[x]
                    Yf = getattr(mod, f"site_stein_{sym}")
                    dY = tangent_at_t(Yf, L, x, 1)
                    cov = (at_index(rows[(fam, L + off)], t) if 1 <= L + off <= L
                           else boundary_row(EL.boundary(fam, L + off), t, T, points))
                    val = jnp.sum(cov * (idx <= t) * (twts @ dY)) + wts @ (X - src[(x, L)] * Yf(EL))
                    avg[("stein", sym)] = set_index(avg[("stein", sym)], val, t)
            vals = {}
            for sym in syms:
                base, k = fixed.get(sym, (sym, None))
                kind = "stein" if (base in stein and not direct) else "direct"
                if kind == "direct" and k is None:
                    vals[sym] = now_avg[sym]
                else:
                    vals[sym] = B.col(avg[(kind, base)], t if k is None else k * points + t % points)
            solve = getattr(mod, f"site_constraint_{qname}")
            if replay is None:
                q1[qname] = B.put(q1[qname], solve(EL, vals), t)
                continue
            solved[qname] = B.put(solved[qname], solve(EL, vals), t)
            for sym in syms:
                if sym not in fixed:
                    paths[sym] = B.put(paths[sym], now_X[sym], t)
                unit = {k: jnp.ones_like(v) * float(k == sym) for k, v in vals.items()}    # per component
                dv[(qname, sym)] = B.put(dv[(qname, sym)], jax.jvp(lambda v: solve(EL, v), (vals,), (unit,))[1], t)
        E1 = ev(1)                  # the running sums advance by their increments at t (order parameters at t known)
        incs = {(n, l): getattr(mod, f"site_increment_{k}")(E1.at(l)) for k, (n, _) in enumerate(sums)
                for l in layers}
        out = {"hist": hist, "terms": tval, "dterms": dterm, "chol": chol, "rows": rows, "q1": q1, "avg": avg,
               "rsum": {k: v + incs[k] for k, v in rs.items()}}
        if replay is not None:
            out.update(solved=solved, paths=paths, dv=dv)
        if record:
            out.update(seen)
        if keep:
            rec["rec_hist"] = {k: B.put(v, hist[k], t) for k, v in rec["rec_hist"].items()}
            out.update(rec)
        return out

    c0 = {"hist": {(f, l): B.zeros(f, S, current=B.layout) for f in names for l in layers},
          "terms": {(n, l): B.zeros(None, S) for n in terms for l in layers},
          "dterms": {(x, n, l): jnp.zeros((T * S, T)) for x in wrt for n in terms for l in layers},
          "chol": {(x, l): jnp.zeros((T, T)) for x, _, _ in site["sources"] for l in layers},
          "rows": {(q, l): jnp.zeros((T, T)) for q in site["kernels"] + tuple(resp) for l in layers},
          "q1": {q: B.zeros(q) for q, _ in site["readouts"]},
          "avg": {(k, sym): B.zeros(q) for q, syms in site["readouts"] for sym in syms if sym not in fixed
                  for k in ("stein", "direct") if k == "direct" or sym in stein}}
    c0["rsum"] = {(n, l): B.zeros(n, S if scope == "sample" else None, current=True) for n, scope in sums
                  for l in layers}
    if record:                      # per path: each response's observable X (S, T) and its tangents in every source
        c0["X"] = {(n, l): jnp.zeros((S, T)) for n in resp for l in layers}
        c0["Gamma"] = {(n, x, l): jnp.zeros((S, T, T)) for n in resp for x in wrt for l in layers}
    if keep:                        # the current-only buffers' histories, for the readout pass
        c0["rec_hist"] = {k: B.zeros(k[0], S) for k in c0["hist"]}
        c0["rec_sums"] = {(n, l): B.zeros(n, S if scope == "sample" else None) for n, scope in sums for l in layers}
    if replay is not None:
        c0["q1"] = {q: jnp.broadcast_to(jnp.asarray(replay[q], jnp.float64), B.zeros(q).shape)
                    for q, _ in site["readouts"]}
        c0.update(solved={q: B.zeros(q) for q, _ in site["readouts"]},
                  paths={sym: B.zeros(q, S) for q, syms in site["readouts"] for sym in syms if sym not in fixed},
                  dv={(q, sym): B.zeros(q) for q, syms in site["readouts"] for sym in syms})
    return jax.lax.fori_loop(0, T, step, c0)



def _shifted(value, shift: dict, key, t):
    """An average's row or entry t, plus that of its additive perturbation in ``shift`` if it has one (no operation
    is traced otherwise)."""
    return value + at_index(shift[key], t) if key in shift else value


def readout_pass(mod, T: int, wts, p: dict, q: dict, hist: dict, *, normals: dict, sizes: dict | None = None,
                 width: float = 0.0, rsums: dict | None = None) -> dict:
    """The readouts of a one-time program (a two-layer spec's: no kernels, responses or Stein plans) on fixed
    field histories ``hist`` ({(field, 1): buffer}, as a march left them) with the order parameters held at
    ``q`` (``rsums``: the running sums' histories, likewise fixed): {name: buffer} of each readout constraint's
    solution, as :func:`replay_march` computes it.  The
    fields do not read the order parameters outside ``SITE['drivers']``; their derivatives in the solutions
    come from this pass alone (dmftc.runtime.engines.site_engine)."""
    site = mod.SITE
    if site["kernels"] or site["responses"] or site["stein"] or site["fixed"]:
        raise StructureSpecError(f"{mod.SPEC_PATH}: the readout pass is that of a one-time program")
    S = jnp.shape(wts)[0]
    B = Buffers(site, sizes, S, T)
    src = {(n, 1): B.source(n, v) for n, v in normals.items()}
    q1 = {n: jnp.broadcast_to(jnp.asarray(q[n], jnp.float64), B.zeros(n).shape) for n, _ in site["readouts"]}

    def step(t, solved):
        E = Evaluator(mod, 1, T, t, 1, hist, {}, q1, src, p, (), width, {}, sz=sizes, rsums=rsums)
        solved = dict(solved)
        for name, syms in site["readouts"]:
            vals = {sym: B.mean(wts, getattr(mod, f"site_average_{sym}")(E), name) for sym in syms}
            solved[name] = B.put(solved[name], getattr(mod, f"site_constraint_{name}")(E, vals), t)
        return solved

    return jax.lax.fori_loop(0, T, step, {n: B.zeros(n) for n, _ in site["readouts"]})


def constraint_pass(mod, T: int, p: dict, q: dict, avg: dict, *, sizes: dict | None = None,
                    width: float = 0.0) -> dict:
    """Each readout constraint's solution over the whole trajectory from fixed single-site averages ``avg``
    ({average: buffer}) with the order parameters at ``q``, the running sums of order parameters recomputed from
    ``q``: the deterministic part of the saddle-point map, whose second derivative the O(1/N) mean correction
    needs (dmftc.runtime.engines.site_engine).  A one-time program only (as :func:`readout_pass`)."""
    site = mod.SITE
    B = Buffers(site, sizes, 1, T)
    q1 = {n: jnp.broadcast_to(jnp.asarray(q[n], jnp.float64), B.zeros(n).shape) for n, _ in site["readouts"]}
    order = [(k, n) for k, (n, scope) in enumerate(site.get("sums", ())) if scope == "order"]

    def step(t, c):
        solved, rs = dict(c[0]), c[1]
        E = Evaluator(mod, 1, T, t, 1, {}, {}, q1, {}, p, (), width, {}, sz=sizes, rsums=rs)
        for name, syms in site["readouts"]:
            vals = {sym: B.col(avg[sym], t) for sym in syms}
            solved[name] = B.put(solved[name], getattr(mod, f"site_constraint_{name}")(E, vals), t)
        return solved, {(n, 1): rs[(n, 1)] + getattr(mod, f"site_increment_{k}")(E) for k, n in order}

    c0 = ({n: B.zeros(n) for n, _ in site["readouts"]}, {(n, 1): B.zeros(n, None, current=True) for _, n in order})
    return jax.lax.fori_loop(0, T, step, c0)[0]
