"""Lowering of a two-layer spec to the IR (:mod:`dmftc.ir.nodes`): the action split into constraints and
single-site averages, the field equations and causal integrals in SymPy.

From the checked model this stage produces

* the per-step single-site process: sources, running sums (causal integrals ``eta * sum_{s<t}``), fields in
  dependency order;
* for every order parameter q_k its defining equation ``C_k(t) = <O_k(t)>``, where ``C_k = dS/d hat q_k``
  from the deterministic part of the action and ``O_k`` is the coefficient of ``hat q_k`` in the exponent of
  the single-site average (so ``q_k = (<O_k> - rest_k) / coeff_k``; no ``O_k``: a deterministic constraint).
"""
from __future__ import annotations

import sympy as sp

from dmftc.frontend.builtins import BUILTINS
from dmftc.ir.symbolic import (STEP, base_name, contract, diff_indexed, free_indices, index_symbol, per_step,
                                   quantity)
from dmftc.errors import SpecError, StructureSpecError
from dmftc.frontend import ast
from dmftc.frontend.check_two_layer import Model
from dmftc.frontend.recurrence import time_offset
from dmftc.ir.nodes import Axis, Field, ModelIR, OrderParameter, RunningSum, Source

_BUILTINS = BUILTINS


class IndexNames:
    """Located errors and fresh index names (``mu#3``), shared by lowering and derivation."""

    def __init__(self, model: Model, index_size: dict, counter: int = 0):
        self.m = model
        self.spec = model.spec
        self.index_size = dict(index_size)
        self.counter = counter

    def err(self, msg, pos, hint=None, cls=StructureSpecError):
        return cls(msg, pos, hint=hint, source=self.spec.source, filename=self.spec.filename)

    def fresh(self, base: str) -> str:
        self.counter += 1
        root = base.split("#")[0].rstrip("'")
        name = f"{root}#{self.counter}"
        self.index_size[name] = self.index_size[root]
        return name

    def fresh_all(self, idx):
        return [self.fresh(i) for i in idx]

    def size(self, name: str) -> sp.Symbol:
        return sp.Symbol(self.index_size[name], integer=True, positive=True)


class _Lowering(IndexNames):
    def __init__(self, model: Model):
        super().__init__(model, model.index_size)
        self.sums: dict[tuple, RunningSum] = {}
        self.activations = {a.name: a for a in self.spec.activations}
        self.sum_pos = {}  # running-sum name -> position of its first integral in the spec
        self.shift = 0     # time values are read this many steps after the current one (a recurrence's t + 1)
        self.refs = None   # a recurrence's reads {(name, time offset): value} (dmftc.ir.recurrence)

    def run(self) -> ModelIR:
        spec = self.spec
        for s in spec.sources:
            if len(s.targets) > 1 and any(t.indices for t in s.targets):
                raise self.err("jointly distributed sources must be scalars", s.pos,
                               hint="declare an indexed source alone: u[mu] ~ normal(0, Kx)")
        orders = {o.name for o in spec.orders}
        sources = tuple(Source(tuple((t.name, t.indices) for t in s.targets), s.cov, "normal",
                               tuple(sorted({x.name for x in ast.walk(s.cov) if getattr(x, "name", None) in orders})))
                        for s in spec.sources)
        recurrent = {r.name for r in self.m.recurrences}
        fdefs = {f.name: Field(f.name, f.indices, self.conv(f.body, {}, "sample")) for f in spec.fields
                 if f.name not in recurrent}
        fdefs.update(lower_recurrences(self, spec.time.step_name))
        fields = tuple(fdefs[n] for n in self.m.field_order if n in fdefs)
        det, obs = self.split_action()
        saddles = tuple(self.saddle(o.name, o.indices, det, obs) for o in spec.orders)
        axes = tuple(Axis(i, self.m.index_size[i], "sample") for d in spec.indices for i in d.names)
        x = sp.Symbol("__x", real=True)
        acts = tuple((a.name, x, self.conv(a.body, {}, "activation", {a.arg: x})) for a in spec.activations)
        params = tuple(p.name for p in spec.params) + (spec.time.steps_name, spec.time.step_name)
        return ModelIR(self.m, "two_layer", params, (self.m.time_var, spec.time.steps_name, spec.time.step_name),
                       axes, acts, saddles, sources, fields,
                       tuple(s for s in self.sums.values() if s.scope == "sample"),
                       tuple(s for s in self.sums.values() if s.scope == "order"),
                       (), dict(self.index_size), self.counter, dict(self.sum_pos))

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
            if e.name == self.m.time_var or e.name not in sym:      # time as a value: the step number
                return STEP + self.shift
            return quantity(e.name)
        if isinstance(e, ast.Indexed):
            s = sym.get(e.name)
            if e.name == "eye" and s is None:                   # the Kronecker delta eye[c, d]
                return sp.KroneckerDelta(*(index_symbol(rename.get(i, i)) for i in e.indices))
            if s is not None and s.kind == "param" and s.indices == (self.spec.time.steps_name,):
                (i,) = e.indices
                k = int(i[i.index("+"):]) if "+" in i else -int(i[i.index("-") + 1:]) if "-" in i else 0
                return per_step(e.name, k + self.shift)
            return quantity(e.name, tuple(rename.get(i, i) for i in e.indices))
        if isinstance(e, ast.Call):
            s = sym.get(e.name)
            if s is not None and s.kind in ("order", "field") and self.refs is not None and e.name in self.refs:
                return self.refs[e.name][time_offset(e.args[0], self.m.time_var)]
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
        raise self.err(f"this expression {what}: {value}", e.pos, cls=SpecError, hint=FINITE_HINT)

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

    def saddle(self, name, idx, det, obs) -> OrderParameter:
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
        declared = [o.name for o in self.spec.orders]
        deps = tuple(sorted({_base(a) for a in same_time}, key=declared.index))
        if deps:
            later = [d for d in deps if declared.index(d) >= declared.index(name)]
            if later:
                raise self.err(f"the constraint of '{name}' couples it to {', '.join(later)} at the same time", pos,
                               hint="an order parameter may be defined from order parameters declared BEFORE it at "
                                    "the same time (e.g. order Delta(t), r(t) with r(t) = -log(Delta(t) / y), or "
                                    "order f[mu, c](t), Delta[mu, c](t) with Delta a function of f[mu, d](t)); other "
                                    "same-time couplings need an iterative solve, which is not supported; use a "
                                    "causal integral")
        if sp.simplify(coeff) == 0:
            raise self.err(f"the constraint of '{name}' does not contain {name}(t)", pos)
        return OrderParameter(name, idx, coeff, rest, None if o == 0 else o,
                              "average" if o != 0 else "constraint", same_time=deps)


