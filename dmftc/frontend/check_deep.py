"""Stage 2 for deep networks: semantic checks of a spec with a ``layers l = 1..L`` declaration.

A deep spec describes one hidden layer ``l`` of a network with ``L`` hidden layers; every layer has the
same single-site process, and layers are coupled only through order parameters of adjacent layers:

* layer families of two-time kernels, ``order Phi[l](t, s)``, with boundary values such as
  ``Phi[0](t, s) = 1`` and definitions as averages ``Phi[l](t, s) = E[phi(h[l](t)) phi(h[l](s))]``;
* response functions, defined by averages of derivatives, ``A[l](t, s) = E[d phi(h[l](t)) / d r[l](s)]``;
* Gaussian-process sources whose covariance is a family of an adjacent layer, ``u[l] ~ gp(0, Phi[l-1])``;
* per-layer fields with causal couplings: ``integral(x, s < t)`` (eta * sum, strictly causal) and
  ``sum(s < t: x)`` or ``sum(s <= t: x)`` (plain sums; ``s <= t`` only without a same-time cycle);
* scalar order parameters at one time: ``K(t) = sum(l = 0..L: ...)``, ``Delta(t) = y - E[...] / gamma``.

The checks (names, arity, layer ranges against boundaries, causality, source covariances, the depth
parameter) raise located :class:`SpecError` s; the result is a :class:`DeepModel`.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from dmftc.frontend import ast
from dmftc.frontend.action_deep import lower_deep_action
from dmftc.frontend.check_two_layer import Checker
from dmftc.frontend.coefficients_deep import is_coefficient, plan_coefficients
from dmftc.frontend.names import suggest
from dmftc.frontend.check_deep_expr import DeepExpressionChecks, LayerRef, kind_phrase
from dmftc.frontend.points_deep import fold_points
from dmftc.errors import CausalitySpecError, NameSpecError, ShapeSpecError, SpecError, StructureSpecError


@dataclass(frozen=True)
class GPSource:
    name: str
    cov_family: str
    offset: int                  # covariance family at layer l + offset (-1 or +1)
    decl: ast.SourceDecl


@dataclass(frozen=True)
class DeepModel:
    """A checked deep spec: classified declarations and equations."""

    spec: ast.Spec
    symbols: dict
    time_var: str
    layer_var: str
    depth: str                                      # the depth parameter (number of hidden layers)
    activation: ast.ActivationDecl
    scalars: tuple[str, ...]                        # one-time order parameters, declaration order
    families: tuple[str, ...]                       # two-time order-parameter families
    responses: tuple[str, ...]                      # response families, definition order
    sources: tuple[GPSource, ...]
    fields: tuple[ast.FieldDecl, ...]               # per-layer field equations, dependency order
    definitions: dict                               # family/response/scalar name -> its defining equation
    boundaries: dict                                # family/response name -> ((LayerRef, equation), ...)
    from_action: tuple = ()                         # the definitions derived from the spec's action, if any
    points: object = None                           # the point index (dmftc.frontend.points_deep.PointAxis)
    coefficients: tuple = ()                        # time coefficients (dmftc.frontend.coefficients_deep), in order

    @property
    def name(self) -> str:
        return self.spec.model.name

    def boundary(self, family: str, ref: LayerRef):
        return next((eq for r, eq in self.boundaries.get(family, ()) if r == ref), None)


_REF = re.compile(r"^(?:(?P<var>[A-Za-z_][A-Za-z_0-9]*)(?P<off>[+-][0-9]+)?|(?P<num>[0-9]+))$")


class _DeepChecker(DeepExpressionChecks, Checker):
    def run(self) -> DeepModel:  # noqa: C901 - one pass over the statement kinds
        s = self.spec
        if len(s.layers) > 1:
            raise self.err(SpecError, "a second 'layers' declaration", s.layers[1].pos,
                           hint="a deep spec has one layer index")
        lay = s.layers[0]
        if s.time is None:
            raise self.err(StructureSpecError, "the spec declares no time grid", s.model.pos,
                           hint="add a line such as 'time t: T = 20 steps of eta = 0.05'")
        per_step = {p.name for p in s.params if s.time is not None and p.dims == (s.time.steps_name,)}
        if any(p.dims and p.name not in per_step for p in s.params) and not s.indices:
            p = next(p for p in s.params if p.dims and p.name not in per_step)
            raise self.err(StructureSpecError, f"array parameter '{p.name}' in a deep spec without a point index",
                           self.word_pos(p.name, p.pos), hint="declare the training points, e.g. 'index mu, nu in "
                           f"1..{p.dims[0]}', and write the per-point quantities with it")
        # several training points: the point index is checked and folded into time (dmftc.frontend.points_deep)
        s, self.points = fold_points(s, lambda cls, msg, pos, hint=None: self.err(cls, msg, pos, hint=hint))
        self.spec = s
        for p in s.params:
            self.declare("param", p.name, (), p.pos)
        tm = s.time
        self.declare_time()
        self.depth_parameter(lay)
        self.declare("layer", lay.var, (), lay.pos)
        self.layer_var, self.depth = lay.var, lay.depth
        if len(s.activations) != 1:
            raise self.err(StructureSpecError, "a deep spec needs exactly one activation",
                           s.activations[1].pos if s.activations else s.model.pos,
                           hint="declare it as 'activation phi(h) = tanh(h)'")
        act = s.activations[0]
        self.declare("activation", act.name, (), act.pos)
        # ---------------------------------------------------------------- order parameters
        scalars, families = [], []
        for o in s.orders:
            if o.indices:
                if o.indices != (lay.var,):
                    raise self.err(ShapeSpecError, f"layer family '{o.name}' must be indexed by the layer index "
                                   f"'{lay.var}'", self.word_pos(o.name, o.pos),
                                   hint=f"write {o.name}[{lay.var}]({tm.var}, s)")
                if o.time2 is None:
                    raise self.err(ShapeSpecError, f"layer family '{o.name}' needs two time arguments",
                                   self.word_pos(o.name, o.pos), hint=f"write {o.name}[{lay.var}]({tm.var}, s)")
                families.append(o.name)
                kind = "family"
            else:
                if o.time2 is not None:
                    raise self.err(ShapeSpecError, f"two-time order parameter '{o.name}' needs a layer index",
                                   self.word_pos(o.name, o.pos), hint=f"write {o.name}[{lay.var}]({tm.var}, s)")
                scalars.append(o.name)
                kind = "order"
            if o.time != tm.var:
                raise self.err(NameSpecError, f"order parameter '{o.name}' must depend on the time variable "
                               f"'{tm.var}'", self.word_pos(o.time, o.pos, after=self.word_pos(o.name, o.pos)),
                               hint=f"write {o.name}({tm.var}{', s' if o.time2 else ''})")
            self.declare(kind, o.name, o.indices, o.pos)
        if not families:
            raise self.err(StructureSpecError, "the deep spec declares no layer family of order parameters",
                           s.model.pos, hint=f"declare e.g. 'order Phi[{lay.var}]({tm.var}, s)'")
        # ---------------------------------------------------------------- sources
        for src in s.sources:
            if src.kind != "gp":
                raise self.err(StructureSpecError, "sources of a deep spec are Gaussian processes over time",
                               self.word_pos("normal", src.pos),
                               hint=f"write u[{lay.var}] ~ gp(0, Phi[{lay.var}-1])")
            if len(src.targets) != 1:
                raise self.err(StructureSpecError, "declare one gp source per statement", src.targets[1].pos,
                               hint="sources of different names are independent processes")
            tgt = src.targets[0]
            if tgt.indices != (lay.var,):
                raise self.err(ShapeSpecError, f"source '{tgt.name}' must be indexed by the layer index",
                               tgt.pos, hint=f"write {tgt.name}[{lay.var}] ~ gp(0, ...)")
            self.declare("source", tgt.name, tgt.indices, tgt.pos)
        derived, deferred = (), ()
        if s.actions:                       # the saddle-point equations of the action, as definitions
            derived, deferred = lower_deep_action(s, lambda cls, msg, pos, hint=None: self.err(cls, msg, pos,
                                                                                                 hint=hint))
            self.spec = s = dataclasses.replace(s, fields=s.fields + derived, actions=())
        # ---------------------------------------------------------------- equations: classify
        responses, fields, definitions, boundaries, coef_eqs = [], [], {}, {}, []
        for f in s.fields:
            sym = self.symbols.get(f.name)
            if is_coefficient(f, self.symbols, {i.name for i in s.initials}) or (
                    f.time == f.time2 and f.name in {c.name for c in coef_eqs}):
                coef_eqs.append(f)              # a time coefficient (dmftc.frontend.coefficients_deep)
                continue
            if sym is not None and sym.kind in ("family", "order", "response"):
                pass
            elif f.time2 is not None and sym is None:
                self.declare("response", f.name, (lay.var,), f.pos)
                responses.append(f.name)
            elif sym is None:
                self.declare("field", f.name, f.indices, f.pos)
                fields.append(f)
                continue
            else:
                raise self.err(NameSpecError, f"'{f.name}' is {kind_phrase(sym)} and cannot be defined by an equation",
                               self.word_pos(f.name, f.pos),
                               hint="equations define fields, order parameters and response functions")
            sym = self.symbols[f.name]
            if sym.kind == "order":
                if f.indices or f.time2 is not None:
                    raise self.err(ShapeSpecError, f"'{f.name}' is an order parameter of one time, without layer "
                                   "index", self.word_pos(f.name, f.pos), hint=f"write {f.name}({tm.var}) = ...")
                self.lhs_time(f)
                if f.name in definitions:
                    raise self.duplicate(f, definitions[f.name])
                definitions[f.name] = f
                continue
            if len(f.indices) != 1 or f.time2 is None:
                raise self.err(ShapeSpecError, f"'{f.name}' is a two-time layer family", self.word_pos(f.name, f.pos),
                               hint=f"write {f.name}[{lay.var}]({tm.var}, s) = ...")
            self.lhs_time(f)
            ref = self.ref(f.indices[0], f.pos)
            if ref == LayerRef(lay.var, 0):
                if f.name in definitions:
                    raise self.duplicate(f, definitions[f.name])
                definitions[f.name] = f
            elif ref.var == lay.var:
                raise self.err(SpecError, f"'{f.name}[{ref.text()}]' is neither the definition at layer "
                               f"'{lay.var}' nor a boundary value", self.word_pos(ref.text(), f.pos),
                               hint=f"define {f.name}[{lay.var}] for every layer and give boundary values such as "
                                    f"{f.name}[0] or {f.name}[{lay.depth}+1]")
            elif (ref.var is None and ref.offset >= 1) or (ref.var == lay.depth and ref.offset <= 0):
                raise self.err(SpecError, f"'{f.name}[{ref.text()}]' is inside the layer range "
                               f"{lay.var} = 1..{lay.depth}", self.word_pos(ref.text(), f.pos),
                               hint=f"boundary values are outside it: {f.name}[0] or {f.name}[{lay.depth}+1]")
            else:
                prev = [eq for r, eq in boundaries.get(f.name, ()) if r == ref]
                if prev:
                    raise self.duplicate(f, prev[0])
                boundaries[f.name] = boundaries.get(f.name, ()) + ((ref, f),)
        for name in families + responses:
            if name not in definitions:
                sym = self.symbols[name]
                raise self.err(StructureSpecError,
                               f"{kind_phrase(sym)} '{name}' has no definition at layer '{lay.var}'",
                               sym.pos, hint=f"add '{name}[{lay.var}]({tm.var}, s) = E[...]'")
        for name in scalars:
            if name not in definitions:
                raise self.err(StructureSpecError, f"order parameter '{name}' has no definition",
                               self.symbols[name].pos, hint=f"add '{name}({tm.var}) = ...'")
        self.boundaries = boundaries
        self.families, self.responses = set(families), set(responses)
        if coef_eqs and self.points is not None:
            raise self.err(StructureSpecError, "time coefficients are not supported in a spec on several points",
                           self.word_pos(coef_eqs[0].name, coef_eqs[0].pos),
                           hint="write the optimiser for one training point")
        read = {e.name for f in coef_eqs for e in ast.walk(f.body) if isinstance(e, ast.Call)}
        for f in fields:
            if not f.indices and f.time2 is None and f.name in read:
                raise self.err(StructureSpecError, f"the one-time coefficient '{f.name}' has no initial value",
                               self.word_pos(f.name, f.pos),
                               hint=f"add '{f.name}(0) = ...' (its value at {tm.var} = 0; the recurrence holds for "
                                    f"{tm.var} > 0)")
        coefficients = plan_coefficients(coef_eqs, time_var=tm.var, initials=s.initials,
                                         params={p.name: p.dims for p in s.params} | {tm.step_name: ()},
                                         per_step=per_step, err=lambda cls, msg, pos, hint=None: self.err(
                                             cls, msg, pos, hint=hint), word_pos=self.word_pos)
        for c in coefficients:
            self.declare("coefficient1" if c.one_time else "coefficient", c.name, (), c.pos)
        # ---------------------------------------------------------------- bodies
        params = [p.name for p in s.params]
        for n, p in enumerate(s.params):
            self.visible = set(params[:n])
            self.expr(p.default, ctx="default", bound=set())
        self.visible = set(params) | {tm.steps_name}
        self.expr(tm.step, ctx="default", bound=set())
        self.visible = None
        self.expr(act.body, ctx="activation", bound=set(), locals_={act.arg})
        for e in ast.walk(act.body):
            sym = self.symbols.get(e.name) if isinstance(e, ast.Name) and e.name != act.arg else None
            if sym is not None and sym.kind != "param":
                raise self.err(StructureSpecError,
                               f"an activation cannot depend on {kind_phrase(sym)} '{e.name}'", e.pos,
                               hint="an activation is a function of its argument and parameters only")
        gps = tuple(self.gp_source(src) for src in s.sources)
        for f in fields:
            if f.indices != (lay.var,):
                raise self.err(ShapeSpecError, f"field '{f.name}' must be indexed by the layer index '{lay.var}'",
                               self.word_pos(f.name, f.pos), hint=f"write {f.name}[{lay.var}]({tm.var}) = ...")
            self.lhs_time(f)
            self.dexpr(f.body, ctx="field", times={tm.var}, layers={lay.var: None})
        for name, eq in definitions.items():
            if name in self.families or name in self.responses:
                self.definition(eq)
            else:
                self.dexpr(eq.body, ctx="scalar", times={tm.var}, layers={}, owner=name)
        for name, bs in boundaries.items():
            for ref, eq in bs:
                self.dexpr(eq.body, ctx="boundary", times=set(), layers={})
        order = self.dependencies(fields)
        byname = {f.name: f for f in fields}
        if deferred:
            raise deferred[0]
        return DeepModel(s, dict(self.symbols), tm.var, lay.var, lay.depth, act, tuple(scalars), tuple(families),
                         tuple(responses), gps, tuple(byname[n] for n in order), definitions, boundaries, derived,
                         self.points, coefficients)

    # ------------------------------------------------------------ pieces
    def lookup(self, name, pos, locals_=frozenset(), extra=()):
        """As for two-layer specs; an undefined name is matched against the spec's own names first."""
        try:
            return super().lookup(name, pos, locals_, extra)
        except NameSpecError as err:
            own = suggest(name, [n for n, v in self.symbols.items() if v.kind not in ("time", "layer")])
            if own and err.message.startswith("undefined name"):
                err.hint = own
            raise

    def duplicate(self, f, prev):
        return self.err(NameSpecError, f"'{f.name}' is defined twice (first at line {prev.pos.line})",
                        self.word_pos(f.name, f.pos), hint="every equation defines a different quantity or layer")

    def lhs_time(self, f):
        tm = self.spec.time.var
        if f.time != tm:
            raise self.err(NameSpecError, f"'{f.name}' must be defined at the time variable '{tm}'",
                           self.word_pos(f.time, f.pos, after=self.word_pos(f.name, f.pos)),
                           hint=f"write {f.name}[...]({tm}{', s' if f.time2 else ''}) = ...")
        if f.time2 is not None and (f.time2 == tm or f.time2 in self.symbols):
            raise self.err(NameSpecError, f"the second time '{f.time2}' of '{f.name}' clashes with an existing name",
                           self.word_pos(f.time2, f.pos, after=self.word_pos(f.name, f.pos)),
                           hint="use a fresh name such as s")

    def depth_parameter(self, lay):
        if lay.start != 1:
            raise self.err(SpecError, "the layer range starts at 1", self.word_pos(str(lay.start), lay.pos),
                           hint=f"write 'layers {lay.var} = 1..{lay.depth}'; boundaries are layers 0 and "
                                f"{lay.depth}+1")
        prm = next((p for p in self.spec.params if p.name == lay.depth), None)
        if prm is None:
            raise self.err(NameSpecError, f"the depth '{lay.depth}' is not a parameter",
                           self.word_pos(lay.depth, lay.pos, after=self.word_pos(lay.var, lay.pos)),
                           hint=suggest(lay.depth, [p.name for p in self.spec.params])
                           or f"declare it first: 'param {lay.depth} = 2 \"hidden layers\"'")
        v = prm.default
        if not (isinstance(v, ast.Num) and float(v.value).is_integer() and v.value >= 1):
            raise self.err(ShapeSpecError, f"the depth parameter '{prm.name}' must be an integer >= 1",
                           v.pos, hint=f"write e.g. 'param {prm.name} = 2'")

    def ref(self, text, pos) -> LayerRef:
        m = _REF.match(text)
        if m is None:  # pragma: no cover - the grammar only makes these shapes
            raise self.err(ShapeSpecError, f"bad layer index '{text}'", pos)
        if m.group("num") is not None:
            return LayerRef(None, int(m.group("num")))
        var, off = m.group("var"), int(m.group("off") or 0)
        if var not in (self.layer_var, self.depth) and var not in getattr(self, "_layer_locals", ()):
            sym = self.symbols.get(var)
            raise self.err(NameSpecError,
                           f"'{var}' is not a layer index" + (f" (it is {kind_phrase(sym)})" if sym else ""),
                           self.word_pos(var, pos),
                           hint=f"layer indices are '{self.layer_var}', the depth '{self.depth}', numbers, "
                                f"or shifts such as {self.layer_var}-1")
        return LayerRef(var, off)

    def check_range(self, name, ref, pos, layers):
        """A family used at ``ref``, where layer variables range over ``layers`` (None: 1..depth)."""
        L = self.depth
        bset = {r for r, _ in self.boundaries.get(name, ())}
        kind = kind_phrase(self.symbols[name])
        if ref.var is not None and ref.var != L:
            lo, hi = layers.get(ref.var) or (LayerRef(None, 1), LayerRef(L, 0))
            need = []  # (value, at which layer value) pairs outside 1..L
            if lo.var is None:
                need += [(LayerRef(None, lo.offset + k + ref.offset), LayerRef(None, lo.offset + k))
                         for k in range(max(0, 1 - (lo.offset + ref.offset)))]
            if hi.var == L:
                need += [(LayerRef(L, hi.offset - k + ref.offset), LayerRef(L, hi.offset - k) if hi.offset - k else
                          LayerRef(L, 0)) for k in range(max(0, hi.offset + ref.offset))]
            elif hi.var is None and hi.offset + ref.offset < 1:
                need += [(LayerRef(None, hi.offset + ref.offset), hi)]
            for value, at in need:
                if value not in bset:
                    raise self._range_error(name, kind, ref, value, at, pos, bset)
            return
        if ref.var is None and ref.offset < 1 and ref not in bset:
            raise self._range_error(name, kind, ref, ref, None, pos, bset)
        if ref.var == L and ref.offset > 0 and ref not in bset:
            raise self._range_error(name, kind, ref, ref, None, pos, bset)

    def _range_error(self, name, kind, ref, value, at, pos, bset):
        where = f" at {self.layer_var} = {at.text()}" if at is not None and value != ref else ""
        have = ", ".join(f"{name}[{r.text()}]" for r in sorted(bset, key=lambda r: (r.var or "", r.offset)))
        msg = (f"{name}[{ref.text()}] needs {name}[{value.text()}]{where}, which is not defined"
               if value != ref else f"{name}[{ref.text()}] is not defined")
        kind_hint = (f"{kind} '{name}' is defined for {self.layer_var} = 1..{self.depth}"
                     + (f" and at the boundaries {have}" if have else " and has no boundary values"))
        return self.err(ShapeSpecError, msg, self.word_pos(ref.text(), pos) if ref.var else pos,
                        hint=kind_hint + f"; add a boundary value such as '{name}[{value.text()}]"
                                         f"({self.spec.time.var}, s) = ...' or use an adjacent layer")

    def gp_source(self, src) -> GPSource:
        name = src.targets[0].name
        if not (isinstance(src.mean, ast.Num) and src.mean.value == 0):
            raise self.err(StructureSpecError, "Gaussian sources must have mean 0", src.mean.pos,
                           hint="write gp(0, covariance)")
        cov = src.cov
        hint = f"write e.g. {name}[{self.layer_var}] ~ gp(0, Phi[{self.layer_var}-1])"
        if not isinstance(cov, ast.Indexed):
            raise self.err(StructureSpecError, f"the covariance of the gp source '{name}' must be a two-time order "
                           "parameter of an adjacent layer", cov.pos, hint=hint)
        sym = self.lookup(cov.name, cov.pos)
        if sym.kind != "family":
            raise self.err(StructureSpecError, f"the covariance of '{name}' is {kind_phrase(sym)} '{cov.name}', not a "
                           "two-time order parameter", cov.pos, hint=hint)
        if len(cov.indices) != 1:
            raise self.err(ShapeSpecError, f"'{cov.name}' has one layer index, got {len(cov.indices)}", cov.pos)
        ref = self.ref(cov.indices[0], cov.pos)
        if ref.var != self.layer_var or abs(ref.offset) != 1:
            raise self.err(StructureSpecError, f"the covariance of '{name}' must be an order parameter of an "
                           f"adjacent layer ({self.layer_var}-1 or {self.layer_var}+1), got {cov.name}[{ref.text()}]",
                           cov.pos, hint=hint)
        self.check_range(cov.name, ref, cov.pos, {})
        return GPSource(name, cov.name, ref.offset, src)

    def definition(self, eq):
        tm, lv = self.spec.time.var, self.layer_var
        body = eq.body
        kind = "response" if eq.name in self.responses else "order"
        if kind == "response":
            if not isinstance(body, ast.Response):
                raise self.err(StructureSpecError, f"response function '{eq.name}' must be defined as an average "
                               "derivative", body.pos,
                               hint=f"write {eq.name}[{lv}]({tm}, {eq.time2}) = E[d phi(h[{lv}]({tm})) / "
                                    f"d r[{lv}]({eq.time2})]; two-time quantities that are not responses are "
                                    "declared with 'order'")
            self.dexpr(body.of, ctx="average", times={tm}, layers={lv: None}, same_layer=True)
            w = body.wrt
            sym = self.symbols.get(w.name) if isinstance(w, ast.Call) else None
            if sym is None or sym.kind != "source":
                raise self.err(StructureSpecError, "responses are derivatives with respect to a source", w.pos,
                               hint="write d u[l](s) or d r[l](s) after the '/', with a gp source")
            if w.indices != (lv,) or len(w.args) != 1 or not isinstance(w.args[0], ast.Name) \
                    or w.args[0].name != eq.time2:
                raise self.err(ShapeSpecError, f"the derivative must be taken with respect to "
                               f"{w.name}[{lv}]({eq.time2}), the source of the same layer at the second time",
                               w.pos)
            return
        if not isinstance(body, ast.Expectation) or body.log:
            raise self.err(StructureSpecError, f"'{eq.name}[{lv}]' must be defined as an average E[...]", body.pos,
                           hint=f"write {eq.name}[{lv}]({tm}, {eq.time2}) = E[phi(h[{lv}]({tm})) "
                                f"phi(h[{lv}]({eq.time2}))]")
        self.dexpr(body.body, ctx="average", times={tm, eq.time2}, layers={lv: None}, same_layer=True)

    # ------------------------------------------------------------ expressions
    def dependencies(self, fields) -> tuple[str, ...]:
        """Fields in same-time dependency order (uses at t, and at s inside sum(s <= t: ...)); reject cycles."""
        deps = {}
        names = {f.name for f in fields}
        for f in fields:
            deps[f.name] = {}
            stack = [(f.body, None)]
            while stack:
                e, cmp = stack.pop()
                if isinstance(e, (ast.Integral, ast.TimeSum)):
                    stack.append((e.body, e.cmp))
                    continue
                if isinstance(e, ast.Call) and e.name in names and (cmp is None or cmp == "<="):
                    deps[f.name].setdefault(e.name, e.pos)
                for c in ast.children(e):
                    stack.append((c, cmp))
        done, state = [], {}

        def visit(n, chain):
            if state.get(n) == 2:
                return
            if state.get(n) == 1:
                cyc = chain[chain.index(n):] + [n]
                raise self.err(CausalitySpecError, f"fields depend on each other at the same time: "
                               f"{' -> '.join(cyc)}", deps[cyc[0]][cyc[1]],
                               hint="break the cycle with a strictly causal sum over s < t")
            state[n] = 1
            for d in sorted(deps[n]):
                visit(d, chain + [n])
            state[n] = 2
            done.append(n)

        for f in fields:
            visit(f.name, [])
        return tuple(done)


def check_deep(spec: ast.Spec) -> DeepModel:
    """Check a deep spec; raise a located :class:`SpecError` on the first problem."""
    return _DeepChecker(spec).run()
