"""Stage 4: symbolic derivation (SymPy) from the IR of a two-layer spec (:mod:`dmftc.ir`).

The IR gives the single-site process (sources, running sums, fields in dependency order) and every order
parameter's defining equation ``coeff_k q_k(t) + rest_k(t) = <O_k(t)>``.  This stage derives the Hessian
blocks: ``kappa = Cov(O_j(t), O_k(s))``; the field sensitivities (tangent equations) to the order parameters
that drive the process, and from them ``D_jk(t,s) = d<O_j(t)>/d q_k(s)``; and ``U = dC/dq - D`` (explicit
part: same-time coefficient plus the causal running-sum terms), so that ``Sigma = U^-1 kappa U^-T``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy as sp

from dmftc.frontend.builtins import BUILTINS
from dmftc.ir.symbolic import ONEHOT, chain, diff_indexed, index_symbol, quantity, singular_terms, unsupported
from dmftc.errors import StructureSpecError
from dmftc.frontend import ast
from dmftc.frontend.check_two_layer import Model
from dmftc.ir.nodes import Field, ModelIR, OrderParameter, RunningSum, Source
from dmftc.ir.two_layer import FINITE_HINT, IndexNames, order_handle, lower_two_layer


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
    sources: tuple[Source, ...]
    sample_sums: tuple[RunningSum, ...]
    order_sums: tuple[RunningSum, ...]
    fields: tuple[Field, ...]
    saddles: tuple[OrderParameter, ...]
    drivers: tuple[str, ...]
    primed: dict[str, tuple[str, ...]]         # driver -> its primed index names
    field_tangents: tuple[Tangent, ...]
    sum_tangents: tuple[Tangent, ...]
    observable_tangents: tuple[Tangent, ...]
    past_terms: tuple[PastTerm, ...]
    singular: tuple[str, ...] = field(default=())
    nonlinear: str | None = None   # why the process is not Gaussian (None: linear, exact moments possible)
    ir: ModelIR | None = field(default=None, compare=False)
    kink_fields: tuple[str, ...] = ()   # fields whose zero is a kink of the activation (DiracDelta(field))
    site: object = field(default=None, compare=False)   # the single-site program (dmftc.derive.site), or None
    site_missing: str | None = None     # why there is none

    def saddle(self, name: str) -> OrderParameter:
        return next(s for s in self.saddles if s.name == name)

    def tangent(self, kind: str, target: str, driver: str) -> Tangent:
        group = {"field": self.field_tangents, "sum": self.sum_tangents, "observable": self.observable_tangents}
        return next(t for t in group[kind] if t.target == target and t.driver == driver)


_BUILTINS = BUILTINS


class _Deriver(IndexNames):
    def __init__(self, ir: ModelIR):
        super().__init__(ir.model, ir.index_size, ir.fresh)
        self.ir = ir
        self.sum_pos = dict(ir.sum_pos)

    # ---------------------------------------------------------------- derivation
    def run(self) -> Derivation:
        ir = self.ir
        orders = tuple((o.name, o.indices) for o in ir.orders)
        order_idx = dict(orders)
        sources, fields, saddles = ir.sources, ir.fields, ir.orders
        sample_sums, order_sums = ir.sample_sums, ir.order_sums
        order_syms = {n: quantity(n, i) for n, i in orders}
        drivers = tuple(n for n, i in orders
                        if any(s.increment.has(order_handle(order_syms[n])) for s in sample_sums))
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
                expr = chain(s.increment, {**sum_deps, **field_deps}, tan, self.fresh_all, self.size) \
                    + explicit * ONEHOT         # (a recurrence's increment reads the running sums)
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
        names = {f.name for f in fields}
        kinks = sorted({str(getattr(a.args[0], "base", a.args[0])) for t in ft + st + ot
                        for a in t.expr.atoms(sp.DiracDelta)} & names)
        return Derivation(self.m, dict(self.index_size), orders, sources, sample_sums, order_sums, fields,
                          tuple(saddles), drivers, primed, tuple(ft), tuple(st), tuple(ot), tuple(past),
                          tuple(singular), self.linearity(fields, sample_sums, saddles), ir, tuple(kinks))

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
                raise self.err(f"{what} is undefined or not real (it contains {bad})", pos, hint=FINITE_HINT)
            raise self.err(f"{what} contains {bad}, which dmftc cannot evaluate", pos,
                           hint="use the built-in functions: " + ", ".join(sorted(_BUILTINS)))



def derive_two_layer(model) -> Derivation:
    """Derive a checked two-layer model or its IR (any kind of spec: :func:`dmftc.derive.derive`)."""
    from dataclasses import replace

    from dmftc.derive.site_lowering import site_program

    ir = model if isinstance(model, ModelIR) else lower_two_layer(model)
    d = _Deriver(ir).run()
    try:
        return replace(d, site=site_program(ir))
    except StructureSpecError as err:
        return replace(d, site_missing=err.message)