_BIG = 1e300  # magnitude beyond which a constant is not safely a double
FINITE_HINT = ("check for a division by zero, a power of zero, the log of zero or of a negative number, or the "
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


def order_handle(x):
    """What ``expr.has`` needs to find any component of a quantity."""
    return x.base if isinstance(x, sp.Indexed) else x


def _base(x) -> str:
    return str(x.base.label) if isinstance(x, sp.Indexed) else str(x)


def _is_order(spec, atom) -> bool:
    return any(o.name == _base(atom) for o in spec.orders)


def lower_recurrences(low: _Lowering, eta: str) -> dict:
    """The fields in recurrence form (dmftc.frontend.recurrence) as running sums of the march: each is its initial
    value plus a state R that starts at 0 and advances at the end of step t by (its new value) - (its value),
    the new value read from its equation with every quantity at the end of step t.  An early recurrence X(t) is
    the field X = init + R (R(t) = X(t) - init); a late one has no field (R(t) = X(t - 1) - init: its previous
    value), and its value at t, where other recurrences read it, is its equation.  The running sum's increment is
    the change over eta (the IR's sums are eta * sum of their increments).  Returns the early ones' fields."""
    plans = low.m.recurrences
    if not plans:
        return {}
    step = sp.Symbol(eta, real=True)
    state = {r.name: quantity(f"∫{r.name}") for r in plans}
    init = {r.name: low.conv(r.init, {}, "sample") for r in plans}
    kind = {r.name: r.kind for r in plans}
    new: dict = {}

    def reads(r):
        """{name: {offset: value}} of the quantities the equation of ``r`` may read."""
        out = {}
        for n, s in low.m.symbols.items():
            if s.kind not in ("order", "field"):
                continue
            now = new[n] if kind.get(n) == "late" and n in new else quantity(n)
            before = init[n] + state[n] if kind.get(n) == "late" else None
            out[n] = {0: now, -1: before} if r.kind == "late" else {-1: now}
        out[r.name][-1] = init[r.name] + state[r.name]        # its own previous value: the state
        return out

    done: list = []
    for r in sorted(plans, key=lambda r: r.kind != "late"):
        pending = [r]
        while pending:                       # late recurrences after those they read at t
            x = pending[-1]
            need = [a for a in x.after if a not in new and a not in [p.name for p in pending]]
            if need:
                pending.append(next(p for p in plans if p.name == need[0]))
                continue
            pending.pop()
            if x.name in new:
                continue
            low.refs, low.shift = reads(x), 1 if x.kind == "early" else 0
            try:
                new[x.name] = low.conv(x.body, {}, "sample")
            finally:
                low.refs, low.shift = None, 0
            done.append(x)
    for x in done:
        name = state[x.name].name
        low.sums[("recurrence", x.name)] = RunningSum(name, (), (new[x.name] - init[x.name] - state[x.name]) / step,
                                                      "sample")
        low.sum_pos[name] = next(f.pos for f in low.spec.fields if f.name == x.name)
    return {x.name: Field(x.name, (), init[x.name] + state[x.name]) for x in plans if x.kind == "early"}


def lower_two_layer(model: Model) -> ModelIR:
    """The IR of a checked two-layer model (located :class:`SpecError` for what cannot be lowered)."""
    return _Lowering(model).run()
