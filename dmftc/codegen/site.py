"""Print a deep spec's single-site program (:mod:`dmftc.derive.site`) into its generated module.

Every field, kernel observable, response observable, readout average and readout constraint becomes a function
of an evaluator ``E`` (:class:`dmftc.runtime.march.site_eval.Evaluator`), which supplies the values at the current
step t of the layer being computed:

    E.field(name, ref, time)    the field of layer ``ref`` ('' = this layer) at 't' (paths,), at 's' (paths, T:
                                every earlier time, the last axis) or at a fixed time; inside a sum over s a
                                field at 't' is (paths, 1)
    E.source(name, ref)         the source at t: a gp's, or a constant-in-time one's (``SITE['normals']``)
    E.row(name, ref)            row t of a kernel or response
    E.diag(name, ref)           its (t, t) entry
    E.q(name, time)             a one-time order parameter at 't', 's' (T,) or a fixed time
    E.act(k, x)                 the k-th derivative of the activation
    E.causal_dot(P, C, upto)    sum over s < t (s <= t with ``upto``) of P(s) C(t, s): the paths' factor P (paths,
                                T) times a row C (T,), a matrix-vector product (None: no path factor)
    E.term(name)                a path factor of the field equations' sums at every earlier time s (paths, T), as
                                ``site_term_<k>`` computed it at each step (``SITE['terms'][k]`` = name)
    E.p[name]                   a parameter value
    E.step                      the step number t as a value (time in an expression, dmftc.ir.symbolic.STEP)
    E.per_step(name, k)         a per-step parameter (lr[T]) at step t + k
    E.coef(name)                row t of a time coefficient (the generated ``coefficients(p, T)``); a one-time
                                coefficient's value at t
    E.coef(name, k)             a one-time coefficient's value at the fixed time k

``SITE`` holds the program's structure: names, the sources' covariances, the Stein plans of the readout
averages, the path factors of the fields' sums and the same-time reads of every quantity (which order one time
step).
"""
from __future__ import annotations

import sympy as sp

from dmftc.codegen.printer import ExprPrinter
from dmftc.derive.site import PAST, SiteProgram, split_name, split_path, time_sum
from dmftc.derive.site_lowering import TANGENT
from dmftc.ir.printing import dsl_str
from dmftc.ir.symbolic import PER_STEP, STEP


