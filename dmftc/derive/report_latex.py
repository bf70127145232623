"""``dmftc derive --latex``: the derivation as one LaTeX fragment (amsmath).

Every section is a bold heading and an ``align*`` environment; every formula is printed by SymPy's LaTeX
printer with the spec's names (:func:`dmftc.ir.printing.tex`); remarks are LaTeX comments.  The fragment
compiles inside ``\\begin{document}`` with ``\\usepackage{amsmath}``.
"""
from __future__ import annotations

import sympy as sp

from dmftc.ir.printing import Avg, Partial, from_ast, tex, tex_name, tex_text
from dmftc.ir.symbolic import step_cancelled
from dmftc.derive.u_blocks import at_time, recurrence_states, u_blocks
from dmftc.derive.two_layer import Derivation

T, S, TP, SP = sp.symbols("t s t' s'")
ETA = sp.Symbol("eta")


class _Doc:
    def __init__(self):
        self.lines: list[str] = []
        self.rows: list[str] = []

    def comment(self, text: str):
        self.flush()
        self.lines += [f"% {line}" for line in text.splitlines()]

    def heading(self, title: str, remark: str = ""):
        self.flush()
        head = rf"\medskip\noindent\textbf{{{tex_text(title)}}}"
        self.lines += ["", head + (f" ({tex_text(remark)})" if remark else "")]

    def row(self, lhs: str, rel: str, rhs: str, note: str = ""):
        self.rows.append(f"  {lhs} &{rel} {rhs}" + (rf" && \text{{{tex_text(note)}}}" if note else ""))

    def flush(self):
        if self.rows:
            self.lines += [r"\begin{align*}", " \\\\\n".join(self.rows), r"\end{align*}"]
            self.rows = []

    def text(self) -> str:
        self.flush()
        return "\n".join(self.lines)


def _display(e):
    """A covariance or other spec expression as SymPy when it can be shown so, else as text."""
    try:
        return tex(from_ast(e))
    except (TypeError, ValueError, AttributeError):
        from dmftc.frontend.ast import to_text
        return rf"\text{{{tex_text(to_text(e))}}}"


def _text(e) -> str:
    from dmftc.frontend.ast import to_text
    return to_text(e)


def _q(name: str, indices=(), *times):
    idx = f"[{','.join(indices)}]" if indices else ""
    return sp.Function(name.replace("∫", "I") + idx)(*times)


def format_latex(d) -> str:
    """The LaTeX fragment of a derivation (two-layer or deep)."""
    return _two_layer(d) if isinstance(d, Derivation) else _deep(d)


