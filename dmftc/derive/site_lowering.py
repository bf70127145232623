"""A two-layer spec's IR in the form of the site program (issue 12, one engine): one hidden layer whose neurons
see constant-in-time Gaussian sources, fields causal in time, and one-time order parameters that are all
readouts.

The two-layer IR (:mod:`dmftc.ir.two_layer`) writes quantities at the current step as symbols and causal
integrals as running sums ``I_k(t) = eta * sum_{s<t} increment_k(s)``.  The site program
(:mod:`dmftc.derive.site`) writes every quantity as a function of time, named like a deep spec's with the layer
variable ``l``:

* a field ``h`` -> ``h[l](t)``; a source ``u ~ normal(0, C)`` -> ``u[l](t)``, constant in time (the march reads
  the values the caller drew from ``C``, :data:`SiteProgram.normals`);
* a running sum ``I_k`` -> the quantity ``_Ik[l](t)`` (the march's state: it reads the sum over s < t and adds
  ``eta * increment(t)`` at the end of step t, once the order parameters at t are known: O(T) per path, where
  the sum over the history would cost O(T^2));
* an order parameter ``q`` -> ``q(t)`` (``q(s)`` inside a sum): a one-time order parameter of the march;
* ``coeff q + rest = <O>`` -> the readout ``coeff q + (rest - E_q) = 0`` reading the single-site average
  ``E_q = <O(t)>``; a deterministic constraint (``r(t) = -log(Delta(t) / y)``) -> a readout with no average.
  The march solves the readouts in declaration order after the fields of the step, as the two-layer march does.

Sample axes: a quantity with sample indices is a function of time and its indices, ``h[l](t, mu)``,
``Delta(s, nu)``; index sums stay SymPy sums over the index; parameters stay ``Indexed``.  The printer lays every
array out as (paths, one axis per sample index, time) (dmftc.codegen.site), as the two-layer kernels do
(dmftc.codegen.lower); ``axes`` lists the indices in that order with their sizes, ``stored`` the indices each
quantity carries.
"""
from __future__ import annotations

import sympy as sp

from dmftc.derive.site import SiteProgram, assemble, merge_sums
from dmftc.errors import StructureSpecError
from dmftc.ir.nodes import ModelIR

__all__ = ["LAYER", "TANGENT", "site_program", "tangent", "two_layer_parts"]

LAYER = "l"                 # the layer variable of the lowered program (one layer)


def _index_names(exprs, known) -> tuple:
    """The sample indices read by ``exprs``: the declared ones first, then fresh ones sorted."""
    used = set()
    for e in exprs:
        used |= {a.name for a in e.atoms(sp.Symbol) if a.name in known}
    declared = [i for i in known if i in used and "#" not in i]
    return tuple(declared + sorted(used - set(declared)))


def _reuse_dummies(expr, declared: dict, index_size: dict):
    """``expr`` with the dummy index of every index sum renamed to a declared index of the same size that is not
    free where the sum stands (``h[mu]``'s sum over ``nu#1`` becomes one over ``nu``): fewer array axes."""
    def walk(e, outer: set):
        if isinstance(e, sp.Sum) and not any(lim[0] == sp.Symbol("s") for lim in e.limits):
            rename, taken = {}, set(outer)
            for lim in e.limits:
                d = lim[0]
                if "#" in d.name:
                    free = {x for x in e.function.free_symbols if x.is_integer} - {lim[0] for lim in e.limits}
                    for name, size in declared.items():
                        cand = sp.Symbol(name, integer=True)
                        if size == index_size[d.name] and cand not in taken | free:
                            rename[d] = cand
                            taken.add(cand)
                            break
                taken.add(rename.get(d, d))
            body = walk(e.function.xreplace(rename), outer | taken)
            return sp.Sum(body, *[(rename.get(lim[0], lim[0]),) + tuple(lim[1:]) for lim in e.limits])
        if not e.args:
            return e
        inner = outer | {x for x in e.free_symbols if x.is_integer}
        return e.func(*[walk(a, inner) for a in e.args])
    return walk(expr, set())


TANGENT = "d__"      # the prefix of a perturbation: d__h[l](t, mu) is the tangent of h[l](t, mu)


def tangent(expr, perturbed: set):
    """The directional derivative of ``expr`` when every quantity named in ``perturbed`` (fields, running sums,
    the order parameters the fields read) moves along its tangent ``d__<name>``: d/de expr(a + e d__a) at 0.
    Index sums and causal structure pass through; Heaviside differentiates to DiracDelta (the mollified delta
    at run time), as in the two-layer engine's tangents."""
    eps = sp.Symbol("__eps", real=True)
    rep = {a: a + eps * sp.Function(TANGENT + type(a).__name__, real=True)(*a.args)
           for a in expr.atoms(sp.core.function.AppliedUndef) if type(a).__name__ in perturbed}
    return sp.diff(expr.xreplace(rep), eps).subs(eps, 0)


