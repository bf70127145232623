"""The block form of U and time-stamped quantities of a two-layer derivation, shared by the text and LaTeX
renderings (:mod:`dmftc.derive.report`, :mod:`dmftc.derive.report_latex`)."""
from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from dmftc.ir.symbolic import diff_indexed, index_symbol, quantity
from dmftc.derive.two_layer import Derivation
from dmftc.ir.text import timed

__all__ = ["at_time", "recurrence_states", "UBlock", "u_blocks"]


def at_time(expr, d: Derivation, when: str):
    """Attach a time argument to every quantity: Delta -> Delta(t); h[mu] -> h[mu](t)."""
    names = {n for n, _ in d.orders} | {f.name for f in d.fields} | {s.name for s in d.sample_sums + d.order_sums}
    return timed(expr, names, when)


def recurrence_states(d: Derivation) -> dict:
    """{running sum name (``Ivh``): (recurrence, what it holds as text: ``vh(t - 1)``, ``h(t) - u``)} of the
    fields in recurrence form (:mod:`dmftc.frontend.recurrence`; lowered by :mod:`dmftc.ir.two_layer`, the state
    of a late recurrence is its previous value, of an early one its value, each less its initial value)."""
    from dmftc.frontend.ast import Num, to_text

    tv, out = d.model.spec.time.var, {}
    for r in d.model.recurrences:
        held = f"{r.name}({tv} - 1)" if r.kind == "late" else f"{r.name}({tv})"
        if not (isinstance(r.init, Num) and r.init.value == 0):
            init = to_text(r.init)
            held += f" - {init}" if init.replace("_", "").isalnum() else f" - ({init})"
        out["I" + r.name] = (r, held)
    return out


@dataclass(frozen=True)
class UBlock:
    """U[row, col](t, s) = same * delta(t,s) + Theta(t-s) * past(t, s) - D[row, col](t, s) if has_d."""

    same: sp.Expr
    past: sp.Expr
    has_d: bool


def u_blocks(d: Derivation) -> dict[tuple[str, str], UBlock]:
    """The block structure of U (scalar indices are shown; indexed blocks keep their indices)."""
    out = {}
    orders = [n for n, _ in d.orders]
    eta = sp.Symbol("eta")
    tangent_obs = {(t.target, t.driver) for t in d.observable_tangents}
    for r in orders:
        for c in orders:
            same = d.saddle(r).coeff if r == c else sp.Integer(0)
            if c in d.saddle(r).same_time:                  # a constraint reading c(t) at the same time
                cidx = dict(d.orders)[c]                    # d rest / d c[mu', ...](t) for an indexed one
                part = diff_indexed(d.saddle(r).rest, quantity(c, cidx), [index_symbol(i + "'") for i in cidx])
                same = at_time(part, d, "t")
            past = sp.Integer(0)
            for pt in d.past_terms:
                if pt.row == r and pt.col == c:
                    term = at_time(pt.at_t, d, "t") * at_time(pt.at_s, d, "s")
                    if pt.dummies:
                        term = sp.Sum(term, *[(index_symbol(x), 1, sp.Symbol(d.index_size[x])) for x in pt.dummies])
                    past += eta * term
            has_d = (r, c) in tangent_obs
            if same != 0 or past != 0 or has_d:
                out[(r, c)] = UBlock(same, past, has_d)
    return out
