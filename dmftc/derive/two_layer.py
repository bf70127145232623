"""Stage 3: symbolic derivation (SymPy) from the action and the single-site process.

From the checked model alone this stage derives

* the per-step single-site process: sources, running sums (causal integrals
  ``eta * sum_{s<t}``), fields in dependency order;
* for every order parameter q_k the saddle-point equation
  ``C_k(t) = <O_k(t)>``, where ``C_k = dS/d hat q_k`` from the deterministic part
  of the action and ``O_k`` is the coefficient of ``hat q_k`` in the exponent of
  the single-site average (so ``q_k = (<O_k> - rest_k) / coeff_k``);
* the Hessian blocks: ``kappa = Cov(O_j(t), O_k(s))``; the field sensitivities
  (tangent equations) to the order parameters that drive the process, and from
  them ``D_jk(t,s) = d<O_j(t)>/d q_k(s)``; and
  ``U = dC/dq - D`` (explicit part: same-time coefficient plus the causal
  running-sum terms), so that ``Sigma = U^-1 kappa U^-T``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy as sp

from dmftc.frontend import ast
from dmftc.derive.activation import BUILTINS
from dmftc.frontend.check import Model
from dmftc.errors import SpecError, StructureSpecError
from dmftc.derive.symbolic import (ONEHOT, base_name, chain, contract, diff_indexed, free_indices, index_symbol, quantity,
                       singular_terms, unsupported)


@dataclass(frozen=True)
class RunningSum:
    """``name(t) = eta * sum_{s<t} increment(s)``; scope 'sample' (per trajectory) or 'order'."""

    name: str
    indices: tuple[str, ...]
    increment: sp.Expr
    scope: str


@dataclass(frozen=True)
class FieldDef:
    name: str
    indices: tuple[str, ...]
    expr: sp.Expr


@dataclass(frozen=True)
class SourceGroup:
    """Jointly Gaussian sources. ``cov`` is an AST (evaluated at run time)."""

    targets: tuple[tuple[str, tuple[str, ...]], ...]
    cov: ast.Expr


@dataclass(frozen=True)
class Saddle:
    """Saddle-point equation ``coeff * q(t) + rest(t) = <observable(t)>``."""

    name: str
    indices: tuple[str, ...]
    coeff: sp.Expr
    rest: sp.Expr
    observable: sp.Expr | None


@dataclass(frozen=True)
class Tangent:
    """Sensitivity of ``target`` to the driver order parameter (an increment for running sums)."""

    target: str
    driver: str
    indices: tuple[str, ...]    # target indices followed by the driver's primed indices
    expr: sp.Expr


@dataclass(frozen=True)
class PastTerm:
    """Causal part of dC_row(t)/d q_col(s) for s < t: eta * sum over ``dummies`` of at_t(t) * at_s(s)."""

    row: str
    col: str
    at_t: sp.Expr
    at_s: sp.Expr
    dummies: tuple[str, ...]


@dataclass(frozen=True)
class Derivation:
    model: Model
    index_size: dict[str, str]                 # every index symbol (declared, bound, primed) -> size param
    orders: tuple[tuple[str, tuple[str, ...]], ...]
    sources: tuple[SourceGroup, ...]
    sample_sums: tuple[RunningSum, ...]
    order_sums: tuple[RunningSum, ...]
    fields: tuple[FieldDef, ...]
    saddles: tuple[Saddle, ...]
    drivers: tuple[str, ...]
    primed: dict[str, tuple[str, ...]]         # driver -> its primed index names
    field_tangents: tuple[Tangent, ...]
    sum_tangents: tuple[Tangent, ...]
    observable_tangents: tuple[Tangent, ...]
    past_terms: tuple[PastTerm, ...]
    singular: tuple[str, ...] = field(default=())
    nonlinear: str | None = None   # why the process is not Gaussian (None: linear, exact moments possible)

    def saddle(self, name: str) -> Saddle:
        return next(s for s in self.saddles if s.name == name)

    def tangent(self, kind: str, target: str, driver: str) -> Tangent:
        group = {"field": self.field_tangents, "sum": self.sum_tangents, "observable": self.observable_tangents}
        return next(t for t in group[kind] if t.target == target and t.driver == driver)


_BUILTINS = BUILTINS


class _Deriver:
    def __init__(self, model: Model):
        self.m = model
        self.spec = model.spec
        self.index_size = dict(model.index_size)
        self.counter = 0
        self.sums: dict[tuple, RunningSum] = {}
        self.activations = {a.name: a for a in self.spec.activations}
        self.sum_pos = {}  # running-sum name -> position of its first integral in the spec

    def err(self, msg, pos, hint=None, cls=StructureSpecError):
        return cls(msg, pos, hint=hint, source=self.spec.source, filename=self.spec.filename)

    def fresh(self, base: str) -> str:
        self.counter += 1
        root = base.split("#")[0].rstrip("'")
        name = f"{root}#{self.counter}"
        self.index_size[name] = self.index_size[root]
        return name

    def size(self, name: str) -> sp.Symbol:
        return sp.Symbol(self.index_size[name], integer=True, positive=True)

    # ---------------------------------------------------------------- AST -> SymPy
    def conv(self, e, rename, scope, local=None):
        c = lambda x: self.conv(x, rename, scope, local)
        sym = self.m.symbols
        if isinstance(e, ast.Num):
            v = e.value
            return sp.Integer(int(v)) if v == int(v) else sp.Float(v)
        if isinstance(e, ast.Name):
            if local and e.name in local:
                return local[e.name]
            if e.name == "pi":
                return sp.pi
            return quantity(e.name)
        if isinstance(e, ast.Indexed):
            return quantity(e.name, tuple(rename.get(i, i) for i in e.indices))
        if isinstance(e, ast.Call):
            s = sym.get(e.name)
            if s is not None and s.kind in ("order", "field"):
                return quantity(e.name, tuple(rename.get(i, i) for i in e.indices))
            args = [c(a) for a in e.args]
            if e.name in self.activations:
                return self.finite(self.activation(e.name, args[0], 0), e)
            return self.finite(_BUILTINS[e.name](*args), e)
        if isinstance(e, ast.PrimeCall):
            return self.finite(self.activation(e.name, c(e.args[0]), 1), e)
        if isinstance(e, ast.Hat):
            return quantity("hat_" + e.name, tuple(rename.get(i, i) for i in e.indices))
        if isinstance(e, ast.BinOp):
            a, b = c(e.left), c(e.right)
            if e.op == "^" and a.is_Number and b.is_Number and _out_of_range(a, b):
                raise self.err(f"the number {a}^{b} is out of the floating-point range", e.pos, cls=SpecError)
            return self.finite({"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b,
                                "^": lambda: a ** b}[e.op](), e)
        if isinstance(e, ast.Neg):
            return -c(e.operand)
        if isinstance(e, ast.IndexSum):
            inner = dict(rename)
            limits = []
            for i in e.indices:
                f = self.fresh(i)
                inner[i] = f
                limits.append((index_symbol(f), 0, self.size(f) - 1))
            return sp.Sum(self.conv(e.body, inner, scope, local), *limits)
        if isinstance(e, ast.Integral):
            if e.cmp is None:  # top-level integral over t in the action: the measure cancels
                return c(e.body)
            rs = self.running_sum(c(e.body), scope)
            self.sum_pos.setdefault(base_name(rs), e.pos)
            return rs
        if isinstance(e, ast.Expectation):
            raise self.err("log E[...] must appear as a separate term of the action", e.pos)
        if isinstance(e, ast.Matrix):
            raise self.err("a matrix cannot be used inside an expression", e.pos)
        raise AssertionError(type(e))  # pragma: no cover

    def finite(self, value, e):
        """``value``, the SymPy form of ``e``, unless it is undefined, infinite, complex or out of range."""
        if value.has(sp.nan, sp.zoo, sp.oo, -sp.oo):
            what = "is undefined or infinite"
        elif value.has(sp.I):
            what = "is not a real number"
        elif any(abs(n.p) > _BIG or n.q > _BIG for n in value.atoms(sp.Rational)) \
                or any(abs(n) > _BIG for n in value.atoms(sp.Float)):
            what = "contains a number out of the floating-point range"
        else:
            return value
        raise self.err(f"this expression {what}: {value}", e.pos, cls=SpecError, hint=_FINITE_HINT)

    def activation(self, name, arg, order):
        if name in self.activations:
            a = self.activations[name]
            x = sp.Symbol("__x", real=True)
            body = self.conv(a.body, {}, "activation", {a.arg: x})
        else:
            x = sp.Symbol("__x", real=True)
            body = _BUILTINS[name](x)
        if order:
            body = sp.diff(body, x, order)
        return body.subs(x, arg)

    def running_sum(self, inc, scope):
        idx = tuple(sorted(free_indices(inc, self.index_size)))
        key = (scope, sp.srepr(inc), idx)
        if key not in self.sums:
            name = f"∫{len(self.sums) + 1}"
            self.sums[key] = RunningSum(name, idx, inc, scope)
        rs = self.sums[key]
        return quantity(rs.name, idx)

    # ---------------------------------------------------------------- derivation
    def run(self) -> Derivation:
        spec = self.spec
        orders = tuple((o.name, o.indices) for o in spec.orders)
        order_idx = dict(orders)
        sources = tuple(SourceGroup(tuple((t.name, t.indices) for t in s.targets), s.cov) for s in spec.sources)
        for s in spec.sources:
            if len(s.targets) > 1 and any(t.indices for t in s.targets):
                raise self.err("jointly distributed sources must be scalars", s.pos,
                               hint="declare an indexed source alone: u[mu] ~ normal(0, Kx)")
        fdefs = {}
        for f in spec.fields:
            fdefs[f.name] = FieldDef(f.name, f.indices, self.conv(f.body, {}, "sample"))
        fields = tuple(fdefs[n] for n in self.m.field_order)
        det, obs = self.split_action()
        saddles = []
        for name, idx in orders:
            saddles.append(self.saddle(name, idx, det, obs))
        sample_sums = tuple(s for s in self.sums.values() if s.scope == "sample")
        order_sums = tuple(s for s in self.sums.values() if s.scope == "order")
        order_syms = {n: quantity(n, i) for n, i in orders}
        drivers = tuple(n for n, i in orders
                        if any(s.increment.has(_handle(order_syms[n])) for s in sample_sums))
        primed = {d: tuple(i + "'" for i in order_idx[d]) for d in drivers}
        for d, ps in primed.items():
            for p, i in zip(ps, order_idx[d]):
                self.index_size[p] = self.index_size[i]
        ft, st, ot = [], [], []
        field_deps = {f.name: f.indices for f in fields}
        sum_deps = {s.name: s.indices for s in sample_sums}
        for d in drivers:
            tan = lambda name, dummies, d=d: quantity(f"d{name}/d{d}", tuple(dummies) + primed[d])
            for f in fields:  # fields first (dependency order), then sums, then observables
                expr = chain(f.expr, {**sum_deps, **field_deps}, tan, self.fresh_all, self.size)
                ft.append(Tangent(f.name, d, f.indices + primed[d], expr))
            dq = quantity(d, primed[d])
            for s in sample_sums:
                explicit = diff_indexed(s.increment, order_syms[d], [index_symbol(p) for p in primed[d]])
                expr = chain(s.increment, field_deps, tan, self.fresh_all, self.size) + explicit * ONEHOT
                st.append(Tangent(s.name, d, s.indices + primed[d], sp.expand(expr) if not s.indices else expr))
            for sd in saddles:
                if sd.observable is not None:
                    expr = chain(sd.observable, field_deps, tan, self.fresh_all, self.size)
                    ot.append(Tangent(sd.name, d, sd.indices + primed[d], expr))
            del dq
        past = []
        for sd in saddles:
            for rs in order_sums:
                dummies = tuple(self.fresh(i) for i in rs.indices)
                a = diff_indexed(sd.rest, quantity(rs.name, rs.indices), [index_symbol(x) for x in dummies])
                if a == 0:
                    continue
                inc = rs.increment.xreplace({index_symbol(i): index_symbol(x) for i, x in zip(rs.indices, dummies)})
                for col, cidx in orders:
                    cols = tuple(self.fresh(i) for i in cidx)
                    b = diff_indexed(inc, order_syms[col], [index_symbol(x) for x in cols])
                    if b == 0:
                        continue
                    ren = {index_symbol(x): index_symbol(i) for x, i in zip(cols, cidx)}
                    b = b.xreplace({index_symbol(i): index_symbol(i + "'") for i in cidx}).xreplace(
                        {k: index_symbol(str(v) + "'") for k, v in ren.items()})
                    for i in cidx:
                        self.index_size[i + "'"] = self.index_size[i]
                    past.append(PastTerm(sd.name, col, a, b, dummies))
        self.supported(fields, sample_sums, saddles, ft, st, ot, past)
        singular = sorted({s for t in ft + st + ot for s in singular_terms(t.expr)})
        return Derivation(self.m, dict(self.index_size), orders, sources, sample_sums, order_sums, fields,
                          tuple(saddles), drivers, primed, tuple(ft), tuple(st), tuple(ot), tuple(past),
                          tuple(singular), self.linearity(fields, sample_sums, saddles))

    def linearity(self, fields, sample_sums, saddles) -> str | None:
        """Prove that every field is affine in the Gaussian sources (given the order parameters) and every
        observable is a polynomial of degree <= 2 in them; otherwise say which term breaks it, and where."""
        lam = sp.Symbol("__lambda")
        random = {n for g in self.spec.sources for n, _ in ((t.name, t.indices) for t in g.targets)}
        random |= {f.name for f in fields} | {s.name for s in sample_sums}

        def scaled(e):
            e = e.replace(lambda x: isinstance(x, sp.Indexed) and str(x.base.label) in random, lambda x: lam * x)
            return e.xreplace({sp.Symbol(n, real=True): lam * sp.Symbol(n, real=True) for n in random})

        def degree_exceeds(e, k):
            try:
                # structural test (no simplify): a false 'nonlinear' only means Monte Carlo is used
                return sp.expand(sp.diff(scaled(e), lam, k + 1).subs(lam, 1)) != 0
            except Exception:  # SymPy cannot decide (e.g. piecewise derivatives of abs): not proven affine
                return True

        line = {f.name: f for f in self.spec.fields}
        for f in fields:
            # substitute the fields it uses as affine placeholders: checking its own expression suffices
            if degree_exceeds(f.expr, 1):
                return f"field {f.name} = {f.expr} (line {line[f.name].pos.line}) is not affine in the sources"
        for s in sample_sums:
            if degree_exceeds(s.increment, 1):
                return f"the integrand {s.increment} of a causal integral is not affine in the sources"
        for sd in saddles:
            if sd.observable is not None and degree_exceeds(sd.observable, 2):
                return f"the observable of {sd.name}, {sd.observable}, is not a polynomial of degree <= 2"
        return None

    def supported(self, fields, sample_sums, saddles, ft, st, ot, past):
        """Reject what the generated kernels cannot evaluate, at the statement it comes from."""
        decl = {f.name: f for f in self.spec.fields}
        log = next((x for a in self.spec.actions for x in ast.walk(a.body) if isinstance(x, ast.Expectation)), None)
        obs_pos = log.pos if log is not None else self.spec.actions[0].pos
        sums = {s.name for s in sample_sums}
        for t in ft:  # tangent kernels see fields, sources and sensitivities, not the running sums themselves
            used = sorted(str(a) for a in t.expr.atoms(sp.Symbol) if str(a) in sums)
            if used:
                f = decl[t.target]
                raise self.err(f"field '{f.name}' must be affine in its causal integrals, with coefficients made "
                               "of parameters and sources", self.sum_pos.get(used[0], f.pos),
                               hint=f"give the integral its own field, e.g. I(t) = integral(..., s < t), and use "
                                    f"I(t) in the equation of '{f.name}'")
        where = [(f.expr, decl[f.name].pos, f"field '{f.name}'") for f in fields]
        where += [(t.expr, decl[t.target].pos, f"the sensitivity of field '{t.target}' to {t.driver}") for t in ft]
        where += [(s.increment, self.sum_pos.get(s.name), "the integrand") for s in sample_sums]
        where += [(t.expr, self.sum_pos.get(t.target), f"the sensitivity of the integrand to {t.driver}") for t in st]
        where += [(s.observable, obs_pos, f"the observable of {s.name}") for s in saddles if s.observable is not None]
        where += [(t.expr, obs_pos, f"the sensitivity of the observable of {t.target} to {t.driver}") for t in ot]
        order_pos = {o.name: o.pos for o in self.spec.orders}
        where += [(e, order_pos[s.name], f"the constraint of '{s.name}'") for s in saddles for e in (s.coeff, s.rest)]
        where += [(e, order_pos[p.row], f"the constraint of '{p.row}'") for p in past for e in (p.at_t, p.at_s)]
        for expr, pos, what in where:
            bad = unsupported(expr)
            if bad is None:
                continue
            if isinstance(bad, sp.DiracDelta) or (isinstance(bad, sp.Derivative) and bad.expr.has(sp.DiracDelta)):
                hint = ("a non-smooth activation (relu, max, min, abs) is differentiated too often here: its "
                        "second derivative is already a delta function; use a smooth activation such as tanh or erf")
                raise self.err(f"{what} needs a derivative of a delta function ({bad}), which cannot be evaluated",
                               pos, hint=hint)
            if bad in (sp.I, sp.nan, sp.zoo, sp.oo, -sp.oo):
                raise self.err(f"{what} is undefined or not real (it contains {bad})", pos, hint=_FINITE_HINT)
            raise self.err(f"{what} contains {bad}, which dmftc cannot evaluate", pos,
                           hint="use the built-in functions: " + ", ".join(sorted(_BUILTINS)))

    def fresh_all(self, idx):
        return [self.fresh(i) for i in idx]

    def split_action(self):
        """Split the action into its deterministic part and the exponent of log E[exp(-X)]."""
        det = sp.Integer(0)
        obs = sp.Integer(0)
        n_log = 0
        for act in self.spec.actions:
            for sign, term in ast.signed_terms(act.body, 1):
                if isinstance(term, ast.Expectation):
                    n_log += 1
                    if sign != 1:
                        raise self.err("log E[...] must enter the action with a + sign", term.pos)
                    arg = term.body.args[0]
                    obs += -self.conv(arg, {}, "observable")
                else:
                    det += sign * self.conv(term, {}, "order")
        if n_log > 1:
            raise self.err("the action may contain only one log E[...] term", self.spec.actions[0].pos,
                           hint="put all observables inside a single exponent")
        for name, idx in ((o.name, o.indices) for o in self.spec.orders):
            hat = quantity("hat_" + name, idx)
            for e in (det, obs):
                first = diff_indexed(e, hat, [index_symbol(self.fresh(i)) for i in idx])
                if first != 0 and diff_indexed(first, hat, [index_symbol(self.fresh(i)) for i in idx]) != 0:
                    raise self.err(f"the action is not linear in the dual variable 'hat {name}'",
                                   self.spec.actions[0].pos, hint="each hat variable multiplies its constraint once")
        return det, obs

    def saddle(self, name, idx, det, obs) -> Saddle:
        hat = quantity("hat_" + name, idx)
        dummies = [index_symbol(self.fresh(i)) for i in idx]
        back = {d: index_symbol(i) for d, i in zip(dummies, idx)}
        c = diff_indexed(det, hat, dummies).xreplace(back)
        o = diff_indexed(obs, hat, dummies).xreplace(back)
        pos = next(x.pos for x in self.spec.orders if x.name == name)
        if c == 0:
            raise self.err(f"order parameter '{name}' has no constraint in the action", pos,
                           hint=f"add integral(hat {name}(t) * ({name}(t) - ...), t)")
        q = quantity(name, idx)
        coeff = contract(sp.diff(c, q))
        if coeff.free_symbols & {s for s in coeff.free_symbols if s.is_Symbol and _is_order(self.spec, s)} \
                or any(isinstance(a, sp.Indexed) for a in coeff.atoms(sp.Indexed)):
            raise self.err(f"the constraint of '{name}' is not linear in {name}(t)", pos)
        rest = sp.expand(c - coeff * q) if not idx else contract(c - coeff * q)
        same_time = [a for a in rest.atoms(sp.Symbol, sp.Indexed) if _is_order(self.spec, a)]
        if same_time:
            names = ", ".join(sorted({_base(a) for a in same_time}))
            raise self.err(f"the constraint of '{name}' couples it to {names} at the same time", pos,
                           hint="same-time couplings between order parameters need an iterative solve, "
                                "which is not supported yet; use a causal integral")
        if sp.simplify(coeff) == 0:
            raise self.err(f"the constraint of '{name}' does not contain {name}(t)", pos)
        return Saddle(name, idx, coeff, rest, None if o == 0 else o)


_BIG = 1e300  # magnitude beyond which a constant is not safely a double
_FINITE_HINT = ("check for a division by zero, a power of zero, the log of zero or of a negative number, or the "
                "square root or a fractional power of a negative number")


def _out_of_range(a, b) -> bool:
    """Whether the constant a^b overflows or underflows a double (checked before SymPy computes it exactly)."""
    if a == 0:
        return False
    try:
        value = abs(float(a) ** float(b))
    except OverflowError:
        return True
    except ZeroDivisionError:
        return False
    return not 1 / _BIG < value < _BIG


def _handle(x):
    """What ``expr.has`` needs to find any component of a quantity."""
    return x.base if isinstance(x, sp.Indexed) else x


def _base(x) -> str:
    return str(x.base.label) if isinstance(x, sp.Indexed) else str(x)


def _is_order(spec, atom) -> bool:
    return any(o.name == _base(atom) for o in spec.orders)


def derive(model: Model) -> Derivation:
    """Derive a checked model; a deep model (:mod:`dmftc.frontend.check_deep`) gives a :class:`dmftc.derive.deep.DeepDerivation`."""
    from dmftc.frontend.check_deep import DeepModel

    if isinstance(model, DeepModel):
        from dmftc.derive.deep import derive_deep
        return derive_deep(model)
    try:
        return _Deriver(model).run()
    except SpecError:
        raise
