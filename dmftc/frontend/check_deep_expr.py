"""Expression checks of deep specs (split from :mod:`dmftc.frontend.check_deep`): every expression of a field equation,
a definition or a scalar order parameter is checked for names, arity, layer references against the layers where
a family exists, time arguments and causality, with located errors.  A mixin of the deep checker.
"""
from __future__ import annotations

from dataclasses import dataclass

from dmftc.frontend import ast
from dmftc.frontend.names import BUILTIN_FUNCTIONS, check_function_call
from dmftc.errors import CausalitySpecError, NameSpecError, ShapeSpecError, SpecError, StructureSpecError


@dataclass(frozen=True)
class LayerRef:
    """A layer index: ``var + offset`` (var is the layer variable or the depth parameter) or a number."""

    var: str | None
    offset: int

    def text(self) -> str:
        if self.var is None:
            return str(self.offset)
        return self.var + (f"{self.offset:+d}" if self.offset else "")


class DeepExpressionChecks:
    """dexpr / call / check_field_layer / usage of :class:`dmftc.frontend.check_deep._DeepChecker`."""

    def dexpr(self, e, *, ctx, times, layers, sum_var=None, sum_cmp=None, same_layer=False, owner=None,
              in_avg=False):
        """Check an expression of a deep spec.  ctx: field | average | scalar | boundary."""
        rec = lambda x, **kw: self.dexpr(x, **({"ctx": ctx, "times": times, "layers": layers, "sum_var": sum_var,
                                                 "sum_cmp": sum_cmp, "same_layer": same_layer, "owner": owner,
                                                 "in_avg": in_avg} | kw))
        tm = self.spec.time.var
        if isinstance(e, ast.Num):
            return
        if isinstance(e, ast.Name):
            sym = self.lookup(e.name, e.pos, extra=times)
            if sym.kind == "param":
                return
            if sym.kind in ("family", "response", "order", "field", "source"):
                raise self.err(ShapeSpecError, f"{kind_phrase(sym)} '{e.name}' needs "
                               + ("a layer index and " if sym.indices else "") + "time arguments", e.pos,
                               hint=f"write {self.usage(sym)}")
            raise self.err(SpecError, f"{kind_phrase(sym)} '{e.name}' cannot be used as a value here", e.pos)
        if isinstance(e, ast.Indexed):
            sym = self.lookup(e.name, e.pos)
            raise self.err(ShapeSpecError, f"{kind_phrase(sym)} '{e.name}' needs time arguments", e.pos,
                           hint=f"write {self.usage(sym)}")
        if isinstance(e, (ast.BinOp,)):
            rec(e.left)
            rec(e.right)
            return
        if isinstance(e, ast.Neg):
            rec(e.operand)
            return
        if isinstance(e, ast.PrimeCall):
            sym = self.lookup(e.name, e.pos)
            if sym.kind not in ("activation", "builtin") or BUILTIN_FUNCTIONS.get(e.name, 1) != 1:
                raise self.err(SpecError, f"'{e.name}' is not an activation; only activations have derivatives",
                               e.pos)
            if len(e.args) != 1:
                raise self.err(ShapeSpecError, f"{e.name}' takes one argument", e.pos)
            rec(e.args[0])
            return
        if isinstance(e, ast.Call):
            return self.call(e, rec, ctx=ctx, times=times, layers=layers, sum_var=sum_var, sum_cmp=sum_cmp,
                             same_layer=same_layer, owner=owner, in_avg=in_avg)
        if isinstance(e, (ast.Integral, ast.TimeSum)):
            if ctx != "field":
                raise self.err(StructureSpecError, "sums over time appear only in field equations", e.pos,
                               hint="order parameters are defined at the current times")
            if sum_var is not None:
                raise self.err(StructureSpecError, "nested sums over time are not supported", e.pos,
                               hint="introduce an intermediate field")
            cmp = e.cmp
            if isinstance(e, ast.Integral) and cmp is None:
                raise self.err(SpecError, f"'integral(..., {e.var})' over all times is not allowed in a field",
                               e.pos, hint=f"write integral(..., {e.var} < {tm})")
            if e.upper != tm:
                raise self.err(CausalitySpecError, f"the upper limit '{e.upper}' is not the time '{tm}'", e.pos,
                               hint=f"write {e.var} < {tm}")
            if cmp in (">", ">="):
                raise self.err(CausalitySpecError, f"sum over {e.var} {cmp} {tm} uses the future", e.pos,
                               hint=f"fields at {tm} depend on earlier times only: {e.var} < {tm}")
            if cmp == "<=" and isinstance(e, ast.Integral):
                raise self.err(CausalitySpecError, f"integral over {e.var} <= {tm} is not strictly causal", e.pos,
                               hint=f"integrals are strictly causal: use {e.var} < {tm}; a same-time term "
                                    f"(discrete-time response) is written sum({e.var} <= {tm}: ...)")
            if e.var in self.symbols or e.var == tm:
                raise self.err(NameSpecError, f"summation variable '{e.var}' clashes with an existing name", e.pos,
                               hint="use a fresh name such as s")
            rec(e.body, times=times | {e.var}, sum_var=e.var, sum_cmp=cmp)
            return
        if isinstance(e, ast.LayerSum):
            if ctx != "scalar":
                raise self.err(StructureSpecError, "sums over layers appear only in definitions of scalar order "
                               "parameters", e.pos)
            if (e.var in self.symbols and e.var != self.layer_var) or e.var in layers:
                raise self.err(NameSpecError, f"layer-sum variable '{e.var}' clashes with an existing name", e.pos,
                               hint=f"use the layer index '{self.layer_var}' or a fresh name")
            self._layer_locals = {e.var}
            try:
                lo, hi = self.ref(e.lo, e.pos), self.ref(e.hi, e.pos)
            finally:
                self._layer_locals = ()
            for r in (lo, hi):
                if r.var is not None and r.var != self.depth:
                    raise self.err(ShapeSpecError, f"layer-sum limits are numbers or '{self.depth}'-relative, got "
                                   f"'{r.text()}'", e.pos)
            rec(e.body, layers={**layers, e.var: (lo, hi)})
            return
        if isinstance(e, ast.Expectation):
            if e.log or ctx != "scalar":
                raise self.err(StructureSpecError, "averages E[...] define order parameters; they cannot appear "
                               "here" if ctx != "scalar" else "log E[...] is not used in deep specs", e.pos,
                               hint="use the order parameter instead")
            rec(e.body, ctx="average", in_avg=True)
            return
        if isinstance(e, ast.Response):
            raise self.err(StructureSpecError, "a response average E[d ... / d ...] must be the whole right side of "
                           "a response definition", e.pos, hint="define it as A[l](t, s) = E[d ... / d ...]")
        if isinstance(e, (ast.Hat, ast.IndexSum, ast.Matrix)):
            raise self.err(StructureSpecError, "this construct is not used in deep specs", e.pos)
        raise AssertionError(type(e))  # pragma: no cover

    def call(self, e, rec, *, ctx, times, layers, sum_var, sum_cmp, same_layer, owner, in_avg):
        tm = self.spec.time.var
        sym = self.lookup(e.name, e.pos, extra=times)
        if sym.kind in ("activation", "builtin"):
            check_function_call(self.err, e, rec)
            return
        if sym.kind in ("param", "time", "layer"):
            raise self.err(ShapeSpecError, f"'{e.name}' is {kind_phrase(sym)}, not a function", e.pos,
                           hint=f"write {e.name} * (...) for a product" if sym.kind == "param" else None)
        if ctx == "boundary":
            raise self.err(StructureSpecError, "boundary values are constants (numbers and parameters)", e.pos)
        # ---- arity: layer index and number of times
        two = sym.kind in ("family", "response", "coefficient")
        if sym.indices and len(e.indices) != 1:
            raise self.err(ShapeSpecError, f"{kind_phrase(sym)} '{e.name}' needs one layer index, got {len(e.indices)}",
                           e.pos, hint=f"write {self.usage(sym)}")
        if not sym.indices and e.indices:
            raise self.err(ShapeSpecError, f"{kind_phrase(sym)} '{e.name}' has no layer index", e.pos,
                           hint=f"write {self.usage(sym)}")
        if len(e.args) != (2 if two else 1):
            raise self.err(ShapeSpecError, f"{kind_phrase(sym)} '{e.name}' takes {2 if two else 1} time argument"
                           f"{'s' if two else ''}, got {len(e.args)}", e.pos, hint=f"write {self.usage(sym)}")
        targs = []
        for a in e.args:
            if isinstance(a, ast.Name) and a.name in times:
                targs.append(a.name)
            elif isinstance(a, ast.Num) and a.value == 0 and ctx == "average" and in_avg:
                targs.append("0")
            else:
                raise self.err(SpecError, "time arguments are time variables in scope"
                               + (" (or 0 inside an average)" if in_avg else ""), a.pos,
                               hint=f"time variables in scope: {', '.join(sorted(times))}")
        ref = None
        if e.indices:
            ref = self.ref(e.indices[0], e.pos)
            if ref.var is not None and ref.var != self.depth and ref.var not in layers:
                raise self.err(ShapeSpecError, f"the layer index '{ref.var}' is not in scope here", e.pos,
                               hint=f"use a number, '{self.depth}', or sum(l = 0..{self.depth}: ...)")
        # ---- per context
        kind = sym.kind
        if kind == "coefficient1":
            if ctx not in ("field", "average"):
                raise self.err(StructureSpecError, f"the one-time coefficient '{e.name}' is read in field equations "
                               "and averages only", e.pos,
                               hint=f"write it in the field equations, e.g. {e.name}({tm}) * ...")
            return
        if kind == "coefficient" and ctx != "field":
            raise self.err(StructureSpecError, f"the time coefficient '{e.name}' is read in field equations only",
                           e.pos, hint=f"write sum(s < {tm}: {e.name}({tm}, s) ...) in a field equation")
        if ctx == "field":
            if kind == "source":
                if ref != LayerRef(self.layer_var, 0):
                    raise self.err(StructureSpecError, f"a field of layer {self.layer_var} uses the source of its own "
                                   "layer", e.pos, hint=f"write {e.name}[{self.layer_var}]({tm})")
                if sum_var is not None or targs[0] != tm:
                    raise self.err(CausalitySpecError, f"the source '{e.name}' enters at the current time only",
                                   e.pos, hint=f"write {e.name}[{self.layer_var}]({tm}) outside sums")
                return
            if kind == "field":
                if ref != LayerRef(self.layer_var, 0):
                    raise self.err(StructureSpecError, "layers are coupled only through order parameters", e.pos,
                                   hint=f"use fields of the same layer, {e.name}[{self.layer_var}]")
                if sum_var is not None and targs[0] == tm:
                    raise self.err(CausalitySpecError, f"inside a sum over {sum_var}, fields are taken at {sum_var}",
                                   e.pos, hint=f"write {e.name}[{self.layer_var}]({sum_var})")
                return
            if sum_var is None:
                raise self.err(CausalitySpecError, f"{kind_phrase(sym)} '{e.name}' enters field equations only through "
                               "causal sums", e.pos, hint=f"write integral(... {self.usage(sym, 's')} ..., s < {tm})")
            if kind == "order" and targs != [sum_var]:
                raise self.err(CausalitySpecError, f"inside a sum over {sum_var}, '{e.name}' is taken at {sum_var}",
                               e.pos, hint=f"write {e.name}({sum_var})")
            if two and targs != [tm, sum_var]:
                raise self.err(CausalitySpecError, f"a kernel in a field equation is taken at ({tm}, {sum_var})",
                               e.pos, hint=f"write {e.name}[...]({tm}, {sum_var})")
            if two and kind != "coefficient":
                self.check_range(e.name, ref, e.pos, layers)
            return
        if ctx == "average":
            if kind in ("family", "response", "order"):
                raise self.err(StructureSpecError, f"{kind_phrase(sym)} '{e.name}' inside an average", e.pos,
                               hint="averages are over fields and sources of the single-site process")
            if same_layer and ref != LayerRef(self.layer_var, 0):
                raise self.err(StructureSpecError, "the average defining a layer family uses fields of the same "
                               "layer", e.pos, hint=f"write {e.name}[{self.layer_var}](...)")
            if not same_layer and (ref.var is not None and ref.var != self.depth):
                raise self.err(StructureSpecError, "averages in scalar order parameters use fixed layers", e.pos,
                               hint=f"write e.g. {e.name}[{self.depth}](...)")
            if not same_layer:
                self.check_field_layer(e.name, ref, e.pos)
            return
        # ctx == "scalar"
        if kind in ("field", "source"):
            raise self.err(StructureSpecError, f"{kind_phrase(sym)} '{e.name}' outside an average", e.pos,
                           hint=f"write E[... {e.name}[...]({tm}) ...]")
        if kind == "order":
            if e.name == owner:
                raise self.err(StructureSpecError, f"'{owner}' is defined in terms of itself", e.pos)
            if targs != [tm]:
                raise self.err(CausalitySpecError, f"'{e.name}' is taken at the current time here", e.pos)
            return
        if two:
            if targs != [tm, tm]:
                raise self.err(SpecError, f"scalar order parameters use kernels at equal times, {e.name}[...]({tm}, "
                               f"{tm})", e.pos)
            self.check_range(e.name, ref, e.pos, layers)

    def check_field_layer(self, name, ref, pos):
        if (ref.var is None and ref.offset < 1) or (ref.var == self.depth and ref.offset > 0):
            raise self.err(ShapeSpecError, f"field '{name}' exists for layers 1..{self.depth} only, not "
                           f"{name}[{ref.text()}]", pos)

    def usage(self, sym, second="s"):
        tm = self.spec.time.var
        if sym.kind in ("family", "response"):
            return f"{sym.name}[{self.layer_var}]({tm}, {second})"
        if sym.kind == "coefficient":
            return f"{sym.name}({tm}, {second})"
        if sym.kind == "coefficient1":
            return f"{sym.name}({tm})"
        if sym.indices:
            return f"{sym.name}[{self.layer_var}]({tm})"
        return f"{sym.name}({tm})"


def kind_phrase(sym) -> str:
    """'an order parameter', 'the layer index', ...: what a symbol of a deep spec is, in words."""
    words = {"param": "a parameter", "time": "the time variable", "layer": "the layer index",
             "activation": "an activation", "builtin": "a built-in function", "order": "an order parameter",
             "family": "an order parameter", "response": "a response function", "source": "a source",
             "field": "a field", "local": "a local name", "index": "an index",
             "coefficient": "a time coefficient", "coefficient1": "a one-time coefficient"}
    return words.get(sym.kind, sym.kind) if sym is not None else "undefined"
