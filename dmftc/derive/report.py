"""Human-readable (text and LaTeX) rendering of a derivation, and the block form of U.

Everything printed here is read off the :class:`~dmftc.derive.two_layer.Derivation`; time
arguments are re-attached for display: ``X(t)`` is the value at the current step,
``I_k(t) = eta * sum_{s<t} (...)(s)`` a causal running sum and ``s'`` the time of
the perturbation in a sensitivity.
"""
from __future__ import annotations


import sympy as sp

from dmftc.frontend.ast import to_text
from dmftc.derive.two_layer import Derivation
from dmftc.ir.printing import dsl_str
from dmftc.ir.symbolic import step_cancelled
from dmftc.derive.u_blocks import at_time, recurrence_states, u_blocks
from dmftc.ir.text import ix as _ix, running_sum_text


def format_derivation(d: Derivation, latex: bool = False) -> str:
    if latex:
        from dmftc.derive.report_latex import format_latex
        return format_latex(d)
    if not isinstance(d, Derivation):  # a deep network (dmftc.derive.deep)
        from dmftc.derive.deep_blocks import format_deep_derivation
        return format_deep_derivation(d)
    spec = d.model.spec
    f = lambda e, when="t": dsl_str(at_time(e, d, when))
    states = recurrence_states(d)

    step = spec.time.step_name

    def running_sum(s):
        text = running_sum_text(s, step, "t", f)
        name = s.name.replace("∫", "I")
        return text.replace("(t) = ", f"(t) = {states[name][1]} = ", 1) if name in states else text

    L: list[str] = []
    w = L.append
    w(f"model {spec.model.name}: {spec.model.description}")
    single = [s.name for s in d.saddles if s.observable is not None]
    cons = [s.name for s in d.saddles if s.observable is None]
    w(f"order parameters: {', '.join(n + _ix(i) + '(t)' for n, i in d.orders)}")
    w(f"  single-site averages: {', '.join(single) or '-'};  deterministic constraints: {', '.join(cons) or '-'}")
    w("")
    w("single-site process (at step t; I_k(t) = eta * sum_{s<t} integrand(s)):")
    for g in d.sources:
        w(f"  source  {', '.join(n + _ix(i) for n, i in g.targets)} ~ normal(0, {to_text(g.cov)})")
    tv = spec.time.var
    for r, _ in states.values():
        w(f"  recur   {r.name}({tv}) = {to_text(r.body)};  {r.name}({r.start}) = {to_text(r.init)}")
    for s in d.sample_sums:
        w(f"  sum     {running_sum(s)}")
    for fd in d.fields:
        w(f"  field   {fd.name}{_ix(fd.indices)}(t) = {f(fd.expr)}")
    w("")
    w("saddle-point equations (one forward march in t):")
    for s in d.order_sums:
        w(f"  {running_sum(s)}")
    for s in d.saddles:
        rhs = f"<{f(s.observable)}>" if s.observable is not None else "0"
        w(f"  {f(s.coeff * sp.Symbol(s.name + _ix(s.indices) + '(t)') + s.rest)} = {rhs}")
    w("")
    if d.drivers:
        w("field sensitivities (tangents to a perturbation of the driver at time s'):")
        for t in d.field_tangents + d.sum_tangents:
            lhs = f"d{t.target.replace('∫', 'I')}{_ix(t.indices[:len(t.indices) - len(d.primed[t.driver])])}(t)" \
                  f"/d{t.driver}{_ix(d.primed[t.driver])}(s')"
            kind = "increment" if t.target.startswith("∫") else "value"
            if kind == "increment":
                inc = step_cancelled(t.expr, step)
                w(f"  {lhs} += {f(sp.Symbol('eta') * t.expr) if inc is None else f(inc)}")
            else:
                w(f"  {lhs} = {f(t.expr)}")
        w("")
    w("Hessian blocks (N Cov(q) -> Sigma = U^-1 kappa U^-T):")
    for s in d.saddles:
        if s.observable is not None:
            w(f"  kappa[{s.name}, *](t, s) = Cov(O_{s.name}(t), O_*(s)),  O_{s.name} = {f(s.observable)}")
    for t in d.observable_tangents:
        w(f"  D[{t.target}, {t.driver}](t, s') = < {f(t.expr)} >")
    for (r, c), b in u_blocks(d).items():
        parts = []
        if b.same != 0:
            parts.append("delta(t,s)" if b.same == 1 else f"{dsl_str(b.same)} delta(t,s)")
        if b.past != 0:
            parts.append(f"Theta(t-s) ({dsl_str(b.past)})" if isinstance(b.past, sp.Add)
                         else f"Theta(t-s) {dsl_str(b.past)}")
        text = " + ".join(parts)
        if b.has_d:
            text += f"{' ' if text else ''}- D[{r}, {c}](t, s)"
        w(f"  U[{r}, {c}](t, s) = {text}")
    if d.singular:
        w("  note: derivatives of a non-smooth activation produce " + ", ".join(d.singular)
          + "; the Monte Carlo sensitivities replace each delta by a Gaussian of width dirac_width (solve option)")
    if d.site is not None:
        w("")
        w(site_program_text(d.site))
    else:
        w("")
        w(f"no single-site program: {d.site_missing}")
    return "\n".join(L)


def _axis_names(axes) -> list[str]:
    """The program's array axes by name, a fresh summation index ``d#10`` printed as ``d2`` (``d3``, ... if taken),
    as :func:`dmftc.ir.printing.clean_dummies` prints it in the formulas."""
    names = [a for a, _ in axes]
    taken, out = {a for a in names if "#" not in a}, []
    for a in names:
        if "#" in a:
            base, k = a.split("#")[0], 2
            while f"{base}{k}" in taken:
                k += 1
            a = f"{base}{k}"
            taken.add(a)
        out.append(a)
    return out


def site_program_text(site) -> str:
    """A two-layer spec's single-site program (dmftc.derive.site_lowering), as the site engine runs it."""
    from dmftc.derive.deep_blocks import site_text

    ix = dict(site.stored)
    out = ["single-site program (one layer l; dmftc.derive.site_lowering, run by dmftc.runtime.engines.site_engine):"]
    out.append(f"  sources constant in time: {', '.join(n + _ix(ix.get(n, ())) for n in site.normals)}"
               + (f";  array axes (paths, {', '.join(_axis_names(site.axes))}, time)" if site.axes else ""))
    out += site_text(site)[1:]
    for n, idx, scope, inc in site.sums:
        out.append(f"  running sum {n}{_ix(idx)}(t + 1) = {n}{_ix(idx)}(t) + {dsl_str(inc)}   ({scope}; after the "
                   "readouts of step t)")
    for name, coeff, rest, avgs in site.readouts:
        means = "; ".join(f"{sym} = <{dsl_str(e)}>" for sym, e in avgs)
        lhs = dsl_str(coeff * sp.Symbol(f"{name}{_ix(ix.get(name, ()))}(t)") + rest)
        out.append(f"  readout {lhs} = 0" + (f",  {means}" if means else ""))
    return "\n".join(out)