class _SitePrinter(ExprPrinter):
    """SymPy -> evaluator calls (module doc); ``vec``: printing a body over the earlier time s."""

    dirac_width = "E.width"

    def __init__(self, prog: SiteProgram, scalars: set, params: set, terms: bool = False, coefficients=(),
                 one_time=()):
        self.prog, self.scalars, self.params = prog, scalars, params
        self.coefficients = set(coefficients)         # time coefficients (dmftc.frontend.coefficients_deep)
        self.one_time = set(one_time)                 # the one-time ones among them
        self.terms = {f: sp.sstr(f) for f in prog.terms} if terms else {}      # read the kept path factors at s
        self.fields = {n for n, _ in prog.fields}
        self.sources = {n for n, _, _ in prog.sources} | set(prog.normals)
        self.two = {n for n, _ in prog.families} | {n for n, _, _ in prog.responses}
        self.running = {n for n, *_ in prog.sums}
        self.t, self.s = sp.Symbol(prog.time), sp.Symbol("s")
        self.vec = False
        self.layout = prog.axes is not None       # arrays (paths, one axis per sample index, time): two-layer
        if self.layout:
            self.axis = {n: k + 1 for k, (n, _) in enumerate(prog.axes)}
            self.size = dict(prog.axes)
            self.rank = len(prog.axes) + 2
            self.stored = dict(prog.stored)

    def indexed(self, text, name, idx) -> str:
        """``text``, the value of ``name`` laid out on its own indices' axes, moved to those of ``idx``."""
        src = tuple(self.axis[i] for i in self.stored[name])
        dst = tuple(self.axis[str(i)] for i in idx)
        if len(src) != len(dst):
            raise NotImplementedError(f"{name} read with indices {idx}, stored with {self.stored[name]}")
        return text if src == dst else f"_k.relabel({text}, {src}, {dst})"

    def index_atom(self, e):
        """Sample-index algebra of a two-layer program (as in dmftc.codegen.two_layer.Printer)."""
        if isinstance(e, sp.Indexed):
            axes = tuple(self.axis[str(i)] for i in e.indices)
            return f"_k.place(E.p[{str(e.base.label)!r}], {axes}, {self.rank})"
        if isinstance(e, sp.Sum) and not time_sum(e):
            axes = tuple(self.axis[str(lim[0])] for lim in e.limits)
            return f"jnp.sum({self.p(e.function)}, axis={axes}, keepdims=True)"
        if isinstance(e, sp.KroneckerDelta):
            a, b = (str(x) for x in e.args)
            return f"_k.kron({self.axis[a]}, {self.axis[b]}, E.sz[{self.size[a]!r}], {self.rank})"
        if isinstance(e, sp.Heaviside):          # its derivative: the mollified delta, as in the symbolic tangents
            return f"_k.step({self.p(e.args[0])}, E.width)"
        return None

    def kink_atom(self, e):
        """A deep program's non-smooth functions as the kink-aware helpers of :mod:`dmftc.runtime.numerics.kernels`: the
        same values, and derivatives that hold the delta functions mollified with ``E.kink`` (0 in the march:
        pathwise tangents; the solve's width in the propagator's local derivatives, dmftc.runtime.sensitivities.site_local)."""
        if isinstance(e, sp.Abs):
            return f"_k.kabs({self.p(e.args[0])}, E.kink)"
        if isinstance(e, sp.sign):
            return f"_k.ksign({self.p(e.args[0])}, E.kink)"
        if isinstance(e, sp.Heaviside):
            return f"_k.step({self.p(e.args[0])}, E.kink)"
        if isinstance(e, (sp.Max, sp.Min)):
            fn = "_k.kmax" if isinstance(e, sp.Max) else "_k.kmin"
            out = self.p(e.args[0])
            for a in e.args[1:]:
                out = f"{fn}({out}, {self.p(a)}, E.kink)"
            return out
        return None

    def time(self, a) -> str:
        if a == self.t:
            return "'t'"
        if a == self.s:
            return "'s'"
        if a.is_Integer:
            return str(int(a))
        raise NotImplementedError(f"time argument {a}")

    def atom(self, e):
        if self.layout:
            own = self.index_atom(e)
            if own is not None:
                return own
        else:
            own = self.kink_atom(e)
            if own is not None:
                return own
        if self.vec and e in self.terms:                       # a kept path factor at s (inside a sum, a kernel)
            return f"E.term({self.terms[e]!r})"
        if e == PAST:
            return "E.past"
        if e == STEP:
            return "E.step"
        if isinstance(e, sp.core.function.AppliedUndef) and type(e).__name__.startswith(PER_STEP):
            return f"E.per_step({type(e).__name__[len(PER_STEP):]!r}, {int(e.args[0])})"
        if isinstance(e, sp.Symbol):
            if e.name in self.params:
                return f"E.p[{e.name!r}]"
            raise NotImplementedError(f"no value for the symbol {e}")
        if time_sum(e):
            hi = e.limits[-1][2]
            outer, self.vec = self.vec, True
            parts = []
            for term in sp.Add.make_args(e.function):       # sum_s P(s) C(t, s): the paths' factor P times a row C
                path = [f for f in sp.Mul.make_args(term) if self.path_dependent(f)]
                coef = sp.Mul(*[f for f in sp.Mul.make_args(term) if not self.path_dependent(f)])
                own, others, _ = split_path(term, self.fields, self.t, self.prog.layer, self.prog.activation,
                                            self.prog.known)
                if self.terms and own is not None:                 # the kept path factor at s (and the rest)
                    P = " * ".join([f"E.term({self.terms[own]!r})"] + [self.p(f) for f in others])
                else:
                    P = self.p(sp.Mul(*path)) if path else "None"
                parts.append(f"E.causal_dot({P}, {self.p(coef)}, upto={hi == self.t})")
            self.vec = outer
            out = parts[0] if len(parts) == 1 else "(" + " + ".join(parts) + ")"
            if len(e.limits) > 1:                       # and over sample indices (sums commute)
                out = f"jnp.sum({out}, axis={tuple(self.axis[str(lim[0])] for lim in e.limits[:-1])}, keepdims=True)"
            return out
        name = type(e).__name__
        if name.rstrip("'") == self.prog.activation and len(e.args) == 1:
            return f"E.act({len(name) - len(name.rstrip(chr(39)))}, {self.p(e.args[0])})"
        if not isinstance(e, sp.core.function.AppliedUndef):
            return None
        base, ref = split_name(name)
        ref = ref or ""
        if self.layout and name.startswith(TANGENT):          # a perturbation (dmftc.derive.site_lowering.tangent)
            base, _ = split_name(name[len(TANGENT):])
            kind = "dfield" if base in self.fields else "drsum" if base in self.running else "dq"
            return self.indexed(f"E.{kind}({base!r})", base, e.args[1:])
        if self.layout and (base in self.fields or base in self.sources or base in self.scalars):
            a, idx = e.args[0], e.args[1:]
            if base in self.fields:
                return self.indexed(f"E.field({base!r}, {ref!r}, {self.time(a)})", base, idx)
            if base in self.sources:
                return self.indexed(f"E.source({base!r}, {ref!r})", base, idx)
            return self.indexed(f"E.q({base!r}, {self.time(a)})", base, idx)
        if self.layout and base in self.running:
            return self.indexed(f"E.rsum({base!r})", base, e.args[1:])
        if base in self.fields:
            (a,) = e.args
            vec = ", vec=True" if self.vec and a != self.s else ""
            return f"E.field({base!r}, {ref!r}, {self.time(a)}{vec})"
        if base in self.sources:
            return f"E.source({base!r}, {ref!r}{', vec=True' if self.vec else ''})"
        if base in self.two:
            if tuple(e.args) == (self.t, self.s):
                return f"E.row({base!r}, {ref!r})"
            if tuple(e.args) == (self.t, self.t):
                return f"E.diag({base!r}, {ref!r})"
        if base in self.scalars and len(e.args) == 1:
            return f"E.q({base!r}, {self.time(e.args[0])})"
        if base in self.coefficients and tuple(e.args) == (self.t, self.s):
            return f"E.coef({base!r})"
        if base in self.one_time and len(e.args) == 1 and (e.args[0] == self.t or e.args[0].is_Integer):
            return f"E.coef({base!r})" if e.args[0] == self.t else f"E.coef({base!r}, {int(e.args[0])})"
        raise NotImplementedError(f"the site program cannot read {e}")

    def path_dependent(self, e) -> bool:
        return any(split_name(type(a).__name__)[0] in self.fields for a in e.atoms(sp.core.function.AppliedUndef))

    def vector(self, e) -> str:
        self.vec = True
        try:
            return self.p(e)
        finally:
            self.vec = False


