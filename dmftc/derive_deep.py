"""Stage 3 for deep networks: symbolic derivation (SymPy) from a checked :class:`~dmftc.check_deep.DeepModel`.

What is derived, for the generic hidden layer ``l`` (time arguments explicit, ``t`` the current step):

* the roles of the spec's names: the forward field ``h`` (its source ``u ~ gp(0, Phi[l-1])``), the backward
  field ``z`` (source ``r ~ gp(0, G[l+1])``), the gradient field ``g = phi'(h) z``, the kernels
  ``Phi[l] = <phi(h) phi(h)>`` and ``G[l] = <g g>`` and the responses ``A[l] = <d phi(h(t)) / d r(s)>``,
  ``B[l] = <d g(t) / d u(s)>`` (the names are the user's);
* the coupling kernels: ``h(t) = u(t) + sum_{s<t} c_h(t, s) g(s)`` and
  ``z(t) = r(t) + sum_{s<=t} c_z0(t, s) phi(h(s)) + sum_{s<t} c_z(t, s) phi(h(s))`` with the coefficients as
  SymPy expressions of the adjacent layer's order parameters and responses (``integral(x, s < t)`` is
  ``eta * sum_{s<t} x``);
* the readout: every average ``E[z[L](t1) phi(h[L](t1))]`` in a scalar order parameter is reduced by
  Stein's lemma for the Gaussian source ``r[L]`` to order parameters and responses,
  ``sum_{s<t1} G[L+1](t1, s) A[L](t1, s) + sum_{s<=t1} c_z0 Phi[L] + sum_{s<t1} c_z Phi[L]``;
* scalar order parameters given by layer sums of equal-time kernels (``K``);
* the Hessian structure (printed by ``dmftc derive``): field sensitivities obtained by differentiating the
  field equations, the Price-theorem term of kernels that are source covariances, kappa and D blocks, the
  response blocks and their Schur complement.  :func:`unroll` builds the field equations at explicit
  times for small T, on which the same derivatives are exact SymPy expressions (used by the tests).
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from . import ast
from .activation import BUILTINS, derivatives as act_derivatives
from .check_deep import DeepModel, LayerRef
from .errors import SpecError, StructureSpecError

_BUILTINS = BUILTINS


def activation_functions(name: str, orders: int = 4):
    """Abstract SymPy functions phi, phi', phi'', ... whose derivatives are the next one (for printing)."""
    classes = []
    for k in range(orders + 1):
        classes.append(type(name + "'" * k, (sp.Function,), {"nargs": 1}))
    for k in range(orders):
        nxt = classes[k + 1]
        classes[k].fdiff = (lambda nxt: lambda self, argindex=1: nxt(self.args[0]))(nxt)
    return tuple(classes)


@dataclass(frozen=True)
class Couplings:
    """Coefficients of the causal sums of the forward and backward field equations (functions of t, s)."""

    h_past: sp.Expr          # coefficient of g(s), s < t, in h(t)
    z_upto: sp.Expr          # coefficient of phi(h(s)), s <= t, in z(t)
    z_past: sp.Expr          # coefficient of phi(h(s)), s < t, in z(t)


@dataclass(frozen=True)
class ScalarDef:
    """A one-time order parameter: ``expr`` of parameters, ``X[k]`` placeholders and layer sums."""

    name: str
    expr: sp.Expr
    averages: tuple            # ((placeholder symbol, time text 't' or '0'), ...): E[z[L](t1) phi(h[L](t1))]
    in_march: bool             # used by the field equations (computed during the march)


@dataclass(frozen=True)
class DeepDerivation:
    model: DeepModel
    t: sp.Symbol
    s: sp.Symbol
    act_arg: sp.Symbol
    phi: tuple                  # (phi, phi', ..., phi'''') of act_arg, concrete SymPy (dmftc.activation)
    roles: dict                 # role -> spec name: h z g u r Phi G A B
    couplings: Couplings
    boundaries: dict            # family -> ((LayerRef, constant SymPy expr), ...)
    scalars: tuple              # ScalarDef, declaration order
    readout_stein: sp.Expr      # E[z[L](t) phi(h[L](t))] reduced to order parameters (printing)
    params: tuple               # scalar parameter names (declaration order), then steps, step

    @property
    def linear(self) -> bool:
        """phi(h) = h exactly: every field is Gaussian."""
        return sp.simplify(self.phi[0] - self.act_arg) == 0

    def rowname(self, family: str, ref: str) -> str:
        return f"{family}[{ref}]"


