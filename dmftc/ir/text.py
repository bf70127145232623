"""Text of the IR (``dmftc derive --ir SPEC``): one uniform listing for two-layer and deep specs."""
from __future__ import annotations

import sympy as sp

from dmftc.ir.printing import dsl_str
from dmftc.ir.symbolic import ONEHOT, show_time, step_cancelled
from dmftc.frontend.ast import to_text
from dmftc.ir.nodes import ModelIR, OrderParameter


def timed(expr, names, when: str):
    """Attach a time argument to every quantity named in ``names`` (and to tangents ``dX/dY``):
    Delta -> Delta(t), h[mu] -> h[mu](t); running sums print as I_k; per-step parameters as lr[t - 1]."""
    tsym = sp.Symbol(when)
    rep = {}
    for a in expr.atoms(sp.Symbol):
        n = str(a)
        if n in names:
            rep[a] = sp.Function(n.replace("∫", "I"))(tsym)
        elif n.startswith("d") and "/d" in n:
            rep[a] = sp.Function(n.replace("∫", "I") + "'")(tsym)  # tangent, s' implicit
    for a in expr.atoms(sp.Indexed):
        n = str(a.base.label)
        if n in names or ("/d" in n):
            label = n.replace("∫", "I") + ("'" if "/d" in n else "")
            rep[a] = sp.Function(f"{label}[{','.join(str(i) for i in a.indices)}]")(tsym)
    out = show_time(expr.xreplace(rep), when)
    return out.xreplace({ONEHOT: sp.Symbol(f"[{when}=s']")})


def running_sum_text(s, step: str, tv: str, f) -> str:
    """``I(t) = eta * sum_{s<t} increment(s)`` of a running sum ``s`` (``f(expr, 's')`` prints at time s), or
    ``I(t) = sum_{s<t} (...)`` with eta cancelled when the increment divides by it (a recurrence's state)."""
    inc = step_cancelled(s.increment, step)
    rhs = f"{step} * sum_{{s<{tv}}} {f(s.increment, 's')}" if inc is None else f"sum_{{s<{tv}}} ({f(inc, 's')})"
    return f"{s.name.replace('∫', 'I')}{ix(s.indices)}({tv}) = {rhs}"


def ix(indices) -> str:
    return f"[{', '.join(indices)}]" if indices else ""


def _head(o: OrderParameter, tv: str) -> str:
    layer = f"[{o.layer}]" if o.layer else ix(o.indices)
    return f"{o.name}{layer}({tv}{', s' if o.times == 2 else ''})"


def format_ir(ir: ModelIR) -> str:
    """The IR as text: axes, activations, order parameters (kind and defining equation), sources (constant or
    order-parameter covariance), causal fields, running sums and boundaries."""
    spec = ir.model.spec
    tv, steps, step = ir.time
    names = {o.name for o in ir.orders} | {f.name for f in ir.fields} | {s.name for s in ir.sample_sums + ir.order_sums}
    f = lambda e, when=tv: dsl_str(timed(e, names, when))          # noqa: E731  (names at the step: name(t))
    L: list[str] = []
    w = L.append
    w(f"IR of {spec.model.name} ({ir.kind.replace('_', '-')}): {spec.model.description}")
    w(f"parameters: {', '.join(ir.params)};  time {tv}: {steps} steps of {step}")
    for a in ir.axes:
        w(f"axis {a.name} in 1..{a.size} ({a.kind})")
    points = getattr(ir.model, "points", None)           # a spec on several points with the time folded in
    if points is not None:
        w("  (the training points are folded into time: every time below is a pair (time, point), "
          "dmftc.frontend.points_deep)")
        mask = points.mask
        if mask is not None:
            w(f"  (update mask {mask}: each coupling at s is multiplied by {mask} of the point of s; 0 on a test point)")
    for name, x, body in ir.activations:
        w(f"activation {name}({x}) = {dsl_str(body)}".replace("__x", "x"))
    w("")
    w("order parameters:")
    for o in ir.orders:
        head = _head(o, tv)
        if o.kind == "average":
            lhs = f(o.coeff * sp.Symbol(head) + o.rest)
            w(f"  {head:<16} average      {lhs} = <{f(o.observable)}>")
        elif o.kind == "response":
            w(f"  {head:<16} response     {head} = <d {f(o.observable)} / d {o.wrt}[{o.layer}](s)>")
        else:
            w(f"  {head:<16} constraint   {f(o.coeff * sp.Symbol(head) + o.rest)} = 0")
            for a in o.averages:
                w(f"  {'':<16}              {a.symbol} = <{f(a.expr)}>")
    w("")
    w("sources:")
    for s in ir.sources:
        targets = ", ".join(n + ix(i) for n, i in s.targets)
        cov = (f"order parameter {', '.join(s.depends_on)}"
               + (f" of layer {ir.axes[0].name}{s.layer_offset:+d}" if s.layer_offset else "")) \
            if s.depends_on else "constant"
        w(f"  {targets} ~ {s.process}(0, {to_text(s.cov)})    covariance: {cov}")
    w("")
    w(f"causal fields (dependency order; I_k({tv}) = {step} * sum_{{s<{tv}}} integrand(s)):")
    for s in ir.sample_sums:
        w(f"  {running_sum_text(s, step, tv, f)}")
    for fd in ir.fields:
        layer = f"[{fd.layer}]" if fd.layer else ix(fd.indices)
        w(f"  {fd.name}{layer}({tv}) = {f(fd.expr)}")
    if ir.order_sums:
        w("")
        w("running sums of order parameters:")
        for s in ir.order_sums:
            w(f"  {running_sum_text(s, step, tv, f)}")
    if ir.boundaries:
        w("")
        w("boundaries:")
        for b in ir.boundaries:
            w(f"  {b.name}[{b.layer}]({tv}, s) = {dsl_str(b.value)}")
    return "\n".join(L)
