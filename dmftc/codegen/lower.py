"""Stage 4: lower a derivation to an array layout for code generation.

Every quantity is stored as an array of one uniform rank
``(batch, axis_1, ..., axis_n, s)``: ``batch`` runs over Monte Carlo samples
(or over time for trajectory-wide evaluations), one axis per index symbol
(size 1 where the quantity does not carry that index), and a trailing axis
``s`` over source times of sensitivities (size 1 elsewhere).  With this layout
products broadcast, index sums are reductions with ``keepdims`` and Kronecker
deltas are placed identity matrices, so the printer needs no index algebra.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from dmftc.derive.two_layer import Derivation


@dataclass(frozen=True)
class Layout:
    axes: tuple[str, ...]          # index symbol names, axis k+1 of every array
    sizes: dict[str, str]          # index name -> size parameter
    roles: dict[str, str]          # storage base name -> role (param/order/field/source/sum/osum/tangent)
    stored: dict[str, tuple[str, ...]]   # storage base name -> index names its data sits on

    @property
    def rank(self) -> int:
        return len(self.axes) + 2

    def axis(self, index_name: str) -> int:
        return self.axes.index(index_name) + 1


def _index_names(expr, known) -> set[str]:
    out = set()
    for s in expr.free_symbols:
        if str(s) in known:
            out.add(str(s))
    for s in expr.atoms(sp.Sum):
        for lim in s.limits:
            out.add(str(lim[0]))
    for s in expr.atoms(sp.Indexed):
        for i in s.indices:
            out |= {str(x) for x in i.free_symbols if str(x) in known}
    return out


def lower(d: Derivation) -> Layout:
    known = set(d.index_size)
    used: set[str] = set()
    exprs = [f.expr for f in d.fields] + [s.increment for s in d.sample_sums + d.order_sums]
    exprs += [s.rest for s in d.saddles] + [s.observable for s in d.saddles if s.observable is not None]
    exprs += [t.expr for t in d.field_tangents + d.sum_tangents + d.observable_tangents]
    exprs += [p.at_t for p in d.past_terms] + [p.at_s for p in d.past_terms]
    for e in exprs:
        used |= _index_names(e, known)
    roles: dict[str, str] = {}
    stored: dict[str, tuple[str, ...]] = {}
    spec = d.model.spec
    for p in spec.params:
        roles[p.name] = "param"
    roles[spec.time.steps_name] = roles[spec.time.step_name] = "param"
    for name, idx in d.orders:
        roles[name], stored[name] = "order", idx
    for g in d.sources:
        for name, idx in g.targets:
            roles[name], stored[name] = "source", idx
    for f in d.fields:
        roles[f.name], stored[f.name] = "field", f.indices
    for s in d.sample_sums:
        roles[s.name], stored[s.name] = "sum", s.indices
    for s in d.order_sums:
        roles[s.name], stored[s.name] = "osum", s.indices
    for t in d.field_tangents + d.sum_tangents:
        name = f"d{t.target}/d{t.driver}"
        roles[name], stored[name] = "tangent", t.indices
    for idx in stored.values():
        used |= set(idx)
    for p in d.primed.values():
        used |= set(p)
    orders = dict(d.orders)
    for pt in d.past_terms:
        used |= {i + "'" for i in orders[pt.col]}
    declared = [i for i in d.model.index_size if i in used]
    rest = sorted(used - set(declared))
    axes = tuple(declared + rest)
    return Layout(axes, {a: d.index_size[a] for a in axes}, roles, stored)
