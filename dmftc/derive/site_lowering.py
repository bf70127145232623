"""A two-layer spec's IR in the form of the site program (issue 12, one engine): one hidden layer whose neurons
see constant-in-time Gaussian sources, fields causal in time, and one-time order parameters that are all
readouts.

The two-layer IR (:mod:`dmftc.ir.two_layer`) writes quantities at the current step as symbols and causal
integrals as running sums ``I_k(t) = eta * sum_{s<t} increment_k(s)``.  The site program
(:mod:`dmftc.derive.site`) writes every quantity as a function of time, named like a deep spec's with the layer
variable ``l``:

* a field ``h`` -> ``h[l](t)``; a source ``u ~ normal(0, C)`` -> ``u[l](t)``, constant in time (the march reads
  the values the caller drew from ``C``, :data:`SiteProgram.normals`);
* a running sum -> ``eta * Sum(increment(s), (s, 0, t - 1))``, its increment at the earlier time s;
* an order parameter ``q`` -> ``q(t)`` (``q(s)`` inside a sum): a one-time order parameter of the march;
* ``coeff q + rest = <O>`` -> the readout ``coeff q + (rest - E_q) = 0`` reading the single-site average
  ``E_q = <O(t)>``; a deterministic constraint (``r(t) = -log(Delta(t) / y)``) -> a readout with no average.
  The march solves the readouts in declaration order after the fields of the step, as the two-layer march does.

Specs with sample axes (``h[mu]``, ``K[mu, nu]``) are not lowered yet: :func:`two_layer_parts` raises a
:class:`StructureSpecError` for them.
"""
from __future__ import annotations

import sympy as sp

from dmftc.derive.site import merge_sums
from dmftc.errors import StructureSpecError
from dmftc.ir.nodes import ModelIR

__all__ = ["LAYER", "two_layer_parts"]

LAYER = "l"                 # the layer variable of the lowered program (one layer)


def _check_scalar(ir: ModelIR, expr, what: str):
    if any(isinstance(a, sp.Indexed) for a in sp.preorder_traversal(expr)):
        raise StructureSpecError(f"{what} has sample axes, which the site program does not lower yet")


def two_layer_parts(ir: ModelIR) -> dict:
    """The arguments of :func:`dmftc.derive.site.assemble` for a two-layer IR (module doc)."""
    if ir.kind != "two_layer":
        raise StructureSpecError(f"not a two-layer IR: {ir.kind}")
    if ir.axes:
        raise StructureSpecError(f"{ir.model.spec.model.name} has sample axes "
                                 f"({', '.join(a.name for a in ir.axes)}), which the site program does not lower yet")
    t, s, eta = sp.Symbol(ir.time[0]), sp.Symbol("s"), sp.Symbol(ir.time[2], real=True)
    fields = [f.name for f in ir.fields]
    sources = [n for src in ir.sources for n, _ in src.targets]
    orders = [o.name for o in ir.orders]
    sums = {rs.name: rs for rs in ir.sample_sums + ir.order_sums}

    def at(expr, tau, inside=False):
        """``expr`` (symbols at the current step) as a function of the time ``tau``."""
        rep = {}
        for a in expr.atoms(sp.Symbol):
            n = a.name
            if n in fields or n in sources:
                rep[a] = sp.Function(f"{n}[{LAYER}]")(tau)
            elif n in orders:
                rep[a] = sp.Function(n)(tau)
            elif n in sums:
                if inside:
                    raise StructureSpecError(f"the increment of a causal integral reads another one ({n}); the "
                                             "site program needs it as a field")
                rep[a] = eta * sp.Sum(at(sums[n].increment, s, True), (s, 0, tau - 1))
        return expr.xreplace(rep)

    for f in ir.fields:
        _check_scalar(ir, f.expr, f"field {f.name}")
    field_exprs = {f.name: at(f.expr, t) for f in ir.fields}
    fields_out = tuple((n, merge_sums(e, set(fields), t)) for n, e in field_exprs.items())
    reads = []
    for o in ir.orders:
        _check_scalar(ir, o.rest + (o.observable or 0), f"order parameter {o.name}")
        avgs = ()
        rest = at(o.rest, t)
        if o.observable is not None:
            sym = sp.Symbol(f"E_{o.name}")
            avgs = ((sym, at(o.observable, t)),)
            rest = rest - sym
        reads.append((o.name, at(o.coeff, t), rest, avgs))
    act = ir.activations[0][0] if ir.activations else "phi"
    return dict(fields=fields_out, srcs=(), fams=(), resp=(), reads=tuple(reads), time=ir.time[0], act=act,
                layer=LAYER, normals=tuple(sources))