def two_layer_parts(ir: ModelIR) -> dict:
    """The arguments of :func:`dmftc.derive.site.assemble` for a two-layer IR (module doc)."""
    if ir.kind != "two_layer":
        raise StructureSpecError(f"not a two-layer IR: {ir.kind}")
    t, eta = sp.Symbol(ir.time[0]), sp.Symbol(ir.time[2], real=True)
    stored = {f.name: f.indices for f in ir.fields}
    stored.update({n: idx for src in ir.sources for n, idx in src.targets})
    fields = [f.name for f in ir.fields]
    sources = [n for src in ir.sources for n, _ in src.targets]
    orders = [o.name for o in ir.orders]
    stored.update({o.name: o.indices for o in ir.orders})
    sums = {rs.name: rs for rs in ir.sample_sums + ir.order_sums}

    def at(expr, tau):
        """``expr`` (quantities at the current step) as a function of the time ``tau``."""
        rep = {}
        for a in expr.atoms(sp.Symbol, sp.Indexed):
            if isinstance(a, sp.Indexed):
                n, idx = str(a.base.label), tuple(a.indices)
            elif a.is_integer:                                       # an index
                continue
            else:
                n, idx = a.name, ()
            if n in fields or n in sources:                  # real-valued, as the IR's symbols: |h|' = sign(h)
                rep[a] = sp.Function(f"{n}[{LAYER}]", real=True)(tau, *idx)
            elif n in orders:
                rep[a] = sp.Function(n, real=True)(tau, *idx)
            elif n in sums:
                rep[a] = sp.Function(f"{sum_name[n]}[{LAYER}]", real=True)(tau, *idx)
        return expr.xreplace(rep)

    sum_name = {n: f"_I{k + 1}" for k, n in enumerate(sums)}
    running = tuple((sum_name[n], rs.indices, rs.scope, eta * at(rs.increment, t)) for n, rs in sums.items())
    stored.update({sum_name[n]: rs.indices for n, rs in sums.items()})

    declared = {a.name: a.size for a in ir.axes}
    for k, (n, idx, scope, inc) in enumerate(running):
        running = running[:k] + ((n, idx, scope, _reuse_dummies(inc, declared, ir.index_size)),) + running[k + 1:]
    fields_out = tuple((f.name, merge_sums(at(f.expr, t), set(fields), t)) for f in ir.fields)
    reads = []
    for o in ir.orders:
        avgs = ()
        rest = at(o.rest, t)
        if o.observable is not None:
            sym = sp.Symbol(f"E_{o.name}")
            avgs = ((sym, at(o.observable, t)),)
            rest = rest - sym
        reads.append((o.name, at(o.coeff, t), rest, avgs))
    exprs = [e for _, e in fields_out] + [r[2] for r in reads] + [e for r in reads for _, e in r[3]]
    exprs += [inc for *_, inc in running]
    axes = tuple((i, ir.index_size[i]) for i in _index_names(exprs, ir.index_size))
    act = ir.activations[0][0] if ir.activations else "phi"
    read = {type(a).__name__ for e in [e for _, e in fields_out] + [inc for *_, inc in running]
            for a in e.atoms(sp.core.function.AppliedUndef)}
    drivers = tuple(n for n in orders if n in read)
    perturbed = {f"{n}[{LAYER}]" for n in fields} | {f"{sum_name[k]}[{LAYER}]" for k in sums} | set(drivers)
    tangents = tuple([("field", n, tangent(e, perturbed)) for n, e in fields_out]
                     + [("sum", n, tangent(inc, perturbed)) for n, _, _, inc in running]
                     + [("average", str(sym), tangent(e, perturbed)) for r in reads for sym, e in r[3]])
    return dict(fields=fields_out, srcs=(), fams=(), resp=(), reads=tuple(reads), time=ir.time[0], act=act,
                layer=LAYER, normals=tuple(sources), axes=axes,
                stored=tuple((n, stored[n]) for n in fields + sources + orders + [sum_name[k] for k in sums]),
                sums=running, tangents=tangents, drivers=drivers)


def site_program(ir: ModelIR) -> SiteProgram:
    """The single-site program of a deep spec's IR, or of a two-layer spec's (:func:`two_layer_parts`: one layer,
    constant-in-time sources, every order parameter a readout)."""
    if ir.kind != "deep":
        return assemble(**two_layer_parts(ir))
    tsym = sp.Symbol(ir.time[0])
    names = {f.name for f in ir.fields}
    fields = tuple((f.name, merge_sums(f.expr, names, tsym)) for f in ir.fields)
    fams = tuple((o.name, o.observable) for o in ir.orders if o.kind == "average" and o.times == 2)
    resp = tuple((o.name, o.observable, o.wrt) for o in ir.orders if o.kind == "response")
    reads = tuple((o.name, o.coeff, o.rest, tuple((a.symbol, a.expr) for a in o.averages))
                  for o in ir.orders if o.kind == "constraint" and o.averages)
    srcs = tuple((s.targets[0][0], s.depends_on[0], s.layer_offset) for s in ir.sources)
    layer = next(a.name for a in ir.axes if a.kind == "layer")
    known = tuple(c.name for c in ir.model.coefficients if c.one_time)
    return assemble(fields, srcs, fams, resp, reads, ir.time[0], ir.activations[0][0], layer, known=known)
