"""Stage 2: semantic checks on the syntax tree.

Resolves every name, checks index and argument arity, rejects duplicate
definitions and non-causal field equations, and returns a :class:`Model`: the
same declarations with a symbol table, ready for symbolic derivation.  Every
problem is a located :class:`SpecError` with a hint.
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from dmftc.frontend import ast
from dmftc.frontend.recurrence import Recurrence, plan_recurrences, time_offset
from dmftc.frontend.names import (DEEP_HINT, KIND_WORDS, BUILTIN_FUNCTIONS, DEFAULT_FUNCTIONS, RESERVED, SOLVE_OPTIONS,
                                  Symbol, check_function_call, kind_word, suggest)
from dmftc.errors import CausalitySpecError, NameSpecError, Pos, ShapeSpecError, SpecError, StructureSpecError

@dataclass(frozen=True)
class Model:
    """A checked specification: declarations plus their symbol table."""

    spec: ast.Spec
    symbols: dict[str, Symbol]
    time_var: str
    index_size: dict[str, str]           # index name -> size parameter name
    field_order: tuple[str, ...]          # fields in dependency order
    recurrences: tuple[Recurrence, ...] = ()   # the fields in recurrence form (dmftc.frontend.recurrence)

    @property
    def name(self) -> str:
        return self.spec.model.name


class Checker:
    def declare_time(self):
        """The time variable, its number of steps and its step size (two-layer and deep specs alike)."""
        tm = self.spec.time
        self.declare("time", tm.var, (), tm.pos)
        self.declare("param", tm.steps_name, (), tm.pos)
        self.declare("param", tm.step_name, (), tm.pos)
        if tm.steps <= 0:
            raise self.err(SpecError, "the number of time steps must be positive",
                           self.find_pos(r"=\s*(\d+)\s+steps", tm.pos, group=1))

    def __init__(self, spec: ast.Spec):
        self.spec = spec
        self.symbols: dict[str, Symbol] = {}
        self.index_size: dict[str, str] = {}
        self.visible: set[str] | None = None  # parameters a default may use (declaration order)
        self.recurrent = {i.name for i in spec.initials}   # fields in recurrence form
        self.current = None                   # the field whose equation is being checked
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", spec.source)]  # lines as Lark counts them

    def err(self, cls, msg, pos, hint=None):
        return cls(msg, pos, hint=hint, source=self.spec.source, filename=self.spec.filename)

    def word_pos(self, word, pos, after=None):
        """Where the whole word ``word`` first occurs in the span ``pos`` (past ``after``); else ``pos``."""
        return self.find_pos(rf"(?<![A-Za-z_0-9]){re.escape(word)}(?![A-Za-z_0-9])", pos, after)

    def find_pos(self, pattern, pos, after=None, group=0):
        """Where the regex ``pattern`` (or its ``group``) first matches in the span ``pos``; else ``pos``."""
        if pos is None:
            return pos
        starts, src = self._line_starts, self.spec.source
        offset = lambda line, col: starts[min(line, len(starts)) - 1] + col - 1
        a = offset(after.end_line, after.end_col) if after is not None and after.end_line else offset(pos.line, pos.col)
        b = offset(pos.end_line, pos.end_col) if pos.end_line and pos.end_col else len(src)
        m = re.compile(pattern).search(src, a, b)
        if m is None:
            return pos
        line = bisect.bisect_right(starts, m.start(group))
        col = m.start(group) - starts[line - 1] + 1
        end_line = bisect.bisect_right(starts, m.end(group))
        return Pos(line, col, end_line, m.end(group) - starts[end_line - 1] + 1)

    # ------------------------------------------------------------ declarations
    def declare(self, kind, name, indices, pos):
        pos = self.word_pos(name, pos)
        if name in self.symbols:
            prev = self.symbols[name]
            where = f" at line {prev.pos.line}" if prev.pos else ""
            raise self.err(NameSpecError, f"'{name}' is already defined as {KIND_WORDS[prev.kind]}{where}", pos,
                           hint="every name (parameter, index, order parameter, source, field) must be unique")
        if name in RESERVED:
            raise self.err(NameSpecError, f"'{name}' is a built-in name and cannot be redefined", pos,
                           hint="choose another name")
        if kind == "param" and name in SOLVE_OPTIONS:
            raise self.err(NameSpecError, f"'{name}' is an option of solve and cannot name a parameter (solve(...) "
                           "and dmftc run would take it as the option)", pos, hint="choose another name")
        self.symbols[name] = Symbol(kind, name, tuple(indices), pos)

    def run(self) -> Model:
        s = self.spec
        if s.time is None:
            raise self.err(StructureSpecError, "the spec declares no time grid", s.model.pos,
                           hint="add a line such as 'time t: T = 100 steps of eta = 0.02'")
        for p in s.params:
            self.declare("param", p.name, p.dims, p.pos)
        tm = s.time
        self.declare_time()
        index_size: dict[str, str] = {}
        for ix in s.indices:
            if ix.start != 1:
                raise self.err(SpecError, "index ranges start at 1", self.word_pos(str(ix.start), ix.pos),
                               hint=f"write 'in 1..{ix.size}'")
            size = self.symbols.get(ix.size)
            if size is None or size.kind != "param" or size.indices:
                raise self.err(NameSpecError, f"index range size '{ix.size}' is not a scalar parameter",
                               self.word_pos(ix.size, ix.pos),
                               hint=suggest(ix.size, [n for n, v in self.symbols.items() if v.kind == "param"])
                               or f"declare it first, e.g. 'param {ix.size} = 4'")
            for n in ix.names:
                self.declare("index", n, (), ix.pos)
                index_size[n] = ix.size
        self.index_size = index_size
        for p in s.params:
            for d in p.dims:
                sym = self.symbols.get(d)
                if sym is None or sym.kind != "param":
                    raise self.err(NameSpecError, f"dimension '{d}' of parameter '{p.name}' is not a parameter",
                                   self.word_pos(d, p.pos, after=self.word_pos(p.name, p.pos)),
                                   hint=suggest(d, [k for k, v in self.symbols.items() if v.kind == "param"])
                                   or f"declare the size first, e.g. 'param {d} = 4'")
        for a in s.activations:
            self.declare("activation", a.name, (), a.pos)
        for o in s.orders:
            if o.time2 is not None:
                raise self.err(StructureSpecError, f"two-time order parameter '{o.name}' in a spec without layers",
                               self.word_pos(o.time2, o.pos, after=self.word_pos(o.name, o.pos)), hint=DEEP_HINT)
            self.check_index_names(o.indices, o.pos)
            if o.time != tm.var:
                raise self.err(NameSpecError, f"order parameter '{o.name}' must depend on the time variable '{tm.var}'",
                               o.pos, hint=f"write {o.name}({tm.var})")
            self.declare("order", o.name, o.indices, o.pos)
        for src in s.sources:
            if src.kind != "normal":
                raise self.err(StructureSpecError, "Gaussian-process sources (~ gp) need a layered spec",
                               self.word_pos("gp", src.pos), hint=DEEP_HINT + "; otherwise use ~ normal(0, cov)")
            for tgt in src.targets:
                self.check_index_names(tgt.indices, tgt.pos)
                self.declare("source", tgt.name, tgt.indices, tgt.pos)
        for f in s.fields:
            if f.time2 is not None:
                raise self.err(StructureSpecError, f"'{f.name}' has two time arguments in a spec without layers",
                               self.word_pos(f.time2, f.pos, after=self.word_pos(f.name, f.pos)), hint=DEEP_HINT)
            self.check_index_names(f.indices, f.pos)
            if f.time != tm.var:
                raise self.err(NameSpecError, f"field '{f.name}' must be defined at the time variable '{tm.var}'",
                               f.pos, hint=f"write {f.name}({tm.var}) = ...")
            self.declare("field", f.name, f.indices, f.pos)
        if not s.orders:
            raise self.err(StructureSpecError, "the spec declares no order parameters", s.model.pos,
                           hint="add a line such as 'order Delta(t), K(t)'")
        if not s.actions:
            raise self.err(StructureSpecError, "the spec has no action", s.model.pos,
                           hint="add an 'action:' section")
        # ------------------------------------------------------------ bodies
        params = [p.name for p in s.params]
        for n, p in enumerate(s.params):  # defaults are evaluated in declaration order, the time grid last
            self.visible = set(params[:n])
            self.expr(p.default, ctx="default", bound=set())
        self.visible = set(params) | {tm.steps_name}
        self.expr(tm.step, ctx="default", bound=set())
        self.visible = None
        for a in s.activations:
            self.expr(a.body, ctx="activation", bound=set(), locals_={a.arg})
        self.activation_cycles()
        for src in s.sources:
            self.expr(src.mean, ctx="default", bound=set())
            self.expr(src.cov, ctx="default", bound=set())
            if not (isinstance(src.mean, ast.Num) and src.mean.value == 0):
                raise self.err(StructureSpecError, "Gaussian sources must have mean 0", src.mean.pos,
                               hint="write normal(0, covariance)")
        for f in s.fields:
            self.current = f.name
            self.expr(f.body, ctx="field", bound=set(f.indices), time=tm.var)
        self.current = None
        recurrences = plan_recurrences(self)
        for act in s.actions:
            self.expr(act.body, ctx="action", bound=set())
        logs = [e for act in s.actions for e in ast.walk(act.body) if isinstance(e, ast.Expectation)]
        if len(logs) > 1:
            raise self.err(StructureSpecError, "the action may contain only one log E[...] term", logs[1].pos,
                           hint="put all observables inside a single exponent")
        for act in s.actions:
            self.linear_in_hats(act.body)
        order = self.field_dependencies()
        return Model(s, dict(self.symbols), tm.var, index_size, order, recurrences)

    def check_index_names(self, indices, pos):
        for i in indices:
            if i not in self.index_size:
                raise self.err(NameSpecError, f"'{i}' is not a declared index", self.word_pos(i, pos),
                               hint=suggest(i, self.index_size) or f"declare it with 'index {i} in 1..P'")
        if len(set(indices)) != len(indices):
            raise self.err(ShapeSpecError, "repeated index in a declaration", pos,
                           hint="use distinct index names, e.g. K[mu, nu]")

    # ------------------------------------------------------------ expressions
    def lookup(self, name, pos, locals_=frozenset(), extra=()):
        if name in locals_:
            return Symbol("local", name, (), None)
        sym = self.symbols.get(name)
        if sym is None:
            if name in BUILTIN_FUNCTIONS:
                return Symbol("builtin", name, (), None)
            if name == "pi":
                return Symbol("param", "pi", (), None)
            if name in DEFAULT_FUNCTIONS:
                raise self.err(NameSpecError, f"'{name}' can only be used in parameter values", pos,
                               hint="inside equations use " + ", ".join(sorted(BUILTIN_FUNCTIONS)))
            cands = set(self.symbols) | set(locals_) | set(BUILTIN_FUNCTIONS) | set(extra)
            raise self.err(NameSpecError, f"undefined name '{name}'", pos, hint=suggest(name, cands)
                           or "declare it as a param, order parameter, source or field")
        return sym

    def expr(self, e, *, ctx, bound, time=None, locals_=frozenset(), integral_var=None, in_log=False):
        rec = lambda x, **kw: self.expr(x, **({"ctx": ctx, "bound": bound, "time": time, "locals_": locals_,
                                               "integral_var": integral_var, "in_log": in_log} | kw))
        if isinstance(e, ast.Num):
            return
        if isinstance(e, ast.Name):
            if ctx in ("field", "action") and e.name in (time, integral_var) and e.name is not None:
                return                    # the step number (0, 1, ..., T - 1) at which the expression is evaluated
            if ctx in ("field", "action") and e.name == self.spec.time.var:
                inside = f" inside an integral over {integral_var}" if integral_var else ""
                raise self.err(SpecError, f"the time variable '{e.name}' cannot be used as a value here{inside}",
                               e.pos, hint=f"an integrand is evaluated at {integral_var}: it reads {integral_var}, "
                                           "not t; write a geometric kernel such as momentum as a recurrence, "
                                           "v(t) = beta * v(t - 1) + ...; v(-1) = 0" if integral_var else
                               "in the action, time enters only inside integral(..., t)")
            sym = self.lookup(e.name, e.pos, locals_)
            if sym.kind == "time":
                raise self.err(SpecError, f"the time variable '{e.name}' cannot be used as a value", e.pos,
                               hint="time enters only through integrals and time arguments")
            if sym.kind in ("order", "field"):
                raise self.err(ShapeSpecError, f"{kind_word(sym)} '{e.name}' needs a time argument", e.pos,
                               hint=f"write {e.name}{self._idx_text(sym.indices)}({time or self.spec.time.var})")
            if sym.kind in ("activation", "builtin"):
                raise self.err(ShapeSpecError, f"function '{e.name}' needs an argument", e.pos,
                               hint=f"write {e.name}(x)")
            if sym.kind == "index":
                raise self.err(SpecError, f"index '{e.name}' cannot be used as a value", e.pos)
            if sym.kind in ("param", "source") and sym.indices and ctx != "default":
                raise self.err(ShapeSpecError, f"'{e.name}' has {len(sym.indices)} index(es) but none were given",
                               e.pos, hint=f"write {self._usage(sym)}")
            if ctx == "default" and sym.kind not in ("param", "local"):
                raise self.err(SpecError, f"'{e.name}' cannot be used in a parameter value", e.pos)
            if ctx == "default" and self.visible is not None and e.name in self.symbols and e.name not in self.visible:
                raise self.err(NameSpecError, f"parameter '{e.name}' is used before it has a value", e.pos,
                               hint="defaults are computed in declaration order (the time grid last); "
                                    "a default may use only the parameters declared above it")
            self._source_use(sym, e.pos, ctx, in_log, integral_var)
            return
        if isinstance(e, ast.Indexed):
            if e.name == "eye" and e.name not in self.symbols:
                return self._kronecker(e, ctx, bound)
            sym = self.lookup(e.name, e.pos, locals_)
            if sym.kind == "param" and sym.indices == (self.spec.time.steps_name,) and ctx != "default":
                return self._per_step(e, time, integral_var)
            self._check_indices(sym, e.indices, e.pos, bound)
            if sym.kind in ("order", "field"):
                raise self.err(ShapeSpecError, f"{kind_word(sym)} '{e.name}' needs a time argument", e.pos,
                               hint=f"write {e.name}{self._idx_text(e.indices)}({time or self.spec.time.var})")
            self._source_use(sym, e.pos, ctx, in_log, integral_var)
            return
        if isinstance(e, ast.Call):
            if ctx == "default":
                if e.name not in DEFAULT_FUNCTIONS or e.indices:
                    raise self.err(SpecError, f"'{e.name}' cannot be used in a parameter value", e.pos,
                                   hint=f"available: {', '.join(sorted(DEFAULT_FUNCTIONS))}")
                if len(e.args) != 1:
                    raise self.err(ShapeSpecError, f"'{e.name}' takes 1 argument, got {len(e.args)}", e.pos)
                rec(e.args[0])
                return
            sym = self.lookup(e.name, e.pos, locals_)
            if sym.kind in ("order", "field"):
                if ctx == "activation":
                    raise self.err(StructureSpecError, f"an activation cannot depend on the {kind_word(sym)} '{e.name}'",
                                   e.pos, hint="an activation is a function of its argument and parameters only")
                self._check_indices(sym, e.indices, e.pos, bound)
                k = time_offset(e.args[0], time) if ctx == "field" and time is not None and len(e.args) == 1 \
                    else None               # t + k in a field equation: checked with the recurrences
                shifted = k is not None and (k != 0 or self.current in self.recurrent)
                if not shifted and (len(e.args) != 1 or not isinstance(e.args[0], ast.Name)):
                    raise self.err(ShapeSpecError, f"{kind_word(sym)} '{e.name}' takes one time argument", e.pos,
                                   hint=f"write {e.name}(t) or, inside an integral, {e.name}(s); a field in "
                                        "recurrence form (with an initial value) also reads t - 1")
                if shifted:             # the offsets are checked with the recurrences (dmftc.frontend.recurrence)
                    return
                tv = e.args[0].name
                allowed = {x for x in (time, integral_var) if x}
                if tv not in allowed:
                    raise self.err(SpecError, f"'{tv}' is not a time variable in scope here", e.args[0].pos,
                                   hint=f"time variables in scope: {', '.join(sorted(allowed))}" if allowed
                                   else f"in the action, time enters only inside integral(..., {self.spec.time.var})")
                if sym.kind == "order" and ctx == "field" and tv != integral_var and self.current not in self.recurrent:
                    raise self.err(CausalitySpecError,
                                   f"order parameter '{e.name}' enters field equations only through causal integrals",
                                   e.pos, hint=f"write integral({e.name}(s) ..., s < {time})")
                if sym.kind == "field" and ctx == "action" and not in_log:
                    raise self.err(StructureSpecError, f"field '{e.name}' used outside the single-site average",
                                   e.pos, hint="fields appear only inside log E[exp(-integral(...))]")
                if sym.kind == "order" and ctx == "action" and in_log:
                    raise self.err(StructureSpecError,
                                   f"order parameter '{e.name}' inside the single-site average", e.pos,
                                   hint="observables in log E[...] depend on fields and parameters only")
                return
            if sym.kind in ("activation", "builtin"):
                check_function_call(self.err, e, rec)
                return
            raise self.err(ShapeSpecError, f"'{e.name}' is a {kind_word(sym)}, not a function", e.pos,
                           hint=f"write {e.name} * (...) for a product" if sym.kind == "param" else None)
        if isinstance(e, ast.PrimeCall):
            if ctx == "default":
                raise self.err(SpecError, f"'{e.name}'' cannot be used in a parameter value", e.pos,
                               hint=f"available: {', '.join(sorted(DEFAULT_FUNCTIONS))}")
            sym = self.lookup(e.name, e.pos, locals_)
            if sym.kind not in ("activation", "builtin") or BUILTIN_FUNCTIONS.get(e.name, 1) != 1:
                raise self.err(SpecError, f"'{e.name}' is not an activation; only activations have derivatives",
                               e.pos, hint=suggest(e.name, [a.name for a in self.spec.activations]))
            if len(e.args) != 1:
                raise self.err(ShapeSpecError, f"{e.name}' takes one argument", e.pos)
            rec(e.args[0])
            return
        if isinstance(e, ast.Hat):
            sym = self.lookup(e.name, e.pos, locals_)
            if ctx != "action":
                raise self.err(StructureSpecError, "dual variables (hat ...) appear only in the action", e.pos)
            if e.time2 is not None:
                raise self.err(ShapeSpecError, f"'hat {e.name}' has two time arguments; two-time kernels and their "
                               "duals belong to deep specs", e.pos, hint=f"write hat {e.name}({e.time})")
            if sym.kind != "order":
                orders = [o.name for o in self.spec.orders]
                raise self.err(NameSpecError, f"'hat {e.name}': '{e.name}' is not an order parameter", e.pos,
                               hint=suggest(e.name, orders) or f"order parameters: {', '.join(orders)}")
            self._check_indices(sym, e.indices, e.pos, bound)
            if time is None:
                raise self.err(StructureSpecError, f"'hat {e.name}' outside an integral over time", e.pos,
                               hint=f"write integral(hat {e.name}{self._idx_text(e.indices)}({e.time}) ..., "
                                    f"{self.spec.time.var})")
            if e.time != time:
                raise self.err(SpecError, f"dual 'hat {e.name}' must be taken at the outer time '{time}'", e.pos)
            return
        if isinstance(e, ast.BinOp):
            rec(e.left)
            rec(e.right)
            return
        if isinstance(e, ast.Neg):
            rec(e.operand)
            return
        if isinstance(e, ast.IndexSum):
            if ctx == "default":
                raise self.err(SpecError, "sum(...) cannot be used in a parameter value", e.pos)
            for i in e.indices:
                if i not in self.index_size:
                    raise self.err(NameSpecError, f"'{i}' is not a declared index", self.word_pos(i, e.pos),
                                   hint=suggest(i, self.index_size) or f"declare it with 'index {i} in 1..P'")
                if i in bound:
                    raise self.err(SpecError, f"index '{i}' is already bound here", e.pos,
                                   hint="use a different index name for the inner sum")
            rec(e.body, bound=bound | set(e.indices))
            return
        if isinstance(e, ast.Integral):
            return self._integral(e, ctx, bound, time, locals_, integral_var, in_log)
        if isinstance(e, ast.Expectation):
            if ctx != "action" or not e.log:
                raise self.err(StructureSpecError, "E[...] appears only as 'log E[exp(-integral(...))]' in the action",
                               e.pos)
            body = e.body
            if not (isinstance(body, ast.Call) and body.name == "exp" and len(body.args) == 1):
                raise self.err(StructureSpecError, "expected exp(...) inside log E[...]",
                               self.find_pos(r"E\s*\[\s*(\S)", e.pos, group=1),
                               hint="write log E[exp(-integral(hat K(t) * observable, t))]")
            rec(body.args[0], in_log=True)
            return
        if isinstance(e, ast.Matrix):
            for r in e.rows:
                rec(r)
            return
        if isinstance(e, (ast.TimeSum, ast.LayerSum, ast.Response)):
            what = {ast.TimeSum: "sum over earlier times", ast.LayerSum: "sum over layers",
                    ast.Response: "response average E[d ... / d ...]"}[type(e)]
            raise self.err(StructureSpecError, f"a {what} is only available in deep specs", e.pos, hint=DEEP_HINT)
        raise AssertionError(type(e))  # pragma: no cover

    def _integral(self, e, ctx, bound, time, locals_, integral_var, in_log):
        tv = self.spec.time.var
        if e.cmp is None:
            if ctx != "action" or time is not None:
                raise self.err(SpecError, f"'integral(..., {e.var})' over all times is only allowed at the top of "
                               "the action", e.pos, hint=f"inside, write a causal integral: integral(..., s < {tv})")
            if e.var != tv:
                raise self.err(SpecError, f"the action integrates over the time variable '{tv}', not '{e.var}'",
                               e.pos, hint=f"write integral(..., {tv})")
            return self.expr(e.body, ctx=ctx, bound=bound, time=tv, locals_=locals_, in_log=in_log)
        if integral_var is not None:
            raise self.err(StructureSpecError, "nested causal integrals are not supported yet", e.pos,
                           hint="introduce an intermediate field for the inner integral")
        if time is None:
            raise self.err(SpecError, "a causal integral needs an enclosing time", e.pos,
                           hint=f"in the action, causal integrals appear inside integral(..., {tv})")
        if e.upper != time:
            raise self.err(CausalitySpecError, f"the integral's upper limit '{e.upper}' is not the time '{time}'",
                           e.pos, hint=f"write integral(..., {e.var} < {time})")
        if e.cmp != "<":
            raise self.err(CausalitySpecError, f"integral over {e.var} {e.cmp} {e.upper} is not strictly causal",
                           e.pos, hint=f"integrals must be strictly causal: use {e.var} < {e.upper}")
        if e.var in self.symbols or e.var == time:
            raise self.err(NameSpecError, f"integration variable '{e.var}' clashes with an existing name", e.pos,
                           hint="use a fresh name such as s")
        if in_log:
            raise self.err(StructureSpecError, "causal integrals inside the single-site average are not supported",
                           e.pos, hint="define a field with the integral and use the field in the observable")
        self.expr(e.body, ctx=ctx, bound=bound, time=None, locals_=locals_, integral_var=e.var, in_log=in_log)

    def _kronecker(self, e, ctx, bound):
        """eye[c, d]: the Kronecker delta of two indices of one range (1 if c = d, else 0)."""
        if ctx == "default":
            raise self.err(SpecError, "eye[...] with indices is the Kronecker delta of equations", e.pos,
                           hint="in a parameter value write the matrix eye(P)")
        if len(e.indices) != 2:
            raise self.err(ShapeSpecError, f"eye[...] takes two indices, got {len(e.indices)}", e.pos,
                           hint="write eye[c, d] for the Kronecker delta of the indices c and d")
        sym = Symbol("param", "eye", tuple(e.indices), None)
        self._check_indices(sym, e.indices, e.pos, bound)
        a, b = e.indices
        if self.index_size[a] != self.index_size[b]:
            raise self.err(ShapeSpecError, f"eye[{a}, {b}]: '{a}' runs over 1..{self.index_size[a]} and '{b}' over "
                           f"1..{self.index_size[b]}", e.pos, hint="a Kronecker delta compares two indices of one "
                                                                  "range")

    def _per_step(self, e, time, integral_var):
        """A per-step parameter ``lr[T]`` read at a time in scope, possibly shifted: lr[t], lr[t - 1], lr[s]."""
        scope = [x for x in (time, integral_var) if x]
        (i,) = e.indices if len(e.indices) == 1 else (None,)
        base = (i or "").split("+")[0].split("-")[0]
        if base not in scope:
            raise self.err(SpecError, f"'{e.name}' has one value per step: read it at a time in scope, "
                           f"e.g. {e.name}[{scope[0] if scope else self.spec.time.var}]", e.pos,
                           hint=f"time variables in scope: {', '.join(scope)}" if scope else
                           f"in the action, time enters only inside integral(..., {self.spec.time.var})")
        if "+" in i and base == time:
            raise self.err(CausalitySpecError, f"'{e.name}[{i}]' reads a later step", e.pos)

    def _source_use(self, sym, pos, ctx, in_log, integral_var=None):
        """Sources are random: they belong in field equations and the single-site average only."""
        if sym.kind != "source":
            return
        if integral_var is not None and ctx == "field":
            raise self.err(StructureSpecError, f"the source '{sym.name}' cannot be integrated over time directly",
                           pos, hint=f"integrands use fields and order parameters at time {integral_var}: define a "
                                     f"field such as {sym.name}_f(t) = {sym.name}{self._idx_text(sym.indices)} "
                                     f"and integrate that")
        if ctx == "activation":
            raise self.err(StructureSpecError, f"an activation cannot depend on the source '{sym.name}'", pos,
                           hint="an activation is a function of its argument and parameters only")
        if ctx == "action" and not in_log:
            raise self.err(StructureSpecError, f"source '{sym.name}' used outside the single-site average", pos,
                           hint="sources appear only in field equations and inside log E[exp(-integral(...))]")

    def _check_indices(self, sym, indices, pos, bound):
        if sym.kind in ("activation", "builtin", "local", "index", "time"):
            raise self.err(ShapeSpecError, f"'{sym.name}' takes no indices", pos)
        if len(indices) != len(sym.indices):
            raise self.err(ShapeSpecError, f"'{sym.name}' has {len(sym.indices)} index(es), got {len(indices)}", pos,
                           hint=f"write {self._usage(sym)}" if sym.indices else f"'{sym.name}' is not indexed")
        for i in indices:
            if i not in self.index_size:
                raise self.err(NameSpecError, f"'{i}' is not a declared index", self.word_pos(i, pos),
                               hint=suggest(i, self.index_size) or f"declare it with 'index {i} in 1..P'")
            if i not in bound:
                raise self.err(SpecError, f"index '{i}' is not bound here", self.word_pos(i, pos),
                               hint=f"sum over it with sum({i}: ...) or use an index of the equation's left side")
        if len(set(indices)) != len(indices):
            raise self.err(ShapeSpecError, f"repeated index in {sym.name}[{', '.join(indices)}] is not supported",
                           pos, hint="diagonal entries are not supported yet")
        if sym.kind == "param" and sym.indices:
            return

    @staticmethod
    def _idx_text(indices):
        return f"[{', '.join(indices)}]" if indices else ""

    def _usage(self, sym):
        """How to write ``sym`` with indices: a parameter 'y[P]' is used as y[mu] with 'index mu in 1..P'."""
        if sym.kind != "param":
            return f"{sym.name}{self._idx_text(sym.indices)}"
        names = []
        for d in sym.indices:
            i = next((i for i, size in self.index_size.items() if size == d and i not in names), None)
            if i is None:
                return f"{sym.name}[...] with an index declared as 'index ... in 1..{d}'"
            names.append(i)
        return f"{sym.name}{self._idx_text(names)}"

    # ------------------------------------------------------------ action structure
    def linear_in_hats(self, e):
        """The action must be linear in every dual variable: no products, powers or functions of hats."""
        if isinstance(e, ast.Expectation):  # checked to be log E[exp(...)]: look inside the exponent
            return self.linear_in_hats(e.body.args[0])
        hats = lambda x: [h for h in ast.walk(x) if isinstance(h, ast.Hat)]
        bad, how = [], ""
        if isinstance(e, ast.BinOp) and e.op == "*" and hats(e.left):
            bad, how = hats(e.right), "multiplied by another dual variable"
        elif isinstance(e, ast.BinOp) and e.op == "/":
            bad, how = hats(e.right), "in a denominator"
        elif isinstance(e, ast.BinOp) and e.op == "^":
            bad, how = hats(e), "raised to a power"
        elif isinstance(e, (ast.Call, ast.PrimeCall)):
            bad, how = hats(e), f"inside the function '{e.name}'"
        if bad:
            h = bad[0]
            raise self.err(StructureSpecError, f"the action is not linear in the dual variable 'hat {h.name}': "
                           f"it appears {how}", h.pos,
                           hint=f"each dual variable multiplies its constraint or observable once, as in "
                                f"hat {h.name}{self._idx_text(h.indices)}({h.time}) * (...)")
        for c in ast.children(e):
            self.linear_in_hats(c)

    def activation_cycles(self):
        """Reject activations defined in terms of themselves (directly or through other activations)."""
        acts = {a.name: a for a in self.spec.activations}
        calls = {n: sorted({x.name for x in ast.walk(a.body) if isinstance(x, (ast.Call, ast.PrimeCall))
                            and x.name in acts}) for n, a in acts.items()}
        state: dict[str, int] = {}

        def visit(n, chain):
            if state.get(n) == 2:
                return
            if state.get(n) == 1:
                cyc = " -> ".join(chain[chain.index(n):] + [n])
                raise self.err(StructureSpecError, f"activation '{n}' is defined in terms of itself: {cyc}",
                               self.word_pos(n, acts[n].pos), hint="write the body with built-in functions such "
                                                                   "as tanh, relu, erf, sigmoid")
            state[n] = 1
            for d in calls[n]:
                visit(d, chain + [n])
            state[n] = 2

        for n in acts:
            visit(n, [])

    # ------------------------------------------------------------ dependencies
    def field_dependencies(self) -> tuple[str, ...]:
        """Order fields so that same-time references come first; reject cycles."""
        deps: dict[str, dict[str, Pos]] = {}  # field -> same-time references (first position of each)
        fields = {f.name: f for f in self.spec.fields}
        for f in self.spec.fields:
            deps[f.name] = {}
            if f.name in self.recurrent:      # evaluated from the state (dmftc.frontend.recurrence)
                continue
            stack = [(f.body, False)]
            while stack:
                e, under = stack.pop()
                if isinstance(e, ast.Integral):
                    stack.append((e.body, True))
                    continue
                if isinstance(e, ast.Call) and e.name in fields and not under:
                    old = deps[f.name].get(e.name)
                    if old is None or (e.pos.line, e.pos.col) < (old.line, old.col):
                        deps[f.name][e.name] = e.pos
                for child in ast.children(e):
                    stack.append((child, under))
        done: list[str] = []
        state: dict[str, int] = {}

        def visit(n, chain):
            if state.get(n) == 2:
                return
            if state.get(n) == 1:
                cyc = chain[chain.index(n):] + [n]
                raise self.err(StructureSpecError, f"fields depend on each other at the same time: {' -> '.join(cyc)}",
                               deps[cyc[0]][cyc[1]], hint="break the cycle with a causal integral over s < t")
            state[n] = 1
            for d in sorted(deps[n]):
                visit(d, chain + [n])
            state[n] = 2
            done.append(n)

        for f in self.spec.fields:
            visit(f.name, [])
        return tuple(done)