def _two_layer(d: Derivation) -> str:
    spec = d.model.spec
    f = lambda e, when="t": tex(at_time(e, d, when))  # noqa: E731
    doc = _Doc()
    doc.comment(f"dmftc derive --latex: model {spec.model.name}, {spec.model.description}\n"
                "an amsmath fragment: \\input it in a document with \\usepackage{amsmath}")
    doc.heading(f"Model {spec.model.name}", spec.model.description)
    doc.heading("Single-site process", "at step t; I_k(t) are causal running sums")
    for g in d.sources:
        targets = ", ".join(tex_name(n + (f"[{','.join(i)}]" if i else "")) for n, i in g.targets)
        lhs = rf"\left({targets}\right)" if len(g.targets) > 1 else targets
        doc.row(lhs, r"\sim", rf"\mathcal{{N}}\left(0, {_display(g.cov)}\right)")
    states = recurrence_states(d)
    for r, _ in states.values():
        doc.row(tex(_q(r.name, (), T)), "=", _display(r.body), note=f"{r.name}({r.start}) = {_text(r.init)}")

    def running_sum(s):
        inc = step_cancelled(s.increment, spec.time.step_name)
        rhs = tex(ETA * sp.Sum(at_time(s.increment, d, "s"), (S, 0, T - 1)) if inc is None
                  else sp.Sum(at_time(inc, d, "s"), (S, 0, T - 1)))
        name = s.name.replace("∫", "I")
        note = f"= {states[name][1]}" if name in states else ""
        doc.row(tex(_q(s.name, s.indices, T)), "=", rhs, note=note)

    for s in d.sample_sums:
        running_sum(s)
    for fd in d.fields:
        doc.row(tex(_q(fd.name, fd.indices, T)), "=", f(fd.expr))
    doc.heading("Saddle-point equations", "one forward march in t")
    for s in d.order_sums:
        running_sum(s)
    for s in d.saddles:
        lhs = tex(s.coeff * _q(s.name, s.indices, T) + at_time(s.rest, d, "t"))
        doc.row(lhs, "=", tex(Avg(at_time(s.observable, d, "t"))) if s.observable is not None else "0")
    if d.drivers:
        doc.heading("Field sensitivities", "to a perturbation of the driver at time s'")
        for t in d.field_tangents + d.sum_tangents:
            name = f"d{t.target}/d{t.driver}'" + (f"[{','.join(t.indices)}]" if t.indices else "")
            lhs = tex(_q(name, (), T))
            if t.target.startswith("∫"):
                inc = step_cancelled(t.expr, spec.time.step_name)                                         # a running sum's increment
                doc.row(lhs, r"\mathrel{+}=", tex(ETA * at_time(t.expr, d, "t") if inc is None else at_time(inc, d, "t")))
            else:
                doc.row(lhs, "=", f(t.expr))
    doc.heading("Hessian blocks", "the propagator: N Cov(q) tends to Sigma")
    doc.row(r"\Sigma", "=", r"U^{-1} \kappa \, U^{-\top}")
    for s in d.saddles:
        if s.observable is not None:
            o = f"O_{{{tex_name(s.name)}}}"
            doc.row(rf"\kappa_{{{tex_name(s.name)},*}}(t, s)", "=",
                    rf"\operatorname{{Cov}}\left({o}(t), O_{{*}}(s)\right), \quad {o}(t) = {f(s.observable)}")
    for t in d.observable_tangents:
        doc.row(rf"D_{{{tex_name(t.target)},{tex_name(t.driver)}}}(t, s')", "=", tex(Avg(at_time(t.expr, d, "t"))))
    for (r, c), b in u_blocks(d).items():
        expr = b.same * sp.KroneckerDelta(T, S) + sp.Heaviside(T - S) * b.past
        rhs = (tex(expr) if expr != 0 else "") + (rf" - D_{{{tex_name(r)},{tex_name(c)}}}(t, s)" if b.has_d else "")
        doc.row(rf"U_{{{tex_name(r)},{tex_name(c)}}}(t, s)", "=", rhs.strip())
    if d.singular:
        doc.comment("derivatives of a non-smooth activation produce " + ", ".join(d.singular) + "; the Monte Carlo "
                    "sensitivities replace each delta by a Gaussian of width dirac_width (solve option)")
    doc.comment("the single-site program the solver runs: see dmftc derive without --latex")
    return doc.text()