def emit_site(prog: SiteProgram, w, *, scalars: tuple, params: tuple, coefficients: tuple = (),
              one_time: tuple = ()) -> None:
    """Append ``SITE`` and the program's functions to a generated deep module (``w`` writes text); ``coefficients``:
    the names of its time coefficients."""
    pr = _SitePrinter(prog, set(scalars), set(params), coefficients=coefficients, one_time=one_time)
    lv, tv = prog.layer, prog.time
    site = {
        "fields": tuple(n for n, _ in prog.fields),
        "sources": prog.sources,
        "kernels": tuple(n for n, _ in prog.families),
        "responses": tuple((n, x) for n, _, x in prog.responses),
        "readouts": tuple((n, tuple(str(s) for s, _ in avgs)) for n, _, _, avgs in prog.readouts),
        "stein": tuple((str(sym), f, x) for sym, f, x, _ in prog.stein),
        "fixed": tuple((str(sym), str(o), k) for sym, o, k in prog.fixed),
        "reads": prog.reads,
        "history": prog.history,
        "terms": tuple(sp.sstr(f) for f in prog.terms),
        "normals": prog.normals,
        "layer": prog.layer,
    }
    if prog.axes is None:
        site.update(factors=prog.factors)
    else:
        site.update(axes=prog.axes, stored=prog.stored, drivers=prog.drivers,
                    sums=tuple((n, scope) for n, _, scope, _ in prog.sums))
    w("\n# ---------------------------------------------------------------- the single-site program\n"
      "# read by dmftc.runtime.march.site_march: fields, kernel rows, responses and the readout as functions of an\n"
      "# evaluator E (dmftc.codegen.site); 'reads': what each quantity needs at the same time step, with layer\n"
      "# references relative to its own layer ('' = the same layer); 'history': the fields read at earlier times,\n"
      "# through 'terms': the path factors of the fields' sums at s, whose values and tangents the march keeps over\n"
      "# time (the fields' tangents live for the current step only); 'normals': the sources constant in time,\n"
      "# whose values the caller draws; a deep spec's 'factors': the path factors each field's causal sums read\n"
      "# (the propagator's couplings, dmftc.runtime.sensitivities.site_local); a two-layer spec's: 'axes' (its sample indices:\n"
      "# the arrays are laid out as (paths, one axis per index, time)), 'stored' (the indices of each quantity),\n"
      "# 'drivers' (the order parameters the fields and running sums read), 'sums' (the running sums,\n"
      "# site_increment_<k>)\n")
    w("SITE = {\n")
    for k, v in site.items():
        w(f"    {k!r}: {v!r},\n")
    w("}\n\n")
    fp = _SitePrinter(prog, set(scalars), set(params), terms=True, coefficients=coefficients, one_time=one_time)
    stored = dict(prog.stored)
    for n, e in prog.fields:
        ix = "".join(f", {i}" for i in stored.get(n, ()))
        w(f"\ndef site_field_{n}(E):\n    \"\"\"{n}[{lv}]({tv}{ix}) = {dsl_str(e)}\"\"\"\n    return {fp.p(e)}\n\n")
    for k, (n, idx, scope, e) in enumerate(prog.sums):
        ix = f"[{', '.join(idx)}]" if idx else ""
        w(f"\ndef site_increment_{k}(E):\n    \"\"\"{n}{ix}({tv} + 1) - {n}{ix}({tv}) = {dsl_str(e)}: a running sum over the "
          f"earlier times ({scope})\"\"\"\n    return {pr.p(e)}\n\n")
    s, t = sp.Symbol("s"), sp.Symbol(tv)
    for k, f in enumerate(prog.terms):
        w(f"\ndef site_term_{k}(E):\n    \"\"\"{sp.sstr(f)} at s = {tv}: a path factor of the sums (the runtime keeps "
          f"its values and tangents)\"\"\"\n    return {pr.p(f.xreplace({s: t}))}\n\n")
    for n, e in prog.families:
        w(f"\ndef site_kernel_{n}(E):\n    \"\"\"{n}[{lv}]({tv}, s) = <{dsl_str(e)}>: the observable over s <= {tv}\"\"\"\n"
          f"    return {fp.vector(e)}\n\n")
    for n, e, x in prog.responses:
        w(f"\ndef site_response_{n}(E):\n    \"\"\"{n}[{lv}]({tv}, s) = <d {dsl_str(e)} / d {x}[{lv}](s)>: the observable "
          f"at {tv} (the runtime carries its tangents)\"\"\"\n    return {pr.p(e)}\n\n")
    if prog.tangents:
        w("\n# the tangents of a perturbation of the fields, running sums and driving order parameters (arrays with\n"
          "# the directions on the last axis): the Jacobian of the saddle-point map (dmftc.runtime.sensitivities.site_tangents)\n")
    for k, (kind, n, e) in enumerate(prog.tangents):
        if kind == "sum":
            fn = f"site_dincrement_{[m for m, *_ in prog.sums].index(n)}"
        else:
            fn = f"site_d{kind}_{n}"
        w(f"\ndef {fn}(E):\n    \"\"\"d {n}: {dsl_str(e)}\"\"\"\n    return {pr.p(e)}\n\n")
        if kind == "average":
            w(f"\ndef site_dmean_{n}(E, w):\n    \"\"\"<d {n}> with path weights w: per term, its perturbed factors "
              f"and the rest contracted over the paths\"\"\"\n    return {_path_means(pr, e)}\n\n")
    stein = {sym: y for sym, _, _, y in prog.stein}
    for name, coeff, rest, avgs in prog.readouts:
        for sym, e in avgs:
            w(f"\ndef site_average_{sym}(E):\n    \"\"\"{sym} = <{dsl_str(e)}>: the paths\"\"\"\n    return {pr.p(e)}\n\n")
            if sym in stein:
                w(f"\ndef site_stein_{sym}(E):\n    \"\"\"Y = d({dsl_str(e)}) / d(field at t): {sym} by Stein's lemma\"\"\"\n"
                  f"    return {pr.p(stein[sym])}\n\n")
        sol = dsl_str(-rest / coeff)
        v = _SitePrinter(prog, set(scalars), set(params), coefficients=coefficients, one_time=one_time)
        v.atom = _with_averages(v.atom, {sym for sym, _ in avgs})
        w(f"\ndef site_constraint_{name}(E, v):\n    \"\"\"{name}(t) = {sol}; v: the averages\"\"\"\n"
          f"    return {v.p(sp.simplify(-rest / coeff))}\n\n")


def _with_averages(atom, syms: set):
    def inner(e):
        if isinstance(e, sp.Symbol) and e in syms:
            return f"v[{e.name!r}]"
        return atom(e)
    return inner


def _path_means(pr, e) -> str:
    """The weighted path average of a tangent, term by term as ``_k.path_dot(w, perturbed factors, the rest)``."""
    def perturbed(f):
        return any(type(a).__name__.startswith(TANGENT) for a in f.atoms(sp.core.function.AppliedUndef))
    parts = []
    for term in sp.Add.make_args(sp.expand(e)):
        fs = sp.Mul.make_args(term)
        x = sp.Mul(*[f for f in fs if perturbed(f)])
        y = sp.Mul(*[f for f in fs if not perturbed(f)])
        parts.append(f"_k.path_dot(w, {pr.p(x)}, {pr.p(y)})")
    return " + ".join(parts) if parts else "0.0"
