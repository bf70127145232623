"""The deep derivation's Hessian structure, symbolically: the layer's field equations unrolled at explicit small
times (:func:`unroll`), the Price-theorem and explicit terms of the blocks, Gaussian averages by Wick's theorem,
response observables, and the text ``dmftc derive`` prints for a deep spec (:func:`format_deep_derivation`).

Split from :mod:`dmftc.derive.deep` (which derives the couplings, readout and scalars the generated module needs);
the tests use :func:`unroll` to check the derived structure exactly at small T.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from dmftc.frontend import ast
from dmftc.derive.deep import DeepDerivation, activation_functions
from dmftc.ir.printing import dsl_str

# ====================================================================== explicit small-T system


@dataclass(frozen=True)
class Unrolled:
    """Field equations of one generic layer at explicit times 0..T-1 (SymPy).

    Sources are symbols ``u(t)``, ``r(t)``; adjacent-layer kernels and responses and the error signal are
    applied functions with integer times (``Phi[l-1](1, 0)``, ``Delta(0)``; symmetric kernels with the larger
    time first).  ``fields[name][t]`` is the field as an explicit expression of those.
    """

    T: int
    fields: dict
    sources: dict                 # 'u' / 'r' -> tuple of symbols
    cov: dict                     # 'u' / 'r' -> TxT matrix of covariance entries (applied functions)
    phi: tuple                    # abstract phi, phi', phi''
    roles: dict

    def kernel(self, name: str, t: int, s: int):
        return sp.Function(name)(max(t, s), min(t, s))


def unroll(d: DeepDerivation, T: int, concrete: bool = False) -> Unrolled:
    """Build the layer's fields at t = 0..T-1 from the derived couplings (``concrete``: the spec's phi)."""
    m, r = d.model, d.roles
    lv = m.layer_var
    abstract = activation_functions(m.activation.name)
    phi = abstract if not concrete else tuple(sp.Lambda(d.act_arg, e) for e in d.phi)
    fam2 = {f"{r['Phi']}[{lv}-1]", f"{r['G']}[{lv}+1]"}

    def at(expr, tt, ss):
        rep = {}
        for f in expr.atoms(sp.Function):
            n = str(f.func)
            if not isinstance(f, sp.core.function.AppliedUndef):
                continue
            args = [a.subs({d.t: tt, d.s: ss}) for a in f.args]
            if n in fam2 and len(args) == 2:
                args = sorted(args, key=lambda a: -int(a))
            rep[f] = sp.Function(n)(*args)
        return expr.xreplace(rep).subs({d.t: tt, d.s: ss})

    a, b = (sp.Lambda(d.act_arg, e.xreplace({f: phi[abstract.index(f.func)](f.args[0])
                                             for f in e.atoms(sp.Function) if f.func in abstract}))
            for e in d.grad_abstract)                      # gradient field g = a(h) z + b(h)
    u = tuple(sp.Symbol(f"{r['u']}({k})") for k in range(T))
    rr = tuple(sp.Symbol(f"{r['r']}({k})") for k in range(T))
    h, z, g = [], [], []
    for tt in range(T):
        h.append(u[tt] + sum((at(d.couplings.h_past, tt, ss) * g[ss] for ss in range(tt)), sp.Integer(0)))
        zt = rr[tt] + sum((at(d.couplings.z_upto, tt, ss) * phi[0](h[ss]) for ss in range(tt + 1)), sp.Integer(0))
        zt += sum((at(d.couplings.z_past, tt, ss) * phi[0](h[ss]) for ss in range(tt)), sp.Integer(0))
        z.append(zt)
        g.append(a(h[tt]) * zt + b(h[tt]))
    cu = sp.Matrix(T, T, lambda a, b: sp.Function(f"{r['Phi']}[{lv}-1]")(max(a, b), min(a, b)))
    cr = sp.Matrix(T, T, lambda a, b: sp.Function(f"{r['G']}[{lv}+1]")(max(a, b), min(a, b)))
    return Unrolled(T, {r["h"]: tuple(h), r["z"]: tuple(z), r["g"]: tuple(g)}, {"u": u, "r": rr},
                    {"u": cu, "r": cr}, phi, dict(r))


def price_term(obs, sources, t1: int, s1: int):
    """Source-covariance part of d<obs>/d C(t1, s1) for a symmetric covariance entry (Price's theorem).

    For a Gaussian x with covariance C, d<F>/dC_ij = <d^2 F / dx_i dx_j> / 2 per matrix entry; the symmetric
    kernel entry C(t1, s1) = C(s1, t1) is two entries when t1 != s1 (factor 1) and one when t1 = s1 (1/2).
    Returns the expression inside the average.
    """
    factor = sp.Rational(1, 2) if t1 == s1 else sp.Integer(1)
    return factor * sp.diff(obs, sources[t1], sources[s1])


def explicit_term(obs, entry):
    """Pathwise part of d obs / d q at fixed sources (q enters the couplings): the field sensitivity chain."""
    return sp.diff(obs, entry)


def gaussian_average(expr, groups):
    """Exact <expr> for a polynomial in jointly Gaussian zero-mean sources (Isserlis).

    ``groups``: sequence of (symbols, covariance Matrix); different groups are independent.
    """
    syms = [x for xs, _ in groups for x in xs]
    cov = {}
    for xs, C in groups:
        for i, a in enumerate(xs):
            for j, b in enumerate(xs):
                cov[(a, b)] = C[i, j]
    poly = sp.Poly(sp.expand(expr), *syms)
    total = sp.Integer(0)
    for powers, coeff in poly.terms():
        factors = [x for x, k in zip(syms, powers) for _ in range(k)]
        total += coeff * _wick(tuple(factors), cov)
    return sp.expand(total)


def _wick(factors, cov):
    if not factors:
        return sp.Integer(1)
    if len(factors) % 2:
        return sp.Integer(0)
    a, rest = factors[0], factors[1:]
    out = sp.Integer(0)
    for i, b in enumerate(rest):
        c = cov.get((a, b), 0)
        if c != 0:
            out += c * _wick(rest[:i] + rest[i + 1:], cov)
    return out


def response_observable(u: Unrolled, of: str, t1: int, wrt: str, s1: int, concrete_phi=None):
    """The pathwise derivative inside a response average, e.g. d phi(h(t1)) / d r(s1) ('of' is 'phi(h)' or 'g')."""
    r = u.roles
    x = u.phi[0](u.fields[r["h"]][t1]) if of == "phi(h)" else u.fields[r["g"]][t1]
    return sp.diff(x, u.sources[wrt][s1])


def blocks_text(d: DeepDerivation) -> list[str]:
    """Hessian structure of the deep action in the spec's names (printed by ``dmftc derive``)."""
    m, r = d.model, d.roles
    lv = m.layer_var
    ph, Phi, G, A, B = m.activation.name, r["Phi"], r["G"], r["A"], r["B"]
    h, z, g, u, rs = r["h"], r["z"], r["g"], r["u"], r["r"]
    Dl = next(sc.name for sc in d.scalars if sc.in_march)
    c = d.couplings
    dh_dD = sp.diff(c.h_past, sp.Function(Dl)(d.s))
    dz_dD = sp.diff(c.z_past, sp.Function(Dl)(d.s)) + sp.diff(c.z_upto, sp.Function(Dl)(d.s))
    dh_dPhi = sp.diff(c.h_past, sp.Function(f"{Phi}[{lv}-1]")(d.t, d.s))
    dh_dA = sp.diff(c.h_past, sp.Function(f"{A}[{lv}-1]")(d.t, d.s))
    dz_dG = sp.diff(c.z_past + c.z_upto, sp.Function(f"{G}[{lv}+1]")(d.t, d.s))
    dz_dB = sp.diff(c.z_upto + c.z_past, sp.Function(f"{B}[{lv}+1]")(d.t, d.s))
    w = []
    w.append("field sensitivities (differentiating the field equations; X' = dX/dq, q at (t', s'); "
             "[..] is 1 if the condition holds):")
    tp, sq = sp.Symbol("t'"), sp.Symbol("s'")
    w.append(f"  d{h}(t)/d{Dl}(t') = [t' < t] ({dsl_str(dh_dD.subs(d.s, tp))}) {g}(t') "
             f"+ sum_{{s<t}} c_{h}(t, s) d{g}(s)/d{Dl}(t')")
    w.append(f"  d{h}(t)/d{Phi}[{lv}-1](t', s') = [t' = t, s' < t] ({dsl_str(dh_dPhi.subs(d.s, sq))}) {g}(s') "
             f"+ sum_{{s<t}} c_{h}(t, s) d{g}(s)/d{Phi}[{lv}-1](t', s')   [+ the source {u}: Price term below]")
    w.append(f"  d{h}(t)/d{A}[{lv}-1](t', s') = [t' = t, s' < t] ({dsl_str(dh_dA)}) {g}(s') "
             f"+ sum_{{s<t}} c_{h}(t, s) d{g}(s)/d{A}[{lv}-1](t', s')")
    w.append(f"  d{z}(t)/d{Dl}(t') = [t' < t] ({dsl_str(dz_dD.subs(d.s, tp))}) {ph}({h}(t')) "
             f"+ sum_{{s<=t}} (c0_{z} + [s<t] c_{z})(t, s) d{ph}({h}(s))/d{Dl}(t')")
    w.append(f"  d{z}(t)/d{G}[{lv}+1](t', s') = [t' = t, s' < t] ({dsl_str(dz_dG.subs(d.s, sq))}) {ph}({h}(s')) "
             f"+ sum_{{s<=t}} (c0_{z} + [s<t] c_{z})(t, s) d{ph}({h}(s))/d{G}[{lv}+1](t', s')   [+ the source {rs}: Price term]")
    w.append(f"  d{z}(t)/d{B}[{lv}+1](t', s') = [t' = t, s' <= t] ({dsl_str(dz_dB.subs(d.s, sq))}) {ph}({h}(s')) "
             f"+ sum_{{s<=t}} (c0_{z} + [s<t] c_{z})(t, s) d{ph}({h}(s))/d{B}[{lv}+1](t', s')")
    w.append(f"  d{g}(t)/dq = (a'({h}(t)) {z}(t) + b'({h}(t))) d{h}(t)/dq + a({h}(t)) d{z}(t)/dq")
    w.append("")
    w.append("Hessian blocks (Sigma from the action's Hessian: the Price term, kappa, D and the response blocks):")
    hessian = len(w)                                 # the blocks below are indented under this heading
    w.append("Price-theorem term (a source covariance is an order parameter): for O = O(" + u + ") at fixed "
             f"couplings, d<O>/d{Phi}[{lv}-1](t', s') = w(t', s') <d^2 O / d{u}(t') d{u}(s')>, "
             "w = 1/2 if t' = s' else 1 (the symmetric entry is two matrix entries); likewise "
             f"{G}[{lv}+1] through {rs}.  Total D = Price term + <explicit derivative at fixed sources>.")
    w.append("kappa blocks (fourth cumulants of the single site, per layer; layers are independent at the saddle):")
    w.append(f"  kappa[{Phi}[{lv}], {Phi}[{lv}]](t,s; t',s') = Cov({ph}({h}(t)) {ph}({h}(s)), {ph}({h}(t')) "
             f"{ph}({h}(s')))")
    w.append(f"  kappa[{G}[{lv}], {G}[{lv}]](t,s; t',s') = Cov({g}(t) {g}(s), {g}(t') {g}(s'))")
    w.append(f"  kappa[{Phi}[{lv}], {G}[{lv}]](t,s; t',s') = Cov({ph}({h}(t)) {ph}({h}(s)), {g}(t') {g}(s'))")
    w.append("D blocks (sensitivities of the layer-l averages; q of layers l-1 and l+1 and the error signal):")
    for obs in (f"{Phi}[{lv}]", f"{G}[{lv}]", f"{A}[{lv}]", f"{B}[{lv}]"):
        drivers = [f"{Phi}[{lv}-1] (Price + explicit)", f"{A}[{lv}-1]", f"{G}[{lv}+1] (Price + explicit)",
                   f"{B}[{lv}+1]", Dl]
        w.append(f"  D[{obs}, q] = d<O_{obs}>/dq,  q in {', '.join(drivers)}")
    w.append(f"  O_{A}[{lv}](t, s) = d{ph}({h}(t))/d{rs}(s),  O_{B}[{lv}](t, s) = d{g}(t)/d{u}(s)  (pathwise, "
             "their sensitivities are tangents of tangents)")
    w.append("response blocks and Schur complement (order parameters q1 = Phi, G, K, Delta and their duals; "
             f"q2 = the responses {A}, {B}):")
    w.append("  Sigma0 = -[Hess_q1 S]^-1 = [[U^-1 kappa U^-T, -U^-1], [-U^-T, 0]]")
    w.append("  M = Hess_q2 S + Hess_q2q1 S . Sigma0 . Hess_q1q2 S")
    w.append("  Sigma_11 = Sigma0 - Sigma0 . Hess_q1q2 S . M^-1 . Hess_q2q1 S . Sigma0   (the physical block)")
    w.append("  Sigma_12 = -Sigma0 . Hess_q1q2 S . M^-1,   Sigma_22 = -M^-1")
    w.append(f"  (the responses enter the action as -Tr({A}[{lv}] {B}[{lv}+1]) pairs; numerically: "
             "dmftc.runtime.engines.deep_linear for linear activations)")
    return w[:hessian] + ["  " + line for line in w[hessian:]]


def site_text(site, f=dsl_str) -> list[str]:
    """What the saddle-point march runs (the single-site program of :mod:`dmftc.derive.site`)."""
    lv = site.layer
    terms = getattr(site, "terms", ())
    out = [f"single-site program, the saddle-point march at one step t (dmftc.runtime.march.site_march; tangents over time for "
           f"{', '.join(site.history) or 'no field'}"
           + (f" as the sums' path factors {', '.join(f(p) for p in terms)}, each computed once per step"
              if terms else "") + "; the fields' tangents at the current step only):"]
    reads = dict(site.reads)
    name = lambda k, n, ref: n if k == "term" or not ref else f"{n}[{ref}]"      # noqa: E731
    stored = dict(getattr(site, "stored", ()))
    for fname, expr in site.fields:
        same = ", ".join(name(*r) for r in reads[("field", fname)])
        out.append(f"  {fname}[{lv}](t{''.join(', ' + i for i in stored.get(fname, ()))}) = {f(expr)}")
        out.append(f"      after: {same or 'nothing of this step'}")
    for p in terms:
        out.append(f"  {f(p)} at s = t, after: {', '.join(name(*r) for r in reads[('term', sp.sstr(p))])}")
    for sym, field, x, y in site.stein:
        out.append(f"  {sym} by Stein's lemma: E[X] = sum_(s<=t) Cov_{x}(t, s) E[d Y / d {x}(s)] + E[X - {x}(t) Y],"
                   f"  Y = dX/d{field}(t) = {f(y)}")
    for sym, other, k in site.fixed:
        out.append(f"  {sym} = {other} at t = {k}")
    return out


def format_deep_derivation(d: DeepDerivation, latex: bool = False) -> str:
    m, r = d.model, d.roles
    lv, tv = m.layer_var, m.time_var
    f = (lambda e: sp.latex(e)) if latex else dsl_str
    out = []
    w = out.append
    w(f"model {m.name}: deep network, layers {lv} = 1..{m.depth}, time {tv} = 0..{m.spec.time.steps_name}-1, "
      f"step {m.spec.time.step_name}")
    w(f"activation: {m.activation.name}(x) = {f(d.phi[0])};  {m.activation.name}'(x) = {f(d.phi[1])};  "
      f"{m.activation.name}''(x) = {f(d.phi[2])}")
    if m.points is not None:
        pts = m.points
        w(f"training points {', '.join(pts.names)} = 1..{pts.size}, folded into time: the steps are the pairs "
          f"tau = ({tv}, {pts.names[0]}) in causal order, tau = {tv} {pts.size} + {pts.names[0]}; below, a time stands "
          f"for such a pair, sum_(s<{tv}) runs over every point at the earlier times, and a kernel such as "
          f"Phi[{lv}](t, s) is the matrix over pairs (t, mu), (s, nu)")
        carried = [f"{n}[{', '.join(pts.names[:k])}]" for n, k in pts.params + pts.orders]
        w(f"  with their points: {', '.join(carried)}")
        if pts.mask is not None:
            w(f"  update mask {pts.mask}[{pts.names[0]}]: every coupling at s below is multiplied by {pts.mask} of the "
              f"point of s (0 on a test point, which no update reads; its error signal is then its test error)")
    w("")
    w(f"order parameters: {', '.join(f'{n}[{lv}](t, s)' for n in m.families + m.responses)}, "
      f"{', '.join(f'{sc.name}(t)' for sc in d.scalars)}")
    if m.from_action:
        from dmftc.frontend.action_deep import expr_text

        w("  from the action (stationarity in the duals hat Q, in the paired responses and in the constraints' duals):")
        for eq in m.from_action:
            lhs = f"{eq.name}{'[' + ', '.join(eq.indices) + ']' if eq.indices else ''}({eq.time}"
            w(f"    {lhs}{', ' + eq.time2 if eq.time2 else ''}) = {expr_text(eq.body)}")
    kink = d.kink_order
    if kink is not None:
        w(f"  non-smooth: derivative {kink} of {m.activation.name} (or {kink - 1} of the gradient field's a, b) "
          "holds a delta function (derivatives are taken "
          "as distributions; the generated code replaces each delta by a Gaussian of width dirac_width, a bias "
          "of the propagator's Monte Carlo estimate)")
    w("")
    w(f"single-site process of layer {lv} (c_X: coupling kernels, explicit in the order parameters of the adjacent "
      "layers):")
    w(f"  {r['u']}[{lv}] ~ GP(0, {r['Phi']}[{lv}-1]),  {r['r']}[{lv}] ~ GP(0, {r['G']}[{lv}+1])  (independent)")
    w(f"  {r['h']}(t) = {r['u']}(t) + sum_{{s<t}} c_{r['h']}(t, s) {r['g']}(s),     c_{r['h']}(t, s) = "
      f"{f(d.couplings.h_past)}")
    arg = f"{r['h']}(s)" if d.scale == 1 else f"{dsl_str(d.scale.subs(d.t, d.s))} {r['h']}(s)"
    w(f"  {r['z']}(t) = {r['r']}(t) + sum_{{s<=t}} c0_{r['z']}(t, s) {m.activation.name}({arg}) + sum_{{s<t}} "
      f"c_{r['z']}(t, s) {m.activation.name}({arg}),")
    w(f"      c0_{r['z']}(t, s) = {f(d.couplings.z_upto)},   c_{r['z']}(t, s) = {f(d.couplings.z_past)}")
    for k in m.coefficients:      # time coefficients (dmftc.frontend.coefficients_deep)
        if k.one_time:
            w(f"  one-time coefficient {k.name}(t) = {ast.to_text(k.body)} for t > 0,  {k.name}(0) = "
              f"{ast.to_text(k.init)}")
            continue
        w(f"  time coefficient {k.name}(t, {k.time2}) = {ast.to_text(k.body)} for t > {k.time2},  "
          f"{k.name}({k.time2}, {k.time2}) = {ast.to_text(k.init)},  0 for t < {k.time2}")
    ga, gb = (dsl_str(e.subs(d.act_arg, sp.Symbol(f"{r['h']}(t)"))) for e in d.grad_abstract)
    if d.scale != 1:              # the activation's argument k(t) h(t): gradient descent in it
        k = dsl_str(d.scale)
        w(f"  {r['g']}(t) = {k} {m.activation.name}'({k} {r['h']}(t)) {r['z']}(t)   (gradient descent)")
    else:
        w(f"  {r['g']}(t) = a({r['h']}(t)) {r['z']}(t) + b({r['h']}(t)),   a = {ga},   b = {gb}"
          + ("   (gradient descent)" if d.standard_gradient else "   (not gradient descent: a != "
                                                                  f"{m.activation.name}' or b != 0)"))
    w("")
    w("saddle-point equations (l = 1..L), boundaries:")
    for name in m.families + m.responses:
        eq = m.definitions[name]
        body = eq.body
        if isinstance(body, ast.Response):
            w(f"  {name}[{lv}](t, s) = < d {ast.to_text(body.of)} / d {ast.to_text(body.wrt)} >")
        else:
            w(f"  {name}[{lv}](t, s) = < {ast.to_text(body.body)} >")
    for name, bs in d.boundaries.items():
        for ref, val in bs:
            w(f"  {name}[{ref.text()}](t, s) = {f(val)}")
    for sc in d.scalars:
        w(f"  {sc.name}(t) = {f(sc.expr)}")
        for ph, when in sc.averages:
            w(f"      {ph} = E[{r['z']}[{m.depth}]({when}) {m.activation.name}({r['h']}[{m.depth}]({when}))]")
        if not sc.affine:
            w(f"      (nonlinear in the averages, e.g. another loss: the propagator takes {sc.name}'s slope at the "
              "saddle, step by step, dmftc.runtime.problem.deep_model.DeepModel.linearised; no O(1/N) mean correction)")
    w(f"  readout by Stein's lemma for {r['r']}[{m.depth}]: E[{r['z']}[{m.depth}](t) {m.activation.name}("
      f"{r['h']}[{m.depth}](t))] = {f(d.readout_stein)}")
    w("")
    out.extend(blocks_text(d))
    if d.site is not None:
        w("")
        out.extend(site_text(d.site, f))
    return "\n".join(out)