def _deep(d) -> str:
    m, r = d.model, d.roles
    lv, L = m.layer_var, m.depth
    ph, h, z, g, u, rs = m.activation.name, r["h"], r["z"], r["g"], r["u"], r["r"]
    Phi, G = r["Phi"], r["G"]
    F = sp.Function
    x = sp.Symbol("x")
    doc = _Doc()
    doc.comment(f"dmftc derive --latex: model {m.name}, a deep network, layers {lv} = 1..{L}\n"
                "an amsmath fragment: \\input it in a document with \\usepackage{amsmath}")
    doc.heading(f"Model {m.name}", f"deep network, layers {lv} = 1..{L}, time {m.time_var} = 0.."
                f"{m.spec.time.steps_name}-1, step {m.spec.time.step_name}")
    if m.points is not None:
        doc.comment(f"training points {', '.join(m.points.names)} are folded into time: a time below is a pair "
                    "(step, point) in causal order")
    for k, e in enumerate(d.phi[:3]):
        doc.row(tex(F(ph + "'" * k)(x)), "=", tex(e.xreplace({d.act_arg: x})))
    doc.heading(f"Process of layer {lv}",
                "c: coupling kernels, explicit in the order parameters of the adjacent layers")
    doc.row(tex(F(f"{u}[{lv}]")(T)), r"\sim", rf"\mathcal{{GP}}\left(0, {tex_name(f'{Phi}[{lv}-1]')}\right)")
    doc.row(tex(F(f"{rs}[{lv}]")(T)), r"\sim", rf"\mathcal{{GP}}\left(0, {tex_name(f'{G}[{lv}+1]')}\right)",
            "independent")
    ch, c0z, cz = F(f"c_{h}"), F(f"c0_{z}"), F(f"c_{z}")
    doc.row(tex(F(h)(T)), "=", tex(F(u)(T) + sp.Sum(ch(T, S) * F(g)(S), (S, 0, T - 1))))
    doc.row(tex(ch(T, S)), "=", tex(d.couplings.h_past))
    doc.row(tex(F(z)(T)), "=", tex(F(rs)(T) + sp.Sum(c0z(T, S) * F(ph)(F(h)(S)), (S, 0, T))
                                   + sp.Sum(cz(T, S) * F(ph)(F(h)(S)), (S, 0, T - 1))))
    doc.row(tex(c0z(T, S)), "=", tex(d.couplings.z_upto))
    doc.row(tex(cz(T, S)), "=", tex(d.couplings.z_past))
    a, b = (e.xreplace({d.act_arg: F(h)(T)}) for e in d.grad_abstract)
    doc.row(tex(F(g)(T)), "=", tex(F("a")(F(h)(T)) * F(z)(T) + F("b")(F(h)(T))),
            "gradient descent" if d.standard_gradient else "not gradient descent")
    doc.row(tex(F("a")(F(h)(T))), "=", rf"{tex(a)}, \quad b\left({tex(F(h)(T))}\right) = {tex(b)}")
    doc.heading(f"Saddle-point equations ({lv} = 1..{L}) and boundaries",
                f"the last line: the readout by Stein's lemma for {rs}[{L}]")
    for name in m.families + m.responses:
        body = m.definitions[name].body
        lhs = tex(F(f"{name}[{lv}]")(T, S))
        try:
            rhs = tex(from_ast(body) if type(body).__name__ == "Response" else Avg(from_ast(body.body)))
        except (TypeError, ValueError, AttributeError):
            rhs = _display(body)
        doc.row(lhs, "=", rhs)
    for name, bs in d.boundaries.items():
        for ref, val in bs:
            doc.row(tex(F(f"{name}[{ref.text()}]")(T, S)), "=", tex(val))
    readout = lambda when: Avg(F(f"{z}[{L}]")(when) * F(ph)(F(f"{h}[{L}]")(when)))  # noqa: E731
    for sc in d.scalars:
        doc.row(tex(F(sc.name)(T)), "=", tex(sc.expr))
        for sym, when in sc.averages:
            doc.row(tex(sym), "=", tex(readout(sp.Symbol(when) if when != "0" else sp.Integer(0))))
    doc.row(tex(readout(T)), "=", tex(d.readout_stein))
    if d.site is not None:
        doc.heading("The saddle-point march", f"one step t, layer {lv}")
        stored = dict(getattr(d.site, "stored", ()))
        for name, expr in d.site.fields:
            doc.row(tex(F(f"{name}[{lv}]")(T, *[sp.Symbol(i) for i in stored.get(name, ())])), "=", tex(expr))
        for sym, field, xs, y in d.site.stein:
            doc.row(tex(sp.Symbol(str(sym))), "", rf"\text{{by Stein's lemma in the source {tex_text(str(xs))}}}")
        for sym, other, k in d.site.fixed:
            doc.row(tex(sp.Symbol(str(sym))), "=", tex(sp.Symbol(str(other))), f"at t = {k}")
    _deep_blocks(doc, d)
    return doc.text()