class _Deriver:
    def __init__(self, m: DeepModel):
        self.m = m
        self.spec = m.spec
        self.t = sp.Symbol(m.time_var)
        self.s = sp.Symbol("s")
        self.x = sp.Symbol("x", real=True)
        self.act = m.activation
        self.phi_f = activation_functions(self.act.name)

    def err(self, msg, pos, hint=None, cls=StructureSpecError):
        return cls(msg, pos, hint=hint, source=self.spec.source, filename=self.spec.filename)

    # ------------------------------------------------------------ AST -> SymPy
    def conv(self, e, tmap, sums=None, concrete_act=False):
        """SymPy form; fields/sources/kernels are applied functions named like the spec ('Phi[l-1]')."""
        c = lambda x: self.conv(x, tmap, sums, concrete_act)
        if isinstance(e, ast.Num):
            v = e.value
            return sp.Integer(int(v)) if v == int(v) else sp.Float(v)
        if isinstance(e, ast.Name):
            if e.name in tmap:
                return tmap[e.name]
            return sp.pi if e.name == "pi" else sp.Symbol(e.name)
        if isinstance(e, ast.BinOp):
            a, b = c(e.left), c(e.right)
            return {"+": a + b, "-": a - b, "*": a * b, "/": a / b, "^": a ** b}[e.op]
        if isinstance(e, ast.Neg):
            return -c(e.operand)
        if isinstance(e, ast.PrimeCall):
            return self.activation(c(e.args[0]), 1, concrete_act)
        if isinstance(e, ast.Call):
            sym = self.m.symbols.get(e.name)
            if sym is not None and sym.kind == "activation":
                return self.activation(c(e.args[0]), 0, concrete_act)
            if sym is None or sym.kind == "builtin":
                return _BUILTINS[e.name](*[c(a) for a in e.args])
            label = e.name + (f"[{e.indices[0]}]" if e.indices else "")
            args = [c(a) for a in e.args]
            return sp.Function(label)(*args)
        if isinstance(e, (ast.Integral, ast.TimeSum)):
            inner = dict(tmap)
            inner[e.var] = self.s
            body = self.conv(e.body, inner, sums, concrete_act)
            if isinstance(e, ast.Integral):
                body = sp.Symbol(self.spec.time.step_name) * body
            ph = sp.Symbol(f"__sum{len(sums)}")
            sums[ph] = (e.cmp, body, e)
            return ph
        if isinstance(e, ast.LayerSum):
            lv = sp.Symbol(e.var, integer=True)
            inner = dict(tmap)
            body = self.layer_conv(e.body, e.var, inner)
            return sp.Sum(body, (lv, self.layer_value(e.lo), self.layer_value(e.hi)))
        if isinstance(e, ast.Expectation):
            ph = sp.Symbol(f"E_{len(sums) + 1}")
            sums[ph] = ("E", e.body, e)
            return ph
        raise AssertionError(type(e))  # pragma: no cover

    def layer_value(self, text):
        m = self.m
        ref = _ref(text, m)
        base = sp.Symbol(ref.var, integer=True) if ref.var else sp.Integer(0)
        return base + ref.offset

    def layer_conv(self, e, var, tmap):
        """Layer-sum bodies: kernels at equal times become Function(name)(layer value)."""
        if isinstance(e, ast.Call) and e.indices and self.m.symbols[e.name].kind in ("family", "response"):
            return sp.Function(e.name)(self.layer_value(e.indices[0]) if not e.indices[0].startswith(var)
                                       else sp.Symbol(var, integer=True) + _ref(e.indices[0], self.m, var).offset)
        if isinstance(e, ast.BinOp):
            a, b = self.layer_conv(e.left, var, tmap), self.layer_conv(e.right, var, tmap)
            return {"+": a + b, "-": a - b, "*": a * b, "/": a / b, "^": a ** b}[e.op]
        if isinstance(e, ast.Neg):
            return -self.layer_conv(e.operand, var, tmap)
        return self.conv(e, tmap, {})

    def activation(self, arg, order, concrete):
        if not concrete:
            return self.phi_f[order](arg)
        return self.concrete_phi(order).subs(self.x, arg)

    def concrete_phi(self, order):
        a = self.act
        body = self.conv(a.body, {a.arg: self.x}, {}, concrete_act=True)
        return sp.diff(body, self.x, order) if order else body

    # ------------------------------------------------------------ structure
    def run(self) -> DeepDerivation:
        m, t, s = self.m, self.t, self.s
        fwd = next((g for g in m.sources if g.offset == -1), None)
        bwd = next((g for g in m.sources if g.offset == +1), None)
        if fwd is None or bwd is None or len(m.sources) != 2:
            pos = m.sources[0].decl.pos if m.sources else m.spec.model.pos
            raise self.err("a deep spec has two gp sources: one with the covariance of layer l-1 (forward) and one "
                           "with that of layer l+1 (backward)", pos,
                           hint="write u[l] ~ gp(0, Phi[l-1]) and r[l] ~ gp(0, G[l+1])")
        eqs = {f.name: f for f in m.fields}
        parsed = {}
        for f in m.fields:
            sums = {}
            expr = self.conv(f.body, {m.time_var: t}, sums)
            parsed[f.name] = (expr, sums)
        src = lambda g: sp.Function(f"{g.name}[{m.layer_var}]")(t)  # noqa: E731
        h = next((n for n, (e, _) in parsed.items() if e.has(src(fwd))), None)
        z = next((n for n, (e, _) in parsed.items() if e.has(src(bwd))), None)
        if h is None or z is None or h == z or len(m.fields) != 3:
            raise self.err("a deep spec has three per-layer fields: a forward field with the forward source, a "
                           "backward field with the backward source, and the gradient field g = phi'(h) z",
                           m.fields[0].pos if m.fields else m.spec.model.pos)
        g = next(n for n in eqs if n not in (h, z))
        lv = m.layer_var
        F = lambda n, arg: sp.Function(f"{n}[{lv}]")(arg)  # noqa: E731
        phi = self.phi_f[0]
        # gradient field
        gexpr, gsums = parsed[g]
        if gsums or sp.simplify(gexpr - self.phi_f[1](F(h, t)) * F(z, t)) != 0:
            raise self.err(f"the gradient field must be {g}[{lv}]({m.time_var}) = {self.act.name}'({h}[{lv}]"
                           f"({m.time_var})) * {z}[{lv}]({m.time_var})", eqs[g].body.pos)
        h_past, h_upto = self.split(h, parsed[h], src(fwd), F(g, s), eqs[h])
        if h_upto != 0:  # pragma: no cover - a same-time cycle, rejected by the checker
            raise self.err("the forward field cannot use the gradient field at the same time", eqs[h].body.pos)
        z_past, z_upto = self.split(z, parsed[z], src(bwd), phi(F(h, s)), eqs[z])
        # families and responses
        fam = {fwd.cov_family: "Phi", bwd.cov_family: "G"}
        if fwd.cov_family == bwd.cov_family:
            raise self.err("the forward and backward sources need different kernels", bwd.decl.cov.pos)
        want = {fwd.cov_family: phi(F(h, t)) * phi(F(h, s)), bwd.cov_family: F(g, t) * F(g, s)}
        for name in m.families:
            eq = m.definitions[name]
            if name not in want:
                raise self.err(f"order parameter '{name}' is not a source covariance; the deep runtime supports the "
                               "two kernels that are", eq.pos, hint="remove it or use it as a gp covariance")
            got = self.conv(eq.body.body, {m.time_var: t, eq.time2: s}, {})
            if sp.simplify(got - want[name]) != 0:
                raise self.err(f"'{name}[{lv}]' must be the average {want[name]} (the covariance its source needs)",
                               eq.body.pos)
        roles = {"h": h, "z": z, "g": g, "u": fwd.name, "r": bwd.name, "Phi": fwd.cov_family, "G": bwd.cov_family}
        for name in m.responses:
            eq = m.definitions[name]
            of = self.conv(eq.body.of, {m.time_var: t}, {})
            wrt = eq.body.wrt.name
            if wrt == bwd.name and of == phi(F(h, t)):
                roles["A"] = name
            elif wrt == fwd.name and of == F(g, t):
                roles["B"] = name
            else:
                raise self.err(f"response '{name}' must be E[d {self.act.name}({h}[{lv}](t)) / d {bwd.name}[{lv}](s)] "
                               f"or E[d {g}[{lv}](t) / d {fwd.name}[{lv}](s)]", eq.body.pos)
        for role in ("A", "B"):
            if role not in roles:
                raise self.err("a deep spec defines both response functions (of phi(h) to the backward source and of "
                               "g to the forward source)", m.spec.model.pos)
        # which adjacent-layer quantities each coupling may use
        allowed_h = {f"{roles['Phi']}[{lv}-1]", f"{roles['A']}[{lv}-1]"}
        allowed_z = {f"{roles['G']}[{lv}+1]", f"{roles['B']}[{lv}+1]"}
        self.restrict(h_past, allowed_h, eqs[h], "forward")
        self.restrict(z_past + z_upto, allowed_z, eqs[z], "backward")
        # boundaries
        bounds = {}
        for name, bs in m.boundaries.items():
            bounds[name] = tuple((ref, self.conv(eq.body, {}, {})) for ref, eq in bs)
        # scalar order parameters
        scalars = []
        used = {str(f.func) for e, _ in parsed.values() for f in e.atoms(sp.Function)} | {
            str(f.func) for _, sums in parsed.values() for (_, b, _) in sums.values() for f in b.atoms(sp.Function)}
        for name in m.scalars:
            eq = m.definitions[name]
            avgs = {}
            expr = self.conv(eq.body, {m.time_var: t}, avgs)
            placeholders = []
            for ph, (_, body, node) in avgs.items():
                when = self.readout_average(body, node, roles)
                placeholders.append((ph, when))
            scalars.append(ScalarDef(name, expr, tuple(placeholders), name in used))
        march = [sc for sc in scalars if sc.in_march]
        for sc in scalars:
            if sc.in_march and not sc.averages:
                raise self.err(f"'{sc.name}' is used by the field equations but is not a readout of the last layer",
                               m.definitions[sc.name].pos,
                               hint="the deep runtime computes one such order parameter during the march")
        if len(march) != 1:
            raise self.err("the field equations must use exactly one scalar order parameter (the error signal)",
                           m.fields[0].pos)
        for sc in scalars:
            if not sc.in_march and sc.averages:
                raise self.err(f"'{sc.name}' uses averages but is not used by the field equations", 
                               m.definitions[sc.name].pos)
            if not sc.in_march and any(isinstance(f, sp.Function) and str(f.func) in m.scalars
                                       for f in sc.expr.atoms(sp.Function)):
                raise self.err(f"'{sc.name}' may use kernels and parameters only", m.definitions[sc.name].pos)
        Lp1 = {"G": f"{roles['G']}[{m.depth}+1]", "B": f"{roles['B']}[{m.depth}+1]"}
        stein = (sp.Sum(sp.Function(Lp1["G"])(t, s) * sp.Function(f"{roles['A']}[{m.depth}]")(t, s), (s, 0, t - 1))
                 + sp.Sum(z_upto.subs(_layer_subs(z_upto, lv, m.depth)) * sp.Function(f"{roles['Phi']}[{m.depth}]")(t, s),
                          (s, 0, t))
                 + sp.Sum(z_past.subs(_layer_subs(z_past, lv, m.depth)) * sp.Function(f"{roles['Phi']}[{m.depth}]")(t, s),
                          (s, 0, t - 1)))
        params = tuple(p.name for p in m.spec.params) + (m.spec.time.steps_name, m.spec.time.step_name)
        return DeepDerivation(m, t, s, self.x, act_derivatives(self.concrete_phi(0)), roles,
                              Couplings(h_past, z_upto, z_past), bounds, tuple(scalars), stein, params)

    def split(self, name, parsed, source, driver, eq):
        """expr = source + sum_{s<t} c_past * driver + sum_{s<=t} c_upto * driver: return (c_past, c_upto)."""
        expr, sums = parsed
        local = expr.subs({ph: 0 for ph in sums})
        if sp.simplify(local - source) != 0:
            raise self.err(f"the field '{name}' must be its source plus causal sums: {source} + sum(...)",
                           eq.body.pos, hint="fields of a deep spec are driven by their own source at the "
                                             "current time and by sums over earlier times")
        out = {"<": sp.Integer(0), "<=": sp.Integer(0)}
        for ph, (cmp, body, node) in sums.items():
            coeff = sp.diff(expr, ph)
            if coeff.free_symbols & set(sums):
                raise self.err("sums over time must enter the field equation linearly", node.pos)
            term = sp.expand(coeff * body)
            c = sp.simplify(term / driver)
            if c.has(driver) or any(c.has(sp.Function(f"{f.name}[{self.m.layer_var}]")) for f in self.m.fields) \
                    or c.has(self.phi_f[0]):
                raise self.err(f"the sum must be linear in {driver} (the deep runtime's {name}-equation form)",
                               node.pos, hint=f"write sum(s < t: coefficient(t, s) * {driver})")
            out[cmp] += c
        return sp.simplify(out["<"]), sp.simplify(out["<="])

    def restrict(self, coeff, allowed, eq, which):
        scal = set(self.m.scalars)
        for f in coeff.atoms(sp.Function):
            n = str(f.func)
            if n in allowed or n in scal:
                continue
            if isinstance(f, sp.core.function.AppliedUndef):
                raise self.err(f"the {which} field's coupling uses {f}; the deep runtime supports the adjacent "
                               f"layer's {' and '.join(sorted(allowed))} and the error signal", eq.body.pos)

    def readout_average(self, body, node, roles):
        m = self.m
        if not (isinstance(body, ast.BinOp) and body.op == "*"):
            raise self.err(f"averages in '{node}' must be E[{roles['z']}[{m.depth}](t) {self.act.name}({roles['h']}"
                           f"[{m.depth}](t))]", node.pos)
        t1 = None
        seen = set()
        for part in (body.left, body.right):
            if isinstance(part, ast.Call) and part.name == roles["z"]:
                seen.add("z")
                arg = part.args[0]
            elif isinstance(part, ast.Call) and part.name == self.act.name and isinstance(part.args[0], ast.Call) \
                    and part.args[0].name == roles["h"]:
                seen.add("phi")
                part = part.args[0]
                arg = part.args[0]
            else:
                break
            if part.indices != (m.depth,):
                break
            when = arg.name if isinstance(arg, ast.Name) else "0"
            if t1 is not None and when != t1:
                break
            t1 = when
        if seen != {"z", "phi"}:
            raise self.err(f"the deep runtime reads the output from E[{roles['z']}[{m.depth}](t) {self.act.name}("
                           f"{roles['h']}[{m.depth}](t))] (and the same at time 0)", node.pos,
                           hint="the network output is the last layer's readout average")
        return t1


