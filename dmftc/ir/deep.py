"""Lowering of a deep spec to the IR (:mod:`dmftc.ir.nodes`): kernels, responses and scalar order parameters
with their defining averages, the gp sources with order-parameter covariances, the per-layer causal fields
and the boundaries, in SymPy (fields, sources and kernels are applied functions named like the spec,
``Phi[l-1](t, s)``; causal sums are ``Sum(..., (s, 0, t - 1))`` or up to ``t``).
"""
from __future__ import annotations

import functools
import re

import sympy as sp

from dmftc.frontend.builtins import BUILTINS
from dmftc.errors import StructureSpecError
from dmftc.frontend import ast
from dmftc.frontend.check_deep import DeepModel, LayerRef
from dmftc.ir.nodes import Average, Axis, Boundary, Field, ModelIR, OrderParameter, Source

_BUILTINS = BUILTINS


@functools.lru_cache(maxsize=None)
def activation_functions(name: str, orders: int = 4):
    """Abstract SymPy functions phi, phi', phi'', ... whose derivatives are the next one (for printing)."""
    classes = []
    for k in range(orders + 1):
        classes.append(type(name + "'" * k, (sp.Function,), {"nargs": 1}))
    for k in range(orders):
        nxt = classes[k + 1]
        classes[k].fdiff = (lambda nxt: lambda self, argindex=1: nxt(self.args[0]))(nxt)
    return tuple(classes)


class DeepLowering:
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
        ref = layer_ref(text, m)
        base = sp.Symbol(ref.var, integer=True) if ref.var else sp.Integer(0)
        return base + ref.offset

    def layer_conv(self, e, var, tmap):
        """Layer-sum bodies: kernels at equal times become Function(name)(layer value)."""
        if isinstance(e, ast.Call) and e.indices and self.m.symbols[e.name].kind in ("family", "response"):
            return sp.Function(e.name)(self.layer_value(e.indices[0]) if not e.indices[0].startswith(var)
                                       else sp.Symbol(var, integer=True) + layer_ref(e.indices[0], self.m, var).offset)
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

    # ------------------------------------------------------------ the IR
    def causal(self, expr, sums):
        """Replace the sum placeholders of :meth:`conv` by SymPy sums over the earlier time s; returns the
        expression and ((sum, position), ...)."""
        t, s = self.t, self.s
        rep, pos = {}, []
        for ph, (cmp, body, node) in sums.items():
            if cmp == "E":
                continue
            rep[ph] = sp.Sum(body, (s, 0, t - 1 if cmp == "<" else t))
            pos.append((rep[ph], node.pos))
        return expr.xreplace(rep), tuple(pos)

    def lower(self) -> ModelIR:
        m, t, s, lv = self.m, self.t, self.s, self.m.layer_var
        orders = []
        for name in m.scalars:
            avgs = {}
            expr = self.conv(m.definitions[name].body, {m.time_var: t}, avgs)
            averages = tuple(Average(ph, self.conv(body, {m.time_var: t}, {}), node.pos)
                             for ph, (_, body, node) in avgs.items())
            orders.append(OrderParameter(name, (), sp.Integer(1), -expr, None, "constraint", 1, None, None,
                                         averages))
        for name in m.families:
            eq = m.definitions[name]
            obs = self.conv(eq.body.body, {m.time_var: t, eq.time2: s}, {})
            orders.append(OrderParameter(name, (), sp.Integer(1), sp.Integer(0), obs, "average", 2, lv))
        for name in m.responses:
            eq = m.definitions[name]
            of = self.conv(eq.body.of, {m.time_var: t}, {})
            orders.append(OrderParameter(name, (), sp.Integer(1), sp.Integer(0), of, "response", 2, lv,
                                         eq.body.wrt.name))
        sources = tuple(Source(((g.name, (lv,)),), g.decl.cov, "gp", (g.cov_family,), g.offset) for g in m.sources)
        fields = []
        for f in m.fields:
            sums = {}
            expr, where = self.causal(self.conv(f.body, {m.time_var: t}, sums), sums)
            fields.append(Field(f.name, (), expr, lv, where))
        bounds = tuple(Boundary(name, ref.text(), self.conv(eq.body, {}, {}))
                       for name, bs in m.boundaries.items() for ref, eq in bs)
        spec = m.spec
        params = tuple(p.name for p in spec.params) + (spec.time.steps_name, spec.time.step_name)
        return ModelIR(m, "deep", params, (m.time_var, spec.time.steps_name, spec.time.step_name),
                       (Axis(lv, m.depth, "layer"),) + tuple(Axis(n, m.points.size, "sample") for n in
                                                             (m.points.names if m.points else ())),
                       ((self.act.name, self.x, self.concrete_phi(0)),),
                       tuple(orders), sources, tuple(fields), boundaries=bounds)


def layer_ref(text, m, extra=None) -> LayerRef:
    mm = re.match(r"^(?:([A-Za-z_][A-Za-z_0-9]*)([+-][0-9]+)?|([0-9]+))$", text)
    if mm.group(3) is not None:
        return LayerRef(None, int(mm.group(3)))
    return LayerRef(mm.group(1), int(mm.group(2) or 0))


def lower_deep(model: DeepModel) -> ModelIR:
    """The IR of a checked deep model."""
    return DeepLowering(model).lower()