def _deep_blocks(doc: _Doc, d) -> None:
    """Field sensitivities and the structure of the Hessian blocks of a deep derivation."""
    m, r = d.model, d.roles
    lv = m.layer_var
    ph, h, z, g = m.activation.name, r["h"], r["z"], r["g"]
    Phi, G, A, B = r["Phi"], r["G"], r["A"], r["B"]
    F = sp.Function
    Dl = next(sc.name for sc in d.scalars if sc.in_march)
    c = d.couplings
    ch, cz = F(f"c_{h}"), F(f"c_{z}")
    cz_all = F(f"c0_{z}")(T, S) + sp.Symbol("[s<t]") * cz(T, S)
    doc.heading("Field sensitivities", "[..] is 1 if the condition holds")
    drivers_h = ((F(Dl)(TP), sp.diff(c.h_past, F(Dl)(d.s)).subs(d.s, TP), "[t'<t]", F(g)(TP)),
                 (F(f"{Phi}[{lv}-1]")(TP, SP), sp.diff(c.h_past, F(f"{Phi}[{lv}-1]")(d.t, d.s)).subs(d.s, SP),
                  "[t'=t, s'<t]", F(g)(SP)),
                 (F(f"{A}[{lv}-1]")(TP, SP), sp.diff(c.h_past, F(f"{A}[{lv}-1]")(d.t, d.s)).subs(d.s, SP),
                  "[t'=t, s'<t]", F(g)(SP)))
    for q, coef, cond, path in drivers_h:
        rhs = sp.Symbol(cond) * coef * path + sp.Sum(ch(T, S) * Partial(F(g)(S), q), (S, 0, T - 1))
        doc.row(tex(Partial(F(h)(T), q)), "=", tex(rhs))
    dz = c.z_past + c.z_upto
    drivers_z = ((F(Dl)(TP), sp.diff(dz, F(Dl)(d.s)).subs(d.s, TP), "[t'<t]", F(ph)(F(h)(TP))),
                 (F(f"{G}[{lv}+1]")(TP, SP), sp.diff(dz, F(f"{G}[{lv}+1]")(d.t, d.s)).subs(d.s, SP),
                  "[t'=t, s'<t]", F(ph)(F(h)(SP))),
                 (F(f"{B}[{lv}+1]")(TP, SP), sp.diff(dz, F(f"{B}[{lv}+1]")(d.t, d.s)).subs(d.s, SP),
                  "[t'=t, s'<=t]", F(ph)(F(h)(SP))))
    for q, coef, cond, path in drivers_z:
        rhs = sp.Symbol(cond) * coef * path + sp.Sum(cz_all * Partial(F(ph)(F(h)(S)), q), (S, 0, T))
        doc.row(tex(Partial(F(z)(T), q)), "=", tex(rhs))
    q = sp.Symbol("q")
    doc.row(tex(Partial(F(g)(T), q)), "=",
            tex((F("a'")(F(h)(T)) * F(z)(T) + F("b'")(F(h)(T))) * Partial(F(h)(T), q)
                + F("a")(F(h)(T)) * Partial(F(z)(T), q)))
    doc.comment(f"the sources: d<O>/d{Phi}[{lv}-1](t', s') has a Price-theorem term w <d^2 O / d{r['u']}(t') "
                f"d{r['u']}(s')>, w = 1/2 if t' = s' else 1; likewise {G}[{lv}+1] through {r['r']}")
    doc.heading("Hessian blocks", "fourth cumulants per layer; D: sensitivities of the layer's averages")
    pairs = ((f"{Phi}[{lv}]", f"{Phi}[{lv}]", F(ph)(F(h)(T)) * F(ph)(F(h)(S)), F(ph)(F(h)(TP)) * F(ph)(F(h)(SP))),
             (f"{G}[{lv}]", f"{G}[{lv}]", F(g)(T) * F(g)(S), F(g)(TP) * F(g)(SP)),
             (f"{Phi}[{lv}]", f"{G}[{lv}]", F(ph)(F(h)(T)) * F(ph)(F(h)(S)), F(g)(TP) * F(g)(SP)))
    for a, b, oa, ob in pairs:
        doc.row(rf"\kappa_{{{tex_name(a)},{tex_name(b)}}}(t, s; t', s')", "=",
                rf"\operatorname{{Cov}}\left({tex(oa)}, {tex(ob)}\right)")
    drivers = ", ".join(tex_name(n) for n in (f"{Phi}[{lv}-1]", f"{A}[{lv}-1]", f"{G}[{lv}+1]", f"{B}[{lv}+1]", Dl))
    for obs in (f"{Phi}[{lv}]", f"{G}[{lv}]", f"{A}[{lv}]", f"{B}[{lv}]"):
        doc.row(rf"D_{{{tex_name(obs)},q}}", "=",
                rf"\frac{{\partial \left\langle O_{{{tex_name(obs)}}} \right\rangle}}{{\partial q}}, "
                rf"\quad q \in \left\{{{drivers}\right\}}")
    doc.heading("Response blocks and Schur complement", f"q1: kernels, K, {Dl} and their duals; q2: responses {A}, {B}")
    doc.row(r"\Sigma_0", "=", r"-\left[\nabla^2_{q_1} S\right]^{-1} = "
            r"\begin{pmatrix} U^{-1} \kappa U^{-T} & -U^{-1} \\ -U^{-T} & 0 \end{pmatrix}")
    doc.row("M", "=", r"\nabla^2_{q_2} S + \nabla^2_{q_2 q_1} S \, \Sigma_0 \, \nabla^2_{q_1 q_2} S")
    doc.row(r"\Sigma_{11}", "=", r"\Sigma_0 - \Sigma_0 \, \nabla^2_{q_1 q_2} S \, M^{-1} \, \nabla^2_{q_2 q_1} S "
            r"\, \Sigma_0", "the physical block")
    doc.row(r"\Sigma_{12}", "=", r"-\Sigma_0 \, \nabla^2_{q_1 q_2} S \, M^{-1}, \quad \Sigma_{22} = -M^{-1}")