def _ref(text, m, extra=None) -> LayerRef:
    import re
    mm = re.match(r"^(?:([A-Za-z_][A-Za-z_0-9]*)([+-][0-9]+)?|([0-9]+))$", text)
    if mm.group(3) is not None:
        return LayerRef(None, int(mm.group(3)))
    return LayerRef(mm.group(1), int(mm.group(2) or 0))


def _layer_subs(expr, lv, depth):
    """Rename kernels of layer l+k to layer depth+k (couplings of the last layer)."""
    rep = {}
    for f in expr.atoms(sp.Function):
        n = str(f.func)
        if "[" in n and n.endswith("]"):
            base, ix = n[:-1].split("[", 1)
            if ix.startswith(lv):
                rep[f.func] = sp.Function(f"{base}[{depth}{ix[len(lv):]}]")
    return {a: rep[a.func](*a.args) for a in expr.atoms(sp.Function) if a.func in rep}


def derive_deep(model: DeepModel) -> DeepDerivation:
    """Derive the deep spec's structure; raise a located SpecError if the runtime cannot solve it."""
    try:
        return _Deriver(model).run()
    except SpecError:
        raise
    except (TypeError, ValueError, ZeroDivisionError) as err:  # pragma: no cover - SymPy surprises
        raise StructureSpecError(f"cannot derive this deep spec: {err}", None, source=model.spec.source,
                                 filename=model.spec.filename) from None


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
    phi = activation_functions(m.activation.name) if not concrete else tuple(
        sp.Lambda(d.act_arg, e) for e in d.phi)
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

    u = tuple(sp.Symbol(f"{r['u']}({k})") for k in range(T))
    rr = tuple(sp.Symbol(f"{r['r']}({k})") for k in range(T))
    h, z, g = [], [], []
    for tt in range(T):
        h.append(u[tt] + sum((at(d.couplings.h_past, tt, ss) * g[ss] for ss in range(tt)), sp.Integer(0)))
        zt = rr[tt] + sum((at(d.couplings.z_upto, tt, ss) * phi[0](h[ss]) for ss in range(tt + 1)), sp.Integer(0))
        zt += sum((at(d.couplings.z_past, tt, ss) * phi[0](h[ss]) for ss in range(tt)), sp.Integer(0))
        z.append(zt)
        g.append(phi[1](h[tt]) * zt)
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
    lv, tv = m.layer_var, m.time_var
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
    w.append(f"  d{h}(t)/d{Dl}(t') = [t' < t] ({sp.sstr(dh_dD.subs(d.s, tp))}) {g}(t') "
             f"+ sum_{{s<t}} c_{h}(t, s) d{g}(s)/d{Dl}(t')")
    w.append(f"  d{h}(t)/d{Phi}[{lv}-1](t', s') = [t' = t, s' < t] ({sp.sstr(dh_dPhi.subs(d.s, sq))}) {g}(s') "
             f"+ sum_{{s<t}} c_{h}(t, s) d{g}(s)/d{Phi}[{lv}-1](t', s')   [+ the source {u}: Price term below]")
    w.append(f"  d{h}(t)/d{A}[{lv}-1](t', s') = [t' = t, s' < t] ({sp.sstr(dh_dA)}) {g}(s') "
             f"+ sum_{{s<t}} c_{h}(t, s) d{g}(s)/d{A}[{lv}-1](t', s')")
    w.append(f"  d{z}(t)/d{Dl}(t') = [t' < t] ({sp.sstr(dz_dD.subs(d.s, tp))}) {ph}({h}(t')) "
             f"+ sum_{{s<=t}} (c0_{z} + [s<t] c_{z})(t, s) d{ph}({h}(s))/d{Dl}(t')")
    w.append(f"  d{z}(t)/d{G}[{lv}+1](t', s') = [t' = t, s' < t] ({sp.sstr(dz_dG.subs(d.s, sq))}) {ph}({h}(s')) "
             f"+ sum_{{s<=t}} (c0_{z} + [s<t] c_{z})(t, s) d{ph}({h}(s))/d{G}[{lv}+1](t', s')   [+ the source {rs}: Price term]")
    w.append(f"  d{z}(t)/d{B}[{lv}+1](t', s') = [t' = t, s' <= t] ({sp.sstr(dz_dB.subs(d.s, sq))}) {ph}({h}(s')) "
             f"+ sum_{{s<=t}} (c0_{z} + [s<t] c_{z})(t, s) d{ph}({h}(s))/d{B}[{lv}+1](t', s')")
    w.append(f"  d{g}(t)/dq = {ph}''({h}(t)) {z}(t) d{h}(t)/dq + {ph}'({h}(t)) d{z}(t)/dq")
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
             "dmftc.deep_linear for linear activations)")
    return w


def format_deep_derivation(d: DeepDerivation, latex: bool = False) -> str:
    m, r = d.model, d.roles
    lv, tv = m.layer_var, m.time_var
    f = (lambda e: sp.latex(e)) if latex else sp.sstr
    out = []
    w = out.append
    w(f"model {m.name}: deep network, layers {lv} = 1..{m.depth}, time {tv} = 0..{m.spec.time.steps_name}-1, "
      f"step {m.spec.time.step_name}")
    w(f"activation: {m.activation.name}(x) = {f(d.phi[0])};  {m.activation.name}'(x) = {f(d.phi[1])};  "
      f"{m.activation.name}''(x) = {f(d.phi[2])}")
    kink = next((k for k, e in enumerate(d.phi) if e.has(sp.DiracDelta)), None)
    if kink is not None:
        w(f"  non-smooth: derivative {kink} of {m.activation.name} holds a delta function (derivatives are taken "
          "as distributions; the generated code replaces each delta by a Gaussian of width dirac_width, a bias "
          "of the propagator's Monte Carlo estimate)")
    w("")
    w(f"process of layer {lv} (c_X: coupling kernels, explicit in the order parameters of the adjacent layers):")
    w(f"  {r['u']}[{lv}] ~ GP(0, {r['Phi']}[{lv}-1]),  {r['r']}[{lv}] ~ GP(0, {r['G']}[{lv}+1])  (independent)")
    w(f"  {r['h']}(t) = {r['u']}(t) + sum_{{s<t}} c_{r['h']}(t, s) {r['g']}(s),     c_{r['h']}(t, s) = "
      f"{f(d.couplings.h_past)}")
    w(f"  {r['z']}(t) = {r['r']}(t) + sum_{{s<=t}} c0_{r['z']}(t, s) {m.activation.name}({r['h']}(s)) + sum_{{s<t}} "
      f"c_{r['z']}(t, s) {m.activation.name}({r['h']}(s)),")
    w(f"      c0_{r['z']}(t, s) = {f(d.couplings.z_upto)},   c_{r['z']}(t, s) = {f(d.couplings.z_past)}")
    w(f"  {r['g']}(t) = {m.activation.name}'({r['h']}(t)) {r['z']}(t)")
    w("")
    w("saddle-point equations (l = 1..L), boundaries:")
    for name in m.families + m.responses:
        eq = m.definitions[name]
        body = eq.body
        if isinstance(body, ast.Response):
            w(f"  {name}[{lv}](t, s) = < d {_txt(body.of)} / d {_txt(body.wrt)} >")
        else:
            w(f"  {name}[{lv}](t, s) = < {_txt(body.body)} >")
    for name, bs in d.boundaries.items():
        for ref, val in bs:
            w(f"  {name}[{ref.text()}](t, s) = {f(val)}")
    for sc in d.scalars:
        w(f"  {sc.name}(t) = {f(sc.expr)}")
        for ph, when in sc.averages:
            w(f"      {ph} = E[{r['z']}[{m.depth}]({when}) {m.activation.name}({r['h']}[{m.depth}]({when}))]")
    w(f"  readout by Stein's lemma for {r['r']}[{m.depth}]: E[{r['z']}[{m.depth}](t) {m.activation.name}("
      f"{r['h']}[{m.depth}](t))] = {f(d.readout_stein)}")
    w("")
    out.extend(blocks_text(d))
    return "\n".join(out)


def _txt(e) -> str:
    if isinstance(e, ast.Call):
        idx = f"[{', '.join(e.indices)}]" if e.indices else ""
        return f"{e.name}{idx}({', '.join(_txt(a) for a in e.args)})"
    if isinstance(e, ast.PrimeCall):
        return f"{e.name}'({', '.join(_txt(a) for a in e.args)})"
    if isinstance(e, ast.BinOp):
        return f"{_txt(e.left)} {e.op} {_txt(e.right)}" if e.op != "*" else f"{_txt(e.left)} {_txt(e.right)}"
    return ast.to_text(e)


__all__ = ["DeepDerivation", "derive_deep", "unroll", "price_term", "explicit_term", "gaussian_average",
           "response_observable", "format_deep_derivation", "activation_functions"]
